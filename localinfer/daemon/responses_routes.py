"""OpenAI's Responses API, what Codex speaks: ``POST /v1/responses``, ``GET`` and ``DELETE
/v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``, ``POST
/v1/responses/input_tokens`` (the prompt's tokens, counted as a response would read them), on
the chat route's engine,
templates, tool grammar (structured.py) and thinking split (reasoning_fields.py).

The request's ``input`` items (messages, function and custom tool calls and their outputs;
earlier reasoning items are accepted and, as chat templates do with past reasoning, not
rendered again) become chat messages; the reply comes back as output items: a ``reasoning``
item with the model's reasoning text, a ``message`` with ``output_text``, and a
``function_call`` (or ``custom_tool_call``) per call, streamed as the documented events, each
with its ``sequence_number``. ``store`` (default true, as OpenAI's) keeps the response and
its conversation on disk (response_store.py) for ``previous_response_id``, GET and DELETE.
``POST /v1/responses/{id}/cancel`` and ``POST /v1/responses/compact`` are answered with a 400
that says why: there are no background responses to cancel, and OpenAI's compaction item is
an encrypted summary only its servers read.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InvalidRequest, refuse_unknown_fields
from ..protocol import json_line
from ..runtime.tools import PartialCall, new_call_id
from ..runtime.types import Done, Message, SamplingParams, Token, TokenLogprob, ToolCall
from .bridge import BridgeResponse, EventStream, start_generation, unless_disconnected
from .error_replies import guarded, stream_failure
from .fields import audit
from .logprob_fields import entries_json
from .reasoning_fields import Thinking, openai_think
from .requests import SMALL_BODY, Fields, priority_of, read_json, sampling, top_logprobs
from .response_store import ResponseStore
from .state import DaemonState
from .structured import Constraints, responses_constraints

ROUTE = "/v1/responses"
INPUT_TOKENS_ROUTE = "/v1/responses/input_tokens"

INCLUDES = {
    "message.output_text.logprobs": "honoured: each output_text part carries its tokens'"
                                    " log-probabilities (with 'top_logprobs' alternatives)",
    "reasoning.encrypted_content": "accepted: the reasoning item carries the reasoning as"
                                   " plain text; there is nothing encrypted to add",
}
"""The ``include`` values taken, and what each does; any other is refused by name."""

_TERMINAL = ("response.completed", "response.incomplete")


@dataclass
class Ask:
    """One request, translated."""

    messages: list[Message]
    conversation: list[dict[str, Any]]
    """Every input item so far (the stored chain's, then this request's)."""
    thinking: Thinking
    constraints: Constraints
    custom: frozenset[str]
    namespaces: dict[str, str]
    params: SamplingParams
    stream: bool
    store: bool
    echo: dict[str, Any]
    """The response object's fields that repeat the request."""


