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
it is accepted here likewise. ``n_predict`` (0: read the prompt only) and ``samplers`` are read
as on the OpenAI routes (llama_fields.py).

llama.vscode also asks llama-server's ``/props`` (the context size it budgets prompts by;
``model`` and ``autoload`` in the query, as its router mode takes them), ``/apply-template``
(the chat prompt as the model's template renders it) and ``/tokenize`` (that prompt's exact
token count); ``/detokenize`` comes with them. Each answers in llama-server's shape.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..errors import InvalidRequest
from ..protocol import json_line
from ..runtime.engine import Engine
from ..runtime.fim import FimFile
from ..runtime.types import DEFAULT_SAMPLING, Done, ModelInfo, Priority, SamplingParams, Token
from .autocomplete import autocomplete_params, autocomplete_priority
from .bridge import BridgeResponse, Choices, merged, start_generation, whole_replies, whole_reply
from .error_replies import guarded, stream_error_body
from .fields import audit
from .llama_fields import (
    completion_prompt,
    default_model,
    llama_sampling,
    n_predict,
    prompt_encoder,
    prompt_only,
    prompt_only_priority,
    within_slots,
)
from .reasoning_fields import openai_think
from .requests import Fields, parse_messages, priority_of, read_json
from .state import DaemonState
from .structured import LLAMA_OUTPUT_FIELDS, openai_constraints, output_grammar


def routes(state: DaemonState) -> list[Route]:
    async def infill(request: Request) -> Response:
        body = await read_json(request)
        audit("/infill", body)
        f = Fields(body)
        prefix = f.string("input_prefix", "")
        suffix = f.string("input_suffix", "")
        typed = f.string("prompt", None)  # None: the prefix runs to the cursor
        extra = _extra(body.get("input_extra"))
        f.number("t_max_prompt_ms", None)  # read, not enforced (as llama-server)
        asked = _Asked.read(body, f)
        name = f.string("model", None) or default_model(state, "/infill", fim=True)
        params = autocomplete_params(asked.params, request, name, prefix, suffix)
        priority = asked.priority(request, body, autocomplete_priority(request, body))

        def encode(engine: Engine) -> list[int]:
            return engine.infill_tokens(prefix, suffix, prompt=typed, extra=extra,
                                        n_predict=params.max_tokens)

        return await _answer(state, request, name, encode, params, priority, asked)

    async def completion(request: Request) -> Response:
        """llama-server's own completion route: a prompt (text, or token ids) continued."""
        body = await read_json(request)
        audit("/completion", body)
        f = Fields(body)
        prompt = completion_prompt(body.get("prompt"))
        asked = _Asked.read(body, f)
        name = f.string("model", None) or default_model(state, "/completion")
        priority = asked.priority(request, body, priority_of(request, body))
        return await _answer(state, request, name, prompt_encoder(prompt), asked.params,
                             priority, asked)

    async def tokenize(request: Request) -> Response:
        body = await read_json(request)
        audit("/tokenize", body)
        f = Fields(body)
        content = body.get("content", "")
        if not isinstance(content, str):
            raise InvalidRequest("'content' must be a string (the text to tokenize).")
        add_special = f.boolean("add_special", False)
        with_pieces = f.boolean("with_pieces", False)
        name = f.string("model", None) or default_model(state, "/tokenize")
        async with state.manager.lease(name) as entry:
            engine = entry.engine

            def spell() -> list[Any]:
                tokens = engine.tokenize(content, add_special=add_special)
                if not with_pieces:
                    return tokens
                return [{"id": t, "piece": _piece(engine.piece(t))} for t in tokens]
            tokens = await asyncio.to_thread(spell)
        return JSONResponse({"tokens": tokens})

    async def detokenize(request: Request) -> Response:
        body = await read_json(request)
        audit("/detokenize", body)
        tokens = body.get("tokens", [])
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise InvalidRequest("'tokens' must be a list of token ids.")
        name = Fields(body).string("model", None) or default_model(state, "/detokenize")
        async with state.manager.lease(name) as entry:
            engine = entry.engine
            text = await asyncio.to_thread(
                lambda: b"".join(engine.piece(t) for t in tokens).decode("utf-8", "replace"))
        return JSONResponse({"content": text})

    async def apply_template(request: Request) -> Response:
        body = await read_json(request)
        audit("/apply-template", body)
        name = Fields(body).string("model", None) or default_model(state, "/apply-template")
        messages = await state.manager.with_preset(name, parse_messages(body.get("messages")))
        thinking = openai_think(body.get("reasoning_effort"), body.get("chat_template_kwargs"))
        # The prompt only: tools are rendered; the output format, applied while generating,
        # is not part of it.
        constraints = openai_constraints({k: v for k, v in body.items()
                                          if k in ("tools", "tool_choice", "parallel_tool_calls")})
        render = constraints.renderer(messages, thinking)
        async with state.manager.lease(name) as entry:
            prompt = await asyncio.to_thread(render, entry.engine)
        return JSONResponse({"prompt": prompt})

    async def props(request: Request) -> Response:
        query = dict(request.query_params)
        unknown = sorted(set(query) - {"model", "autoload"})
        if unknown:
            raise InvalidRequest(f"'{unknown[0]}' is not a parameter of /props (it takes"
                                 " 'model' and 'autoload').")
        autoload = query.get("autoload", "true")
        if autoload not in ("true", "false"):
            raise InvalidRequest("'autoload' must be true or false.")
        name = query.get("model") or default_model(state, "/props")
        if autoload == "false":
            resolved = (await state.manager.resolve(name)).name
            if resolved not in state.manager.loaded:
                raise InvalidRequest(f"model {resolved!r} is not loaded, and autoload=false"
                                     " asks not to load it: load it first (any request to"
                                     " it does) or leave autoload out.")
        async with state.manager.lease(name) as entry:
            info = entry.engine.info
            template = entry.engine.chat_template_source
        return JSONResponse(_props(entry.name, info, template))

    return [Route("/infill", guarded(state, "infill", infill), methods=["POST"]),
            Route("/completion", guarded(state, "completion", completion), methods=["POST"]),
            Route("/completions", guarded(state, "completion", completion), methods=["POST"]),
            Route("/tokenize", guarded(state, "tokenize", tokenize), methods=["POST"]),
            Route("/detokenize", guarded(state, "detokenize", detokenize), methods=["POST"]),
            Route("/apply-template", guarded(state, "apply-template", apply_template),
                  methods=["POST"]),
            Route("/props", guarded(state, "props", props), methods=["GET"])]


