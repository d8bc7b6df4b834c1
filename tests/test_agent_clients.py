"""Cline's and Open WebUI's requests, as their source sends them, replayed against the daemon
with a fake Qwen3 agent (it reasons, calls read_file, and answers once the file is in the
prompt).

- Cline (cline/cline, sdk/packages/llms): its "OpenAI Compatible" provider is the AI SDK's
  ``@ai-sdk/openai-compatible`` with ``includeUsage``, its "Ollama" provider
  ``ollama-ai-provider-v2`` (with Cline's patch: no ``think`` unless set); both driven by
  ``streamText`` with the system prompt, messages, tools, ``maxOutputTokens`` and
  ``temperature``. The bodies below are those the two providers sent when run against the
  daemon (docs/editors.md says how), two turns each: a call, then its result.
- Open WebUI (open-webui/open-webui, backend/open_webui/routers/ollama.py and
  utils/payload.py): its connection check (/api/version, parsed to integers), model list
  (/api/tags, then /api/ps for each model's ``expires_at``, parsed with
  ``datetime.fromisoformat``), /api/show, /api/chat with the model's parameters in
  ``options`` (Ollama's names, its placement options among them) and OpenAI-style tool calls
  converted to Ollama's, and the unload it sends (/api/generate with ``keep_alive: 0``).
"""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from daemon_util import fake_factory, install_fake_models, openai_client, serve
from template_fixtures import QWEN3_TOOLS

SYSTEM = "You are Cline, a highly skilled software engineer.\n" + "RULES ...\n" * 50
TASK = "<task>\nWhat does src/a.py say?\n</task>"
ENVIRONMENT = ("<environment_details>\n# Current Working Directory\n/tmp/p\n"
               "</environment_details>")
TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read the contents of a file at the specified path.",
        "parameters": {"type": "object", "properties": {"path": {
            "type": "string", "description": "The path of the file to read (relative to the"
                                             " current working directory)"}},
            "required": ["path"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "execute_command", "description": "Run a CLI command on the system.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string"}, "requires_approval": {"type": "boolean"}},
            "required": ["command", "requires_approval"]}}},
]


def _agent(prompt: str) -> str:
    if "<tool_response>" in prompt:
        return "<think>\nI have it.\n</think>\n\nThe file says hello."
    return ("<think>\nI should read the file.\n</think>\n\n<tool_call>\n"
            + json.dumps({"name": "read_file", "arguments": {"path": "src/a.py"}})
            + "\n</tool_call>")


@pytest.fixture
def agent(home):
    install_fake_models("qwen3:1b-f16")
    with serve(fake_factory(reply=_agent, chat_template=QWEN3_TOOLS, n_ctx=32768)) as d:
        yield d


def _ndjson(response) -> list[dict]:
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line]


def test_cline_openai_compatible_round_trip(agent):
    """@ai-sdk/openai-compatible's body (content as text parts, tool_choice "auto",
    stream_options.include_usage; the second turn's assistant message with content null, its
    reasoning_content and the call), through the openai SDK."""
    client = openai_client(agent)
    user = {"role": "user", "content": [{"type": "text", "text": TASK},
                                        {"type": "text", "text": ENVIRONMENT}]}
    ask = {"model": "qwen3:1b", "max_tokens": 8192, "temperature": 0, "tools": TOOLS,
           "tool_choice": "auto", "stream": True, "stream_options": {"include_usage": True}}
    chunks = list(client.chat.completions.create(
        messages=[{"role": "system", "content": SYSTEM}, user], **ask))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert reasoning == "I should read the file." and calls[0].function.name == "read_file"
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(arguments) == {"path": "src/a.py"}
    assert chunks[-1].usage.prompt_tokens > 0 and not chunks[-1].choices  # include_usage
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    history = [{"role": "system", "content": SYSTEM}, user,
               {"role": "assistant", "content": None, "reasoning_content": reasoning,
                "tool_calls": [{"id": calls[0].id, "type": "function", "function": {
                    "name": "read_file", "arguments": '{"path":"src/a.py"}'}}]},
               {"role": "tool", "tool_call_id": calls[0].id, "content": "print('hello')"}]
    second = list(client.chat.completions.create(messages=history, **ask))
    text = "".join(c.choices[0].delta.content or "" for c in second if c.choices)
    assert text == "The file says hello."
    assert second[-1].usage.prompt_tokens_details.cached_tokens > 0  # the first turn's prefix


