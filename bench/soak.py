"""A soak of the daemon: N clients for a while, each sending generation requests over every API
(OpenAI and Ollama, streamed and not), a fraction of which leave early (mid-stream, while a
whole reply is made, or mid-body). It reports completed / left / failed / 5xx, the time to first
token as the clients saw it, the daemon's resident memory growth, and its active sequences and
queue afterwards (both must be 0).

It starts `localinfer serve` as its own process (or uses --socket of a running one):

    python bench/soak.py [--model gemma3:270m] [--clients 8] [--disconnect 0.3]
                         [--duration 300] [--tokens 48]
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

PROMPTS = ["Tell me a short story about a lighthouse.", "What is a prime number?",
           "Write a haiku about rain.", "List three uses of a paperclip.",
           "Explain why the sky is blue in two sentences.", "Say hello in French."]


def client(sock: Path, timeout: float = 600) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)),
                        base_url="http://localhost", timeout=timeout)


def metrics(sock: Path) -> dict[str, float]:
    with client(sock, 30) as c:
        out: dict[str, float] = {}
        for line in c.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def request_for(model: str, tokens: int, rng: random.Random) -> tuple[str, dict, bool]:
    prompt = rng.choice(PROMPTS)
    stream = rng.random() < 0.6
    messages = [{"role": "user", "content": prompt}]
    return rng.choice([
        ("/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": tokens,
                                  "stream": stream}, stream),
        ("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": tokens,
                             "stream": stream}, stream),
        ("/api/chat", {"model": model, "messages": messages, "stream": stream,
                       "options": {"num_predict": tokens}}, stream),
        ("/api/generate", {"model": model, "prompt": prompt, "stream": stream,
                           "options": {"num_predict": tokens}}, stream),
    ])


def first_piece(path: str, line: str) -> bool:
    """Whether a streamed line carries generated text."""
    if path.startswith("/v1/"):
        if not line.startswith("data: {"):
            return False
        choice = (json.loads(line[6:]).get("choices") or [{}])[0]
        return bool(choice.get("text") or (choice.get("delta") or {}).get("content"))
    item = json.loads(line)
    return bool(item.get("response") or (item.get("message") or {}).get("content"))


def has_error(path: str, line: str) -> bool:
    if path.startswith("/v1/"):
        return line.startswith("data: {") and '"error"' in line[:20]
    return line.startswith('{"error"')


class Soak:
    def __init__(self, sock: Path, args: argparse.Namespace) -> None:
        self.sock = sock
        self.args = args
        self.counts: Counter[str] = Counter()
        self.ttft_ms: list[float] = []
        self.statuses: Counter[int] = Counter()
        self.lock = threading.Lock()

    def count(self, what: str, status: int | None = None, ttft_ms: float | None = None
              ) -> None:
        with self.lock:
            self.counts[what] += 1
            if status is not None:
                self.statuses[status] += 1
            if ttft_ms is not None:
                self.ttft_ms.append(ttft_ms)

    def run_client(self, seed: int, deadline: float) -> None:
        rng = random.Random(seed)
        args = self.args
        with client(self.sock) as c:
            while time.monotonic() < deadline:
                path, body, stream = request_for(args.model, args.tokens, rng)
                leave = rng.random() < args.disconnect
                try:
                    if leave and rng.random() < 0.15:
                        self.leave_mid_body(path, body)
                    elif stream:
                        self.streamed(c, path, body, leave, rng)
                    else:
                        self.whole(path, body, leave, rng)
                except httpx.HTTPError as exc:
                    self.count(f"failed ({type(exc).__name__})")

    def streamed(self, c: httpx.Client, path: str, body: dict, leave: bool,
                 rng: random.Random) -> None:
        t0 = time.perf_counter()
        ttft = None
        lines_before_leaving = rng.randint(1, 6) if leave else -1
        with c.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                response.read()
                self.count("5xx" if response.status_code >= 500 else "failed (4xx)",
                           response.status_code)
                return
            for n, line in enumerate(response.iter_lines(), 1):
                if not line:
                    continue
                if has_error(path, line):
                    self.count("failed (error in stream)", 200)
                    return
                if ttft is None and first_piece(path, line):
                    ttft = (time.perf_counter() - t0) * 1000
                if n == lines_before_leaving:
                    self.count("left mid-stream", 200)
                    return  # closing the response closes the connection
        self.count("completed", 200, ttft)

    def whole(self, path: str, body: dict, leave: bool, rng: random.Random) -> None:
        # A fresh connection: leaving closes it while the daemon makes the reply.
        with client(self.sock, rng.uniform(0.05, 1.0) if leave else 600) as c:
            try:
                response = c.post(path, json=body)
            except httpx.ReadTimeout:
                if leave:
                    self.count("left mid-reply")
                    return
                raise
        if response.status_code >= 500:
            self.count("5xx", response.status_code)
        elif response.status_code != 200:
            self.count("failed (4xx)", response.status_code)
        else:
            self.count("completed", 200)

    def leave_mid_body(self, path: str, body: dict) -> None:
        data = json.dumps(body).encode()
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.sock))
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type:"
                      f" application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                      + data[: len(data) // 2])
        self.count("left mid-body")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 \
        else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3:270m")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--disconnect", type=float, default=0.3,
                        help="fraction of requests whose client leaves early")
    parser.add_argument("--duration", type=float, default=300, help="seconds")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per reply at most")
    parser.add_argument("--socket", type=Path, default=None,
                        help="a running daemon's socket (default: start one)")
    args = parser.parse_args()

    daemon = None
    sock = args.socket
    if sock is None:
        sock = Path(tempfile.mkdtemp(prefix="li-soak-", dir="/tmp")) / "d.sock"
        daemon = subprocess.Popen(
            [sys.executable, "-m", "localinfer", "serve", "--socket", str(sock), "--no-tcp",
             "--slots", str(args.clients), "--keep-alive", "-1"],
            stdout=subprocess.PIPE, text=True)
        assert daemon.stdout is not None  # stdout=PIPE
        print(daemon.stdout.readline().strip(), flush=True)
    try:
        with client(sock) as c:  # load the model, and warm up
            c.post("/api/generate", json={"model": args.model, "prompt": "Hi", "stream": False,
                                          "options": {"num_predict": 8}}).raise_for_status()
        before = metrics(sock)
        soak = Soak(sock, args)
        deadline = time.monotonic() + args.duration
        threads = [threading.Thread(target=soak.run_client, args=(i, deadline))
                   for i in range(args.clients)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        time.sleep(2)  # let the daemon notice the last clients that left
        after = metrics(sock)
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(60)

    rss0 = before.get("localinfer_process_resident_memory_bytes", 0)
    rss1 = after.get("localinfer_process_resident_memory_bytes", 0)
    server_5xx = sum(v for k, v in after.items()
                     if k.startswith("localinfer_requests_total") and 'status="5' in k)
    left_counted = sum(v for k, v in after.items()
                       if k.startswith("localinfer_client_disconnects_total"))
    total = sum(soak.counts.values())
    print(f"\nsoak: {args.clients} clients, {args.disconnect:.0%} leave early,"
          f" {elapsed:.0f} s, model {args.model}, up to {args.tokens} tokens a reply")
    print(f"| {'what':<34} | {'value':>20} |")
    print(f"|{'-' * 36}|{'-' * 22}|")
    rows = [("requests sent", f"{total}")]
    rows += [(what, f"{n}") for what, n in sorted(soak.counts.items())]
    rows += [("5xx seen by clients", f"{soak.counts.get('5xx', 0)}"),
             ("5xx counted by the daemon", f"{server_5xx:.0f}"),
             ("client disconnects counted", f"{left_counted:.0f}"),
             ("TTFT p50 / p90 / p99 (ms)", " / ".join(
                 f"{percentile(soak.ttft_ms, q):.0f}" for q in (50, 90, 99))),
             ("RSS before / after (MB)", f"{rss0 / 1e6:.0f} / {rss1 / 1e6:.0f}"),
             ("RSS growth (MB)", f"{(rss1 - rss0) / 1e6:+.1f}"),
             ("active sequences after", f"{after.get('localinfer_active_sequences', 0):.0f}"),
             ("queue depth after", f"{after.get('localinfer_queue_depth', 0):.0f}")]
    for what, value in rows:
        print(f"| {what:<34} | {value:>20} |")
    bad = soak.counts.get("5xx", 0) or server_5xx or after.get("localinfer_active_sequences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