@dataclass(frozen=True)
class _Asked:
    """What an ``/infill`` or ``/completion`` request asks of its reply, read (and checked)
    before the generation starts: a bad value after it would leave the lease held and the
    generation running."""

    fields: list[str]
    """``response_fields``: only these of the final reply (none: all)."""
    streamed: bool
    copies: int
    """``n_cmpl``: completions of the prompt."""
    read_only: bool
    """``n_predict`` 0 (llama.vscode's and llama.vim's request that reads new context into
    the cache ahead of the next completion): the prompt is read, nothing is predicted."""
    params: SamplingParams

    @staticmethod
    def read(body: dict[str, Any], f: Fields) -> _Asked:
        fields = _response_fields(body.get("response_fields"))
        streamed = f.boolean("stream", False)
        copies = _copies(f)
        predict = n_predict(f, f.integer("max_tokens", None, low=-1))
        if predict == 0 and copies > 1:
            raise InvalidRequest("'n_predict': 0 reads the prompt into the cache and predicts"
                                 " nothing: send 'n_cmpl': 1 with it.")
        params = dataclasses.replace(_params(f, predict),
                                     grammar=output_grammar(body, LLAMA_OUTPUT_FIELDS)[0])
        return _Asked(fields, streamed, copies, predict == 0, params)

    def priority(self, request: Request, body: dict[str, Any], usual: Priority) -> Priority:
        return prompt_only_priority(request, body, usual) if self.read_only else usual


async def _answer(state: DaemonState, request: Request, name: str,
                  encode: Callable[[Engine], list[int]], params: SamplingParams,
                  priority: Priority, asked: _Asked) -> Response:
    """Generate for ``/infill`` or ``/completion`` and answer as llama-server does: its
    completion object (an array of them for ``n_cmpl`` above 1), or its server-sent events."""
    fields, streamed, copies = asked.fields, asked.streamed, asked.copies
    # Above the slots, llama-server's words, which llama.vscode reads to name its setting.
    encoded = within_slots(copies, encode, lambda n: (
        f"Field 'n_cmpl': Value must be between 1 <= value <= {n}, but got {copies}"))
    entry, events, stack = await start_generation(
        state.manager, name, encoded, params, priority, copies=copies)
    model = entry.name
    settings = {"n_ctx": entry.engine.info.n_ctx, **_sampling(params)}
    if asked.read_only:
        done = await whole_reply(state, request, events, stack)
        final = _only(fields, _final(prompt_only(done), model, "", settings))
        return Response(_sse(final), media_type="text/event-stream") if streamed \
            else JSONResponse(final)
    if not streamed:  # with n_cmpl above 1 an array, as llama-server answers it
        replies = [_only(fields, _final(done, model, done.text, settings, index=i)) for i, done
                   in enumerate(await whole_replies(state, request, events, stack))]
        return JSONResponse(replies if copies > 1 else replies[0])

    choices = Choices(events)

    async def stream() -> AsyncIterator[str]:
        # With n_cmpl above 1 the completions' events interleave, each with its ``index``.
        try:
            async for index, event in merged(choices.streams):
                if isinstance(event, Token):
                    yield _sse({"index": index, "content": event.text, "tokens": [],
                                "stop": False, "id_slot": -1,
                                "tokens_predicted": event.live.n_tokens,
                                "tokens_evaluated": event.live.prompt_tokens, "model": model})
                    continue
                state.record(event)
                if event.finish_reason == "cancelled" and state.shutting_down:
                    raise state.cut_off(event)  # not a superseded keystroke's end
                yield _sse(_only(fields, _final(event, model, "", settings, index=index)))
        except Exception as exc:  # headers are sent: report the error in the stream
            yield _sse(stream_error_body(request.url.path, exc))

    return BridgeResponse(stream(), choices, media_type="text/event-stream",
                          on_close=stack.aclose)


