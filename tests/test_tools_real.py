"""Tool calling and structured output on the real starter model, through the daemon and the
real openai and ollama clients. The starter has no chat template of its own, so it is served
with a fixture copy of Qwen 2.5's (which takes tools); a history of earlier calls shows the
base model what comes next, and the grammar makes every call valid JSON of its schema."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from daemon_util import ollama_client, openai_client, serve
from localinfer.loading import load_engine
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.grammar import gbnf_grammar, json_grammar
from localinfer.runtime.tools import FORMATS, ToolChoice, call_grammar, parse_tools
from localinfer.runtime.types import SamplingParams

pytestmark = pytest.mark.model

# Qwen's end of turn is plain text to Gemma's tokenizer: the starter's own end-of-turn token
# stands in for it, so that the model can end a turn (a grammar allows only that after a call).
QWEN = (Path(__file__).parent / "templates" / "qwen2.5.jinja").read_text().replace(
    "<|im_end|>", "<end_of_turn>")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def qwen_factory(model, num_ctx, progress=None):
    """The daemon's engines: the starter with Qwen 2.5's template (it takes tools)."""
    return load_engine(model.path, LoadOptions(n_ctx=2048, n_slots=1, chat_template=QWEN),
                       name=model.name, family=model.family)


@pytest.fixture(scope="module")
def tool_daemon(starter_path):
    with serve(qwen_factory) as d:
        yield d


def _agent_history(call: Any) -> list[dict[str, Any]]:
    """An agent loop three calls in: the user asked about four cities."""
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "What's the weather in Paris, Berlin, Rome and London?"}]
    for i, city in enumerate(["Paris", "Berlin", "Rome"]):
        history += [{"role": "assistant", "content": "", "tool_calls": [call(i, city)]},
                    {"role": "tool", "tool_call_id": f"call_{i}", "tool_name": "get_weather",
                     "content": f"{10 + i} C"}]
    return history


def _openai_call(i: int, city: str) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


def _ollama_call(i: int, city: str) -> dict[str, Any]:
    return {"function": {"name": "get_weather", "arguments": {"city": city}}}


@pytest.mark.parametrize("stream", [False, True])
def test_openai_tool_call_round_trip(tool_daemon, stream):
    client = openai_client(tool_daemon)
    messages = _agent_history(_openai_call)
    ask = {"model": "gemma3:270m", "tools": [WEATHER], "temperature": 0, "max_tokens": 40,
           "parallel_tool_calls": False}
    if stream:
        chunks = list(client.chat.completions.create(messages=messages, stream=True, **ask))
        deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
        name = deltas[0].function.name
        arguments = "".join(d.function.arguments or "" for d in deltas)
        call_id = deltas[0].id
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    else:
        reply = client.chat.completions.create(messages=messages, **ask)
        assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0].message
        [call] = reply.choices[0].message.tool_calls
        name, arguments, call_id = call.function.name, call.function.arguments, call.id
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    messages += [{"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "12 C"}]
    final = client.chat.completions.create(messages=messages, tool_choice="none", **ask)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_tool_call_round_trip(tool_daemon, stream):
    client = ollama_client(tool_daemon)
    messages = _agent_history(_ollama_call)
    options = {"temperature": 0, "num_predict": 40}
    if stream:
        parts = list(client.chat(model="gemma3:270m", messages=messages, tools=[WEATHER],
                                 options=options, stream=True))
        calls = [c for p in parts for c in (p.message.tool_calls or [])]
    else:
        calls = client.chat(model="gemma3:270m", messages=messages, tools=[WEATHER],
                            options=options).message.tool_calls or []
    [call] = calls
    assert call.function.name == "get_weather"
    jsonschema.validate(dict(call.function.arguments), WEATHER["function"]["parameters"])
    messages += [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": dict(call.function.arguments)}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "12 C"}]
    final = client.chat(model="gemma3:270m", messages=messages, options=options)
    assert final.message.content and not final.message.tool_calls


RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}


def _responses_history() -> list[dict[str, Any]]:
    """The agent loop above as Responses API input items."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "What's the weather in Paris, Berlin, Rome and London?"}]
    for i, city in enumerate(["Paris", "Berlin", "Rome"]):
        items += [{"type": "function_call", "call_id": f"call_{i}", "name": "get_weather",
                   "arguments": json.dumps({"city": city})},
                  {"type": "function_call_output", "call_id": f"call_{i}",
                   "output": f"{10 + i} C"}]
    return items


