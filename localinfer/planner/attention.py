"""Flash attention and the physical batch of a CPU load, decided by what this machine measured
for this model, not by a rule.

On a CPU, flash attention computes attention in tiles instead of materialising each head's
score matrix: it reads a long prompt faster and many streams cheaper, and on some CPUs reads a
short message after a long history slower; the physical batch (``n_ubatch``, rows per graph)
trades the window cache's size against the matrix kernels' efficiency. Which set-up is fastest
depends on the CPU, the model and the work, so ``localinfer bench --prefill`` measures each
(prefill_bench.py): fresh prompts of each length, a next turn's few tokens after a long
history, and generation with one stream and with four, after that history and after a line.
It records the rates here, per machine (calibration.profile_key) and model file; ``hw
--remeasure`` measures them again.

A load on the CPU with flash attention left at ``auto`` and an F16 cache then takes the set-up
that does this model's work here fastest: its engines count what they read and generate
(runtime/workload.py, kept across restarts), and ``choose`` adds up the seconds each set-up
takes for that work, each prompt, turn or step counted at the nearest measured size. A daemon
whose time goes to generating takes flash attention where it generates faster; one whose time
goes to reading after a history (an editor's keystrokes with short completions) keeps it off
where that reads slower. Until a
model has served ``MIN_REQUESTS`` requests here the weights are one prompt of each measured
length (a coding agent's 16k-token requests and a chat's short turns both come). The choice
takes effect at the model's next load: flash attention changes the KV cache's layout. Without
a measurement the rule stays (flash attention off on the CPU: see
runtime.llama.flash_attn_type), and ``plan`` says how to measure.

Measurements taken while other processes kept more than ``BUSY_LIMIT`` of the cores busy are
kept, shown, and never used: a loaded machine skews one set-up more than another. The file is
a cache (``<cache>/hardware/attention.json``), read with no trust: a malformed entry is
skipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..hardware.profile import HardwareProfile
from ..paths import atomic_write_text, get_paths, read_json_object
from ..runtime import workload
from ..runtime.workload import Workload
from .calibration import forget_machine, profile_key

log = logging.getLogger(__name__)

FILE = "attention.json"
BUSY_LIMIT = 0.25
"""The most of the machine's cores other processes may keep busy during a measurement that
decides (a quarter: one core of 4; none of 2, where one busy core is half the machine)."""
MIN_REQUESTS = 20
"""A workload seen here of fewer requests weighs nothing (one prompt of each length does)."""
TURN_NEW = 64
"""The new tokens of the measured next turn (bench/prefill_bench.py)."""
MIN_GAIN = 0.10
"""A set-up other than the rule's is taken only when it does the work at least this much
faster: measurement noise must not flip the default (one set-up's figure moved by 5-10%
between sweeps on a 2-core machine, and a change of set-up starts the prefix cache afresh)."""


@dataclass(frozen=True)
class AttentionChoice:
    """The set-up a CPU load takes, and why."""

    flash_attn: bool
    n_ubatch: int
    reason: str


def file_key(path: str | Path) -> str:
    """A model file as the measurements know it: its name and size (a new download of the
    same name is another file)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        size = 0
    return hashlib.sha256(f"{p.name}|{size}".encode()).hexdigest()[:16]


def workload_file(path: str | Path) -> Path:
    """The file engines of the model file at ``path`` count its work in
    (runtime/workload.py), which its next load's set-up weighs. Loads with the settings (the
    daemon's, ``run``'s, the chat's) count; a measurement's own loads do not."""
    return get_paths().workload_dir / f"{file_key(path)}.json"


def workload_seen(path: str | Path) -> Workload | None:
    """What engines of the model file at ``path`` have done here, or None."""
    return workload.load(workload_file(path))


def _path(cache_dir: Path | None) -> Path:
    return (cache_dir or get_paths().cache_dir) / "hardware" / FILE


