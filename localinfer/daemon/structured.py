"""Tool calls and structured output: reading ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``response_format`` (OpenAI), ``json_schema`` and ``grammar``
(llama-server), ``format`` (Ollama) and the Responses API's flat ``tools`` (function and
custom) and ``text.format`` into a grammar for the model's sampler, and its reply back into
each API's ``tool_calls``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest, refuse_unknown_fields
from ..runtime.engine import Engine
from ..runtime.grammar import Grammar, gbnf_grammar, json_grammar
from ..runtime.tools import (
    CallSplitter,
    PartialCall,
    Tool,
    ToolChoice,
    ToolFormat,
    call_grammar,
    new_call_id,
    parse_reply,
    parse_tool_choice,
    parse_tools,
)
from ..runtime.types import Message, SamplingParams, ToolCall
from .reasoning_fields import Thinking


@dataclass
class Constraints:
    """One chat request's tools and output format; ``fmt`` is known once the model is."""

    tools: list[Tool]
    choice: ToolChoice
    parallel: bool
    output: Grammar | None
    """The reply's JSON schema (response_format, format), when it has one."""
    fmt: ToolFormat | None = None
    thinking: Thinking | None = None
    """The request's thinking, known with the prompt (the encoder sets both)."""

    @property
    def calling(self) -> bool:
        """Whether the model may call a tool in this reply (its calls are parsed)."""
        return bool(self.tools) and self.choice.mode != "none"

    def encoder(self, messages: Sequence[Message], thinking: Thinking, prefill: str = ""
                ) -> Callable[[Engine], list[int]]:
        """The prompt's tokens, the tools rendered by the model's own template (with the
        request's thinking variables), then ``prefill`` (the reply's start, if the client
        wrote one)."""
        render = self.renderer(messages, thinking, prefill)
        return lambda engine: engine.prompt_tokens(render(engine))

    def renderer(self, messages: Sequence[Message], thinking: Thinking, prefill: str = ""
                 ) -> Callable[[Engine], str]:
        """The prompt's text, as ``encoder`` tokenizes it."""
        self.thinking = thinking

        def render(engine: Engine) -> str:
            if not self.calling:
                return thinking.chat_text(engine, messages, prefill=prefill)
            self.fmt = engine.tool_format()
            return thinking.chat_text(engine, messages, prefill=prefill,
                                      tools=[t.definition for t in self.tools])
        return render

    def sampling(self, base: SamplingParams) -> Callable[[Engine], SamplingParams]:
        def resolve(engine: Engine) -> SamplingParams:
            grammar = self.output
            if self.calling:
                assert self.fmt is not None  # set by the encoder, which runs first
                grammar = call_grammar(self.fmt, self.tools, self.choice,
                                       parallel=self.parallel)
            # The prompt is rendered (the encoder runs first): the budget knows its tags.
            budget = self.thinking.reasoning_budget() if self.thinking is not None else None
            params = base if budget is None else dataclasses.replace(
                base, reasoning_budget=budget)
            if grammar is None:
                return params
            return dataclasses.replace(params, grammar=reasoned(grammar, self.thinking))
        return resolve

    def splitter(self) -> CallSplitter | None:
        return CallSplitter(self.fmt) if self.calling and self.fmt is not None else None

    def reply(self, text: str) -> tuple[str, list[ToolCall]]:
        """A whole reply's content and calls."""
        if not self.calling or self.fmt is None:
            return text, []
        return parse_reply(self.fmt, text)


def reasoned(grammar: Grammar, thinking: Thinking | None) -> Grammar:
    """``grammar``, letting a thinking model reason first when it constrains the reply from
    its first token (a lazy grammar waits for its trigger anyway): else the reasoning of a
    prompt that opened the block would be cut off, and its answer land in the reasoning."""
    tags = thinking.reasoning_tags() if thinking is not None else None
    if tags is None or grammar.triggers:
        return grammar
    return dataclasses.replace(grammar, reasoning=tags)


def openai_constraints(body: dict[str, Any]) -> Constraints:
    tools = parse_tools(body.get("tools"))
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    if choice.mode in ("required", "function") and not tools:
        raise InvalidRequest("'tool_choice' asks for a call but 'tools' is empty.")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidRequest("'parallel_tool_calls' must be true or false.")
    output, field = output_grammar(body, OPENAI_OUTPUT_FIELDS)
    return _checked(Constraints(tools, choice, parallel, output), field)


