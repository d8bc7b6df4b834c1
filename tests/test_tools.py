"""Tool calling and structured output, fast: the call formats' parsers and grammars, the
templates rendering tools and their history, and both APIs' shapes with the scripted backend
and the real openai and ollama clients (the real model's sampling is in test_tools_real.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon_util import fake_factory, install_fake_models, ollama_client, openai_client, serve
from localinfer.errors import InvalidRequest
from localinfer.runtime.chat_template import BUILTIN_TEMPLATES, ChatTemplate
from localinfer.runtime.grammar import (
    gbnf_grammar,
    integer_range,
    json_grammar,
    number_range,
    to_gbnf,
)
from localinfer.runtime.llama import schema_rules
from localinfer.runtime.tools import (
    FORMATS,
    CallSplitter,
    ToolChoice,
    call_grammar,
    detect_format,
    parse_reply,
    parse_tool_choice,
    parse_tools,
)
from localinfer.runtime.types import Message, ToolCall

pytest_plugins = ["daemon_fixtures"]

TEMPLATES = Path(__file__).parent / "templates"
QWEN = (TEMPLATES / "qwen2.5.jinja").read_text()
LLAMA = (TEMPLATES / "llama3.1.jinja").read_text()
MISTRAL = (TEMPLATES / "mistral.jinja").read_text()

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(("template", "fmt"), [(QWEN, "hermes"), (LLAMA, "llama3"),
                                               (MISTRAL, "mistral")])
def test_each_family_template_renders_tools_calls_and_results(template, fmt):
    chat = ChatTemplate(template, bos_token="<s>", eos_token="</s>")
    assert chat.supports_tools and detect_format(template).name == fmt
    history = [
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=(ToolCall("get_weather", '{"city": "Paris"}',
                                                      "call_1"),)),
        Message("tool", "18 C and sunny", tool_call_id="call_1", tool_name="get_weather"),
        Message("user", "And tomorrow?"),
    ]
    text = chat.render(history, tools=[WEATHER])
    assert '"get_weather"' in text and "The weather in a city" in text  # the tool's definition
    assert '{"city": "Paris"}' in text  # the call, its arguments as an object
    assert "18 C and sunny" in text  # the result
    # tool_choice "none": the tools are not offered, the history stays.
    assert '{"city": "Paris"}' in chat.render(history)


def test_a_template_without_tools_refuses_them():
    chat = ChatTemplate(BUILTIN_TEMPLATES["gemma"])
    assert not chat.supports_tools
    with pytest.raises(InvalidRequest, match="no tool support"):
        chat.render([Message("user", "hi")], tools=[WEATHER])
    with pytest.raises(InvalidRequest, match="no tool support"):  # not dropped unseen
        chat.render([Message("assistant", "", tool_calls=(ToolCall("f", "{}"),))])


def test_unknown_formats_are_refused_clearly():
    assert detect_format("{{ tools }}<|channel|>").name == "harmony"  # test_harmony.py
    with pytest.raises(InvalidRequest, match="does not parse"):
        detect_format("{{ tools }}")


@pytest.mark.parametrize(("fmt", "text", "content"), [
    ("hermes", "Let me look.\n" + CALL_TEXT, "Let me look."),
    ("hermes", '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
               "\n</tool_call>", ""),  # SmolLM2 writes a list
    ("llama3", ' {"name": "get_weather", "parameters": {"city": "Paris"}}', ""),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', ""),
    ("mistral", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]', ""),
    ("phi4", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
             "<|/tool_call|>", ""),
])
def test_each_format_parses_back_to_calls(fmt, text, content):
    parsed, calls = parse_reply(FORMATS[fmt], text)
    assert parsed == content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    assert calls[0].id.startswith("call_")


def test_text_stays_content_and_a_cut_call_is_dropped():
    assert parse_reply(FORMATS["hermes"], "Just prose.") == ("Just prose.", [])
    cut = '<tool_call>\n{"name": "get_weather", "argu'
    # Cut off by max_tokens: the call's markup is not the answer (it reached clients as text).
    assert parse_reply(FORMATS["hermes"], cut) == ("", [])
    assert parse_reply(FORMATS["hermes"], "Checking.\n" + cut) == ("Checking.", [])
    assert parse_reply(FORMATS["hermes"], '{"name": "x", "arguments": {}}')[1] == []
    content, calls = parse_reply(FORMATS["hermes"], CALL_TEXT + "\n" + cut)
    assert content == "" and [c.name for c in calls] == ["get_weather"]


def test_the_splitter_streams_content_and_holds_back_a_call():
    splitter = CallSplitter(FORMATS["hermes"])
    text = "Sure, checking.\n" + CALL_TEXT
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    sent = "".join(splitter.push(p) for p in pieces)
    assert sent == "Sure, checking.\n"
    rest, calls = splitter.finish()
    assert (sent + rest).rstrip() == "Sure, checking." and calls[0].name == "get_weather"
    llama = CallSplitter(FORMATS["llama3"])
    assert llama.push('{"name": "get_weather", ') == ""  # may be a call: held back
    assert CallSplitter(FORMATS["llama3"]).push("Hello") == "Hello"


def test_call_grammars_follow_tool_choice():
    tools = parse_tools([WEATHER, {"type": "function", "function": {"name": "now"}}])
    hermes = FORMATS["hermes"]
    auto = call_grammar(hermes, tools, ToolChoice("auto"), parallel=True)
    assert auto is not None and auto.triggers and auto.prefix == "<tool_call>\n"
    required = call_grammar(hermes, tools, ToolChoice("required"), parallel=False)
    assert required is not None and not required.triggers and required.separator is None
    named = call_grammar(hermes, tools, parse_tool_choice(
        {"type": "function", "function": {"name": "now"}}, tools), parallel=True)
    assert named is not None and [c["properties"]["name"]["const"] for c in
                                  named.schema_json["anyOf"]] == ["now"]
    assert call_grammar(hermes, tools, ToolChoice("none"), parallel=True) is None
    with pytest.raises(InvalidRequest, match="not among"):
        parse_tool_choice({"type": "function", "function": {"name": "nope"}}, tools)
    gbnf = to_gbnf(required, schema_rules)
    assert gbnf.startswith('root ::= "<tool_call>\\n" json-value "\\n</tool_call>"')
    assert '"\\"get_weather\\""' in gbnf


def test_bad_tools_are_400s():
    for raw, message in [("x", "must be a list"), ([{"type": "retrieval"}], "tools\\[0\\]"),
                         ([{"function": {"name": ""}}], "name"),
                         ([WEATHER, WEATHER], "twice")]:
        with pytest.raises(InvalidRequest, match=message):
            parse_tools(raw)
    assert json_grammar(None).schema_json == {"type": "object"}


@pytest.fixture
def tool_daemon(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="Checking.\n" + CALL_TEXT, chat_template=QWEN)) as d:
        yield d


def test_openai_client_gets_tool_calls_whole_and_streamed(tool_daemon):
    client = openai_client(tool_daemon)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.chat.completions.create(model="fake:1b", messages=messages,
                                           tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather", {"city": "Paris"})
    chunks = list(client.chat.completions.create(model="fake:1b", messages=messages,
                                                 tools=[WEATHER], stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert content.strip() == "Checking."
    assert deltas[0].index == 0 and deltas[0].id.startswith("call_")
    assert deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == {"city": "Paris"}
    # The arguments are streamed as the model writes them (in several pieces, before the
    # reply ends), as OpenAI streams them, not held to the end; the id is sent once.
    pieces = [d for d in deltas if d.function.arguments]
    assert len(pieces) > 1 and [d.id for d in deltas if d.id] == [deltas[0].id]
    last_piece = max(i for i, c in enumerate(chunks) for d in (
        c.choices[0].delta.tool_calls or [] if c.choices else []) if d.function.arguments)
    assert chunks[last_piece].choices[0].finish_reason is None
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The history goes back: the call and its result reach the prompt.
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
    again = client.chat.completions.create(model="fake:1b", messages=messages,
                                           tools=[WEATHER], tool_choice="required",
                                           parallel_tool_calls=False)
    assert again.choices[0].message.tool_calls
    grammar = tool_daemon.manager.loaded["fake:1b-f16"].engine.backend.grammars[-1]
    assert not grammar.triggers and grammar.separator is None  # required, one call


def test_ollama_client_gets_tool_calls_whole_and_streamed(tool_daemon):
    client = ollama_client(tool_daemon)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.chat(model="fake:1b", messages=messages, tools=[WEATHER])
    [call] = reply.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    parts = list(client.chat(model="fake:1b", messages=messages, tools=[WEATHER], stream=True))
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [c.function.arguments for c in calls] == [{"city": "Paris"}]
    assert "".join(p.message.content or "" for p in parts).strip() == "Checking."
    assert parts[-1].done
    messages += [reply.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_name": "get_weather", "content": "18 C"}]
    assert client.chat(model="fake:1b", messages=messages, tools=[WEATHER]).message.tool_calls


def test_structured_output_asks_for_a_grammar(tool_daemon):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    openai = openai_client(tool_daemon)
    openai.chat.completions.create(
        model="fake:1b", messages=[{"role": "user", "content": "hi"}],
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema,
                                                                "strict": True}})
    ollama_client(tool_daemon).chat(model="fake:1b", messages=[{"role": "user",
                                                                "content": "hi"}],
                                    format="json")
    ollama_client(tool_daemon).generate(model="fake:1b", prompt="hi", format=schema)
    grammars = tool_daemon.manager.loaded["fake:1b-f16"].engine.backend.grammars
    assert [g.schema_json for g in grammars] == [schema, {"type": "object"}, schema]


def test_refusals_are_400s_naming_the_field(tool_daemon, home):
    with tool_daemon.uds() as http:
        for body, message in [
            ({"response_format": {"type": "yaml"}}, "response_format.type"),
            ({"response_format": {"type": "json_schema", "json_schema": {}}}, "schema"),
            ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "together"),
            ({"tool_choice": "required"}, "'tools' is empty"),
            ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                  "function": {"name": "x"}}}, "not among"),
            ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
            # Nested fields the API does not define are named, never dropped.
            ({"response_format": {"type": "json_object", "foo": 1}}, "response_format.foo"),
            ({"response_format": {"type": "json_schema", "json_schema": {
                "schema": {"type": "object"}, "foo": 1}}}, "json_schema.foo"),
            ({"tools": [{**WEATHER, "foo": 1}]}, "tools[0].foo"),
            ({"tools": [{**WEATHER, "function": {**WEATHER["function"], "foo": 1}}]},
             "tools[0].function.foo"),
            ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {
                "name": "get_weather", "x": 1}}}, "tool_choice.function.x"),
            ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi",
                                                         "foo": 1}]}]}, "content[0].foo"),
            ({"messages": [{"role": "user", "content": "hi"}, {
                "role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "foo": 1,
                                                     "function": {"name": "f",
                                                                  "arguments": "{}"}}]}]},
             "tool_calls[0].foo"),
            # A tool message answers a call made before it; each call is answered.
            ({"messages": [{"role": "user", "content": "hi"},
                           {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
             "answers no tool call"),
            ({"messages": [{"role": "user", "content": "hi"},
                           {"role": "tool", "content": "x"}]}, "tool_call_id' is required"),
            ({"messages": [{"role": "user", "content": "hi"}, {
                "role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                     "function": {"name": "f",
                                                                  "arguments": "{}"}}]},
                           {"role": "user", "content": "and?"}]}, "have no tool message"),
        ]:
            r = http.post("/v1/chat/completions", json={
                "model": "fake:1b", "messages": [{"role": "user", "content": "hi"}], **body})
            assert r.status_code == 400 and message in r.json()["error"]["message"], \
                (body, r.text)
        # A reply's own calls sent back: Ollama's carry function.index, OpenAI's streamed
        # deltas an index (accepted, as the APIs take them).
        history = [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "c1", "index": 0, "function": {"index": 0, "name": "get_weather",
                                                             "arguments": {"city": "a"}}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "12 C"}]
        for path in ("/api/chat", "/v1/chat/completions"):
            r = http.post(path, json={"model": "fake:1b", "messages": history,
                                      "stream": False})
            assert r.status_code == 200, (path, r.text)
        # llama-server's json_object with a schema: the schema holds (it was dropped).
        r = http.post("/v1/chat/completions", json={
            "model": "fake:1b", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object", "schema": {"type": "object",
                                                                  "required": ["a"]}}})
        assert r.status_code == 200, r.text
        grammars = tool_daemon.manager.loaded["fake:1b-f16"].engine.backend.grammars
        assert grammars[-1].schema_json == {"type": "object", "required": ["a"]}
        r = http.post("/api/chat", json={"model": "fake:1b", "format": "yaml",
                                         "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "'format'" in r.json()["error"]


def test_a_model_without_tool_support_gets_a_400(daemon):
    with daemon.uds() as http:
        for path in ("/v1/chat/completions", "/api/chat"):
            r = http.post(path, json={"model": "fake:1b", "tools": [WEATHER], "stream": False,
                                      "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 400 and "no tool support" in json.dumps(r.json()), path


ZED = {  # Zed's Ollama provider with tools (its agent panel)
    "model": "fake:1b", "stream": True, "keep_alive": "-1m",
    "options": {"num_ctx": 2048, "temperature": 1.0},
    "messages": [{"role": "system", "content": "You are a helpful assistant."},
                 {"role": "user", "content": "Weather in Paris?"}],
    "tools": [WEATHER],
}
CONTINUE = {  # Continue's OpenAI provider in agent mode
    "model": "fake:1b", "stream": True, "max_tokens": 4096, "temperature": 0.7,
    "messages": [{"role": "system", "content": "<important_rules>...</important_rules>"},
                 {"role": "user", "content": "Weather in Paris?"}],
    "tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": False,
    "stream_options": {"include_usage": True},
}
OPEN_WEBUI = {  # Open WebUI's native function calling through /api/chat
    "model": "fake:1b", "stream": False, "options": {},
    "messages": [{"role": "user", "content": "Weather in Paris?"}],
    "tools": [WEATHER],
}


def test_editor_shaped_requests_get_calls(tool_daemon):
    with tool_daemon.uds() as http:
        lines = [json.loads(line) for line in
                 http.post("/api/chat", json=ZED).text.splitlines()]
        assert any(p["message"].get("tool_calls") for p in lines) and lines[-1]["done"]
        with http.stream("POST", "/v1/chat/completions", json=CONTINUE) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
        assert events[-1]["usage"]["completion_tokens"] > 0
        reasons = [c["finish_reason"] for e in events for c in e["choices"]]
        assert "tool_calls" in reasons
        body = http.post("/api/chat", json=OPEN_WEBUI).json()
        assert body["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def test_integer_bounds_are_enforced_or_refused():
    rules = schema_rules({"type": "integer", "minimum": -3, "exclusiveMaximum": 0}, "n")
    assert re.fullmatch(_regex(integer_range({"minimum": -3, "exclusiveMaximum": 0})), "-2")
    assert rules.startswith("n ::= (") and rules.split("\n")[0].endswith(") space")
    assert '"0" | [1-9]' in schema_rules({"type": "integer", "minimum": 0}, "n")
    assert schema_rules({"type": "string"}, "s").startswith("s ::= string")
    # A bound past a float's range is an exact integer all the same (it overflowed
    # math.isfinite: a 500); JSON's 1e400 reads as infinity, which is refused.
    assert "root ::=" in schema_rules({"type": "integer", "maximum": 10**400}, "root")
    for schema in ({"type": "integer", "maximum": float("inf")},
                   {"type": "number", "maximum": -1}, {"type": "number", "minimum": 0.5,
                                                        "maximum": 2},
                   {"type": "number", "minimum": -2}, {"type": "number", "exclusiveMinimum": 0},
                   {"type": "integer", "minimum": 3, "maximum": 1}):
        with pytest.raises(ValueError):
            schema_rules(schema, "n")


def _regex(gbnf: str) -> str:
    """The GBNF integer_range and number_range write (literals, classes, counts, groups) as a
    regular expression."""
    return re.sub(r'"([^"]*)"', lambda m: re.escape(m.group(1)), gbnf).replace(" ", "")


_SAFE = 2**53 - 1  # JavaScript's largest safe integer: agents' tool schemas bound counts by it
_bounds = st.one_of(st.none(), st.integers(-10**6, 10**6), st.sampled_from([
    0, 1, -1, 9, 10, 99, 100, 999, 1000, _SAFE, -_SAFE, 10**15, 10**16 - 1]))


@given(low=_bounds, high=_bounds, exclusive=st.booleans(), n=st.one_of(
    st.integers(-10**7, 10**7), st.integers(-2**60, 2**60),
    _bounds.filter(lambda b: b is not None)))
def test_integer_bounds_admit_exactly_the_integers_in_range(low, high, exclusive, n):
    """Claude Code's tools bound integers by 0..2**53-1 and -(2**53-1)..2**53-1."""
    if low is not None and high is not None and high < low + exclusive:
        return
    schema = {("exclusiveMinimum" if exclusive else "minimum"): low, "maximum": high}
    schema = {k: v for k, v in schema.items() if v is not None}
    if not schema:
        return
    pattern = _regex(integer_range(schema))
    bottom = None if low is None else low + exclusive
    inside = (bottom is None or n >= bottom) and (high is None or n <= high)
    unbounded_long = len(str(abs(n))) > 16 and (high is None or bottom is None)
    if not unbounded_long:
        assert bool(re.fullmatch(pattern, str(n))) == inside, (schema, n)
    for padded in (f"0{abs(n)}", "-0", f"+{abs(n)}"):
        assert not re.fullmatch(pattern, padded)


