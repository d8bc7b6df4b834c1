"""gpt-oss's harmony tool calls on the real starter model: llama.cpp's grammar sampler takes
the harmony grammars (from the first token, and lazily from a call's opening) and what it
makes parses back into calls. The starter is served with gpt-oss's own chat template
(tests/templates/gpt-oss.jinja); to Gemma's tokenizer the harmony markers are plain text, and
a history of earlier calls shows the base model what comes next."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from daemon_util import ollama_client, openai_client, serve
from localinfer.loading import load_engine
from localinfer.runtime.backend import LoadOptions

pytestmark = pytest.mark.model

GPT_OSS = (Path(__file__).parent / "templates" / "gpt-oss.jinja").read_text()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def harmony_daemon(starter_path):
    def factory(model, num_ctx, progress=None):
        return load_engine(model.path, LoadOptions(n_ctx=2048, n_slots=1,
                                                   chat_template=GPT_OSS),
                           name=model.name, family=model.family)

    with serve(factory) as d:
        yield d


def _history(ollama: bool) -> list[dict[str, Any]]:
    """An agent loop three calls in, in either client's shape."""
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "What's the weather in Paris, Berlin, Rome and London?"}]
    for i, city in enumerate(["Paris", "Berlin", "Rome"]):
        arguments = {"city": city}
        history += [
            {"role": "assistant", "content": "", "tool_calls": [{"function": {
                "name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_name": "get_weather", "content": f"{10 + i} C"},
        ] if ollama else [
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": f"call_{i}", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"{10 + i} C"},
        ]
    return history


def test_required_call_from_the_first_token(harmony_daemon):
    client = openai_client(harmony_daemon)
    reply = client.chat.completions.create(
        model="gemma3:270m", messages=_history(ollama=False), tools=[WEATHER],
        tool_choice="required", temperature=0, max_tokens=60)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_auto_call_constrained_from_its_opening_ollama(harmony_daemon):
    reply = ollama_client(harmony_daemon).chat(
        model="gemma3:270m", messages=_history(ollama=True), tools=[WEATHER],
        options={"temperature": 0, "num_predict": 60})
    [call] = reply.message.tool_calls or []
    assert call.function.name == "get_weather"
    jsonschema.validate(dict(call.function.arguments), WEATHER["function"]["parameters"])


def test_auto_call_constrained_from_its_opening_openai_streamed(harmony_daemon):
    chunks = list(openai_client(harmony_daemon).chat.completions.create(
        model="gemma3:270m", messages=_history(ollama=False), tools=[WEATHER], temperature=0,
        max_tokens=60, stream=True))
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather"
    arguments = json.loads("".join(d.function.arguments or "" for d in deltas))
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