BUILT_IN_TOOLS = ("web_search", "web_search_preview", "web_search_preview_2025_03_11",
                  "web_search_2025_08_26", "file_search", "computer_use_preview",
                  "computer_use", "computer", "code_interpreter", "image_generation", "mcp",
                  "local_shell", "shell", "apply_patch", "tool_search",
                  "programmatic_tool_calling")
"""The Responses API's tools that OpenAI runs on its own servers (or that name a client
protocol of their own): none runs here."""


@dataclass(frozen=True)
class ResponsesTools:
    """A Responses API request's tools and output format, and how its calls come back."""

    constraints: Constraints
    custom: frozenset[str]
    """The custom tools, whose calls are ``custom_tool_call`` items."""
    namespaces: dict[str, str]
    """The namespace of each tool given inside a ``namespace`` tool."""


_RESPONSES_TOOL_FIELDS = {
    "function": {"type", "name", "description", "parameters", "strict"},
    "custom": {"type", "name", "description", "format"},
    "namespace": {"type", "name", "description", "tools"},
}
"""The fields of the Responses API's tools that this route reads."""


def responses_constraints(body: dict[str, Any]) -> ResponsesTools:
    """The Responses API's ``tools`` (``function``; ``custom`` whose input is free text or
    matches a regex, called as a function of one string argument, ``input``; ``namespace``,
    a group of those), ``tool_choice``, ``parallel_tool_calls`` and ``text.format``."""
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise InvalidRequest("'tools' must be a list of tools.")
    listed = [(f"tools[{i}]", item, "") for i, item in enumerate(raw or [])]
    definitions, custom, namespaces = [], set(), {}
    while listed:
        where, item, namespace = listed.pop(0)
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in BUILT_IN_TOOLS:
            raise InvalidRequest(f"'{where}' is {kind!r}, one of OpenAI's built-in tools"
                                 " (they run on OpenAI's servers); localinfer runs none of"
                                 " them: define it as a function tool and run it yourself.")
        if isinstance(kind, str) and kind in _RESPONSES_TOOL_FIELDS:
            refuse_unknown_fields(item, _RESPONSES_TOOL_FIELDS[kind], where, f"a {kind} tool")
        if kind == "namespace" and not namespace and isinstance(item.get("name"), str) and \
                isinstance(item.get("tools"), list):
            listed[:0] = [(f"{where}.tools[{j}]", tool, item["name"])
                          for j, tool in enumerate(item["tools"])]
            continue
        if kind not in ("function", "custom") or not isinstance(item.get("name"), str):
            raise InvalidRequest(f"'{where}' must be {{\"type\": \"function\", \"custom\" or"
                                 " \"namespace\", \"name\": ..., ...}.")
        function = {"name": item["name"]}
        if isinstance(item.get("description"), str):
            function["description"] = item["description"]
        if kind == "function":
            if item.get("parameters") is not None:
                function["parameters"] = item["parameters"]
        else:
            function["parameters"] = {"type": "object", "required": ["input"],
                                      "properties": {"input": _custom_input(item, where)}}
            custom.add(item["name"])
        if namespace:
            namespaces[item["name"]] = namespace
        definitions.append({"type": "function", "function": function})
    tools = parse_tools(definitions)
    choice, allowed = _responses_choice(body.get("tool_choice"), tools)
    if allowed is not None:
        tools = [t for t in tools if t.name in allowed]
    if choice.mode in ("required", "function") and not tools:
        raise InvalidRequest("'tool_choice' asks for a call but 'tools' is empty.")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidRequest("'parallel_tool_calls' must be true or false.")
    output = _text_format(body.get("text"))
    return ResponsesTools(_checked(Constraints(tools, choice, parallel, output), "text.format"),
                          frozenset(custom), namespaces)


