"""Tool calling: the call format each chat template family was taught, the grammar its calls
must follow (from the tools' JSON schemas), and parsing the calls back out of a reply, whole or
as it streams.

Formats, as the catalog's templates write them:
- ``hermes`` (Qwen 2.5/3, Hermes, SmolLM): ``<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>``, one block per call;
- ``llama3`` (Llama 3.1/3.2): the whole reply is ``{"name": ..., "parameters": {...}}``;
- ``mistral`` (Mistral, Mistral Nemo): ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``;
- ``phi4`` (Phi-4-mini): ``<|tool_call|>[{"name": ..., "arguments": {...}}]<|/tool_call|>``;
- ``harmony`` (gpt-oss): a message to the function, ``<|channel|>commentary
  to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``, one per reply (``<|call|>``
  ends the generation); runtime/thinking.py's HarmonySplitter hands it on in that form.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest, refuse_unknown_fields
from .grammar import Grammar
from .thinking import HARMONY_MESSAGE
from .types import ToolCall


@dataclass(frozen=True)
class ToolFormat:
    name: str
    opener: str
    """The text that opens the calls ("" when the reply is the call: llama3)."""
    closer: str
    arguments_key: str
    """"arguments", or Llama's "parameters"."""
    as_list: bool
    """The calls are one JSON array (Mistral, Phi-4) rather than one object per block."""
    bare: bool
    """A reply may be the calls with no opener in its text: Llama's have none, and a control
    token opener ([TOOL_CALLS]) is not printed."""


FORMATS = {f.name: f for f in (
    ToolFormat("hermes", "<tool_call>", "</tool_call>", "arguments", as_list=False,
               bare=False),
    ToolFormat("llama3", "", "", "parameters", as_list=False, bare=True),
    ToolFormat("mistral", "[TOOL_CALLS]", "", "arguments", as_list=True, bare=True),
    ToolFormat("phi4", "<|tool_call|>", "<|/tool_call|>", "arguments", as_list=True,
               bare=True),
    ToolFormat("harmony", "<|channel|>commentary to=functions.", "<|call|>", "arguments",
               as_list=False, bare=False),
)}

# What gpt-oss writes between a call's function name and its JSON: the channel when the
# recipient came first (``to=functions.NAME<|channel|>commentary json``), the content type;
# as llama.cpp's parser takes them (common/chat.cpp, common_chat_params_init_gpt_oss).
_HARMONY_INFIX = ('("<|channel|>" ("commentary" | "analysis"))?'
                  ' (" "? "<|constrain|>"? [A-Za-z0-9_-]+)? "<|message|>"')
# A call gpt-oss must make: it may reason first (one analysis message: any text but its
# end), then names the recipient in the role's part or in the channel's.
_HARMONY_CALL_OPENING = ('("<|channel|>analysis<|message|>" ([^<] | "<" [^|] | "<|" [^e]'
                         ' | "<|e" [^n] | "<|en" [^d] | "<|end" [^|] | "<|end|" [^>])*'
                         ' "<|end|><|start|>assistant")?'
                         ' ("<|channel|>" ("commentary" | "analysis"))? " "? "to="')
# A call opens where a message to a function begins: at the start of the reply or after
# another message's <|end|>, the recipient in the role's part or in the channel's.
_HARMONY_TRIGGER = (r"(?:[\s\S]*<\|end\|>)?(?:<\|start\|>assistant)?"
                    r"(?:<\|channel\|>(?:commentary|analysis))?\s*to=(functions\.)[\s\S]*")


def detect_format(template_source: str) -> ToolFormat:
    """The call format a chat template's text teaches; InvalidRequest for one we cannot
    parse (so that a request with tools gets a clear 400, never prose that looks like a
    call)."""
    if "<tool_call>" in template_source:
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in template_source:
        return FORMATS["mistral"]
    if "<|tool_call|>" in template_source or "<|tool|>" in template_source:
        return FORMATS["phi4"]
    if "<|channel|>" in template_source:
        return FORMATS["harmony"]
    if "<|start_header_id|>" in template_source:
        return FORMATS["llama3"]
    raise InvalidRequest("this model's chat template takes tools, but in a call format"
                         " localinfer does not parse; use a qwen3, llama3.x or mistral model"
                         " for tools.")


@dataclass(frozen=True)
class Tool:
    """A function the model may call, as the request defined it (OpenAI's shape)."""

    name: str
    parameters: dict[str, Any]
    definition: dict[str, Any]
    """``{"type": "function", "function": {...}}`` as the template renders it."""