@pytest.mark.parametrize("stream", [False, True])
def test_responses_tool_call_round_trip(tool_daemon, stream):
    """The openai SDK's responses.create / responses.stream: a function_call, its
    function_call_output, then the answer (streamed: continued from the stored response by
    previous_response_id, as a client that keeps no history does)."""
    client = openai_client(tool_daemon)
    ask = {"model": "gemma3:270m", "tools": [RESPONSES_WEATHER], "temperature": 0,
           "max_output_tokens": 40, "parallel_tool_calls": False}
    if stream:
        with client.responses.stream(input=_responses_history(), **ask) as s:
            types = [e.type for e in s]
            first = s.get_final_response()
        assert types[-1] == "response.completed"
        assert "response.function_call_arguments.done" in types
    else:
        first = client.responses.create(input=_responses_history(), store=False, **ask)
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and first.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "12 C"}
    if stream:
        final = client.responses.create(previous_response_id=first.id, input=[result],
                                        tool_choice="none", **ask)
        assert final.usage.input_tokens_details.cached_tokens > 0  # the first turn's prefix
    else:
        items = [*_responses_history(), call.model_dump(exclude_none=True), result]
        final = client.responses.create(input=items, tool_choice="none", store=False, **ask)
    assert final.output_text and not [i for i in final.output if i.type == "function_call"]


# Bounded values only: an unbounded string or number could run past max_tokens mid-call.
_leaf = st.one_of(
    st.just({"type": "boolean"}),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 100)),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(1, 12)),
    st.lists(st.sampled_from(["red", "green", "blue", "none"]), min_size=1, max_size=3,
             unique=True).map(lambda e: {"enum": e}),
)
_names = st.sampled_from(["city", "count", "unit", "flag", "label"])


def _object(values: st.SearchStrategy) -> st.SearchStrategy:
    return st.dictionaries(_names, values, min_size=1, max_size=3).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda required: {"type": "object", "properties": props, "required": required,
                              "additionalProperties": False}))


_schemas = _object(st.one_of(_leaf, _object(_leaf),
                             _leaf.map(lambda s: {"type": "array", "items": s,
                                                  "maxItems": 2})))


@settings(max_examples=4, deadline=None, derandomize=True, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=_schemas)
def test_required_always_yields_a_call_valid_against_its_schema(tool_daemon, schema):
    client = openai_client(tool_daemon)
    tool = {"type": "function", "function": {"name": "act", "parameters": schema}}
    reply = client.chat.completions.create(
        model="gemma3:270m", messages=[{"role": "user", "content": "Do it."}], tools=[tool],
        tool_choice="required", parallel_tool_calls=False, temperature=0.7, max_tokens=160)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "act"
    jsonschema.validate(json.loads(call.function.arguments), schema)


class City(BaseModel):
    name: Annotated[str, Field(max_length=20)]
    population: Annotated[int, Field(ge=0)]
    capital: bool


def test_openai_parse_returns_a_pydantic_object(tool_daemon):
    client = openai_client(tool_daemon)
    reply = client.beta.chat.completions.parse(
        model="gemma3:270m", response_format=City, temperature=0, max_tokens=80,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}])
    assert isinstance(reply.choices[0].message.parsed, City)


def test_ollama_format_schema_returns_valid_json(tool_daemon):
    schema = City.model_json_schema()
    client = ollama_client(tool_daemon)
    reply = client.chat(model="gemma3:270m", format=schema, options={"temperature": 0,
                                                                     "num_predict": 80},
                        messages=[{"role": "user", "content": "Describe Paris as JSON."}])
    jsonschema.validate(json.loads(reply.message.content), schema)
    # Raw, as an editor's completion would: the grammar alone makes it JSON of the schema.
    generated = client.generate(model="gemma3:270m", prompt="A city as JSON:", format=schema,
                                raw=True, options={"temperature": 0, "num_predict": 80})
    jsonschema.validate(json.loads(generated.response), schema)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_every_format_grammar_compiles_in_llama_cpp(real_engine, fmt, choice):
    tools = parse_tools([WEATHER, {"type": "function", "function": {"name": "now"}}])
    for parallel in (True, False):
        grammar = call_grammar(FORMATS[fmt], tools, ToolChoice(choice), parallel=parallel)
        assert grammar is not None
        real_engine.backend.check_grammar(grammar)
        # A thinking model's reasoning may come first (daemon/structured.py ``reasoned``).
        real_engine.backend.check_grammar(
            dataclasses.replace(grammar, reasoning=("<think>", "</think>")))