def test_cline_ollama_round_trip(agent):
    """ollama-ai-provider-v2's /api/chat body: temperature, top_p and max_output_tokens at the
    top (Ollama ignores them; here they are honoured where options leaves them out),
    options.num_ctx, tools with tool_choice "auto"; then the call with its thinking and the
    tool message with tool_call_id."""
    with agent.uds() as http:
        body = {"model": "qwen3:1b",
                "messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": TASK + ENVIRONMENT}],
                "temperature": 0, "max_output_tokens": 8192, "options": {"num_ctx": 32768},
                "tools": TOOLS, "tool_choice": "auto", "stream": True}
        lines = _ndjson(http.post("/api/chat", json=body))
        calls = [c for line in lines for c in line["message"].get("tool_calls") or []]
        function = calls[0]["function"]
        assert (function["name"], function["arguments"]) == ("read_file", {"path": "src/a.py"})
        assert lines[-1]["done"] and lines[-1]["done_reason"] == "stop"
        history = body["messages"] + [
            {"role": "assistant", "content": "", "thinking": "I should read the file.",
             "tool_calls": [{"id": "3fLgdSvTGxpL1fUn", "type": "function", "function": {
                 "name": "read_file", "arguments": {"path": "src/a.py"}}}]},
            {"role": "tool", "tool_call_id": "3fLgdSvTGxpL1fUn", "content": "print('hello')"}]
        answer = _ndjson(http.post("/api/chat", json={**body, "messages": history}))
        assert "".join(line["message"]["content"] for line in answer) == \
            "The file says hello."
        # The top-level sampling counts: max_output_tokens is num_predict where options
        # leaves it out, and options wins where it sets it.
        short = _ndjson(http.post("/api/chat", json={**body, "max_output_tokens": 3}))
        assert (short[-1]["done_reason"], short[-1]["eval_count"]) == ("length", 3)
        wins = _ndjson(http.post("/api/chat", json={
            **body, "max_output_tokens": 3, "options": {"num_predict": 5}}))
        assert wins[-1]["eval_count"] == 5
        # tool_choice "none" answers without a call; a named tool as the provider writes it.
        none = _ndjson(http.post("/api/chat", json={**body, "tool_choice": "none"}))
        assert not any(line["message"].get("tool_calls") for line in none)
        named = _ndjson(http.post("/api/chat", json={
            **body, "tool_choice": {"type": "function", "name": "read_file"}}))
        assert any(line["message"].get("tool_calls") for line in named)
        bad = http.post("/api/chat", json={**body, "tool_choice": {"type": "function",
                                                                     "name": "nope"}})
        assert bad.status_code == 400 and "'nope'" in bad.json()["error"]


def test_open_webui_connection_and_model_list(agent):
    """What Open WebUI reads when it connects and lists models: the version as integers,
    each model's "model" and "name", and a loaded model's expires_at as an ISO time."""
    with agent.uds() as http:
        version = http.get("/api/version").json()["version"]
        assert all(part.isdigit() for part in re.sub(r"^v|-.*", "", version).split("."))
        models = http.get("/api/tags", headers={"Content-Type": "application/json"}).json()
        names = {m["model"] for m in models["models"]}
        assert "qwen3:1b-f16" in names and all(m["name"] for m in models["models"])
        assert http.post("/api/chat", json={"model": "qwen3:1b-f16", "messages": [
            {"role": "user", "content": "hi"}], "stream": False}).status_code == 200
        loaded = http.get("/api/ps").json()["models"]
        expires = {m["name"]: datetime.fromisoformat(m["expires_at"]) for m in loaded}
        assert int(expires["qwen3:1b-f16"].timestamp()) > 0
        shown = http.post("/api/show", json={"model": "qwen3:1b-f16"})
        assert shown.status_code == 200 and "tools" in shown.json()["capabilities"]
        # Its OpenAI connection lists /v1/models with a bearer key.
        listed = http.get("/v1/models", headers={"Authorization": "Bearer sk-x"}).json()
        assert "qwen3:1b-f16" in {m["id"] for m in listed["data"]}


def test_open_webui_chat_tools_and_unload(agent):
    """A chat as Open WebUI's convert_payload_openai_to_ollama and
    apply_model_params_to_body_ollama build it: the model's parameters in options (Ollama's
    names, placement options such as num_gpu and use_mmap among them), keep_alive, and an
    OpenAI tool call converted to Ollama's (index, id, arguments as an object) with the tool
    message's tool_call_id; then its unload."""
    options = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
               "repeat_penalty": 1.1, "num_ctx": 8192, "num_predict": 512, "seed": 42,
               "num_batch": 512, "num_keep": 24, "num_gpu": 99, "num_thread": 4,
               "use_mmap": True, "use_mlock": False, "stop": ["<|im_end|>"]}
    with agent.uds() as http:
        base = {"model": "qwen3:1b-f16", "stream": True, "options": options,
                "keep_alive": "5m", "tools": TOOLS}
        first = _ndjson(http.post("/api/chat", json={**base, "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "What does src/a.py say?"}]}))
        call = next(c for line in first for c in line["message"].get("tool_calls") or [])
        history = [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "What does src/a.py say?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"index": 0, "id": "call_1", "function": {
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"]}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "print('hello')"}]
        answer = _ndjson(http.post("/api/chat", json={**base, "messages": history}))
        assert "".join(line["message"]["content"] for line in answer) == \
            "The file says hello."
        # A title or tag task: the same route, not streamed, with a JSON format.
        task = http.post("/api/chat", json={"model": "qwen3:1b-f16", "stream": False,
                                            "messages": [{"role": "user", "content": "t"}],
                                            "options": {"num_predict": 50}})
        assert task.status_code == 200 and task.json()["done"]
        unload = http.post("/api/generate", json={"model": "qwen3:1b-f16", "keep_alive": 0,
                                                  "prompt": ""})
        assert unload.status_code == 200 and unload.json()["done_reason"] == "unload"
        assert http.get("/api/ps").json()["models"] == []
