"""The guard in front of every route: Host and Origin checks, CORS, the API key over TCP, and
the body-size limit."""

from __future__ import annotations

import openai

from daemon_util import fake_factory, install_fake_models, serve
from localinfer.daemon.state import DaemonSettings

pytest_plugins = ["daemon_fixtures"]  # daemon


def test_oversized_body_is_413(daemon):
    with daemon.uds() as c:
        response = c.post("/v1/chat/completions", content=b"x" * (9 * 1024 * 1024))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


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
        # A page served from this machine or an editor's webview is answered with CORS
        # headers, as Ollama answers them: the guard lets it through, so a browser may read it.
        ok = c.get("/api/tags", headers={"Origin": "http://localhost:5173"})
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "http://localhost:5173"
        for origin in ("http://localhost:5173", "vscode-webview://abc"):
            pre = c.options("/api/chat", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type"})
            assert pre.status_code == 200, pre.text
            assert pre.headers["access-control-allow-origin"] == origin
        refused = c.options("/api/chat", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert refused.status_code == 403


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


def test_cors_preflight_needs_no_api_key(home):
    install_fake_models("fake:1b-f16")
    settings = DaemonSettings(api_key="k", cors_origins=("https://app.example",))
    with serve(fake_factory(), settings=settings) as d, d.tcp() as c:
        pre = c.options("/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "https://app.example"
        refused = c.post("/v1/models", headers={"Origin": "https://app.example"})
        # The page can read why (CORS headers on the guard's own refusal too).
        assert refused.status_code == 401
        assert refused.headers["access-control-allow-origin"] == "https://app.example"


def test_any_host_when_bound_to_every_interface(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(), settings=DaemonSettings(any_host=True)) as d, d.tcp() as c:
        assert c.get("/api/tags", headers={"Host": "192.168.1.20:11480"}).status_code == 200
