"""The daemon's lifecycle: one instance per user, a private Unix socket (curl can use it),
clear errors for a busy port or a bad socket path, and a stop that ends in-flight streams."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time

import openai
import pytest

from daemon_util import STARTER, fake_factory, install_fake_models, openai_client, serve
from localinfer.client import DaemonClient
from localinfer.daemon.server import Daemon, ServeOptions
from localinfer.errors import DaemonError

pytest_plugins = ["daemon_fixtures"]  # daemon


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_over_the_unix_socket(daemon):
    out = subprocess.run(["curl", "-s", "--unix-socket", str(daemon.socket),
                          "http://localhost/api/tags"], capture_output=True, text=True,
                         check=True)
    assert {m["name"] for m in json.loads(out.stdout)["models"]} == {"fake:1b-f16",
                                                                      "other:2b-f16", STARTER}
    out = subprocess.run(["curl", "-sN", "--unix-socket", str(daemon.socket),
                          "http://localhost/v1/chat/completions", "-d",
                          '{"model":"fake:1b","stream":true,"messages":[{"role":"user",'
                          '"content":"hi"}]}'], capture_output=True, text=True, check=True)
    assert out.stdout.rstrip().endswith("data: [DONE]")


def test_stop_ends_in_flight_streams_and_removes_the_socket(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 5000, step_delay_s=0.005)) as d:
        client = openai_client(d)
        stream = client.chat.completions.create(model="fake:1b", stream=True, messages=[
            {"role": "user", "content": "x"}])
        next(iter(stream))
        d.daemon.stop()
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in stream:
                pass
    assert not d.socket.exists()


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ("/api/generate", {"prompt": "x", "stream": False}),
    ("/v1/messages", {"max_tokens": 9000, "messages": [{"role": "user", "content": "x"}]}),
    ("/completion", {"prompt": "x"}),
])
def test_a_whole_reply_cut_off_by_a_stop_is_a_503_not_a_short_200(home, path, body):
    """A non-streamed reply the shutdown stopped came back 200 with finish_reason "stop" and
    12 of 500 tokens: the client took half an answer for the whole."""
    import threading
    import time

    import httpx

    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 5000, step_delay_s=0.005)) as d:
        got: list[httpx.Response] = []
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(d.socket)),
                          base_url="http://localinfer", timeout=60) as c:
            asker = threading.Thread(target=lambda: got.append(c.post(
                path, json={"model": "fake:1b", **body})))
            asker.start()
            deadline = time.monotonic() + 30
            while not any(m["stats"]["active"] for m in
                          DaemonClient(socket_path=d.socket).status()["loaded"]):
                assert time.monotonic() < deadline, "the reply never started"
                time.sleep(0.02)
            time.sleep(0.1)  # a few tokens in
            d.daemon.stop()
            asker.join(30)
    [r] = got
    assert r.status_code == 503, r.text
    assert "shutting down" in r.text


def test_second_instance_and_stale_files(home, tmp_path):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory()) as d:
        second = Daemon(ServeOptions(socket_path=tmp_path / "x.sock", port=0), fake_factory())
        with pytest.raises(DaemonError, match="already serving"):
            second.start()
        pid = os.getpid()
        assert str(pid) in json.dumps(DaemonClient(socket_path=d.socket).status())
    # A crash leaves a socket file and an unlocked pid file behind: the next start reuses them.
    from localinfer.instance import pid_file, runtime_dir

    runtime_dir()
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    pid_file().write_text(json.dumps({"pid": 999999, "socket": str(stale)}))
    daemon = Daemon(ServeOptions(socket_path=stale, port=0), fake_factory())
    daemon.start()
    try:
        assert stale.exists() and (stale.stat().st_mode & 0o777) == 0o600
    finally:
        daemon._cleanup()
    assert not stale.exists() and not pid_file().exists()


def test_port_in_use_is_a_clear_error(home, tmp_path):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    try:
        daemon = Daemon(ServeOptions(socket_path=tmp_path / "p.sock", port=port),
                        fake_factory())
        with pytest.raises(DaemonError, match=f"port {port}.*in use"):
            daemon.start()
        assert not (tmp_path / "p.sock").exists()
    finally:
        blocker.close()


def test_socket_is_private(daemon):
    assert (daemon.socket.stat().st_mode & 0o777) == 0o600


def test_socket_path_that_is_a_file_is_not_deleted(home, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("precious")
    daemon = Daemon(ServeOptions(socket_path=notes, tcp=False), fake_factory())
    with pytest.raises(DaemonError, match="not a socket"):
        daemon.start()
    assert notes.read_text() == "precious"


def test_a_start_refused_for_another_homes_socket_leaves_it_alone(daemon, tmp_path,
                                                                  monkeypatch):
    # Another home's daemon on the same --socket: refused, and that daemon's socket stays
    # (it was removed: the running daemon was then out of reach of ps and stop).
    from localinfer.paths import get_paths

    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path / "other-home"))
    other = Daemon(ServeOptions(socket_path=daemon.socket, tcp=False), fake_factory(),
                   paths=get_paths())
    with pytest.raises(DaemonError, match="already listening"):
        other.start()
    assert daemon.socket.is_socket()
    with daemon.uds() as c:
        assert c.get("/health").status_code == 200


def test_sockets_accept_connections_from_the_bind_on(tmp_path):
    import socket as socket_mod

    from localinfer.daemon.server import bind_tcp, bind_unix

    unix = bind_unix(tmp_path / "d.sock")
    tcp = bind_tcp("127.0.0.1", 0)
    try:
        for sock in (unix, tcp):
            client = socket_mod.socket(sock.family, socket_mod.SOCK_STREAM)
            client.connect(sock.getsockname())  # queued until the server accepts it
            client.close()
    finally:
        unix.close()
        tcp.close()


def test_a_live_daemons_socket_is_not_taken_over(tmp_path):
    """`serve --socket` naming another home's socket: the live one is refused, not unlinked
    (its daemon lost its clients, and its path when the second exited); a crash's leftover
    is replaced."""
    from localinfer.daemon.server import bind_unix

    path = tmp_path / "d.sock"
    live = bind_unix(path)
    try:
        with pytest.raises(DaemonError, match="already listening"):
            bind_unix(path)
        assert path.is_socket()
    finally:
        live.close()
    again = bind_unix(path)  # closed without unlinking: nobody answers there now
    again.close()


def test_a_chat_reply_cut_off_by_a_stop_is_an_error_not_a_cancel(home):
    """localinfer's own stream (the chat UI's): the shutdown's cut showed as the user's
    cancel ("✂ cancelled"), with no word of the daemon going away."""
    import time

    from localinfer.runtime.types import Message, SamplingParams, Token

    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 5000, step_delay_s=0.005)) as d:
        generation = DaemonClient(socket_path=d.socket).generate(
            "fake:1b", messages=[Message("user", "x")], params=SamplingParams(max_tokens=4000))
        events = iter(generation)
        assert isinstance(next(events), Token)
        time.sleep(0.05)
        d.daemon.stop()
        with pytest.raises(DaemonError, match="shutting down"):
            for _ in events:
                pass


def test_a_client_that_stops_reading_frees_its_slot(home, monkeypatch):
    """A client that never reads its stream (a suspended editor) held its slot for ever once
    the socket's buffers filled: 8 of them wedged the daemon. Past STALL_S it is taken as
    gone."""
    import time

    from localinfer.daemon import bridge

    monkeypatch.setattr(bridge, "STALL_S", 1.0)
    install_fake_models("fake:1b-f16")
    errors: list[logging.LogRecord] = []
    seen = logging.Handler(logging.ERROR)
    seen.emit = errors.append  # type: ignore[method-assign]
    with serve(fake_factory(reply="a long line of text " * 20000, n_ctx=200_000)) as d:
        logging.getLogger("uvicorn.error").addHandler(seen)  # after uvicorn set its logging
        body = json.dumps({"model": "fake:1b", "prompt": "x", "stream": True,
                           "max_tokens": 150_000}).encode()
        stuck = socket.socket(socket.AF_UNIX)
        stuck.connect(str(d.socket))
        stuck.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type:"
                      b" application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        client = DaemonClient(socket_path=d.socket)

        def active() -> int:
            return sum(m["stats"]["active"] for m in client.status()["loaded"])

        deadline = time.monotonic() + 30
        while not active():
            assert time.monotonic() < deadline, "the stream never started"
            time.sleep(0.02)
        while active():  # its buffers fill, then it is ended
            assert time.monotonic() < deadline, "the stalled stream kept its slot"
            time.sleep(0.1)
        stuck.close()
    logging.getLogger("uvicorn.error").removeHandler(seen)
    # Its close is logged at info as what it is, not at error as an unfinished response.
    assert [r.getMessage() for r in errors] == []


def test_a_connection_that_sends_nothing_or_half_a_request_is_closed(home, monkeypatch):
    """Idle and half-sent connections stayed open for ever: enough of them used up the
    daemon's file descriptors and it stopped answering."""
    import time

    from localinfer.daemon import server as server_module

    monkeypatch.setattr(server_module, "REQUEST_READ_S", 0.5)
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 100, step_delay_s=0.01)) as d:
        silent = socket.socket(socket.AF_UNIX)
        silent.connect(str(d.socket))
        half = socket.socket(socket.AF_UNIX)
        half.connect(str(d.socket))
        half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                     b"\r\n0123456789")
        answered = socket.socket(socket.AF_UNIX)  # the app answers before the body is whole
        answered.connect(str(d.socket))
        answered.sendall(b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                         b"\r\n0123456789")
        received = {}
        for name, conn in (("silent", silent), ("half", half), ("answered", answered)):
            conn.settimeout(10)
            started = time.monotonic()
            received[name] = b""
            while chunk := conn.recv(4096):  # read to the close
                received[name] += chunk
            assert time.monotonic() - started < 9
        assert received["silent"] == b""  # an idle connection is only closed
        head, _, body = received["half"].partition(b"\r\n\r\n")  # half a request: told why
        assert head.startswith(b"HTTP/1.1 408 ")
        assert "did not arrive whole within 0.5 s" in json.loads(body)["error"]["message"]
        # An answer already sent is not followed by a 408 on the same connection.
        assert received["answered"].startswith(b"HTTP/1.1 404 ")
        assert b"408" not in received["answered"]
        # A whole request, and a stream longer than the deadline, are not cut.
        started = time.monotonic()
        reply = openai_client(d).completions.create(model="fake:1b", prompt="x",
                                                    max_tokens=100,
                                                    extra_body={"speculative": False})
        assert reply.usage.completion_tokens == 100 and time.monotonic() - started > 0.5


