"""What every route shares: the daemon's settings, its counters for /metrics, and the state
(model manager, generations in flight, activity) that one running daemon holds."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import DaemonError, LocalInferError
from ..runtime.disk_cache import PrefixStore
from ..runtime.types import Done
from .manager import ModelManager

MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class DaemonSettings:
    """How the daemon guards and paces its API."""

    api_key: str | None = None
    """When set, TCP requests need ``Authorization: Bearer <api_key>``."""
    cors_origins: tuple[str, ...] = ()
    """Browser origins allowed to call the API (no CORS headers otherwise)."""
    extra_hosts: tuple[str, ...] = ()
    """Host names accepted besides loopback ones (the address the daemon was bound to)."""
    any_host: bool = False
    """Bound to every interface (0.0.0.0 or ::) on purpose: any Host header is accepted."""
    max_body_bytes: int = MAX_BODY_BYTES
    idle_exit_s: float | None = None
    """Exit after this many seconds without requests (an auto-started daemon)."""


@dataclass
class Counters:
    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    last_decode_tps: float = 0.0
    last_ttft_ms: float = 0.0

    clients_left: dict[str, int] = field(default_factory=dict)
    """Requests whose client closed the connection before the reply's end, by route."""

    def count(self, route: str, status: int) -> None:
        key = (route, status)
        self.requests[key] = self.requests.get(key, 0) + 1

    def client_left(self, route: str) -> None:
        self.clients_left[route] = self.clients_left.get(route, 0) + 1


class Cancellable(Protocol):
    """A generation in flight as /localinfer/cancel sees it (bridge.py's ``EventStream``)."""

    def cancel(self) -> None: ...


class DaemonState:
    def __init__(self, manager: ModelManager, settings: DaemonSettings) -> None:
        self.manager = manager
        self.settings = settings
        self.counters = Counters()
        self.started = time.time()
        self.last_activity = time.monotonic()
        self.in_flight = 0
        self.shutting_down = False
        self.exit_requested = asyncio.Event()
        self.generations: dict[str, Cancellable] = {}
        """Streams of /localinfer/generate by id, for /localinfer/cancel."""
        self.hardware: dict[str, Any] | None = None
        self.prefix_cache: PrefixStore | None = None
        """The prefix cache on disk, for /localinfer/status, ps and /metrics (or None)."""

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def cut_off(self, done: Done) -> LocalInferError:
        """The error of a reply the engine cancelled before its end: a 503 while the daemon
        shuts down (send it again once it is back), else one naming the other causes."""
        n = done.usage.completion_tokens
        if self.shutting_down:
            return DaemonError(f"the daemon is shutting down: the reply was stopped after {n}"
                               " tokens; send the request again once the daemon is back.")
        return LocalInferError(f"the generation was cancelled after {n} tokens (the model was"
                               " unloaded, or a newer request superseded it).")

    def record(self, done: Done) -> None:
        """Count a finished generation's tokens for /metrics."""
        c = self.counters
        c.prompt_tokens += done.usage.prompt_tokens
        c.cached_tokens += done.usage.cached_tokens
        c.generated_tokens += done.usage.completion_tokens
        if done.timings.decode_tokens:
            c.last_decode_tps = done.timings.decode_tps
        if done.timings.ttft_ms:
            c.last_ttft_ms = done.timings.ttft_ms
