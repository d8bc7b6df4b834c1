"""The editor workload: what an editor user's machine asks of a local model server at once, run
against localinfer's daemon or llama-server (the same requests, over HTTP), with its figures.

- one chat client in a multi-turn conversation (``/v1/chat/completions``, streamed): TTFT as
  the client sees the first token;
- three editor clients sending fill-in-the-middle requests in llama.vscode's ``/infill`` shape
  at its default settings (``id_slot`` 0, ``input_prefix``/``input_suffix``/``input_extra``/
  ``prompt``, ``n_predict`` 128, three completions (``n_cmpl``), ``n_indent``,
  ``t_max_prompt_ms``/``t_max_predict_ms`` 500, its samplers, not streamed) on a ~1,500-token
  file that changes by one keystroke between requests; a keystroke that comes while the
  previous request runs supersedes it, and the client cancels it (closes the connection, as
  an editor aborts the fetch): FIM latency from sending to the whole reply;
- an indexing client embedding chunks of the files (``/v1/embeddings``, batches of 8).

Figures: p50/p95 TTFT per client kind (FIM's as the server reports its prompt time; chat's
measured by the client), FIM latency, aggregate tok/s (chat + FIM tokens over the wall time)
and embeddings/s. ``localinfer bench --editor`` prints them; ``bench/editor_workload.py``
runs localinfer and llama-server side by side.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..errors import LocalInferError, WorkerError
from ..hardware.rpc import RPCConnection

# llama.vscode's /infill request (src/llama-server.ts createRequestPayload) with its default
# settings (package.json; llama.vim's t_max_predict_ms is 1000, and it asks one completion).
FIM_DEFAULTS = {"id_slot": 0, "top_k": 40, "top_p": 0.99, "stream": False,
                "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
                "t_max_prompt_ms": 500, "t_max_predict_ms": 500}
COMPLETIONS = 3
"""llama.vscode's max_parallel_completions (sent as ``n_cmpl``): the editor offers the others
with Alt+]."""
N_PREDICT = 128
KEYSTROKE_S = 0.075
"""Between two keystrokes of a burst (llama.vscode's debounce is 75 ms)."""
EDITOR_POLL_S = 0.15
"""With ``Workload.serial_editors``: how often a keystroke that came while its editor's request
runs looks again (llama.vscode's DELAY_BEFORE_COMPL_REQUEST; llama.vim retries every 100 ms)."""
READ_PAUSE_S = 0.5
"""After a burst: the user reads the suggestion that completed."""
CHAT_QUESTIONS = [
    "What does compute_metric_3 return for an empty list?",
    "Rewrite it so that it skips negative values.",
    "Now add a docstring example.",
    "Which of these functions could share a helper?",
    "Write that helper.",
    "Summarise the changes in two sentences.",
]


@dataclass(frozen=True)
class Target:
    """A server under test and the models its clients ask for."""

    label: str
    url: str
    chat_model: str
    fim_model: str
    embed_model: str
    embed_url: str | None = None
    """Where embeddings go, when not ``url`` (llama-server serves them from a second
    process started with ``--embeddings``)."""


@dataclass(frozen=True)
class Workload:
    """How much each client does."""

    chat_turns: int = 6
    chat_tokens: int = 64
    editors: int = 3
    fim_completed: int = 8
    """Requests each editor waits for to the end (superseded ones come on top)."""
    burst: int = 3
    """Keystrokes per burst: all but the last supersede the request before them."""
    n_predict: int = N_PREDICT
    completions: int = COMPLETIONS
    """Completions of each FIM prompt (``n_cmpl``)."""
    file_lines: int = 170
    """About 1,500 tokens of Python with Gemma's or Qwen's tokenizer."""
    embed_chunks: int = 48
    embed_batch: int = 8
    seed: int = 1
    kinds: tuple[str, ...] = ("chat", "fim", "embed")
    """The client kinds that run (all, unless a server lacks a route)."""
    serial_editors: bool = False
    """Editors as llama.vscode and llama.vim send (src/completion.ts, autoload/llama.vim): one
    request in flight each, never aborted; a keystroke that comes meanwhile waits for it and
    is dropped when a newer one comes. Off: every keystroke is sent and aborts the request
    before it (the issue's workload)."""


@dataclass
class Figures:
    """One server's results: latencies in ms, rates per second."""

    label: str
    wall_s: float = 0.0
    chat_ttft_ms: list[float] = field(default_factory=list)
    chat_tokens: int = 0
    fim_latency_ms: list[float] = field(default_factory=list)
    fim_ttft_ms: list[float] = field(default_factory=list)
    """As the server reports its prompt processing (llama-server's timings.prompt_ms,
    localinfer's timings.ttft_ms)."""
    fim_prompt_tokens: list[int] = field(default_factory=list)
    fim_tokens: int = 0
    fim_cancelled: int = 0
    """Keystrokes' requests aborted, or (serial editors) never sent."""
    embed_latency_ms: list[float] = field(default_factory=list)
    embeddings: int = 0
    embed_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "label": self.label, "wall_s": round(self.wall_s, 1),
            "chat_ttft_p50_ms": pct(self.chat_ttft_ms, 50),
            "chat_ttft_p95_ms": pct(self.chat_ttft_ms, 95),
            "fim_ttft_p50_ms": pct(self.fim_ttft_ms, 50),
            "fim_ttft_p95_ms": pct(self.fim_ttft_ms, 95),
            "fim_latency_p50_ms": pct(self.fim_latency_ms, 50),
            "fim_latency_p95_ms": pct(self.fim_latency_ms, 95),
            "fim_requests": len(self.fim_latency_ms), "fim_cancelled": self.fim_cancelled,
            "fim_prompt_tokens_p50": pct([float(n) for n in self.fim_prompt_tokens], 50),
            "embed_batch_p50_ms": pct(self.embed_latency_ms, 50),
            "aggregate_tps": round((self.chat_tokens + self.fim_tokens) / self.wall_s, 1)
            if self.wall_s else None,
            "embeddings_per_s": round(self.embeddings / self.embed_s, 1)
            if self.embed_s else None,
            "errors": self.errors[:5],
        }