def routes(state: DaemonState, store: ResponseStore | None = None) -> list[Route]:
    responses = store if store is not None else ResponseStore()

    async def history(body: dict[str, Any]) -> list[dict[str, Any]]:
        """The stored conversation ``previous_response_id`` continues (404 if none)."""
        previous = Fields(body).string("previous_response_id", None)
        if previous is None:
            return []
        SMALL_BODY.set(False)  # the prompt is the stored conversation: it may be long
        return list((await asyncio.to_thread(responses.get, previous))["conversation"])

    async def create(request: Request) -> Response:
        body = await read_json(request)
        audit(ROUTE, body)
        ask = read_request(body, await history(body))
        ask.messages = await state.manager.with_preset(Fields(body).string("model"),
                                                       ask.messages)
        entry, events, stack = await start_generation(
            state.manager, Fields(body).string("model"),
            ask.constraints.encoder(ask.messages, ask.thinking),
            ask.constraints.sampling(ask.params), priority_of(request, body))
        reply = Reply({**ask.echo, "model": entry.name}, custom=ask.custom,
                      namespaces=ask.namespaces, logprobs=ask.params.logprobs is not None)

        async def produce() -> AsyncIterator[dict[str, Any]]:
            async for event in reply.run(state, events, ask.thinking, ask.constraints):
                if event["type"] in _TERMINAL and ask.store:
                    inputs = [item if "id" in item else {"id": "item_" + uuid.uuid4().hex,
                                                         **item}
                              for item in ask.conversation]
                    record = {"response": event["response"],
                              "conversation": inputs + reply.output}
                    await asyncio.to_thread(responses.put, reply.ident, record)
                yield event

        if not ask.stream:
            return JSONResponse(await _whole(request, produce(), events, stack))
        return BridgeResponse(_sse(reply, produce()), events, media_type="text/event-stream",
                              on_close=stack.aclose)

    async def retrieve(request: Request) -> Response:
        stream = request.query_params.get("stream")
        if stream not in (None, "false"):
            raise InvalidRequest("'stream': a stored response is not streamed again; GET it"
                                 " whole (leave 'stream' out).")
        record = await asyncio.to_thread(responses.get, request.path_params["response_id"])
        return JSONResponse(record["response"])

    async def input_items(request: Request) -> Response:
        """The items the response was made from (the stored chain's and its own input), as
        OpenAI lists them: ``order`` (desc by default), ``limit`` (1-100, 20), ``after``."""
        record = await asyncio.to_thread(responses.get, request.path_params["response_id"])
        items = record["conversation"][:len(record["conversation"]) - len(
            record["response"].get("output") or [])]
        query = request.query_params
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest("'order' must be \"asc\" or \"desc\".")
        limit = query.get("limit", "20")
        if not limit.isdigit() or not 1 <= int(limit) <= 100:
            raise InvalidRequest("'limit' must be an integer from 1 to 100.")
        if order == "desc":
            items = items[::-1]
        after = query.get("after")
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise InvalidRequest(f"'after': no item {after!r} in this response's input.")
            items = items[ids.index(after) + 1:]
        page = [listed_item(item) for item in items[:int(limit)]]
        return JSONResponse({"object": "list", "data": page,
                             "first_id": page[0].get("id") if page else None,
                             "last_id": page[-1].get("id") if page else None,
                             "has_more": len(items) > len(page)})

    async def delete(request: Request) -> Response:
        ident = request.path_params["response_id"]
        await asyncio.to_thread(responses.delete, ident)
        return JSONResponse({"id": ident, "object": "response", "deleted": True})

    async def input_tokens(request: Request) -> Response:
        """The request's prompt in tokens: the same messages, tools and thinking variables,
        rendered by the same template, as POST /v1/responses would read (its
        ``usage.input_tokens``)."""
        body = await read_json(request)
        audit(INPUT_TOKENS_ROUTE, body)
        ask = read_request(body, await history(body))
        ask.messages = await state.manager.with_preset(Fields(body).string("model"),
                                                       ask.messages)
        encode = ask.constraints.encoder(ask.messages, ask.thinking)
        async with state.manager.lease(Fields(body).string("model")) as entry:
            tokens = await asyncio.to_thread(encode, entry.engine)
        return JSONResponse({"object": "response.input_tokens", "input_tokens": len(tokens)})

    async def cancel(request: Request) -> Response:
        ident = request.path_params["response_id"]
        await asyncio.to_thread(responses.get, ident)  # an unknown id is a 404
        raise InvalidRequest(f"{ident} cannot be cancelled: only a background response can"
                             " be, and localinfer runs none ('background: true' is refused;"
                             " every response is made while its request waits). To stop a"
                             " response being made, close its stream or its request.")

    async def compact(request: Request) -> Response:
        raise InvalidRequest("POST /v1/responses/compact: server-side compaction is not"
                             " supported. OpenAI's compaction item is an encrypted summary"
                             " that only OpenAI's servers read, and a local model has nothing"
                             " to decrypt it with; compact the conversation on the client"
                             " (send a summary of it as the next 'input'), or start a new"
                             " one.")

    return [
        Route(ROUTE, guarded(state, "v1/responses", create), methods=["POST"]),
        Route(INPUT_TOKENS_ROUTE, guarded(state, "v1/responses/input_tokens", input_tokens),
              methods=["POST"]),
        Route(ROUTE + "/compact", guarded(state, "v1/responses/compact", compact),
              methods=["POST"]),
        Route(ROUTE + "/{response_id}/cancel", guarded(state, "v1/responses/id/cancel",
                                                       cancel), methods=["POST"]),
        Route(ROUTE + "/{response_id}", guarded(state, "v1/responses/id", retrieve),
              methods=["GET"]),
        Route(ROUTE + "/{response_id}", guarded(state, "v1/responses/id", delete),
              methods=["DELETE"]),
        Route(ROUTE + "/{response_id}/input_items",
              guarded(state, "v1/responses/id/input_items", input_items), methods=["GET"]),
    ]


