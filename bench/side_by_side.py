"""localinfer's daemon and llama-server side by side in one run, on the same model with the same
requests from the same streaming HTTP client (OpenAI's API), alternating which server goes first
each round, and the ratios between them.

    python bench/side_by_side.py --llama-server PATH [--model F.gguf] [--quick]
        [--rounds N] [--json OUT.json] [--llama-server-arg ARG ...]

Rows: one stream greedy and sampled (decode tok/s), 4 and 8 streams at once (aggregate tok/s:
completion tokens over the wall time), TTFT of a short fresh message, TTFT of the 5th turn of a
chat (four turns of about 300 tokens each before it, each reply the server's own) and its ratio
to the fresh message, and a code edit (repeat a 60-line function with one change, on the
completions route: where prompt-lookup speculation helps). Each server has 8 slots of 4,096
tokens: ``localinfer serve --slots 8 --ctx 4096`` and ``llama-server -np 8 -c 32768``, every
other setting its default. The machine's load average is printed with each server's figures:
other work skews them.

llama-server is built from the llama.cpp sources vendored in the llama-cpp-python sdist
(cmake -DLLAMA_BUILD_SERVER=ON, target llama-server); never built by the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from localinfer import gguf
from localinfer.bench.editor_workload import (
    Target,
    start_llama_server_process,
    start_localinfer,
    stop,
)
from localinfer.bench.engine_bench import _PARAGRAPH, CODE_EDIT_PROMPT, STORY_PROMPTS
from localinfer.hardware.probe import probe_cpu
from localinfer.loading import fallback_template
from localinfer.store import ModelStore
from streaming import stream

SLOTS = 8
CTX_PER_SLOT = 4096
LOCALINFER_ARGS = ("--slots", str(SLOTS), "--ctx", str(CTX_PER_SLOT))
LLAMA_SERVER_ARGS = ("-np", str(SLOTS), "-c", str(SLOTS * CTX_PER_SLOT))
TOPICS = ["the history of the printing press", "how tides work", "baking sourdough bread",
          "the rules of chess"]
QUESTIONS = ["Now summarise everything we discussed in three sentences.",
             "Which of these topics would you explain to a child first, and why?",
             "List the four topics we covered, one per line, with a short title each.",
             "What is the most surprising fact you mentioned?",
             "Give me one question to test my understanding.",
             "Which topic has the longest history?",
             "Explain the second topic again in one short paragraph.",
             "Which two of these topics have the most in common?",
             "Write a short quiz question about the last topic.",
             "What should I read next to learn more about any of them?",
             "Summarise the first topic in one sentence.",
             "Which topic was the hardest to explain, and why?"]
"""Each asked as the 5th turn and as a fresh message: twelve pairs, as single TTFTs on a laptop
vary by 10-30% (the ratio of the medians of six pairs ranged over 0.98-1.32 in five runs on
one machine)."""


def client(url: str) -> httpx.Client:
    """A client that opens a connection per request: llama-server closes a streamed reply's
    connection, and a pooled one would then fail on the next request."""
    return httpx.Client(base_url=url, timeout=600,
                        limits=httpx.Limits(max_keepalive_connections=0))


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def measure(target: Target, quick: bool) -> dict[str, Any]:
    """Every row against one running server."""
    n_tokens = 32 if quick else 64
    http = client(target.url)
    greedy = {"model": target.chat_model, "max_tokens": n_tokens, "temperature": 0}
    sampled = {**greedy, "temperature": 0.7, "seed": 1}
    prompts = STORY_PROMPTS[:2 if quick else 3]
    out: dict[str, Any] = {"load_before": os.getloadavg()[0]}

    def chat_stream(body: dict, messages: list[dict[str, str]],
                    via: httpx.Client = http) -> dict:
        return stream(via, "/v1/chat/completions", {**body, "messages": messages})

    chat_stream({**greedy, "max_tokens": 4}, chat("Warm up"))
    out["greedy_tps"] = statistics.median(chat_stream(greedy, chat(p))["decode_tps"]
                                          for p in prompts)
    out["sampled_tps"] = statistics.median(chat_stream(sampled, chat(p))["decode_tps"]
                                           for p in prompts)
    for width in (4, 8):
        clients = [client(target.url) for _ in range(width)]
        started = time.perf_counter()
        with ThreadPoolExecutor(width) as pool:  # each stream its own client and thread
            results = list(pool.map(lambda c, p: chat_stream(greedy, chat(p), c), clients,
                                    STORY_PROMPTS[:width]))
        wall = time.perf_counter() - started
        out[f"streams{width}_tps"] = sum(r["tokens"] for r in results) / wall
        for c in clients:
            c.close()

    # A chat: each turn resends the whole conversation with the server's own replies.
    turn = {**greedy, "max_tokens": 48}
    messages: list[dict[str, str]] = []
    for i, topic in enumerate(TOPICS):
        messages += chat(f"Turn {i + 1}. Tell me about {topic}. " + _PARAGRAPH * 3)
        reply = chat_stream(turn, messages)
        messages.append({"role": "assistant", "content": reply["text"]})
    first = {**greedy, "max_tokens": 4}
    questions = QUESTIONS[:3] if quick else QUESTIONS
    fifth, fresh = [], []
    for i, q in enumerate(questions):  # interleaved, each first by turns: the load drifts
        pair = [(fifth, messages + chat(q)), (fresh, chat(q))]
        for replies, asked in pair if i % 2 == 0 else pair[::-1]:
            replies.append(chat_stream(first, asked))
    out["fresh_ttft_ms"] = statistics.median(r["ttft_ms"] for r in fresh)
    out["fifth_ttft_ms"] = statistics.median(r["ttft_ms"] for r in fifth)
    out["fifth_prompt_tokens"] = (fifth[0]["usage"] or {}).get("prompt_tokens")
    # As the server measured it (localinfer: from its engine's submit; llama-server: its prompt
    # processing): the rest of the client's TTFT is the HTTP path, the template, tokenizing.
    out["fresh_server_ms"] = statistics.median(server_ttft_ms(r) for r in fresh)
    out["fifth_server_ms"] = statistics.median(server_ttft_ms(r) for r in fifth)

    edit = {"model": target.chat_model, "prompt": CODE_EDIT_PROMPT, "temperature": 0,
            "max_tokens": 200 if quick else 600, "stop": ["```"]}
    code_edit = stream(http, "/v1/completions", edit)
    out["code_edit_tps"] = code_edit["decode_tps"]
    out["code_edit_tokens"] = code_edit["tokens"]
    http.close()
    out["load_after"] = os.getloadavg()[0]
    return out


def server_ttft_ms(reply: dict) -> float:
    timings = reply["server"]
    return float(timings.get("ttft_ms", timings.get("prompt_ms", 0.0)))


ROWS = [("1 stream, greedy (tok/s)", "greedy_tps"),
        ("1 stream, temperature 0.7 (tok/s)", "sampled_tps"),
        ("4 streams, aggregate (tok/s)", "streams4_tps"),
        ("8 streams, aggregate (tok/s)", "streams8_tps"),
        ("TTFT, short fresh message (ms)", "fresh_ttft_ms"),
        ("TTFT, 5th chat turn (ms)", "fifth_ttft_ms"),
        ("5th turn / fresh message", "fifth_ratio"),
        ("TTFT, fresh / 5th turn, server-side (ms)", "server"),
        ("code edit, greedy (tok/s)", "code_edit_tps"),
        ("load average before / after", "load")]


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k, v in rounds[0].items() if isinstance(v, (int, float))]
    out = {k: statistics.median(r[k] for r in rounds) for k in keys}
    out["fifth_ratio"] = out["fifth_ttft_ms"] / out["fresh_ttft_ms"]
    return out


def table(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    def show(r: dict[str, Any], key: str) -> str:
        if key == "load":
            return f"{r['load_before']:.1f} / {r['load_after']:.1f}"
        if key == "server":
            return f"{r['fresh_server_ms']:.1f} / {r['fifth_server_ms']:.1f}"
        return f"{r[key]:.2f}" if key == "fifth_ratio" else f"{r[key]:.1f}"

    lines = ["| | localinfer | llama-server | ratio |", "|---|---|---|---|"]
    for label, key in ROWS:
        ratio = "" if key in ("load", "server") else f"{ours[key] / theirs[key]:.2f}x"
        lines.append(f"| {label} | {show(ours, key)} | {show(theirs, key)} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", type=Path, required=True, metavar="PATH",
                        help="the llama-server binary to compare with")
    parser.add_argument("--model", type=Path, default=None,
                        help="GGUF both servers load (default: the starter)")
    parser.add_argument("--quick", action="store_true", help="fewer and shorter requests")
    parser.add_argument("--rounds", type=int, default=2,
                        help="run both servers this many times, alternating which goes first")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT",
                        help="also write the figures as JSON")
    parser.add_argument("--llama-server-arg", action="append", default=[], metavar="ARG",
                        help="one more llama-server argument (repeat for each), e.g."
                             " --llama-server-arg=-fa --llama-server-arg=off to compare at"
                             " localinfer's attention on the CPU")
    args = parser.parse_args()
    if not shutil.which(str(args.llama_server)):
        print(f"no llama-server at {args.llama_server}", file=sys.stderr)
        return 2
    model = (args.model or ModelStore().resolve("gemma3:270m").path).resolve()
    logs = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    # A file without a chat template of its own (the starter): llama-server would fall back to
    # ChatML; give it the template localinfer renders with, so that both read the same prompt.
    server_args = [*LLAMA_SERVER_ARGS, *args.llama_server_arg]
    template = fallback_template(gguf.read_header(model), None)
    if template is not None:
        (logs / "chat-template.jinja").write_text(template)
        server_args += ["--chat-template-file", str(logs / "chat-template.jinja")]

    cpu = probe_cpu()
    print(f"model {model}\nlocalinfer serve {' '.join(LOCALINFER_ARGS)};"
          f" llama-server {' '.join(server_args)}\nCPU {cpu.model}, {cpu.physical_cores}"
          f" cores, AVX-512: {'avx512f' in cpu.flags}; server logs in {logs}", flush=True)

    def localinfer(round_: int) -> tuple[list, Target]:
        home = logs / f"localinfer-home-{round_}"
        home.mkdir()
        return start_localinfer(model, model, home, logs / "localinfer.log", LOCALINFER_ARGS)

    def llama_server(round_: int) -> tuple[list, Target]:
        proc, url = start_llama_server_process(args.llama_server, model, server_args,
                                               logs / "llama-server.log")
        return [proc], Target("llama-server", url, "bench", "bench", "bench")

    servers: dict[str, Callable[[int], tuple[list, Target]]] = {
        "localinfer": localinfer, "llama-server": llama_server}
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    for round_ in range(max(1, args.rounds)):
        order = list(servers) if round_ % 2 == 0 else list(servers)[::-1]
        for name in order:
            procs, target = servers[name](round_)
            try:
                figures[name].append(measure(target, args.quick))
            finally:
                stop(procs)
            print(f"round {round_ + 1}, {name}: {json.dumps(figures[name][-1])}", flush=True)
    ours, theirs = median_of(figures["localinfer"]), median_of(figures["llama-server"])
    print(f"\nmedians of {len(figures['localinfer'])} rounds:\n{table(ours, theirs)}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