def pct(values: Sequence[float], q: int) -> float | None:
    """The q-th percentile (nearest rank), or None with no values."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, -(-q * len(ordered) // 100) - 1))], 1)


# --- the text the clients work on ----------------------------------------------------------------
def source_file(seed: int, lines: int) -> str:
    """A deterministic Python module of about ``lines`` lines (small functions)."""
    rng = random.Random(seed)
    words = ["mean", "spread", "score", "weight", "total", "count", "ratio", "delta"]
    out = [f'"""Metrics for batch {seed}: small functions an editor user works on."""', ""]
    i = 0
    while len(out) < lines:
        name, limit = rng.choice(words), rng.randint(2, 99)
        out += [f"def compute_metric_{i}(values, weight={rng.randint(1, 9)}):",
                f'    """Return the weighted {name} of the values above {limit}."""',
                "    total = 0",
                "    for index, value in enumerate(values):",
                f"        if value > {limit}:",
                "            total += value * weight",
                "        else:",
                f"            total -= index % {rng.randint(2, 7)}",
                "    return total / max(len(values), 1)", ""]
        i += 1
    return "\n".join(out[:lines]) + "\n"


def fim_body(text: str, cursor: int, extra: list[dict[str, str]], model: str,
             n_predict: int, completions: int = COMPLETIONS) -> dict[str, Any]:
    """llama.vscode's /infill request for a cursor at ``cursor`` in ``text``: the lines before
    the cursor's line (at most 256), the line up to the cursor as ``prompt``, the rest of the
    line and the next 64 lines as the suffix."""
    line_start = text.rfind("\n", 0, cursor) + 1
    before = text[:line_start].splitlines(keepends=True)[-256:]
    after = text[cursor:].splitlines(keepends=True)[:65]
    line = text[line_start:cursor]
    return {"model": model, "input_prefix": "".join(before), "input_suffix": "".join(after),
            "input_extra": extra, "prompt": line, "n_predict": n_predict,
            "n_cmpl": completions, "n_indent": len(line) - len(line.lstrip(" ")),
            **FIM_DEFAULTS}


def completion_tokens(body: dict[str, Any]) -> int:
    """Tokens a non-streamed reply generated, in llama-server's or localinfer's fields."""
    timings = body.get("timings") or {}
    for value in (timings.get("predicted_n"), body.get("tokens_predicted"),
                  timings.get("completion_tokens"),
                  (body.get("usage") or {}).get("completion_tokens")):
        if isinstance(value, int):
            return value
    return 0


def prompt_figures(body: dict[str, Any]) -> tuple[float | None, int | None]:
    """(server-reported time to the first token in ms, prompt tokens) of a reply."""
    timings = body.get("timings") or {}
    ttft = timings.get("prompt_ms", timings.get("ttft_ms"))
    tokens = timings.get("prompt_n", timings.get("prompt_tokens"))
    return (float(ttft) if isinstance(ttft, (int, float)) else None,
            tokens if isinstance(tokens, int) else None)


# --- the clients -------------------------------------------------------------------------------
STATEMENT = "result = compute_metric_3(values, weight=2) + compute_metric_4(values)"
"""What each editor types, one key at a time."""


def editor_file(w: Workload, index: int) -> tuple[str, int, list[dict[str, str]]]:
    """Editor ``index``'s file, with a fresh line in its middle where it types, the cursor
    there, and the other file it sends as context (``input_extra``)."""
    text = source_file(w.seed * 10 + index, w.file_lines)
    extra = [{"filename": f"metrics_{index + 1}.py",
              "text": source_file(w.seed * 10 + index + 1, 40)}]
    cursor = text.find("\n", len(text) // 2) + 1
    return text[:cursor] + "    \n" + text[cursor:], cursor + 4, extra


async def chat_client(http: httpx.AsyncClient, t: Target, w: Workload, out: Figures) -> None:
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are an expert coder."}]
    for turn in range(w.chat_turns):
        messages.append({"role": "user", "content": CHAT_QUESTIONS[turn % len(CHAT_QUESTIONS)]})
        body = {"model": t.chat_model, "messages": messages, "stream": True,
                "max_tokens": w.chat_tokens, "temperature": 0,
                "stream_options": {"include_usage": True}}
        started = time.perf_counter()
        first: float | None = None
        pieces: list[str] = []
        usage = 0
        async with http.stream("POST", f"{t.url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                out.errors.append(f"chat: HTTP {r.status_code} {(await r.aread())[:200]!r}")
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        first = first or time.perf_counter()
                        pieces.append(piece)
                usage = (chunk.get("usage") or {}).get("completion_tokens") or usage
        if first is not None:
            out.chat_ttft_ms.append((first - started) * 1000)
        out.chat_tokens += usage or len(pieces)
        messages.append({"role": "assistant", "content": "".join(pieces)})
        await asyncio.sleep(1.0)  # the user reads the answer and types the next question


def fim_replies(r: httpx.Response) -> list[dict[str, Any]]:
    """An /infill reply's completions: an array with n_cmpl above 1, as llama-server answers."""
    replies = r.json()
    return replies if isinstance(replies, list) else [replies]


