"""Helpers for the chat UI's tests: the app from the CLI's factory on the fake backend, a fake
model whose decode steps the test releases one by one, and waiting for the UI."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from localinfer.hardware import load_profile
from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend
from localinfer.tui.app import create_app

PROFILES = Path(__file__).parent / "profiles"
REPLY = ("Here is a function:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\n"
         "It adds **two** numbers and returns their sum to the caller right away.")


def laptop():
    """A recorded 8 GB laptop (no GPU, bandwidth from its data sheet): numbers that do not
    depend on the machine the tests run on."""
    return load_profile(PROFILES / "laptop-8gb-cpu.json")


class GatedBackend(FakeBackend):
    """The fake model, but each decode step waits until the test releases it."""

    def __init__(self, *args, gated: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gated = gated
        self.gate = threading.Semaphore(0)

    def decode(self, tokens, positions, seq_ids, outputs) -> None:
        if self.gated and not self.gate.acquire(timeout=60):
            raise RuntimeError("the test never released this decode step")
        super().decode(tokens, positions, seq_ids, outputs)

    def release(self, steps: int = 1) -> None:
        for _ in range(steps):
            self.gate.release()

    def open(self) -> None:
        """Stop gating (and let any waiting step through)."""
        self.gated = False
        self.gate.release()


class Opener:
    """``open_engine`` for the app: engines on fake backends, remembering what was opened."""

    def __init__(self, make: Callable[[str], FakeBackend] | None = None,
                 fail: Exception | None = None) -> None:
        self.make = make or (lambda ref: FakeBackend(REPLY, name=ref))
        self.fail = fail
        self.opened: list[str] = []
        self.engines: list[Engine] = []

    def __call__(self, ref, config, *, on_copy=None, on_load=None) -> Engine:
        self.opened.append(ref)
        if self.fail is not None:
            raise self.fail
        if on_load:
            on_load(0.5)
        engine = Engine(self.make(ref))
        self.engines.append(engine)
        return engine

    def close(self) -> None:
        for engine in self.engines:
            engine.close()


def in_process_app(opener: Opener, model: str = "fake:1b", **kwargs):
    """The app exactly as ``localinfer chat MODEL --no-daemon`` builds it, on the fake
    backend and a recorded hardware profile."""
    kwargs.setdefault("hardware", laptop())
    return create_app(model, no_daemon=True, open_engine=opener, **kwargs)


async def until(pilot, condition: Callable[[], object], what: str, timeout_s: float = 20.0):
    """Let the app run until ``condition()`` holds (the timeout only stops a hung test)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"the UI never got to: {what}")
        await pilot.pause(0.01)


def streamed(app, n: int) -> bool:
    """Whether the reply being streamed has at least ``n`` tokens."""
    return bool(app.reply and app.reply.live and app.reply.live.n_tokens >= n)


async def until_screen(pilot, app, screen_type: type, what: str) -> None:
    """Until ``app.screen`` is a ``screen_type`` and mounted: the screen becomes current
    before its buttons are composed, and a click in between finds nothing to press."""
    await until(pilot, lambda: isinstance(app.screen, screen_type) and app.screen.is_mounted,
                what)


def text_of(widget) -> str:
    """What a Label/Static shows, as plain text."""
    return str(widget.render())


async def ready(pilot) -> None:
    app = pilot.app
    await until(pilot, lambda: app.session is not None or app.load_error is not None,
                "the model is ready")
