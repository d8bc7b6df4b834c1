"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) on the fake backend,
through the real ``anthropic`` SDK and raw HTTP: the reply's shape, the stream's events in
order, tool calls and thinking (a Qwen3-style template), errors in Anthropic's shape, the
x-api-key header, and a request shaped as Claude Code sends it."""

from __future__ import annotations

import asyncio
import json
import time

import anthropic
import httpx
import pytest

from daemon_util import REPLY, fake_factory, install_fake_models, serve
from localinfer.daemon.fields import ROUTES
from localinfer.daemon.state import DaemonSettings
from template_fixtures import QWEN3_CALL, QWEN3_TOOLS
from template_fixtures import QWEN3_REASONING as REASONING

pytest_plugins = ["daemon_fixtures"]

HI = [{"role": "user", "content": "hi"}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


def client(d, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=d.url, api_key=api_key, max_retries=0)


def events(raw: str) -> list[tuple[str, dict]]:
    """An SSE body as (event, data) pairs."""
    out = []
    for block in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_a_message_has_anthropics_shape(daemon):
    reply = client(daemon).messages.create(model="fake:1b", max_tokens=64, messages=HI)
    assert reply.id.startswith("msg_") and reply.type == "message"
    assert reply.role == "assistant" and reply.model == "fake:1b-f16"
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text == REPLY
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    assert reply.usage.output_tokens > 0 and reply.usage.input_tokens > 0
    assert reply.usage.cache_read_input_tokens == 0


def test_max_tokens_and_stop_sequences_say_why_it_stopped(daemon):
    c = client(daemon)
    short = c.messages.create(model="fake:1b", max_tokens=2, messages=HI)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2
    stopped = c.messages.create(model="fake:1b", max_tokens=64, messages=HI,
                                stop_sequences=["never", "fake"])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "fake")
    assert stopped.content[0].text == "Hello from the "


def test_the_stream_sends_the_events_in_anthropics_order(daemon):
    with daemon.uds() as http:
        raw = http.post("/v1/messages", json={"model": "fake:1b", "max_tokens": 64,
                                              "messages": HI, "stream": True}).text
    sequence = events(raw)
    kinds = [kind for kind, _ in sequence]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert all(kind == data["type"] for kind, data in sequence)
    start = sequence[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    text = "".join(d["delta"]["text"] for k, d in sequence if k == "content_block_delta")
    assert text == REPLY
    delta = sequence[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] > 0
    # The SDK reads the same stream into the same message.
    with client(daemon).messages.stream(model="fake:1b", max_tokens=64, messages=HI) as s:
        assert "".join(s.text_stream) == REPLY
        final = s.get_final_message()
    assert final.content[0].text == REPLY and final.stop_reason == "end_turn"


def test_the_async_client_streams(daemon):
    async def main() -> tuple[str, str]:
        c = anthropic.AsyncAnthropic(base_url=daemon.url, api_key="unused", max_retries=0)
        reply = await c.messages.create(model="fake:1b", max_tokens=64, messages=HI)
        async with c.messages.stream(model="fake:1b", max_tokens=64, messages=HI) as s:
            text = "".join([t async for t in s.text_stream])
        return reply.content[0].text, text

    assert asyncio.run(main()) == (REPLY, REPLY)


def test_reasoning_then_a_call_whole_and_streamed(qwen3):
    c = client(qwen3)
    ask = {"model": "qwen3:1b", "max_tokens": 2000, "tools": [WEATHER],
           "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    reply = c.messages.create(**ask, thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in reply.content] == ["thinking", "tool_use"]
    assert reply.content[0].thinking == REASONING
    call = reply.content[1]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    assert call.input == {"city": "Paris"} and reply.stop_reason == "tool_use"

    with c.messages.stream(**ask) as s:
        seen = list(s)
        final = s.get_final_message()
    kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in seen]
    assert ("content_block_delta", "thinking_delta") in kinds
    # The call's input streams as the model writes it: several deltas, which the SDK
    # accumulates into a growing snapshot of the input.
    assert kinds.count(("content_block_delta", "input_json_delta")) >= 3
    snapshots = [e.snapshot for e in seen if e.type == "input_json"]
    assert len(snapshots) >= 3 and snapshots[-1] == {"city": "Paris"}
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[1].input == {"city": "Paris"} and final.stop_reason == "tool_use"

    hidden = c.messages.create(**ask, thinking={"type": "enabled", "budget_tokens": 1024,
                                                "display": "omitted"})
    assert hidden.content[0].type == "thinking" and hidden.content[0].thinking == ""


def test_the_history_reaches_the_template(home):
    """tool_use and tool_result blocks (string and block content, is_error), system blocks
    and earlier thinking become the calls, tool messages and system prompt the template
    renders; the earlier reasoning is left out, as the templates leave it out."""
    install_fake_models("qwen3:1b-f16")
    prompts: list[str] = []

    def reply(prompt: str) -> str:
        prompts.append(prompt)
        return "Sunny."

    body = {"model": "qwen3:1b", "max_tokens": 50, "tools": [WEATHER],
            "system": [{"type": "text", "text": "You help.",
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "use the tool", "signature": "abc"},
                    {"type": "redacted_thinking", "data": "xyz"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                     "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "12 C"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no rain",
                     "is_error": True},
                    {"type": "text", "text": "And tomorrow?"}]}]}
    with serve(fake_factory(reply=reply, chat_template=QWEN3_TOOLS)) as d:
        answer = client(d).messages.create(**body)
    assert answer.content[0].text == "Sunny." and answer.stop_reason == "end_turn"
    prompt = prompts[-1]
    assert prompt.index("You help.") < prompt.index("get_weather") < prompt.index("Paris?")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\n12 C\n</tool_response>" in prompt
    assert "<tool_response>\nError: no rain\n</tool_response>" in prompt
    assert prompt.index("Error: no rain") < prompt.index("And tomorrow?")
    assert "Let me look." in prompt and "use the tool" not in prompt and "xyz" not in prompt


def test_count_tokens_equals_the_replys_input_tokens(qwen3):
    """The same tokenization (template, system, tools) on both routes: on a prompt no
    earlier request cached, count_tokens' input_tokens is the reply's input_tokens."""
    c = client(qwen3)
    ask = {"model": "qwen3:1b", "tools": [WEATHER], "system": "Be brief.",
           "messages": [{"role": "user", "content": "Weather in Oslo?"}]}
    counted = c.messages.count_tokens(**ask).input_tokens
    reply = c.messages.create(max_tokens=200, **ask)
    assert counted == reply.usage.input_tokens and reply.usage.cache_read_input_tokens == 0
    assert counted > c.messages.count_tokens(model="qwen3:1b", messages=ask["messages"]
                                             ).input_tokens  # the tools are in the prompt
    # Asked again, the prompt's start comes from the KV cache: read, not counted twice.
    again = c.messages.create(max_tokens=200, **ask)
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == counted


@pytest.mark.parametrize("choice,ok", [
    ({"type": "auto"}, True), ({"type": "any"}, True),
    ({"type": "tool", "name": "get_weather"}, True),
    ({"type": "auto", "disable_parallel_tool_use": True}, True),
    ({"type": "tool", "name": "nope"}, False), ({"type": "function"}, False)])
def test_tool_choice(qwen3, choice, ok):
    with qwen3.uds() as http:
        r = http.post("/v1/messages", json={
            "model": "qwen3:1b", "max_tokens": 200, "tools": [WEATHER], "tool_choice": choice,
            "messages": [{"role": "user", "content": "Weather in Paris?"}]})
    assert r.status_code == (200 if ok else 400), r.text
    if ok:
        assert r.json()["stop_reason"] == "tool_use"
    else:
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_tool_choice_none_answers_without_a_call(qwen3):
    reply = client(qwen3).messages.create(
        model="qwen3:1b", max_tokens=200, tools=[WEATHER], tool_choice={"type": "none"},
        messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert reply.stop_reason == "end_turn"
    assert all(b.type != "tool_use" for b in reply.content)


BAD = [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "image"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "document"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": "image"}]}]}]},
     "image"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "web_search_20250305"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "bash_20250124"),
    ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
    ({"container": "c1"}, "container"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10}}, "budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "max_tokens"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
    ({"stop": ["x"]}, "stop"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"output_config": {"effort": "extreme"}}, "effort"),
    ({"output_config": {"task_budget": 5}}, "task_budget"),
    # Not strings where a name is expected: a 400, not a 500 (a list cannot be looked up).
    ({"messages": [{"role": "user", "content": [{"type": [1]}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": {}}]}]}]},
     "messages[0].content[0].content[0]"),
    ({"tool_choice": {"type": [1]}}, "tool_choice"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}}],
      "tool_choice": {"type": "tool", "name": [1]}}, "tool_choice.name"),
    ({"output_config": {"effort": [1]}}, "output_config.effort"),
    # cache_control saves prefixes to disk: garbage is not taken for "ephemeral".
    ({"cache_control": "abc"}, "cache_control"),
    ({"cache_control": {"type": "ephemeral", "ttl": "1d"}}, "cache_control"),
    ({"system": [{"type": "text", "text": "x", "cache_control": True}]}, "cache_control"),
    # Fields Anthropic's API does not define, nested as at the top: named, never dropped.
    ({"messages": [{"role": "user", "content": "hi", "foo": 1}]}, "messages[0].foo"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "foo": 1}]}]},
     "messages[0].content[0].foo"),
    ({"metadata": {"foo": "x"}}, "metadata.foo"),
    ({"metadata": {"user_id": 5}}, "metadata.user_id"),
    # What Anthropic's API refuses that the engine would take.
    ({"temperature": 5}, "temperature"),
    ({"stop_sequences": "he"}, "stop_sequences"),
    ({"stop_sequences": [""]}, "stop_sequences"),
    ({"tools": [{"name": "bad name!", "input_schema": {"type": "object"}}]}, "tools[0].name"),
    ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, "tools[0].input_schema"),
    ({"messages": [{"role": "user", "content": ""}]}, "messages[0].content"),
    ({"messages": [{"role": "system", "content": "Be brief."}]}, "no user turn"),
    # A tool_result answers the turn before's tool_use, and each tool_use is answered.
    ({"messages": [*HI, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2",
                                      "content": "x"}]}]}, "'messages[2].content[0].tool_use_id'"),
    ({"messages": [*HI, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
        {"role": "user", "content": "and then?"}]}, "toolu_1 have no tool_result"),
    ({"messages": [*HI, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
        {"role": "user", "content": "and then?"},
        {"role": "assistant", "content": "ok"}]}, "toolu_1 have no tool_result"),
]


def test_what_real_clients_send_back_is_accepted(home):
    """A tool_use block with the SDK's caller and toolset_name, results split over user
    turns (one per message, as some libraries send them), and an empty assistant turn (the
    daemon's own empty reply sent back)."""
    install_fake_models("qwen3:1b-f16")
    calls = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "a"},
         "caller": {"type": "direct"}},
        {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "b"}}]}
    with serve(fake_factory(reply="Sunny.", chat_template=QWEN3_TOOLS)) as d:
        answer = client(d).messages.create(model="qwen3:1b", max_tokens=20, tools=[WEATHER],
                                           messages=[
            *HI, {"role": "assistant", "content": []}, *HI, calls,
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": "12 C", "toolset_name": "weather"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2",
                                          "content": "14 C"}]}])
    assert answer.content[0].text == "Sunny."