@given(high=st.integers(0, 10**7), value=st.floats(0, 2 * 10**7))
def test_number_bounds_from_zero_admit_the_numbers_in_range(high, value):
    """A whole, non-negative range on a number (Claude Code's TaskOutput timeout, 0..600000)."""
    pattern = _regex(number_range({"minimum": 0, "maximum": high}))
    text = f"{value:.3f}"
    assert bool(re.fullmatch(pattern, text)) == (float(text) <= high), (high, text)
    assert not re.fullmatch(pattern, "-1") and not re.fullmatch(pattern, f"0{high}")


@given(low=st.one_of(st.none(), st.integers(0, 10**6), st.just(3.0)),
       high=st.one_of(st.none(), st.integers(0, 10**7)),
       value=st.floats(-2 * 10**7, 2 * 10**7))
def test_number_bounds_on_one_side_admit_the_numbers_in_range(low, high, value):
    """A maximum alone (an MCP tool's ``timeout: {type: number, maximum: 600000}``) admits
    every number up to it, negatives included; a whole minimum alone, every number from it."""
    if (low is None and high is None) or (low is not None and high is not None and high < low):
        return
    schema = {k: v for k, v in (("minimum", low), ("maximum", high)) if v is not None}
    pattern = _regex(number_range(schema))
    text = f"{value:.3f}"
    inside = (low is None or float(text) >= low) and (high is None or float(text) <= high)
    if text.startswith("-") and float(text) == 0:
        return  # "-0.000": in range, and a grammar from 0 up need not write it
    if len(text.split(".")[0].lstrip("-")) <= 16:
        assert bool(re.fullmatch(pattern, text)) == inside, (schema, text)


