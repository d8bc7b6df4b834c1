"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens, for Claude Code
and the ``anthropic`` SDK (``ANTHROPIC_BASE_URL`` set to the daemon).

It runs on the same engine, chat templates, tool grammar and thinking split as the OpenAI chat
route; this module only translates. Usage follows Anthropic's meaning: ``input_tokens`` are
the prompt tokens read this time, ``cache_read_input_tokens`` those whose KV cache an earlier
request left (their sum is what count_tokens says the prompt is).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

import jiter
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InvalidRequest, refuse_unknown_fields
from ..runtime.engine import Engine
from ..runtime.tools import PartialCall
from ..runtime.types import Done, Message, ToolCall
from .bridge import BridgeResponse, EventStream, start_generation, whole_reply
from .error_replies import guarded, stream_error_body
from .fields import audit
from .reasoning_fields import anthropic_think
from .replies import End, Piece, cut_calls, reply_parts, whole_parts
from .requests import Fields, priority_of, read_json, sampling
from .state import DaemonState
from .structured import Constraints, anthropic_constraints

PING_INTERVAL_S = 10.0
"""A stream that has sent nothing for this long sends a ``ping`` event (as Anthropic's API
does): a long prompt's prefill (a minute for an agent's 30k tokens on a CPU) would otherwise
leave the client's read timeout to fire before the first token."""


def routes(state: DaemonState) -> list[Route]:
    async def messages(request: Request) -> Response:
        body = await read_json(request)
        audit("/v1/messages", body)
        f = Fields(body)
        max_tokens = f.integer("max_tokens", low=1)
        _anthropic_ranges(body)
        prompt = _Prompt(body, max_tokens)
        # A preset's system prompt and seed turns (the encoder reads the list when it runs).
        prompt.messages[:] = await state.manager.with_preset(f.string("model"),
                                                             prompt.messages)
        params = replace(sampling(f, max_tokens=max_tokens),
                         stop=f.stop("stop_sequences"), cache_prompt=asks_caching(body))
        entry, events, stack = await start_generation(
            state.manager, f.string("model"), prompt.encode,
            prompt.constraints.sampling(params), priority_of(request, body))
        reply = _Reply(entry.name, prompt, params.stop, max_tokens)
        if not f.boolean("stream", False):
            done = await whole_reply(state, request, events, stack)
            return JSONResponse(reply.whole(done))

        async def stream() -> AsyncIterator[str]:
            yield reply.start(await _cached_at_admission(events))
            yield _event("ping", {"type": "ping"})
            try:
                async for part in _with_pings(reply_parts(state, events, prompt.thinking,
                                                          prompt.constraints)):
                    if part is None:
                        yield _event("ping", {"type": "ping"})
                        continue
                    for event in reply.part(part.reasoning, part.content):
                        yield event
                    if isinstance(part, Piece):
                        for event in reply.calls(part.calls):
                            yield event
                    if isinstance(part, End):
                        for event in reply.end(part.done, part.calls):
                            yield event
            except Exception as exc:  # headers are sent: report the error in the stream
                yield _event("error", stream_error_body(request.url.path, exc))

        return BridgeResponse(stream(), events, media_type="text/event-stream",
                              on_close=stack.aclose)

    async def count_tokens(request: Request) -> Response:
        body = await read_json(request)
        audit("/v1/messages/count_tokens", body)
        prompt = _Prompt(body, None)
        # As /v1/messages reads it: with a preset's system prompt and seed turns.
        prompt.messages[:] = await state.manager.with_preset(Fields(body).string("model"),
                                                             prompt.messages)
        async with state.manager.lease(Fields(body).string("model")) as entry:
            tokens = await asyncio.to_thread(prompt.encode, entry.engine)
        return JSONResponse({"input_tokens": len(tokens)})

    async def unknown(request: Request) -> Response:
        raise HTTPException(404)  # answered "no such endpoint", in Anthropic's shape

    return [
        Route("/v1/messages", guarded(state, "v1/messages", messages), methods=["POST"]),
        Route("/v1/messages/count_tokens",
              guarded(state, "v1/messages/count_tokens", count_tokens), methods=["POST"]),
        Route("/v1/messages/{rest:path}", guarded(state, "v1/messages/other", unknown),
              methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
    ]


def _anthropic_ranges(body: dict[str, Any]) -> None:
    """What Anthropic's API refuses that the engine would take: a temperature past 0-1,
    ``stop_sequences`` not a list of non-empty strings, ``metadata`` with a field other than
    a string ``user_id``."""
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and \
            not 0 <= temperature <= 1:
        raise InvalidRequest(f"'temperature' must be between 0 and 1 (Anthropic's range), got"
                             f" {temperature!r}.")
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(
            isinstance(s, str) and s for s in stops)):
        raise InvalidRequest("'stop_sequences' must be a list of non-empty strings, got"
                             f" {json.dumps(stops)[:80]}.")
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise InvalidRequest("'metadata' must be an object with an optional 'user_id'.")
        refuse_unknown_fields(metadata, {"user_id"}, "metadata", "metadata")
        if not isinstance(metadata.get("user_id", ""), (str, type(None))):
            raise InvalidRequest("'metadata.user_id' must be a string or null.")