def _custom_input(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A custom tool's ``format`` as the JSON schema of its input string: any text, or text
    matching a regex (llama.cpp's schema grammar compiles the pattern). A Lark grammar is
    refused: llama.cpp's grammars cannot hold one inside a call's JSON."""
    fmt = tool.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if fmt is None or kind == "text":
        return {"type": "string"}
    syntax = fmt.get("syntax") if isinstance(fmt, dict) else None
    definition = fmt.get("definition") if isinstance(fmt, dict) else None
    if kind == "grammar" and syntax == "regex" and isinstance(definition, str):
        return {"type": "string", "pattern": definition}
    if kind == "grammar" and syntax == "lark":
        raise InvalidRequest(f"'{where}.format': the custom tool {tool['name']!r} has a"
                             " Lark grammar, which localinfer cannot hold a call to (llama.cpp"
                             " takes GBNF); send it with a \"regex\" grammar, as"
                             " {\"type\": \"text\"}, or as a function tool.")
    raise InvalidRequest(f"'{where}.format' must be {{\"type\": \"text\"}} or"
                         " {\"type\": \"grammar\", \"syntax\": \"regex\", \"definition\": ...}.")


def _responses_choice(raw: Any, tools: Sequence[Tool]
                      ) -> tuple[ToolChoice, frozenset[str] | None]:
    """The Responses API's ``tool_choice``: "auto", "none", "required", {"type": "function"
    or "custom", "name": ...}, or {"type": "allowed_tools", "mode": "auto" or "required",
    "tools": [...]}; and the names of the tools allowed (None: all)."""
    if not isinstance(raw, dict):
        return parse_tool_choice(raw, tools), None
    kind = raw.get("type")
    if kind in ("function", "custom"):
        return parse_tool_choice({"type": "function", "function": {"name": raw.get("name")}},
                                 tools), None
    if kind == "allowed_tools":
        mode, allowed = raw.get("mode", "auto"), raw.get("tools")
        if mode not in ("auto", "required") or not isinstance(allowed, list) or not all(
                isinstance(t, dict) and isinstance(t.get("name"), str) for t in allowed):
            raise InvalidRequest("'tool_choice' of type allowed_tools needs \"mode\": \"auto\""
                                 " or \"required\" and \"tools\": [{\"type\": ..., \"name\":"
                                 " ...}].")
        names = {t["name"] for t in allowed}
        unknown = names - {t.name for t in tools}
        if unknown:
            raise InvalidRequest(f"'tool_choice.tools' names {sorted(unknown)[0]!r}, which is"
                                 " not among 'tools'.")
        return ToolChoice(mode), frozenset(names)
    if kind in BUILT_IN_TOOLS:
        raise InvalidRequest(f"'tool_choice' names the built-in tool {kind!r}; localinfer"
                             " runs none of OpenAI's built-in tools.")
    raise InvalidRequest("'tool_choice' must be \"auto\", \"none\", \"required\","
                         " {\"type\": \"function\", \"name\": ...} or {\"type\":"
                         " \"allowed_tools\", ...}.")


def _text_format(text: Any) -> Grammar | None:
    """The Responses API's ``text``: ``format`` (text, json_object, or json_schema with the
    schema beside the type) and ``verbosity`` (only "medium", the default, is kept: a
    template has no verbosity switch)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise InvalidRequest("'text' must be an object: {\"format\": {...}}.")
    verbosity = text.get("verbosity")
    if verbosity not in (None, "medium"):
        raise InvalidRequest("'text.verbosity': only \"medium\" is supported (no template"
                             " has a verbosity switch); ask for brevity in the prompt.")
    unknown = set(text) - {"format", "verbosity"}
    if unknown:
        raise InvalidRequest(f"'text.{sorted(unknown)[0]}' is not a field localinfer"
                             " implements.")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise InvalidRequest("'text.format.schema' must be a JSON schema object.")
        return json_grammar(fmt["schema"])
    if kind in ("text", "json_object"):
        return _response_format({"type": kind})
    raise InvalidRequest("'text.format.type' must be \"text\", \"json_object\" or"
                         " \"json_schema\".")


OPENAI_OUTPUT_FIELDS = ("response_format", "json_schema", "grammar")
"""The fields of OpenAI's routes that say what the reply must look like (OpenAI's, then
llama-server's)."""

LLAMA_OUTPUT_FIELDS = ("json_schema", "grammar")
"""Those of llama-server's own routes (/infill)."""


def output_grammar(body: dict[str, Any], fields: Sequence[str]) -> tuple[Grammar | None, str]:
    """The grammar of the one field of ``fields`` that constrains the reply, and its name (the
    first of ``fields`` when none does). Two at once are refused: each says what the whole
    reply must be."""
    readers: dict[str, Callable[[Any], Grammar | None]] = {
        "response_format": _response_format, "json_schema": _json_schema,
        "grammar": _gbnf}
    given = [(grammar, name) for name in fields
             if (grammar := readers[name](body.get(name))) is not None]
    if len(given) > 1:
        raise InvalidRequest(f"'{given[0][1]}' and '{given[1][1]}' each say what the whole"
                             " reply must look like; send one of them.")
    return given[0] if given else (None, fields[0])


