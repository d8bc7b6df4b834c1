"""Faults from outside: clients that leave (before the body ends, while a reply is made, mid-
stream), two pulls of one model at once, a daemon stopped (SIGTERM, `stop`) during a pull, a
pull that fails before its first byte, the chat killed mid-reply, a load that runs out of memory.
Each is quiet (no traceback), counted, and leaves nothing behind but what can be resumed."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pty
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from filelock import FileLock

import ggufgen
from daemon_util import fake_factory, install_fake_models, serve
from hub_server import STARTER_BYTES
from localinfer import gguf
from localinfer.chats import ChatMessage, ChatStore
from localinfer.cli import main
from localinfer.daemon.bridge import PullJob
from localinfer.errors import DownloadError, InvalidRequest, ModelLoadError, StoreError
from localinfer.loading import load_engine
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.types import Message
from localinfer.store import ModelStore, pull_model
from memlimit import address_space_limit
from tui_util import REPLY, GatedBackend, Opener, in_process_app, streamed, until

pytest_plugins = ["hub_fixtures"]  # local_hub, hub_catalog, hub_home
NAME = "tinygemma:270m-q4_k_m"
LONG_REPLY = " ".join(f"word{i}" for i in range(400))


@pytest.fixture
def slow_daemon(home):
    """A fake model that takes seconds per reply: a client can leave in the middle."""
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply=LONG_REPLY, step_delay_s=0.02)) as d:
        yield d


def metric(d, name: str, labels: str) -> float:
    with d.uds() as http:
        for line in http.get("/metrics").text.splitlines():
            if line.startswith(f"localinfer_{name}{{{labels}}} "):
                return float(line.split()[-1])
    return 0.0


def wait_for(condition, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def no_tracebacks(caplog) -> None:
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not loud, [r.getMessage() for r in loud]


def test_a_client_that_leaves_a_whole_reply_is_counted_quietly(slow_daemon, caplog):
    caplog.set_level(logging.INFO)
    with slow_daemon.uds() as http, pytest.raises(httpx.ReadTimeout):
        http.post("/api/generate", json={"model": "fake:1b", "prompt": "hi", "stream": False},
                  timeout=0.5)
    wait_for(lambda: metric(slow_daemon, "requests_total",
                            'route="api/generate",status="499"') == 1, "not counted")
    assert metric(slow_daemon, "client_disconnects_total", 'route="api/generate"') == 1
    wait_for(lambda: metric(slow_daemon, "active_sequences", "") == 0, "still generating")
    no_tracebacks(caplog)
    assert any("the client left" in r.getMessage() for r in caplog.records
               if r.levelno == logging.INFO)


def test_a_client_that_leaves_mid_body_is_counted_quietly(slow_daemon, caplog):
    caplog.set_level(logging.INFO)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(slow_daemon.socket))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                     b'{"model": "fake:1b", "mess')
        time.sleep(0.2)  # the route is waiting for the rest of the body
    wait_for(lambda: metric(slow_daemon, "client_disconnects_total",
                            'route="v1/chat/completions"') == 1, "not counted")
    no_tracebacks(caplog)


def test_a_client_that_leaves_a_stream_is_counted_quietly(slow_daemon, caplog):
    caplog.set_level(logging.INFO)
    with slow_daemon.uds() as http:
        with http.stream("POST", "/v1/chat/completions", json={
                "model": "fake:1b", "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as response:
            for _ in zip(range(3), response.iter_lines(), strict=False):
                pass
    wait_for(lambda: metric(slow_daemon, "client_disconnects_total",
                            'route="v1/chat/completions"') == 1, "not counted")
    wait_for(lambda: metric(slow_daemon, "active_sequences", "") == 0, "still generating")
    assert metric(slow_daemon, "requests_total",
                  'route="v1/chat/completions",status="200"') == 1
    no_tracebacks(caplog)


# --- pulls -------------------------------------------------------------------------------------
@pytest.fixture
def pull_daemon(hub_home, local_hub):
    with serve(fake_factory(reply="hi")) as d:
        yield d


def pull_lines(d, into: list, model: str = NAME) -> None:
    with d.uds() as http, http.stream("POST", "/api/pull", json={"model": model},
                                      timeout=120) as response:
        into.append(response.status_code)
        into.extend(json.loads(line) for line in response.iter_lines())


def test_a_second_pull_of_a_model_joins_the_first(pull_daemon, local_hub):
    local_hub.faults.pause_at = 30_000_000
    first: list = []
    second: list = []
    thread = threading.Thread(target=pull_lines, args=(pull_daemon, first))
    thread.start()
    try:
        assert local_hub.faults.paused.wait(60)
        joiner = threading.Thread(target=pull_lines, args=(pull_daemon, second))
        joiner.start()
        wait_for(lambda: len(second) > 1, "the second pull got no progress")
        assert len(PullJob.running) == 1
    finally:
        local_hub.release()
        thread.join(120)
        joiner.join(120)
    assert first[0] == second[0] == 200
    assert first[-1] == second[-1] == {"status": "success"}
    assert second[1]["completed"] >= 20_000_000  # it joined where the first one was
    assert {json.dumps(s) for s in second[1:]} <= {json.dumps(s) for s in first[1:]}
    assert local_hub.body_bytes() == STARTER_BYTES  # downloaded once


def test_a_pull_held_by_another_process_is_a_409(pull_daemon, local_hub):
    store = ModelStore()
    lock = FileLock(str(store.paths.cache_dir / "locks" / f"{NAME.replace(':', '--')}.lock"))
    (store.paths.cache_dir / "locks").mkdir(parents=True, exist_ok=True)
    with lock, pull_daemon.uds() as http:
        response = http.post("/api/pull", json={"model": NAME, "stream": False})
    assert response.status_code == 409
    assert "a pull of tinygemma:270m-q4_k_m is running" in response.json()["error"]


def test_stopping_the_daemon_cancels_a_stalled_pull_at_once(pull_daemon, local_hub):
    """`localinfer stop` (and a signal) end every pull stream with an error line, even one
    whose download is stalled; the partial file stays."""
    local_hub.faults.pause_at = 30_000_000
    lines: list = []
    thread = threading.Thread(target=pull_lines, args=(pull_daemon, lines))
    thread.start()
    try:
        assert local_hub.faults.paused.wait(60)
        with pull_daemon.uds() as http:
            http.post("/localinfer/shutdown")
        thread.join(10)  # far less than the 30 s a stalled download could hold it
        assert not thread.is_alive(), "the pull stream did not end"
    finally:
        local_hub.release()
        thread.join(60)
    assert "the daemon is shutting down: the pull of" in lines[-1]["error"]
    wait_for(lambda: not PullJob.running, "the pull thread did not stop")
    [partial] = ModelStore().partials()
    assert 0 < partial.size_bytes < STARTER_BYTES


def test_sigterm_during_a_pull(hub_home, local_hub, tmp_path):
    """The real signal in a real `localinfer serve`: the NDJSON client gets a final error
    line, the daemon exits 0, the partial is kept and resumable."""
    local_hub.faults.pause_at = 30_000_000
    sock_path = Path(f"/tmp/li-sig-{os.getpid()}.sock")
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", "serve", "--no-tcp",
                             "--socket", str(sock_path)],
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # a dump if hung
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(sock_path.exists, "the daemon did not start", 60)
        lines: list = []

        def stop_when_stalled() -> None:
            if local_hub.faults.paused.wait(60):
                proc.send_signal(signal.SIGTERM)

        threading.Thread(target=stop_when_stalled, daemon=True).start()
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock_path)),
                          base_url="http://localhost", timeout=60) as http, \
                http.stream("POST", "/api/pull", json={"model": NAME}) as response:
            lines.extend(json.loads(line) for line in response.iter_lines())
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # its threads' stacks, in the failure's output
            print(proc.communicate(timeout=30)[1])
            raise
    finally:
        local_hub.release()
        if proc.poll() is None:
            proc.kill()
        sock_path.unlink(missing_ok=True)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert "the daemon is shutting down: the pull of" in lines[-1]["error"]
    [partial] = ModelStore().partials()
    assert partial.name == NAME and 0 < partial.size_bytes < STARTER_BYTES


def test_a_pull_that_fails_before_its_first_byte_leaves_nothing(hub_home, local_hub,
                                                                capsys):
    local_hub.faults.down = True  # the Hub resolves the file, the CDN answers 503
    store = ModelStore()
    with pytest.raises(DownloadError) as info:
        pull_model(store, NAME)
    assert f"0 B of {STARTER_BYTES / 1e6:.1f} MB is kept" in info.value.message
    assert "?" not in info.value.message
    assert store.partials() == []
    assert not list(store.root.rglob("*.partial*"))
    # Out of disk space: nothing is written either.
    with pytest.raises(StoreError, match="not enough disk space"):
        pull_model(ModelStore(disk_free=lambda path: 1000), NAME)
    assert not list(store.root.rglob("*.partial*"))
    assert main(["list"]) == 0
    assert "Partial download" not in capsys.readouterr().out
    # One left by an earlier version (a description, no bytes) is not listed either.
    _, meta = store.partial_paths(NAME)
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"size": STARTER_BYTES}))
    assert main(["list"]) == 0
    assert "Partial download" not in capsys.readouterr().out


# --- the chat ----------------------------------------------------------------------------------
def test_the_chat_saves_the_streaming_reply_as_it_goes(home):
    backends: list[GatedBackend] = []
    opener = Opener(lambda ref: backends.append(GatedBackend(REPLY, name=ref)) or backends[-1])

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await until(pilot, lambda: app.session is not None, "the model is ready")
            app.query_one("#input").insert("Tell me a story")
            await pilot.press("enter")
            backends[0].release(6)
            await until(pilot, lambda: streamed(app, 6), "a few tokens")
            # What a kill -9 now leaves on disk: the question and the text so far.
            await until(pilot, lambda: len(ChatStore().load(app.chat.id).messages) == 2,
                        "the streaming reply saved")
            saved = ChatStore().load(app.chat.id).messages
            assert [m.role for m in saved] == ["user", "assistant"]
            assert saved[1].finish_reason == "interrupted"
            assert saved[1].content and REPLY.startswith(saved[1].content)
            assert app.chat.messages[-1].role == "user"  # in memory: not a message yet
            widget = app.reply.widget
            backends[0].open()
            # Until the widget has settled too: the app drops its reply before that, and
            # leaving run_test while it settles tears the widget down under it.
            await until(pilot, lambda: app.reply is None and not widget.streaming,
                        "the reply ends")
        final = ChatStore().load(app.chat.id).messages
        assert [(m.role, m.finish_reason) for m in final] == [("user", None),
                                                              ("assistant", "stop")]
        opener.close()

    asyncio.run(main())

    # After crashes (one mid-reply, one before the first word), the next prompt alternates.
    chat = ChatStore().new()
    chat.add(ChatMessage("user", "q1"))
    chat.add(ChatMessage("assistant", "Once up", finish_reason="interrupted"))
    chat.add(ChatMessage("user", "q2"))  # killed before its reply's first word was saved
    chat.add(ChatMessage("user", "q2 again"))
    roles = [m.role for m in chat.prompt_messages()]
    assert roles == ["user", "assistant", "user"]
    assert chat.prompt_messages()[-1].content == "q2 again"


@pytest.mark.model
def test_kill_9_of_the_chat_mid_reply_keeps_the_streamed_text(home, starter_path):
    """The real `localinfer chat --no-daemon` in a terminal, killed while the starter model
    writes: the chat file holds the question and the reply so far, marked interrupted."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localinfer", "chat", "--no-daemon", str(starter_path)],
        stdin=follower, stdout=follower, stderr=follower,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"},
        start_new_session=True)
    os.close(follower)
    screen = bytearray()

    def drain() -> None:  # the app blocks if nobody reads its screen
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                return
            if not chunk:
                return
            screen.extend(chunk)

    threading.Thread(target=drain, daemon=True).start()
    store = ChatStore()

    def streaming_reply() -> str:
        for summary in store.summaries():
            messages = store.load(summary.id).messages
            if len(messages) == 2 and messages[1].finish_reason == "interrupted" and \
                    len(messages[1].content.split()) >= 3:
                return messages[1].content
        return ""

    try:
        wait_for(lambda: b"Chat with" in screen, "the chat did not start", 120)
        for ch in "Write a long story about a dragon who learns to cook.":
            os.write(leader, ch.encode())
        os.write(leader, b"\r")
        wait_for(streaming_reply, "no streaming reply was saved", 120)
        proc.kill()  # SIGKILL: no chance to save anything more
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    [summary] = store.summaries()
    user, reply = store.load(summary.id).messages
    assert user.content == "Write a long story about a dragon who learns to cook."
    assert reply.finish_reason == "interrupted" and len(reply.content.split()) >= 3


