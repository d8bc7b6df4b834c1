"""The daemon on the real starter model: in-process with the real clients, and as a separate
`localinfer serve` process that is signalled, restarted, and used by the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from daemon_util import serve
from localinfer.config import Config
from localinfer.loading import engine_factory

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def real_daemon(starter_path):
    with serve(engine_factory(Config(ctx=2048), n_slots=2)) as d:
        yield d


def test_openai_and_ollama_clients_on_the_real_model(real_daemon):
    client = openai.OpenAI(base_url=real_daemon.url + "/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(model="gemma3:270m", temperature=0, max_tokens=16,
                                          messages=[{"role": "user", "content": "Hello"}])
    assert chat.usage.completion_tokens == 16 and chat.choices[0].message.content
    # Without drafts: whether a step verifies one is the engine's measured choice, and a step
    # of several rows can round apart at a near tie (docs/engine.md: where outputs can differ).
    plain = {"speculative": False}
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="gemma3:270m", prompt="The capital of France is", temperature=0,
        max_tokens=12, stream=True, extra_body=plain))
    again = client.completions.create(model="gemma3:270m", prompt="The capital of France is",
                                      temperature=0, max_tokens=12, extra_body=plain)
    assert text == again.choices[0].text and len(text.split()) >= 3
    olla = ollama.Client(host=real_daemon.url)
    out = olla.generate(model="gemma3:270m", prompt="The capital of France is", raw=True,
                        options={"num_predict": 12, "temperature": 0, **plain})
    assert out.response == text
    assert out.eval_count == 12 and out.eval_duration > 0
    [running] = olla.ps().models
    assert running.model == "gemma3:270m-q4_k_m" and running.size_vram == 0
    show = olla.show("gemma3:270m")
    assert show.modelinfo["general.architecture"] == "gemma3"
    assert "<start_of_turn>" in show.template


def test_prompt_longer_than_the_model_can_have_is_400(real_daemon):
    # Loaded with 2048 (Config(ctx=2048)); a longer prompt would reload it with more, up to
    # the trained 32768; one past that is refused with the figures, without a reload.
    with real_daemon.uds() as c:
        r = c.post("/v1/completions", json={"model": "gemma3:270m", "prompt": "word " * 33000})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "can have here is 32768 tokens" in message, message
    assert real_daemon.manager.loaded["gemma3:270m-q4_k_m"].engine.info.n_ctx == 2048


def _serve_process(home: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    sock = Path(tempfile.mkdtemp(prefix="li-", dir="/tmp")) / "s.sock"
    env = {**os.environ, "LOCALINFER_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", "serve", "--socket", str(sock),
                             "--port", "0", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "listening on unix:" in line, line + proc.stderr.read()
    return proc, sock


def _cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOCALINFER_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "localinfer", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def served_home(tmp_path, starter_path):
    """A home whose store holds the starter model (linked: no copy)."""
    home = tmp_path / "home"
    models = home / "data" / "models" / "gemma3"
    models.mkdir(parents=True)
    (models / "270m-q4_k_m.gguf").symlink_to(starter_path)
    manifest = json.loads((starter_path.with_suffix(".json")).read_text())
    manifest["path"] = str(models / "270m-q4_k_m.gguf")
    (models / "270m-q4_k_m.json").write_text(json.dumps(manifest))
    return home


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_streams_and_cleans_up(served_home, sig):
    proc, sock = _serve_process(served_home)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=60,
                          base_url="http://localhost") as c:
            with c.stream("POST", "/api/generate", json={
                    "model": "gemma3:270m", "prompt": "Count to a thousand:",
                    "options": {"num_predict": 2000}}) as r:
                lines = r.iter_lines()
                assert json.loads(next(lines))["done"] is False
                proc.send_signal(sig)
                rest = [json.loads(line) for line in lines if line]
        assert "shutting down" in rest[-1]["error"]  # the stream was ended, not cut off
        assert proc.wait(30) == 0
        assert "stopped" in proc.stdout.read()
        assert not sock.exists()
        assert not (served_home / "run" / "localinfer.pid").exists()
    finally:
        proc.kill()


def test_cli_talks_to_the_daemon(served_home):
    proc, sock = _serve_process(served_home)
    try:
        again = _cli(served_home, "serve", "--socket", str(sock.parent / "other.sock"))
        assert again.returncode == 8 and "already" in again.stderr
        run = _cli(served_home, "run", "gemma3:270m", "The capital of France is", "-n", "8",
                   "-t", "0")
        assert run.returncode == 0, run.stderr
        assert "Loading" not in run.stderr  # it went through the daemon, which loaded it
        assert "decode" in run.stderr.splitlines()[-1]
        ps = _cli(served_home, "ps")
        assert "gemma3:270m-q4_k_m" in ps.stdout and "100% CPU" in ps.stdout
        stop_model = _cli(served_home, "stop", "gemma3:270m")
        assert "unloaded gemma3:270m-q4_k_m" in stop_model.stdout
        assert "No model loaded" in _cli(served_home, "ps").stdout
        stop = _cli(served_home, "stop")
        assert stop.returncode == 0 and "stopped the daemon" in stop.stdout
        assert proc.wait(30) == 0
        missing = _cli(served_home, "ps")  # no daemon: a no-op that says so, as in scripts
        assert missing.returncode == 0 and "no daemon is running" in missing.stdout
    finally:
        proc.kill()


def test_stale_socket_and_pid_file_after_a_crash(served_home):
    proc, sock = _serve_process(served_home)
    proc.kill()  # no cleanup: the socket and the pid file stay behind
    proc.wait()
    assert sock.exists()
    proc2, sock2 = _serve_process(served_home)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock2)),
                          base_url="http://localhost") as c:
            assert c.get("/health").json()["status"] == "ok"
    finally:
        proc2.terminate()
        assert proc2.wait(30) == 0


def test_idle_exit(served_home):
    proc, sock = _serve_process(served_home, "--idle-exit", "1")
    assert proc.wait(30) == 0
    assert not sock.exists()