def ollama_constraints(body: dict[str, Any], output: Grammar | None) -> Constraints:
    """/api/chat's ``tools`` with its ``format`` (``output``, read once by the options), and
    the ``tool_choice`` the AI SDK's Ollama provider sends ("auto", "none", "required" or
    {"type": "function", "name": ...}; Ollama has none, and calls as "auto" does)."""
    tools = parse_tools(body.get("tools"))
    raw = body.get("tool_choice")
    if isinstance(raw, dict) and raw.get("type") == "function" and "function" not in raw:
        raw = {"type": "function", "function": {"name": raw.get("name")}}
    choice = parse_tool_choice(raw, tools)
    if choice.mode in ("required", "function") and not tools:
        raise InvalidRequest("'tool_choice' asks for a call but 'tools' is empty.")
    return _checked(Constraints(tools, choice, True, output), "format")


def format_only(output: Grammar | None, thinking: Thinking) -> Constraints:
    """A reply's format without tools, for a prompt encoded elsewhere (Ollama's
    /api/generate)."""
    return Constraints([], ToolChoice("auto"), True, output, thinking=thinking)


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


_RESPONSE_FORMAT_FIELDS = {"text": {"type"}, "json_object": {"type", "schema"},
                           "json_schema": {"type", "json_schema"}}
"""``response_format``'s fields by type (``json_object`` with a ``schema``: llama-server's)."""
_JSON_SCHEMA_FIELDS = {"name", "description", "schema", "strict"}


def _response_format(value: Any) -> Grammar | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if isinstance(kind, str) and kind in _RESPONSE_FORMAT_FIELDS:
        assert isinstance(value, dict)
        refuse_unknown_fields(value, _RESPONSE_FORMAT_FIELDS[kind], "response_format",
                      f"a {kind} response_format")
    if kind == "text":
        return None
    if kind == "json_object":  # llama-server's: with a schema, JSON matching it
        schema = value.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise InvalidRequest("'response_format.schema' must be a JSON schema object.")
        return json_grammar(schema)
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequest("'response_format.json_schema.schema' must be a JSON schema"
                                 " object.")
        assert isinstance(spec, dict)
        refuse_unknown_fields(spec, _JSON_SCHEMA_FIELDS, "response_format.json_schema",
                      "response_format.json_schema")
        return json_grammar(schema)
    raise InvalidRequest("'response_format.type' must be \"text\", \"json_object\" or"
                         " \"json_schema\".")


def _json_schema(value: Any) -> Grammar | None:
    """llama-server's ``json_schema``: the reply is JSON matching this schema."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest("'json_schema' must be a JSON schema object.")
    return json_grammar(value)


def _gbnf(value: Any) -> Grammar | None:
    """llama-server's ``grammar``: GBNF text (start rule ``root``) the reply must match; ""
    (llama-server's default) constrains nothing."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRequest("'grammar' must be GBNF text (a string).")
    try:
        return gbnf_grammar(value)
    except ValueError as exc:
        raise InvalidRequest(f"'grammar' cannot be used: {exc}.") from None


def _checked(constraints: Constraints, field: str) -> Constraints:
    if constraints.calling and constraints.output is not None:
        raise InvalidRequest(f"'{field}' and 'tools' together are not supported: the reply is"
                             f" either tool calls or what '{field}' says; send one of them.")
    return constraints


def openai_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def openai_call_deltas(calls: Sequence[ToolCall], first: int = 0
                       ) -> list[list[dict[str, Any]]]:
    """Each call as OpenAI streams it: its id and name, then its arguments (the calls
    numbered from ``first``, after those streamed as they were written)."""
    deltas = []
    for i, c in enumerate(calls, start=first):
        deltas.append([{"index": i, "id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": ""}}])
        deltas.append([{"index": i, "function": {"arguments": c.arguments}}])
    return deltas


def openai_partial_deltas(calls: Sequence[PartialCall], sent: list[int]
                          ) -> list[list[dict[str, Any]]]:
    """The calls as the model writes them, as OpenAI streams them: a call's id and name once
    its name is written, then each new piece of its arguments. ``sent`` holds how much of
    each call's arguments went out, and is updated."""
    deltas = []
    for i, call in enumerate(calls):
        if i == len(sent):
            deltas.append([{"index": i, "id": new_call_id(), "type": "function",
                            "function": {"name": call.name, "arguments": ""}}])
            sent.append(0)
        if len(call.arguments) > sent[i]:
            deltas.append([{"index": i, "function": {"arguments": call.arguments[sent[i]:]}}])
            sent[i] = len(call.arguments)
    return deltas


def ollama_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [{"function": {"index": i, "name": c.name, "arguments": json.loads(c.arguments)}}
            for i, c in enumerate(calls)]


_ANTHROPIC_TOOL_KEYS = {"name", "description", "input_schema", "type", "cache_control", "strict",
                        "eager_input_streaming"}
