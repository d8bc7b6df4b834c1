"""The daemon's HTTP application: OpenAI (/v1), Ollama (/api) and localinfer's own routes.

``create_app(state)`` builds a Starlette app around a ``DaemonState`` (the model manager and
the settings). A pure-ASGI guard in front of every route rejects what a local daemon must not
serve: a Host header that is not loopback over TCP (DNS rebinding), a browser Origin that was
not configured, a missing API key over TCP when one is set, and oversized bodies. Every error,
including a bug, is a JSON body in the shape of the API the route belongs to.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..errors import Busy, ContextOverflow, InvalidRequest, LocalInferError, ModelNotFound
from .manager import ModelManager

log = logging.getLogger(__name__)

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

    def count(self, route: str, status: int) -> None:
        key = (route, status)
        self.requests[key] = self.requests.get(key, 0) + 1


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
        self.generations: dict[str, Any] = {}
        """Streams of /localinfer/generate by id, for /localinfer/cancel."""
        self.hardware: dict[str, Any] | None = None

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def record(self, done: Any) -> None:
        """Count a finished generation's tokens for /metrics."""
        c = self.counters
        c.prompt_tokens += done.usage.prompt_tokens
        c.cached_tokens += done.usage.cached_tokens
        c.generated_tokens += done.usage.completion_tokens
        if done.timings.decode_tokens:
            c.last_decode_tps = done.timings.decode_tps
        if done.timings.ttft_ms:
            c.last_ttft_ms = done.timings.ttft_ms


def is_ollama_path(path: str) -> bool:
    return path.startswith("/api/")


def error_body(path: str, status: int, message: str, code: str | None = None) -> dict:
    """The error shape of the API a path belongs to."""
    if is_ollama_path(path):
        return {"error": message}
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


def error_response(path: str, exc: Exception) -> JSONResponse:
    if isinstance(exc, LocalInferError):
        status = exc.http_status if 400 <= exc.http_status < 600 else 500
        code = {ContextOverflow: "context_length_exceeded", ModelNotFound: "model_not_found",
                Busy: "server_busy", RequestTooLarge: "request_too_large"}.get(type(exc))
        if code is None and status >= 500:
            code = "server_error"
        headers = {"Retry-After": "2"} if isinstance(exc, Busy) else None
        body = error_body(path, status, exc.message, code)
        if path.startswith("/localinfer/"):  # localinfer's own client rebuilds the error
            body["error"]["class"] = type(exc).__name__
        return JSONResponse(body, status, headers=headers)
    if isinstance(exc, HTTPException):
        message = exc.detail if isinstance(exc.detail, str) else "HTTP error"
        if exc.status_code == 404:
            message = f"no such endpoint: {path}"
        return JSONResponse(error_body(path, exc.status_code, message), exc.status_code)
    log.exception("unhandled error on %s", path)
    return JSONResponse(error_body(path, 500, f"internal error: {type(exc).__name__}: {exc}",
                                   "internal_error"), 500)


async def _handle(request: Request, exc: Exception) -> Response:
    return error_response(request.url.path, exc)


# --- the guard ---------------------------------------------------------------------------------
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
_TRUSTED_ORIGIN_SCHEMES = ("vscode-webview://", "vscode-file://", "app://", "file://",
                           "tauri://")


def host_is_loopback(host: str) -> bool:
    name = host.strip().lower()
    if name.startswith("["):  # [::1]:port
        name = name[1:].split("]", 1)[0]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Guard:
    """Host, Origin, API key and body-size checks in front of every route."""

    def __init__(self, app: ASGIApp, settings: DaemonSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = Headers(scope=scope)
        server = scope.get("server")
        via_tcp = bool(server) and server[1] is not None  # a Unix socket has no port
        settings = self.settings

        if via_tcp and not settings.any_host:
            host = headers.get("host")
            if host is not None and not (host_is_loopback(host) or
                                         host.split(":")[0] in settings.extra_hosts):
                return await self._reject(scope, receive, send, 403,
                                          f"Host {host!r} is not allowed: this daemon only"
                                          " answers to localhost (DNS rebinding protection).")
        origin = headers.get("origin")
        if origin and not self._origin_allowed(origin):
            return await self._reject(scope, receive, send, 403,
                                      f"Origin {origin!r} is not allowed; add it with"
                                      " `localinfer serve --cors-origin ORIGIN`.")
        # A CORS preflight never carries credentials: it is answered without the key (and
        # says nothing); the request it announces needs the key as usual.
        preflight = scope["method"] == "OPTIONS" and "access-control-request-method" in headers
        if via_tcp and settings.api_key and path != "/health" and not preflight:
            auth = headers.get("authorization", "")
            if auth != f"Bearer {settings.api_key}":
                return await self._reject(
                    scope, receive, send, 401,
                    "missing or wrong API key: send 'Authorization: Bearer <key>' (the key is"
                    " LOCALINFER_API_KEY)." if auth else
                    "this daemon requires an API key over TCP: send 'Authorization: Bearer"
                    " <key>' (LOCALINFER_API_KEY).", code="invalid_api_key")
        length = headers.get("content-length")
        limit = settings.max_body_bytes
        if length is not None and (not length.isdigit() or int(length) > limit):
            return await self._reject(scope, receive, send, 413,
                                      f"the request body is larger than {limit >> 20} MiB.")
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # a chunked body with no Content-Length
                    raise RequestTooLarge(f"the request body is larger than {limit >> 20} MiB.")
            return message

        await self.app(scope, limited_receive, send)

    def _origin_allowed(self, origin: str) -> bool:
        if origin in self.settings.cors_origins or "*" in self.settings.cors_origins:
            return True
        if origin.startswith(_TRUSTED_ORIGIN_SCHEMES):
            return True
        for scheme in ("http://", "https://"):
            if origin.startswith(scheme):
                return host_is_loopback(origin[len(scheme):].split("/", 1)[0])
        return False

    async def _reject(self, scope: Scope, receive: Receive, send: Send, status: int,
                      message: str, code: str | None = None) -> None:
        body = error_body(scope["path"], status, message, code or {
            401: "invalid_api_key", 403: "forbidden", 413: "request_too_large"}.get(status))
        await JSONResponse(body, status)(scope, receive, send)


class RequestTooLarge(LocalInferError):
    title = "request too large"
    http_status = 413


def guarded(state: DaemonState, name: str,
            handler: Callable[[Request], Awaitable[Response]]) -> Callable:
    """Wrap a route: count it for /metrics, keep the daemon awake, and turn any error into a
    JSON response in the route's API shape (never a traceback, never a dead daemon)."""

    async def endpoint(request: Request) -> Response:
        state.touch()
        try:
            response = await handler(request)
        except Exception as exc:
            response = error_response(request.url.path, exc)
        state.counters.count(name, response.status_code)
        return response

    return endpoint


def create_app(state: DaemonState) -> Starlette:
    from . import native_routes, ollama_routes, openai_routes

    routes = [*native_routes.routes(state), *openai_routes.routes(state),
              *ollama_routes.routes(state)]
    middleware = [Middleware(Guard, settings=state.settings)]
    if state.settings.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(
            state.settings.cors_origins), allow_methods=["*"], allow_headers=["*"]))
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={Exception: _handle, HTTPException: _handle,
                            LocalInferError: _handle},
    )
    app.state.daemon = state
    return app


def json_line(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


VERSION = __version__
__all__ = ["DaemonSettings", "DaemonState", "create_app", "InvalidRequest"]