@pytest.mark.parametrize("extra,name", BAD, ids=[n for _, n in BAD])
def test_refusals_are_400s_in_anthropics_shape_naming_the_field(daemon, extra, name):
    c = client(daemon)
    body = {"model": "fake:1b", "max_tokens": 64, "messages": HI, **extra}
    with pytest.raises(anthropic.BadRequestError) as caught:
        c.post("/v1/messages", body=body, cast_to=httpx.Response)
    error = caught.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert name in error["error"]["message"]


def test_thinking_on_a_model_that_does_not_think_is_refused(daemon):
    with pytest.raises(anthropic.BadRequestError, match="does not support thinking"):
        client(daemon).messages.create(model="fake:1b", max_tokens=4096, messages=HI,
                                       thinking={"type": "enabled", "budget_tokens": 1024})
    assert client(daemon).messages.create(model="fake:1b", max_tokens=64, messages=HI,
                                          thinking={"type": "disabled"}).content


def test_not_found_errors(daemon):
    c = client(daemon)
    with pytest.raises(anthropic.NotFoundError) as caught:
        c.messages.create(model="no-such-model", max_tokens=8, messages=HI)
    assert caught.value.body["error"]["type"] == "not_found_error"
    with daemon.uds() as http:
        for path in ("/v1/messages/batches", "/v1/messages/abc/def"):
            r = http.post(path, json={})
            assert r.status_code == 404
            assert r.json() == {"type": "error", "error": {
                "type": "not_found_error", "message": f"no such endpoint: {path}"}}
        r = http.post("/v1/messages/count_tokens", json={"model": "nope", "messages": HI})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        # Elsewhere the shapes stay OpenAI's and Ollama's.
        assert http.post("/v1/nothing", json={}).json()["error"]["type"] == \
            "invalid_request_error"