def test_connections_past_the_cap_are_refused_with_a_json_503(home, monkeypatch):
    """A client that opens connections without closing them used up the daemon's file
    descriptors (~21,000 here) and nobody could reach it; past MAX_CONNECTIONS a new one is
    told why, and the daemon answers again once they close."""
    from localinfer.daemon import server as server_module

    monkeypatch.setattr(server_module, "MAX_CONNECTIONS", 3)
    install_fake_models("fake:1b-f16")
    with serve(fake_factory()) as d:
        idle = []
        for _ in range(3):
            conn = socket.socket(socket.AF_UNIX)
            conn.connect(str(d.socket))
            idle.append(conn)
        refused = socket.socket(socket.AF_UNIX)
        refused.connect(str(d.socket))
        refused.settimeout(10)
        received = b""
        while chunk := refused.recv(4096):
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ")
        assert "3 connections open already" in json.loads(body)["error"]["message"]
        for conn in idle:
            conn.close()
        with d.uds() as c:
            deadline = time.monotonic() + 10
            while c.get("/health").status_code != 200:  # the idle ones' closes are seen
                assert time.monotonic() < deadline
                time.sleep(0.05)


def test_the_connection_cap_leaves_room_under_the_open_files_limit(monkeypatch):
    """macOS starts processes with 256 open files, below the 512 connections allowed: the
    daemon raises its soft limit, and caps connections below whatever limit it has."""
    import resource

    from localinfer.daemon import server as server_module

    monkeypatch.setattr(server_module, "_fd_limit", 300)
    assert server_module.connection_cap() == 300 - server_module.FD_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        assert server_module.raise_fd_limit() == (hard if hard != resource.RLIM_INFINITY
                                                  else resource.getrlimit(
                                                      resource.RLIMIT_NOFILE)[0])
        assert server_module.connection_cap() == min(server_module.MAX_CONNECTIONS,
                                                     server_module._fd_limit
                                                     - server_module.FD_SPARE)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_exit_counts_from_the_end_of_the_last_reply(home):
    # It counted from the request's start: a reply streaming longer than --idle-exit had the
    # daemon exit as soon as it ended.
    from localinfer.daemon.state import DaemonSettings

    install_fake_models("fake:1b-f16")
    factory = fake_factory(reply="tok " * 120, step_delay_s=0.01)
    with serve(factory, settings=DaemonSettings(idle_exit_s=1.0)) as d:
        client = openai_client(d)
        text = client.completions.create(model="fake:1b", prompt="a",
                                          extra_body={"speculative": False}).choices[0].text
        assert text.count("tok") >= 100  # about 1.2 s, past the idle exit
        time.sleep(0.3)
        with d.uds() as c:
            assert c.get("/health").status_code == 200  # still there after the reply
        deadline = time.monotonic() + 10
        while not d.daemon.state.exit_requested.is_set() and d.socket.exists() and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert not d.socket.exists()  # then gone, idle


def test_a_shutdown_while_a_model_loads_answers_its_requests_at_once(home):
    # The requests waiting for the load got a cut stream or a plain-text 500 after uvicorn's
    # 5 s graceful timeout; the load goes on in its thread and is closed at its end.
    install_fake_models("fake:1b-f16")
    release = threading.Event()
    made: list = []
    inner = fake_factory()

    def slow(model, num_ctx, progress=None):
        release.wait(10)
        made.append(inner(model, num_ctx, progress))
        return made[-1]

    with serve(slow) as d:
        replies: list = []

        def ask() -> None:
            with d.uds() as c:
                replies.append(c.post("/v1/completions", json={"model": "fake:1b",
                                                                "prompt": "a"}))

        asker = threading.Thread(target=ask)
        asker.start()
        deadline = time.monotonic() + 10
        while d.manager.loading is None and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        d.daemon.stop()
        asker.join(10)
        waited = time.monotonic() - started
        release.set()
    [reply] = replies
    assert reply.status_code == 503 and "shutting down" in reply.json()["error"]["message"]
    assert waited < 3  # not uvicorn's 5 s
    deadline = time.monotonic() + 10
    while not (made and made[0].backend.closed) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert made and made[0].backend.closed  # the engine the load made after all is closed
