"""The store against a local Hub: pull (resume, verification, errors, disk space, offline),
plan by header, remove and add. The real huggingface_hub code talks to tests/hub_server.py
through HF_ENDPOINT; the file it serves is the real starter GGUF (253 MB)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from hub_server import FILE, GATED_REPO, REPO, STARTER_BYTES, STARTER_SHA256, TOKEN
from localinfer import gguf
from localinfer.catalog import load_catalog
from localinfer.errors import (
    AccessDenied,
    Cancelled,
    DownloadError,
    InvalidModelFile,
    InvalidRequest,
    ModelNotFound,
    OfflineError,
    StoreError,
)
from localinfer.hardware import load_profile
from localinfer.planner import Candidate, PlanPrefs
from localinfer.selection import catalog_candidates, pull_target
from localinfer.store import SPACE_MARGIN, HeaderFetch, ModelStore, PullProgress, pull_model

pytest_plugins = ["hub_fixtures"]  # local_hub, hub_catalog, hub_home
NAME = "tinygemma:270m-q4_k_m"
PROFILES = Path(__file__).parent / "profiles"


def no_leftovers(store: ModelStore) -> bool:
    """Nothing half-done in the store: no partial file, meta or lock, and no empty folder."""
    return not [p for p in store.root.rglob("*") if ".partial" in p.name or
                p.name.endswith(".lock") or p.is_dir() and not any(p.iterdir())]


# --- pull ------------------------------------------------------------------------------------
def test_pull_downloads_verifies_and_lists(hub_home, local_hub):
    store = ModelStore()
    steps = []
    model = pull_model(store, NAME, progress=steps.append)
    assert model.name == NAME and model.model == "tinygemma:270m" and model.quant == "Q4_K_M"
    assert model.sha256 == STARTER_SHA256 and model.size_bytes == STARTER_BYTES
    assert model.source == f"hf:{REPO}/{FILE}" and model.revision
    assert Path(model.path).is_relative_to(hub_home)
    assert [m.name for m in store.installed()] == [NAME]
    assert gguf.read_header(model.path).architecture == "gemma3"
    assert no_leftovers(store)

    statuses = [s.status for s in steps]
    order = ["resolving", "downloading", "verifying", "writing", "success"]
    assert [s for i, s in enumerate(statuses) if i == 0 or statuses[i - 1] != s] == order
    downloads = [s for s in steps if s.status == "downloading"]
    assert [s.completed for s in downloads] == sorted(s.completed for s in downloads)
    assert downloads[-1].completed == downloads[-1].total == STARTER_BYTES
    assert all(s.digest == STARTER_SHA256 for s in downloads)
    assert "verified against the Hub's SHA-256" in steps[-1].message

    # The Hub saw one HEAD on the resolve URL; the CDN sent the file once, whole.
    [head] = local_hub.requests("hub")
    assert head.method == "HEAD" and head.path == f"/{REPO}/resolve/main/{FILE}"
    assert local_hub.body_bytes() == STARTER_BYTES

    # Pulling again asks the Hub (one HEAD) and downloads nothing.
    local_hub.reset_log()
    again = []
    assert pull_model(store, NAME, progress=again.append).path == model.path
    assert again[-1].message == f"{NAME} is up to date"
    assert local_hub.body_bytes() == 0 and len(local_hub.requests("hub")) == 1

    # A file cut short since is downloaded again (it was "up to date", and would not load).
    with open(model.path, "r+b") as f:
        f.truncate(100_000_000)
    local_hub.reset_log()
    repaired = []
    assert pull_model(store, NAME, progress=repaired.append).path == model.path
    assert any("is damaged (100,000,000 bytes of" in s.message for s in repaired)
    assert Path(model.path).stat().st_size == STARTER_BYTES
    assert gguf.read_header(model.path).architecture == "gemma3"


def test_a_cut_connection_is_resumed_where_it_stopped(hub_home, local_hub):
    local_hub.faults.cut_at = 100_000_000
    model = pull_model(ModelStore(), NAME)
    assert model.sha256 == STARTER_SHA256
    first, second = local_hub.requests("cdn", "GET")
    assert first.status == 200 and first.body_bytes == 100_000_000
    kept = int(second.range.removeprefix("bytes=").removesuffix("-"))
    assert second.status == 206 and 0 < kept <= 100_000_000
    assert kept + second.body_bytes == STARTER_BYTES  # only the rest was sent again


def test_an_interrupted_pull_resumes_with_only_the_rest(hub_home, local_hub):
    local_hub.faults.cut_at = 120_000_000
    local_hub.faults.down_after_cut = True  # the Hub stays down: this pull gives up
    store = ModelStore()
    with pytest.raises(DownloadError) as info:
        pull_model(store, NAME)
    message = info.value.message
    assert "HTTP 503" in message and f"run `localinfer pull {NAME}` again to resume" in message
    assert store.installed() == []  # nothing half-done is listed
    [partial] = store.partials()
    assert partial.name == NAME and partial.total_bytes == STARTER_BYTES
    assert 0 < partial.size_bytes <= 120_000_000
    kept = partial.size_bytes

    # Back up; enough disk for the rest, not for the whole file: the check counts what is kept.
    local_hub.faults.down = False
    local_hub.reset_log()
    store = ModelStore(disk_free=lambda path: STARTER_BYTES - kept + SPACE_MARGIN + 1)
    steps = []
    model = pull_model(store, NAME, progress=steps.append)
    assert model.sha256 == STARTER_SHA256
    [get] = local_hub.requests("cdn", "GET")
    assert get.range == f"bytes={kept}-" and get.status == 206
    assert local_hub.body_bytes() == STARTER_BYTES - kept
    first = next(s for s in steps if s.status == "downloading")
    assert first.completed == kept and first.message.startswith(f"resuming {NAME} at")
    assert store.partials() == [] and no_leftovers(store)


def test_cancel_keeps_the_partial_file_for_the_next_pull(hub_home, local_hub):
    store = ModelStore()
    cancel = threading.Event()

    def progress(step):
        if step.status == "downloading" and step.completed >= 50_000_000:
            cancel.set()

    with pytest.raises(Cancelled, match="again to resume"):
        pull_model(store, NAME, progress=progress, cancel=cancel)
    [partial] = store.partials()
    assert partial.size_bytes >= 50_000_000 and store.installed() == []
    local_hub.reset_log()
    pull_model(store, NAME)
    assert local_hub.body_bytes() == STARTER_BYTES - partial.size_bytes


def test_a_corrupted_download_is_rejected_and_removed(hub_home, local_hub):
    local_hub.faults.corrupt_at = 123_456_789
    store = ModelStore()
    with pytest.raises(StoreError) as info:
        pull_model(store, NAME)
    assert info.value.title == "checksum mismatch"
    assert STARTER_SHA256 in info.value.message and "the download was removed" in \
        info.value.message
    assert store.installed() == [] and store.partials() == [] and no_leftovers(store)
    assert not store.root.joinpath("tinygemma", "270m-q4_k_m.gguf").exists()
    # Served correctly, the next pull starts from the beginning and succeeds.
    local_hub.faults.corrupt_at = None
    local_hub.reset_log()
    assert pull_model(store, NAME).sha256 == STARTER_SHA256
    assert local_hub.body_bytes() == STARTER_BYTES


def test_missing_repo_and_missing_file(hub_home, local_hub):
    store = ModelStore()
    with pytest.raises(ModelNotFound, match="the Hub has no repo localinfer-test/no-such-repo"
                                            r" \(HTTP 404\)"):
        pull_model(store, "tinygemma:missing-q4_k_m")
    with pytest.raises(ModelNotFound, match=f"{REPO} has no file tiny-gemma-270m-Q8_0.gguf"):
        pull_model(store, "tinygemma:pick-q8_0")
    assert local_hub.requests("cdn") == [] and no_leftovers(store)


def test_unknown_names_and_paths_fail_before_the_network(hub_home, local_hub):
    store = ModelStore()
    with pytest.raises(ModelNotFound, match="tinygemma comes in tinygemma:270m"):
        pull_model(store, "tinygemma:9b")
    with pytest.raises(ModelNotFound, match="has no 'q3_k_m' variant.*it has q4_k_m"):
        pull_model(store, "tinygemma:270m-q3_k_m")
    with pytest.raises(InvalidRequest, match="localinfer add PATH"):
        pull_model(store, "./model.gguf")
    assert local_hub.log == []


def test_a_token_saved_by_hf_auth_login_opens_a_gated_repo(hub_home, local_hub):
    """huggingface_hub sends the token `hf auth login` saved; the errors said "set HF_TOKEN"
    as if there were none, and "the token in HF_TOKEN" when it was the saved one."""
    from huggingface_hub import constants

    Path(constants.HF_TOKEN_PATH).write_text("hf_not_the_right_one")
    with pytest.raises(AccessDenied) as info:
        pull_model(ModelStore(), "tinygemma:gated-q4_k_m")
    assert "has no access to it (HTTP 403)" in info.value.message
    assert "`hf auth login` saved" in info.value.message
    Path(constants.HF_TOKEN_PATH).write_text(TOKEN)
    assert pull_model(ModelStore(), "tinygemma:gated-q4_k_m").sha256 == STARTER_SHA256


def test_gated_repo_needs_a_token(hub_home, local_hub, monkeypatch):
    store = ModelStore()
    with pytest.raises(AccessDenied) as info:
        pull_model(store, "tinygemma:gated-q4_k_m")
    assert f"{GATED_REPO} is a gated repo (HTTP 401)" in info.value.message
    assert "set HF_TOKEN" in info.value.message
    monkeypatch.setenv("HF_TOKEN", "hf_not_the_right_one")
    with pytest.raises(AccessDenied, match=r"has no access to it \(HTTP 403\)"):
        pull_model(store, "tinygemma:gated-q4_k_m")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    local_hub.reset_log()
    assert pull_model(store, "tinygemma:gated-q4_k_m").sha256 == STARTER_SHA256
    [head] = local_hub.requests("hub")
    [get] = local_hub.requests("cdn", "GET")
    assert head.authorized and not get.had_auth  # the token never goes to the CDN


def test_not_enough_disk_space_is_found_before_downloading(hub_home, local_hub):
    store = ModelStore(disk_free=lambda path: 100_000_000)
    with pytest.raises(StoreError) as info:
        pull_model(store, NAME)
    assert info.value.title == "not enough disk space"
    assert "0.32 GB needed (0.25 GB for the file, 64 MB left over for the rest), 0.10 GB" \
        " free" in info.value.message
    assert local_hub.requests("cdn", "GET") == [] and store.installed() == []


def test_offline_pull_says_why_and_touches_nothing(hub_home, local_hub, monkeypatch):
    with pytest.raises(OfflineError, match="offline mode is on.*localinfer add PATH"):
        pull_model(ModelStore(offline=True), NAME)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the store reads it, as the config does
    with pytest.raises(OfflineError):
        pull_model(ModelStore(), NAME)
    assert local_hub.log == []
    # An installed model is simply there offline.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    model = pull_model(ModelStore(), NAME)
    local_hub.reset_log()
    steps = []
    assert pull_model(ModelStore(offline=True), NAME, progress=steps.append) == model
    assert "offline: not checked" in steps[-1].message and local_hub.log == []


def test_the_planner_picks_the_variant_and_says_why(hub_home, local_hub, tmp_path):
    store = ModelStore()
    desktop = load_profile(PROFILES / "desktop-rtx3060-32gb.json")
    target = pull_target(store, "tinygemma:pick", hardware=desktop, prefs=PlanPrefs())
    assert target.name == "tinygemma:pick-q8_0" and target.planned
    assert "the best quality that fits and reaches 10 tok/s" in target.reason
    slow = tmp_path / "slow.json"  # 4.5 GB/s: Q8_0 would decode under 10 tok/s, Q4_K_M not
    slow.write_text(json.dumps({
        "name": "slow box", "ram_total_gib": 4, "ram_available_gib": 3,
        "cpu": {"model": "x", "physical_cores": 4, "logical_cores": 4, "ghz": 2.0,
                "flags": ["avx2"]},
        "host_bandwidth_gbps": 4.5, "bandwidth_source": "spec", "gpus": [],
        "backends": ["CPU"]}))
    target = pull_target(store, "tinygemma:pick", hardware=load_profile(slow), prefs=PlanPrefs())
    assert target.name == "tinygemma:pick-q4_k_m"
    assert target.reason.startswith("tinygemma:pick-q4_k_m: the best quality that fits")
    # A name with the quant is taken as it is.
    exact = pull_target(store, "tinygemma:pick-q4_k_m")
    assert exact.name == "tinygemma:pick-q4_k_m" and not exact.planned
    assert local_hub.log == []


# --- plan before download: the header only ------------------------------------------------
def test_the_header_is_read_with_a_few_mb_and_cached(hub_home, local_hub, starter_path):
    spec = load_catalog().models["tinygemma:270m"]
    fetch = HeaderFetch()
    [candidate] = catalog_candidates(ModelStore(), spec, fetch=fetch)
    assert not candidate.estimated and not candidate.installed
    assert candidate.file_bytes == STARTER_BYTES and candidate.n_layers == 18
    served = local_hub.body_bytes()
    header_bytes = gguf.read_header(starter_path).data_offset
    assert 6_000_000 < header_bytes < 7_000_000  # gemma's vocabulary of 262k tokens
    assert fetch.files_read == 1 and fetch.bytes_read == served
    assert header_bytes <= served <= 1.5 * header_bytes and served < STARTER_BYTES / 25
    assert all(r.status == 206 for r in local_hub.requests("cdn", "GET"))

    # Cached: no network the second time, and offline too.
    local_hub.reset_log()
    for store in (ModelStore(), ModelStore(offline=True)):
        [again] = catalog_candidates(store, spec, fetch=HeaderFetch(enabled=not store.offline))
        assert not again.estimated and again.layers == candidate.layers
    assert local_hub.log == []


def test_offline_without_a_cached_header_uses_the_catalog_estimate(hub_home, local_hub):
    spec = load_catalog().models["tinygemma:270m"]
    [candidate] = catalog_candidates(ModelStore(offline=True), spec,
                                     fetch=HeaderFetch(enabled=False))
    assert candidate.estimated and local_hub.log == []


def test_an_unreachable_hub_falls_back_to_estimates(hub_home, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
    fetch = HeaderFetch()
    spec = load_catalog().models["tinygemma:pick"]
    candidates = catalog_candidates(ModelStore(), spec, fetch=fetch)
    assert candidates == [Candidate.from_spec(spec, v) for v in spec.variants]
    assert fetch.files_read == 0 and not fetch.enabled
    assert len(fetch.notes) == 1  # one attempt, not one per variant
    assert "cannot connect" in fetch.notes[0]


# --- remove and add ------------------------------------------------------------------------------
def test_remove_deletes_the_file_and_the_manifest(hub_home, local_hub):
    store = ModelStore()
    model = pull_model(store, NAME)
    assert store.find_installed("tinygemma:270m") == model
    removed = store.remove("tinygemma:270m")
    assert removed.name == NAME and not Path(model.path).exists() and store.installed() == []
    with pytest.raises(ModelNotFound, match="not installed"):
        store.remove(NAME)


def test_add_copies_or_links_a_local_gguf(home, starter_path, tmp_path):
    store = ModelStore()
    copied = store.add(starter_path)
    assert copied.name == "gemma-3:270m-q4_k_m"  # general.basename and size_label
    assert copied.sha256 == STARTER_SHA256 and not copied.linked
    assert Path(copied.path).is_relative_to(home) and copied.source == f"local:{starter_path}"

    linked = store.add(starter_path, name="mine:small", link=True)
    assert linked.name == "mine:small-q4_k_m" and linked.model == "mine:small"
    assert linked.linked and Path(linked.path) == starter_path
    assert store.resolve("mine:small").path == starter_path

    with pytest.raises(InvalidRequest, match="already installed"):
        store.add(starter_path, name="mine:small")
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model")
    with pytest.raises(InvalidModelFile):
        store.add(not_gguf)
    with pytest.raises(ModelNotFound):
        store.add(tmp_path / "missing.gguf")

    store.remove("mine:small")
    assert starter_path.is_file()  # a linked file is never deleted
    store.remove(copied.name)
    assert not Path(copied.path).exists()
    assert store.installed() == []


def test_catalog_file_from_the_environment_adds_and_overrides(tmp_path, monkeypatch):
    packaged = load_catalog()
    extra = tmp_path / "extra.toml"
    spec = packaged.models["qwen3:0.6b"]
    extra.write_text(f"""
