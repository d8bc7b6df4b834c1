"""The daemon's /api/pull and /api/delete, driven by the real ollama client library, with
the local Hub (tests/hub_server.py) behind HF_ENDPOINT."""

from __future__ import annotations

import json
import os
import time

import httpx
import ollama
import pytest

from daemon_util import STARTER, fake_factory, install_fake_models, serve
from hub_server import STARTER_BYTES, STARTER_SHA256
from localinfer.daemon.bridge import PullJob
from localinfer.store import ModelStore

pytest_plugins = ["hub_fixtures"]  # local_hub, hub_catalog, hub_home
NAME = "tinygemma:270m-q4_k_m"


@pytest.fixture
def daemon(hub_home, local_hub):
    with serve(fake_factory(reply="hi")) as d:
        yield d


def client(d) -> ollama.Client:
    return ollama.Client(host="http://localhost", transport=httpx.HTTPTransport(uds=str(d.socket)))


def test_pull_streams_ollama_progress(daemon, local_hub):
    steps = list(client(daemon).pull("tinygemma:270m", stream=True))
    statuses = [s.status for s in steps]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    layer = [s for s in steps if s.status == f"pulling {STARTER_SHA256[:12]}"]
    assert layer and all(s.digest == f"sha256:{STARTER_SHA256}" for s in layer)
    assert all(s.total == STARTER_BYTES for s in layer)
    assert [s.completed for s in layer] == sorted(s.completed for s in layer)
    assert layer[-1].completed == STARTER_BYTES
    tags = {m.model: m for m in client(daemon).list().models}
    assert sorted(tags) == sorted([NAME, STARTER]) and tags[NAME].digest == STARTER_SHA256
    # Pulled again without streaming: one object, and nothing downloaded.
    local_hub.reset_log()
    assert client(daemon).pull(NAME, stream=False).status == "success"
    assert local_hub.body_bytes() == 0


def test_pull_errors_in_ollama_shape(daemon):
    with pytest.raises(ollama.ResponseError) as info:
        client(daemon).pull("nope:1b")
    assert info.value.status_code == 404 and "the catalog has no model 'nope:1b'" in \
        info.value.error
    # Not streamed: the error comes with its status.
    with pytest.raises(ollama.ResponseError) as info:
        client(daemon).pull("tinygemma:gated-q4_k_m", stream=False)
    assert info.value.status_code == 403 and "is a gated repo" in info.value.error
    # Streamed: the headers are sent, the error is a line of the stream.
    with pytest.raises(ollama.ResponseError, match="is a gated repo"):
        list(client(daemon).pull("tinygemma:gated-q4_k_m", stream=True))
    with daemon.uds() as http:
        response = http.post("/api/pull", json={})
    assert response.status_code == 400 and response.json() == {"error": "'model' is required."}


def test_delete_removes_the_model(daemon):
    client(daemon).pull(NAME)
    path = ModelStore().find_installed(NAME).path
    assert client(daemon).delete(NAME).status == "success"
    assert [m.model for m in client(daemon).list().models] == [STARTER]  # always offered
    with pytest.raises(ollama.ResponseError) as info:
        client(daemon).delete(NAME)
    assert info.value.status_code == 404
    assert not os.path.exists(path)


def test_delete_unloads_a_loaded_model_first(daemon):
    install_fake_models("fake:1b-f16")
    client(daemon).generate(model="fake:1b", prompt="hello")
    assert "fake:1b-f16" in daemon.manager.loaded
    assert client(daemon).delete("fake:1b-f16").status == "success"
    assert "fake:1b-f16" not in daemon.manager.loaded
    assert [m.name for m in ModelStore().installed()] == []


def test_delete_refused_for_a_presets_model_leaves_it_loaded(daemon):
    """A model a preset is over was unloaded, then the delete refused; the family's name
    (which every other route takes) was "not installed"; Ollama's ":latest" tag was unknown
    everywhere."""
    install_fake_models("fake:1b-f16")
    with daemon.uds() as http:
        made = http.post("/api/create", json={"model": "mine", "from": "fake:1b",
                                              "system": "Be brief.", "stream": False})
        assert made.status_code == 200, made.text
    client(daemon).generate(model="fake:1b", prompt="hello")
    with pytest.raises(ollama.ResponseError, match="presets mine are over"):
        client(daemon).delete("fake")
    assert "fake:1b-f16" in daemon.manager.loaded
    assert client(daemon).show("mine:latest").modelfile
    assert client(daemon).chat(model="mine:latest",
                               messages=[{"role": "user", "content": "hi"}]).message.content
    assert client(daemon).delete("mine").status == "success"
    assert client(daemon).delete("fake").status == "success"
    assert [m.name for m in ModelStore().installed()] == []


def test_a_client_that_leaves_cancels_the_pull(daemon, local_hub):
    local_hub.faults.pause_at = 60_000_000  # holds the download until the client has left
    store = ModelStore()
    with daemon.uds() as http:
        with http.stream("POST", "/api/pull", json={"model": NAME}) as response:
            for line in response.iter_lines():
                if json.loads(line).get("completed", 0) >= 50_000_000:
                    # Taken while it runs: once cancelled, it may leave the list at once.
                    [job] = PullJob.running
                    break  # leaving the loop closes the connection
    deadline = time.monotonic() + 60
    while not job.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert job.cancelled, "the daemon did not notice the client leaving"
    local_hub.release()  # the next chunk arrives, and the pull stops there
    while PullJob.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not PullJob.running, "the pull did not stop"
    [partial] = store.partials()
    assert 50_000_000 <= partial.size_bytes < STARTER_BYTES and store.installed() == []
    assert not (store.root / "tinygemma" / "270m-q4_k_m.gguf.partial.lock").exists()
    # The next pull picks up from there.
    local_hub.reset_log()
    assert client(daemon).pull(NAME, stream=False).status == "success"
    assert local_hub.body_bytes() == STARTER_BYTES - partial.size_bytes


def test_management_routes_name_a_field_they_do_not_take(daemon):
    """/api/delete removed the model though its body had a mistyped field; /api/show and
    /api/pull dropped unknown fields in silence."""
    install_fake_models("fake:1b-f16")
    with daemon.uds() as http:
        for method, path in (("DELETE", "/api/delete"), ("POST", "/api/show"),
                             ("POST", "/api/pull")):
            r = http.request(method, path, json={"model": "fake:1b-f16", "forse": True})
            assert r.status_code == 400 and "'forse' is not a field" in r.json()["error"]
    assert [m.name for m in ModelStore().installed()] == ["fake:1b-f16"]
