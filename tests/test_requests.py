"""Bad and hostile request bodies on every API: always a 4xx JSON error in the API's own shape,
never a 500; and the odd values clients really send (-1 seeds, absurd keep-alives)."""

from __future__ import annotations

import pytest

from daemon_util import ollama_client

pytest_plugins = ["daemon_fixtures"]  # daemon


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
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
     404, "`localinfer add FILE.gguf` installs"),
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


def test_a_path_with_an_empty_segment_says_what_to_check(daemon):
    """A base URL ending in a slash gives //v1/...: the 404 points at it."""
    with daemon.uds() as c:
        response = c.get(str(c.base_url).rstrip("/") + "//v1/models")
    assert response.status_code == 404, response.text
    assert "base URL end with a slash" in response.json()["error"]["message"]


def test_wrong_method_is_a_json_error(daemon):
    with daemon.uds() as c:
        response = c.get("/v1/chat/completions")
    assert response.status_code == 405 and "error" in response.json()


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
    # Ollama's for ever: ~292 years on (its `ps` says "Forever" past 20 years; the zero
    # time it says "Never" for, which read as expired to clients).
    assert running.expires_at.year > 2200
    with daemon.uds() as c:
        assert c.get("/localinfer/status").status_code == 200


def test_a_requests_keep_alive_does_not_stay_for_the_next(daemon):
    """As Ollama: a request without keep_alive gets the daemon's (5 minutes here), not the
    10 s or the -1 the request before it gave."""
    import time as clock

    client = ollama_client(daemon)
    for given in ("10s", -1):
        client.generate(model="fake:1b", prompt="hi", keep_alive=given)
        client.generate(model="fake:1b", prompt="hi")
        [running] = client.ps().models
        left = running.expires_at.timestamp() - clock.time()
        assert 250 < left < 310, (given, left)