_TOOL_FIELDS = {"type", "function"}
_TOOL_FUNCTION_FIELDS = {"name", "description", "parameters", "strict"}
"""A function tool's fields (``strict``: OpenAI's, which the grammar already is)."""


def parse_tools(raw: Any) -> list[Tool]:
    """OpenAI/Ollama ``tools`` -> Tools, with errors naming the field."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidRequest("'tools' must be a list of {type: \"function\", function: {...}}.")
    tools = []
    for i, item in enumerate(raw):
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(item, dict) or item.get("type", "function") != "function" or \
                not isinstance(function, dict):
            raise InvalidRequest(f"'tools[{i}]' must be {{\"type\": \"function\", \"function\":"
                                 " {name, description, parameters}}.")
        refuse_unknown_fields(item, _TOOL_FIELDS, f"tools[{i}]", "a tool")
        refuse_unknown_fields(function, _TOOL_FUNCTION_FIELDS, f"tools[{i}].function",
                              "a tool's function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"'tools[{i}].function.name' must be a non-empty string.")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise InvalidRequest(f"'tools[{i}].function.parameters' must be a JSON schema"
                                 " object.")
        tools.append(Tool(name, parameters, {"type": "function", "function": function}))
    if len({t.name for t in tools}) != len(tools):
        raise InvalidRequest("'tools' names a function twice.")
    return tools


@dataclass(frozen=True)
class ToolChoice:
    mode: str
    """"auto", "none", "required", or "function" (``name`` only)."""
    name: str = ""


def parse_tool_choice(raw: Any, tools: Sequence[Tool]) -> ToolChoice:
    """OpenAI's ``tool_choice``: "auto", "none", "required" or {"type": "function",
    "function": {"name": ...}}."""
    if raw is None:
        return ToolChoice("auto")
    if raw in ("auto", "none", "required"):
        return ToolChoice(raw)
    function = raw.get("function") if isinstance(raw, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest("'tool_choice' must be \"auto\", \"none\", \"required\" or"
                             " {\"type\": \"function\", \"function\": {\"name\": ...}}.")
    assert isinstance(raw, dict) and isinstance(function, dict)
    refuse_unknown_fields(raw, {"type", "function"}, "tool_choice", "tool_choice")
    refuse_unknown_fields(function, {"name"}, "tool_choice.function", "tool_choice.function")
    if name not in {t.name for t in tools}:
        raise InvalidRequest(f"'tool_choice' names {name!r}, which is not among 'tools'.")
    return ToolChoice("function", name)


def call_grammar(fmt: ToolFormat, tools: Sequence[Tool], choice: ToolChoice, *,
                 parallel: bool) -> Grammar | None:
    """The grammar of a reply's calls: lazy (from where the model opens a call) for "auto",
    from the first token for "required" or a named function; None for "none"."""
    if choice.mode == "none" or not tools:
        return None
    chosen = [t for t in tools if choice.mode != "function" or t.name == choice.name]
    lazy = choice.mode == "auto"
    if fmt.name == "harmony":  # the name is in the header: one alternative per function,
        # each converted alone (its local $refs resolve in its own schema)
        return Grammar(json.dumps({"anyOf": [t.parameters for t in chosen]}), described=True,
                       heads=tuple(f"functions.{t.name}" for t in chosen),
                       infix=_HARMONY_INFIX, lead="" if lazy else _HARMONY_CALL_OPENING,
                       triggers=(_HARMONY_TRIGGER,) if lazy else ())
    parameters, defs = _embedded(chosen)
    call = {"anyOf": [{
        "type": "object",
        "properties": {"name": {"const": t.name}, fmt.arguments_key: arguments},
        "required": ["name", fmt.arguments_key],
    } for t, arguments in zip(chosen, parameters, strict=True)]}
    schema: dict[str, Any] = {**call, **defs}
    separator: str | None = "\n" if parallel else None
    if fmt.as_list:
        schema = {"type": "array", "items": call, "minItems": 1, **defs}
        if not parallel:
            schema["maxItems"] = 1
        separator = None
    elif fmt.name == "llama3":
        separator = None  # Llama 3.x calls one function per reply
    if fmt.opener:
        prefix = fmt.opener + ("\n" if not fmt.as_list else "")
        suffix = "\n" + fmt.closer if fmt.closer and not fmt.as_list else fmt.closer
        trigger = r"[\s\S]*?(" + re.escape(fmt.opener) + r")[\s\S]*"
    else:
        prefix = suffix = ""
        trigger = r"\s*(\{\s*\"name\")[\s\S]*"
    return Grammar(json.dumps(schema), prefix=prefix, suffix=suffix, described=True,
                   separator=separator, triggers=(trigger,) if lazy else ())


def _embedded(tools: Sequence[Tool]) -> tuple[list[Any], dict[str, Any]]:
    """Each tool's parameters as the call grammar's schema holds them, and the ``$defs`` its
    root needs. A tool's local ``$ref`` ("#/$defs/A", as pydantic and MCP servers write them)
    points into the tool's own schema, not the grammar's: tool ``i``'s schema is copied under
    the root's ``$defs`` as ``tool<i>``, each of its own definitions as ``tool<i>-<name>``
    (the converter names a definition's rule after its last segment: two tools' ``Item``s
    stay apart), and its references are moved there."""
    parameters: list[Any] = []
    defs: dict[str, Any] = {}
    for i, tool in enumerate(tools):
        if '"$ref"' not in json.dumps(tool.parameters):
            parameters.append(tool.parameters)
            continue
        prefix = f"tool{i}"
        moved = _refs_under(tool.parameters, prefix)
        for key in _DEFINITIONS:
            for name, definition in (moved.pop(key, None) or {}).items():
                defs[f"{prefix}-{name}"] = definition
        defs[prefix] = moved
        parameters.append(moved)
    return parameters, ({"$defs": defs} if defs else {})


_DEFINITIONS = ("$defs", "definitions")
_DATA_KEYWORDS = ("enum", "const", "default", "examples")
"""Keywords whose values are JSON data, not schemas: a "$ref" inside one is a value."""
_NAMED_SCHEMAS = ("properties", "patternProperties", "dependentSchemas", *_DEFINITIONS)
"""Keywords whose values map names (any names: a property may be called "default") to
schemas."""


def _refs_under(schema: Any, prefix: str, *, named: bool = False) -> Any:
    """``schema`` (a tool's) with every local reference moved to where ``_embedded`` puts
    its parts: a definition to ``#/$defs/<prefix>-<name>``, anything else (the root, its
    properties) under ``#/$defs/<prefix>``. ``named``: ``schema`` maps names to schemas."""
    if isinstance(schema, list):
        return [_refs_under(item, prefix) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if named:
        return {name: _refs_under(value, prefix) for name, value in schema.items()}
    moved = {key: value if key in _DATA_KEYWORDS else
             _refs_under(value, prefix, named=key in _NAMED_SCHEMAS)
             for key, value in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        parts = ref[1:].split("/")
        if len(parts) >= 3 and parts[1] in _DEFINITIONS:
            moved["$ref"] = "/".join([f"#/$defs/{prefix}-{parts[2]}", *parts[3:]])
        else:
            moved["$ref"] = f"#/$defs/{prefix}" + ref[1:]
    return moved


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_reply(fmt: ToolFormat, text: str) -> tuple[str, list[ToolCall]]:
    """A whole reply -> (its text content, its calls). A call cut off (by max_tokens) is
    dropped, after complete ones or alone: with a format that opens calls with a tag, the
    text from the tag on is a call, never content (its markup would reach the user as the
    answer); a bare format's reply that does not parse as calls is all content."""
    start = _call_start(fmt, text)
    if start is None:
        return text, []
    calls = _parse_calls(fmt, text[start:])
    if not calls and not fmt.opener:
        return text, []
    return text[:start].rstrip(), calls


def _call_start(fmt: ToolFormat, text: str) -> int | None:
    if fmt.opener:
        at = text.find(fmt.opener)
        if at >= 0:
            return at
    stripped = text.lstrip()
    if fmt.bare and stripped.startswith("[" if fmt.as_list else "{"):
        return len(text) - len(stripped)
    return None


def _parse_calls(fmt: ToolFormat, text: str) -> list[ToolCall]:
    objects: list[Any] = []
    if fmt.opener and text.startswith(fmt.opener) and fmt.closer and not fmt.as_list:
        blocks = text.split(fmt.opener)[1:]
        for i, block in enumerate(blocks):
            body, closed, _ = block.partition(fmt.closer)
            value = _harmony_value(body) if fmt.name == "harmony" else _loads(body)
            if value is None and not closed and i == len(blocks) - 1 and objects:
                break  # a last call cut off by max_tokens: the complete ones stand
            objects.extend(value if isinstance(value, list) else [value])
    else:
        body = text[len(fmt.opener):] if fmt.opener and text.startswith(fmt.opener) else text
        if fmt.closer:
            body = body.split(fmt.closer, 1)[0]
        value = _loads(body)
        objects.extend(value if isinstance(value, list) else [value])
    calls = []
    for value in objects:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return []
        arguments = value.get(fmt.arguments_key, value.get("arguments", value.get(
            "parameters", {})))
        if not isinstance(arguments, dict):
            return []
        calls.append(ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False),
                              new_call_id()))
    return calls