def record(hw: HardwareProfile, model_path: str | Path, model_name: str,
           rows: Sequence[Mapping[str, Any]], *, busy_share: float,
           cache_dir: Path | None = None) -> None:
    """Keep one sweep's rows (``flash_attn``, ``n_ubatch``, ``kind``, ``tokens``, ``tps``) for
    this machine and model file, replacing the last; ``busy_share`` the share of the cores
    other processes kept busy meanwhile."""
    path = _path(cache_dir)
    data = read_json_object(path)
    machine = data.get(profile_key(hw))
    if not isinstance(machine, dict):
        machine = data[profile_key(hw)] = {}
    machine[file_key(model_path)] = {
        "model": model_name, "path": str(model_path), "at": time.time(),
        "busy_share": round(busy_share, 3),
        "rows": [{"flash_attn": row["flash_attn"], "n_ubatch": row["n_ubatch"],
                  "kind": row_kind(row), "tokens": row["tokens"], "tps": row_tps(row)}
                 for row in rows]}
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def measured(hw: HardwareProfile, cache_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    """{file key: entry} of this machine's well-formed measurements."""
    machine = read_json_object(_path(cache_dir)).get(profile_key(hw))
    if not isinstance(machine, dict):
        return {}
    out = {}
    for key, entry in machine.items():
        try:
            rows = [(bool(r["flash_attn"]), int(r["n_ubatch"]), row_kind(r), int(r["tokens"]),
                     row_tps(r)) for r in entry["rows"]]
            numbers = [float(entry["busy_share"]), float(entry["at"]), *(r[-1] for r in rows)]
            str(entry["path"])
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError):
            log.warning("skipping a malformed attention measurement in %s", _path(cache_dir))
            continue
        if rows and all(tps > 0 for *_, tps in rows) and all(map(math.isfinite, numbers)):
            out[key] = entry
    return out


def forget(hw: HardwareProfile, cache_dir: Path | None = None) -> bool:
    """Drop this machine's measurements (``hw --reset``). True when there were some."""
    return forget_machine(_path(cache_dir), hw)


def _rates(entry: Mapping[str, Any]) -> dict[tuple[bool, int], dict[tuple[str, int], float]]:
    """{set-up: {(kind, size): tokens per second}} of a measurement."""
    rates: dict[tuple[bool, int], dict[tuple[str, int], float]] = {}
    for row in entry["rows"]:
        setup = (bool(row["flash_attn"]), int(row["n_ubatch"]))
        rates.setdefault(setup, {})[(row_kind(row), int(row["tokens"]))] = row_tps(row)
    return rates


KINDS = {"prompt": "prefill at {n:,} tokens", "turn": "a next turn after {n:,}",
         "decode": "{n} stream(s)", "decode_short": "{n} stream(s) after a line"}
"""The kinds of work a measurement's rows hold, in the order they are shown, with a label
for one of a size ``n``."""


def _weights(keys: set[tuple[str, int]], seen: Workload | None
             ) -> dict[tuple[str, int], float] | None:
    """Tokens of each measured kind and size in ``seen``, each counted at the nearest size
    measured (one history size is measured for next turns); None without enough of it."""
    if seen is None or seen.requests < MIN_REQUESTS:
        return None
    weights = dict.fromkeys(keys, 0.0)
    lengths = sorted(n for kind, n in keys if kind == "prompt")
    for length, tokens in seen.prompts.items():
        weights[("prompt", min(lengths, key=lambda n: abs(n - length)))] += tokens
    turns = sorted(n for kind, n in keys if kind == "turn")
    if turns:
        weights[("turn", turns[-1])] += seen.turns
    for counted, kind in ((seen.decode, "decode"), (seen.decode_short, "decode_short")):
        # Steps at a position not measured (a measurement from before positions were)
        # count at the other.
        if not any(k == kind for k, _ in keys):
            kind = "decode" if kind == "decode_short" else "decode_short"
        widths = [n for k, n in keys if k == kind]
        for width, tokens in counted.items() if widths else ():
            weights[(kind, min(widths, key=lambda n: abs(n - width)))] += tokens
    return weights if any(weights.values()) else None