def record_fim(r: httpx.Response, started: float, out: Figures) -> bool:
    """Count a keystroke's shown reply (its latency from ``started``, tokens, server TTFT and
    prompt tokens); False, with the error noted, where it failed."""
    if r.status_code != 200:
        out.errors.append(f"infill: HTTP {r.status_code} {r.text[:200]}")
        return False
    replies = fim_replies(r)
    out.fim_latency_ms.append((time.perf_counter() - started) * 1000)
    out.fim_tokens += sum(completion_tokens(reply) for reply in replies)
    ttft, prompt_tokens = prompt_figures(replies[0])  # the one that read the prompt
    if ttft is not None:
        out.fim_ttft_ms.append(ttft)
    if prompt_tokens is not None:
        out.fim_prompt_tokens.append(prompt_tokens)
    return True


async def editor_client(http: httpx.AsyncClient, t: Target, w: Workload, index: int,
                        out: Figures) -> None:
    rng = random.Random(w.seed * 100 + index)
    text, cursor, extra = editor_file(w, index)
    typed = 0
    done = 0
    superseded: list[asyncio.Future] = []
    while done < w.fim_completed:
        for key in range(w.burst):
            char = STATEMENT[typed % len(STATEMENT)]
            typed += 1
            text = text[:cursor] + char + text[cursor:]
            cursor += 1
            body = fim_body(text, cursor, extra, t.fim_model, w.n_predict, w.completions)
            started = time.perf_counter()
            request = asyncio.ensure_future(http.post(f"{t.url}/infill", json=body))
            last = key == w.burst - 1
            finished, _ = await asyncio.wait({request}, timeout=None if last else
                                             KEYSTROKE_S * rng.uniform(0.8, 1.2))
            if not finished:  # the next keystroke supersedes it: the editor aborts the fetch
                request.cancel()
                superseded.append(request)
                out.fim_cancelled += 1
                continue
            if not record_fim(request.result(), started, out):
                return
            if last:
                done += 1
        await asyncio.sleep(READ_PAUSE_S)
    await asyncio.gather(*superseded, return_exceptions=True)  # their connections closed