def _harmony_value(block: str) -> Any:
    """``NAME <|constrain|>json<|message|>{...}`` -> {"name": NAME, "arguments": {...}}."""
    header, _, arguments = block.partition(HARMONY_MESSAGE)
    name = header.split("<|", 1)[0].strip()
    value = _loads(arguments)
    return {"name": name, "arguments": value} if name and value is not None else None


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


@dataclass(frozen=True)
class PartialCall:
    """A call as far as the model has written it: its name, and the text of its arguments
    so far (the JSON object's text as the model writes it, complete once ``complete``)."""

    name: str
    arguments: str
    complete: bool


_HEAD_REACH = 512
"""How far back an unfinished call's head (``{"name": "...", "arguments": ``) may begin."""


class _CallScanner:
    """Finds the calls in a reply's call text as it grows, each from its head (the name,
    then the arguments key, in the order the call grammar writes them) through its arguments
    object; it reads each character once (an agent's call may write a whole file)."""

    def __init__(self, key: str) -> None:
        self._head = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"'
                                + re.escape(key) + r'"\s*:\s*\{')
        self._seek = 0  # where the next head is looked for
        self._start = -1  # where the arguments being read begin (-1: none)
        self._at = 0  # how far they have been read
        self._depth = 0
        self._string = False
        self._escape = False
        self.calls: list[PartialCall] = []

    def scan(self, text: str, since: int) -> None:
        """Read ``text`` (the reply so far) on; a call begins at ``since`` or later."""
        self._seek = max(self._seek, since)
        while True:
            if self._start < 0:
                head = self._head.search(text, self._seek)
                if head is None:
                    self._seek = max(self._seek, len(text) - _HEAD_REACH)
                    return
                try:
                    name = json.loads(f'"{head.group(1)}"')
                except json.JSONDecodeError:
                    name = head.group(1)
                self._start = head.end() - 1
                self._at, self._depth, self._string, self._escape = self._start, 0, False, False
                self.calls.append(PartialCall(name, "", False))
            end = self._read(text)
            last = self.calls[-1]
            self.calls[-1] = PartialCall(last.name, text[self._start:end or len(text)],
                                         end is not None)
            if end is None:
                return
            self._seek, self._start = end, -1

    def _read(self, text: str) -> int | None:
        """Read the arguments object on; where it ends, if it has."""
        for i in range(self._at, len(text)):
            c = text[i]
            if self._string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._string = False
            elif c == '"':
                self._string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._at = i + 1
                    return i + 1
        self._at = len(text)
        return None