ADMISSION_WAIT_S = 1.0
"""How long a stream's ``message_start`` waits for the engine to admit the request, whose
cached prefix it then knows (a request queued behind busy slots for longer starts without)."""


async def _cached_at_admission(events: EventStream) -> int:
    """The prompt tokens the request finds cached, once the engine admits it (within
    ADMISSION_WAIT_S; else 0): ``message_start``'s usage then splits input and cache reads as
    the last ``message_delta`` does (clients that read it there saw no cache hit)."""
    deadline = time.monotonic() + ADMISSION_WAIT_S
    while time.monotonic() < deadline:
        request = events.generation.request
        if request is not None and request.t_start > 0:
            return request.n_cached
        if events.waiting or events.generation.cancelled:  # it ended, or failed
            break
        await asyncio.sleep(0.002)
    return 0


async def _with_pings(parts: AsyncIterator[Piece | End]) -> AsyncIterator[Piece | End | None]:
    """``parts``, with a None each time ``PING_INTERVAL_S`` passes without one (the wait
    for the next part goes on: it is not cancelled)."""
    iterator = aiter(parts)
    while True:
        following = asyncio.ensure_future(anext(iterator))
        try:
            while not (await asyncio.wait({following}, timeout=PING_INTERVAL_S))[0]:
                yield None
        except BaseException:
            following.cancel()
            raise
        try:
            yield following.result()
        except StopAsyncIteration:
            return


class _Prompt:
    """A request's prompt: its messages, tools and thinking, read once; ``encode`` renders
    it with the model's template (the same tokens for a reply and for count_tokens)."""

    def __init__(self, body: dict[str, Any], max_tokens: int | None) -> None:
        self.messages = [*_system(body.get("system")), *_messages(body.get("messages"))]
        # A last assistant turn of text is the reply's start: the model continues it.
        last = self.messages[-1] if self.messages else None
        prefill = ""
        if last is not None and last.role == "assistant" and not last.tool_calls:
            prefill = self.messages.pop().content
            if prefill != prefill.rstrip():
                raise InvalidRequest("the final assistant message (the reply's start) cannot"
                                     " end with white space (as Anthropic's API): the model"
                                     " writes the space with the next word.")
        if not any(m.role == "user" for m in self.messages):
            raise InvalidRequest("'messages' holds no user turn: the conversation starts with"
                                 " a user message (a last assistant message is the start of"
                                 " the reply to it).")
        config = body.get("output_config")
        self.thinking, self.show_thinking = anthropic_think(
            body.get("thinking"), max_tokens,
            config.get("effort") if isinstance(config, dict) else None)
        self.constraints: Constraints = anthropic_constraints(body)
        self.encode: Callable[[Engine], list[int]] = self._counted(
            self.constraints.encoder(self.messages, self.thinking, prefill))
        self.n_tokens = 0

    def _counted(self, encode: Callable[[Engine], list[int]]) -> Callable[[Engine], list[int]]:
        def counted(engine: Engine) -> list[int]:
            tokens = encode(engine)
            self.n_tokens = len(tokens)
            return tokens
        return counted


def asks_caching(body: dict[str, Any]) -> bool:
    """Whether the request has a ``cache_control`` (its own, or on a system, tool or message
    block): its prompt's prefixes are then saved to the prefix cache on disk on their first
    reading, not only once read before (runtime/disk_cache.py)."""
    if body.get("cache_control") is not None:
        _cache_control(body["cache_control"], "cache_control")
        return True
    blocks: list[Any] = []
    for key in ("system", "tools"):
        if isinstance(body.get(key), list):
            blocks += body[key]
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            blocks += content
            blocks += [part for block in content if isinstance(block, dict)
                       and isinstance(block.get("content"), list) for part in block["content"]]
    marked = [block["cache_control"] for block in blocks
              if isinstance(block, dict) and block.get("cache_control") is not None]
    for control in marked:
        _cache_control(control, "a block's 'cache_control'")
    return bool(marked)


