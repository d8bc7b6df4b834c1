"""Calibration: measured/predicted decode speed per machine, learnt from real runs.

``localinfer run`` and ``localinfer bench`` record each real decode rate against what the
planner predicted for the same placement; the planner then multiplies its predictions on this
machine by the geometric mean of the last few ratios, per backend (the CPU, CUDA, Metal...).
Each record notes the machine's load over the run and the host bandwidth the prediction used:
only quiet runs predicted with today's bandwidth figure calibrate (a run on a busy machine is
kept apart, shown by ``hw``, never used). A run faster than the bandwidth allows marks that
figure to be measured again. The file is a cache (``<cache>/hardware/calibration.json``;
``localinfer hw --reset`` forgets this machine's records): deleting it only returns the planner
to its uncalibrated formula.

``after_reply`` is the one check both front ends make after a reply (``run`` records it, the
chat measures the bandwidth again when decode beat the roofline): it answers a ``ReplyCheck``.
The front ends' types (``ModelInfo``, ``Done``) are read here, never imported at run time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import gguf
from ..hardware import bandwidth as bw
from ..hardware.load import MachineLoad
from ..hardware.probe import probe
from ..hardware.profile import HardwareProfile
from ..paths import atomic_write_text, get_paths, read_json_object
from .candidate import Candidate
from .speed import Roofline, decode_reads, predict

if TYPE_CHECKING:  # annotations only: the planner imports nothing above it at run time
    from ..config import Config
    from ..runtime.types import Done, ModelInfo

log = logging.getLogger(__name__)

FILE = "calibration.json"
MIN_DECODE_TOKENS = 32
"""Fewer decoded tokens than this measure the warm-up more than the machine."""
KEEP = 8
"""Records kept per machine and backend, of quiet runs and of runs under load each."""
USE_LAST = 5
ABOVE_ROOFLINE = 1.1
"""Decode faster than this share of the roofline: the host bandwidth figure is too low (the
roofline is a ceiling; 10% for what the bytes-per-token count leaves out)."""
DRIFT = 2.0
"""A quiet run whose ratio is this far (either way) from the machine's calibration: the
bandwidth figure the predictions rest on is measured again."""
SAME_BANDWIDTH = 0.1
"""Records predicted with a host bandwidth more than 10% from today's figure do not
calibrate: their ratio corrected a figure that is no longer used."""


@dataclass(frozen=True)
class Measurement:
    ratio: float
    """measured / predicted decode tokens per second."""
    predicted_tps: float
    measured_tps: float
    model: str
    n_gpu_layers: int
    tokens: int
    at: float
    load: MachineLoad | None = None
    """The machine's load over the run (None: recorded by an older version)."""
    host_bandwidth_gbps: float = 0.0
    """The host bandwidth the prediction used (0: not recorded)."""
    roofline_share: float = 0.0
    """Measured decode over the memory-bandwidth ceiling (0: not known)."""
    drift: str | None = None
    """Why this run marked the bandwidth figure to be measured again, if it did."""

    @property
    def quiet(self) -> bool:
        return self.load is not None and not self.load.heavy

    @classmethod
    def from_dict(cls, data: Any) -> Measurement:
        """From the cache; raises TypeError or ValueError on a malformed record."""
        if not isinstance(data, dict):
            raise TypeError("not an object")
        if not all(isinstance(data.get(f), (int, float))
                   for f in ("ratio", "predicted_tps", "measured_tps", "at")):
            raise ValueError("a figure is not a number")
        load = data.get("load")
        return cls(**{**data, "load": MachineLoad(**load) if load is not None else None})

    def calibrates(self, host_bandwidth_gbps: float) -> bool:
        """Whether the planner may use this record with today's bandwidth figure."""
        return (self.quiet and 0.05 <= self.ratio <= 20 and host_bandwidth_gbps > 0
                and abs(self.host_bandwidth_gbps / host_bandwidth_gbps - 1) <= SAME_BANDWIDTH)


