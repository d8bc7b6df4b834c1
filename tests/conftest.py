"""Shared fixtures and the run order. Every test runs under a temporary LOCALINFER_HOME,
removed when the session ends; the real starter model is assembled (1-2 s) and loaded once per
session, and the tests on it run after the fast ones."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Set before any localinfer module reads it, so no test can touch the real home.
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="localinfer-test-home-"))
os.environ["LOCALINFER_HOME"] = str(_SESSION_HOME)
os.environ.pop("LOCALINFER_API_KEY", None)
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
# huggingface_hub takes HF_ENDPOINT's origin, as it is when first imported, for a Hub's and
# follows redirects to it: imported now, before a test points HF_ENDPOINT at its local Hub, so
# that a later test's local CDN given that Hub's old port is never taken for a Hub (its HEAD
# redirect then followed to a file without the Hub's headers: a failure once in some runs).
os.environ.pop("HF_ENDPOINT", None)
import huggingface_hub.constants  # noqa: E402, F401

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Fast tests first, so a run shows progress (and fails) within a minute; then the tests
    on the real model, and the minutes-long ``slow`` ones last. Otherwise in collected order.
    Tests marked ``gpu`` need a llama.cpp build with a GPU device: skipped without one, but
    failed in the GPU lane (LOCALINFER_GPU_LANE=1, .ci/gpu-lane), where one must be found."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow"):
            return 2
        return 1 if item.get_closest_marker("model") else 0

    items.sort(key=rank)  # stable: each group keeps its order
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_tests:
        missing = _no_gpu_reason()
        if missing and os.environ.get("LOCALINFER_GPU_LANE") != "1":
            for item in gpu_tests:
                item.add_marker(pytest.mark.skip(reason=missing))
        elif missing:
            raise pytest.UsageError(f"LOCALINFER_GPU_LANE=1, but {missing}")


def _no_gpu_reason() -> str:
    """Why the GPU tests cannot run here ("" when they can): llama.cpp's devices, asked once."""
    from localinfer.hardware.probe import probe_build

    build = probe_build()
    if any(b != "CPU" for b in build.backends):
        return ""
    return ("this llama.cpp build offloads to no GPU device (backends compiled in: "
            + (", ".join(build.compiled) or "unknown") + "; the Vulkan lane, .ci/gpu-lane,"
            " runs these on Mesa's llvmpipe)" + "".join(" " + n for n in build.notes))


def pytest_sessionfinish(session: pytest.Session) -> None:
    # The home holds the assembled starter model (242 MB); it is cheaper to assemble again
    # than to leave one behind per run.
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh, empty LOCALINFER_HOME for one test."""
    path = tmp_path / "home"
    monkeypatch.setenv("LOCALINFER_HOME", str(path))
    return path


@pytest.fixture(scope="session")
def starter_path() -> Path:
    """The real starter model (Gemma 3 270M Q4_K_M), assembled into the session's store."""
    from localinfer.store import ModelStore

    model = ModelStore().resolve("gemma3:270m")
    return model.path


@pytest.fixture(scope="session")
def real_engine(starter_path):
    """The starter model loaded once for the whole session: 2 slots of 2048 tokens."""
    from localinfer.loading import load_engine
    from localinfer.runtime.backend import LoadOptions

    engine = load_engine(starter_path, LoadOptions(n_ctx=2048, n_slots=2), name="gemma3:270m",
                         family="gemma3")
    yield engine
    engine.close()


@pytest.fixture
def fake_engine():
    from localinfer.runtime.engine import Engine
    from localinfer.runtime.fake import FakeBackend

    engines = []

    def make(**kwargs):
        engine = Engine(FakeBackend(**kwargs))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()
