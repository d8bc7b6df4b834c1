"""Hub names (hf.co/user/repo[:quant]) against the local Hub: the repo listed with the real
huggingface_hub code (HfApi.model_info with files_metadata), the quant chosen, every file
verified against the SHA-256 the Hub lists, split models pulled as one; `plan` reading only
headers; the errors; the daemon's /api/pull and model fields; `run` pulling on first use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from daemon_util import fake_factory, openai_client, serve
from hub_server import (
    FILE,
    FILE_TYPES,
    GATED_REPO,
    NO_GGUF_REPO,
    QUANTS_REPO,
    REPO,
    SPLIT_REPO,
    STARTER_SHA256,
    TOKEN,
    sha256_of,
)
from localinfer import gguf
from localinfer.config import Config
from localinfer.errors import (
    AccessDenied,
    Cancelled,
    InvalidRequest,
    ModelNotFound,
    OfflineError,
)
from localinfer.hardware import load_profile
from localinfer.planner import PlanPrefs
from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend
from localinfer.selection import pull_target
from localinfer.session import Launcher
from localinfer.store import ModelStore, pull_model

pytest_plugins = ["hub_fixtures"]  # local_hub, hub_catalog, hub_home, split_repo
PROFILES = Path(__file__).parent / "profiles"
QUANTS = "hf.co/localinfer-test/tiny-quants-gguf"


def no_leftovers(store: ModelStore) -> bool:
    """No partial file or meta, and no empty folder (a failed first pull left one)."""
    return not [p for p in store.root.rglob("*") if ".partial" in p.name
                or p.is_dir() and not any(p.iterdir())]


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localinfer", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


# --- pulling ---------------------------------------------------------------------------------
def test_a_hub_name_pulls_q4_k_m_by_default_verified(hub_home, local_hub, tiny_quant_files):
    store = ModelStore()
    target = pull_target(store, "hf.co/localinfer-test/tiny-quants-GGUF")
    assert target.name == f"{QUANTS}:q4_k_m" and target.repo == QUANTS_REPO
    assert not target.reason  # Q4_K_M is there: no planning needed
    steps = []
    model = pull_model(store, target, progress=steps.append)
    assert model.name == f"{QUANTS}:q4_k_m" and model.model == QUANTS
    assert model.quant == "Q4_K_M" and model.parts == 1
    expected = sha256_of(str(tiny_quant_files["tiny-Q4_K_M.gguf"]),
                         tiny_quant_files["tiny-Q4_K_M.gguf"].stat().st_mtime_ns)
    assert model.sha256 == expected
    assert model.source == f"hf:{QUANTS_REPO}/tiny-Q4_K_M.gguf"
    assert Path(model.path) == store.root / "hf.co--localinfer-test--tiny-quants-gguf" / \
        "q4_k_m.gguf"
    assert "verified against the Hub's SHA-256" in steps[-1].message
    # The listing: one model_info request with the files' metadata.
    [info] = [r for r in local_hub.requests("hub") if r.path.startswith("/api/models/")]
    assert info.path == "/api/models/localinfer-test/tiny-quants-GGUF"
    # Any spelling of the name finds it installed; `list` shows the canonical name.
    for ref in (f"{QUANTS}:Q4_K_M", "huggingface.co/localinfer-test/Tiny-Quants-GGUF:q4_k_m",
                "localinfer-test/tiny-quants-gguf:Q4_K_M", QUANTS):
        assert store.resolve(ref).name == model.name
    assert [m.name for m in store.installed()] == [model.name]
    assert no_leftovers(store)
    # A quant by name, in any case; pulling again downloads nothing.
    q8 = pull_model(store, "localinfer-test/tiny-quants-gguf:q8_0")
    assert q8.quant == "Q8_0" and gguf.read_header(q8.path).quant == "Q8_0"
    local_hub.reset_log()
    assert pull_model(store, f"{QUANTS}:Q8_0").path == q8.path
    assert local_hub.body_bytes() == 0
    store.remove(q8.name)
    assert not Path(q8.path).exists()


def test_a_split_quant_is_pulled_as_one_model(hub_home, local_hub):
    store = ModelStore()
    model = pull_model(store, f"{QUANTS}:Q2_K")
    assert model.parts == 2 and model.quant == "Q2_K"
    folder = store.root / "hf.co--localinfer-test--tiny-quants-gguf"
    assert [p.name for p in model.paths] == ["q2_k-00001-of-00002.gguf",
                                             "q2_k-00002-of-00002.gguf"]
    assert all(p.parent == folder and p.is_file() for p in model.paths)
    header = gguf.read_header(model.path)
    assert header.block_count == 4 and gguf.split_count(header) == 2
    assert model.size_bytes == sum(p.stat().st_size for p in model.paths)
    gets = {r.path for r in local_hub.requests("cdn", "GET")}
    assert len(gets) == 2  # both shards came
    assert no_leftovers(store)
    # Offline, its pull says it is installed, by any name (it said the Hub cannot be asked).
    local_hub.reset_log()
    for ref in (f"{QUANTS}:Q2_K", QUANTS):
        result = cli("--offline", "pull", ref)
        assert result.returncode == 0, result.stderr
        assert f"{model.name} is installed (offline: not checked" in result.stdout
        offline = ModelStore(offline=True)
        assert pull_model(offline, pull_target(offline, ref)).path == model.path
        assert pull_model(offline, ref).path == model.path
    assert local_hub.requests("hub") == []
    removed = cli("rm", "--yes", model.name)
    assert removed.returncode == 0, removed.stderr
    assert "deleted its 2 files:" in removed.stdout  # it named the first file only
    assert not any(p.exists() for p in model.paths) and not folder.exists()


def test_a_corrupted_shard_is_refused_and_nothing_is_listed(hub_home, local_hub,
                                                             tiny_quant_files):
    second = tiny_quant_files["Q2_K/tiny-Q2_K-00002-of-00002.gguf"]
    local_hub.faults.corrupt_at = second.stat().st_size - 1  # the last byte of each file
    store = ModelStore()
    with pytest.raises(Exception) as info:
        pull_model(store, f"{QUANTS}:Q2_K")
    assert "SHA-256" in str(info.value) and "the download was removed" in str(info.value)
    assert store.installed() == [] and no_leftovers(store)


def test_a_partial_download_is_removed_by_the_repo_name(hub_home, local_hub):
    """`rm hf.co/user/repo` missed the partial download of its quant (and said it was not
    installed); two of them are named, not guessed between."""
    store = ModelStore()
    for quant in ("Q2_K", "Q4_K_M"):
        cancel = threading.Event()
        with pytest.raises(Cancelled):
            pull_model(store, f"{QUANTS}:{quant}", cancel=cancel,
                       progress=lambda step, c=cancel: c.set() if step.completed else None)
    assert len(store.partials()) == 2
    with pytest.raises(InvalidRequest, match="more than one partial download"):
        store.remove(QUANTS)
    store.remove(f"{QUANTS}:Q2_K")
    [left] = store.partials()
    done = cli("rm", "--yes", QUANTS)
    assert done.returncode == 0, done.stderr
    assert left.name in done.stdout
    assert store.partials() == [] and no_leftovers(store)


def test_without_q4_k_m_the_planner_picks_the_quant(hub_home, local_hub):
    store = ModelStore()
    hardware = load_profile(PROFILES / "laptop-8gb-cpu.json")
    target = pull_target(store, "hf.co/localinfer-test/tiny-noq4-GGUF", hardware=hardware,
                         prefs=PlanPrefs(n_ctx=256))
    assert target.name in ("hf.co/localinfer-test/tiny-noq4-gguf:q8_0",
                           "hf.co/localinfer-test/tiny-noq4-gguf:f16")
    assert target.reason.startswith("no Q4_K_M in hf.co/localinfer-test/tiny-noq4-GGUF;")
    # The choice read the headers only (a few hundred bytes each), no model.
    assert all(r.range for r in local_hub.requests("cdn", "GET"))
    with pytest.raises(InvalidRequest, match="has no Q4_K_M; name a quant"):
        pull_model(store, "hf.co/localinfer-test/tiny-noq4-GGUF")


def test_errors_name_what_went_wrong(hub_home, local_hub, monkeypatch):
    store = ModelStore()
    with pytest.raises(ModelNotFound) as info:
        pull_model(store, "hf.co/localinfer-test/no-such-repo:Q4_K_M")
    assert "has no model repo localinfer-test/no-such-repo" in info.value.message
    assert "set HF_TOKEN" in info.value.message
    with pytest.raises(ModelNotFound) as info:
        pull_model(store, f"hf.co/{NO_GGUF_REPO}")
    assert "has no GGUF file (it has config.json, model.safetensors)" in info.value.message
    with pytest.raises(ModelNotFound) as info:
        pull_model(store, f"{QUANTS}:Q5_K_M")
    assert "has no GGUF file for the quant Q5_K_M; it has Q2_K, Q4_K_M, Q8_0, F16" in \
        info.value.message
    assert "mmproj" not in info.value.message
    with pytest.raises(AccessDenied) as info:
        pull_model(store, f"hf.co/{GATED_REPO}:Q4_K_M")
    assert "gated" in info.value.message and "HF_TOKEN" in info.value.message
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError, match="offline mode is on"):
        pull_model(ModelStore(), f"{QUANTS}:Q4_K_M")
    assert store.installed() == [] and no_leftovers(store)


def test_hostile_names_touch_neither_the_hub_nor_the_disk(hub_home, local_hub):
    store = ModelStore()
    for ref in ("hf.co/../../etc:Q4_K_M", "hf.co/a/b/../../c", "hf.co/a/b:Q4/../../x",
                "hf.co/a/b c:Q4_K_M"):
        with pytest.raises(InvalidRequest):
            pull_target(store, ref)
        result = cli("pull", ref)
        assert result.returncode == 2 and "invalid Hub model name" in result.stderr
    assert local_hub.requests() == [] and not store.root.exists()


# --- plan: headers only ----------------------------------------------------------------------
def test_plan_reads_only_headers_for_each_quant(hub_home, local_hub, tiny_quant_files):
    result = cli("plan", "hf.co/localinfer-test/Tiny-Quants-GGUF", "--hardware",
                 str(PROFILES / "laptop-8gb-cpu.json"), "--ctx", "256")
    assert result.returncode == 0, result.stderr
    for quant in FILE_TYPES:
        assert f"{QUANTS}:{quant.lower()}" in result.stdout
    assert "Choice:" in result.stdout and "Read the GGUF headers of 5 file(s)" in \
        result.stdout  # Q4_K_M, Q8_0, F16 and both shards of Q2_K
    gets = local_hub.requests("cdn", "GET")
    assert gets and all(r.range and r.range.startswith("bytes=0-") for r in gets)
    assert not ModelStore().root.exists()  # nothing downloaded
    as_json = json.loads(cli("plan", f"{QUANTS}:Q8_0", "--json", "--hardware",
                             str(PROFILES / "laptop-8gb-cpu.json")).stdout)
    assert [e["name"] for e in as_json["candidates"]] == [f"{QUANTS}:q8_0"]
    failed = cli("plan", f"{QUANTS}:Q5_K_M")
    assert failed.returncode == 3 and "it has Q2_K, Q4_K_M, Q8_0, F16" in failed.stderr


# --- the daemon ------------------------------------------------------------------------------
def test_the_daemon_pulls_and_serves_a_hub_name(hub_home, local_hub):
    with serve(fake_factory(reply="hi")) as d:
        client = ollama.Client(host="http://localhost",
                               transport=httpx.HTTPTransport(uds=str(d.socket)))
        # Not pulled: the model field is refused, saying how to pull it.
        with pytest.raises(ollama.ResponseError) as info:
            client.chat(model=f"{QUANTS}:Q4_K_M", messages=[{"role": "user", "content": "x"}])
        assert info.value.status_code == 404
        assert f"`localinfer pull {QUANTS}:q4_k_m`" in info.value.error
        steps = list(client.pull(f"{QUANTS}:Q4_K_M", stream=True))
        assert steps[-1].status == "success"
        names = [m.model for m in client.list().models]
        assert f"{QUANTS}:q4_k_m" in names
        reply = client.chat(model="hf.co/localinfer-test/Tiny-Quants-GGUF:Q4_K_M",
                            messages=[{"role": "user", "content": "x"}])
        assert reply.message.content == "hi"
        shown = client.show(f"{QUANTS}:q4_k_m")
        assert shown.details.quantization_level == "Q4_K_M"
        oa = openai_client(d)
        assert f"{QUANTS}:q4_k_m" in [m.id for m in oa.models.list()]
        completion = oa.chat.completions.create(
            model="localinfer-test/tiny-quants-gguf:Q4_K_M",
            messages=[{"role": "user", "content": "x"}])
        assert completion.choices[0].message.content == "hi"
        with pytest.raises(openai.BadRequestError):
            oa.chat.completions.create(model="hf.co/a/../../b:Q4_K_M",
                                       messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.NotFoundError):
            oa.chat.completions.create(model=f"{QUANTS}:Q8_0",  # not pulled
                                       messages=[{"role": "user", "content": "x"}])
        for bad in ("hf.co/../../etc:Q4_K_M", "hf.co/a/b/c"):
            with pytest.raises(ollama.ResponseError) as info:
                client.chat(model=bad, messages=[{"role": "user", "content": "x"}])
            assert info.value.status_code == 400, bad
            with pytest.raises(ollama.ResponseError) as info:
                client.pull(bad, stream=False)
            assert info.value.status_code == 400, bad
        with pytest.raises(ollama.ResponseError) as info:
            client.pull(f"{QUANTS}:Q5_K_M", stream=False)
        assert info.value.status_code == 404 and "it has Q2_K, Q4_K_M" in info.value.error
        client.delete(f"{QUANTS}:q4_k_m")
        assert f"{QUANTS}:q4_k_m" not in [m.model for m in client.list().models]


# --- run: pulled, verified and run ----------------------------------------------------------
@pytest.mark.model
def test_the_daemon_says_where_it_reads_hf_token(hub_home, local_hub):
    """Through the daemon, "set HF_TOKEN" sent users to a shell the running daemon never
    sees; its errors say it reads the environment it was started in."""
    with serve(fake_factory()) as d:
        with d.uds() as c:
            r = c.post("/api/pull", json={"model": f"hf.co/{GATED_REPO}:Q4_K_M",
                                          "stream": False}, timeout=60)
            assert r.status_code in (401, 403), r.text
            message = r.json()["error"]
            assert "set HF_TOKEN" in message and "environment it was started in" in message
            r = c.post("/api/pull", json={"model": f"hf.co/{GATED_REPO}:Q4_K_M"}, timeout=60)
            last = json.loads(r.text.strip().splitlines()[-1])
            assert "environment it was started in" in last["error"]


def test_run_pulls_verifies_and_runs_a_hub_name(hub_home, local_hub):
    name = f"hf.co/{REPO}:Q4_K_M"
    result = cli("run", name, "The capital of France is", "-n", "6", "-t", "0",
                 "--no-daemon")
    assert result.returncode == 0, result.stderr
    assert "verified against the Hub's SHA-256" in result.stderr
    assert result.stdout.strip()
    [model] = ModelStore().installed()
    assert model.name == "hf.co/localinfer-test/tiny-gemma-gguf:q4_k_m"
    assert model.sha256 == STARTER_SHA256 and model.source == f"hf:{REPO}/{FILE}"
    # Run again: installed, nothing downloaded, the same greedy text.
    local_hub.reset_log()
    again = cli("run", name, "The capital of France is", "-n", "6", "-t", "0", "--no-daemon")
    assert again.returncode == 0 and again.stdout == result.stdout
    assert local_hub.requests() == []
    shown = cli("show", name)
    assert shown.returncode == 0 and "hf:localinfer-test/tiny-gemma-GGUF" in shown.stdout


@pytest.mark.model
def test_a_split_model_is_pulled_and_loaded_as_one(hub_home, local_hub, split_repo):
    name = f"hf.co/{SPLIT_REPO}:Q4_K_M"
    result = cli("run", name, "The capital of France is", "-n", "6", "-t", "0",
                 "--no-daemon")
    assert result.returncode == 0, result.stderr
    [model] = ModelStore().installed()
    assert model.parts == 2 and "in 2 files" in result.stderr
    # The catalog's starter has a repeat penalty of its own (sampling_defaults): the same
    # sampling for both, so that only the files differ.
    whole = cli("run", "gemma3:270m", "The capital of France is", "-n", "6", "-t", "0",
                "--repeat-penalty", "1", "--no-daemon")
    assert result.stdout == whole.stdout  # the same weights, loaded from two files


def test_gated_repo_with_token(hub_home, local_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    store = ModelStore()
    model = pull_model(store, f"hf.co/{GATED_REPO}:Q4_K_M")
    assert model.sha256 == STARTER_SHA256


def test_a_split_download_that_stopped_resumes_as_one(hub_home, local_hub,
                                                      tiny_quant_files):
    second = tiny_quant_files["Q2_K/tiny-Q2_K-00002-of-00002.gguf"]
    sha = sha256_of(str(second), second.stat().st_mtime_ns)
    local_hub.faults.down_for.add(sha)  # the first shard comes, the second does not
    store = ModelStore()
    with pytest.raises(Exception, match="is kept: run `localinfer pull"):
        pull_model(store, f"{QUANTS}:Q2_K")
    [partial] = store.partials()  # the shards are one download
    assert partial.name == f"{QUANTS}:q2_k" and store.installed() == []
    shards = [tiny_quant_files[f"Q2_K/tiny-Q2_K-0000{i}-of-00002.gguf"] for i in (1, 2)]
    assert partial.size_bytes == shards[0].stat().st_size
    assert partial.total_bytes == sum(p.stat().st_size for p in shards)
    local_hub.faults.down_for.clear()
    local_hub.reset_log()
    model = pull_model(store, f"{QUANTS}:q2_k")
    assert model.parts == 2 and store.partials() == [] and no_leftovers(store)
    # Only the second shard was downloaded again.
    assert [r.path.rsplit("/", 1)[-1] for r in local_hub.requests("cdn", "GET")] == [sha]


# --- chat: the launcher the chat UI opens models with ----------------------------------------
def test_the_chat_launcher_pulls_a_hub_name_on_first_use(hub_home, local_hub, monkeypatch):
    monkeypatch.delenv("LOCALINFER_HOST", raising=False)
    opened = []

    def opener(ref, config, *, on_copy=None, on_load=None):
        opened.append(ref)
        return Engine(FakeBackend("hi", name=ref))

    launcher = Launcher(Config(), open_engine=opener, if_no_daemon="in_process")
    steps = []
    session = launcher.open(f"hf.co/{QUANTS_REPO}:Q8_0", steps.append)
    try:
        assert opened == [f"{QUANTS}:q8_0"]  # the installed model, by its canonical name
        pulls = [s for s in steps if s.stage == "pull"]
        assert any(s.total_bytes and s.fraction == 1.0 for s in pulls)  # the bytes, for a bar
        assert "verified against the Hub's SHA-256" in pulls[-1].message
    finally:
        session.close()
        launcher.close()
    offline = Launcher(Config(offline=True), open_engine=opener, if_no_daemon="in_process")
    with pytest.raises(OfflineError, match="is not installed and offline mode is on"):
        offline.open(f"hf.co/{QUANTS_REPO}:F16", steps.append)


def test_a_hub_that_never_answers_is_a_clear_timeout(home, monkeypatch):
    """A Hub (or proxy) that takes the connection and never answers: the repo's listing
    waited for ever (`pull hf.co/...` and `plan hf.co/...` hung); it is a DownloadError
    after the metadata timeout, as a catalog pull's is."""
    import socket as socket_mod
    import time

    from huggingface_hub import constants

    from localinfer.errors import DownloadError
    from localinfer.store.hub_repo import list_repo

    silent = socket_mod.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 1)
    started = time.monotonic()
    try:
        with pytest.raises(DownloadError, match="did not answer in time"):
            list_repo("someone/some-GGUF")
    finally:
        silent.close()
    assert time.monotonic() - started < 30