async def serial_editor_client(http: httpx.AsyncClient, t: Target, w: Workload, index: int,
                               out: Figures) -> None:
    """``editor_client`` as llama.vscode and llama.vim send (``Workload.serial_editors``): a
    keystroke's request goes once the editor's request in flight has ended (looked at every
    EDITOR_POLL_S), unless a newer keystroke came; FIM latency runs from a burst's last
    keystroke to the reply for its text."""
    rng = random.Random(w.seed * 100 + index)
    text, cursor, extra = editor_file(w, index)
    newest = 0
    in_flight: asyncio.Future | None = None

    async def keystroke(key: int, body: dict[str, Any]) -> httpx.Response | None:
        nonlocal in_flight
        while in_flight is not None and not in_flight.done():
            await asyncio.sleep(EDITOR_POLL_S)
        if key != newest:  # a newer keystroke came while it waited: never sent
            out.fim_cancelled += 1
            return None
        in_flight = asyncio.ensure_future(http.post(f"{t.url}/infill", json=body))
        return await in_flight

    sent: list[asyncio.Future] = []
    for _ in range(w.fim_completed):
        for key in range(w.burst):
            text = text[:cursor] + STATEMENT[newest % len(STATEMENT)] + text[cursor:]
            cursor += 1
            newest += 1
            body = fim_body(text, cursor, extra, t.fim_model, w.n_predict, w.completions)
            started = time.perf_counter()
            request = asyncio.ensure_future(keystroke(newest, body))
            if key < w.burst - 1:
                sent.append(request)
                await asyncio.sleep(KEYSTROKE_S * rng.uniform(0.8, 1.2))
                continue
            r = await request
            assert r is not None  # the newest keystroke is always sent
            if not record_fim(r, started, out):
                return
        await asyncio.sleep(READ_PAUSE_S)
    for r in await asyncio.gather(*sent):  # earlier keystrokes' replies: shown to nobody
        if r is not None and r.status_code == 200:
            out.fim_tokens += sum(completion_tokens(reply) for reply in fim_replies(r))