def choose(entry: Mapping[str, Any], seen: Workload | None = None,
           *, rule: tuple[bool, int]) -> AttentionChoice | None:
    """The measured set-up that does the work this model did here (``seen``, counted by its
    engines: runtime/workload.py) in the least time, or None where the measurement cannot
    decide (taken under load, or a set-up missing a measured kind or size). Without a
    workload of ``MIN_REQUESTS`` requests, one prompt of each measured length. ``rule`` is
    the set-up the load would take without a measurement: kept unless another is
    ``MIN_GAIN`` faster."""
    rates = _rates(entry)
    keys = {key for by_key in rates.values() for key in by_key}
    if float(entry["busy_share"]) > BUSY_LIMIT or not any(k == "prompt" for k, _ in keys) \
            or any(set(by_key) != keys for by_key in rates.values()):
        return None
    weights = _weights(keys, seen)
    basis = _basis(weights, rates.get(rule) or next(iter(rates.values())), seen)
    if weights is None:
        weights = {(kind, n): float(n) for kind, n in keys if kind == "prompt"}
    seconds = {setup: sum(w / by_key[key] for key, w in weights.items())
               for setup, by_key in rates.items()}
    best = fastest = min(seconds, key=lambda s: seconds[s])
    if rule in seconds and seconds[rule] <= seconds[best] * (1 + MIN_GAIN):
        best = rule
    flash, ubatch = best
    baseline = rates.get(rule)
    if baseline is None or best == rule:
        versus = ("the fastest measured" if best == fastest else
                  f"within {MIN_GAIN:.0%} of the fastest measured, the default's set-up")
    else:
        order = list(KINDS)
        gains = ", ".join(f"{KINDS[kind].format(n=n)} {rates[best][kind, n] / old:.2f}x"
                          for (kind, n), old in sorted(baseline.items(), key=lambda k: (
                              order.index(k[0][0]), k[0][1])))
        versus = f"{gains} against flash attention {'on' if rule[0] else 'off'}, ubatch {rule[1]}"
    reason = (f"flash attention {'on' if flash else 'off'}, {ubatch}-row batches: measured"
              f" here ({versus}; {basis}; `localinfer bench --prefill`)")
    return AttentionChoice(flash, ubatch, reason)


def _basis(weights: Mapping[tuple[str, int], float] | None,
           rates: Mapping[tuple[str, int], float], seen: Workload | None) -> str:
    """What the choice weighed: the work seen here, as shares of its time, and the work
    seen that the measurement has no rate for."""
    if weights is None or seen is None:
        return "weighing one prompt of each length: no workload seen here yet"
    time = {kind: sum(w / rates[key] for key, w in weights.items() if key[0] == kind)
            for kind in KINDS}
    time["decode"] += time.pop("decode_short")
    total = sum(time.values()) or 1.0
    measured_kinds = {kind.removesuffix("_short") for kind, _ in rates}
    seen_kinds = (("turn", "next turns", seen.turns),
                  ("decode", "generating",
                   sum(seen.decode.values()) + sum(seen.decode_short.values())))
    unmeasured = [what for kind, what, count in seen_kinds
                  if count and kind not in measured_kinds]
    missing = (f"; {' and '.join(unmeasured)} not measured (`localinfer hw --remeasure`)"
               if unmeasured else "")
    return (f"weighing the work of {seen.requests:,} requests here: reading prompts"
            f" {time['prompt'] / total:.0%}, next turns {time['turn'] / total:.0%},"
            f" generating {time['decode'] / total:.0%} of the time{missing}")


def row_kind(row: Mapping[str, Any]) -> str:
    """A measured row's kind: ``prompt`` (a fresh prompt of ``tokens``), ``turn`` (a next
    turn's ``TURN_NEW`` tokens after ``tokens`` cached), ``decode`` (``tokens`` streams after
    that history) or ``decode_short`` (``tokens`` streams after a line); rows written before
    kinds were measured are prompts."""
    kind = row.get("kind", "prompt")
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    return str(kind)


def row_tps(row: Mapping[str, Any]) -> float:
    """A measured row's rate: tokens read (or generated, all streams together) per second."""
    return float(row["tps"] if "tps" in row else row["prefill_tps"])
