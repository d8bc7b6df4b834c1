"""Starting the real daemon in-process (a thread) on a temporary socket and a free port, and
the openai and ollama clients that talk to it (its fixture is in daemon_fixtures.py)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import ollama
import openai

import ggufgen
from localinfer.daemon.residency import MemoryPlan
from localinfer.daemon.server import Daemon, ServeOptions
from localinfer.daemon.state import DaemonSettings
from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend
from localinfer.store import ModelStore


class RunningDaemon:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.socket = daemon.socket_path
        self.url = daemon.url

    @property
    def manager(self):
        return self.daemon.state.manager

    def uds(self, **kwargs) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)),
                            base_url="http://localhost", timeout=30, **kwargs)

    def tcp(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)


def install_fake_models(*names: str) -> None:
    """Register models in the current store whose files the fake factory never reads."""
    store = ModelStore()
    for name in names:
        family, tag = name.split(":")
        path = store.root / family / f"{tag}.gguf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(ggufgen.tiny_model())  # a valid header for /api/show
        store.register(name=name, model=name.rsplit("-", 1)[0], quant="F16", path=path,
                       sha256=None, source="test")


def fake_factory(max_queue: int = 64, loads: list | None = None, **backend_kwargs
                 ) -> Callable:
    def factory(model, num_ctx, progress=None):
        if progress is not None:
            progress(1.0)
        if loads is not None:
            loads.append((model.name, num_ctx))
        kwargs = dict(backend_kwargs)
        if num_ctx:  # as engine_factory does: at most the trained context
            kwargs["n_ctx"] = min(num_ctx, kwargs.get("n_ctx_train") or num_ctx)
        return Engine(FakeBackend(name=model.name, **kwargs), max_queue=max_queue,
                      load_ms=5.0)
    return factory


@contextlib.contextmanager
def serve(factory: Callable, *, settings: DaemonSettings | None = None,
          keep_alive_s: float = 300.0, max_loaded: int | None = 1, tcp: bool = True,
          memory: MemoryPlan | None = None) -> Iterator[RunningDaemon]:
    sock_dir = Path(tempfile.mkdtemp(prefix="li-", dir="/tmp"))  # short: sun_path limit
    options = ServeOptions(socket_path=sock_dir / "d.sock", port=0, tcp=tcp,
                           keep_alive_s=keep_alive_s, max_loaded=max_loaded,
                           settings=settings or DaemonSettings())
    daemon = Daemon(options, factory, memory=memory)
    daemon.start()
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    running = RunningDaemon(daemon)
    deadline = time.monotonic() + 20
    while True:
        try:
            with running.uds() as c:
                if c.get("/health").status_code in (200, 503):
                    break
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    try:
        yield running
    finally:
        daemon.stop()
        thread.join(30)
        shutil.rmtree(sock_dir, ignore_errors=True)


REPLY = "Hello from the fake model, streaming word by word."
STARTER = "gemma3:270m-q4_k_m"
"""The starter as /api/tags and /v1/models list it from the first start, before any request
names it (its package is installed with the tests)."""


def openai_client(d, tcp=False, **kwargs) -> openai.OpenAI:
    if tcp:
        return openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, **kwargs)
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(d.socket)))
    return openai.OpenAI(base_url="http://localhost/v1", api_key="unused", http_client=http,
                         max_retries=0, **kwargs)


def ollama_client(d, tcp=False) -> ollama.Client:
    if tcp:
        return ollama.Client(host=d.url)
    return ollama.Client(host="http://localhost",
                         transport=httpx.HTTPTransport(uds=str(d.socket)))