def _piece(piece: bytes) -> str | list[int]:
    """A token's piece as llama-server's ``with_pieces`` gives it: the text where it is whole
    UTF-8, else its bytes (a piece of a character)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def _props(name: str, info: ModelInfo, template: str) -> dict[str, Any]:
    """llama-server's ``/props``: the context each slot has (what editors budget prompts by),
    the slots, the model and its template, the default sampling."""
    # A request without a cap runs to the context's end.
    params = _sampling(dataclasses.replace(DEFAULT_SAMPLING, max_tokens=None))
    return {
        "default_generation_settings": {"n_ctx": info.n_ctx, "params": params},
        "total_slots": info.n_slots, "model_alias": name, "model_path": info.path,
        "chat_template": template, "bos_token": info.bos_text, "eos_token": info.eos_text,
        "modalities": {"vision": False, "audio": False},
        "build_info": f"localinfer {__version__}",
    }


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


def _copies(f: Fields) -> int:
    """How many completions of the prompt: ``n_cmpl``, or its alias ``n`` (llama-server's)."""
    copies: int = f.integer("n_cmpl", None, low=1)
    return copies if copies is not None else f.integer("n", 1, low=1)


def _params(f: Fields, predict: int | None) -> SamplingParams:
    params = llama_sampling(f, predict)
    t_max = f.number("t_max_predict_ms", None)
    return dataclasses.replace(params, t_max_predict_ms=t_max if t_max and t_max > 0 else None,
                               n_indent=f.integer("n_indent", 0, low=0)).validate()


def _final(done: Done, model: str, content: str, settings: dict[str, Any], *, index: int = 0
           ) -> dict[str, Any]:
    """llama-server's final completion object; ``settings`` its ``generation_settings``: the
    slot's context (llama.vscode's status line shows ``tokens_cached`` of ``n_ctx``, and fails
    without this object) and the sampling (``_sampling``)."""
    t = done.timings
    n = t.completion_tokens
    # As llama-server: "word" for a stop string met (and which), "eos" for the model's end.
    stop_type = {"stop": "word" if done.stop_sequence else "eos", "length": "limit"}.get(
        done.finish_reason, "none")
    return {
        "index": index, "content": content, "tokens": [], "id_slot": -1, "stop": True,
        "model": model, "tokens_predicted": n, "generation_settings": settings,
        # llama-server's tokens_cached: what the slot's cache holds after the reply (its
        # last token is sampled, not read), which llama.vscode shows of n_ctx.
        "tokens_evaluated": t.prompt_tokens, "tokens_cached": t.prompt_tokens + max(0, n - 1),
        "truncated": False, "has_new_line": "\n" in done.text, "stop_type": stop_type,
        "stopping_word": done.stop_sequence if done.finish_reason == "stop" else "",
        "superseded": done.finish_reason == "cancelled",
        "timings": {
            "prompt_n": t.prefill_tokens, "prompt_ms": t.prefill_ms,
            "prompt_per_token_ms": t.prefill_ms / t.prefill_tokens if t.prefill_tokens else 0.0,
            "prompt_per_second": t.prefill_tps, "predicted_n": n,
            "predicted_ms": t.decode_ms,
            "predicted_per_token_ms": t.decode_ms / t.decode_tokens if t.decode_tokens else 0.0,
            "predicted_per_second": t.decode_tps, "cache_n": t.cached_tokens,
        },
    }


def _sampling(params: SamplingParams) -> dict[str, Any]:
    """A request's sampling as llama-server reports it (``generation_settings``, ``/props``)."""
    return {"n_predict": -1 if params.max_tokens is None else params.max_tokens,
            "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "min_p": params.min_p, "typical_p": params.typical_p,
            "repeat_penalty": params.repeat_penalty, "repeat_last_n": params.repeat_last_n,
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
            "seed": 0xFFFFFFFF if params.seed is None else params.seed,  # llama-server's random
            "stop": list(params.stop), "n_indent": params.n_indent,
            "t_max_predict_ms": params.t_max_predict_ms or -1}


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json_line(obj)}\n\n"