def _cache_control(value: Any, where: str) -> None:
    """Anthropic's ``{"type": "ephemeral"}``, with an optional ``ttl`` of "5m" or "1h"."""
    if not isinstance(value, dict) or value.get("type") != "ephemeral" or \
            not set(value) <= {"type", "ttl"} or value.get("ttl", "5m") not in ("5m", "1h"):
        raise InvalidRequest(f"{where} must be {{\"type\": \"ephemeral\"}} (with an optional"
                             f" \"ttl\" of \"5m\" or \"1h\"), got {value!r}.")


def _system(value: Any, where: str = "system") -> list[Message]:
    """``system`` (or a system turn among the messages, ``where``): a string or text blocks
    (their ``cache_control``: ``asks_caching``)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [Message("system", value)] if value else []
    if not isinstance(value, list):
        raise InvalidRequest(f"'{where}' must be a string or a list of text blocks.")
    texts = [_text(block, f"{where}[{i}]") for i, block in enumerate(value)]
    return [Message("system", "\n".join(texts))] if texts else []


def _text(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or \
            not isinstance(block.get("text"), str):
        raise InvalidRequest(f"'{where}' must be a text block {{\"type\": \"text\", \"text\":"
                             " ...}.")
    return str(block["text"])


_NO_VISION = {"image", "document"}
_PAST_THINKING = {"thinking", "redacted_thinking"}


_BLOCK_FIELDS = {
    "text": {"type", "text", "cache_control", "citations"},
    "tool_use": {"type", "id", "name", "input", "cache_control", "caller", "toolset_name"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control",
                    "toolset_name"},
    "thinking": {"type", "thinking", "signature"},
    "redacted_thinking": {"type", "data"},
}
"""The fields of each content block Anthropic defines and this route reads."""


def _messages(raw: Any) -> list[Message]:
    """Anthropic's messages as the templates' messages: a user turn's ``tool_result`` blocks
    become tool messages (in their order among its text), an assistant turn's ``tool_use``
    blocks its calls. Earlier turns' thinking is left out of the prompt, as the chat
    templates leave it out of the history. As Anthropic's API: every field is one it defines,
    a turn's content is not empty (but for the last assistant turn), and the user turn after
    an assistant's tool_use blocks answers each with a tool_result of its id."""
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'messages' must be a non-empty list of {role, content} objects.")
    out: list[Message] = []
    names: dict[str, str] = {}  # tool_use id -> the tool's name, for its result
    waiting: list[str] = []  # the last assistant turn's tool_use ids
    answered: set[str] = set()  # those the user turns since it answered
    for i, item in enumerate(raw):
        f = Fields(item, f"messages[{i}].")
        role = f.string("role")
        if role not in ("user", "assistant", "system"):
            raise InvalidRequest(f"'messages[{i}].role' must be \"user\" or \"assistant\""
                                 f" (or \"system\"), got {role!r}.")
        refuse_unknown_fields(item, {"role", "content"}, f"messages[{i}]", "a message")
        content = item.get("content")
        # An assistant turn may be empty (a reply with nothing in it, sent back).
        if content in ("", []) and role != "assistant":
            raise InvalidRequest(f"'messages[{i}].content' is empty: a {role} message needs"
                                 " content.")
        if role == "assistant":
            _answered(waiting, answered, i)
            waiting, answered = [], set()
        if role == "system":  # a system turn mid-conversation (Claude Code sends them)
            out += _system(content, f"messages[{i}].content")
            continue
        if isinstance(content, str):
            out.append(Message(role, content))
        elif not isinstance(content, list):
            raise InvalidRequest(f"'messages[{i}].content' must be a string or a list of"
                                 " content blocks.")
        else:
            texts: list[str] = []
            calls: list[ToolCall] = []
            for j, block in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                kind = _kind(block)
                if kind in _BLOCK_FIELDS:
                    refuse_unknown_fields(block, _BLOCK_FIELDS[kind], where, f"a {kind} block")
                if kind == "text":
                    texts.append(_text(block, where))
                elif kind in _NO_VISION:
                    raise InvalidRequest(f"'{where}' is {'an' if kind == 'image' else 'a'}"
                                         f" {kind}: this model server has no vision support;"
                                         " send text only.")
                elif role == "assistant" and kind in _PAST_THINKING:
                    continue
                elif role == "assistant" and kind == "tool_use":
                    calls.append(_tool_use(block, where))
                    names[calls[-1].id] = calls[-1].name
                elif role == "user" and kind == "tool_result":
                    if texts:  # text before a result is a turn of its own
                        out.append(Message("user", "".join(texts)))
                        texts = []
                    out.append(_tool_result(block, where, names, waiting))
                    answered.add(out[-1].tool_call_id or "")
                else:
                    article = "an" if role == "assistant" else "a"
                    raise InvalidRequest(f"'{where}' is a {kind!r} block, which {article} {role}"
                                         " message cannot hold here; send text, tool_use"
                                         " (assistant) or tool_result (user) blocks.")
            if texts or calls or role == "assistant":
                out.append(Message(role, "".join(texts), tool_calls=tuple(calls)))
        if role == "assistant":
            waiting = [c.id for c in out[-1].tool_calls]
    if out and out[-1].role != "assistant":  # the last assistant turn is the reply's start
        _answered(waiting, answered, len(raw))
    return out


