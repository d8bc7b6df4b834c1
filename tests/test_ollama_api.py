"""The Ollama-compatible routes (/api), driven by the official ollama client library over the
Unix socket and TCP, with the scripted fake backend."""

from __future__ import annotations

import ollama
import pytest

from daemon_util import (
    REPLY,
    STARTER,
    fake_factory,
    install_fake_models,
    ollama_client,
    serve,
)

pytest_plugins = ["daemon_fixtures"]  # daemon


@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_ollama_chat_and_generate(daemon, tcp):
    client = ollama_client(daemon, tcp)
    parts = list(client.chat(model="fake:1b", messages=[{"role": "user", "content": "hi"}],
                             stream=True))
    assert "".join(p.message.content for p in parts) == REPLY
    last = parts[-1]
    assert last.done and last.done_reason == "stop"
    assert last.eval_count > 5 and last.eval_duration > 0 and last.prompt_eval_count > 0
    # The parts add up to no more than the whole (the first token was counted twice).
    assert last.total_duration >= last.load_duration + last.prompt_eval_duration + \
        last.eval_duration
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
    assert names == {"fake:1b-f16", "other:2b-f16", STARTER}  # the starter: before first use
    client.generate(model="fake:1b", prompt="hi")
    running = client.ps().models
    assert [m.model for m in running] == ["fake:1b-f16"] and running[0].size_vram == 0
    show = client.show("fake:1b")
    assert show.details.format == "gguf"
    # A model the catalog does not size lists with its header's count, as /api/show gives it.
    listed = {m.model: m for m in client.list().models}["fake:1b-f16"]
    assert listed.details.parameter_size == show.details.parameter_size
    assert listed.details.parameter_size.endswith("K")  # ggufgen's tiny model


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
