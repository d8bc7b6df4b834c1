"""Flash attention and the physical batch of a CPU load, decided by what this machine measured
for this model, not by a rule.

On a CPU, flash attention computes attention in tiles instead of materialising each head's
score matrix: it reads a long prompt faster and many streams cheaper, and on some CPUs reads a
short message after a long history slower; the physical batch (``n_ubatch``, rows per graph)
trades the window cache's size against the matrix kernels' efficiency. Which set-up is fastest
depends on the CPU, the model and the length, so ``localinfer bench --prefill`` measures each
(prefill_bench.py) and records the rates here, per machine (calibration.profile_key) and model
file; ``hw --remeasure`` measures them again. A load on the CPU with flash attention left at
``auto`` and an F16 cache then takes the set-up that reads the daemon's workload fastest:
``choose`` adds up the seconds each set-up takes to read the workload's prompts, each counted
at the nearest measured length (by default one prompt of each length, as a coding agent's
16k-token requests and a chat's short turns both come): a few long prompts can outweigh many
short ones, as they do in the time a person waits. Without a measurement the rule stays
(flash attention off on the CPU: see runtime.llama.flash_attn_type), and ``plan`` says how to
measure.

Measurements taken while other processes kept more than ``BUSY_LIMIT`` of the cores busy are
kept, shown, and never used: a loaded machine skews one set-up more than another. The file is
a cache (``<cache>/hardware/attention.json``), read with no trust: a malformed entry is
skipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..hardware.profile import HardwareProfile
from ..paths import atomic_write_text, get_paths, read_json_object
from .calibration import forget_machine, profile_key

log = logging.getLogger(__name__)

FILE = "attention.json"
BUSY_LIMIT = 0.25
"""The most of the machine's cores other processes may keep busy during a measurement that
decides (a quarter: one core of 4; none of 2, where one busy core is half the machine)."""
MIN_GAIN = 0.03
"""A set-up other than the rule's is taken only when it reads the workload at least this much
faster: measurement noise must not flip the default."""


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


def _path(cache_dir: Path | None) -> Path:
    return (cache_dir or get_paths().cache_dir) / "hardware" / FILE


def record(hw: HardwareProfile, model_path: str | Path, model_name: str,
           rows: Sequence[Mapping[str, Any]], *, busy_share: float,
           cache_dir: Path | None = None) -> None:
    """Keep one sweep's rows (``flash_attn``, ``n_ubatch``, ``tokens``, ``prefill_tps``) for
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
        "rows": [{k: row[k] for k in ("flash_attn", "n_ubatch", "tokens", "prefill_tps")}
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
            rows = [(bool(r["flash_attn"]), int(r["n_ubatch"]), int(r["tokens"]),
                     float(r["prefill_tps"])) for r in entry["rows"]]
            float(entry["busy_share"])
            str(entry["path"])
        except (KeyError, TypeError, ValueError):
            log.warning("skipping a malformed attention measurement in %s", _path(cache_dir))
            continue
        if rows and all(tps > 0 for *_, tps in rows):
            out[key] = entry
    return out


def forget(hw: HardwareProfile, cache_dir: Path | None = None) -> bool:
    """Drop this machine's measurements (``hw --reset``). True when there were some."""
    return forget_machine(_path(cache_dir), hw)


def choose(entry: Mapping[str, Any], workload: Mapping[int, float] | None = None,
           *, rule: tuple[bool, int]) -> AttentionChoice | None:
    """The measured set-up that reads ``workload`` ({prompt tokens: share of requests},
    default every measured length alike) in the least time, or None where the measurement
    cannot decide (taken under load, or a set-up missing at some length). ``rule`` is the
    set-up the load would take without a measurement: kept unless another is ``MIN_GAIN``
    faster."""
    if float(entry["busy_share"]) > BUSY_LIMIT:
        return None
    rates: dict[tuple[bool, int], dict[int, float]] = {}
    for row in entry["rows"]:
        setup = (bool(row["flash_attn"]), int(row["n_ubatch"]))
        rates.setdefault(setup, {})[int(row["tokens"])] = float(row["prefill_tps"])
    lengths = sorted({n for by_length in rates.values() for n in by_length})
    if not lengths or any(set(by_length) != set(lengths) for by_length in rates.values()):
        return None
    weights = dict.fromkeys(lengths, 1.0)
    if workload:
        weights = dict.fromkeys(lengths, 0.0)
        for tokens, share in workload.items():  # each prompt counts at the nearest length
            weights[min(lengths, key=lambda n: abs(n - tokens))] += share
    seconds = {setup: sum(w * n / by_length[n] for n, w in weights.items())
               for setup, by_length in rates.items()}
    best = min(seconds, key=lambda s: seconds[s])
    if rule in seconds and seconds[rule] <= seconds[best] * (1 + MIN_GAIN):
        best = rule
    flash, ubatch = best
    by_length = rates[best]
    baseline = rates.get(rule)
    if baseline is None or best == rule:
        versus = "the fastest measured"
    else:
        gains = ", ".join(f"{by_length[n] / baseline[n]:.2f}x at {n:,}" for n in lengths)
        versus = (f"prefill {gains} tokens against flash attention"
                  f" {'on' if rule[0] else 'off'}, ubatch {rule[1]}")
    reason = (f"flash attention {'on' if flash else 'off'}, {ubatch}-row batches: measured"
              f" here ({versus}; `localinfer bench --prefill`)")
    return AttentionChoice(flash, ubatch, reason)
