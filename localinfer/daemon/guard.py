"""The guard in front of every route (pure ASGI): it rejects what a local daemon must not
serve: a Host header that is not loopback over TCP (DNS rebinding), a browser Origin that was
not configured, a missing API key over TCP when one is set (a bearer token, or Anthropic's
x-api-key header), and oversized bodies."""

from __future__ import annotations

import hmac
import ipaddress
import time
from collections.abc import Sequence
from contextvars import ContextVar

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .error_replies import RequestTooLarge, error_body
from .state import DaemonSettings

RECEIVED_AT: ContextVar[float] = ContextVar("received_at", default=0.0)
"""When the request being served arrived (``time.perf_counter()``), for its timings'
``prepare_ms``: set here, first thing, for every HTTP request."""
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


def origin_allowed(cors_origins: Sequence[str], origin: str) -> bool:
    """A browser page's Origin this daemon answers: one given with ``--cors-origin`` (or
    ``*``), an editor's or desktop app's webview, or a page served from this machine."""
    if origin in cors_origins or "*" in cors_origins:
        return True
    if origin.startswith(_TRUSTED_ORIGIN_SCHEMES):
        return True
    for scheme in ("http://", "https://"):
        if origin.startswith(scheme):
            return host_is_loopback(origin[len(scheme):].split("/", 1)[0])
    return False


class LocalCORS(CORSMiddleware):
    """CORS headers, and answers to preflights, for every origin the guard lets through (a
    page on localhost, an editor's webview), as Ollama sends them; not only for those given
    with ``--cors-origin``. Without them a browser drops the reply the guard allowed."""

    def __init__(self, app: ASGIApp, cors_origins: Sequence[str]) -> None:
        super().__init__(app, allow_origins=list(cors_origins), allow_methods=["*"],
                         allow_headers=["*"])
        self._origins = tuple(cors_origins)

    def is_allowed_origin(self, origin: str) -> bool:
        return origin_allowed(self._origins, origin)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = Headers(scope=scope).get("origin") if scope["type"] == "http" else None
        if origin and not self.is_allowed_origin(origin):
            await self.app(scope, receive, send)  # the guard refuses it, saying why
            return
        await super().__call__(scope, receive, send)


class Guard:
    """Host, Origin, API key and body-size checks in front of every route."""

    def __init__(self, app: ASGIApp, settings: DaemonSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        RECEIVED_AT.set(time.perf_counter())
        path = scope["path"]
        headers = Headers(scope=scope)
        server = scope.get("server")
        via_tcp = server is not None and server[1] is not None  # a Unix socket has no port
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
            # Anthropic's clients send the key as x-api-key (Claude Code's ANTHROPIC_API_KEY);
            # its ANTHROPIC_AUTH_TOKEN, like every OpenAI client, as a bearer token.
            auth = headers.get("authorization", "")
            api_key = headers.get("x-api-key", "")
            if not (_same(auth, f"Bearer {settings.api_key}")
                    or _same(api_key, settings.api_key)):
                return await self._reject(
                    scope, receive, send, 401,
                    "missing or wrong API key: send 'Authorization: Bearer <key>' or"
                    " 'x-api-key: <key>' (the key is LOCALINFER_API_KEY)." if auth or api_key
                    else "this daemon requires an API key over TCP: send 'Authorization:"
                    " Bearer <key>' or 'x-api-key: <key>' (LOCALINFER_API_KEY).",
                    code="invalid_api_key")
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
        return origin_allowed(self.settings.cors_origins, origin)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, status: int,
                      message: str, code: str | None = None) -> None:
        body = error_body(scope["path"], status, message, code or {
            401: "invalid_api_key", 403: "forbidden", 413: "request_too_large"}.get(status))
        await JSONResponse(body, status)(scope, receive, send)


def _same(given: str, key: str) -> bool:
    """Compared in constant time: how long a wrong key took says nothing of the right one."""
    return hmac.compare_digest(given.encode(), key.encode())