async def _whole(request: Request, produce: AsyncIterator[dict[str, Any]],
                 events: EventStream, stack: Any) -> dict[str, Any]:
    """A non-streamed response: every event made (and the response stored), cancelled if the
    client leaves; the model given back."""
    last: dict[str, Any] = {}

    async def consume() -> None:
        async for event in produce:
            last.update(event)

    try:
        await unless_disconnected(request, consume(), events.cancel)
    finally:
        await stack.aclose()
    return last["response"]


async def _sse(reply: Reply, produce: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    for event in reply.start():
        yield _event_text(event)
    try:
        async for event in produce:
            yield _event_text(event)
    except Exception as exc:  # headers are sent: the error is the stream's last event
        status, message, _ = stream_failure("/v1/responses", exc)
        yield _event_text(reply.fail(message, "server_error" if status >= 500
                                     else "invalid_request"))


def _event_text(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json_line(event)}\n\n"


# --- the request ------------------------------------------------------------------------------

def read_request(body: dict[str, Any], history: list[dict[str, Any]]) -> Ask:
    f = Fields(body)
    items = input_items(body.get("input"))
    conversation = history + items
    instructions = f.string("instructions", None)
    messages = ([Message("system", instructions)] if instructions else []) + \
        conversation_messages(conversation)
    if not any(m.role != "system" for m in messages):
        raise InvalidRequest("'input' is empty: send a string or at least one message item.")
    reasoning = Fields(body.get("reasoning") or {}, "reasoning.")
    unknown = set(reasoning.data) - {"effort", "summary", "generate_summary"}
    if unknown:
        raise InvalidRequest(f"'reasoning.{sorted(unknown)[0]}' is not a field localinfer"
                             " implements.")
    for name in ("summary", "generate_summary"):
        if reasoning.data.get(name) not in (None, "auto", "concise", "detailed"):
            raise InvalidRequest(f"'reasoning.{name}' must be \"auto\", \"concise\" or"
                                 " \"detailed\".")
    effort = reasoning.data.get("effort")
    thinking = openai_think(effort, None, field="reasoning.effort")
    tools = responses_constraints(body)
    constraints = tools.constraints
    include = _include(body.get("include"))
    asked = "message.output_text.logprobs" in include or bool(f.integer("top_logprobs", 0))
    params = replace(sampling(f, max_tokens=f.integer("max_output_tokens", None, low=1)),
                     logprobs=top_logprobs(f, asked=asked))
    if params.logprobs is not None and params.logprobs > 20:
        raise InvalidRequest("'top_logprobs' must be at most 20.")
    for name, high in (("temperature", 2), ("top_p", 1)):  # OpenAI's ranges
        value = body.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                not 0 <= value <= high:
            raise InvalidRequest(f"'{name}' must be between 0 and {high}, got {value!r}.")
    store = f.boolean("store", True)
    echo = {
        "id": "resp_" + uuid.uuid4().hex, "object": "response",
        "created_at": int(time.time()), "background": False,
        "instructions": instructions, "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": constraints.parallel, "temperature": params.temperature,
        "top_p": params.top_p, "top_logprobs": params.logprobs or 0,
        "max_output_tokens": params.max_tokens, "max_tool_calls": None,
        "text": body.get("text") or {"format": {"type": "text"}},
        "reasoning": {"effort": effort, "summary": reasoning.data.get("summary")},
        "store": store, "metadata": _metadata(body.get("metadata")),
        "previous_response_id": f.string("previous_response_id", None),
        "truncation": "disabled", "user": f.string("user", None),
        "prompt_cache_key": f.string("prompt_cache_key", None), "service_tier": "default",
    }
    return Ask(messages, conversation, thinking, constraints, tools.custom, tools.namespaces,
               params, f.boolean("stream", False), store, echo)


def _include(value: Any) -> set[str]:
    if value is None:
        return set()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest("'include' must be a list of strings.")
    for name in value:
        if name not in INCLUDES:
            raise InvalidRequest(f"'include': {name!r} is not supported (it belongs to a"
                                 " built-in tool or input localinfer does not run); it takes "
                                 + ", ".join(sorted(INCLUDES)) + ".")
    return set(value)


def _metadata(value: Any) -> dict[str, str]:
    """OpenAI's ``metadata``: up to 16 string pairs, kept with the stored response."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 16 or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in value.items()):
        raise InvalidRequest("'metadata' must be an object of at most 16 string keys (64"
                             " characters each) and string values (512 characters each).")
    return value


def input_items(value: Any) -> list[dict[str, Any]]:
    """``input`` as a list of items: a string is one user message; an item without a type
    but with a role is a message."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise InvalidRequest("'input' must be a string or a list of items.")
    items = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequest(f"'input[{i}]' must be an object (an item).")
        kind = item.get("type", "message" if "role" in item else None)
        if not isinstance(kind, str):
            raise InvalidRequest(f"'input[{i}]' needs a 'type' (or a 'role', for a message).")
        items.append({**item, "type": kind})
    return items


def listed_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as OpenAI lists it: a message's text as a list of parts (``input_text``,
    an assistant's ``output_text``) and its ``status``."""
    if item.get("type") != "message":
        return item
    content = item.get("content")
    if isinstance(content, str):
        kind = "output_text" if item.get("role") == "assistant" else "input_text"
        part: dict[str, Any] = {"type": kind, "text": content}
        if kind == "output_text":
            part["annotations"] = []
        content = [part]
    return {**item, "content": content, "status": item.get("status", "completed")}


_ROLES = {"user": "user", "assistant": "assistant", "system": "system",
          "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal", "summary_text",
               "reasoning_text")
_PART_FIELDS = {"type", "text", "refusal", "annotations", "logprobs"}
"""The fields a text part may have: what the API's own output parts carry, sent back."""


def conversation_messages(items: list[dict[str, Any]]) -> list[Message]:
    """Input items -> chat messages: a call joins the assistant message before it; its
    output is a tool message naming the call (and its function, for templates that show
    it). Reasoning items are not rendered again (chat templates drop past reasoning)."""
    messages: list[Message] = []
    names: dict[str, str] = {}
    unanswered: list[str] = []  # calls whose output has not come yet
    for i, item in enumerate(items):
        where = f"input[{i}]"
        f = Fields(item, where + ".")
        kind = item["type"]
        if kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in _ROLES:
                raise InvalidRequest(f"'{where}.role' must be user, assistant, system or"
                                     f" developer, got {role!r}.")
            if role == "user" and unanswered:  # as OpenAI's API: each call has its output
                raise InvalidRequest(f"No tool output found for function call"
                                     f" {unanswered[0]} before '{where}': send its"
                                     " function_call_output first.")
            messages.append(Message(_ROLES[role], _text(item.get("content"),
                                                         where + ".content")))
        elif kind in ("function_call", "custom_tool_call"):
            name, call_id = f.string("name"), f.string("call_id")
            arguments = f.string("arguments") if kind == "function_call" else json.dumps(
                {"input": f.string("input")}, ensure_ascii=False)
            names[call_id] = name
            unanswered.append(call_id)
            call = ToolCall(name, arguments, call_id)
            if messages and messages[-1].role == "assistant":
                last = messages[-1]
                messages[-1] = replace(last, tool_calls=(*last.tool_calls, call))
            else:
                messages.append(Message("assistant", "", tool_calls=(call,)))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = f.string("call_id")
            if call_id not in names:
                raise InvalidRequest(f"No tool call found for function call output with"
                                     f" call_id {call_id} ('{where}.call_id'): send the call"
                                     " before its output.")
            if call_id in unanswered:
                unanswered.remove(call_id)
            messages.append(Message("tool", _text(item.get("output"), where + ".output"),
                                    tool_call_id=call_id, tool_name=names.get(call_id, "")))
        elif kind != "reasoning":
            raise InvalidRequest(f"'{where}' is a {kind!r} item, which localinfer does not"
                                 " take (it takes message, function_call,"
                                 " function_call_output, custom_tool_call,"
                                 " custom_tool_call_output and reasoning items).")
    return messages


def _text(value: Any, where: str) -> str:
    """A message's content or a call's output: a string, or a list of text parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidRequest(f"'{where}' must be a string or a list of text parts.")
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("refusal" if kind == "refusal" else "text") if isinstance(
            part, dict) else None
        if kind in ("input_image", "input_file", "input_audio"):
            raise InvalidRequest(f"'{where}[{j}]' is {kind!r}: this model server has no"
                                 " vision or audio support; send text only.")
        if kind not in _TEXT_PARTS or not isinstance(text, str):
            raise InvalidRequest(f"'{where}[{j}]' must be a text part ({{\"type\":"
                                 " \"input_text\", \"text\": ...}).")
        refuse_unknown_fields(part, _PART_FIELDS, f"{where}[{j}]", "a text part")
        texts.append(text)
    return "".join(texts)


# --- the reply --------------------------------------------------------------------------------

class Reply:
    """One response as the model makes it: its output items, and the stream events that
    build them (numbered in order; a non-streamed response makes the same and keeps the
    last)."""

    def __init__(self, echo: dict[str, Any], *, custom: frozenset[str],
                 namespaces: dict[str, str], logprobs: bool) -> None:
        self.echo = echo
        self.ident: str = echo["id"]
        self.custom = custom
        self.namespaces = namespaces
        self.logprobs = logprobs
        self.output: list[dict[str, Any]] = []
        self.sequence = -1
        self.item: dict[str, Any] | None = None
        """The reasoning or message item being streamed."""
        self.text = ""
        self.entries: list[TokenLogprob] = []
        """The open message's log-probabilities."""
        self.pending: list[TokenLogprob] = []
        """Log-probabilities of text held back (a possible call), not yet sent."""
        self.reasoning_tokens = 0
        self.usage: dict[str, Any] | None = None
        self.streamed: list[dict[str, Any]] = []
        """The function calls streamed as the model wrote them, each's item (its arguments
        so far) while open, in order."""
        self.streaming = True
        """Calls are still streamed: no custom tool's call came first (its input is sent
        whole, and the calls keep their order)."""

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence, **fields}

    def snapshot(self, status: str, *, error: dict[str, Any] | None = None,
                 incomplete: str | None = None) -> dict[str, Any]:
        return {**self.echo, "status": status, "output": list(self.output),
                "error": error, "usage": self.usage,
                "incomplete_details": {"reason": incomplete} if incomplete else None}

    def start(self) -> list[dict[str, Any]]:
        response = self.snapshot("in_progress")
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    async def run(self, state: DaemonState, events: EventStream, thinking: Thinking,
                  constraints: Constraints) -> AsyncIterator[dict[str, Any]]:
        """The events of the reply, ending with response.completed or .incomplete; a
        generation that stops early raises."""
        splitter = constraints.splitter()
        async for event in events:
            if isinstance(event, Token):
                reasoning, content = thinking.split(event.text)
                if splitter is not None:
                    content = splitter.push(content)
                if reasoning:
                    self.reasoning_tokens = event.live.n_tokens
                    for e in self._reasoning(reasoning):
                        yield e
                self.pending += event.logprobs if not reasoning else ()
                for e in self._content(content):
                    yield e
                for e in self._streaming(splitter.calls if splitter is not None else []):
                    yield e
                continue
            state.record(event)
            if event.finish_reason == "cancelled":
                raise state.cut_off(event)
            reasoning, content = thinking.flush()
            calls: list[ToolCall] = []
            if splitter is not None:
                content, calls = splitter.finish(content)
            for e in [*self._reasoning(reasoning), *self._content(content),
                      *self._finish(event, calls)]:
                yield e

    def _reasoning(self, delta: str) -> list[dict[str, Any]]:
        if not delta:
            return []
        events = self._open("reasoning")
        self.text += delta
        return [*events, self._event("response.reasoning_text.delta", **self._where(),
                                     delta=delta)]

    def _content(self, delta: str) -> list[dict[str, Any]]:
        if not delta:
            return []
        events = self._open("message")
        self.text += delta
        entries, self.pending = self.pending, []
        self.entries += entries
        return [*events, self._event("response.output_text.delta", **self._where(),
                                     delta=delta, logprobs=entries_json(entries)
                                     if self.logprobs else [])]

    def _where(self) -> dict[str, Any]:
        assert self.item is not None
        return {"item_id": self.item["id"], "output_index": len(self.output),
                "content_index": 0}

    def _open(self, kind: str) -> list[dict[str, Any]]:
        if self.item is not None and self.item["type"] == kind:
            return []
        events = self._close()
        if kind == "reasoning":
            self.item = {"id": "rs_" + uuid.uuid4().hex, "type": "reasoning", "summary": [],
                         "content": [], "encrypted_content": None, "status": "in_progress"}
        else:
            self.item = {"id": "msg_" + uuid.uuid4().hex, "type": "message",
                         "role": "assistant", "status": "in_progress", "content": []}
        self.text, self.entries = "", []
        index = len(self.output)
        return [*events,
                self._event("response.output_item.added", output_index=index,
                            item=dict(self.item)),
                self._event("response.content_part.added", **self._where(),
                            part=self._part(""))]

    def _part(self, text: str) -> dict[str, Any]:
        assert self.item is not None
        if self.item["type"] == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [],
                "logprobs": entries_json(self.entries) if self.logprobs else []}

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item = self.item
        if item is None:
            return []
        where, part = self._where(), self._part(self.text)
        if item["type"] == "reasoning":
            done = self._event("response.reasoning_text.done", **where, text=self.text)
        else:
            done = self._event("response.output_text.done", **where, text=self.text,
                               logprobs=part["logprobs"])
        item = {**item, "status": status, "content": [part]}
        events = [done, self._event("response.content_part.done", **where, part=part),
                  self._event("response.output_item.done", output_index=len(self.output),
                              item=item)]
        self.output.append(item)
        self.item = None
        return events

    def _streaming(self, calls: Sequence[PartialCall]) -> list[dict[str, Any]]:
        """A function call's item as the model writes it: added once its name is written,
        a ``response.function_call_arguments.delta`` per piece of its arguments, done once
        they are whole."""
        events: list[dict[str, Any]] = []
        for i, call in enumerate(calls[:len(self.streamed) + 1] if self.streaming else ()):
            if i == len(self.streamed):
                if call.name in self.custom:
                    self.streaming = False
                    break
                if self.item is not None and self.item["type"] == "message":
                    self.entries += self.pending
                events += self._close()
                item = {"id": "fc_" + uuid.uuid4().hex, "type": "function_call",
                        "call_id": new_call_id(), "name": call.name, "arguments": "",
                        "status": "in_progress"}
                if call.name in self.namespaces:
                    item["namespace"] = self.namespaces[call.name]
                self.streamed.append(item)
                events.append(self._event("response.output_item.added",
                                          output_index=len(self.output), item=dict(item)))
            item = self.streamed[i]
            if item["status"] != "in_progress":
                continue
            if len(call.arguments) > len(item["arguments"]):
                delta = call.arguments[len(item["arguments"]):]
                item["arguments"] = call.arguments
                events.append(self._event("response.function_call_arguments.delta",
                                          item_id=item["id"], output_index=len(self.output),
                                          delta=delta))
            if call.complete:
                events += self._call_done(item, "completed")
        return events

    def _call_done(self, item: dict[str, Any], status: str) -> list[dict[str, Any]]:
        item["status"] = status
        where = {"item_id": item["id"], "output_index": len(self.output)}
        self.output.append(dict(item))
        return [self._event("response.function_call_arguments.done", **where,
                            arguments=item["arguments"], name=item["name"]),
                self._event("response.output_item.done", output_index=where["output_index"],
                            item=dict(item))]

    def _finish(self, done: Done, calls: list[ToolCall]) -> list[dict[str, Any]]:
        if self.item is not None and self.item["type"] == "message":
            self.entries += self.pending
        # The item still open when max_output_tokens ran out was cut off: incomplete.
        events = self._close("incomplete" if done.finish_reason == "length" else "completed")
        for item in self.streamed:  # a call cut off (max_output_tokens) ends incomplete
            if item["status"] == "in_progress":
                events += self._call_done(item, "incomplete")
        for call in calls[len(self.streamed):]:
            events += self._call(call)
        u = done.usage
        self.usage = {"input_tokens": u.prompt_tokens,
                      "input_tokens_details": {"cached_tokens": u.cached_tokens},
                      "output_tokens": u.completion_tokens,
                      "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                      "total_tokens": u.total_tokens}
        if done.finish_reason == "length":
            return [*events, self._event("response.incomplete", response=self.snapshot(
                "incomplete", incomplete="max_output_tokens"))]
        return [*events, self._event("response.completed", response={
            **self.snapshot("completed"), "completed_at": int(time.time())})]

    def _call(self, call: ToolCall) -> list[dict[str, Any]]:
        """A call's item, its input in one delta (the grammar made it whole)."""
        index = len(self.output)
        if call.name in self.custom:
            value = json.loads(call.arguments).get("input", "")
            item = {"id": "ctc_" + uuid.uuid4().hex, "type": "custom_tool_call",
                    "call_id": call.id, "name": call.name, "input": value}
            kind, key = "response.custom_tool_call_input", "input"
        else:
            item = {"id": "fc_" + uuid.uuid4().hex, "type": "function_call",
                    "call_id": call.id, "name": call.name, "arguments": call.arguments}
            kind, key = "response.function_call_arguments", "arguments"
        if call.name in self.namespaces:
            item["namespace"] = self.namespaces[call.name]
        where = {"item_id": item["id"], "output_index": index}
        self.output.append({**item, "status": "completed"})
        return [self._event("response.output_item.added", output_index=index,
                            item={**item, key: "", "status": "in_progress"}),
                self._event(kind + ".delta", **where, delta=item[key]),
                self._event(kind + ".done", **where, **{key: item[key]},
                            **({"name": call.name} if key == "arguments" else {})),
                self._event("response.output_item.done", output_index=index,
                            item=self.output[-1])]

    def fail(self, message: str, code: str) -> dict[str, Any]:
        """The stream's last event when the generation failed after the headers were sent."""
        return self._event("response.failed", response=self.snapshot(
            "failed", error={"code": code, "message": message}))
