"""localinfer's daemon and llama-server side by side in one run, on the same model with the same
requests from one streaming HTTP client (OpenAI's API), alternating which server goes first
each round, and the ratios between them.

    python bench/side_by_side.py --llama-server PATH [--model F.gguf] [--quick] [--agent]
        [--rounds N] [--json OUT.json] [--llama-server-arg ARG ...] [--localinfer-arg ARG ...]

Both servers run at their own defaults (``localinfer serve``; ``llama-server -m F``, plus the
chat template localinfer renders the model with when the file has none, so that both read the
same prompt); ``--llama-server-arg`` / ``--localinfer-arg`` add settings to one side. One
``httpx.Client`` makes every request to both, each on a new connection (llama-server closes a
streamed reply's connection), and reads each stream to its end.

Rows: one stream greedy and sampled (decode tok/s), 4 and 8 streams at once (aggregate tok/s:
completion tokens over the wall time), TTFT of a short fresh message, TTFT of the 5th turn of a
chat (four turns of about 300 tokens each before it, each reply the server's own), what a
request pays when the client before it left its stream after the first token (its TTFT less a
fresh message's), and a code edit (repeat a 60-line function with one change, on the
completions route: where prompt-lookup speculation helps). ``--agent`` adds a coding agent's
request: an ~18k-token system prompt (a repository's source) and a question, read cold, sent
again, and sent once more after the server was stopped and started again (localinfer on the
same home: its prefix cache on disk; llama-server keeps none at its defaults).

Each TTFT row also prints the server's own figure and the client's time less it (the HTTP path,
JSON, the template, tokenizing: llama-server's ``prompt_ms`` covers only its prompt's
evaluation, localinfer's ``ttft_ms`` runs from its engine's submit), and warns when the two
servers' client-minus-server times differ by more than a few ms: a TTFT row is only a fair
comparison of the engines when that overhead is alike. The machine's load average is printed
with each server's figures: other work skews them.

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
    serve_localinfer,
    start_llama_server_process,
    start_localinfer,
    stop,
)
from localinfer.bench.engine_bench import _PARAGRAPH, CODE_EDIT_PROMPT, STORY_PROMPTS
from localinfer.hardware.probe import probe_cpu
from localinfer.loading import fallback_template
from localinfer.store import ModelStore
from streaming import stream

AGENT_SOURCE_CHARS = 64_000
"""About 18k tokens of this project's own source (Gemma's tokenizer, ~3.5 characters a token
of Python): a coding agent's system prompt with a repository in it."""
GAP_WARN_MS = 5.0
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


