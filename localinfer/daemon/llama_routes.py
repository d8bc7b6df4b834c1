"""llama-server's routes that editor plugins use: ``/infill`` (llama.vscode's and llama.vim's
autocomplete), with its request and response shapes.

The request: ``input_prefix``, ``input_suffix``, ``input_extra`` (files as ``[{filename,
text}]``, repo-level context), ``prompt`` (text typed at the cursor), ``n_predict``,
``t_max_predict_ms``, ``n_indent``, the samplers, ``grammar`` or ``json_schema``,
``stream``, ``response_fields`` (llama.vim: only those fields of the final reply); ``model`` is
optional (llama-server serves one model): without it the most recently used loaded model with
FIM tokens answers, else the configured default model. The reply is llama-server's completion
object (``content``, ``stop``, ``stop_type``, ``tokens_predicted``, ``tokens_evaluated``,
``tokens_cached``, ``timings`` with ``prompt_n``/``predicted_per_second``...), or with
``stream`` its server-sent events, one per piece of text, the last with ``stop: true``.

llama.vscode always sends ``t_max_prompt_ms``, which llama-server reads but does not enforce;
it is accepted here likewise. Its ``samplers`` list turns off the samplers it leaves out (as in
llama.cpp, a missing ``temperature`` means 1); the ``infill`` sampler it names is accepted and
not applied: the standard chain samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InvalidRequest
from ..protocol import json_line
from ..runtime.engine import Engine
from ..runtime.fim import FimFile
from ..runtime.types import DEFAULT_SAMPLING, Done, Priority, SamplingParams, Token
from .autocomplete import autocomplete_params, autocomplete_priority
from .bridge import BridgeResponse, start_generation, whole_replies, whole_reply
from .error_replies import guarded, stream_error_body
from .fields import audit
from .requests import Fields, read_json, sampling
from .state import DaemonState
from .structured import LLAMA_OUTPUT_FIELDS, output_grammar

SAMPLER_NAMES = frozenset({"top_k", "top_p", "min_p", "temperature", "penalties", "infill"})


def routes(state: DaemonState) -> list[Route]:
    async def infill(request: Request) -> Response:
        body = await read_json(request)
        audit("/infill", body)
        f = Fields(body)
        prefix = f.string("input_prefix", "")
        suffix = f.string("input_suffix", "")
        typed = f.string("prompt", "")
        extra = _extra(body.get("input_extra"))
        f.number("t_max_prompt_ms", None)  # read, not enforced (as llama-server)
        fields = _response_fields(body.get("response_fields"))
        streamed = f.boolean("stream", False)  # read before the generation starts: a bad value
        # after it would leave the lease held and the generation running
        copies = _copies(f)
        if streamed and copies > 1:
            raise InvalidRequest("'n_cmpl' above 1 is answered whole: send 'stream': false"
                                 " (as llama.vscode does), or ask one completion per stream.")
        name = f.string("model", None) or _default_model(state)
        # n_predict 0 (llama.vscode's and llama.vim's request that reads new context into
        # the cache ahead of the next completion): the prompt is read, nothing is predicted.
        warm_only = f.integer("n_predict", None) == 0
        if warm_only and copies > 1:
            raise InvalidRequest("'n_predict': 0 reads the prompt into the cache and predicts"
                                 " nothing: send 'n_cmpl': 1 with it.")
        params = dataclasses.replace(_params(f),
                                     grammar=output_grammar(body, LLAMA_OUTPUT_FIELDS)[0])
        params = autocomplete_params(params, request, name, prefix)
        priority = autocomplete_priority(request, body)
        if warm_only:
            params = dataclasses.replace(params, max_tokens=1)
            if "priority" not in body and "x-localinfer-priority" not in request.headers:
                priority = Priority.BACKGROUND  # no one waits for it

        def encode(engine: Engine) -> list[int]:
            if copies > engine.info.n_slots:  # llama-server's words, which llama.vscode reads
                raise InvalidRequest(f"Field 'n_cmpl': Value must be between 1 <= value <="
                                     f" {engine.info.n_slots}, but got {copies}")
            return engine.infill_tokens(prefix, suffix, prompt=typed, extra=extra,
                                        n_predict=params.max_tokens)

        entry, events, stack = await start_generation(
            state.manager, name, encode, params, priority, copies=copies)
        model = entry.name
        if warm_only:
            done = await whole_reply(state, request, events, stack)
            final = _only(fields, _final(done, model, "", predicted=False))
            return Response(_sse(final), media_type="text/event-stream") if streamed \
                else JSONResponse(final)
        if copies > 1:  # an array, as llama-server answers n_cmpl
            dones = await whole_replies(state, request, events, stack)
            return JSONResponse([_only(fields, _final(done, model, done.text, index=i))
                                 for i, done in enumerate(dones)])
        if not streamed:
            done = await whole_reply(state, request, events, stack)
            return JSONResponse(_only(fields, _final(done, model, done.text)))

        async def stream() -> AsyncIterator[str]:
            try:
                n = 0
                async for event in events:
                    if isinstance(event, Token):
                        n = event.live.n_tokens
                        yield _sse({"index": 0, "content": event.text, "tokens": [],
                                    "stop": False, "id_slot": -1, "tokens_predicted": n,
                                    "model": model})
                        continue
                    state.record(event)
                    yield _sse(_only(fields, _final(event, model, "")))
            except Exception as exc:  # headers are sent: report the error in the stream
                yield _sse(stream_error_body(request.url.path, exc))

        return BridgeResponse(stream(), events, media_type="text/event-stream",
                              on_close=stack.aclose)

    return [Route("/infill", guarded(state, "infill", infill), methods=["POST"])]


def _extra(value: Any) -> list[FimFile]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest("'input_extra' must be a list of {filename, text} objects.")
    files = []
    for i, item in enumerate(value):
        f = Fields(item, f"input_extra[{i}].")
        files.append(FimFile(filename=f.string("filename", "tmp"), text=f.string("text", "")))
    return files


def _response_fields(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise InvalidRequest("'response_fields' must be a list of field paths like"
                             " \"timings/prompt_n\".")
    return value


def _only(paths: list[str], reply: dict[str, Any]) -> dict[str, Any]:
    """llama-server's ``response_fields``: only these fields of the final reply, each under
    its path ("timings/prompt_n"); a path the reply lacks is left out."""
    if not paths:
        return reply
    out = {}
    for path in paths:
        value: Any = reply
        for key in path.split("/"):
            value = value.get(key, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is not _ABSENT:
            out[path] = value
    return out


_ABSENT = object()


def _default_model(state: DaemonState) -> str:
    manager = state.manager
    with_fim = [e for e in manager.loaded.values() if e.engine.info.fim is not None]
    if with_fim:
        return max(with_fim, key=lambda e: e.last_used).name
    if manager.config.default_model:
        return manager.config.default_model
    raise InvalidRequest("/infill needs a model: send 'model' (a code model with"
                         " fill-in-the-middle tokens, e.g. qwen2.5-coder:1.5b), load one, or"
                         " set default_model in config.toml.")


def _copies(f: Fields) -> int:
    """How many completions of the prompt: ``n_cmpl``, or its alias ``n`` (llama-server's)."""
    copies: int = f.integer("n_cmpl", None, low=1)
    return copies if copies is not None else f.integer("n", 1, low=1)


def _params(f: Fields) -> SamplingParams:
    n_predict = f.integer("n_predict", None)
    if n_predict is None:
        n_predict = f.integer("max_tokens", None)
    if n_predict == 0:
        n_predict = None  # the caller reads the prompt only (``warm_only``)
    defaults = DEFAULT_SAMPLING
    samplers = f.data.get("samplers")
    if samplers is not None:
        if not isinstance(samplers, list) or not all(isinstance(s, str) for s in samplers):
            raise InvalidRequest("'samplers' must be a list of sampler names.")
        unknown = sorted(set(samplers) - SAMPLER_NAMES)
        if unknown:
            raise InvalidRequest(f"sampler {unknown[0]!r} is not supported (use"
                                 f" {', '.join(sorted(SAMPLER_NAMES))}).")
        # As in llama.cpp, a sampler left out of the list does not run.
        defaults = SamplingParams(
            top_k=defaults.top_k if "top_k" in samplers else 0,
            top_p=defaults.top_p if "top_p" in samplers else 1.0,
            min_p=defaults.min_p if "min_p" in samplers else 0.0,
            temperature=defaults.temperature if "temperature" in samplers else 1.0)
    params = sampling(f, max_tokens=None if n_predict is None or n_predict < 0 else n_predict,
                      defaults=defaults)
    t_max = f.number("t_max_predict_ms", None)
    return dataclasses.replace(params, t_max_predict_ms=t_max if t_max and t_max > 0 else None,
                               n_indent=f.integer("n_indent", 0, low=0)).validate()


def _final(done: Done, model: str, content: str, *, index: int = 0, predicted: bool = True
           ) -> dict[str, Any]:
    """llama-server's final completion object; ``predicted`` False for a request that only
    read its prompt (n_predict 0), whose one sampled token is not part of the reply."""
    t = done.timings
    n = t.completion_tokens if predicted else 0
    stop_type = {"stop": "eos", "length": "limit"}.get(done.finish_reason, "none")
    if not predicted and done.finish_reason != "cancelled":
        stop_type = "limit"
    return {
        "index": index, "content": content, "tokens": [], "id_slot": -1, "stop": True,
        "model": model, "tokens_predicted": n,
        "tokens_evaluated": t.prompt_tokens, "tokens_cached": t.cached_tokens,
        "truncated": False, "has_new_line": predicted and "\n" in done.text, "stop_type": stop_type,
        "stopping_word": "", "superseded": done.finish_reason == "cancelled",
        "timings": {
            "prompt_n": t.prefill_tokens, "prompt_ms": t.prefill_ms,
            "prompt_per_token_ms": t.prefill_ms / t.prefill_tokens if t.prefill_tokens else 0.0,
            "prompt_per_second": t.prefill_tps, "predicted_n": n,
            "predicted_ms": t.decode_ms if predicted else 0.0,
            "predicted_per_token_ms": t.decode_ms / t.decode_tokens if t.decode_tokens else 0.0,
            "predicted_per_second": t.decode_tps, "cache_n": t.cached_tokens,
        },
    }


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json_line(obj)}\n\n"
