"""Fixtures for store tests against the local Hub: the server (serving the real starter GGUF
under made-up repos) and a catalog file, given by LOCALINFER_CATALOG, that points at them.
A test module uses them with ``pytest_plugins = ["hub_fixtures"]``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hub_server import CATALOG, FILE, GATED_REPO, REPO, LocalHub


@pytest.fixture
def local_hub(starter_path, monkeypatch):
    """The local Hub, serving the starter file as REPO/FILE and GATED_REPO/FILE (HF_TOKEN =
    hub_server.TOKEN opens it); HF_ENDPOINT points at it for this test."""
    hub = LocalHub()
    hub.add_repo(REPO, {FILE: starter_path})
    hub.add_repo(GATED_REPO, {FILE: starter_path}, gated=True)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
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
