"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions.

Shapes follow the OpenAI API so that the official clients and editor plugins work unchanged.
Every chunk also carries a ``timings`` object (tokens so far, live decode tok/s, TTFT, prefill
tok/s) that standard clients ignore; the final chunk carries the request's full timings.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InvalidRequest, LocalInferError
from ..protocol import json_line, live_json, timings_json
from ..runtime.engine import Engine
from ..runtime.types import Done, Priority, SamplingParams, Token
from .bridge import BridgeResponse, start_generation, whole_reply
from .errors import error_body, guarded
from .requests import Fields, parse_messages, priority_of, read_json, sampling
from .state import DaemonState
from .structured import Constraints, openai_call_deltas, openai_calls, openai_constraints


def usage_json(done: Done) -> dict[str, Any]:
    u = done.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def finish_reason(done: Done) -> str:
    return "length" if done.finish_reason == "length" else "stop"


def routes(state: DaemonState) -> list[Route]:
    async def list_models(request: Request) -> Response:
        installed = await asyncio.to_thread(state.manager.store.installed)
        data = [{"id": m.name, "object": "model", "created": int(m.added),
                 "owned_by": "localinfer"} for m in installed]
        return JSONResponse({"object": "list", "data": data})

    async def chat_completions(request: Request) -> Response:
        body = await read_json(request)
        f = Fields(body)
        messages = parse_messages(body.get("messages"))
        constraints = openai_constraints(body)
        return await _generate(state, request, f, constraints.encoder(messages),
                               constraints.sampling(_params(f)), priority_of(request, body),
                               chat=True, constraints=constraints)

    async def completions(request: Request) -> Response:
        body = await read_json(request)
        f = Fields(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise InvalidRequest("'prompt' must be a string (one prompt per request).")
        if body.get("suffix"):
            raise InvalidRequest("'suffix' (fill-in-the-middle) is served by Ollama's"
                                 " /api/generate; /v1/completions takes a prompt only.")
        return await _generate(state, request, f, lambda e: e.completion_tokens(prompt),
                               _params(f), priority_of(request, body), chat=False)

    return [
        Route("/v1/models", guarded(state, "v1/models", list_models), methods=["GET"]),
        Route("/v1/chat/completions", guarded(state, "v1/chat/completions", chat_completions),
              methods=["POST"]),
        Route("/v1/completions", guarded(state, "v1/completions", completions),
              methods=["POST"]),
    ]


def _with_calls(choice: dict[str, Any], constraints: Constraints, done: Done) -> None:
    """Split a reply's tool calls out of its content, in OpenAI's shape."""
    content, calls = constraints.reply(done.text)
    if calls:
        choice["message"] = {"role": "assistant", "content": content or None,
                             "tool_calls": openai_calls(calls)}
        if done.finish_reason != "length":
            choice["finish_reason"] = "tool_calls"


def _params(f: Fields) -> SamplingParams:
    n = f.integer("n", 1)
    if n != 1:
        raise InvalidRequest(f"'n' must be 1 (one choice per request), got {n}.")
    if f.data.get("logprobs"):
        raise InvalidRequest("'logprobs' is not supported.")
    max_tokens = f.integer("max_completion_tokens", None, low=1)
    if max_tokens is None:
        max_tokens = f.integer("max_tokens", None, low=1)
    return sampling(f, max_tokens=max_tokens)


async def _generate(state: DaemonState, request: Request, f: Fields,
                    encode: Callable[[Engine], list[int]],
                    params: SamplingParams | Callable[[Engine], SamplingParams],
                    priority: Priority, *, chat: bool, constraints: Constraints | None = None
                    ) -> Response:
    stream = f.boolean("stream", False)
    options = f.data.get("stream_options") or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    entry, events, stack = await start_generation(state.manager, f.string("model"), encode,
                                                  params, priority)
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    model = entry.name
    if not stream:
        done = await whole_reply(state, request, events, stack)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": done.text},
                      "logprobs": None, "finish_reason": finish_reason(done)}
            if constraints is not None:
                _with_calls(choice, constraints, done)
        else:
            choice = {"index": 0, "text": done.text, "logprobs": None,
                      "finish_reason": finish_reason(done)}
        return JSONResponse({
            "id": ident, "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": model, "choices": [choice],
            "usage": usage_json(done), "timings": timings_json(done.timings),
        })

    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta_text: str | None, reason: str | None, timings: dict,
              tool_calls: list[dict[str, Any]] | None = None) -> str:
        if chat:
            delta: dict[str, Any] = {} if delta_text is None else {"content": delta_text}
            if tool_calls is not None:
                delta = {"tool_calls": tool_calls}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": delta_text or "", "logprobs": None,
                      "finish_reason": reason}
        body = {"id": ident, "object": kind, "created": created, "model": model,
                "choices": [choice], "timings": timings}
        if include_usage:
            body["usage"] = None
        return f"data: {json_line(body)}\n\n"

    async def body() -> AsyncIterator[str]:
        if chat:
            first = {"id": ident, "object": kind, "created": created, "model": model,
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                  "logprobs": None, "finish_reason": None}]}
            if include_usage:
                first["usage"] = None
            yield f"data: {json_line(first)}\n\n"
        splitter = constraints.splitter() if constraints is not None else None
        try:
            async for event in events:
                if isinstance(event, Token):
                    text = splitter.push(event.text) if splitter else event.text
                    if text or splitter is None:
                        yield chunk(text, None, live_json(event.live))
                    continue
                state.record(event)
                if event.finish_reason == "cancelled":
                    raise LocalInferError("the generation was cancelled (the daemon is"
                                          " shutting down or the model was unloaded).")
                reason = finish_reason(event)
                if splitter is not None:
                    rest, calls = splitter.finish(event.text)
                    if rest:
                        yield chunk(rest, None, timings_json(event.timings))
                    for delta in openai_call_deltas(calls):
                        yield chunk(None, None, timings_json(event.timings), tool_calls=delta)
                    reason = "tool_calls" if calls and reason != "length" else reason
                yield chunk(None, reason, timings_json(event.timings))
                if include_usage:
                    tail = {"id": ident, "object": kind, "created": created, "model": model,
                            "choices": [], "usage": usage_json(event)}
                    yield f"data: {json_line(tail)}\n\n"
        except Exception as exc:  # headers are sent: report the error in the stream
            status = exc.http_status if isinstance(exc, LocalInferError) else 500
            message = exc.message if isinstance(exc, LocalInferError) else str(exc)
            yield f"data: {json_line(error_body(request.url.path, status, message))}\n\n"
        yield "data: [DONE]\n\n"

    return BridgeResponse(body(), events, media_type="text/event-stream",
                          on_close=stack.aclose)