[[models]]
name = "qwen3:0.6b"
family = "qwen3"
params = {spec.params}
layers = {spec.layers}
embedding = {spec.embedding}
heads = {spec.heads}
kv_heads = {spec.kv_heads}
head_dim = {spec.head_dim}
vocab = {spec.vocab}
context = {spec.context}
repo = "my-mirror/Qwen3-0.6B-GGUF"
default_quant = "Q8_0"
variants = [{{ quant = "Q8_0", file = "q8.gguf" }}]
""")
    monkeypatch.setenv("LOCALINFER_CATALOG", str(extra))
    catalog = load_catalog()
    assert catalog.models["qwen3:0.6b"].repo == "my-mirror/Qwen3-0.6B-GGUF"
    assert catalog.models["qwen3:0.6b"].family.id == "qwen3"
    assert set(catalog.models) == set(packaged.models)
    monkeypatch.setenv("LOCALINFER_CATALOG", str(tmp_path / "missing.toml"))
    with pytest.raises(Exception, match="LOCALINFER_CATALOG"):
        load_catalog()


def test_a_second_pull_of_the_same_model_waits_its_turn(hub_home, local_hub):
    local_hub.faults.pause_at = 30_000_000
    errors = []

    def first():
        try:
            pull_model(ModelStore(), NAME)
        except Exception as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert local_hub.faults.paused.wait(60)
        with pytest.raises(StoreError) as info:
            pull_model(ModelStore(), NAME)
        assert info.value.title == "pull in progress"
        # Nor is its partial file removed from under it (the pull then failed with an
        # internal error, FileNotFoundError, after the last byte).
        partial = ModelStore().partials()
        assert partial and partial[0].path.exists()
        with pytest.raises(StoreError, match="a pull of .* is running"):
            ModelStore().remove(NAME)
        assert partial[0].path.exists()
    finally:
        local_hub.release()
        thread.join(120)
    assert errors == [] and ModelStore().find_installed(NAME).sha256 == STARTER_SHA256


@pytest.mark.parametrize("name", [NAME, NAME.rsplit("-", 1)[0]], ids=["full", "no-quant"])
def test_removing_an_unfinished_download(hub_home, local_hub, name):
    """By its full name, or the model's without the quant (tinygemma:270m: it said "not
    installed" of the partial download, as `rm hf.co/user/repo` did)."""
    store = ModelStore()
    cancel = threading.Event()
    with pytest.raises(Cancelled):
        pull_model(store, NAME, progress=lambda step: cancel.set() if step.completed else None,
                   cancel=cancel)
    [partial] = store.partials()
    assert store.remove(name) == partial
    assert store.partials() == [] and no_leftovers(store)