def profile_key(hw: HardwareProfile) -> str:
    """The same CPU, RAM size, GPUs and llama.cpp backends make the same machine."""
    text = "|".join([hw.cpu.model, f"{round(hw.ram_total_gib)}GiB", str(hw.cpu.logical_cores),
                     *sorted(g.name for g in hw.gpus), *sorted(hw.backends)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _path(cache_dir: Path | None) -> Path:
    return (cache_dir or get_paths().cache_dir) / "hardware" / FILE


def load_ratios(hw: HardwareProfile, cache_dir: Path | None = None) -> dict[str, float]:
    """{backend: ratio} for this machine: the geometric mean of the last quiet runs predicted
    with today's host bandwidth figure."""
    ratios: dict[str, float] = {}
    for backend, records in history(hw, cache_dir).items():
        values = [r.ratio for r in records if r.calibrates(hw.host_bandwidth_gbps)][-USE_LAST:]
        if values:
            ratios[backend] = math.exp(sum(math.log(v) for v in values) / len(values))
    return ratios


def history(hw: HardwareProfile, cache_dir: Path | None = None) -> dict[str, list[Measurement]]:
    """{backend: records, oldest first} for this machine; malformed records are skipped (a
    hand-edited or foreign cache)."""
    entries = read_json_object(_path(cache_dir)).get(profile_key(hw), {})
    out: dict[str, list[Measurement]] = {}
    for backend, records in (entries.items() if isinstance(entries, dict) else []):
        kept = []
        for r in (records if isinstance(records, list) else []):
            try:
                kept.append(Measurement.from_dict(r))
            except (TypeError, ValueError):
                continue
        if kept:
            out[backend] = kept
    return out


def record(hw: HardwareProfile, backend: str, measurement: Measurement,
           cache_dir: Path | None = None) -> None:
    """Append one measurement. The file keeps the last few quiet runs and, apart, the last few
    under load, so that runs on a busy machine never push quiet ones out."""
    path = _path(cache_dir)
    data = read_json_object(path)
    machine = data.get(profile_key(hw))
    if not isinstance(machine, dict):
        machine = data[profile_key(hw)] = {}
    records = history(hw, cache_dir).get(backend, []) + [measurement]
    quiet = [r for r in records if r.quiet][-KEEP:]
    other = [r for r in records if not r.quiet][-KEEP:]
    machine[backend] = [asdict(r) for r in sorted(quiet + other, key=lambda r: r.at)]
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def forget(hw: HardwareProfile, cache_dir: Path | None = None) -> bool:
    """Drop this machine's records (``hw --reset``). True when there were some."""
    return forget_machine(_path(cache_dir), hw)


def forget_machine(path: Path, hw: HardwareProfile) -> bool:
    """Drop this machine's section of the per-machine cache file at ``path``. True when it
    had one."""
    data = read_json_object(path)
    if data.pop(profile_key(hw), None) is None:
        return False
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
    return True


def drift_reason(m: Measurement, calibrated_ratio: float | None) -> str | None:
    """Why run ``m`` says the host bandwidth figure is wrong, or None: decode above the
    roofline that figure sets, or (on a quiet machine) a ratio far from the calibration."""
    if m.roofline_share > ABOVE_ROOFLINE:
        return (f"{m.model} decoded {m.measured_tps:.1f} tok/s, {m.roofline_share:.0%} of the"
                f" roofline of {m.host_bandwidth_gbps:.1f} GB/s")
    if m.quiet and calibrated_ratio and not 1 / DRIFT <= m.ratio / calibrated_ratio <= DRIFT:
        return (f"{m.model} decoded {m.measured_tps:.1f} tok/s on a quiet machine, x{m.ratio:.2f}"
                f" of the prediction where this machine's runs were x{calibrated_ratio:.2f}")
    return None


def record_run(*, model_path: str | Path, model_name: str, n_gpu_layers: int,
               n_threads: int | None, prompt_tokens: int, decode_tokens: int,
               decode_tps: float, hw: HardwareProfile | None = None,
               cache_dir: Path | None = None, kv_type: str = "f16",
               load: MachineLoad | None = None) -> Measurement | None:
    """Compare a real run's decode rate with the planner's prediction for the same model,
    placement and context position, and record the ratio (with ``load``, the machine's load
    over the run). A run that shows the host bandwidth figure wrong (``drift_reason``) marks
    it to be measured again by the next probe. Returns None when the run decoded too few
    tokens to say anything."""
    if decode_tokens < MIN_DECODE_TOKENS or decode_tps <= 0:
        return None
    hw = hw or probe()  # the bandwidth is measured once per machine, then cached
    header = gguf.read_header(model_path)
    candidate = Candidate.from_header(header, name=model_name)
    position = prompt_tokens + decode_tokens // 2
    prediction = predict(candidate, hw, n_gpu_layers, position=position, n_threads=n_threads,
                         kv_type=kv_type)
    roofline = _roofline(candidate, hw, n_gpu_layers, kv_type)
    ceiling = roofline.ceiling_tps(position)
    measurement = Measurement(
        ratio=round(decode_tps / prediction.decode_tps, 4),
        predicted_tps=round(prediction.decode_tps, 2), measured_tps=round(decode_tps, 2),
        model=model_name, n_gpu_layers=n_gpu_layers, tokens=decode_tokens, at=time.time(),
        load=load, host_bandwidth_gbps=hw.host_bandwidth_gbps,
        roofline_share=round(decode_tps / ceiling, 3) if ceiling else 0.0)
    reason = drift_reason(measurement, load_ratios(hw, cache_dir).get(prediction.key))
    if reason and roofline.reads.bytes_at(position)[0] and flag_bandwidth(hw, reason, cache_dir):
        measurement = replace(measurement, drift=reason)
    record(hw, prediction.key, measurement, cache_dir)
    log.debug("calibration: %s predicted %.1f tok/s, measured %.1f (ratio %.3f)", model_name,
              prediction.decode_tps, decode_tps, measurement.ratio)
    return measurement


def _roofline(candidate: Candidate, hw: HardwareProfile, n_gpu_layers: int,
              kv_type: str) -> Roofline:
    gpus = hw.usable_gpus()
    return Roofline(decode_reads(candidate, n_gpu_layers, kv_type), hw.host_bandwidth_gbps,
                    hw.bandwidth_source, gpus[0][0].bandwidth_gbps if gpus else 0.0)


def check_steps(*, model_path: str | Path, model_name: str, n_gpu_layers: int,
                prompt_tokens: int, decode_tokens: int, steps_tps: float,
                hw: HardwareProfile | None = None, cache_dir: Path | None = None,
                kv_type: str = "f16") -> str | None:
    """For a run with speculation (not a calibration sample: several tokens a step): each
    decode step still reads the weights once, so steps faster than the roofline show the host
    bandwidth figure too low; mark it. Returns the reason when it did."""
    if decode_tokens < MIN_DECODE_TOKENS or steps_tps <= 0:
        return None
    hw = hw or probe()
    candidate = Candidate.from_header(gguf.read_header(model_path), name=model_name)
    roofline = _roofline(candidate, hw, n_gpu_layers, kv_type)
    position = prompt_tokens + decode_tokens // 2
    ceiling = roofline.ceiling_tps(position)
    if not ceiling or steps_tps <= ABOVE_ROOFLINE * ceiling:
        return None
    reason = (f"{model_name} ran {steps_tps:.1f} decode steps/s, {steps_tps / ceiling:.0%} of"
              f" the roofline of {hw.host_bandwidth_gbps:.1f} GB/s")
    if roofline.reads.bytes_at(position)[0] and flag_bandwidth(hw, reason, cache_dir):
        return reason
    return None


@dataclass(frozen=True)
class ReplyCheck:
    """What one finished reply says about this machine's host bandwidth figure."""

    note: str | None = None
    """A line for the user (``run`` prints it, the chat shows it), or None."""
    remeasure: str | None = None
    """Why the cached host bandwidth figure must be measured again, or None. A reply recorded
    in this process (``after_reply`` with ``info``) has marked it already, for the next probe;
    a front end that measures it now marks it (``flag_bandwidth``) and probes."""


def after_reply(done: Done | None, *, info: ModelInfo | None = None,
                n_threads: int | None = None, load: MachineLoad | None = None,
                hardware: HardwareProfile | None = None,
                roofline_pct: float | None = None) -> ReplyCheck:
    """The check both front ends make after a reply ``done``.

    With ``info`` (a model loaded in this process: ``localinfer run``), the reply's decode is
    recorded against the planner's prediction with ``n_threads`` and the machine's ``load``
    over it (``record_calibration``); a reply that shows the host bandwidth figure wrong marks
    it for the next probe, and the note says so. Never fails the reply.

    Else, with ``hardware`` and ``roofline_pct`` (the reply's decode as a percent of the
    roofline the chat showed): decode steps faster than ABOVE_ROOFLINE x the roofline mean the
    cached host bandwidth is too low, to be measured again now. Each step reads the weights
    once; with speculation a step makes its accepted drafts too, so the steps' rate is the
    tokens' rate without them."""
    if info is not None:
        reason = _record_reply(info, done, n_threads, load)
        return ReplyCheck(note=drift_note(reason) if reason else None, remeasure=reason)
    if done is None or roofline_pct is None or hardware is None:
        return ReplyCheck()
    t = done.timings
    if t.decode_tokens <= 0:
        return ReplyCheck()
    steps_pct = roofline_pct * (t.decode_tokens - t.accepted_tokens) / t.decode_tokens
    if steps_pct <= 100 * ABOVE_ROOFLINE:
        return ReplyCheck()
    host = hardware.host_bandwidth_gbps
    return ReplyCheck(
        note=(f"Decode ran at {steps_pct:.0f}% of the roofline: the cached host bandwidth"
              f" ({host:.1f} GB/s) is too low; measuring it again."),
        remeasure=f"a reply decoded at {steps_pct:.0f}% of the roofline of {host:.1f} GB/s")


def record_calibration(info: ModelInfo, done: Done | None, config: Config,
                       load: MachineLoad | None = None) -> str | None:
    """After an in-process ``localinfer run``: record its measured/predicted decode for this
    machine, with the machine's ``load`` over the run. Returns a note for the user when the
    run marked the bandwidth figure to be measured again. Never fails the run (a calibration
    problem is logged, not shown)."""
    reason = _record_reply(info, done, config.threads, load)
    return drift_note(reason) if reason else None


def _record_reply(info: ModelInfo, done: Done | None, n_threads: int | None,
                  load: MachineLoad | None) -> str | None:
    """Record a reply of a model loaded in this process; why it marked the host bandwidth
    figure to be measured again, or None."""
    if done is None or done.finish_reason == "cancelled":
        return None
    t = done.timings
    try:
        if t.drafted_tokens and t.decode_tokens:  # several tokens a step: not a decode rate
            steps_tps = t.decode_tps * (t.decode_tokens - t.accepted_tokens) / t.decode_tokens
            return check_steps(model_path=info.path, model_name=info.name,
                               n_gpu_layers=info.n_gpu_layers, prompt_tokens=t.prompt_tokens,
                               decode_tokens=t.decode_tokens, steps_tps=steps_tps,
                               kv_type=info.kv_type)
        m = record_run(model_path=info.path, model_name=info.name,
                       n_gpu_layers=info.n_gpu_layers, n_threads=n_threads,
                       prompt_tokens=t.prompt_tokens, decode_tokens=t.decode_tokens,
                       decode_tps=t.decode_tps, kv_type=info.kv_type, load=load)
    except Exception:
        log.debug("calibration not recorded", exc_info=True)
        return None
    return m.drift if m is not None else None


def flag_bandwidth(hw: HardwareProfile, reason: str, cache_dir: Path | None = None) -> bool:
    """Mark ``hw``'s measured host bandwidth figure to be measured again by the next probe
    that may measure. False when there is no measured figure to doubt."""
    if hw.bandwidth_source != "measured":
        return False
    return bw.mark_suspect((cache_dir or get_paths().cache_dir) / "hardware",
                           bw.profile_key(hw), reason)


def drift_note(reason: str) -> str:
    return (f"note: {reason}: the cached host bandwidth figure looks wrong; it will be measured"
            " again the next time the hardware is probed (`localinfer hw --remeasure` does it"
            " now).")
