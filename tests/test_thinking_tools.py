"""Thinking and tool calls in one reply: a Qwen3-style model (Qwen2.5's tool template plus
Qwen3's thinking switch) reasons in ``<think>`` and then calls a tool; the reasoning reaches
``reasoning_content`` / ``message.thinking`` and the call ``tool_calls``, whole and streamed,
through the real openai and ollama clients on the fake backend."""

from __future__ import annotations

import json

from daemon_util import ollama_client, openai_client
from template_fixtures import GENERATION_PROMPT, QWEN3_TOOLS, QWEN25
from template_fixtures import QWEN3_REASONING as REASONING

pytest_plugins = ["daemon_fixtures"]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def test_the_template_thinks_and_takes_tools():
    assert GENERATION_PROMPT in QWEN25 and "<think>" in QWEN3_TOOLS


def test_openai_reasoning_then_a_call(qwen3):
    client = openai_client(qwen3)
    reply = client.chat.completions.create(model="qwen3:1b", messages=MESSAGES,
                                           tools=[WEATHER], logprobs=True, top_logprobs=2)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.model_extra["reasoning_content"] == REASONING
    assert not choice.message.content
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather", {"city": "Paris"})
    # Logprobs cover every token of the reply: the reasoning and the call's markers too.
    assert "".join(t.token for t in choice.logprobs.content).endswith("</tool_call>")

    chunks = list(client.chat.completions.create(model="qwen3:1b", messages=MESSAGES,
                                                 tools=[WEATHER], stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning == REASONING
    assert "".join(d.content or "" for d in deltas).strip() == ""
    calls = [t for d in deltas for t in (d.tool_calls or [])]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(t.function.arguments or "" for t in calls)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_ollama_thinking_then_a_call(qwen3):
    client = ollama_client(qwen3)
    reply = client.chat(model="qwen3:1b", messages=MESSAGES, tools=[WEATHER], think=True)
    assert reply.message.thinking == REASONING and not reply.message.content
    [call] = reply.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}

    parts = list(client.chat(model="qwen3:1b", messages=MESSAGES, tools=[WEATHER],
                             think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == REASONING
    assert "".join(p.message.content or "" for p in parts).strip() == ""
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    assert parts[-1].done


def test_a_required_call_may_follow_reasoning(qwen3):
    """tool_choice "required" constrains the reply from its first token: the grammar lets the
    model think first (test_output_fields checks the rule, test_tools_real the sampling)."""
    client = openai_client(qwen3)
    reply = client.chat.completions.create(model="qwen3:1b", messages=MESSAGES,
                                           tools=[WEATHER], tool_choice="required")
    assert reply.choices[0].message.tool_calls
    assert reply.choices[0].message.model_extra["reasoning_content"] == REASONING
    grammars = qwen3.manager.loaded["qwen3:1b-f16"].engine.backend.grammars
    assert grammars[-1].reasoning == ("<think>", "</think>") and not grammars[-1].triggers
    client.chat.completions.create(model="qwen3:1b", messages=MESSAGES, tools=[WEATHER])
    assert grammars[-1].triggers and grammars[-1].reasoning is None  # waits for <tool_call>


def test_a_call_cut_by_max_tokens_is_the_same_whole_and_streamed(home):
    """The stream sent a call as far as max_tokens let it come; the whole reply dropped it
    (no tool_calls, content ""), as OpenAI does not."""
    from daemon_util import fake_factory, install_fake_models, serve
    from template_fixtures import QWEN3_CALL

    install_fake_models("qwen3:1b-f16")
    with serve(fake_factory(reply=QWEN3_CALL, chat_template=QWEN3_TOOLS)) as d:
        client = openai_client(d)
        seen = set()
        for max_tokens in range(4, 40, 3):
            ask = {"model": "qwen3:1b", "max_tokens": max_tokens, "tools": [WEATHER],
                   "messages": [{"role": "user", "content": "Weather in Paris?"}]}
            whole = client.chat.completions.create(**ask).choices[0]
            calls: dict[int, dict] = {}
            reason = None
            for chunk in client.chat.completions.create(**ask, stream=True):
                for choice in chunk.choices:
                    reason = choice.finish_reason or reason
                    for delta in choice.delta.tool_calls or []:
                        call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                        call["name"] += delta.function.name or ""
                        call["arguments"] += delta.function.arguments or ""
            got = [{"name": c.function.name, "arguments": c.function.arguments}
                   for c in whole.message.tool_calls or []]
            assert got == [calls[i] for i in sorted(calls)], max_tokens
            assert whole.finish_reason == reason
            seen.add(bool(got) and got[0]["arguments"] != '{"city": "Paris"}')
    assert True in seen  # some cut inside the call's arguments