def test_a_disk_that_fills_during_the_download_says_what_is_kept(hub_home, local_hub,
                                                                monkeypatch):
    """ENOSPC while writing: "cannot use: No space left on device" with no path before; now
    what filled, the bytes kept and how to resume (which works: the partial stays)."""
    import errno

    from localinfer.store import hub

    def fills(remote, partial, *, on_bytes, cancel):
        with open(partial, "ab") as out:
            out.write(b"\0" * 4096)
        on_bytes(4096, remote.size)
        raise OSError(errno.ENOSPC, "No space left on device", str(partial))

    monkeypatch.setattr(hub, "download", fills)
    with pytest.raises(StoreError) as info:
        pull_model(ModelStore(), NAME)
    assert info.value.title == "not enough disk space"
    assert "filled up while downloading" in info.value.message
    assert "4.1 KB of" in info.value.message and "again to resume" in info.value.message
    [partial] = ModelStore().partials()
    assert partial.size_bytes == 4096


def test_a_file_shorter_than_its_listing_is_not_resumed_for_ever(hub_home, local_hub,
                                                                  monkeypatch):
    """A Hub listing more bytes than it serves: the first pull kept what came, and every
    later one was HTTP 416 with "run again to resume". The partial goes; the next pull
    starts again."""
    from localinfer.errors import DownloadError
    from localinfer.store import hub

    def short(remote, partial, *, on_bytes, cancel):
        with open(partial, "ab") as out:
            out.write(b"\0" * 4096)
        on_bytes(4096, remote.size)
        raise DownloadError("the Hub has fewer bytes than it lists (HTTP 416).",
                            title="size mismatch")

    monkeypatch.setattr(hub, "download", short)
    with pytest.raises(DownloadError) as info:
        pull_model(ModelStore(), NAME)
    assert "partial download was deleted" in info.value.message
    assert "to resume" not in info.value.message
    assert ModelStore().partials() == []


def test_the_pull_display_says_the_hash_was_read_not_that_it_matched(capsys):
    # The bar's last line came before the comparison: it said "Verified" right above a
    # checksum mismatch.
    from localinfer.cli.models import _PullDisplay

    display = _PullDisplay()
    display(PullProgress("verifying", 0, 2048, name=NAME))
    display(PullProgress("verifying", 2048, 2048, name=NAME))
    display.finish()
    err = capsys.readouterr().err
    assert "Hashed 2.0 KB" in err and "Verified" not in err