def client() -> httpx.Client:
    """The one client both servers get: a new connection per request (llama-server closes a
    streamed reply's connection, and a pooled one would then fail on the next request)."""
    return httpx.Client(timeout=1800, limits=httpx.Limits(max_keepalive_connections=0))


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def agent_messages(question: str) -> list[dict[str, str]]:
    """A coding agent's request: a system prompt with a repository's source, then a question."""
    root = Path(__file__).resolve().parent.parent / "localinfer"
    source, size = [], 0
    for path in sorted(root.rglob("*.py")):
        text = f"### {path.relative_to(root.parent)}\n{path.read_text()}\n"
        source.append(text)
        size += len(text)
        if size >= AGENT_SOURCE_CHARS:
            break
    system = ("You are a coding agent working in this repository. Answer questions about it."
              "\n\n" + "".join(source)[:AGENT_SOURCE_CHARS])
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def left_after_first_token(http: httpx.Client, url: str, body: dict) -> None:
    """A stream its client leaves once the first piece of text arrives (as an editor drops a
    superseded completion): the connection is closed with the reply unread."""
    with http.stream("POST", url, json={**body, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and any(
                    (choice.get("delta") or {}).get("content")
                    for choice in json.loads(line[6:]).get("choices") or []):
                break


def measure(target: Target, quick: bool, agent: bool, http: httpx.Client,
            restart: Callable[[], Target] | None = None) -> dict[str, Any]:
    """Every row against one running server; ``restart`` stops it and starts it again (on the
    same home), for the agent request after a restart."""
    n_tokens = 32 if quick else 64
    greedy = {"model": target.chat_model, "max_tokens": n_tokens, "temperature": 0}
    sampled = {**greedy, "temperature": 0.7, "seed": 1}
    prompts = STORY_PROMPTS[:2 if quick else 3]
    chat_url = f"{target.url}/v1/chat/completions"
    out: dict[str, Any] = {"load_before": os.getloadavg()[0]}

    def chat_stream(body: dict, messages: list[dict[str, str]]) -> dict:
        return stream(http, chat_url, {**body, "messages": messages})

    chat_stream({**greedy, "max_tokens": 4}, chat("Warm up"))
    out["greedy_tps"] = statistics.median(chat_stream(greedy, chat(p))["decode_tps"]
                                          for p in prompts)
    out["sampled_tps"] = statistics.median(chat_stream(sampled, chat(p))["decode_tps"]
                                           for p in prompts)
    for width in (4, 8):
        started = time.perf_counter()
        with ThreadPoolExecutor(width) as pool:  # each stream its own thread, one client
            results = list(pool.map(lambda p: chat_stream(greedy, chat(p)),
                                    STORY_PROMPTS[:width]))
        wall = time.perf_counter() - started
        out[f"streams{width}_tps"] = sum(r["tokens"] for r in results) / wall

    # A chat: each turn resends the whole conversation with the server's own replies.
    turn = {**greedy, "max_tokens": 48}
    messages: list[dict[str, str]] = []
    for i, topic in enumerate(TOPICS):
        messages += chat(f"Turn {i + 1}. Tell me about {topic}. " + _PARAGRAPH * 3)
        reply = chat_stream(turn, messages)
        messages.append({"role": "assistant", "content": reply["text"]})
    first = {**greedy, "max_tokens": 4}
    questions = QUESTIONS[:3] if quick else QUESTIONS
    fifth, fresh, after_left = [], [], []
    for i, q in enumerate(questions):  # interleaved, each first by turns: the load drifts
        pair = [(fifth, messages + chat(q)), (fresh, chat(q))]
        for replies, asked in pair if i % 2 == 0 else pair[::-1]:
            replies.append(chat_stream(first, asked))
        left_after_first_token(http, chat_url, {**greedy, "max_tokens": 200,
                                                "messages": chat(STORY_PROMPTS[i % 4])})
        after_left.append(chat_stream(first, chat(q + " ")))
    for name, replies in (("fresh", fresh), ("fifth", fifth), ("after_left", after_left)):
        out[f"{name}_ttft_ms"] = statistics.median(r["ttft_ms"] for r in replies)
        # As the server measured it (localinfer: from its engine's submit; llama-server: its
        # prompt's evaluation): the rest of the client's TTFT is the HTTP path, the template,
        # tokenizing.
        out[f"{name}_server_ms"] = statistics.median(server_ttft_ms(r) for r in replies)
        out[f"{name}_gap_ms"] = statistics.median(r["ttft_ms"] - server_ttft_ms(r)
                                                  for r in replies)
    out["left_cost_ms"] = out["after_left_ttft_ms"] - out["fresh_ttft_ms"]
    # localinfer's phases of a fresh message's TTFT (its timings; llama-server has none).
    for phase in ("prepare_ms", "queue_ms", "setup_ms", "prefill_ms"):
        if all(phase in r["server"] for r in fresh):
            out[f"fresh_{phase}"] = statistics.median(r["server"][phase] for r in fresh)
    out["fifth_prompt_tokens"] = (fifth[0]["usage"] or {}).get("prompt_tokens")

    edit = {"model": target.chat_model, "prompt": CODE_EDIT_PROMPT, "temperature": 0,
            "max_tokens": 200 if quick else 600, "stop": ["```"]}
    code_edit = stream(http, f"{target.url}/v1/completions", edit)
    out["code_edit_tps"] = code_edit["decode_tps"]
    out["code_edit_tokens"] = code_edit["tokens"]
    if agent:
        body = {**greedy, "max_tokens": 8}
        cold = chat_stream(body, agent_messages("Which module holds the engine's batch loop?"))
        again = chat_stream(body, agent_messages("Which module holds the engine's batch loop?"))
        out["agent_prompt_tokens"] = (cold["usage"] or {}).get("prompt_tokens")
        out["agent_cold_ttft_ms"] = cold["ttft_ms"]
        out["agent_again_ttft_ms"] = again["ttft_ms"]
        if restart is not None:  # localinfer: `stop` and `serve`; llama-server: reads it all
            url = f"{restart().url}/v1/chat/completions"
            after = stream(http, url, {**body, "messages": agent_messages(
                "Which module holds the engine's batch loop?")})
            out["agent_restart_ttft_ms"] = after["ttft_ms"]
            out["agent_restart_cached"] = ((after["usage"] or {}).get(
                "prompt_tokens_details") or {}).get("cached_tokens") or 0
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
        ("the next request after a client left its stream, TTFT added (ms)", "left_cost_ms"),
        ("TTFT server-side, fresh / 5th turn / after a left stream (ms)", "server"),
        ("client less server, fresh / 5th turn / after a left stream (ms)", "gap"),
        ("code edit, greedy (tok/s)", "code_edit_tps"),
        ("agent prompt, cold TTFT (ms)", "agent_cold_ttft_ms"),
        ("agent prompt again, TTFT (ms)", "agent_again_ttft_ms"),
        ("agent prompt after a restart, TTFT (ms)", "agent_restart_ttft_ms"),
        ("load average before / after", "load")]
LOWER_IS_BETTER = ("ttft_ms", "fifth_ratio", "left_cost_ms")
TRIPLES = {"server": "server_ms", "gap": "gap_ms"}


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k, v in rounds[0].items() if isinstance(v, (int, float))]
    out = {k: statistics.median(r[k] for r in rounds) for k in keys}
    out["fifth_ratio"] = out["fifth_ttft_ms"] / out["fresh_ttft_ms"]
    return out