def test_an_error_mid_stream_is_an_error_event(home):
    install_fake_models("fake:1b-f16")

    def reply(prompt: str) -> str:
        raise RuntimeError("the backend broke")

    with serve(fake_factory(reply=reply)) as d, d.uds() as http:
        raw = http.post("/v1/messages", json={"model": "fake:1b", "max_tokens": 8,
                                              "messages": HI, "stream": True}).text
    sequence = events(raw)
    assert sequence[0][0] == "message_start"
    kind, data = sequence[-1]
    assert kind == "error" and data["type"] == "error"
    assert data["error"]["type"] == "api_error" and data["error"]["message"]


def test_the_api_key_may_come_as_x_api_key(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(), settings=DaemonSettings(api_key="s3cret")) as d:
        ok = client(d, api_key="s3cret").messages.create(model="fake:1b", max_tokens=8,
                                                         messages=HI)
        assert ok.content
        bearer = anthropic.Anthropic(base_url=d.url, auth_token="s3cret", api_key=None,
                                     max_retries=0)
        assert bearer.messages.count_tokens(model="fake:1b", messages=HI).input_tokens
        with pytest.raises(anthropic.AuthenticationError) as caught:
            client(d, api_key="wrong").messages.create(model="fake:1b", max_tokens=8,
                                                       messages=HI)
        assert caught.value.body["error"]["type"] == "authentication_error"


