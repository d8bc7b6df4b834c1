"""Every error the daemon answers, as a JSON body in the shape of the API the route belongs to:
Ollama's ``{"error": message}`` under /api, Anthropic's ``{"type": "error", "error": {type,
message}}`` under /v1/messages, OpenAI's ``{"error": {message, type, code}}`` elsewhere, and on
localinfer's own routes also the class, so its client raises the same one.
Never a traceback, never a dead daemon: ``guarded`` wraps every route."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from ..errors import Busy, Cancelled, LocalInferError, ModelTooLarge
from ..protocol import ERROR_CODES, error_json, http_status
from .state import DaemonState

log = logging.getLogger(__name__)


class RequestTooLarge(LocalInferError):
    title = "request too large"
    http_status = 413


class ClientLeft(Cancelled):
    """The client closed its connection before the reply (mid-body or mid-generation): the
    work stops, nothing is sent, and it is counted as nginx's 499 "client closed request"."""

    title = "client left"


_CODES = {**ERROR_CODES, RequestTooLarge: "request_too_large", ModelTooLarge: "model_too_large"}


def is_ollama_path(path: str) -> bool:
    return path.startswith("/api/")


def is_anthropic_path(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
"""Anthropic's error type for each status (its SDK picks the exception by the status)."""


def anthropic_error_type(status: int) -> str:
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def anthropic_client(request: Request) -> bool:
    """Whether the error goes to Anthropic's API's client: its routes, and /v1/models asked
    with Anthropic's version header (its SDK's models.list and models.retrieve)."""
    path = request.url.path
    return is_anthropic_path(path) or (path.startswith("/v1/models")
                                       and "anthropic-version" in request.headers)


def error_body(path: str, status: int, message: str, code: str | None = None, *,
               anthropic: bool = False) -> dict[str, Any]:
    """The error shape of the API a path belongs to (Anthropic's also where ``anthropic``)."""
    if is_ollama_path(path):
        return {"error": message}
    if anthropic or is_anthropic_path(path):
        return {"type": "error", "error": {"type": anthropic_error_type(status),
                                           "message": message}}
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


DAEMON_TOKEN = (" The daemon reads HF_TOKEN from the environment it was started in (set it"
                " there, then restart `localinfer serve`), or the token `hf auth login` saved"
                " (read at each request).")


def message_of(exc: LocalInferError) -> str:
    """An error's message as the daemon says it: one that asks to set HF_TOKEN says where the
    daemon reads it (a user sets it in a shell the running daemon never sees)."""
    return exc.message + DAEMON_TOKEN if "set HF_TOKEN" in exc.message else exc.message


def error_response(path: str, exc: Exception, *, anthropic: bool = False) -> JSONResponse:
    if isinstance(exc, LocalInferError):
        status = http_status(exc)
        code = _CODES.get(type(exc))
        if code is None and status >= 500:
            code = "server_error"
        headers = {"Retry-After": "2"} if isinstance(exc, Busy) else None
        if isinstance(exc, Busy) and is_anthropic_path(path):
            status = 529  # Anthropic's "overloaded" (its SDK's OverloadedError), retried
        body = error_body(path, status, message_of(exc), code, anthropic=anthropic)
        if path.startswith("/localinfer/"):  # localinfer's own client rebuilds the error
            body["error"] |= error_json(exc) | {"message": message_of(exc)}
        return JSONResponse(body, status, headers=headers)
    if isinstance(exc, HTTPException):
        message = exc.detail if isinstance(exc.detail, str) else "HTTP error"
        if exc.status_code == 404:
            message = f"no such endpoint: {path}"
            if "//" in path:
                message += (" (the path has an empty segment: does the client's base URL end"
                            " with a slash?)")
        return JSONResponse(error_body(path, exc.status_code, message, anthropic=anthropic),
                            exc.status_code)
    log.exception("unhandled error on %s", path)
    return JSONResponse(error_body(path, 500, f"internal error: {type(exc).__name__}: {exc}",
                                   "internal_error"), 500)


def stream_failure(path: str, exc: Exception) -> tuple[int, str, str | None]:
    """The status, message and code of an error raised after a stream's headers were sent
    (reported as the stream's last event); an unexpected one is logged."""
    if isinstance(exc, LocalInferError):
        return http_status(exc), message_of(exc), _CODES.get(type(exc))
    log.exception("error mid-stream on %s", path)
    return 500, f"internal error: {type(exc).__name__}: {exc}", "internal_error"


def stream_error_body(path: str, exc: Exception) -> dict[str, Any]:
    """The error event of a stream whose headers are sent, in the path's API shape."""
    return error_body(path, *stream_failure(path, exc))


async def handle_error(request: Request, exc: Exception) -> Response:
    """Starlette's exception handler, for what happens outside a guarded route (a 404, a
    wrong method)."""
    return error_response(request.url.path, exc, anthropic=anthropic_client(request))


def guarded(state: DaemonState, name: str,
            handler: Callable[[Request], Awaitable[Response]]) -> Callable:
    """Wrap a route: count it for /metrics, keep the daemon awake, and turn any error into a
    JSON response in the route's API shape (never a traceback, never a dead daemon)."""

    async def endpoint(request: Request) -> Response:
        state.touch()
        try:
            response = await handler(request)
        except (ClientLeft, ClientDisconnect):
            # Not an error of the daemon's: counted and logged quietly. The 499 is never
            # sent (nobody listens); the server drops it.
            log.info("%s %s: the client left before the reply", request.method,
                     request.url.path)
            state.counters.count(name, ClientLeft.http_status)
            state.counters.client_left(name)
            return Response(status_code=ClientLeft.http_status)
        except Exception as exc:
            response = error_response(request.url.path, exc,
                                      anthropic=anthropic_client(request))
        state.counters.count(name, response.status_code)
        if hasattr(response, "on_client_left"):  # a stream (bridge.BridgeResponse)
            response.on_client_left = lambda: state.counters.client_left(name)
        return response

    return endpoint
