"""gpt-oss's harmony format: the reasoning split from the answer by channel, tool calls parsed
from messages to ``functions.NAME`` and constrained by a lazy grammar, and both APIs' shapes,
on the fake backend with gpt-oss's own chat template (tests/templates/gpt-oss.jinja) and the
real openai and ollama clients. The vocabulary's side is in test_never_sampled.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from daemon_util import fake_factory, install_fake_models, ollama_client, openai_client, serve
from localinfer.errors import InvalidRequest
from localinfer.runtime.chat_template import ChatTemplate
from localinfer.runtime.grammar import to_gbnf
from localinfer.runtime.llama import schema_rules
from localinfer.runtime.thinking import (
    HarmonySplitter,
    split_reply,
    template_vars,
    thinking_format,
)
from localinfer.runtime.tools import (
    CallSplitter,
    ToolChoice,
    call_grammar,
    detect_format,
    parse_reply,
    parse_tools,
)
from localinfer.runtime.types import Message, ToolCall

pytest_plugins = ["daemon_fixtures"]

GPT_OSS = (Path(__file__).parent / "templates" / "gpt-oss.jinja").read_text()
HARMONY = thinking_format(GPT_OSS)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
# Replies as gpt-oss writes them after the prompt's "<|start|>assistant" (<|return|> and
# <|call|> end the generation: the engine keeps no text of them).
ANSWER = ("<|channel|>analysis<|message|>Two and two.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>Four.")
CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city":"Paris"}')


def test_harmony_is_told_from_the_template():
    assert HARMONY is not None and HARMONY.harmony and HARMONY.takes_effort
    assert detect_format(GPT_OSS).name == "harmony"
    assert template_vars(HARMONY, "high", model="o") == {"reasoning_effort": "high"}
    with pytest.raises(InvalidRequest, match="always thinks"):
        template_vars(HARMONY, False, model="o")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 1000])
def test_split_is_the_same_however_the_text_is_cut(size):
    for reply, thinking, content in [
        (ANSWER, "Two and two.", "Four."),
        (ANSWER + "<|return|>", "Two and two.", "Four."),
        (CALL, "Need the weather.", "<|channel|>commentary to=functions.get_weather"
         ' <|constrain|>json<|message|>{"city":"Paris"}<|call|>'),
    ]:
        splitter = HarmonySplitter()
        parts = [splitter.push(reply[i:i + size]) for i in range(0, len(reply), size)]
        parts.append(splitter.flush())
        assert "".join(t for t, _ in parts) == thinking
        assert "".join(c for _, c in parts) == content


def test_split_edge_cases():
    assert HARMONY is not None
    # gpt-oss-20b's stray "<|channel|>commentary to=assistant" before the real channel
    assert split_reply(HARMONY, "<|channel|>commentary to=assistant<|channel|>analysis"
                                "<|message|>Hm.<|end|><|start|>assistant<|channel|>final"
                                "<|message|>Hi.") == ("Hm.", "Hi.")
    # a preamble in the commentary channel is the answer's; the recipient in the role's part
    content = split_reply(HARMONY, "<|channel|>commentary<|message|>Checking.<|end|>"
                                   "<|start|>assistant to=functions.get_weather<|channel|>"
                                   'commentary json<|message|>{"city":"Paris"}<|call|>')[1]
    assert content.startswith("Checking.<|channel|>commentary to=functions.get_weather ")
    # a call to a built-in tool no request offers is dropped
    assert split_reply(HARMONY, "<|channel|>analysis to=python<|message|>print(1)<|call|>"
                       ) == ("", "")
    assert split_reply(HARMONY, "Plain words, no channel.") == ("", "Plain words, no channel.")
    assert split_reply(HARMONY, "<|channel|>analysis<|message|>cut off") == ("cut off", "")
    assert split_reply(HARMONY, "<|channel|>analysis<|message|>a<|end|><|start|>assi"
                       ) == ("a", "")  # a header cut off by max_tokens is dropped
    assert split_reply(HARMONY, "Already thinking<|end|><|start|>assistant<|channel|>final"
                                "<|message|>Done", thinking=True) == ("Already thinking", "Done")


def test_calls_parse_back_and_stream_held():
    fmt = detect_format(GPT_OSS)
    content = split_reply(HARMONY, CALL)[1]
    text, [call] = parse_reply(fmt, "Checking." + content)
    assert text == "Checking." and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    splitter = CallSplitter(fmt)
    sent = "".join(splitter.push(p) for p in ["Check", "ing.", content[:9], content[9:]])
    assert sent == "Checking."
    assert splitter.finish()[1][0].name == "get_weather"
    cut = content.replace("<|call|>", "")[:-4]  # arguments cut off by max_tokens: dropped
    assert parse_reply(fmt, cut) == ("", [])


def test_call_grammar_names_each_function_before_its_arguments():
    fmt = detect_format(GPT_OSS)
    tools = parse_tools([WEATHER, {"type": "function", "function": {"name": "now"}}])
    auto = call_grammar(fmt, tools, ToolChoice("auto"), parallel=True)
    assert auto is not None and auto.heads == ("functions.get_weather", "functions.now")
    [trigger] = auto.triggers
    # The grammar starts at the function's name, in either place gpt-oss writes the recipient,
    # at the start of the reply or after the reasoning; never inside a message's text.
    for text in [
        "<|channel|>commentary to=functions.",
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.",
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary"
        " to=functions.",
    ]:
        match = re.fullmatch(trigger, text)
        assert match is not None and match.start(1) == text.index("functions.")
    assert re.fullmatch(trigger, "<|channel|>analysis<|message|>I could say to=functions.") \
        is None
    gbnf = to_gbnf(auto, schema_rules)
    root = gbnf.splitlines()[0]
    assert root.startswith('root ::= ("functions.get_weather" ')
    assert '"<|message|>" json-value-0 | "functions.now" ' in root
    assert root.endswith('"<|message|>" json-value-1)')
    assert len(re.findall(r"^space ::=", gbnf, re.M)) == 1  # shared rules written once
    required = call_grammar(fmt, tools, ToolChoice("required"), parallel=True)
    assert required is not None and not required.triggers
    root = to_gbnf(required, schema_rules).splitlines()[0]
    assert root.startswith('root ::= ("<|channel|>analysis<|message|>" ')  # may reason first
    assert '"to=" ("functions.get_weather" ' in root
    # Each function's schema is converted alone: its local $refs resolve in it.
    listed = parse_tools([{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}},
        "$defs": {"Item": {"type": "string", "enum": ["a", "b"]}}}}}])
    pick = call_grammar(fmt, listed, ToolChoice("required"), parallel=False)
    assert pick is not None and '"\\"a\\""' in to_gbnf(pick, schema_rules)


def test_the_template_renders_the_history_calls_and_results():
    chat = ChatTemplate(GPT_OSS)
    assert chat.supports_tools
    text = chat.render([
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=(ToolCall("get_weather", '{"city": "Paris"}',
                                                      "call_1"),)),
        Message("tool", "18 C", tool_call_id="call_1", tool_name="get_weather"),
    ], tools=[WEATHER], template_vars={"reasoning_effort": "low"})
    assert "Reasoning: low" in text and "type get_weather = (_: {\ncity: string," in text
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
            '{"city": "Paris"}<|call|>') in text
    assert text.endswith('<|start|>functions.get_weather to=assistant<|channel|>commentary'
                         '<|message|>"18 C"<|end|><|start|>assistant')


def _reply(prompt: str) -> str:
    """gpt-oss as scripted: the answer once the tool's result is in, a call when tools are
    offered, else the answer; the reasoning says which effort the prompt asked for."""
    effort = re.search(r"Reasoning: (\w+)", prompt)
    thought = f"<|channel|>analysis<|message|>Effort {effort and effort.group(1)}.<|end|>"
    if 'to=assistant<|channel|>commentary<|message|>"18 C"<|end|>' in prompt:
        return thought + "<|start|>assistant<|channel|>final<|message|>18 C in Paris."
    if "namespace functions" in prompt:
        return CALL.replace("<|channel|>analysis<|message|>Need the weather.<|end|>", thought)
    return thought + "<|start|>assistant<|channel|>final<|message|>Four."


@pytest.fixture
def gpt_oss(home):
    install_fake_models("oss:1b-f16")
    with serve(fake_factory(reply=_reply, chat_template=GPT_OSS)) as d:
        yield d


def test_openai_client_reasoning_and_effort(gpt_oss):
    client = openai_client(gpt_oss)
    messages = [{"role": "user", "content": "2+2?"}]
    whole = client.chat.completions.create(model="oss:1b", messages=messages,
                                           reasoning_effort="low")
    message = whole.choices[0].message
    assert (message.content, message.model_extra["reasoning_content"]) == (
        "Four.", "Effort low.")
    chunks = list(client.chat.completions.create(model="oss:1b", messages=messages,
                                                 stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content", "") for d in deltas) == (
        "Effort medium.")  # the template's default
    assert "".join(d.content or "" for d in deltas) == "Four."
    assert not any("<|" in (d.content or "") for d in deltas)


def test_ollama_client_thinking_and_effort(gpt_oss):
    client = ollama_client(gpt_oss)
    messages = [{"role": "user", "content": "2+2?"}]
    whole = client.chat(model="oss:1b", messages=messages, think="high")
    assert (whole.message.thinking, whole.message.content) == ("Effort high.", "Four.")
    parts = list(client.chat(model="oss:1b", messages=messages, stream=True, think="low"))
    assert "".join(p.message.thinking or "" for p in parts) == "Effort low."
    assert "".join(p.message.content for p in parts) == "Four."
    generated = client.generate(model="oss:1b", prompt="2+2?")
    assert (generated.thinking, generated.response) == ("Effort medium.", "Four.")


def test_openai_tool_call_round_trip(gpt_oss):
    client = openai_client(gpt_oss)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.chat.completions.create(model="oss:1b", messages=messages, tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert choice.message.model_extra["reasoning_content"] == "Effort medium."
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather", {"city": "Paris"})
    grammar = gpt_oss.manager.loaded["oss:1b-f16"].engine.backend.grammars[-1]
    assert grammar.triggers and grammar.heads == ("functions.get_weather",)
    chunks = list(client.chat.completions.create(model="oss:1b", messages=messages,
                                                 tools=[WEATHER], stream=True))
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Paris"}
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
    final = client.chat.completions.create(model="oss:1b", messages=messages, tools=[WEATHER])
    assert final.choices[0].message.content == "18 C in Paris."
    assert final.choices[0].finish_reason == "stop"


def test_ollama_tool_call_round_trip(gpt_oss):
    client = ollama_client(gpt_oss)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.chat(model="oss:1b", messages=messages, tools=[WEATHER], think="low")
    [call] = reply.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert reply.message.thinking == "Effort low."
    parts = list(client.chat(model="oss:1b", messages=messages, tools=[WEATHER], stream=True))
    assert [c.function.arguments for p in parts for c in (p.message.tool_calls or [])] == [
        {"city": "Paris"}]
    messages += [reply.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_name": "get_weather", "content": "18 C"}]
    final = client.chat(model="oss:1b", messages=messages, tools=[WEATHER])
    assert final.message.content == "18 C in Paris." and not final.message.tool_calls
