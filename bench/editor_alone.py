"""One editor typing, against localinfer and llama-server: what a keystroke's completion costs
when nothing else runs, and beside a client that reads long prompts (an agent's, a file opened
cold). The editor sends llama.vscode's /infill request for each keystroke and waits for its
reply, then 0.3 s, as a user who reads each suggestion; the first (cold) request is not counted.

Each server runs alone with its documented editor settings, as in bench/editor_workload.py
(localinfer's defaults; llama-server with llama.vscode's CPU-only FIM flags), rounds
alternating which goes first. It prints, per server: the editor's latency (p50, max), the
server's prompt time (p50), the longest of each reply's completions (tokens, p50), and with
``--reader`` the long prompts' time to their one token.

    python bench/editor_alone.py --fim-file F.gguf [--llama-server PATH] [--keystrokes 14]
        [--reader] [--rounds N]

F.gguf: a model with FIM tokens (bench/editor_workload.py says how to make one of the starter).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from localinfer.bench.editor_workload import (
    STATEMENT,
    Target,
    Workload,
    completion_tokens,
    editor_file,
    fim_body,
    fim_replies,
    prompt_figures,
    start_llama_server,
    start_localinfer,
    stop,
)
from localinfer.errors import LocalInferError

READER_WORDS = 1200
"""Words of each long prompt (4,664 tokens of the starter's)."""


def long_reads(target: Target, done: threading.Event, out: list[float],
               errors: list[str]) -> None:
    """Raw completions of a long prompt, one token each, one after another until ``done``:
    the time to each reply into ``out``, a failure into ``errors``."""
    rng = random.Random(1)
    with httpx.Client(timeout=600) as http:
        while not done.is_set():
            prompt = " ".join(f"{rng.choice(['alpha', 'beta', 'gamma', 'delta'])}"
                              f"{rng.randrange(1000)}" for _ in range(READER_WORDS))
            sent = time.perf_counter()
            try:
                r = http.post(f"{target.url}/v1/completions", json={
                    "model": target.fim_model, "prompt": prompt, "max_tokens": 1})
            except httpx.HTTPError as exc:
                errors.append(f"the long prompt: {exc}")
                return
            if r.status_code != 200:
                errors.append(f"the long prompt: HTTP {r.status_code} {r.text[:200]}")
                return
            out.append(time.perf_counter() - sent)


def type_along(target: Target, keystrokes: int, reader: bool) -> dict[str, float]:
    w = Workload()
    text, cursor, extra = editor_file(w, 0)
    latency, prompt_s, longest, reads = [], [], [], []
    errors: list[str] = []
    done = threading.Event()
    thread = threading.Thread(target=long_reads, args=(target, done, reads, errors),
                              daemon=True)
    with httpx.Client(timeout=600) as http:
        for key in range(keystrokes + 1):
            if key == 1 and reader:
                thread.start()  # once the editor's file is cached
            text = text[:cursor] + STATEMENT[key % len(STATEMENT)] + text[cursor:]
            cursor += 1
            body = fim_body(text, cursor, extra, target.fim_model, w.n_predict, w.completions)
            sent = time.perf_counter()
            r = http.post(f"{target.url}/infill", json=body)
            took = time.perf_counter() - sent
            if r.status_code != 200:
                raise LocalInferError(f"/infill: HTTP {r.status_code} {r.text[:200]}",
                                      title="editor alone")
            replies = fim_replies(r)
            if key:  # the first read the file cold
                latency.append(took)
                prompt_ms, _ = prompt_figures(replies[0])  # the one that read the prompt
                if prompt_ms is not None:
                    prompt_s.append(prompt_ms / 1000)
                longest.append(max(completion_tokens(x) for x in replies))
            time.sleep(0.3)
    done.set()
    if reader:
        thread.join()
    if errors:
        raise LocalInferError(errors[0], title="editor alone")
    figures = {"latency_p50_s": statistics.median(latency), "latency_max_s": max(latency),
               "prompt_p50_s": statistics.median(prompt_s) if prompt_s else float("nan"),
               "longest_tokens_p50": statistics.median(longest)}
    if reads:
        figures |= {"long_reads": len(reads), "long_read_p50_s": statistics.median(reads)}
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fim-file", type=Path, required=True)
    parser.add_argument("--llama-server", type=Path, default=None, metavar="PATH")
    parser.add_argument("--keystrokes", type=int, default=14,
                        help="keystrokes after the first (cold) one, at least 1")
    parser.add_argument("--reader", action="store_true",
                        help="a second client reads long prompts meanwhile")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if args.keystrokes < 1:
        parser.error("--keystrokes must be at least 1")
    logs = Path(tempfile.mkdtemp(prefix="editor-alone-"))
    fim = args.fim_file.resolve()
    servers = ["localinfer"] + (["llama-server"] if args.llama_server else [])
    print(f"server logs in {logs}", flush=True)
    for round_ in range(max(1, args.rounds)):
        for server in servers if round_ % 2 == 0 else servers[::-1]:
            if server == "localinfer":
                home = logs / f"home-{round_}"
                home.mkdir()
                procs, target = start_localinfer(fim, fim, home, logs / "localinfer.log")
            else:
                assert args.llama_server is not None
                procs, target = start_llama_server(args.llama_server, fim, fim,
                                                   logs / "llama-server.log")
            try:
                figures = type_along(target, args.keystrokes, args.reader)
            finally:
                stop(procs)
            shown = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in figures.items())
            print(f"round {round_ + 1}, {server}: {shown}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LocalInferError as exc:
        print(f"editor_alone: {exc.one_line()}", file=sys.stderr)
        sys.exit(exc.exit_code)
