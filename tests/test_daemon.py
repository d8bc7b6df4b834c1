"""The daemon, in-process on a temporary socket and port, with the scripted fake backend,
driven by the real openai and ollama client libraries, httpx and curl."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time

import httpx
import ollama
import openai
import pytest

from daemon_util import fake_factory, install_fake_models, serve
from localinfer.client import DaemonClient
from localinfer.daemon.app import DaemonSettings
from localinfer.daemon.server import Daemon, ServeOptions
from localinfer.errors import ContextOverflow, DaemonError, ModelNotFound
from localinfer.runtime.types import Done, Message, SamplingParams, Token

REPLY = "Hello from the fake model, streaming word by word."


@pytest.fixture
def daemon(home):
    install_fake_models("fake:1b-f16", "other:2b-f16")
    with serve(fake_factory(reply=REPLY, step_delay_s=0.001)) as d:
        yield d


def openai_client(d, tcp=False, **kwargs) -> openai.OpenAI:
    if tcp:
        return openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, **kwargs)
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(d.socket)))
    return openai.OpenAI(base_url="http://localhost/v1", api_key="unused", http_client=http,
                         max_retries=0, **kwargs)


def ollama_client(d, tcp=False) -> ollama.Client:
    if tcp:
        return ollama.Client(host=d.url)
    return ollama.Client(host="http://localhost",
                         transport=httpx.HTTPTransport(uds=str(d.socket)))


# --- OpenAI --------------------------------------------------------------------------------
@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_openai_chat_streaming_and_not(daemon, tcp):
    client = openai_client(daemon, tcp)
    messages = [{"role": "user", "content": "hi"}]
    full = client.chat.completions.create(model="fake:1b", messages=messages)
    assert full.choices[0].message.content == REPLY
    assert full.choices[0].finish_reason == "stop"
    assert full.usage.completion_tokens > 5 and full.usage.prompt_tokens > 0
    assert full.model == "fake:1b-f16"
    chunks = list(client.chat.completions.create(
        model="fake:1b", messages=messages, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == REPLY
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens
    # localinfer's extra: every content chunk carries live timings, the final one all of them
    timed = [c.model_extra["timings"] for c in chunks if c.model_extra.get("timings")]
    assert timed[-1]["decode_tps"] > 0 and "prefill_ms" in timed[-1]
    assert any("n_tokens" in t for t in timed)


def test_openai_completions_and_max_tokens(daemon):
    client = openai_client(daemon)
    out = client.completions.create(model="fake:1b", prompt="Once", max_tokens=3)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 3
    stream = client.completions.create(model="fake:1b", prompt="Once", stream=True,
                                       max_tokens=4)
    assert "".join(c.choices[0].text for c in stream) == out.choices[0].text + " "
    chat = client.chat.completions.create(model="fake:1b", messages=[
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        max_completion_tokens=2)
    assert chat.choices[0].finish_reason == "length"


def test_openai_models_and_stop(daemon):
    client = openai_client(daemon)
    ids = {m.id for m in client.models.list()}
    assert ids == {"fake:1b-f16", "other:2b-f16"}
    out = client.chat.completions.create(model="fake:1b", messages=[
        {"role": "user", "content": "hi"}], stop=["model"], seed=1, temperature=0.2, top_p=0.9)
    assert out.choices[0].message.content == "Hello from the fake "


def test_openai_errors_have_openai_shape(daemon):
    client = openai_client(daemon)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope:1b", messages=[{"role": "user",
                                                                   "content": "x"}])
    assert info.value.body["code"] == "model_not_found"
    assert "nope:1b" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="'n' must be 1"):
        client.chat.completions.create(model="fake:1b", n=2, messages=[
            {"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="must not be empty"):
        client.chat.completions.create(model="fake:1b", messages=[])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake:1b", messages=[
            {"role": "user", "content": "word " * 3000}])
    assert info.value.body["code"] == "context_length_exceeded"
    assert "2048 tokens" in info.value.body["message"]


# --- Ollama --------------------------------------------------------------------------------
@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_ollama_chat_and_generate(daemon, tcp):
    client = ollama_client(daemon, tcp)
    parts = list(client.chat(model="fake:1b", messages=[{"role": "user", "content": "hi"}],
                             stream=True))
    assert "".join(p.message.content for p in parts) == REPLY
    last = parts[-1]
    assert last.done and last.done_reason == "stop"
    assert last.eval_count > 5 and last.eval_duration > 0 and last.prompt_eval_count > 0
    assert last.total_duration >= last.eval_duration
    whole = client.chat(model="fake:1b", messages=[{"role": "user", "content": "hi"}],
                        options={"num_predict": 4, "temperature": 0, "seed": 3})
    assert whole.done_reason == "length" and whole.eval_count == 4
    gen = client.generate(model="fake:1b", prompt="hi", system="Be brief.")
    assert gen.response == REPLY
    raw = client.generate(model="fake:1b", prompt="hi", raw=True, stream=True,
                          options={"stop": ["model"]})
    assert "".join(p.response for p in raw) == "Hello from the fake "


def test_ollama_listing_routes(daemon):
    client = ollama_client(daemon)
    with daemon.uds() as c:
        assert c.get("/api/version").json()["version"]
    names = {m.model for m in client.list().models}
    assert names == {"fake:1b-f16", "other:2b-f16"}
    client.generate(model="fake:1b", prompt="hi")
    running = client.ps().models
    assert [m.model for m in running] == ["fake:1b-f16"] and running[0].size_vram == 0
    show = client.show("fake:1b")
    assert show.details.format == "gguf"


def test_ollama_load_unload_and_keep_alive(daemon):
    client = ollama_client(daemon)
    loaded = client.chat(model="other:2b", messages=[])
    assert loaded.done_reason == "load"
    assert [m.model for m in client.ps().models] == ["other:2b-f16"]
    unloaded = client.generate(model="other:2b", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert client.ps().models == []
    client.generate(model="fake:1b", prompt="hi", keep_alive=0)
    assert client.ps().models == []  # keep_alive 0: unloaded right after the request


def test_ollama_errors(daemon):
    client = ollama_client(daemon)
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="nope:1b", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 404 and "nope:1b" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model="fake:1b", prompt="hi", options={"temperature": "hot"})
    assert info.value.status_code == 400 and "options.temperature" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model="fake:1b", prompt="x", suffix="y")
    assert info.value.status_code == 400 and "fill-in-the-middle" in info.value.error


def test_fill_in_the_middle(home):
    install_fake_models("coder:1b-f16")
    with serve(fake_factory(reply="middle", fim=True)) as d:
        out = ollama_client(d).generate(model="coder:1b", prompt="def f(", suffix="):")
        assert out.response == "middle"


# --- httpx, curl, health, metrics ------------------------------------------------------------
def test_health_and_metrics(daemon):
    with daemon.uds() as c:
        assert c.get("/health").json()["status"] == "ok"
        c.post("/api/generate", json={"model": "fake:1b", "prompt": "hi", "stream": False})
        text = c.get("/metrics").text
    assert 'localinfer_requests_total{route="api/generate",status="200"} 1' in text
    assert 'localinfer_model_loaded{model="fake:1b-f16"} 1' in text
    for name in ("prompt_tokens_total", "generated_tokens_total", "decode_tokens_per_second",
                 "queue_depth", "process_resident_memory_bytes"):
        assert f"localinfer_{name}" in text


def test_health_is_503_while_loading(home):
    install_fake_models("slow:1b-f16")
    gate = threading.Event()
    base = fake_factory()

    def slow_factory(model, num_ctx, progress=None):
        progress(0.5)
        gate.wait(10)
        return base(model, num_ctx, progress)

    with serve(slow_factory) as d:
        with d.uds() as c:
            worker = threading.Thread(target=c.post, args=("/api/generate",),
                                      kwargs={"json": {"model": "slow:1b"}})
            worker.start()
            deadline = time.monotonic() + 5
            while d.manager.loading is None and time.monotonic() < deadline:
                time.sleep(0.01)
            with d.uds() as c2:
                health = c2.get("/health")
            gate.set()
            worker.join()
        assert health.status_code == 503 and health.json()["status"] == "loading"
        assert health.json()["progress"] == 0.5


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_over_the_unix_socket(daemon):
    out = subprocess.run(["curl", "-s", "--unix-socket", str(daemon.socket),
                          "http://localhost/api/tags"], capture_output=True, text=True,
                         check=True)
    assert {m["name"] for m in json.loads(out.stdout)["models"]} == {"fake:1b-f16",
                                                                      "other:2b-f16"}
    out = subprocess.run(["curl", "-sN", "--unix-socket", str(daemon.socket),
                          "http://localhost/v1/chat/completions", "-d",
                          '{"model":"fake:1b","stream":true,"messages":[{"role":"user",'
                          '"content":"hi"}]}'], capture_output=True, text=True, check=True)
    assert out.stdout.rstrip().endswith("data: [DONE]")


# --- bad input: always a 4xx JSON error, never a 500 ----------------------------------------
@pytest.mark.parametrize("path, body, status, needle", [
    ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
    ("/api/chat", b"[1, 2]", 400, "JSON object"),
    ("/v1/chat/completions", b"", 400, "empty"),
    ("/v1/chat/completions", {"model": 5, "messages": [{"role": "user", "content": "x"}]},
     400, "'model' must be a string"),
    ("/v1/chat/completions", {"model": "fake:1b", "messages": "hi"}, 400, "list"),
    ("/v1/chat/completions", {"model": "fake:1b", "messages": [{"content": "x"}]}, 400,
     "'messages[0].role' is required"),
    ("/v1/chat/completions", {"model": "fake:1b", "messages": [{"role": "user",
                                                               "content": 3}]}, 400, "content"),
    ("/v1/chat/completions", {"model": "fake:1b", "max_tokens": 0, "messages": [
        {"role": "user", "content": "x"}]}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": "fake:1b", "temperature": -1, "messages": [
        {"role": "user", "content": "x"}]}, 400, "temperature"),
    ("/v1/completions", {"model": "fake:1b", "prompt": ["a", "b"]}, 400, "one prompt"),
    ("/api/generate", {"model": "../../etc/passwd", "prompt": "x"}, 400, "file path"),
    ("/api/generate", {"model": "/etc/passwd", "prompt": "x"}, 400, "file path"),
    ("/api/chat", {"model": "fake:1b", "keep_alive": "soon", "messages": [
        {"role": "user", "content": "x"}]}, 400, "keep_alive"),
    ("/api/chat", {"model": "fake:1b", "messages": [{"role": "wizard", "content": "x"}]},
     400, "role"),
    ("/api/show", {}, 400, "'model' is required"),
    ("/v1/nothing", {}, 404, "no such endpoint"),
])
def test_bad_requests_get_clear_json_errors(daemon, path, body, status, needle):
    with daemon.uds() as c:
        if isinstance(body, bytes):
            response = c.post(path, content=body)
        else:
            response = c.post(path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert needle in message
    if path.startswith("/api/"):
        assert isinstance(error, str)  # Ollama's shape
    else:
        assert {"message", "type", "code"} <= set(error)  # OpenAI's shape


def test_oversized_body_is_413(daemon):
    with daemon.uds() as c:
        response = c.post("/v1/chat/completions", content=b"x" * (9 * 1024 * 1024))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_wrong_method_is_a_json_error(daemon):
    with daemon.uds() as c:
        response = c.get("/v1/chat/completions")
    assert response.status_code == 405 and "error" in response.json()


# --- security ---------------------------------------------------------------------------------
def test_host_header_must_be_loopback_over_tcp(daemon):
    with daemon.tcp() as c:
        assert c.get("/api/tags", headers={"Host": "evil.example"}).status_code == 403
        assert c.get("/api/tags", headers={"Host": "localhost:11480"}).status_code == 200
        assert c.get("/api/tags", headers={"Host": "[::1]:80"}).status_code == 200
        assert c.get("/api/tags", headers={"Host": "127.0.0.1"}).status_code == 200
        assert c.get("/api/tags", headers={"Host": "127.0.0.1.evil.example"}).status_code == 403
    with daemon.uds() as c:  # a Unix socket cannot be reached by a browser
        assert c.get("/api/tags", headers={"Host": "anything"}).status_code == 200


def test_browser_origins_are_refused_unless_configured(daemon):
    with daemon.tcp() as c:
        bad = c.post("/api/generate", json={"model": "fake:1b", "prompt": "x"},
                     headers={"Origin": "https://evil.example"})
        assert bad.status_code == 403
        assert "access-control-allow-origin" not in bad.headers
        ok = c.get("/api/tags", headers={"Origin": "http://localhost:5173"})
        assert ok.status_code == 200 and "access-control-allow-origin" not in ok.headers


def test_configured_cors_origin(home):
    install_fake_models("fake:1b-f16")
    settings = DaemonSettings(cors_origins=("https://app.example",))
    with serve(fake_factory(), settings=settings) as d, d.tcp() as c:
        pre = c.options("/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
        assert pre.headers["access-control-allow-origin"] == "https://app.example"
        got = c.get("/api/tags", headers={"Origin": "https://app.example"})
        assert got.headers["access-control-allow-origin"] == "https://app.example"


def test_api_key_required_over_tcp_only(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(), settings=DaemonSettings(api_key="s3cret")) as d:
        with d.tcp() as c:
            missing = c.get("/v1/models")
            assert missing.status_code == 401
            assert missing.json()["error"]["code"] == "invalid_api_key"
            assert c.get("/v1/models", headers={"Authorization": "Bearer nope"}
                         ).status_code == 401
            assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}
                         ).status_code == 200
            assert c.get("/health").status_code == 200
        with d.uds() as c:
            assert c.get("/v1/models").status_code == 200
        assert openai.OpenAI(base_url=d.url + "/v1", api_key="s3cret").models.list().data


# --- scheduling -------------------------------------------------------------------------------
def test_client_disconnect_cancels_and_frees_the_slot(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 2000, step_delay_s=0.005, n_slots=1)) as d:
        with d.uds() as c:
            with c.stream("POST", "/api/generate", json={"model": "fake:1b", "prompt": "x"}
                          ) as response:
                lines = response.iter_lines()
                for _ in range(3):
                    next(lines)
            engine = d.manager.loaded["fake:1b-f16"].engine
            deadline = time.monotonic() + 5
            while engine.stats().active and time.monotonic() < deadline:
                time.sleep(0.01)
            assert engine.stats().active == 0
            generated = engine.stats().generated_tokens_total
            assert generated < 200  # stopped long before the 4000-token reply ended
            # The only slot is free again: the next request runs at once.
            quick = c.post("/api/generate", json={"model": "fake:1b", "prompt": "y",
                                                  "stream": False,
                                                  "options": {"num_predict": 2}})
            assert quick.json()["done_reason"] == "length"


def test_full_queue_is_503_with_retry_after(home):
    install_fake_models("fake:1b-f16")
    factory = fake_factory(max_queue=1, reply="tok " * 2000, step_delay_s=0.005, n_slots=1)
    with serve(factory) as d, d.uds() as c1, d.uds() as c2, d.uds() as c3:
        # No speculation: the first reply must still be running when the third request comes.
        with c1.stream("POST", "/v1/completions", json={"model": "fake:1b", "prompt": "a",
                                                         "stream": True, "speculative": False}
                       ) as r1:
            # Keep the iterator: a dropped one is closed, and httpx then closes the connection
            # (the daemon would rightly cancel the first reply).
            lines = r1.iter_lines()
            next(lines)
            with c2.stream("POST", "/v1/completions", json={"model": "fake:1b",
                                                             "prompt": "b", "stream": True}):
                third = c3.post("/v1/completions", json={"model": "fake:1b", "prompt": "c"})
    assert third.status_code == 503
    assert third.headers["retry-after"]
    assert third.json()["error"]["code"] == "server_busy"


def test_concurrent_clients_all_complete_correctly(home):
    install_fake_models("fake:1b-f16")
    factory = fake_factory(reply=lambda p: "answer to " + p.split()[-1], step_delay_s=0.002,
                           n_slots=4)
    with serve(factory) as d:
        results = {}

        def ask(i):
            client = openai_client(d, tcp=i % 2 == 0)
            out = client.completions.create(model="fake:1b", prompt=f"question q{i}",
                                            temperature=0)
            results[i] = out.choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == {i: f"answer to q{i}" for i in range(8)}


def test_swapping_models_waits_for_in_flight_work(home):
    install_fake_models("fake:1b-f16", "other:2b-f16")
    loads = []
    factory = fake_factory(loads=loads, reply="tok " * 100, step_delay_s=0.002)
    with serve(factory) as d:
        client = openai_client(d)
        first = iter(client.completions.create(model="fake:1b", prompt="a", stream=True))
        text = next(first).choices[0].text  # the first model is generating
        second = client.completions.create(model="other:2b", prompt="b", max_tokens=3)
        assert second.choices[0].finish_reason == "length"
        text += "".join(c.choices[0].text for c in first)
        assert text.count("tok") == 100  # the first reply was completed, not cut
        assert [name for name, _ in loads] == ["fake:1b-f16", "other:2b-f16"]
        assert list(d.manager.loaded) == ["other:2b-f16"]


def test_keep_alive_expiry_unloads(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(), keep_alive_s=0.3) as d:
        ollama_client(d).generate(model="fake:1b", prompt="hi")
        assert list(d.manager.loaded) == ["fake:1b-f16"]
        deadline = time.monotonic() + 5
        while d.manager.loaded and time.monotonic() < deadline:
            time.sleep(0.05)
        assert d.manager.loaded == {}


def test_num_ctx_larger_than_loaded_reloads_and_is_capped_at_training(home):
    install_fake_models("fake:1b-f16")
    loads = []
    with serve(fake_factory(loads=loads, n_ctx_train=8192)) as d:
        client = ollama_client(d)
        client.generate(model="fake:1b", prompt="hi")
        client.generate(model="fake:1b", prompt="hi", options={"num_ctx": 4096})
        client.generate(model="fake:1b", prompt="hi", options={"num_ctx": 1024})
        # Beyond what the model was trained for: capped (as Ollama does), not an error.
        client.generate(model="fake:1b", prompt="hi", options={"num_ctx": 1_000_000})
        assert d.manager.loaded["fake:1b-f16"].engine.info.n_ctx == 8192
    assert loads == [("fake:1b-f16", None), ("fake:1b-f16", 4096), ("fake:1b-f16", 8192)]


def test_a_model_whose_engine_crashed_is_loaded_again(home):
    install_fake_models("fake:1b-f16")
    loads = []
    with serve(fake_factory(loads=loads)) as d:
        client = ollama_client(d)
        client.generate(model="fake:1b", prompt="hi")
        engine = d.manager.loaded["fake:1b-f16"].engine

        def broken(params, seed):
            raise TypeError("a bug in the backend")

        engine.backend.new_sampler = broken
        with pytest.raises(ollama.ResponseError, match="stopped unexpectedly"):
            client.generate(model="fake:1b", prompt="hi")
        assert client.generate(model="fake:1b", prompt="hi").done
        assert d.manager.loaded["fake:1b-f16"].engine is not engine
    assert [name for name, _ in loads] == ["fake:1b-f16", "fake:1b-f16"]


# --- lifecycle --------------------------------------------------------------------------------
def test_stop_ends_in_flight_streams_and_removes_the_socket(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 5000, step_delay_s=0.005)) as d:
        client = openai_client(d)
        stream = client.chat.completions.create(model="fake:1b", stream=True, messages=[
            {"role": "user", "content": "x"}])
        next(iter(stream))
        d.daemon.stop()
        with pytest.raises(openai.APIError, match="cancelled"):
            for _ in stream:
                pass
    assert not d.socket.exists()


def test_second_instance_and_stale_files(home, tmp_path):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory()) as d:
        second = Daemon(ServeOptions(socket_path=tmp_path / "x.sock", port=0), fake_factory())
        with pytest.raises(DaemonError, match="already serving"):
            second.start()
        pid = os.getpid()
        assert str(pid) in json.dumps(DaemonClient(socket_path=d.socket).status())
    # A crash leaves a socket file and an unlocked pid file behind: the next start reuses them.
    from localinfer.daemon.instance import pid_file, runtime_dir

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


# --- localinfer's own client ------------------------------------------------------------------
def test_client_streams_engine_events(daemon):
    client = DaemonClient.discover()
    assert client is not None and client.socket_path == daemon.socket
    generation = client.generate("fake:1b", messages=[Message("user", "hi")],
                                 params=SamplingParams(temperature=0))
    events = list(generation)
    assert isinstance(events[-1], Done) and events[-1].text == REPLY
    assert all(isinstance(e, Token) for e in events[:-1])
    assert events[-2].live.n_tokens > 1
    assert generation.info.name == "fake:1b-f16"
    assert events[-1].timings.completion_tokens == events[-1].usage.completion_tokens


def test_client_cancel_and_errors(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 5000, step_delay_s=0.005, n_ctx=512)) as d:
        client = DaemonClient(socket_path=d.socket)
        generation = client.generate("fake:1b", prompt="x")
        for event in generation:
            if isinstance(event, Token) and event.live.n_tokens >= 3:
                generation.cancel()
        assert generation.done.finish_reason == "cancelled"
        with pytest.raises(ModelNotFound):
            client.generate("missing:1b", prompt="x")
        with pytest.raises(ContextOverflow, match="512 tokens"):
            client.generate("fake:1b", prompt="word " * 600)


def test_client_load_reports_progress_and_describes_the_model(home):
    install_fake_models("fake:1b-f16")
    seen = []
    with serve(fake_factory()) as d:
        client = DaemonClient(socket_path=d.socket)
        info = client.load("fake:1b", progress=seen.append)
        assert info.name == "fake:1b-f16" and info.n_ctx == 2048
        assert seen[-1] == 1.0
        assert list(d.manager.loaded) == ["fake:1b-f16"]


def test_client_cancel_ends_with_the_daemons_own_figures(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 5000, step_delay_s=0.005)) as d:
        client = DaemonClient(socket_path=d.socket)
        generation = client.generate("fake:1b", prompt="count with me")
        for event in generation:
            if isinstance(event, Token) and event.live.n_tokens >= 5:
                assert generation.prompt_tokens == 6  # bos + "count", " ", "with", " ", "me"
                generation.cancel()
        done = generation.done
        assert done.finish_reason == "cancelled"
        assert done.usage.prompt_tokens == 6 and done.usage.completion_tokens >= 5
        assert done.timings.decode_tps > 0 and done.timings.ttft_ms > 0
        assert d.manager.loaded["fake:1b-f16"].engine.stats().active == 0


def test_status_describes_the_daemons_hardware(daemon):
    status = DaemonClient(socket_path=daemon.socket).status()
    assert status["hardware"]["cpu"]["logical_cores"] >= 1
    assert "CPU" in status["hardware"]["backends"]


# --- hostile values --------------------------------------------------------------------------
@pytest.mark.parametrize("body, needle", [
    ({"model": "fake:1b", "prompt": "x", "priority": ["interactive"]}, "priority"),
    ({"model": "fake:1b", "prompt": "x", "stop": ["x" * 600]}, "stop strings"),
    ({"model": "fake:1b", "prompt": "x", "top_k": 2**40}, "top_k"),
    ({"model": "fake:1b", "prompt": "x", "repeat_last_n": -5}, "repeat_last_n"),
])
def test_hostile_values_are_400(daemon, body, needle):
    with daemon.uds() as c:
        response = c.post("/v1/completions", json=body)
    assert response.status_code == 400 and needle in response.json()["error"]["message"]


def test_deeply_nested_json_is_400(daemon):
    with daemon.uds() as c:
        response = c.post("/api/chat", content=b"[" * 100_000 + b"]" * 100_000)
    assert response.status_code == 400 and "too deeply" in response.json()["error"]


def test_minus_one_means_random_seed_and_whole_context(daemon):
    client = ollama_client(daemon)
    out = client.generate(model="fake:1b", prompt="hi", options={
        "seed": -1, "repeat_last_n": -1, "repeat_penalty": 1.1, "num_predict": 3})
    assert out.eval_count == 3


def test_absurd_keep_alive_means_forever_and_ps_still_works(daemon):
    client = ollama_client(daemon)
    client.generate(model="fake:1b", prompt="hi", keep_alive="1e400")
    [running] = client.ps().models
    assert running.model == "fake:1b-f16"
    assert str(running.expires_at).startswith("0001-01-01")  # Ollama's "never"
    with daemon.uds() as c:
        assert c.get("/localinfer/status").status_code == 200


def test_a_client_leaving_a_non_streaming_request_is_not_a_server_error(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 5000, step_delay_s=0.005)) as d:
        with d.uds() as c:
            with pytest.raises(httpx.ReadTimeout):
                c.post("/v1/completions", json={"model": "fake:1b", "prompt": "x"},
                       timeout=httpx.Timeout(5, read=0.5))
            engine = d.manager.loaded["fake:1b-f16"].engine
            deadline = time.monotonic() + 10
            while engine.stats().active and time.monotonic() < deadline:
                time.sleep(0.02)
            assert engine.stats().active == 0  # the generation was cancelled
            assert 'status="500"' not in c.get("/metrics").text


def test_cors_preflight_needs_no_api_key(home):
    install_fake_models("fake:1b-f16")
    settings = DaemonSettings(api_key="k", cors_origins=("https://app.example",))
    with serve(fake_factory(), settings=settings) as d, d.tcp() as c:
        pre = c.options("/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "https://app.example"
        assert c.post("/v1/models", headers={"Origin": "https://app.example"}
                      ).status_code == 401


def test_any_host_when_bound_to_every_interface(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(), settings=DaemonSettings(any_host=True)) as d, d.tcp() as c:
        assert c.get("/api/tags", headers={"Host": "192.168.1.20:11480"}).status_code == 200


def test_socket_path_that_is_a_file_is_not_deleted(home, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("precious")
    daemon = Daemon(ServeOptions(socket_path=notes, tcp=False), fake_factory())
    with pytest.raises(DaemonError, match="not a socket"):
        daemon.start()
    assert notes.read_text() == "precious"


def test_the_client_rebuilds_the_daemons_error_class(home):
    from localinfer.errors import ModelLoadError

    install_fake_models("fake:1b-f16")

    def broken(model, num_ctx, progress=None):
        raise ModelLoadError("llama.cpp could not load it (out of memory?)")

    with serve(broken) as d:
        client = DaemonClient(socket_path=d.socket)
        with pytest.raises(ModelLoadError, match="out of memory"):
            client.generate("fake:1b", prompt="x")
