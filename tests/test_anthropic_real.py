"""Anthropic's Messages API on the real starter model, through the real ``anthropic`` SDK
(sync, async and streaming): a tool round trip (call -> tool_result -> answer) with the
starter served with Qwen 2.5's tools template (as tests/test_tools_real.py does), and
count_tokens agreeing with the reply's usage."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import jsonschema
import pytest

from daemon_util import serve
from test_tools_real import qwen_factory

pytestmark = pytest.mark.model

MODEL = "gemma3:270m"
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def tool_daemon(starter_path):
    with serve(qwen_factory) as d:
        yield d


def _client(d) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=d.url, api_key="unused", max_retries=0)


def _agent_history() -> list[dict[str, Any]]:
    """An agent loop three calls in, in Anthropic's blocks: the user asked about four
    cities."""
    history: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": "What's the weather in Paris, Berlin, Rome and London?"}]}]
    for i, city in enumerate(["Paris", "Berlin", "Rome"]):
        history += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}",
                                               "name": "get_weather", "input": {"city": city}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                          "content": f"{10 + i} C"}]}]
    return history


# The 2.x SDK no longer lists the sampling fields; older ones and Claude Code send them.
GREEDY = {"extra_body": {"temperature": 0}}
ASK = {"model": MODEL, "tools": [WEATHER], **GREEDY, "max_tokens": 40,
       "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}


def _answer(messages: list[dict[str, Any]], call: anthropic.types.ToolUseBlock
            ) -> list[dict[str, Any]]:
    return [*messages,
            {"role": "assistant", "content": [{"type": "tool_use", "id": call.id,
                                               "name": call.name, "input": call.input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                          "content": [{"type": "text", "text": "12 C"}]}]}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_round_trip(tool_daemon, stream):
    client = _client(tool_daemon)
    messages = _agent_history()
    if stream:
        with client.messages.stream(messages=messages, **ASK) as s:
            kinds = {e.delta.type for e in s if e.type == "content_block_delta"}
            reply = s.get_final_message()
        assert "input_json_delta" in kinds
    else:
        reply = client.messages.create(messages=messages, **ASK)
    assert reply.stop_reason == "tool_use", reply.content
    [call] = [b for b in reply.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER["input_schema"])
    final = client.messages.create(messages=_answer(messages, call),
                                   **{**ASK, "tool_choice": {"type": "none"}})
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in final.content] == ["text"] and final.content[0].text.strip()


def test_the_async_client_round_trip(tool_daemon):
    async def main() -> None:
        client = anthropic.AsyncAnthropic(base_url=tool_daemon.url, api_key="unused",
                                          max_retries=0)
        messages = _agent_history()
        reply = await client.messages.create(messages=messages, **ASK)
        [call] = [b for b in reply.content if b.type == "tool_use"]
        jsonschema.validate(call.input, WEATHER["input_schema"])
        async with client.messages.stream(messages=_answer(messages, call),
                                          **{**ASK, "tool_choice": {"type": "none"}}) as s:
            text = "".join([t async for t in s.text_stream])
            final = await s.get_final_message()
        assert text.strip() and final.content[0].text == text

    asyncio.run(main())


def test_count_tokens_agrees_with_the_replys_usage(tool_daemon):
    client = _client(tool_daemon)
    ask = {"model": MODEL, "tools": [WEATHER],
           "system": [{"type": "text", "text": "You answer in one word.",
                       "cache_control": {"type": "ephemeral"}}],
           "messages": [{"role": "user", "content": "Is it raining in Lisbon?"}]}
    counted = client.messages.count_tokens(**ask).input_tokens
    reply = client.messages.create(max_tokens=8, **GREEDY, **ask)
    usage = reply.usage
    assert counted == usage.input_tokens + usage.cache_read_input_tokens
    again = client.messages.create(max_tokens=8, **GREEDY, **ask)
    # The second time the prompt's KV cache is reused: read from the cache, not again.
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == counted


def test_a_plain_message_streams(tool_daemon):
    client = _client(tool_daemon)
    ask = {"model": MODEL, "max_tokens": 24, **GREEDY,
           "messages": [{"role": "user", "content": "Say hello."}]}
    whole = client.messages.create(**ask)
    assert whole.content[0].text.strip() and whole.usage.output_tokens > 0
    with client.messages.stream(**ask) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text.strip() and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert 0 < final.usage.output_tokens <= 24


# The schema shapes of Claude Code 2.1's tools that llama.cpp's grammar could not take: a
# script bounded by 524,288 characters (its nested expansion overflowed llama.cpp's parser's
# stack: the daemon crashed), a property of annotations alone (any value), counts bounded by
# JavaScript's largest safe integer, and a 0..600000 number.
AGENT_TOOL = {"name": "run_script", "description": "Run a script", "input_schema": {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
    "properties": {
        "script": {"type": "string", "maxLength": 524288, "description": "the script"},
        "args": {"description": "any JSON value, passed to the script"},
        "offset": {"type": "integer", "minimum": 0, "maximum": 9007199254740991},
        "delta": {"type": "integer", "minimum": -9007199254740991,
                  "maximum": 9007199254740991},
        "timeout": {"type": "number", "minimum": 0, "maximum": 600000}},
    "required": ["script", "offset"], "additionalProperties": False}}


def test_claude_codes_tool_schemas_make_a_grammar_and_a_valid_call(tool_daemon):
    """And a system turn among the messages, as Claude Code 2.1 sends with its
    mid-conversation-system beta."""
    reply = _client(tool_daemon).messages.create(
        model=MODEL, max_tokens=200, tools=[AGENT_TOOL], tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Run the tests."},
                  {"role": "system", "content": "Agents available: none."}], **GREEDY)
    calls = [b for b in reply.content if b.type == "tool_use"]
    assert calls and all(c.name == "run_script" for c in calls)
    for call in calls:
        jsonschema.validate(call.input, AGENT_TOOL["input_schema"])
    with tool_daemon.tcp() as http:
        assert http.get("/health").status_code == 200


def test_a_grammar_nested_past_what_llama_cpp_parses_is_a_400_not_a_crash(tool_daemon):
    """A client's own GBNF is checked by the daemon; a schema's by runtime/llama/sampling.py
    (test_tools.py: the nesting it counts)."""
    deep = "root ::= " + "(" * 5000 + '"a"' + ")" * 5000 + "\n"
    with tool_daemon.tcp() as http:
        r = http.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 4, "grammar": deep,
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "nested" in r.json()["error"]["message"]
        many = {"type": "array", "items": {"type": "integer"}, "maxItems": 5000}
        r = http.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "n", "schema": many}}})
        assert r.status_code == 400 and "nests groups" in r.json()["error"]["message"]
        assert http.get("/health").status_code == 200