def test_a_claude_code_request(qwen3):
    """As Claude Code sends it (its gateway documentation and captured traffic): the betas
    and version headers, ``?beta=true``, system blocks with cache_control, a tool whose
    schema carries ``$schema`` and ``additionalProperties``, metadata.user_id, streaming."""
    tool = {"name": "Read", "description": "Read a file",
            "input_schema": {"$schema": "http://json-schema.org/draft-07/schema#",
                             "type": "object", "additionalProperties": False,
                             "properties": {"file_path": {"type": "string"}},
                             "required": ["file_path"]},
            "cache_control": {"type": "ephemeral"}}
    body = {"model": "qwen3:1b", "max_tokens": 32000, "temperature": 1, "stream": True,
            "metadata": {"user_id": "user_abc_account__session_1"},
            "system": [{"type": "text", "text": "You are Claude Code.",
                        "cache_control": {"type": "ephemeral"}},
                       {"type": "text", "text": "Work in /repo."}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
            "tools": [tool]}
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "anything",
               "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
                                 "fine-grained-tool-streaming-2025-05-14",
               "x-app": "cli", "user-agent": "claude-cli/2.0.36 (external, cli)"}
    with qwen3.tcp() as http:
        raw = http.post("/v1/messages?beta=true", json=body, headers=headers)
        assert raw.status_code == 200, raw.text
        sequence = events(raw.text)
        assert sequence[0][0] == "message_start" and sequence[-1][0] == "message_stop"
        assert sequence[-2][1]["delta"]["stop_reason"] == "tool_use"
        count = http.post("/v1/messages/count_tokens?beta=true", headers=headers, json={
            k: body[k] for k in ("model", "system", "messages", "tools")})
        assert count.status_code == 200 and count.json()["input_tokens"] > 0


DOCUMENTED = {
    # Anthropic's Messages API reference (the anthropic SDK's MessageCreateParams, 2.17,
    # and its beta's), as of 2026-12; temperature, top_p and top_k from the earlier
    # reference (the 2.x SDK sends them in extra_body; Claude Code sends temperature).
    "/v1/messages": {
        "model", "max_tokens", "messages", "system", "stream", "stop_sequences",
        "temperature", "top_p", "top_k", "thinking", "tools", "tool_choice", "metadata",
        "cache_control", "container", "diagnostics", "inference_geo", "output_config",
        "service_tier", "speed", "user_profile_id", "workspace_id", "mcp_servers",
        "context_management", "output_format", "billing_policy", "compaction",
        "fallback_credit_token", "fallbacks", "thread"},
    "/v1/messages/count_tokens": {
        "model", "messages", "system", "thinking", "tools", "tool_choice", "cache_control",
        "output_config", "speed", "user_profile_id", "workspace_id", "mcp_servers",
        "context_management", "output_format"},
}


