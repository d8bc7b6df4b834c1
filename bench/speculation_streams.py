"""Speculation by cost through the daemon: aggregate tok/s of 1, 2, 4 and 8 greedy streams with
speculation off, on (every draft verified) and adaptive (the default), and optionally the same
streams on llama-server, in alternating rounds; it prints medians and the load average.

Each stream is its own HTTP client and thread on the OpenAI streaming API (/v1/completions),
over loopback TCP for both servers. The goal (issue 15): at every width, adaptive within 3% of
the better of on and off; with 4 streams, at least llama-server's `-np 4`.

    python bench/speculation_streams.py [--model gemma3:270m] [--tokens 64] [--rounds 3]
        [--widths 1,2,4,8] [--llama-server PATH --gguf FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from daemon_concurrency import stream
from localinfer.bench.editor_workload import free_port, stop, wait_http
from localinfer.bench.engine_bench import STORY_PROMPTS

MODES = {"off": False, "on": True, "adaptive": None}


def aggregate(url: str, body: dict, width: int) -> float:
    """Tokens per second of ``width`` streams started together, from the first request to
    the last token (each stream's token count from the timings its server sends last:
    localinfer's ``completion_tokens``, llama-server's ``predicted_n``)."""
    counts: list[int] = []

    def one(prompt: str) -> None:
        with httpx.Client(base_url=url, timeout=600) as c:
            server = stream(c, "/v1/completions", {**body, "prompt": prompt})["server"]
        counts.append(server.get("completion_tokens") or server.get("predicted_n") or 0)

    threads = [threading.Thread(target=one, args=(p,)) for p in STORY_PROMPTS[:width]]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3:270m")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--widths", default="1,2,4,8")
    parser.add_argument("--slots", type=int, default=0, help="daemon slots (default: its plan)")
    parser.add_argument("--llama-server", type=Path, default=None, metavar="PATH")
    parser.add_argument("--gguf", type=Path, default=None, help="the model file for llama-server")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    home = Path(tempfile.mkdtemp(prefix="li-spec-", dir="/tmp"))
    port = free_port()
    serve = [sys.executable, "-m", "localinfer", "serve", "--port", str(port), "--socket",
             str(home / "d.sock"), "--keep-alive", "-1"]
    if args.slots:
        serve += ["--slots", str(args.slots)]
    procs = [subprocess.Popen(serve, stdout=(home / "daemon.log").open("w"),
                              stderr=subprocess.STDOUT)]
    ours = f"http://127.0.0.1:{port}"
    theirs = None
    try:
        wait_http(f"{ours}/health", procs[0])
        if args.llama_server:
            lport = free_port()
            procs.append(subprocess.Popen(
                [str(args.llama_server), "-m", str(args.gguf), "-np", "4", "-c", "16384",
                 "--host", "127.0.0.1", "--port", str(lport), "-t", "2"],
                stdout=(home / "llama-server.log").open("w"), stderr=subprocess.STDOUT))
            theirs = f"http://127.0.0.1:{lport}"
            wait_http(f"{theirs}/health", procs[-1])
        body = {"model": args.model, "max_tokens": args.tokens, "temperature": 0}
        for url in (ours, theirs) if theirs else (ours,):
            aggregate(url, body, 1)  # load the model and warm it up
        figures: dict[tuple[int, str], list[float]] = {}
        loads = []
        for r in range(args.rounds):
            for width in widths:
                for mode, speculative in MODES.items():
                    spec = {} if speculative is None else {"speculative": speculative}
                    figures.setdefault((width, mode), []).append(
                        aggregate(ours, {**body, **spec}, width))
                if theirs:
                    figures.setdefault((width, "llama-server"), []).append(
                        aggregate(theirs, body, width))
                loads.append(os.getloadavg()[0])
                print(f"round {r + 1}, {width} streams: " + ", ".join(
                    f"{m} {v[-1]:.1f}" for (w, m), v in figures.items() if w == width)
                      + f" (load {loads[-1]:.1f})", flush=True)
        columns = list(MODES) + (["llama-server"] if theirs else [])
        print(f"\naggregate tok/s, medians of {args.rounds} rounds ({args.tokens} tokens a"
              f" stream, greedy; load average {min(loads):.1f}-{max(loads):.1f}):")
        print("streams " + "".join(f"{c:>14}" for c in columns) + "   adaptive/best")
        for width in widths:
            med = {c: statistics.median(figures[(width, c)]) for c in columns}
            best = max(med["on"], med["off"])
            print(f"{width:7d} " + "".join(f"{med[c]:14.1f}" for c in columns)
                  + f"   {med['adaptive'] / best:.2f}")
    finally:
        stop(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
