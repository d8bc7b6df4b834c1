"""Tool calls and structured output on the chat routes: reading ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``response_format`` (OpenAI) and ``format`` (Ollama) into a grammar
for the model's sampler, and its reply back into each API's ``tool_calls``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest
from ..runtime.engine import Engine
from ..runtime.grammar import Grammar, json_grammar
from ..runtime.tools import (
    CallSplitter,
    Tool,
    ToolChoice,
    ToolFormat,
    call_grammar,
    parse_reply,
    parse_tool_choice,
    parse_tools,
)
from ..runtime.types import Message, SamplingParams, ToolCall
from .thinking import Thinking


@dataclass
class Constraints:
    """One chat request's tools and output format; ``fmt`` is known once the model is."""

    tools: list[Tool]
    choice: ToolChoice
    parallel: bool
    output: Grammar | None
    """The reply's JSON schema (response_format, format), when it has one."""
    fmt: ToolFormat | None = None

    @property
    def calling(self) -> bool:
        """Whether the model may call a tool in this reply (its calls are parsed)."""
        return bool(self.tools) and self.choice.mode != "none"

    def encoder(self, messages: Sequence[Message], thinking: Thinking
                ) -> Callable[[Engine], list[int]]:
        """The prompt's tokens, the tools rendered by the model's own template (with the
        request's thinking variables)."""
        def encode(engine: Engine) -> list[int]:
            if not self.calling:
                return thinking.chat_tokens(engine, messages)
            self.fmt = engine.tool_format()
            return thinking.chat_tokens(engine, messages,
                                        tools=[t.definition for t in self.tools])
        return encode

    def sampling(self, base: SamplingParams) -> Callable[[Engine], SamplingParams]:
        def resolve(engine: Engine) -> SamplingParams:
            grammar = self.output
            if self.calling:
                assert self.fmt is not None  # set by the encoder, which runs first
                grammar = call_grammar(self.fmt, self.tools, self.choice,
                                       parallel=self.parallel)
            return dataclasses.replace(base, grammar=grammar) if grammar else base
        return resolve

    def splitter(self) -> CallSplitter | None:
        return CallSplitter(self.fmt) if self.calling and self.fmt is not None else None

    def reply(self, text: str) -> tuple[str, list[ToolCall]]:
        """A whole reply's content and calls."""
        if not self.calling or self.fmt is None:
            return text, []
        return parse_reply(self.fmt, text)


def openai_constraints(body: dict[str, Any]) -> Constraints:
    tools = parse_tools(body.get("tools"))
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    if choice.mode in ("required", "function") and not tools:
        raise InvalidRequest("'tool_choice' asks for a call but 'tools' is empty.")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidRequest("'parallel_tool_calls' must be true or false.")
    output = _response_format(body.get("response_format"))
    return _checked(Constraints(tools, choice, parallel, output), "response_format")


def ollama_constraints(body: dict[str, Any]) -> Constraints:
    tools = parse_tools(body.get("tools"))
    return _checked(Constraints(tools, ToolChoice("auto"), True, ollama_format(body)),
                    "format")


def ollama_format(body: dict[str, Any]) -> Grammar | None:
    """Ollama's ``format``: "json" (any JSON object) or a JSON schema."""
    value = body.get("format")
    if value is None or value == "":
        return None
    if value == "json":
        return json_grammar(None)
    if isinstance(value, dict):
        return json_grammar(value)
    raise InvalidRequest("'format' must be \"json\" or a JSON schema object.")


def _response_format(value: Any) -> Grammar | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar(None)
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequest("'response_format.json_schema.schema' must be a JSON schema"
                                 " object.")
        return json_grammar(schema)
    raise InvalidRequest("'response_format.type' must be \"text\", \"json_object\" or"
                         " \"json_schema\".")


def _checked(constraints: Constraints, field: str) -> Constraints:
    if constraints.calling and constraints.output is not None:
        raise InvalidRequest(f"'{field}' and 'tools' together are not supported: the reply is"
                             " either tool calls or JSON of the schema; send one of them.")
    return constraints


def openai_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def openai_call_deltas(calls: Sequence[ToolCall]) -> list[list[dict[str, Any]]]:
    """Each call as OpenAI streams it: its id and name, then its arguments."""
    deltas = []
    for i, c in enumerate(calls):
        deltas.append([{"index": i, "id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": ""}}])
        deltas.append([{"index": i, "function": {"arguments": c.arguments}}])
    return deltas


def ollama_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [{"function": {"index": i, "name": c.name, "arguments": json.loads(c.arguments)}}
            for i, c in enumerate(calls)]
