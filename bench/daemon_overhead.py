"""Daemon overhead: streaming through `localinfer serve` (Unix socket and TCP) against the
in-process engine, same model, same prompts, in one run.

The daemon runs as its own process (as it does for an editor); this process is its HTTP
client, and between daemon runs it drives an in-process engine on the same prompts. For
each request it measures, as the client sees them, the time to the first token and the
decode rate between the first and the last token of the stream (OpenAI /v1/completions,
SSE). Targets (issue 4): decode >= 0.97 x in-process, TTFT within +10 ms.

    python bench/daemon_overhead.py [--model gemma3:270m] [--runs 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from streaming import figures, stream_engine

PROMPTS = [
    "The history of the printing press begins",
    "Here is a recipe for a simple tomato soup:",
    "The three laws of thermodynamics are",
]


def stream_http(client: httpx.Client, model: str, prompt: str, n: int) -> tuple[float, float]:
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
            "stream": True, "speculative": False}  # one-token steps on both sides
    t0 = time.perf_counter()
    times = []
    with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    times.append(time.perf_counter())
    return figures(t0, times)[:2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3:270m")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=2048)
    args = parser.parse_args()

    from localinfer.config import Config
    from localinfer.loading import open_engine

    sock = Path(tempfile.mkdtemp(prefix="li-bench-", dir="/tmp")) / "d.sock"
    port = 11000 + os.getpid() % 1000
    daemon = subprocess.Popen(
        [sys.executable, "-m", "localinfer", "serve", "--socket", str(sock), "--port",
         str(port), "--ctx", str(args.ctx), "--slots", "1", "--keep-alive", "-1"],
        stdout=subprocess.PIPE, text=True)
    assert daemon.stdout is not None  # stdout=PIPE
    try:
        print(daemon.stdout.readline().strip(), flush=True)
        clients = {
            "socket": httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)),
                                   base_url="http://localhost", timeout=120),
            "tcp": httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120),
        }
        engine = open_engine(args.model, Config(ctx=args.ctx))
        print(f"model {engine.info.name}, {args.tokens} tokens, {args.runs} runs x"
              f" {len(PROMPTS)} prompts", flush=True)
        sides = {
            "in-process": lambda p: stream_engine(engine, p, args.tokens)[:2],
            "socket": lambda p: stream_http(clients["socket"], args.model, p, args.tokens),
            "tcp": lambda p: stream_http(clients["tcp"], args.model, p, args.tokens),
        }
        for fn in sides.values():  # warm-up (and the daemon's model load)
            fn("Warm up")
        results: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
        for run in range(args.runs):
            order = list(sides)[run % 3:] + list(sides)[:run % 3]
            for i, base in enumerate(PROMPTS):
                for side in order:
                    # Unique first words: nobody reuses a previous request's KV cache.
                    results[side].append(sides[side](f"Run {run}-{i} {side}. {base}"))
            print(f"run {run + 1}/{args.runs}: " + ", ".join(
                f"{k} {statistics.median(t for _, t in v):.1f} tok/s"
                for k, v in results.items()), flush=True)
        engine.close()
    finally:
        daemon.terminate()
        daemon.wait(30)

    base_ttft = statistics.median(t for t, _ in results["in-process"])
    base_tps = statistics.median(t for _, t in results["in-process"])
    print()
    print(f"{'':14}{'decode tok/s':>14}{'ratio':>9}{'TTFT ms':>10}{'vs in-process':>15}")
    ok = True
    for side, values in results.items():
        ttft = statistics.median(t for t, _ in values)
        tps = statistics.median(t for _, t in values)
        print(f"{side:14}{tps:>14.1f}{tps / base_tps:>8.3f}x{ttft:>10.1f}"
              f"{ttft - base_ttft:>+13.1f}ms")
        if side != "in-process":
            ok &= tps >= 0.97 * base_tps and ttft <= base_ttft + 10
    print(f"targets (decode >= 0.97x, TTFT within +10 ms): {'met' if ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