def test_a_tools_local_refs_are_its_own():
    """A tool schema with ``$defs`` and a local ``$ref`` (pydantic, FastMCP) makes a grammar:
    its references resolve in its own schema, not in the call grammar's."""
    shapes = {"type": "object", "required": ["where", "limit"], "properties": {
        "where": {"$ref": "#/$defs/Place"}, "limit": {"type": "number", "maximum": 600000},
        "default": {"$ref": "#/$defs/Place"},  # a property's name, not the keyword
        "then": {"$ref": "#/definitions/Step"}},
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}},
        "definitions": {"Step": {"anyOf": [{"type": "string"}, {"$ref": "#/definitions/Step"},
                                           {"$ref": "#"}]}}}
    tools = parse_tools([{"type": "function", "function": {"name": n, "parameters": shapes}}
                         for n in ("a", "b")])
    fmt = detect_format("<tool_call>{{ tools }}</tool_call>")
    for choice in (ToolChoice("required"), ToolChoice("function", "b")):
        grammar = call_grammar(fmt, tools, choice, parallel=True)
        assert grammar is not None
        gbnf = to_gbnf(grammar, schema_rules)
        assert "city" in gbnf and "600000" in gbnf
    # Two tools' definitions of one name stay apart (the converter names a rule after the
    # last segment of its reference: both were "Item", and the second tool got the first's).
    one = {"type": "object", "properties": {"x": {"$ref": "#/$defs/Item"}}, "$defs": {
        "Item": {"type": "object", "required": ["alpha"],
                 "properties": {"alpha": {"type": "integer"}}}}}
    two = {"type": "object", "properties": {"y": {"$ref": "#/$defs/Item"}}, "$defs": {
        "Item": {"type": "object", "required": ["beta"],
                 "properties": {"beta": {"type": "string"}}}}}
    both = parse_tools([{"type": "function", "function": {"name": n, "parameters": p}}
                        for n, p in (("one", one), ("two", two))])
    grammar = call_grammar(fmt, both, ToolChoice("required"), parallel=False)
    assert grammar is not None
    rules = dict(line.split(" ::= ", 1) for line in to_gbnf(grammar, schema_rules).splitlines()
                 if " ::= " in line)
    assert '"\\"alpha\\""' in rules["tool0-Item-alpha-kv"]
    assert '"\\"beta\\""' in rules["tool1-Item-beta-kv"]


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "minLength": 5, "maxLength": 2}, "'minLength' 5 is greater than"),
    ({"type": "array", "items": {}, "minItems": 3, "maxItems": 1}, "'minItems' 3 is greater"),
    ({"allOf": [{"type": "string"}, {"maxLength": 2}]}, "'allOf' can be enforced only"),
    ({"type": "integer", "multipleOf": 7}, "'multipleOf' cannot be enforced"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems'"),
    ({"type": "object", "minProperties": 2}, "'minProperties'"),
])
def test_a_response_format_the_grammar_cannot_hold_is_refused(schema, words):
    """Never a grammar that admits what the schema forbids; a minimum past its maximum (a
    repetition of {5,2}) took llama.cpp's grammar parser to 23 GB and the daemon to the OOM
    killer."""
    with pytest.raises(ValueError, match=re.escape(words)):
        schema_rules(schema, "root")


