"""What the bench scripts measure of one stream, as its consumer sees it (imported by them;
each script puts bench/ on sys.path by running from it)."""

from __future__ import annotations

import time


def figures(t0: float, times: list[float]) -> tuple[float, float, int]:
    """From the request's start and each text chunk's arrival: TTFT in ms, the decode rate
    between the first and the last chunk, and the number of chunks."""
    if not times:
        return 0.0, 0.0, 0
    ttft_ms = (times[0] - t0) * 1000
    decode_tps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    return ttft_ms, decode_tps, len(times)


def stream_engine(engine, prompt: str, n: int) -> tuple[float, float, int]:
    """A greedy completion streamed from an in-process engine, without speculation (these
    scripts compare one-token steps)."""
    from localinfer.runtime.types import SamplingParams, Token

    t0 = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=n, speculative=False)
    times = [time.perf_counter() for event in engine.complete(prompt, params)
             if isinstance(event, Token)]
    return figures(t0, times)
