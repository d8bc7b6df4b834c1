"""The daemon's HTTP application, assembled: localinfer's own routes, OpenAI's (/v1, with
the Responses API), Anthropic's (/v1/messages) and Ollama's (/api), behind the guard
(guard.py), with every error
answered in its API's shape (error_replies.py). ``create_app(state)`` builds it around a
``DaemonState`` (state.py)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from ..errors import LocalInferError
from . import (
    anthropic_routes,
    embedding_routes,
    llama_routes,
    native_routes,
    ollama_routes,
    openai_routes,
    preset_routes,
    responses_routes,
)
from .error_replies import handle_error
from .guard import Guard, LocalCORS
from .state import DaemonState


def create_app(state: DaemonState) -> Starlette:
    routes = [*native_routes.routes(state), *openai_routes.routes(state),
              *anthropic_routes.routes(state), *responses_routes.routes(state),
              *ollama_routes.routes(state), *embedding_routes.routes(state),
              *llama_routes.routes(state), *preset_routes.routes(state)]
    # CORS outside the guard: its own refusals (a wrong API key, a body too large) reach a
    # page it let through with the headers that let the page read them.
    middleware = [Middleware(LocalCORS, cors_origins=tuple(state.settings.cors_origins)),
                  Middleware(Guard, settings=state.settings)]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={Exception: handle_error, HTTPException: handle_error,
                            LocalInferError: handle_error},
    )
    app.state.daemon = state
    return app
