"""Embedding and reranking routes: Ollama's ``/api/embed`` (and its legacy
``/api/embeddings``), OpenAI's ``/v1/embeddings``, and llama-server's ``/v1/rerank`` (also
``/rerank``, ``/v1/reranking``) on a reranker: ``query`` and ``documents`` in, ``results``
(``index``, ``relevance_score``: the model's raw score, higher is more relevant) out, sorted,
cut to ``top_n``, each with its ``document`` text when ``return_documents`` is true. They
only translate: the engine tokenizes, batches the inputs into shared decodes and pools
(runtime/engine.py ``embed`` and ``rank``).

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

from ..errors import ContextOverflow, InvalidRequest
from ..runtime.types import Embeddings, normalized
from .error_replies import guarded
from .fields import audit
from .llama_fields import used_last
from .requests import Fields, parse_keep_alive, read_json
from .state import DaemonState

MAX_INPUTS = 2048
"""The most inputs one request may embed (OpenAI's limit)."""

EmbedInput = str | list[int]

MAX_DOCUMENTS = 1000
"""The most documents one rerank request may score (each is a whole pass of the reranker:
a bounded request keeps the daemon answering others)."""


def _only_reranker(state: DaemonState) -> str:
    """The model a rerank request without ``model`` means: the one reranker loaded."""
    rerankers = [e.name for e in state.manager.loaded.values() if e.engine.info.reranker]
    if len(rerankers) != 1:
        raise InvalidRequest("'model' is required: name the reranker (e.g. bge-reranker-v2-m3).")
    return rerankers[0]


def _loaded_embedder(state: DaemonState) -> str:
    """The model an OpenAI embeddings request without ``model`` means (llama-server serves
    one model; llama.vscode leaves ``model`` out unless one is set): the embedding model
    loaded and used last."""
    name = used_last(state, lambda info: info.embedding_only)
    if name is None:
        raise InvalidRequest("'model' is required: name the embedding model (e.g."
                             " nomic-embed-text:137m), or load one first.")
    return name


def routes(state: DaemonState) -> list[Route]:
    async def api_embed(request: Request) -> Response:
        body = await read_json(request)
        audit("/api/embed", body)
        f = Fields(body)
        name = f.string("model")
        raw = body.get("input")
        inputs: list[EmbedInput] = [] if raw is None or raw == "" else _strings(raw, "input")
        dimensions = f.integer("dimensions", None, low=1)
        truncate = f.boolean("truncate", True)
        try:
            _, result, load_ms = await _embed(state, name, inputs, f, truncate=truncate)
        except ContextOverflow as exc:  # truncate: false, which this route can turn on
            raise ContextOverflow(f"{exc.message.removesuffix('.')}; or leave out"
                                  " truncate: false to cut it.", n_prompt=exc.n_prompt,
                                  n_ctx=exc.n_ctx) from None
        ns = 1_000_000
        return JSONResponse({
            "model": name,  # as asked, as Ollama echoes it (and /api/generate here)
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
        name = f.string("model", None) or _loaded_embedder(state)
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

    async def rerank(request: Request) -> Response:
        body = await read_json(request)
        audit("/v1/rerank and /rerank", body)
        f = Fields(body)
        name = f.string("model", None) or _only_reranker(state)
        query = f.string("query")
        documents = body.get("documents")
        if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
            raise InvalidRequest("'documents' must be a list of strings.")
        if len(documents) > MAX_DOCUMENTS:
            raise InvalidRequest(f"at most {MAX_DOCUMENTS} documents per request, got"
                                 f" {len(documents)}: rank them in several requests.")
        top_n = f.integer("top_n", None, low=1)
        with_text = f.boolean("return_documents", False)
        async with state.manager.lease(name) as entry:
            engine = entry.engine
            ranking = await asyncio.to_thread(engine.rank, query, documents)
        order = sorted(range(len(documents)), key=lambda i: -ranking.scores[i])
        results = []
        for i in order[:top_n]:
            item: dict[str, Any] = {"index": i, "relevance_score": ranking.scores[i]}
            if with_text:
                item["document"] = documents[i]  # llama-server's shape: the text itself
            results.append(item)
        return JSONResponse({
            "model": entry.name, "object": "list",
            "usage": {"prompt_tokens": ranking.prompt_tokens,
                      "total_tokens": ranking.prompt_tokens},
            "results": results,
        })

    return [
        Route("/v1/rerank", guarded(state, "v1/rerank", rerank), methods=["POST"]),
        Route("/rerank", guarded(state, "rerank", rerank), methods=["POST"]),
        Route("/v1/reranking", guarded(state, "v1/rerank", rerank), methods=["POST"]),
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
        if engine.info.reranker:
            raise InvalidRequest(f"{entry.name} is a reranker: it scores (query, document)"
                                 " pairs and makes no embeddings. Use /v1/rerank.")

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