def test_raw_grammar_and_json_schema_on_every_route(tool_daemon):
    """llama-server's ``grammar`` (GBNF) and ``json_schema`` constrain the real model's reply
    on the chat and completions routes, with logprobs alongside; GBNF llama.cpp cannot parse
    is a 400 that says so."""
    gbnf = 'root ::= ("yes" | "no") "."\n'
    client = openai_client(tool_daemon)
    chat = client.chat.completions.create(
        model="gemma3:270m", messages=[{"role": "user", "content": "Is Paris in France?"}],
        max_tokens=10, logprobs=True, top_logprobs=3, extra_body={"grammar": gbnf})
    assert chat.choices[0].message.content in ("yes.", "no.")
    assert "".join(t.token for t in chat.choices[0].logprobs.content) == \
        chat.choices[0].message.content
    legacy = client.completions.create(model="gemma3:270m", prompt="A city as JSON:",
                                       max_tokens=80, temperature=0, logprobs=2,
                                       extra_body={"json_schema": City.model_json_schema()})
    City.model_validate_json(legacy.choices[0].text)
    assert "".join(legacy.choices[0].logprobs.tokens) == legacy.choices[0].text
    with tool_daemon.uds() as http:
        r = http.post("/v1/completions", json={"model": "gemma3:270m", "prompt": "x",
                                               "grammar": "root ::= undefined-rule"})
        assert r.status_code == 400
        assert "not GBNF that llama.cpp can parse" in r.json()["error"]["message"], r.text
        # What is wrong, where the message can tell: a rule that begins with itself, no
        # root rule, an enum of nothing (each was "its start rule must be named root" or
        # "could not parse").
        for body, said in (({"grammar": 'root ::= root "a"'}, "may not begin with itself"),
                           ({"grammar": 'start ::= "a"'}, "must be named root"),
                           ({"json_schema": {"enum": []}}, "'enum' is an empty list")):
            r = http.post("/v1/completions", json={"model": "gemma3:270m", "prompt": "x",
                                                   **body})
            assert r.status_code == 400 and said in r.json()["error"]["message"], r.text
        r = http.post("/v1/completions", json={"model": "gemma3:270m", "prompt": "x",
                                               "grammar": 'root ::= "a" root | "b"'})
        assert r.status_code == 200, r.text


def test_a_grammar_no_token_can_follow_ends_the_request_not_the_daemon(tool_daemon):
    """A character class no token matches: accepting any token would abort the process inside
    llama.cpp ("Unexpected empty grammar stack"); the request gets a 400, the daemon lives."""
    with tool_daemon.uds() as http:
        r = http.post("/v1/completions", json={"model": "gemma3:270m", "prompt": "Hi",
                                               "grammar": "root ::= [\\x00-\\x00]",
                                               "max_tokens": 5})
        assert r.status_code == 400, r.text
        assert "allows no token" in r.json()["error"]["message"]
        ok = http.post("/v1/completions", json={"model": "gemma3:270m", "prompt": "Hi",
                                                "max_tokens": 3, "temperature": 0})
        assert ok.status_code == 200, ok.text


def test_a_logit_bias_that_bans_what_the_grammar_allows_ends_the_request(tool_daemon):
    """The grammar allows only tokens that start "a"; the bias bans them all (-100): a 400
    for that request, where accepting a banned token would abort llama.cpp."""
    with tool_daemon.uds() as http:
        warm = http.post("/v1/completions", json={"model": "gemma3:270m", "prompt": "a",
                                                  "max_tokens": 1, "temperature": 0})
        assert warm.status_code == 200, warm.text  # loaded: its vocabulary can be read
        loaded = next(iter(tool_daemon.manager.loaded.values())).engine
        starts = [t for t in range(loaded.info.n_vocab)
                  if loaded.backend.token_bytes(t).startswith(b"a")]
        bias = {str(t): -100 for t in starts}
        r = http.post("/v1/completions", json={"model": "gemma3:270m", "prompt": "Hi",
                                               "grammar": 'root ::= "a"', "max_tokens": 3,
                                               "logit_bias": bias})
        assert r.status_code == 400, r.text
        assert "logit_bias" in r.json()["error"]["message"]
        ok = http.post("/v1/completions", json={"model": "gemma3:270m", "prompt": "Hi",
                                                "max_tokens": 3, "temperature": 0})
        assert ok.status_code == 200, ok.text


def test_tool_calls_with_logprobs(tool_daemon):
    client = openai_client(tool_daemon)
    reply = client.chat.completions.create(
        model="gemma3:270m", messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_tokens=80,
        logprobs=True, top_logprobs=2)
    choice = reply.choices[0]
    assert choice.message.tool_calls and choice.finish_reason == "tool_calls"
    tokens = "".join(t.token for t in choice.logprobs.content)
    assert "get_weather" in tokens and all(t.logprob <= 0 for t in choice.logprobs.content)


def test_a_grammar_after_reasoning_the_prompt_opened(real_engine):
    """A prompt that ends inside ``<think>`` (R1-style templates, Qwen3's thinking ones): the
    grammar lets the model reason, close the block, and then holds it to the schema, whether
    the schema's or a client's GBNF."""
    prompt = ('Q: Is the sky blue?\nA: <think>The sky looks blue by day.</think>'
              '{"answer": "yes"}\nQ: Is grass red?\nA: <think>Grass is green.</think>'
              '{"answer": "no"}\nQ: Is snow white?\nA: <think>')
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
              "required": ["answer"]}
    for grammar in (json_grammar(schema),
                    gbnf_grammar('root ::= "{\\"answer\\": \\"" ("yes" | "no") "\\"}"')):
        reasoned = dataclasses.replace(grammar, reasoning=("", "</think>"))
        done = real_engine.complete(prompt, SamplingParams(temperature=0, max_tokens=60,
                                                           grammar=reasoned)).result()
        reasoning, _, answer = done.text.partition("</think>")
        assert reasoning.strip() and done.finish_reason == "stop", done.text
        jsonschema.validate(json.loads(answer), schema)
