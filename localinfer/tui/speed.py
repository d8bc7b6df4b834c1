"""The chat UI's speed figures, as plain functions (no Textual here, so they test in isolation).

Measured: decode, TTFT and prefill come from the engine's own timings (``LiveStats`` on every
token, ``Timings`` at the end); the sparkline's samples are tokens over wall time between
token arrivals, measured by the UI. Predicted: the memory-bandwidth roofline,

    ceiling tok/s = 1 / sum over devices d of (bytes read per token on d / bandwidth of d)

where the bytes are the weights of the layers placed on d (exact, from the GGUF header) plus
their KV cache read at the current context length, and the bandwidth is the host's measured
read bandwidth (``localinfer hw``) or the GPU's data-sheet figure; and the planner's predicted
decode speed for the same placement. Decode as a percent of the ceiling says how close the
machine runs to its memory limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..chats import ReplyStats
    from ..hardware import HardwareProfile
    from ..planner import Candidate
    from ..runtime.backend import ModelInfo

KV_BYTES_PER_ELEMENT = 2.0  # F16 KV cache, as the runtime allocates it


@dataclass(frozen=True)
class Roofline:
    """Where the bytes of one decoded token come from, and how fast each device reads them."""

    cpu_bytes: float
    """Weight bytes read per token from host memory."""
    gpu_bytes: float
    cpu_kv_per_position: float
    """KV bytes read per token for each token already in the context (host layers)."""
    gpu_kv_per_position: float
    host_bandwidth_gbps: float
    host_bandwidth_source: str
    """"measured", "spec" or "estimated" (how the host figure was obtained)."""
    gpu_bandwidth_gbps: float = 0.0
    exact: bool = True
    """False when the weights per token are the file size (no header could be read)."""
    cpu_windows: tuple[tuple[float, int | None], ...] = ()
    gpu_windows: tuple[tuple[float, int | None], ...] = ()
    """(KV bytes per position, sliding window or None) per layer, when known: a sliding-window
    layer reads at most its window of cells."""

    def bytes_per_token(self, position: int) -> tuple[float, float]:
        """(host bytes, GPU bytes) read to decode one token at ``position``."""
        def kv(windows, per_position: float) -> float:
            if windows:
                return sum(b * (position if w is None else min(position, w))
                           for b, w in windows)
            return per_position * position
        return (self.cpu_bytes + kv(self.cpu_windows, self.cpu_kv_per_position),
                self.gpu_bytes + kv(self.gpu_windows, self.gpu_kv_per_position))

    def ceiling_tps(self, position: int) -> float | None:
        """The decode rate memory bandwidth allows at ``position`` (None if unknown)."""
        cpu, gpu = self.bytes_per_token(position)
        seconds = 0.0
        if cpu:
            if self.host_bandwidth_gbps <= 0:
                return None
            seconds += cpu / (self.host_bandwidth_gbps * 1e9)
        if gpu:
            if self.gpu_bandwidth_gbps <= 0:
                return None
            seconds += gpu / (self.gpu_bandwidth_gbps * 1e9)
        return 1.0 / seconds if seconds > 0 else None

    def percent(self, decode_tps: float, position: int) -> float | None:
        ceiling = self.ceiling_tps(position)
        if not ceiling or decode_tps <= 0:
            return None
        return 100.0 * decode_tps / ceiling


def roofline_for(info: ModelInfo, hardware: HardwareProfile,
                 candidate: Candidate | None) -> Roofline:
    """The roofline of a loaded model: exact per layer from its header (``candidate``), else
    the whole file read once per token, all from host memory."""
    gpu_bw = 0.0
    if info.n_gpu_layers > 0 and hardware.gpus:
        gpu = next((g for g in hardware.gpus if info.gpu_backend in g.drivers),
                   hardware.gpus[0])
        gpu_bw = gpu.bandwidth_gbps
    host_bw, source = hardware.host_bandwidth_gbps, hardware.bandwidth_source
    if candidate is None:
        on_gpu = info.n_gpu_layers >= info.n_layers > 0
        return Roofline(cpu_bytes=0.0 if on_gpu else float(info.size_bytes),
                        gpu_bytes=float(info.size_bytes) if on_gpu else 0.0,
                        cpu_kv_per_position=0.0, gpu_kv_per_position=0.0,
                        host_bandwidth_gbps=host_bw, host_bandwidth_source=source,
                        gpu_bandwidth_gbps=gpu_bw, exact=False)
    layers = candidate.layers
    n = len(layers)
    k = max(0, min(info.n_gpu_layers, n + 1))  # llama.cpp offloads the last layers first
    first_gpu = n - min(k, n)

    def windows(part) -> tuple[tuple[float, int | None], ...]:
        return tuple((layer.kv_elements_per_token * KV_BYTES_PER_ELEMENT, layer.sliding_window)
                     for layer in part)

    cpu_layers, gpu_layers = layers[:first_gpu], layers[first_gpu:]
    cpu_bytes = float(sum(layer.read_bytes for layer in cpu_layers))
    gpu_bytes = float(sum(layer.read_bytes for layer in gpu_layers))
    if k > n:
        gpu_bytes += candidate.output_bytes
    else:
        cpu_bytes += candidate.output_bytes
    return Roofline(
        cpu_bytes=cpu_bytes, gpu_bytes=gpu_bytes,
        cpu_kv_per_position=sum(b for b, _ in windows(cpu_layers)),
        gpu_kv_per_position=sum(b for b, _ in windows(gpu_layers)),
        host_bandwidth_gbps=host_bw, host_bandwidth_source=source, gpu_bandwidth_gbps=gpu_bw,
        cpu_windows=windows(cpu_layers), gpu_windows=windows(gpu_layers),
    )


class SpeedTracker:
    """Decode speed over one reply, for the sparkline: each sample is the tokens that arrived
    over the last ``window`` tokens' wall time. At most ``max_samples`` are kept (older ones
    are merged pairwise), so a long reply costs the same to draw as a short one."""

    def __init__(self, window: int = 8, max_samples: int = 240) -> None:
        self.window = window
        self.max_samples = max_samples
        self.samples: list[float] = []
        self._arrivals: list[tuple[int, float]] = []  # (tokens so far, time)

    def add(self, n_tokens: int, at: float) -> float | None:
        """Record that ``n_tokens`` had arrived at time ``at`` (seconds); return the new
        sample, if one could be taken."""
        arrivals = self._arrivals
        if arrivals and n_tokens <= arrivals[-1][0]:
            return None
        arrivals.append((n_tokens, at))
        # The oldest arrival at least `window` tokens back (or the first one).
        while len(arrivals) > 2 and n_tokens - arrivals[1][0] >= self.window:
            arrivals.pop(0)
        n0, t0 = arrivals[0]
        if len(arrivals) < 2 or at <= t0:
            return None
        sample = (n_tokens - n0) / (at - t0)
        self.samples.append(sample)
        if len(self.samples) > self.max_samples:
            merged = [(a + b) / 2 for a, b in zip(self.samples[0::2], self.samples[1::2])]
            if len(self.samples) % 2:
                merged.append(self.samples[-1])
            self.samples = merged
        return sample


# --- words ---------------------------------------------------------------------------------
def thousands(n: float) -> str:
    return f"{n:,.0f}"


def tps(value: float) -> str:
    if value <= 0 or not math.isfinite(value):
        return "–"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def placement(info: ModelInfo) -> str:
    """"CPU only", "GPU 24/32 layers" or "GPU 33/33 layers (CUDA)"."""
    if info.n_gpu_layers <= 0:
        return "CPU only"
    layers = min(info.n_gpu_layers, info.n_layers)
    backend = f" ({info.gpu_backend})" if info.gpu_backend else ""
    return f"GPU {layers}/{info.n_layers} layers{backend}"


def summary_line(stats: ReplyStats) -> str:
    """The line that stays under a reply: all measured, except the roofline share (of a
    predicted ceiling)."""
    parts = [f"{stats.completion_tokens} tok", f"decode {tps(stats.decode_tps)} tok/s",
             f"TTFT {thousands(stats.ttft_ms)} ms", f"prefill {tps(stats.prefill_tps)} tok/s"]
    if stats.cached_tokens:
        parts.append(f"{thousands(stats.cached_tokens)} cached")
    if stats.roofline_pct is not None:
        parts.append(f"{stats.roofline_pct:.0f}% of roofline")
    if stats.finish_reason != "stop":
        parts.append({"length": "token limit", "cancelled": "cancelled"}.get(
            stats.finish_reason, stats.finish_reason))
    return " · ".join(parts)
