"""OpenAI-compatible routes: /v1/models (in Anthropic's shape to an Anthropic client),
/v1/chat/completions, /v1/completions.

Shapes follow the OpenAI API so that the official clients and editor plugins work unchanged.
Every chunk also carries a ``timings`` object (tokens so far, live decode tok/s, TTFT, prefill
tok/s) that standard clients ignore; the final chunk carries the request's full timings.
llama-server's own fields (``n_predict``, ``samplers``; no ``model``) are read as it reads them
here (llama_fields.py), for llama.vim's instruction requests.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InvalidRequest, ModelNotFound
from ..protocol import json_line, live_json, timings_json
from ..runtime.engine import Engine
from ..runtime.tools import new_call_id
from ..runtime.types import Done, ModelInfo, Priority, SamplingParams, TokenLogprob
from ..store import InstalledModel, ModelStore, validate_name
from ..store.local import available_models
from .autocomplete import autocomplete_params, autocomplete_priority
from .bridge import BridgeResponse, Choices, merged, start_generation, whole_replies
from .error_replies import guarded, stream_error_body
from .fields import audit
from .llama_fields import (
    completion_prompt,
    default_model,
    llama_sampling,
    n_predict,
    prompt_encoder,
    prompt_only,
    prompt_only_events,
    prompt_only_priority,
    within_slots,
)
from .logprob_fields import completion_json, entries_json
from .reasoning_fields import Thinking, openai_think
from .replies import Piece, cut_calls, reply_parts, whole_parts
from .requests import (
    Fields,
    check_tool_history,
    parse_messages,
    priority_of,
    read_json,
    top_logprobs,
)
from .state import DaemonState
from .structured import (
    OPENAI_OUTPUT_FIELDS,
    Constraints,
    openai_call_deltas,
    openai_calls,
    openai_constraints,
    openai_partial_deltas,
    output_grammar,
)


def stream_usage(options: Any) -> bool:
    """``stream_options``: whether a stream ends with a usage chunk (``include_usage``);
    ``include_obfuscation`` is taken and has nothing to pad here. Anything else is refused."""
    if options is None:
        return False
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object such as"
                             " {\"include_usage\": true}.")
    for key, value in options.items():
        if key not in ("include_usage", "include_obfuscation"):
            raise InvalidRequest(f"'stream_options.{key}' is not supported (only"
                                 " include_usage and include_obfuscation are).")
        if not isinstance(value, bool):
            raise InvalidRequest(f"'stream_options.{key}' must be true or false.")
    return bool(options.get("include_usage"))


def usage_json(done: Done) -> dict[str, Any]:
    u = done.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def model_json(m: InstalledModel, request: Request, loaded: ModelInfo | None = None
               ) -> dict[str, Any]:
    """An installed model as OpenAI's model object, or as Anthropic's for a client that sends
    ``anthropic-version`` (Claude Code lists a gateway's models at its start). A ``loaded``
    one carries llama-server's ``meta``, by which llama.vscode knows to ask ``/props`` for the
    context it budgets prompts by (without it, it assumes 8,192 tokens)."""
    if "anthropic-version" in request.headers:
        created = datetime.fromtimestamp(m.added, UTC).isoformat().replace("+00:00", "Z")
        return {"type": "model", "id": m.name, "display_name": m.name, "created_at": created}
    out: dict[str, Any] = {"id": m.name, "object": "model", "created": int(m.added),
                           "owned_by": "localinfer"}
    if loaded is not None:
        out["meta"] = {"n_vocab": loaded.n_vocab, "n_ctx_train": loaded.n_ctx_train,
                       "n_params": loaded.n_params, "size": loaded.size_bytes}
    return out


def listed_models(store: ModelStore) -> list[InstalledModel]:
    """What /v1/models lists: the available models, then each preset under its own name
    (described as the model it is over)."""
    installed = available_models(store)
    by_name = {m.name: m for m in installed}
    return installed + [replace(by_name[p.model], name=p.name, model=p.name, added=p.created)
                        for p in store.presets.all() if p.model in by_name]


def _loaded_info(state: DaemonState, name: str) -> ModelInfo | None:
    entry = state.manager.loaded.get(name)
    return entry.engine.info if entry is not None else None


def finish_reason(done: Done) -> str:
    return "length" if done.finish_reason == "length" else "stop"


def routes(state: DaemonState) -> list[Route]:
    async def list_models(request: Request) -> Response:
        installed = await asyncio.to_thread(listed_models, state.manager.store)
        data = [model_json(m, request, _loaded_info(state, m.name)) for m in installed]
        if "anthropic-version" in request.headers:  # Anthropic's page of models: all of them
            return JSONResponse({"data": data, "has_more": False,
                                 "first_id": data[0]["id"] if data else None,
                                 "last_id": data[-1]["id"] if data else None})
        return JSONResponse({"object": "list", "data": data})

    async def retrieve_model(request: Request) -> Response:
        """OpenAI's model object for an installed model (or preset): by any name a request
        may give it (its full name, the name without the quant, ``gemma3:270m``, or the
        family's), as the generating routes resolve it."""
        model_id = request.path_params["model_id"]
        installed = await asyncio.to_thread(listed_models, state.manager.store)
        try:
            wanted = validate_name(model_id)
        except InvalidRequest:
            wanted = ""  # no model can have that name
        store = state.manager.store
        found = store.named(store.untagged(wanted), installed) if wanted else None
        if found is None:
            have = ", ".join(m.name for m in installed) or "none"
            raise ModelNotFound(f"the model {model_id!r} does not exist here (installed:"
                                f" {have}); `localinfer pull` downloads one.")
        return JSONResponse(model_json(found, request, _loaded_info(state, found.name)))

    async def chat_completions(request: Request) -> Response:
        body = await read_json(request)
        audit("/v1/chat/completions", body)
        f = Fields(body)
        # llama-server's clients may name no model (it serves one): llama.vim does.
        name = f.string("model", None) or default_model(state, "/v1/chat/completions")
        parsed = parse_messages(body.get("messages"))
        check_tool_history(parsed)  # as OpenAI's API (Ollama's and llama-server's do not)
        messages = await state.manager.with_preset(name, parsed)
        thinking = openai_think(body.get("reasoning_effort"), body.get("chat_template_kwargs"))
        constraints = openai_constraints(body)
        params = replace(_params(f), logprobs=top_logprobs(f, asked=f.boolean("logprobs",
                                                                               False)))
        return await _generate(state, request, f, name, constraints.encoder(messages, thinking),
                               params, priority_of(request, body), chat=True,
                               thinking=thinking, constraints=constraints)

    async def completions(request: Request) -> Response:
        body = await read_json(request)
        audit("/v1/completions", body)
        f = Fields(body)
        name = f.string("model", None) or default_model(state, "/v1/completions")
        prompt = completion_prompt(body.get("prompt"))
        # The legacy API's logprobs is how many alternatives to send (OpenAI allows 5).
        params = replace(_params(f), logprobs=f.integer("logprobs", None, low=0),
                         grammar=output_grammar(body, OPENAI_OUTPUT_FIELDS)[0])
        suffix = f.string("suffix", "")
        if suffix:  # fill-in-the-middle: an editor's autocomplete
            if not isinstance(prompt, str):
                raise InvalidRequest("'suffix' needs the text before the cursor as 'prompt',"
                                     " not token ids.")
            text = prompt
            return await _generate(state, request, f, name,
                                   lambda e: e.infill_tokens(text, suffix),
                                   autocomplete_params(params, request, name, text, suffix),
                                   autocomplete_priority(request, body), chat=False)
        return await _generate(state, request, f, name, prompt_encoder(prompt),
                               params, priority_of(request, body), chat=False)

    return [
        Route("/v1/models", guarded(state, "v1/models", list_models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", guarded(state, "v1/models/id", retrieve_model),
              methods=["GET"]),
        Route("/v1/chat/completions", guarded(state, "v1/chat/completions", chat_completions),
              methods=["POST"]),
        Route("/v1/completions", guarded(state, "v1/completions", completions),
              methods=["POST"]),
    ]


def _params(f: Fields) -> SamplingParams:
    max_tokens = f.integer("max_completion_tokens", None, low=1)
    if max_tokens is None:
        max_tokens = f.integer("max_tokens", None, low=1)
    # llama-server's n_predict and samplers (llama.vim's instruction requests send them).
    return llama_sampling(f, n_predict(f, max_tokens))


async def _generate(state: DaemonState, request: Request, f: Fields, name: str,
                    encode: Callable[[Engine], list[int]], params: SamplingParams,
                    priority: Priority, *, chat: bool, thinking: Thinking | None = None,
                    constraints: Constraints | None = None
                    ) -> Response:
    stream = f.boolean("stream", False)
    read_only = n_predict(f, None) == 0  # llama-server's n_predict 0: only read the prompt
    if read_only:
        priority = prompt_only_priority(request, f.data, priority)
    copies = f.integer("n", 1, low=1)  # choices: each a completion of the one prompt
    if copies > 1 and read_only:
        raise InvalidRequest("'n_predict': 0 reads the prompt and predicts nothing: send"
                             " 'n': 1 with it.")

    encode_checked = within_slots(copies, encode, lambda n: (
        f"'n' must be at most {n} (this model's slots: each choice is a sequence of its own),"
        f" got {copies}."))
    include_usage = stream_usage(f.data.get("stream_options"))
    entry, events, stack = await start_generation(
        state.manager, name, encode_checked,
        constraints.sampling(params) if constraints is not None else params, priority,
        copies=copies)
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    model = entry.name
    choices = Choices(events)
    # Each choice's reply is split on its own (``Thinking`` follows one reply's text).
    thinkings = [thinking] + [thinking.another_choice() if thinking is not None else None
                              for _ in choices.streams[1:]]
    sent = [0] * copies  # characters of each choice's text sent: legacy logprobs' text_offset

    def logprobs(entries: tuple[TokenLogprob, ...], index: int = 0) -> dict[str, Any] | None:
        if params.logprobs is None:
            return None
        if chat:
            return {"content": entries_json(entries)}
        return completion_json(entries, offset=sent[index])

    def whole_choice(done: Done, index: int) -> dict[str, Any]:
        if not chat:
            return {"index": index, "text": done.text, "logprobs": logprobs(done.logprobs),
                    "finish_reason": finish_reason(done)}
        reasoning, content, calls = whole_parts(done, thinkings[index], constraints)
        # A call max_tokens cut is there as far as it came, as the stream sent it.
        content, cut = cut_calls(done, thinkings[index], constraints, content, calls)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        choice = {"index": index, "message": message,
                  "logprobs": logprobs(done.logprobs), "finish_reason": finish_reason(done)}
        if calls or cut:
            message.update(content=content or None, tool_calls=openai_calls(calls) + [
                {"id": new_call_id(), "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}} for c in cut])
            if done.finish_reason != "length":
                choice["finish_reason"] = "tool_calls"
        return choice

    def usage_of(dones: list[Done]) -> dict[str, Any]:
        """The prompt once, every choice's completion."""
        usage = usage_json(dones[0])
        usage["completion_tokens"] = sum(d.usage.completion_tokens for d in dones)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return usage

    if not stream:
        dones = await whole_replies(state, request, events, stack)
        if read_only:
            dones = [prompt_only(dones[0])]
        return JSONResponse({
            "id": ident, "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": model,
            "choices": [whole_choice(done, i) for i, done in enumerate(dones)],
            "usage": usage_of(dones), "timings": timings_json(dones[0].timings),
        })

    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(index: int, delta_text: str | None, reason: str | None, timings: dict,
              entries: tuple[TokenLogprob, ...] = (), reasoning: str = "",
              tool_calls: list[dict[str, Any]] | None = None) -> str:
        if chat:
            delta: dict[str, Any] = {} if delta_text is None else {"content": delta_text}
            if reasoning:
                delta = {"reasoning_content": reasoning, **delta}
            if tool_calls is not None:
                delta = {"tool_calls": tool_calls}
            choice = {"index": index, "delta": delta, "logprobs": logprobs(entries, index),
                      "finish_reason": reason}
        else:
            choice = {"index": index, "text": delta_text or "",
                      "logprobs": logprobs(entries, index), "finish_reason": reason}
            sent[index] += len(delta_text or "")
        body = {"id": ident, "object": kind, "created": created, "model": model,
                "choices": [choice], "timings": timings}
        if include_usage:
            body["usage"] = None
        return f"data: {json_line(body)}\n\n"

    async def body() -> AsyncIterator[str]:
        for index in range(copies) if chat else ():
            first = {"id": ident, "object": kind, "created": created, "model": model,
                     "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                  "logprobs": None, "finish_reason": None}]}
            if include_usage:
                first["usage"] = None
            yield f"data: {json_line(first)}\n\n"
        dones: dict[int, Done] = {}
        # Per choice, the calls streamed so far: how much of each one's arguments was sent.
        streamed: dict[int, list[int]] = {}
        try:
            async for index, part in merged([
                    reply_parts(state, prompt_only_events(stream) if read_only else stream,
                                thinkings[i], constraints)
                    for i, stream in enumerate(choices.streams)]):
                sent_calls = streamed.setdefault(index, [])
                if isinstance(part, Piece):
                    if part.reasoning or part.content or part.logprobs or not part.calls:
                        yield chunk(index,
                                    part.content or None if part.reasoning else part.content,
                                    None, live_json(part.live), part.logprobs, part.reasoning)
                    for delta in openai_partial_deltas(part.calls, sent_calls):
                        yield chunk(index, None, None, live_json(part.live), tool_calls=delta)
                    continue
                event = part.done
                reason = finish_reason(event)
                timings = timings_json(event.timings)
                if part.reasoning or part.content:
                    yield chunk(index, part.content or None, None, timings,
                                reasoning=part.reasoning)
                for delta in openai_call_deltas(part.calls[len(sent_calls):],
                                                first=len(sent_calls)):
                    yield chunk(index, None, None, timings, tool_calls=delta)
                if (part.calls or sent_calls) and reason != "length":
                    reason = "tool_calls"
                yield chunk(index, None, reason, timings)
                dones[index] = event
            if include_usage:  # after every choice's end, as OpenAI sends it
                tail = {"id": ident, "object": kind, "created": created, "model": model,
                        "choices": [], "usage": usage_of([dones[i] for i in sorted(dones)])}
                yield f"data: {json_line(tail)}\n\n"
        except Exception as exc:  # headers are sent: report the error in the stream
            yield f"data: {json_line(stream_error_body(request.url.path, exc))}\n\n"
        yield "data: [DONE]\n\n"

    return BridgeResponse(body(), choices, media_type="text/event-stream",
                          on_close=stack.aclose)
