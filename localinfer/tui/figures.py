"""The chat UI's speed figures in words, and the sparkline's samples, as plain functions (no
Textual here, so they test in isolation).

Measured: decode, TTFT and prefill come from the engine's own timings (``LiveStats`` on every
token, ``Timings`` at the end); the sparkline's samples are tokens over wall time between
token arrivals, measured by the UI. Predicted: the memory-bandwidth roofline and the planner's
decode speed for the same placement (``planner.Roofline``, ``session.DecodeReference``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..chats import ReplyStats
    from ..protocol import ModelInfo


class SpeedTracker:
    """Decode speed over one reply, for the sparkline: each sample is the tokens that arrived
    over the last ``window`` tokens' wall time, the first once that many have come (two
    arrivals a millisecond apart, tokens the UI took together, read as a rate of thousands
    and flattened the line). At most ``max_samples`` are kept (older ones are merged
    pairwise), so a long reply costs the same to draw as a short one."""

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
        if len(arrivals) < 2 or at <= t0 or n_tokens - n0 < self.window:
            return None
        sample = (n_tokens - n0) / (at - t0)
        self.samples.append(sample)
        if len(self.samples) > self.max_samples:
            pairs = zip(self.samples[0::2], self.samples[1::2], strict=False)  # odd one: below
            merged = [(a + b) / 2 for a, b in pairs]
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


def ttft(ms: float, n_tokens: int) -> str:
    """"412 ms", or "–" for a reply cancelled before its first token (the engine's timings
    then say 0)."""
    return f"{thousands(ms)} ms" if n_tokens else "–"


def placement(info: ModelInfo) -> str:
    """"CPU only", "GPU 24/32 layers", "GPU 33/33 layers (CUDA)", or, split over
    workers, "CPU 6 + 13 layers on 2 workers" (it said "CPU only")."""
    remote = [(device, n) for device, n in info.split if device != "CPU"]
    if remote:
        here = sum(n for device, n in info.split if device == "CPU")
        hosts = len({device.rsplit(" #", 1)[0] for device, _ in remote})
        return (f"CPU {here} + {sum(n for _, n in remote)} layers on {hosts}"
                f" worker{'s' * (hosts != 1)}")
    if info.n_gpu_layers <= 0:
        return "CPU only"
    layers = info.n_gpu_layers  # llama.cpp's count: the output layer is one more
    backend = f" ({info.gpu_backend})" if info.gpu_backend else ""
    return f"GPU {layers}/{info.n_layers + 1} layers{backend}"


def thought_title(stats: ReplyStats | None, *, streaming: bool) -> str:
    """A reasoning block's title: "Thought for 4.2 s · 180 tok · 41.0 tok/s" (measured by
    the session: from its first token to the answer's first)."""
    if streaming or stats is None or not stats.thought_tokens:
        return "Thinking…" if streaming else "Thought"
    return (f"Thought for {stats.thought_ms / 1000:.1f} s · {stats.thought_tokens:,} tok ·"
            f" {tps(stats.thought_tps)} tok/s")


def summary_line(stats: ReplyStats) -> str:
    """The line that stays under a reply: all measured, except the roofline share (of a
    predicted ceiling). After reasoning, the answer's own TTFT and decode come first (from
    its first token), then the whole reply's."""
    parts = [f"{stats.completion_tokens} tok", f"decode {tps(stats.decode_tps)} tok/s",
             f"TTFT {ttft(stats.ttft_ms, stats.completion_tokens)}",
             f"prefill {tps(stats.prefill_tps)} tok/s"]
    if stats.thought_tokens:
        parts = [f"answer: TTFT {thousands(stats.answer_ttft_ms)} ms, decode"
                 f" {tps(stats.answer_decode_tps)} tok/s", "all: " + parts[0], *parts[1:]]
    if stats.cached_tokens:
        parts.append(f"{thousands(stats.cached_tokens)} cached")
    if stats.roofline_pct is not None:
        parts.append(f"{stats.roofline_pct:.0f}% of roofline")
    if stats.finish_reason != "stop":
        parts.append({"length": "token limit", "context": "context full",
                      "cancelled": "cancelled"}.get(stats.finish_reason, stats.finish_reason))
    return " · ".join(parts)