@pytest.mark.model
def test_tokenizing_a_lone_surrogate_is_an_invalid_request(real_engine):
    """Behind the daemon's own check: llama.cpp's tokenizer gets UTF-8, and a string with an
    unpaired surrogate has none; the error says so instead of a UnicodeEncodeError."""
    with pytest.raises(InvalidRequest, match="unpaired UTF-16 surrogate"):
        real_engine.completion_tokens("a cut emoji: \ud83d")
    with pytest.raises(InvalidRequest, match="unpaired UTF-16 surrogate"):
        real_engine.chat_tokens([Message("user", "\udc00")])


@pytest.mark.parametrize("runs_out", ["weights", "kv"])
def test_a_load_that_runs_out_of_memory_says_what_ran_out_and_what_to_do(tmp_path, runs_out):
    """A ~930 MiB model with 256 MiB of room left to this process: read into RAM (no mmap),
    its weights cannot be allocated; mapped (and room for the mapping), with a 65536-token
    context, its 1 GiB KV cache cannot. The error says which and how much. (The GPU lane runs
    a GPU out of memory the same way: tests/test_gpu.py.)"""
    big = tmp_path / "zero.gguf"
    size = ggufgen.write_zero_model(big, context=65536)
    header = gguf.read_header(big)  # read first: the reader maps the whole file
    weights = runs_out == "weights"
    options = (LoadOptions(n_ctx=256, n_gpu_layers=0, use_mmap=False) if weights
               else LoadOptions(n_ctx=65536, n_gpu_layers=0))
    room = 256 * 2**20 + (0 if weights else size)
    with address_space_limit(room), pytest.raises(ModelLoadError) as e:
        load_engine(big, options, name="zero", header=header)
    message = str(e.value)
    assert e.value.title == "out of memory"
    assert message.startswith("out of memory loading zero.gguf: llama.cpp could not allocate")
    if weights:
        asked = float(message.split("allocate ")[1].split(" MiB")[0])
        assert 0.9 * size / 2**20 < asked <= size / 2**20
        assert "of RAM (CPU buffer) for its weights. Use a smaller quantization" in message
    else:  # 8 layers x K and V x 512 x 65536 x 2 bytes
        assert ("allocate 1.00 GiB of RAM (CPU buffer) for its KV cache (65536 tokens x 1"
                " slot). Use a smaller --ctx") in message
    # Nothing held on: with the room back, it loads (mapped, a small context).
    engine = load_engine(big, LoadOptions(n_ctx=256, n_gpu_layers=0), name="zero")
    engine.close()