def table(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    def show(r: dict[str, Any], key: str) -> str:
        if key == "load":
            return f"{r['load_before']:.1f} / {r['load_after']:.1f}"
        if key in TRIPLES:
            return " / ".join(f"{r[f'{name}_{TRIPLES[key]}']:.1f}"
                              for name in ("fresh", "fifth", "after_left"))
        return f"{r[key]:.2f}" if key == "fifth_ratio" else f"{r[key]:.1f}"

    lines = ["| | localinfer | llama-server | ratio |", "|---|---|---|---|"]
    for label, key in ROWS:
        if key not in TRIPLES and key != "load" and key not in ours:
            continue  # a row this run did not measure (--agent)
        plain = key in ("load", "left_cost_ms") or key in TRIPLES
        ratio = "" if plain or not theirs[key] else f"{ours[key] / theirs[key]:.2f}x"
        lines.append(f"| {label} | {show(ours, key)} | {show(theirs, key)} | {ratio} |")
    return "\n".join(lines)


def gap_warnings(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """Where the two servers' client-minus-server times differ by more than GAP_WARN_MS: that
    row's client-side TTFTs then measure the HTTP paths as much as the engines."""
    warnings = []
    for name in ("fresh", "fifth", "after_left"):
        a, b = ours[f"{name}_gap_ms"], theirs[f"{name}_gap_ms"]
        if abs(a - b) > GAP_WARN_MS:
            warnings.append(f"warning: {name}: client less server is {a:.1f} ms for localinfer"
                            f" and {b:.1f} ms for llama-server: more than {GAP_WARN_MS:.0f} ms"
                            " apart, so that TTFT row compares more than the engines.")
    return warnings


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
    parser.add_argument("--agent", action="store_true",
                        help="add a coding agent's ~18k-token request, cold and again (a minute"
                             " or more per server on a 2-core CPU)")
    parser.add_argument("--llama-server-arg", action="append", default=[], metavar="ARG",
                        help="one more llama-server argument (repeat for each), e.g."
                             " --llama-server-arg=-np --llama-server-arg=8")
    parser.add_argument("--localinfer-arg", action="append", default=[], metavar="ARG",
                        help="one more `localinfer serve` argument (repeat for each)")
    args = parser.parse_args()
    if not shutil.which(str(args.llama_server)):
        print(f"no llama-server at {args.llama_server}", file=sys.stderr)
        return 2
    model = (args.model or ModelStore().resolve("gemma3:270m").path).resolve()
    logs = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    # A file without a chat template of its own (the starter): llama-server would fall back to
    # ChatML; give it the template localinfer renders with, so that both read the same prompt.
    server_args = list(args.llama_server_arg)
    template = fallback_template(gguf.read_header(model), None)
    if template is not None:
        (logs / "chat-template.jinja").write_text(template)
        server_args += ["--jinja", "--chat-template-file", str(logs / "chat-template.jinja")]
    serve_args = list(args.localinfer_arg)

    cpu = probe_cpu()
    print(f"model {model}\nlocalinfer serve {' '.join(serve_args)};"
          f" llama-server {' '.join(server_args)}\nCPU {cpu.model}, {cpu.physical_cores}"
          f" cores, AVX-512: {'avx512f' in cpu.flags}; server logs in {logs}", flush=True)

    def localinfer(round_: int, again: bool = False) -> tuple[list, Target]:
        home = logs / f"localinfer-home-{round_}"
        if again:  # a restart: the same home, its prefix cache on disk
            return serve_localinfer(home, logs / "localinfer.log", serve_args)
        home.mkdir()
        return start_localinfer(model, model, home, logs / "localinfer.log", serve_args)

    def llama_server(round_: int, again: bool = False) -> tuple[list, Target]:
        proc, url = start_llama_server_process(args.llama_server, model, server_args,
                                               logs / "llama-server.log")
        return [proc], Target("llama-server", url, "bench", "bench", "bench")

    servers: dict[str, Callable[..., tuple[list, Target]]] = {
        "localinfer": localinfer, "llama-server": llama_server}
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    with client() as http:
        for round_ in range(max(1, args.rounds)):
            order = list(servers) if round_ % 2 == 0 else list(servers)[::-1]
            for name in order:
                procs, target = servers[name](round_)

                def restart(name: str = name, round_: int = round_,
                            procs: list = procs) -> Target:
                    stop(procs)
                    procs[:], started = servers[name](round_, again=True)
                    return started

                try:
                    figures[name].append(measure(target, args.quick, args.agent, http,
                                                 restart))
                finally:
                    stop(procs)
                print(f"round {round_ + 1}, {name}: {json.dumps(figures[name][-1])}",
                      flush=True)
    ours, theirs = median_of(figures["localinfer"]), median_of(figures["llama-server"])
    print(f"\nmedians of {len(figures['localinfer'])} rounds:\n{table(ours, theirs)}")
    if "fresh_prefill_ms" in ours:
        print("localinfer's fresh-message TTFT by phase (ms): "
              + ", ".join(f"{phase} {ours[f'fresh_{phase}_ms']:.1f}"
                          for phase in ("prepare", "queue", "setup", "prefill"))
              + " (prepare: parsing, template, tokenizing; queue: waiting for the engine;"
                " setup: admission to the first decode, within prefill)")
    for warning in gap_warnings(ours, theirs):
        print(warning)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
