"""The session interface front ends share: chat and plain completion through an in-process
engine or the daemon, the launcher's one choice between them, and the loaded model's speed
reference (roofline and prediction with the configured KV cache type)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from daemon_util import fake_factory, install_fake_models, serve
from localinfer.catalog import load_catalog
from localinfer.config import Config
from localinfer.errors import DaemonError
from localinfer.hardware import load_profile
from localinfer.planner import Candidate, roofline_for
from localinfer.protocol import ModelInfo
from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend
from localinfer.runtime.types import Done, Message, Priority, SamplingParams, Token
from localinfer.session import (
    DaemonSession,
    EngineSession,
    Launcher,
    decode_reference,
    model_rows,
)
from localinfer.store import ModelStore

PROFILES = Path(__file__).parent / "profiles"
GREEDY = SamplingParams(temperature=0, max_tokens=64)


def finished(generation) -> tuple[str, Done]:
    events = list(generation)
    assert isinstance(events[-1], Done)
    assert all(isinstance(e, Token) for e in events[:-1])
    return "".join(e.text for e in events[:-1]), events[-1]


class FakeOpener:
    def __init__(self) -> None:
        self.opened: list[str] = []
        self.engines: list[Engine] = []

    def __call__(self, ref, config, *, on_copy=None, on_load=None) -> Engine:
        self.opened.append(ref)
        on_load(0.5)
        engine = Engine(FakeBackend("One two three.", name=ref))
        self.engines.append(engine)
        return engine


def test_the_session_module_loads_no_front_end_library_nor_llama_cpp():
    code = ("import json, sys, localinfer.session\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    loaded = set(json.loads(out))
    assert not loaded & {"textual", "fastapi", "starlette", "uvicorn", "llama_cpp"}


def test_an_engine_session_chats_and_completes(fake_engine):
    session = EngineSession(fake_engine(reply="Plain words here."), priority=Priority.NORMAL)
    assert session.in_process and session.where == "in this process"
    text, done = finished(session.complete("Once upon a time", GREEDY))
    assert text == "Plain words here." and done.usage.prompt_tokens > 0
    text, _ = finished(session.chat([Message("user", "Hi")], GREEDY))
    assert text == "Plain words here."
    assert session.count_tokens([Message("user", "Hi")]) > 0


def test_without_a_daemon_run_s_launcher_opens_the_model_in_this_process(home, monkeypatch):
    monkeypatch.delenv("LOCALINFER_HOST", raising=False)
    opener = FakeOpener()
    launcher = Launcher(Config(), open_engine=opener, if_no_daemon="in_process",
                        priority=Priority.NORMAL)
    steps = []
    session = launcher.open("fake:1b", steps.append)
    try:
        assert isinstance(session, EngineSession) and launcher.in_process
        assert opener.opened == ["fake:1b"]
        assert [(s.stage, s.fraction) for s in steps] == [("load", 0.0), ("load", 0.5),
                                                          ("loaded", 1.0)]
        text, done = finished(session.complete("Count:", GREEDY))
        assert text == "One two three." and done.finish_reason == "stop"
    finally:
        session.close()
        launcher.close()


def test_without_a_daemon_a_launcher_that_may_not_start_one_says_so(home, monkeypatch):
    monkeypatch.delenv("LOCALINFER_HOST", raising=False)
    launcher = Launcher(Config(), if_no_daemon="fail")
    with pytest.raises(DaemonError, match="no localinfer daemon is running"):
        launcher.open("fake:1b", lambda step: None)
    with pytest.raises(ValueError):
        Launcher(Config(), if_no_daemon="maybe")


def test_a_daemon_that_cannot_start_in_this_home_is_a_daemon_error(home, monkeypatch):
    # A read-only home (here: a file where the cache folder goes) fails to start a daemon as
    # a daemon error, which the chat answers with "Run in this process" (it was an OSError:
    # an internal error).
    monkeypatch.delenv("LOCALINFER_HOST", raising=False)
    from localinfer.paths import get_paths

    cache = get_paths().cache_dir
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("not a folder")
    launcher = Launcher(Config())
    with pytest.raises(DaemonError, match="cannot start the daemon.*--no-daemon"):
        launcher.open("fake:1b", lambda step: None)


def test_a_daemon_session_chats_and_completes_and_follows_the_model_info(home, monkeypatch):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="From the daemon."), tcp=False) as daemon:
        monkeypatch.setenv("LOCALINFER_HOST", f"unix:{daemon.socket}")
        opener = FakeOpener()
        launcher = Launcher(Config(), open_engine=opener, if_no_daemon="in_process",
                            priority=Priority.NORMAL)
        steps = []
        session = launcher.open("fake:1b-f16", steps.append)
        try:
            assert isinstance(session, DaemonSession) and not session.in_process
            assert not launcher.in_process and opener.opened == []
            assert session.model == session.info.name == "fake:1b-f16"
            assert {s.stage for s in steps} == {"load"}
            generation = session.complete("Say something", GREEDY)
            text, done = finished(generation)
            assert text == "From the daemon." and done.usage.prompt_tokens > 0
            assert generation.prompt_tokens == done.usage.prompt_tokens
            text, _ = finished(session.chat([Message("user", "Hi")], GREEDY))
            assert text == "From the daemon."
        finally:
            launcher.close()


def test_a_daemon_at_localinfer_host_resolves_the_name_in_its_own_store(home, monkeypatch,
                                                                       tmp_path):
    """Through LOCALINFER_HOST (another home, another machine) the name was resolved in this
    home's store: a model the daemon had was "not installed" here, and the starter was
    copied here first."""
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="From afar."), tcp=False) as daemon:
        monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path / "elsewhere"))  # an empty store
        monkeypatch.setenv("LOCALINFER_HOST", f"unix:{daemon.socket}")
        launcher = Launcher(Config(), if_no_daemon="fail", priority=Priority.NORMAL)
        try:
            session = launcher.open("fake:1b", lambda step: None)
            assert isinstance(session, DaemonSession)
            assert finished(session.complete("Hi", GREEDY))[0] == "From afar."
            assert not (tmp_path / "elsewhere" / "data" / "models").exists()
        finally:
            launcher.close()


def test_the_speed_reference_uses_the_loaded_kv_cache_type():
    hardware = load_profile(PROFILES / "laptop-8gb-cpu.json")
    spec, variant = load_catalog().lookup("llama3.2:1b-q8_0")
    candidate = Candidate.from_spec(spec, variant)
    info = ModelInfo(name=candidate.name, path="/nonexistent.gguf", architecture="llama",
                     quant="Q8_0", size_bytes=candidate.file_bytes, n_params=candidate.params,
                     n_layers=candidate.n_layers, n_gpu_layers=0, n_ctx_train=131072,
                     n_ctx=8192, n_slots=1, n_vocab=candidate.n_vocab)
    info_q8 = dataclasses.replace(info, kv_type="q8_0")
    f16 = decode_reference(info, hardware, candidate, Config(), {})
    q8 = decode_reference(info_q8, hardware, candidate, Config(), {})
    assert f16.roofline == roofline_for(info, hardware, candidate, "f16")
    assert q8.roofline == roofline_for(info, hardware, candidate, "q8_0")
    assert q8.roofline.ceiling_tps(8000) > f16.roofline.ceiling_tps(8000)
    assert q8.predicted_tps(8000) > f16.predicted_tps(8000)
    calibrated = decode_reference(info_q8, hardware, candidate, Config(), {"CPU": 0.5})
    assert calibrated.predicted_tps(8000) == pytest.approx(q8.predicted_tps(8000) * 0.5)


def test_model_rows_list_installed_models_first_then_the_catalog(home):
    install_fake_models("fake:1b-f16")
    rows = model_rows(ModelStore(), load_profile(PROFILES / "laptop-8gb-cpu.json"), Config())
    assert rows[0].name == "fake:1b-f16" and rows[0].installed and rows[0].fits
    assert all(not r.installed for r in rows[1:]) and len(rows) > 5


def test_a_daemon_generation_keeps_the_models_chat_template():
    """A stream's start event carries the model's info without its template; taking it as it
    came made the chat UI think a thinking model (qwen3) did not think after its first reply
    through the daemon, and refuse /think and F8."""
    from types import SimpleNamespace

    from localinfer.session import _InfoTracking
    from test_protocol import INFO

    loaded = dataclasses.replace(INFO, chat_template="{{ '<think>' }}")
    streamed = dataclasses.replace(loaded, chat_template=None, n_ctx=8192)

    class Events:
        info = streamed

        def __iter__(self):
            yield "token"

    session = SimpleNamespace(info=loaded)
    assert list(_InfoTracking(Events(), session)) == ["token"]  # type: ignore[arg-type]
    assert session.info.n_ctx == 8192 and session.info.chat_template == "{{ '<think>' }}"