async def indexing_client(http: httpx.AsyncClient, t: Target, w: Workload,
                          out: Figures) -> None:
    n_files = -(-12 * w.embed_chunks // 60) + 1  # 12 lines a chunk, none of them empty
    corpus = "".join(source_file(w.seed * 1000 + i, 60) for i in range(n_files)).splitlines()
    chunks = ["\n".join(corpus[i:i + 12]) for i in range(0, 12 * w.embed_chunks, 12)]
    url = f"{t.embed_url or t.url}/v1/embeddings"
    started = time.perf_counter()
    for i in range(0, len(chunks), w.embed_batch):
        batch = chunks[i:i + w.embed_batch]
        sent = time.perf_counter()
        r = await http.post(url, json={"model": t.embed_model, "input": batch,
                                       "encoding_format": "float"})
        if r.status_code != 200:
            out.errors.append(f"embeddings: HTTP {r.status_code} {r.text[:200]}")
            return
        out.embed_latency_ms.append((time.perf_counter() - sent) * 1000)
        out.embeddings += len(r.json()["data"])
    out.embed_s = time.perf_counter() - started


async def run_workload(t: Target, w: Workload) -> Figures:
    """All clients at once against ``t``; each client its own connection pool, as separate
    editor processes would have."""
    out = Figures(t.label)
    timeout = httpx.Timeout(600.0)
    clients = [httpx.AsyncClient(timeout=timeout) for _ in range(w.editors + 2)]
    try:
        started = time.perf_counter()
        runs = []
        if "chat" in w.kinds:
            runs.append(chat_client(clients[0], t, w, out))
        if "embed" in w.kinds:
            runs.append(indexing_client(clients[1], t, w, out))
        if "fim" in w.kinds:
            editor = serial_editor_client if w.serial_editors else editor_client
            runs += [editor(clients[2 + i], t, w, i, out) for i in range(w.editors)]
        await asyncio.gather(*runs)
        out.wall_s = time.perf_counter() - started
    finally:
        for c in clients:
            await c.aclose()
    return out


async def warm_up(t: Target, w: Workload) -> None:
    """Load every model and fail early on a route the server lacks (not measured)."""
    requests = {
        "chat": (f"{t.url}/v1/chat/completions",
                 {"model": t.chat_model, "max_tokens": 4,
                  "messages": [{"role": "user", "content": "Hi"}]}),
        "fim": (f"{t.url}/infill", fim_body("def f(x):\n    return x\n", 9, [], t.fim_model,
                                            4)),
        "embed": (f"{t.embed_url or t.url}/v1/embeddings",
                  {"model": t.embed_model, "input": ["warm up"]}),
    }
    async with httpx.AsyncClient(timeout=600.0) as http:
        for kind in w.kinds:
            url, body = requests[kind]
            r = await http.post(url, json=body)
            if r.status_code != 200:
                raise LocalInferError(f"{t.label}: {url} answered HTTP {r.status_code}:"
                                      f" {r.text[:300]}", title="editor workload")


async def measured(t: Target, w: Workload) -> dict[str, Any]:
    await warm_up(t, w)
    return (await run_workload(t, w)).summary()


# --- the servers -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_worker(threads: int, env: dict[str, str] | None = None
                 ) -> tuple[subprocess.Popen, str]:
    """A ``localinfer worker`` on loopback (its description on the next port, so both ports
    must be free) with ``threads`` threads, once it answers: (process, "127.0.0.1:PORT")."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        break
    else:
        raise LocalInferError("no two adjacent free ports on loopback", title="worker")
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", "worker", "--port", str(port),
                             "--cache", "off", "--threads", str(threads)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    endpoint = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            RPCConnection(endpoint, connect_timeout_s=1).close()
            return proc, endpoint
        except WorkerError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise LocalInferError(f"the worker did not start: {stderr}",
                                      title="worker") from None
            time.sleep(0.2)


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    """Until ``url`` answers 200 (llama-server answers 503 while it loads)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LocalInferError(f"the server exited with code {proc.returncode} (see its"
                                  " log)", title="editor workload")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise LocalInferError(f"{url} did not answer within {timeout_s:.0f} s",
                          title="editor workload")


def start_localinfer(fim_file: Path, embed_file: Path, home: Path, log: Path,
                     serve_args: Sequence[str] = ()) -> tuple[list[subprocess.Popen], Target]:
    """``localinfer serve`` with its default settings (but ``serve_args``) on a fresh ``home``
    with the two files added (linked, as ``bench-fim`` and ``bench-embed``), on a free port."""
    env = {**os.environ, "LOCALINFER_HOME": str(home)}
    for path, name in ((fim_file, "bench-fim"), (embed_file, "bench-embed")):
        subprocess.run([sys.executable, "-m", "localinfer", "add", str(path), "--name", name,
                        "--link"], env=env, check=True, capture_output=True)
    return serve_localinfer(home, log, serve_args)