@pytest.mark.parametrize("route", sorted(DOCUMENTED))
def test_every_documented_field_is_listed(route):
    """Each field Anthropic documents is honoured, ignored with a reason, or refused: a
    field the API gains is noticed here (add it to DOCUMENTED and to daemon/fields.py)."""
    rule = ROUTES[route]
    listed = {*rule.honoured, *rule.elsewhere, *rule.ignored, *rule.refused}
    assert DOCUMENTED[route] - listed == set()
    assert listed - DOCUMENTED[route] <= {"priority"}  # localinfer's own


def test_ignored_fields_are_accepted(daemon):
    with daemon.uds() as http:
        r = http.post("/v1/messages", json={
            "model": "fake:1b", "max_tokens": 16, "messages": HI,
            "metadata": {"user_id": "u1"}, "service_tier": "auto", "speed": "fast",
            "cache_control": {"type": "ephemeral"}, "inference_geo": "us",
            "context_management": {}, "fallbacks": [], "priority": "interactive"})
        assert r.status_code == 200, r.text
        r = http.post("/v1/messages/count_tokens", json={
            "model": "fake:1b", "messages": HI, "cache_control": {"type": "ephemeral"}})
        assert r.status_code == 200, r.text


def test_effort_reaches_a_template_that_takes_one(home):
    """output_config.effort is gpt-oss's reasoning_effort; a template without an effort
    setting (and a model that does not think) answers as usual."""
    install_fake_models("effort:1b-f16", "fake:1b-f16")
    prompts: list[str] = []

    def reply(prompt: str) -> str:
        prompts.append(prompt)
        return "ok"

    template = ("{{ '<|channel|>' }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
                "effort={{ reasoning_effort | default('none') }}")
    with serve(fake_factory(reply=reply, chat_template=template)) as d:
        for effort, seen in (("max", "effort=high"), ("low", "effort=low"),
                             (None, "effort=none")):
            config = {"output_config": {"effort": effort}} if effort else {}
            with d.uds() as http:
                r = http.post("/v1/messages", json={"model": "effort:1b", "max_tokens": 8,
                                                    "messages": HI, **config})
            assert r.status_code == 200, r.text
            assert prompts[-1].endswith(seen)
    with serve(fake_factory(reply=REPLY)) as d, d.uds() as http:
        r = http.post("/v1/messages", json={"model": "fake:1b", "max_tokens": 8, "messages": HI,
                                            "output_config": {"effort": "high"}})
        assert r.status_code == 200, r.text


def test_output_format_reaches_the_sampler(daemon):
    """output_config.format and the beta's output_format are the reply's JSON schema; both,
    or one with tools, are refused."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    with daemon.uds() as http:
        for extra in ({"output_config": {"format": {"type": "json_schema", "schema": schema}}},
                      {"output_format": {"type": "json_schema", "schema": schema}}):
            r = http.post("/v1/messages", json={"model": "fake:1b", "max_tokens": 8,
                                                "messages": HI, **extra})
            assert r.status_code == 200, r.text
        grammars = daemon.manager.loaded["fake:1b-f16"].engine.backend.grammars
        assert [g.schema_json for g in grammars] == [schema, schema]
        both = http.post("/v1/messages", json={
            "model": "fake:1b", "max_tokens": 8, "messages": HI,
            "output_format": {"type": "json_schema", "schema": schema},
            "output_config": {"format": {"type": "json_schema", "schema": schema}}})
        assert both.status_code == 400 and "output_format" in both.json()["error"]["message"]
        bad = http.post("/v1/messages", json={
            "model": "fake:1b", "max_tokens": 8, "messages": HI,
            "output_config": {"format": {"type": "json_object"}}})
        assert bad.status_code == 400 and "output_config.format" in bad.text


def test_models_are_listed_in_anthropics_shape_to_an_anthropic_client(daemon):
    """Claude Code lists a gateway's models at its start (with anthropic-version); OpenAI's
    clients still get OpenAI's list."""
    c = client(daemon)
    page = c.models.list()
    assert {m.id for m in page.data} >= {"fake:1b-f16", "other:2b-f16"}
    assert all(m.type == "model" and m.display_name == m.id for m in page.data)
    assert c.models.retrieve("fake:1b-f16").created_at.year >= 2024
    # By any name a request may give it, as the generating routes take it: the family's too.
    assert c.models.retrieve("fake").id == "fake:1b-f16"
    assert c.models.retrieve("FAKE:1B").id == "fake:1b-f16"  # as a request may spell it
    # Not found: Anthropic's error shape for Anthropic's client (OpenAI's shape before).
    with pytest.raises(anthropic.NotFoundError) as caught:
        c.models.retrieve("nope")
    assert caught.value.body["error"]["type"] == "not_found_error"
    with daemon.uds() as http:
        assert http.get("/v1/models").json()["object"] == "list"
        assert http.get("/v1/models/nope").json()["error"]["code"] == "model_not_found"