def test_a_tools_parameters_leave_what_no_grammar_holds_to_the_model():
    tools = parse_tools([{"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True,
                                                  "items": {"type": "string"}}}}}}])
    grammar = call_grammar(detect_format("<tool_call>{{ tools }}</tool_call>"), tools,
                           ToolChoice("required"), parallel=False)
    assert grammar is not None and grammar.described
    from localinfer.runtime.llama.sampling import described_schema_rules

    assert "tags" in to_gbnf(grammar, described_schema_rules)
    bad = {"type": "object", "properties": {"a": {"type": "string", "minLength": 3,
                                                  "maxLength": 1}}}
    with pytest.raises(ValueError, match="'minLength' 3 is greater"):
        described_schema_rules(bad, "root")


@pytest.mark.parametrize("text, words", [
    ('root ::= "a"{5,2}', "asks for at least 5 and at most 2"),
    ('root ::= "a"{2000000}', "counts past 1,000,000"),
    ('root ::= ("a" | "b"){0,3000000}', "counts past"),
])
def test_a_gbnf_repetition_llama_cpp_would_build_forever_is_refused(text, words):
    with pytest.raises(ValueError, match=words):
        gbnf_grammar(text)
    gbnf_grammar('root ::= "a"{1,3} "b"{2,} [{] "x{5,2}"')  # literals and classes are text


