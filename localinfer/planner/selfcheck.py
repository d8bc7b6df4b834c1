"""The self-check: ``localinfer bench`` compares its measured decode and prefill with what the
planner predicts for this machine and placement, says how far off the plan was and whether the
measurement fell inside the plan's interval, and keeps the last few checks per machine (a
cache, ``<cache>/hardware/self_check.json``). ``localinfer hw --report`` prints each as one
anonymous JSON line (device, backend, model, quant, predicted, measured; no host name, path
or user) to paste into an issue, so that the planner's tables grow from users' machines."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..hardware.profile import HardwareProfile
from ..paths import atomic_write_text, get_paths, read_json_object
from .calibration import profile_key
from .machine import interval

FILE = "self_check.json"
KEEP = 10
"""Checks kept per machine (the newest)."""


@dataclass(frozen=True)
class Figure:
    predicted: float
    measured: float
    low: float
    high: float
    """The plan's interval around ``predicted``."""

    @property
    def error(self) -> float:
        """predicted / measured - 1: +20% = the plan was 20% too fast."""
        return self.predicted / self.measured - 1 if self.measured else 0.0

    @property
    def inside(self) -> bool:
        return self.low <= self.measured <= self.high


@dataclass(frozen=True)
class SelfCheck:
    device: str
    """The device that took most of a token's time: the GPU's name, else the CPU model."""
    backend: str
    kind: str
    """"cpu", "discrete" or "integrated"."""
    bandwidth_gbps: float
    model: str
    quant: str
    size_gib: float
    n_gpu_layers: int
    n_layers: int
    threads: int
    decode: Figure
    prefill: Figure | None
    prefill_tokens: int
    quiet: bool
    """Whether the machine was quiet over the decode runs (a busy one measures its load)."""
    at: float = 0.0

    def lines(self) -> list[str]:
        """What ``localinfer bench`` says about it."""
        out = [_line("decode", self.decode, "tok/s", 1)]
        if self.prefill is not None:
            out.append(_line(f"prefill ({self.prefill_tokens} tokens)", self.prefill, "tok/s",
                             0))
        if not self.quiet:
            out.append("the machine was busy during the runs: the measurement is low")
        return out

    def report(self) -> str:
        """One anonymous JSON line for an issue."""
        data: dict[str, Any] = {
            "localinfer": __version__, "device": self.device, "backend": self.backend,
            "kind": self.kind, "bandwidth_gbps": round(self.bandwidth_gbps, 1),
            "model": self.model, "quant": self.quant, "size_gib": round(self.size_gib, 3),
            "n_gpu_layers": self.n_gpu_layers, "n_layers": self.n_layers,
            "threads": self.threads, "quiet": self.quiet,
            "decode": _figure(self.decode),
            "prefill": _figure(self.prefill) if self.prefill else None,
            "prefill_tokens": self.prefill_tokens}
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Any) -> SelfCheck:
        if not isinstance(data, dict):
            raise TypeError("not an object")
        pre = data.get("prefill")
        return cls(**{**data, "decode": Figure(**data["decode"]),
                      "prefill": Figure(**pre) if pre else None})


def _figure(f: Figure) -> dict[str, Any]:
    return {"predicted": round(f.predicted, 2), "measured": round(f.measured, 2),
            "interval": [round(f.low, 2), round(f.high, 2)]}


def _line(what: str, f: Figure, unit: str, digits: int) -> str:
    where = "inside" if f.inside else "outside"
    side = "under" if f.error < 0 else "over"
    return (f"{what}: measured {f.measured:.{digits}f} {unit}, the plan predicted"
            f" {f.predicted:.{digits}f} ({f.low:.{digits}f}-{f.high:.{digits}f}):"
            f" {abs(f.error):.0%} {side} the measurement, {where} its interval")


def build(hw: HardwareProfile, *, backend: str, model: str, quant: str, size_bytes: int,
          n_gpu_layers: int, n_layers: int, threads: int, predicted_decode: float,
          measured_decode: float, predicted_prefill: float, measured_prefill: float | None,
          prefill_tokens: int, quiet: bool) -> SelfCheck:
    """The check of one bench run; ``backend`` is the prediction's key (the backend that takes
    most of a token's time: "CPU" when it is the CPU)."""
    gpu = next((g for g, b in hw.usable_gpus() if b == backend), None)
    if backend != "CPU" and gpu is not None:
        device, kind, bandwidth = gpu.name, gpu.kind, gpu.bandwidth_gbps
    else:
        device, kind, bandwidth = hw.cpu.model or "unknown CPU", "cpu", hw.host_bandwidth_gbps
    d_low, d_high = interval(backend, "decode")
    p_low, p_high = interval(backend, "prefill")
    return SelfCheck(
        device=device, backend=backend, kind=kind, bandwidth_gbps=bandwidth, model=model,
        quant=quant, size_gib=size_bytes / 2**30, n_gpu_layers=n_gpu_layers, n_layers=n_layers,
        threads=threads,
        decode=Figure(predicted_decode, measured_decode, predicted_decode * d_low,
                      predicted_decode * d_high),
        prefill=Figure(predicted_prefill, measured_prefill, predicted_prefill * p_low,
                       predicted_prefill * p_high) if measured_prefill else None,
        prefill_tokens=prefill_tokens, quiet=quiet, at=time.time())


def _path(cache_dir: Path | None) -> Path:
    return (cache_dir or get_paths().cache_dir) / "hardware" / FILE


def record(hw: HardwareProfile, check: SelfCheck, cache_dir: Path | None = None) -> None:
    """Keep ``check`` with this machine's last KEEP."""
    path = _path(cache_dir)
    data = read_json_object(path)
    kept = [asdict(c) for c in checks(hw, cache_dir)][-(KEEP - 1):] + [asdict(check)]
    data[profile_key(hw)] = kept
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def checks(hw: HardwareProfile, cache_dir: Path | None = None) -> list[SelfCheck]:
    """This machine's checks, oldest first; malformed records are skipped."""
    entries = read_json_object(_path(cache_dir)).get(profile_key(hw), [])
    out = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            out.append(SelfCheck.from_dict(entry))
        except (TypeError, ValueError, KeyError):
            continue
    return out
