"""What the bench scripts measure of one stream, as its consumer sees it (imported by them;
each script puts bench/ on sys.path by running from it)."""

from __future__ import annotations

import json
import time

import httpx


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


def stream(c: httpx.Client, path: str, body: dict) -> dict:
    """One request streamed over OpenAI's API (chat or completions, localinfer's daemon or
    llama-server): its text, TTFT and decode rate as the client saw them, the completion tokens
    the server counted, and the server's own ``timings``."""
    t0 = time.perf_counter()
    times, text, timings, usage = [], [], {}, {}
    with c.stream("POST", path, json={**body, "stream": True,
                                      "stream_options": {"include_usage": True}}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                if piece:
                    times.append(time.perf_counter())
                    text.append(piece)
            timings = chunk.get("timings") or timings
            usage = chunk.get("usage") or usage
    ttft_ms, _, _ = figures(t0, times)
    tokens = usage.get("completion_tokens") or len(times)
    # By tokens, not chunks: a speculative step streams several tokens at once.
    decode_s = times[-1] - times[0] if times else 0.0
    return {"text": "".join(text), "ttft_ms": ttft_ms, "tokens": tokens,
            "decode_tps": (tokens - 1) / decode_s if decode_s > 0 else 0.0,
            "wall_s": time.perf_counter() - t0, "server": timings, "usage": usage}