def test_a_full_queue_is_an_overloaded_error(home):
    install_fake_models("fake:1b-f16")
    # Words that never repeat: prompt-lookup speculation cannot hurry the first reply.
    factory = fake_factory(max_queue=1, reply=" ".join(f"w{i}" for i in range(2000)),
                           step_delay_s=0.005, n_slots=1)
    long = {"model": "fake:1b", "max_tokens": 4000, "messages": HI, "stream": True}
    with serve(factory) as d, d.uds() as c1, d.uds() as c2, d.uds() as c3:
        with c1.stream("POST", "/v1/messages", json=long) as r1:
            lines = r1.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)
            with c2.stream("POST", "/v1/messages", json=long):
                # The second waits in the queue once the engine has it (its reply's headers
                # can come first: on a busy machine the third overtook it).
                engine = d.manager.loaded["fake:1b-f16"].engine
                deadline = time.monotonic() + 30
                while engine.stats().queue_depth < 1 and time.monotonic() < deadline:
                    time.sleep(0.01)
                third = c3.post("/v1/messages", json={**long, "stream": False})
    assert third.status_code == 529 and third.headers["retry-after"]  # Anthropic's overloaded
    assert third.json()["error"]["type"] == "overloaded_error"


def test_a_last_assistant_turn_is_continued(home):
    """Anthropic's prefill: a last assistant message of text is the reply's start, written
    into the prompt after the template's assistant opening; the reply continues it."""
    install_fake_models("fake:1b-f16")
    prompts: list[str] = []

    def reply(prompt: str) -> str:
        prompts.append(prompt)
        return '"Paris"}'

    with serve(fake_factory(reply=reply)) as d:
        answer = client(d).messages.create(model="fake:1b", max_tokens=16, messages=[
            {"role": "user", "content": "Capital of France, as JSON?"},
            {"role": "assistant", "content": '{"capital":'}])
        # As Anthropic's API: a prefill may not end in white space.
        with pytest.raises(anthropic.BadRequestError, match="cannot end with white space"):
            client(d).messages.create(model="fake:1b", max_tokens=16, messages=[
                {"role": "user", "content": "Capital of France, as JSON?"},
                {"role": "assistant", "content": '{"capital": '}])
    assert prompts[-1].endswith('<start_of_turn>model\n{"capital":')
    assert answer.content[0].text == '"Paris"}'


def test_pings_flow_while_a_long_prompt_is_read(home, monkeypatch):
    """A slow prefill (here 0.6 s, at 0.05 s a ping) sends pings before the first token, so
    a client's read timeout does not fire while a long prompt is read; the SDK's stream
    reads through them."""
    from localinfer.daemon import anthropic_routes
    monkeypatch.setattr(anthropic_routes, "PING_INTERVAL_S", 0.05)
    install_fake_models("fake:1b-f16")
    long_prompt = [{"role": "user", "content": "word " * 60}]
    with serve(fake_factory(reply=REPLY, prompt_delay_s=0.01)) as d:
        with d.uds() as http:
            raw = http.post("/v1/messages", json={"model": "fake:1b", "max_tokens": 64,
                                                  "messages": long_prompt,
                                                  "stream": True}).text
        kinds = [kind for kind, _ in events(raw)]
        first_block = kinds.index("content_block_start")
        assert kinds[0] == "message_start"
        assert kinds[1:first_block] == ["ping"] * (first_block - 1) and first_block - 1 >= 4
        assert kinds[-1] == "message_stop"
        c = anthropic.Anthropic(base_url=d.url, api_key="unused", max_retries=0,
                                timeout=anthropic.Timeout(5.0, read=0.3))
        with c.messages.stream(model="fake:1b", max_tokens=64, messages=long_prompt) as s:
            assert s.get_final_message().content[0].text == REPLY