def serve_localinfer(home: Path, log: Path, serve_args: Sequence[str] = ()
                     ) -> tuple[list[subprocess.Popen], Target]:
    """``localinfer serve`` on ``home`` as ``start_localinfer`` left it (again: a restart), on
    a free port, its output appended to ``log``."""
    env = {**os.environ, "LOCALINFER_HOME": str(home)}
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", "serve", "--port", str(port),
                             "--socket", str(home / "d.sock"), "--keep-alive", "-1",
                             *serve_args],
                            env=env, stdout=log.open("a"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", proc)
    return [proc], Target("localinfer", url, "bench-fim", "bench-fim", "bench-embed")


LLAMA_SERVER_FIM_ARGS = ("-ub", "1024", "-b", "1024", "--ctx-size", "0", "--cache-reuse", "256")
"""llama.vscode's README, CPU-only FIM server (its command for Qwen2.5-Coder 0.5B)."""
LLAMA_SERVER_EMBED_ARGS = ("--embeddings", "--pooling", "mean", "-ub", "2048", "-b", "2048",
                           "--ctx-size", "2048")
"""llama.vscode's embeddings server (``--embeddings -ub 2048 -b 2048 --ctx-size 2048``);
``--pooling mean`` because a chat model's file names no pooling of its own."""


def start_llama_server(binary: Path, fim_file: Path, embed_file: Path, log: Path
                       ) -> tuple[list[subprocess.Popen], Target]:
    """llama-server with llama.vscode's settings: one process for chat and FIM, a second
    with ``--embeddings`` for the indexing client."""
    procs: list[subprocess.Popen] = []
    urls = []
    for path, args in ((fim_file, LLAMA_SERVER_FIM_ARGS), (embed_file, LLAMA_SERVER_EMBED_ARGS)):
        proc, url = start_llama_server_process(binary, path, args, log)
        procs.append(proc)
        urls.append(url)
    return procs, Target("llama-server", urls[0], "bench-fim", "bench-fim", "bench-embed",
                         embed_url=urls[1])


def start_llama_server_process(binary: Path, model: Path, args: Sequence[str], log: Path
                               ) -> tuple[subprocess.Popen, str]:
    """One llama-server on ``model`` with ``args``, on a free port, once it answers: the
    process and its URL (its output appended to ``log``)."""
    port = free_port()
    proc = subprocess.Popen([str(binary), "-m", str(model), "--host", "127.0.0.1",
                             "--port", str(port), *args],
                            stdout=log.open("a"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", proc)
    except BaseException:
        stop([proc])
        raise
    return proc, url


def stop(procs: Sequence[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def measure(start: Callable[[], tuple[list[subprocess.Popen], Target]], w: Workload
            ) -> dict[str, Any]:
    """Start a server, warm it up, run the workload, stop it: its summary, with the machine's
    load average (1 minute) before and after the workload (other work skews the figures)."""
    procs, target = start()
    try:
        load_before = os.getloadavg()[0]
        summary = asyncio.run(measured(target, w))
        return {**summary, "load_before": round(load_before, 2),
                "load_after": round(os.getloadavg()[0], 2)}
    finally:
        stop(procs)


ROWS = [("chat TTFT p50 / p95 (ms)", "chat_ttft_p50_ms", "chat_ttft_p95_ms"),
        ("FIM TTFT p50 / p95 (ms, server)", "fim_ttft_p50_ms", "fim_ttft_p95_ms"),
        ("FIM latency p50 / p95 (ms)", "fim_latency_p50_ms", "fim_latency_p95_ms"),
        ("FIM done / cancelled", "fim_requests", "fim_cancelled"),
        ("FIM prompt tokens p50", "fim_prompt_tokens_p50", None),
        ("embedding batch p50 (ms)", "embed_batch_p50_ms", None),
        ("aggregate tok/s", "aggregate_tps", None),
        ("embeddings/s", "embeddings_per_s", None),
        ("wall time (s)", "wall_s", None),
        ("load average before / after", "load_before", "load_after")]


def table(results: Sequence[dict[str, Any]]) -> str:
    """The servers' figures side by side."""
    def cell(r: dict[str, Any], a: str, b: str | None) -> str:
        def show(v: Any) -> str:
            return "–" if v is None else f"{v:g}" if isinstance(v, float) else str(v)
        return show(r.get(a)) + (f" / {show(r.get(b))}" if b else "")

    width = max(len(label) for label, _, _ in ROWS) + 2
    lines = ["".ljust(width) + "".join(r["label"].ljust(22) for r in results)]
    for label, a, b in ROWS:
        lines.append(label.ljust(width) + "".join(cell(r, a, b).ljust(22) for r in results))
    for r in results:
        lines += [f"{r['label']}: {e}" for e in r.get("errors") or []]
    return "\n".join(lines)