"""A custom tool's keys: ``cache_control`` saves the prompt to the prefix cache on disk
(anthropic_routes.asks_caching), ``strict`` is always so (the grammar follows the schema),
and ``eager_input_streaming`` changes no reply (the input is streamed once it is whole)."""

_ANTHROPIC_CHOICES = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}


def anthropic_constraints(body: dict[str, Any]) -> Constraints:
    """Anthropic's ``tools`` (custom tools; its server tools are refused by name),
    ``tool_choice`` and ``output_config.format`` / ``output_format``."""
    tools = parse_tools([_anthropic_tool(i, t) for i, t in enumerate(_list(body, "tools"))])
    raw = body.get("tool_choice")
    choice, parallel = ToolChoice("auto"), True
    if raw is not None:
        kind = raw.get("type") if isinstance(raw, dict) else None
        if not isinstance(kind, str) or kind not in _ANTHROPIC_CHOICES:
            raise InvalidRequest("'tool_choice' must be {\"type\": \"auto\"}, {\"type\": \"any\"},"
                                 " {\"type\": \"tool\", \"name\": ...} or {\"type\": \"none\"}.")
        name = raw.get("name", "") if kind == "tool" else ""
        if kind == "tool" and (not isinstance(name, str)
                               or name not in {t.name for t in tools}):
            raise InvalidRequest(f"'tool_choice.name' must name one of 'tools', got {name!r}.")
        if kind in ("any", "tool") and not tools:
            raise InvalidRequest("'tool_choice' asks for a tool call but 'tools' is empty.")
        disable = raw.get("disable_parallel_tool_use", False)
        if not isinstance(disable, bool):
            raise InvalidRequest("'tool_choice.disable_parallel_tool_use' must be true or false.")
        choice, parallel = ToolChoice(_ANTHROPIC_CHOICES[kind], name), not disable
    output, field = _anthropic_format(body)
    return _checked(Constraints(tools, choice, parallel, output), field)


def _list(body: dict[str, Any], name: str) -> list[Any]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"'{name}' must be a list.")
    return value


_ANTHROPIC_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")


def _anthropic_tool(i: int, tool: Any) -> dict[str, Any]:
    """One of Anthropic's tools as the OpenAI-shaped definition the templates render."""
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise InvalidRequest(f"'{where}' must be an object with name and input_schema.")
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise InvalidRequest(f"'{where}' is Anthropic's server tool {kind!r}, which runs on"
                             " Anthropic's servers; localinfer has none (it runs offline):"
                             " define it as a custom tool with an input_schema, and run it"
                             " in the client.")
    unknown = sorted(set(tool) - _ANTHROPIC_TOOL_KEYS)
    if unknown:
        raise InvalidRequest(f"'{where}.{unknown[0]}' is not supported for a custom tool;"
                             " send name, description and input_schema.")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise InvalidRequest(f"'{where}.input_schema' must be a JSON schema of type \"object\""
                             " (a tool's input is an object).")
    name = tool.get("name")
    if not isinstance(name, str) or not _ANTHROPIC_TOOL_NAME.fullmatch(name):
        raise InvalidRequest(f"'{where}.name' must be 1-128 letters, digits, '_' or '-' (as"
                             f" Anthropic's API), got {name!r}.")
    function = {"name": name, "parameters": schema}
    if tool.get("description") is not None:
        if not isinstance(tool["description"], str):
            raise InvalidRequest(f"'{where}.description' must be a string.")
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _anthropic_format(body: dict[str, Any]) -> tuple[Grammar | None, str]:
    """``output_config.format`` (or the beta's ``output_format``): {"type": "json_schema",
    "schema": {...}}, the reply is JSON matching it."""
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise InvalidRequest("'output_config' must be an object.")
    config = config or {}
    extra = sorted(set(config) - {"format", "effort"})  # effort: reasoning_fields.py
    if extra:
        raise InvalidRequest(f"'output_config.{extra[0]}' is not supported; send format"
                             " and effort.")
    given = [(name, value) for name, value in (("output_config.format", config.get("format")),
                                                ("output_format", body.get("output_format")))
             if value is not None]
    if len(given) > 1:
        raise InvalidRequest("'output_config.format' and 'output_format' each say what the"
                             " reply must look like; send one of them.")
    if not given:
        return None, "output_config.format"
    name, value = given[0]
    schema = value.get("schema") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("type") != "json_schema" or \
            not isinstance(schema, dict):
        raise InvalidRequest(f"'{name}' must be {{\"type\": \"json_schema\", \"schema\":"
                             " {...}}.")
    return json_grammar(schema), name