def test_two_calls_stream_their_inputs_piece_by_piece(home):
    """Parallel calls, each a tool_use block opened once its name is written, its input in
    several input_json_delta events; the SDK's final message holds both inputs whole."""
    install_fake_models("qwen3:1b-f16")
    note = "line one\nline two with {braces} and \"quotes\""
    calls = "\n".join(
        "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"
        for name, args in (("get_weather", {"city": "Paris"}),
                           ("write_note", {"path": "a b.txt", "text": note})))
    note_tool = {"name": "write_note", "input_schema": {"type": "object", "properties": {
        "path": {"type": "string"}, "text": {"type": "string"}}}}
    with serve(fake_factory(reply=calls, chat_template=QWEN3_TOOLS)) as d:
        c = client(d)
        with c.messages.stream(model="qwen3:1b", max_tokens=500, tools=[WEATHER, note_tool],
                               messages=HI) as s:
            seen = list(s)
            final = s.get_final_message()
    assert [b.type for b in final.content] == ["tool_use", "tool_use"]
    assert final.content[0].input == {"city": "Paris"}
    assert final.content[1].input == {"path": "a b.txt", "text": note}
    assert final.content[0].id != final.content[1].id and final.stop_reason == "tool_use"
    per_block = [sum(1 for e in seen if e.type == "content_block_delta" and e.index == i)
                 for i in (0, 1)]
    assert per_block[0] >= 3 and per_block[1] >= 8
    starts = [i for i, e in enumerate(seen) if e.type == "content_block_start"]
    first_delta_of_1 = next(i for i, e in enumerate(seen)
                            if e.type == "content_block_delta" and e.index == 1)
    assert starts[1] < first_delta_of_1


def _long_thinker(text: str) -> str:
    """A Qwen3-like model that reasons for 3,000 tokens unless made to stop: once the text
    so far ends with the closed block, it answers."""
    if text.endswith("</think>\n\n"):
        return "The answer."
    return "<think>\n" + "w " * 1500 + "\n</think>\n\nThe long answer."


def test_budget_tokens_closes_the_thinking(home):
    """thinking.budget_tokens caps the reasoning on its own: after that many reasoning
    tokens the end of the block is written in the model's place, and the model answers
    (whole and streamed); a budget the reasoning stays within changes nothing."""
    install_fake_models("qwen3:1b-f16")
    with serve(fake_factory(reply=_long_thinker, chat_template=QWEN3_TOOLS,
                            n_ctx=8192)) as d:
        c = client(d)
        ask = {"model": "qwen3:1b", "max_tokens": 6000, "messages": HI,
               "thinking": {"type": "enabled", "budget_tokens": 1024}}
        reply = c.messages.create(**ask)
        assert [b.type for b in reply.content] == ["thinking", "text"]
        # 1,024 reasoning tokens: the new line after <think>, then 511 "w " and a "w".
        assert reply.content[0].thinking.split() == ["w"] * 512
        assert reply.content[1].text == "The answer." and reply.stop_reason == "end_turn"
        assert reply.usage.output_tokens < 1100
        with c.messages.stream(**ask) as s:
            final = s.get_final_message()
        assert final.content[0].thinking == reply.content[0].thinking
        assert final.content[1].text == "The answer."
        roomy = c.messages.create(**{**ask, "thinking": {"type": "enabled",
                                                         "budget_tokens": 4000}})
        assert roomy.content[0].thinking.split() == ["w"] * 1500
        assert roomy.content[1].text == "The long answer."
        adaptive = c.messages.create(**{**ask, "thinking": {"type": "adaptive"}})
        assert adaptive.content[1].text == "The long answer."