def test_grammar_nesting_counts_groups_outside_quotes_classes_and_comments():
    from localinfer.runtime.grammar import gbnf_nesting as _nesting

    assert _nesting('root ::= (a (b (c)?)?)? "((((" [(((] # (((((\nx ::= (\n y\n)') == 3
    assert _nesting("root ::= " + "(" * 1001 + '"a"' + ")" * 1001) == 1001
    assert _nesting(schema_rules({"type": "string", "maxLength": 524288}, "s")) < 5


@pytest.mark.parametrize("fmt,text", [
    ("hermes", 'Sure.<tool_call>\n{"name": "a", "arguments": {"s": "x\\"} {y", "n": [1, {'
               '"k": 2}]}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}\n'
               '</tool_call>'),
    ("llama3", '{"name": "a", "parameters": {"q": "{"}}'),
    ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {"q": 1}}, {"name": "b",'
                ' "arguments": {"r": "]"}}]'),
])
def test_calls_are_seen_as_they_are_written(fmt, text):
    """CallSplitter.calls, pushed a character at a time: each call's name once written,
    its arguments' text growing (braces and quotes inside strings do not end them), whole
    at the end and the same JSON as the parsed calls."""
    splitter = CallSplitter(FORMATS[fmt])
    grown: list[tuple[int, int]] = []
    for ch in text:
        splitter.push(ch)
        grown.append((len(splitter.calls), sum(len(c.arguments) for c in splitter.calls)))
    assert grown == sorted(grown)  # calls and their arguments only ever grow
    streamed = splitter.calls
    _, calls = splitter.finish()
    assert [c.name for c in streamed] == [c.name for c in calls]
    assert all(c.complete for c in streamed)
    assert [json.loads(c.arguments) for c in streamed] == \
        [json.loads(c.arguments) for c in calls]
    half = CallSplitter(FORMATS[fmt])
    half.push(text[:text.index('": {') + 6])  # cut inside the first call's arguments
    assert not half.calls[0].complete and half.calls[0].arguments.startswith("{")
