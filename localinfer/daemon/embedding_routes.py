"""Embedding routes: Ollama's ``/api/embed`` (and its legacy ``/api/embeddings``) and OpenAI's
``/v1/embeddings``. They only translate: the engine tokenizes, batches the inputs into shared
decodes and pools (runtime/engine.py ``embed``).

``/api/embed`` and ``/v1/embeddings`` return unit vectors (L2-normalised, as Ollama and
llama-server do), cut first to ``dimensions`` when asked; the legacy ``/api/embeddings`` returns
the pooled vector as it is, as Ollama's does. An input longer than the model embeds at once is
cut when ``truncate`` is true (Ollama's default) and refused with a 400 otherwise (OpenAI's
route always refuses, as OpenAI does).
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InvalidRequest
from ..runtime.types import Embeddings, normalized
from .error_replies import guarded
from .fields import audit
from .requests import Fields, parse_keep_alive, read_json
from .state import DaemonState

MAX_INPUTS = 2048
"""The most inputs one request may embed (OpenAI's limit)."""

EmbedInput = str | list[int]


def routes(state: DaemonState) -> list[Route]:
    async def api_embed(request: Request) -> Response:
        body = await read_json(request)
        audit("/api/embed", body)
        f = Fields(body)
        name = f.string("model")
        raw = body.get("input")
        inputs: list[EmbedInput] = [] if raw is None or raw == "" else _strings(raw, "input")
        dimensions = f.integer("dimensions", None, low=1)
        model, result, load_ms = await _embed(state, name, inputs, f,
                                               truncate=f.boolean("truncate", True))
        ns = 1_000_000
        return JSONResponse({
            "model": model,
            "embeddings": [normalized(v, _dimensions(v, dimensions)) for v in result.vectors],
            "total_duration": int((result.total_ms + load_ms) * ns),
            "load_duration": int(load_ms * ns),
            "prompt_eval_count": result.prompt_tokens,
        })

    async def api_embeddings(request: Request) -> Response:
        body = await read_json(request)
        audit("/api/embeddings", body)
        f = Fields(body)
        name = f.string("model")
        prompt = f.string("prompt", "")
        model, result, _ = await _embed(state, name, [prompt] if prompt else [], f,
                                        truncate=True)
        return JSONResponse({"embedding": result.vectors[0] if result.vectors else []})

    async def v1_embeddings(request: Request) -> Response:
        body = await read_json(request)
        audit("/v1/embeddings", body)
        f = Fields(body)
        name = f.string("model")
        inputs = _openai_inputs(body.get("input"))
        encoding = f.string("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise InvalidRequest(f"'encoding_format' must be \"float\" or \"base64\", got"
                                 f" {encoding!r}.")
        dimensions = f.integer("dimensions", None, low=1)
        model, result, _ = await _embed(state, name, inputs, f, truncate=False)
        data = []
        for i, vector in enumerate(result.vectors):
            unit = normalized(vector, _dimensions(vector, dimensions))
            data.append({"object": "embedding", "index": i,
                         "embedding": _base64(unit) if encoding == "base64" else unit})
        return JSONResponse({
            "object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": result.prompt_tokens,
                      "total_tokens": result.prompt_tokens},
        })

    return [
        Route("/api/embed", guarded(state, "api/embed", api_embed), methods=["POST"]),
        Route("/api/embeddings", guarded(state, "api/embeddings", api_embeddings),
              methods=["POST"]),
        Route("/v1/embeddings", guarded(state, "v1/embeddings", v1_embeddings),
              methods=["POST"]),
    ]


async def _embed(state: DaemonState, name: str, inputs: list[EmbedInput], f: Fields, *,
                 truncate: bool) -> tuple[str, Embeddings, float]:
    """Lease the model and embed ``inputs`` (none: only load it, as Ollama does); returns the
    model's name, the vectors and the load time in ms (0 when it was loaded already)."""
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequest(f"at most {MAX_INPUTS} inputs per request, got {len(inputs)}.")
    options = Fields(f.data.get("options") or {}, "options.")
    num_ctx = options.integer("num_ctx", None, low=1)
    keep_alive = parse_keep_alive(f.data.get("keep_alive"))
    manager = state.manager
    was_loaded = (await manager.resolve(name)).name in manager.loaded
    async with manager.lease(name, keep_alive_s=keep_alive, num_ctx=num_ctx) as entry:
        engine = entry.engine

        def run() -> Embeddings:
            tokens = [engine.embedding_tokens(item, truncate=truncate) if isinstance(item, str)
                      else engine.embedding_input(item, truncate=truncate) for item in inputs]
            if not tokens:
                return Embeddings(vectors=[], prompt_tokens=0, total_ms=0.0)
            return engine.embed(tokens)

        result = await asyncio.to_thread(run)
    return entry.name, result, 0.0 if was_loaded else entry.load_ms


def _strings(value: Any, field: str) -> list[EmbedInput]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise InvalidRequest(f"'{field}' must be a string or a list of strings.")


def _openai_inputs(value: Any) -> list[EmbedInput]:
    """OpenAI's ``input``: a string, a list of strings, a list of token ids, or a list of
    lists of token ids."""
    if isinstance(value, str) or (isinstance(value, list) and value
                                  and all(isinstance(s, str) for s in value)):
        return _strings(value, "input")
    if isinstance(value, list) and value and all(_is_token(t) for t in value):
        return [list(value)]
    if isinstance(value, list) and value and all(
            isinstance(item, list) and item and all(_is_token(t) for t in item)
            for item in value):
        return [list(item) for item in value]
    raise InvalidRequest("'input' must be a non-empty string, a list of strings, a list of"
                         " token ids or a list of lists of token ids.")


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dimensions(vector: list[float], dimensions: int | None) -> int | None:
    if dimensions is not None and dimensions > len(vector):
        raise InvalidRequest(f"'dimensions' is {dimensions} but the model's vectors have"
                             f" {len(vector)}.")
    return dimensions


def _base64(vector: list[float]) -> str:
    """OpenAI's base64 encoding: the little-endian float32 values."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
