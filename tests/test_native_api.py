"""localinfer's own routes: /health, /metrics and /localinfer/status."""

from __future__ import annotations

import threading
import time

from daemon_util import fake_factory, install_fake_models, serve
from localinfer.client import DaemonClient

pytest_plugins = ["daemon_fixtures"]  # daemon


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


def test_health_is_200_while_a_second_model_loads():
    """A daemon serving its chat model while it loads another is up (a supervisor took it
    for down); the load is in the body, where the CLI's progress reads it."""
    from localinfer.protocol import health_json, load_fraction_from

    body, status = health_json(version="x", loading="code:7b", load_fraction=0.25,
                               loaded=["chat:8b"])
    assert status == 200 and body["status"] == "ok" and body["loading"] == "code:7b"
    assert load_fraction_from(body) == 0.25
    body, status = health_json(version="x", loading=None, load_fraction=0.0,
                               loaded=["chat:8b"])
    assert status == 200 and "loading" not in body and load_fraction_from(body) is None


def test_status_describes_the_daemons_hardware(daemon):
    status = DaemonClient(socket_path=daemon.socket).status()
    assert status["hardware"]["cpu"]["logical_cores"] >= 1
    assert "CPU" in status["hardware"]["backends"]