class CallSplitter:
    """Streams a reply's content while holding back whatever may be the start of a call:
    ``push`` returns the text that is surely content, ``calls`` the calls being written
    (their arguments so far); ``finish`` parses the whole reply and returns the content not
    yet sent and the calls."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self._text = ""
        self._sent = 0
        # A harmony call reaches the splitter whole (thinking.HarmonySplitter holds it).
        self._scanner = _CallScanner(fmt.arguments_key) if fmt.name != "harmony" else None

    def push(self, piece: str) -> str:
        self._text += piece
        end = self._safe_end()
        out = self._text[self._sent:end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        if self._scanner is not None and len(self._text) > self._sent:
            self._scanner.scan(self._text, self._sent)  # what is held back may be calls
        return out

    @property
    def calls(self) -> list[PartialCall]:
        """The calls written so far, each with its arguments' text so far."""
        return self._scanner.calls if self._scanner is not None else []

    def _safe_end(self) -> int:
        text, fmt = self._text, self.fmt
        stripped = text.lstrip()
        if fmt.bare and self._sent == 0 and (
                not stripped or stripped[0] == ("[" if fmt.as_list else "{")):
            return 0  # the reply may be all calls: wait and see
        if not fmt.opener:
            return len(text)
        at = text.find(fmt.opener)
        if at >= 0:
            return at
        # Hold back a tail that could be the opener's beginning.
        for n in range(min(len(fmt.opener) - 1, len(text)), 0, -1):
            if fmt.opener.startswith(text[-n:]):
                return len(text) - n
        return len(text)

    def finish(self, tail: str = "") -> tuple[str, list[ToolCall]]:
        """``tail``: content that came after the last push (held back by a thinking split)."""
        self._text += tail
        text = self._text
        content, calls = parse_reply(self.fmt, text)
        sent = text[:self._sent]
        rest = content[len(sent):] if content.startswith(sent) else ""
        return rest, calls
