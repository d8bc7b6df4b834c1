"""Calibration: measured/predicted decode speed per machine, learnt from real runs.

``localinfer run`` (and later ``localinfer bench``) records each real decode rate against
what the planner predicted for the same placement; the planner then multiplies its
predictions on this machine by the geometric mean of the last few ratios, per backend (the
CPU, CUDA, Metal...). The file is a cache (``<cache>/hardware/calibration.json``): deleting it
only returns the planner to its uncalibrated formula.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import gguf
from ..paths import atomic_write_text, get_paths, read_json_object
from ..planner import Candidate, predict
from .probe import probe
from .profile import HardwareProfile

if TYPE_CHECKING:  # annotations only: runtime/__init__ would load the engine
    from ..config import Config
    from ..protocol import ModelInfo
    from ..runtime.types import Done

log = logging.getLogger(__name__)

FILE = "calibration.json"
MIN_DECODE_TOKENS = 32
"""Fewer decoded tokens than this measure the warm-up more than the machine."""
KEEP = 8
USE_LAST = 5


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


def profile_key(hw: HardwareProfile) -> str:
    """The same CPU, RAM size, GPUs and llama.cpp backends make the same machine."""
    text = "|".join([hw.cpu.model, f"{round(hw.ram_total_gib)}GiB", str(hw.cpu.logical_cores),
                     *sorted(g.name for g in hw.gpus), *sorted(hw.backends)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _path(cache_dir: Path | None) -> Path:
    return (cache_dir or get_paths().cache_dir) / "hardware" / FILE


def load_ratios(hw: HardwareProfile, cache_dir: Path | None = None) -> dict[str, float]:
    """{backend: ratio} for this machine: the geometric mean of the last measurements."""
    entries = read_json_object(_path(cache_dir)).get(profile_key(hw), {})
    ratios: dict[str, float] = {}
    if not isinstance(entries, dict):
        return ratios
    for backend, records in entries.items():
        if not isinstance(records, list):  # a hand-edited or foreign cache: ignore it
            continue
        recorded = [r.get("ratio") for r in records[-USE_LAST:] if isinstance(r, dict)]
        values = [v for v in recorded if isinstance(v, (int, float)) and 0.05 <= v <= 20]
        if values:
            ratios[backend] = math.exp(sum(math.log(v) for v in values) / len(values))
    return ratios


def history(hw: HardwareProfile, cache_dir: Path | None = None) -> dict[str, list[Measurement]]:
    entries = read_json_object(_path(cache_dir)).get(profile_key(hw), {})
    out: dict[str, list[Measurement]] = {}
    for backend, records in (entries.items() if isinstance(entries, dict) else []):
        try:
            out[backend] = [Measurement(**r) for r in records]
        except TypeError:
            continue
    return out


def record(hw: HardwareProfile, backend: str, measurement: Measurement,
           cache_dir: Path | None = None) -> None:
    """Append one measurement (the file keeps the last few per machine and backend)."""
    path = _path(cache_dir)
    data = read_json_object(path)
    machine = data.setdefault(profile_key(hw), {})
    records = machine.setdefault(backend, [])
    records.append(asdict(measurement))
    del records[:-KEEP]
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def record_run(*, model_path: str | Path, model_name: str, n_gpu_layers: int,
               n_threads: int | None, prompt_tokens: int, decode_tokens: int,
               decode_tps: float, hw: HardwareProfile | None = None,
               cache_dir: Path | None = None, kv_type: str = "f16") -> Measurement | None:
    """Compare a real run's decode rate with the planner's prediction for the same model,
    placement and context position, and record the ratio. Returns None when the run decoded
    too few tokens to say anything."""
    if decode_tokens < MIN_DECODE_TOKENS or decode_tps <= 0:
        return None
    hw = hw or probe()  # the bandwidth is measured once per machine, then cached
    header = gguf.read_header(model_path)
    candidate = Candidate.from_header(header, name=model_name)
    position = prompt_tokens + decode_tokens // 2
    prediction = predict(candidate, hw, n_gpu_layers, position=position, n_threads=n_threads,
                         kv_type=kv_type)
    measurement = Measurement(
        ratio=round(decode_tps / prediction.decode_tps, 4),
        predicted_tps=round(prediction.decode_tps, 2), measured_tps=round(decode_tps, 2),
        model=model_name, n_gpu_layers=n_gpu_layers, tokens=decode_tokens, at=time.time())
    record(hw, prediction.key, measurement, cache_dir)
    log.debug("calibration: %s predicted %.1f tok/s, measured %.1f (ratio %.3f)", model_name,
              prediction.decode_tps, decode_tps, measurement.ratio)
    return measurement


def record_calibration(info: ModelInfo, done: Done | None, config: Config) -> None:
    """After an in-process ``localinfer run``: record its measured/predicted decode for this
    machine. Never fails the run (a calibration problem is logged, not shown)."""
    if done is None or done.finish_reason == "cancelled":
        return
    t = done.timings
    if t.drafted_tokens:  # speculation makes several tokens per step: not a decode rate
        return
    try:
        record_run(model_path=info.path, model_name=info.name, n_gpu_layers=info.n_gpu_layers,
                   n_threads=config.threads, prompt_tokens=t.prompt_tokens,
                   decode_tokens=t.decode_tokens, decode_tps=t.decode_tps,
                   kv_type=info.kv_type)
    except Exception:
        log.debug("calibration not recorded", exc_info=True)
