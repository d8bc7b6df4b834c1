"""Through the daemon, with several real HTTP clients at once: concurrent streams, the 5th turn
of a chat, and a code edit with and without speculation (issue 7's comparisons, as an editor
and a chat window would see them).

It starts `localinfer serve` (8 slots) as its own process and drives it over the Unix socket
with one httpx client per stream, each in its own thread, on the OpenAI streaming API.

    python bench/daemon_concurrency.py [--model gemma3:270m] [--tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from localinfer.bench.engine_bench import _PARAGRAPH, CODE_EDIT_PROMPT, STORY_PROMPTS
from streaming import stream


def client(sock: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)),
                        base_url="http://localhost", timeout=600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3:270m")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    sock = Path(tempfile.mkdtemp(prefix="li-bench-", dir="/tmp")) / "d.sock"
    daemon = subprocess.Popen([sys.executable, "-m", "localinfer", "serve", "--socket", str(sock),
                               "--no-tcp", "--slots", "8", "--ctx", "4096", "--keep-alive",
                               "-1"], stdout=subprocess.PIPE, text=True)
    assert daemon.stdout is not None  # stdout=PIPE
    try:
        print(daemon.stdout.readline().strip(), flush=True)
        c = client(sock)
        completion = {"model": args.model, "max_tokens": args.tokens, "temperature": 0,
                      "speculative": False}
        stream(c, "/v1/completions", {**completion, "prompt": "Warm up"})

        print("\nconcurrent streams (each its own HTTP client and thread):")
        solo = {p: stream(c, "/v1/completions", {**completion, "prompt": p})
                for p in STORY_PROMPTS}
        single = 0.0

        def run(http: httpx.Client, prompt: str, results: dict[str, dict]) -> None:
            results[prompt] = stream(http, "/v1/completions", {**completion, "prompt": prompt})

        for width in (1, 2, 4, 8):
            results: dict[str, dict] = {}
            clients = [client(sock) for _ in range(width)]
            threads = [threading.Thread(target=run, args=(clients[i], STORY_PROMPTS[i], results))
                       for i in range(width)]
            started = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - started
            tokens = sum(r["server"].get("completion_tokens", 0) for r in results.values())
            aggregate = tokens / wall
            single = single or aggregate
            equal = sum(results[p]["text"] == solo[p]["text"] for p in results)
            complete = all(r["server"].get("completion_tokens") == args.tokens
                           for r in results.values())
            per_stream = statistics.median(r["decode_tps"] for r in results.values())
            print(f"  {width} streams: {aggregate:6.1f} tok/s aggregate"
                  f" ({aggregate / single:.2f}x), per-stream decode {per_stream:.1f} tok/s,"
                  f" all complete: {complete}, equal to the solo run: {equal}/{width}")
            for x in clients:
                x.close()

        print("\nchat, turn by turn (each turn resends the whole conversation):")
        messages: list[dict] = []
        chat = {"model": args.model, "max_tokens": 24, "temperature": 0}
        topics = ["the history of the printing press", "how tides work",
                  "baking sourdough bread", "the rules of chess"]
        for i, topic in enumerate(topics):
            messages.append({"role": "user", "content": f"Turn {i + 1}. Tell me about {topic}. "
                             + _PARAGRAPH * 3})
            reply = stream(c, "/v1/chat/completions", {**chat, "messages": messages})
            messages.append({"role": "assistant", "content": reply["text"]})
            print(f"  turn {i + 1}: TTFT {reply['ttft_ms']:.0f} ms, prompt"
                  f" {reply['server'].get('prompt_tokens')} tokens,"
                  f" {reply['server'].get('cached_tokens')} cached")
        # Three new messages, each as the 5th turn and alone (as `localinfer bench` does);
        # medians of the TTFT the client saw and of the one the engine measured.
        questions = [{"role": "user", "content": text} for text in (
            "Now summarise everything we discussed in three sentences.",
            "Which of these topics would you explain to a child first, and why?",
            "List the four topics we covered, one per line, with a short title each.")]
        fifth = [stream(c, "/v1/chat/completions", {**chat, "messages": messages + [q]})
                 for q in questions]
        alone = [stream(c, "/v1/chat/completions", {**chat, "messages": [q]})
                 for q in questions]

        def median(runs: list[dict], server: bool = False) -> float:
            return statistics.median(r["server"].get("ttft_ms", 0.0) if server else r["ttft_ms"]
                                     for r in runs)

        print(f"  turn 5: TTFT {median(fifth):.0f} ms (engine {median(fifth, True):.0f} ms),"
              f" prompt {fifth[0]['server'].get('prompt_tokens')} tokens,"
              f" {fifth[0]['server'].get('cached_tokens')} cached; the new message alone"
              f" {median(alone):.0f} ms (engine {median(alone, True):.0f} ms) ->"
              f" {median(fifth) / median(alone):.2f}x")

        print("\ncode edit (repeat a 60-line function with one change):")
        edit = {"model": args.model, "prompt": CODE_EDIT_PROMPT, "max_tokens": 600,
                "temperature": 0, "stop": ["```"]}
        # Each read cold, as the first request after a load: a cached prompt whose sliding-
        # window cache has wrapped rounds differently (see engine.REREAD_TAIL).
        c.post("/localinfer/unload", json={})
        plain = stream(c, "/v1/completions", {**edit, "speculative": False})
        c.post("/localinfer/unload", json={})
        fast = stream(c, "/v1/completions", edit)  # the engine's default: speculation on
        print(f"  plain {plain['decode_tps']:.1f} tok/s, prompt lookup {fast['decode_tps']:.1f}"
              f" tok/s ({fast['decode_tps'] / plain['decode_tps']:.2f}x),"
              f" {fast['server'].get('accepted_tokens')}/{fast['server'].get('drafted_tokens')}"
              f" drafted tokens accepted, identical text: {plain['text'] == fast['text']}")
        c.close()
    finally:
        daemon.terminate()
        daemon.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
