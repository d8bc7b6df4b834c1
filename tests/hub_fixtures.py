"""Fixtures for store tests against the local Hub: the server (serving the real starter GGUF
under made-up repos) and a catalog file, given by LOCALINFER_CATALOG, that points at them.
A test module uses them with ``pytest_plugins = ["hub_fixtures"]``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import ggufgen
from hub_server import (
    CATALOG,
    FILE,
    FILE_TYPES,
    GATED_REPO,
    NO_GGUF_REPO,
    NO_Q4_REPO,
    QUANTS_REPO,
    REPO,
    SPLIT_REPO,
    SPLIT_STEM,
    LocalHub,
)


@pytest.fixture(scope="session")
def tiny_quant_files(tmp_path_factory) -> dict[str, Path]:
    """Small generated GGUFs, one per quant (sizes growing with the quant), keyed by their
    path in QUANTS_REPO; Q2_K is split in two shards in a folder, as large repos do; a
    README, and a vision projector that is not a model."""
    folder = tmp_path_factory.mktemp("tiny-quants")
    files: dict[str, Path] = {}
    for quant, embd in (("Q4_K_M", 64), ("Q8_0", 96), ("F16", 128)):
        path = folder / f"tiny-{quant}.gguf"
        path.write_bytes(ggufgen.tiny_model(embd=embd, file_type=FILE_TYPES[quant]))
        files[path.name] = path
    whole = folder / "tiny-Q2_K-whole.gguf"
    whole.write_bytes(ggufgen.tiny_model(n_layers=4, embd=32, file_type=FILE_TYPES["Q2_K"]))
    (folder / "Q2_K").mkdir()
    for shard in ggufgen.split_gguf(whole, folder / "Q2_K", "tiny-Q2_K", 2):
        files[f"Q2_K/{shard.name}"] = shard
    mmproj = folder / "mmproj-tiny-F16.gguf"
    mmproj.write_bytes(ggufgen.tiny_model(embd=32, file_type=1))
    files[mmproj.name] = mmproj
    readme = folder / "README.md"
    readme.write_text("# tiny quants\n", encoding="utf-8")
    files[readme.name] = readme
    return files


@pytest.fixture(scope="session")
def split_starter(starter_path, tmp_path_factory) -> list[Path]:
    """The starter model split into two shards as llama.cpp's gguf-split does (253 MB)."""
    return ggufgen.split_gguf(starter_path, tmp_path_factory.mktemp("split-starter"),
                              SPLIT_STEM, 2)


@pytest.fixture
def split_repo(local_hub, split_starter) -> str:
    """SPLIT_REPO on the local Hub: the starter as two shards."""
    local_hub.add_repo(SPLIT_REPO, {path.name: path for path in split_starter})
    return SPLIT_REPO


@pytest.fixture
def local_hub(starter_path, tiny_quant_files, tmp_path, monkeypatch):
    """The local Hub, serving the starter file as REPO/FILE and GATED_REPO/FILE (HF_TOKEN =
    hub_server.TOKEN opens it), the generated quants as QUANTS_REPO (and without Q4_K_M, as
    NO_Q4_REPO), and a repo with no GGUF; HF_ENDPOINT points at it for this test."""
    hub = LocalHub()
    hub.add_repo(REPO, {FILE: starter_path})
    hub.add_repo(GATED_REPO, {FILE: starter_path}, gated=True)
    hub.add_repo(QUANTS_REPO, tiny_quant_files)
    hub.add_repo(NO_Q4_REPO, {name: path for name, path in tiny_quant_files.items()
                              if name in ("tiny-Q8_0.gguf", "tiny-F16.gguf")})
    other = tmp_path / "safetensors"
    other.mkdir()
    (other / "config.json").write_text("{}", encoding="utf-8")
    (other / "model.safetensors").write_bytes(b"\0" * 64)
    hub.add_repo(NO_GGUF_REPO, {p.name: p for p in other.iterdir()})
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    # No token saved by `hf auth login` either: here and in the CLI's processes.
    token_file = tmp_path / "hf-token"
    monkeypatch.setenv("HF_TOKEN_PATH", str(token_file))
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(token_file))
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("LOCALINFER_OFFLINE", raising=False)
    with hub:
        yield hub


@pytest.fixture
def hub_catalog(tmp_path, monkeypatch) -> Path:
    """The tests' catalog (tinygemma:*), added through LOCALINFER_CATALOG."""
    path = tmp_path / "test-catalog.toml"
    path.write_text(CATALOG, encoding="utf-8")
    monkeypatch.setenv("LOCALINFER_CATALOG", str(path))
    return path


@pytest.fixture
def hub_home(home, local_hub, hub_catalog):
    """A fresh LOCALINFER_HOME with the local Hub and the tests' catalog; its downloads
    (253 MB each) are deleted afterwards."""
    yield home
    shutil.rmtree(home, ignore_errors=True)