def test_a_reply_cut_by_max_tokens_has_the_same_blocks_whole_and_streamed(home):
    """max_tokens inside the second call, or inside the first: the stream sent the calls as
    far as written, the whole reply dropped them (one call of two; an empty text block in
    place of the first)."""
    install_fake_models("qwen3:1b-f16")
    second = QWEN3_CALL.replace("get_weather", "get_time")
    with serve(fake_factory(reply=f"{QWEN3_CALL}\n{second}", chat_template=QWEN3_TOOLS)) as d:
        c = client(d)
        time_tool = {**WEATHER, "name": "get_time"}
        seen = set()
        for max_tokens in range(4, 60, 3):
            ask = {"model": "qwen3:1b", "max_tokens": max_tokens, "tools": [WEATHER, time_tool],
                   "messages": [{"role": "user", "content": "Weather in Paris?"}]}
            whole = c.messages.create(**ask)
            with c.messages.stream(**ask) as s:
                streamed = s.get_final_message()
            shape = [(b.type, getattr(b, "name", None), getattr(b, "input", None))
                     for b in whole.content]
            assert shape == [(b.type, getattr(b, "name", None), getattr(b, "input", None))
                             for b in streamed.content], max_tokens
            assert all(b.type != "text" or b.text for b in whole.content)  # no empty text
            assert whole.stop_reason == streamed.stop_reason
            seen.add(tuple((kind, name) for kind, name, _ in shape))
        assert ((("tool_use", "get_weather"),) in seen and
                (("tool_use", "get_weather"), ("tool_use", "get_time")) in seen), seen
        # A stop sequence met inside a call: the same both ways, and no tool_use stop (the
        # call never finished: a client would run it with half its input).
        ask = {"model": "qwen3:1b", "max_tokens": 200, "tools": [WEATHER],
               "stop_sequences": ["Par"],
               "messages": [{"role": "user", "content": "Weather in Paris?"}]}
        whole = c.messages.create(**ask)
        with c.messages.stream(**ask) as s:
            streamed = s.get_final_message()
        assert whole.stop_reason == streamed.stop_reason == "stop_sequence"
        assert [(b.type, getattr(b, "input", None)) for b in whole.content] == \
            [(b.type, getattr(b, "input", None)) for b in streamed.content]


def test_stop_reasons_say_what_the_client_asked(home):
    """A stop string the client did not send (a preset's) ends the turn as the model's end
    does; the context's end is not max_tokens; a reply with nothing in it has no blocks."""
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply=REPLY)) as d:
        c = client(d)
        with d.uds() as http:
            made = http.post("/api/create", json={"model": "stops", "from": "fake:1b",
                                                  "parameters": {"stop": ["fake"]},
                                                  "stream": False})
            assert made.status_code == 200, made.text
        own = c.messages.create(model="stops", max_tokens=64, messages=HI)
        assert own.content[0].text == "Hello from the "  # the preset's stop string held
        assert (own.stop_reason, own.stop_sequence) == ("end_turn", None)
        asked = c.messages.create(model="fake:1b", max_tokens=64, messages=HI,
                                  stop_sequences=["fake"])
        assert (asked.stop_reason, asked.stop_sequence) == ("stop_sequence", "fake")
        empty = c.messages.create(model="fake:1b", max_tokens=64, messages=HI,
                                  stop_sequences=["Hello"])
        assert empty.content == [] and empty.stop_reason == "stop_sequence"
        with d.uds() as http:
            raw = http.post("/v1/messages", json={"model": "fake:1b", "max_tokens": 64,
                                                  "messages": HI, "stream": True,
                                                  "stop_sequences": ["Hello"]}).text
        assert "content_block_start" not in raw
    with serve(fake_factory(reply="word " * 400, n_ctx=64)) as d:
        full = client(d).messages.create(model="fake:1b", max_tokens=200, messages=HI)
        assert full.stop_reason == "model_context_window_exceeded"
        assert full.usage.output_tokens < 200


def test_message_start_splits_the_cache_reads_as_message_delta_does(daemon):
    """message_start said every prompt token was read (cache 0) where message_delta then
    said most came from the cache: clients that read usage at the start saw no cache hit."""
    body = {"model": "fake:1b", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "a long enough question " * 20}]}
    with daemon.uds() as http:
        http.post("/v1/messages", json=body)
        sequence = events(http.post("/v1/messages", json=body).text)
    start = sequence[0][1]["message"]["usage"]
    end = next(d for k, d in sequence if k == "message_delta")["usage"]
    assert start["cache_read_input_tokens"] > 0
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == \
        (end["input_tokens"], end["cache_read_input_tokens"])