def _answered(waiting: Sequence[str], answered: set[str], i: int) -> None:
    """Refuse a conversation whose user turns after an assistant turn (up to message ``i``)
    leave one of its tool_use blocks without a tool_result, as Anthropic's API does."""
    missing = [call_id for call_id in waiting if call_id not in answered]
    if missing:
        raise InvalidRequest(f"tool_use ids {', '.join(missing)} have no tool_result block in"
                             f" the user turns after them (before 'messages[{i}]'): each"
                             " tool_use needs one.")


def _kind(block: Any) -> str | None:
    """A content block's ``type``, where it is a string (else None: refused as unknown)."""
    kind = block.get("type") if isinstance(block, dict) else None
    return kind if isinstance(kind, str) else None


def _tool_use(block: dict[str, Any], where: str) -> ToolCall:
    f = Fields(block, f"{where}.")
    arguments = block.get("input")
    if not isinstance(arguments, dict):
        raise InvalidRequest(f"'{where}.input' must be an object.")
    return ToolCall(f.string("name"), json.dumps(arguments, ensure_ascii=False), f.string("id"))


def _tool_result(block: dict[str, Any], where: str, names: dict[str, str],
                 waiting: Sequence[str]) -> Message:
    """A tool's result, its content a string or text blocks; ``is_error`` is said in it (the
    templates have no field for it). Its id is one of the turn before's tool_use blocks
    (``waiting``)."""
    f = Fields(block, f"{where}.")
    call_id = f.string("tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            kind = _kind(part)
            if kind == "text":
                refuse_unknown_fields(part, _BLOCK_FIELDS["text"], f"{where}.content[{k}]",
                              "a text block")
            if kind in _NO_VISION:
                raise InvalidRequest(f"'{where}.content[{k}]' is {'an' if kind == 'image' else 'a'}"
                                     f" {kind}: this model server has no vision support; send"
                                     " text only.")
            parts.append(_text(part, f"{where}.content[{k}]"))
        content = "".join(parts)
    elif not isinstance(content, str):
        raise InvalidRequest(f"'{where}.content' must be a string or a list of text blocks.")
    if f.boolean("is_error", False):
        content = f"Error: {content}"
    if call_id not in waiting:
        expected = ", ".join(waiting) if waiting else "none: the turn before called no tool"
        raise InvalidRequest(f"'{where}.tool_use_id' {call_id!r} answers no tool_use block of"
                             f" the assistant turn before it (its ids: {expected}).")
    return Message("tool", content, tool_call_id=call_id, tool_name=names.get(call_id, ""))


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _tool_id(call: ToolCall) -> str:
    return "toolu_" + call.id.removeprefix("call_")


def _usage(done: Done) -> dict[str, int]:
    u = done.usage
    return {"input_tokens": u.prompt_tokens - u.cached_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": u.cached_tokens,
            "output_tokens": u.completion_tokens}


def _stop(done: Done, calls: Sequence[object], stops: Sequence[str], max_tokens: int
          ) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence: ``stop_sequence`` only for one of the
    request's ``stops`` (a preset's own stop string ends the turn as the model's end does),
    and the context's end apart from ``max_tokens`` (a client that raised max_tokens would
    meet it again)."""
    if done.finish_reason == "length":
        if done.usage.completion_tokens < max_tokens:
            return "model_context_window_exceeded", None
        return "max_tokens", None
    if calls:
        return "tool_use", None
    if done.stop_sequence and done.stop_sequence in stops:
        return "stop_sequence", done.stop_sequence
    return "end_turn", None


def _partial_input(arguments: str) -> dict[str, Any]:
    """A call's input as far as the model wrote it before the reply ended in it: read as the
    SDKs read a streamed call's partial JSON (jiter's partial mode: finished members, an
    unfinished string left out), else nothing."""
    try:
        value = jiter.from_json(arguments.encode(), partial_mode=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Reply:
    """One reply in Anthropic's shape: whole, or as the stream's events (content blocks
    opened, extended and closed in order, each with its index)."""

    def __init__(self, model: str, prompt: _Prompt, stops: Sequence[str] = (),
                 max_tokens: int = 0) -> None:
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model = model
        self.prompt = prompt
        self.stops = stops
        """The request's stop_sequences."""
        self.max_tokens = max_tokens
        self.index = -1
        self.open: str | None = None  # the kind of the block being streamed
        self.streamed: list[int] = []
        """How much of each call's arguments has been sent, in order (streamed calls)."""

    def _message(self, content: list[dict[str, Any]], stop: tuple[str | None, str | None],
                 usage: dict[str, int]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "content": content,
                "model": self.model, "stop_reason": stop[0], "stop_sequence": stop[1],
                "usage": usage}

    def _thinking(self, text: str) -> str:
        return text if self.prompt.show_thinking else ""

    def whole(self, done: Done) -> dict[str, Any]:
        """The reply's message, with the blocks its stream would have sent: no empty text
        block, and a call that max_tokens cut (or whose end it cut) as far as it came."""
        reasoning, content, calls = whole_parts(done, self.prompt.thinking,
                                                self.prompt.constraints)
        content, cut = cut_calls(done, self.prompt.thinking, self.prompt.constraints,
                                 content, calls)
        blocks: list[dict[str, Any]] = []
        if reasoning:
            blocks.append({"type": "thinking", "thinking": self._thinking(reasoning),
                           "signature": ""})
        if content:
            blocks.append({"type": "text", "text": content})
        blocks += [{"type": "tool_use", "id": _tool_id(c), "name": c.name,
                    "input": json.loads(c.arguments)} for c in calls]
        blocks += [{"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24],
                    "name": c.name, "input": _partial_input(c.arguments)} for c in cut]
        return self._message(blocks, _stop(done, calls, self.stops, self.max_tokens),
                             _usage(done))

    def start(self, cached: int = 0) -> str:
        usage = {"input_tokens": self.prompt.n_tokens - cached,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
                 "output_tokens": 0}
        return _event("message_start", {"type": "message_start",
                                        "message": self._message([], (None, None), usage)})

    def _block(self, kind: str, block: dict[str, Any]) -> list[str]:
        """Close the open block and open a new one."""
        events = self._close()
        self.index += 1
        self.open = kind
        events.append(_event("content_block_start", {
            "type": "content_block_start", "index": self.index, "content_block": block}))
        return events

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        # A thinking block ends with its signature (none here: nothing checks it locally).
        events = [self._delta({"type": "signature_delta", "signature": ""})] \
            if self.open == "thinking" else []
        self.open = None
        return [*events, _event("content_block_stop", {"type": "content_block_stop",
                                                       "index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return _event("content_block_delta", {"type": "content_block_delta",
                                              "index": self.index, "delta": delta})

    def part(self, reasoning: str, content: str) -> list[str]:
        events = []
        if reasoning:
            if self.open != "thinking":
                events += self._block("thinking", {"type": "thinking", "thinking": "",
                                                   "signature": ""})
            if self.prompt.show_thinking:
                events.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        if content and not self.streamed:  # after the calls begin, none (a cut call's text)
            if self.open != "text":
                events += self._block("text", {"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": content}))
        return events

    def calls(self, calls: Sequence[PartialCall]) -> list[str]:
        """The calls' arguments as the model writes them: a tool_use block per call, opened
        once its name is written, and an ``input_json_delta`` per piece of its arguments
        (the calls come in order: the last opened block is the one growing)."""
        events = []
        for i, call in enumerate(calls):
            if i == len(self.streamed):
                events += self._block("tool_use", {
                    "type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24],
                    "name": call.name, "input": {}})
                self.streamed.append(0)
            if len(call.arguments) > self.streamed[i]:
                events.append(self._delta({"type": "input_json_delta",
                                           "partial_json": call.arguments[self.streamed[i]:]}))
                self.streamed[i] = len(call.arguments)
        return events

    def end(self, done: Done, calls: list[ToolCall]) -> list[str]:
        events = []
        for call in calls[len(self.streamed):]:  # those not streamed: whole
            events += self._block("tool_use", {"type": "tool_use", "id": _tool_id(call),
                                               "name": call.name, "input": {}})
            events.append(self._delta({"type": "input_json_delta",
                                       "partial_json": call.arguments}))
        events += self._close()
        stop_reason, stop_sequence = _stop(done, calls, self.stops, self.max_tokens)
        events.append(_event("message_delta", {
            "type": "message_delta", "usage": _usage(done),
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence}}))
        events.append(_event("message_stop", {"type": "message_stop"}))
        return events
