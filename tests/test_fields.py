"""No request field is silently dropped: each route's refused and unknown fields get a 400
naming them, the accepted-and-ignored ones get a normal reply, and the table in docs/api.md is the
one the field lists generate."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai.types.responses import response_create_params as params

from localinfer.daemon.fields import ROUTES, fields_table
from localinfer.errors import InvalidRequest
from localinfer.runtime.types import SamplingParams

pytest_plugins = ["daemon_fixtures"]

CHAT = {"model": "fake:1b", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "fake:1b", "prompt": "hi"}
OLLAMA_CHAT = {**CHAT, "stream": False}
GENERATE = {"model": "fake:1b", "prompt": "hi", "stream": False}

REFUSED = [
    ("/v1/chat/completions", CHAT, {"functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", CHAT, {"function_call": "auto"}, "function_call"),
    ("/v1/chat/completions", CHAT, {"audio": {"voice": "alloy"}}, "audio"),
    ("/v1/chat/completions", CHAT, {"modalities": ["text", "audio"]}, "modalities"),
    ("/v1/chat/completions", CHAT, {"prediction": {"type": "content"}}, "prediction"),
    ("/v1/chat/completions", CHAT, {"web_search_options": {}}, "web_search_options"),
    ("/v1/chat/completions", CHAT, {"verbosity": "low"}, "verbosity"),
    ("/v1/chat/completions", CHAT, {"n_probs": 3}, "n_probs"),  # unknown
    ("/v1/completions", COMPLETION, {"echo": True}, "echo"),
    ("/v1/completions", COMPLETION, {"best_of": 3}, "best_of"),
    ("/v1/completions", COMPLETION, {"logprobs": -1}, "logprobs"),
    ("/api/chat", OLLAMA_CHAT, {"truncate": True}, "truncate"),
    ("/api/chat", OLLAMA_CHAT, {"shift": True}, "shift"),
    ("/api/chat", OLLAMA_CHAT, {"options": {"tfs_z": 0.9}}, "options.tfs_z"),
    ("/api/chat", OLLAMA_CHAT, {"options": {"penalize_newline": True}},
     "options.penalize_newline"),
    ("/api/chat", OLLAMA_CHAT, {"options": {"f16_kv": False}}, "options.f16_kv"),
    ("/api/chat", OLLAMA_CHAT, {"options": {"vocab_only": True}}, "options.vocab_only"),
    ("/api/chat", OLLAMA_CHAT, {"options": {"num_gqa": 8}}, "options.num_gqa"),  # unknown
    ("/api/chat", OLLAMA_CHAT, {"options": {"mirostat": 3}}, "mirostat"),
    ("/api/generate", GENERATE, {"images": ["aGk="]}, "images"),
    ("/api/generate", GENERATE, {"template": "{{ .Prompt }}"}, "template"),
    ("/api/generate", GENERATE, {"context": [1, 2, 3]}, "context"),
    ("/api/generate", GENERATE, {"width": 512}, "width"),
    ("/api/generate", GENERATE, {"options": {"typical_p": 0}}, "typical_p"),
    ("/api/generate", GENERATE, {"debug_render_only": True}, "debug_render_only"),
    # Values refused rather than taken for something else (a client's mistake never runs on).
    ("/api/generate", GENERATE, {"options": {"num_predict": -5}}, "options.num_predict"),
    ("/v1/chat/completions", CHAT, {"stream": True, "stream_options": {"foo": 1}},
     "stream_options.foo"),
    ("/v1/chat/completions", CHAT, {"stream_options": "abc"}, "stream_options"),
    ("/v1/chat/completions", CHAT, {"stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
    ("/v1/chat/completions", CHAT, {"priority": "Interactive"}, "priority"),
    ("/v1/chat/completions", CHAT, {"priority": 0}, "priority"),
    ("/api/chat", OLLAMA_CHAT, {"priority": []}, "priority"),
]


@pytest.mark.parametrize(("path", "base", "extra", "name"), REFUSED,
                         ids=[f"{p}:{n}" for p, _, _, n in REFUSED])
def test_refused_fields_are_400_naming_them(daemon, path, base, extra, name):
    with daemon.uds() as c:
        r = c.post(path, json={**base, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert name in message


ACCEPTED = [
    ("/v1/chat/completions", CHAT, {"user": "u1", "store": False, "metadata": {"a": "b"},
                                    "prompt_cache_key": "k", "service_tier": "auto",
                                    "safety_identifier": "s", "modalities": ["text"], "n": 1,
                                    "stream_options": None, "cache_prompt": True}),
    ("/v1/completions", COMPLETION, {"echo": False, "best_of": 1, "user": "u1"}),
    ("/api/chat", OLLAMA_CHAT, {"truncate": False, "shift": False, "keep_alive": "5m",
                                "options": {"num_thread": 4, "num_gpu": 99, "use_mmap": True,
                                            "num_keep": 5, "num_batch": 512, "tfs_z": 1,
                                            "penalize_newline": False, "f16_kv": True}}),
    ("/api/generate", GENERATE, {"images": [], "context": [], "template": "",
                                 "system": "Be brief.", "raw": False}),
]


@pytest.mark.parametrize(("path", "base", "extra"), ACCEPTED,
                         ids=[p for p, _, _ in ACCEPTED])
def test_tolerated_fields_are_accepted(daemon, path, base, extra):
    with daemon.uds() as c:
        r = c.post(path, json={**base, **extra})
    assert r.status_code == 200, r.text


def test_llama_servers_samplers_are_the_chain_in_their_order():
    """llama-server's ``samplers`` reach the sampling parameters as the chain, in the order
    given, ``infill`` with them (the real model's tests check the chain llama.cpp builds); a
    sampler left out is off, an unknown one is a 400."""
    from localinfer.daemon.llama_fields import llama_sampling
    from localinfer.daemon.requests import Fields

    params = llama_sampling(Fields({"samplers": ["top_p", "infill", "top_k"]}), 16)
    assert params.chain == ("top_p", "infill", "top_k")
    assert (params.min_p, params.temperature, params.max_tokens) == (0.0, 1.0, 16)
    assert llama_sampling(Fields({}), 16).chain is None  # the standard chain
    # A penalty runs where the chain names the penalties, as in llama.cpp.
    for samplers, penalized in ((["top_k"], False), (["penalties", "top_k"], True)):
        assert llama_sampling(Fields({"samplers": samplers, "repeat_penalty": 1.3}),
                              16).penalized is penalized
    with pytest.raises(InvalidRequest, match="'dry'"):
        llama_sampling(Fields({"samplers": ["top_k", "dry"]}), 16)
    with pytest.raises(InvalidRequest, match="'xtc'"):
        SamplingParams(chain=("xtc",)).validate()
    # llama-server's letters (it takes "kpt"; a 400 here before).
    assert llama_sampling(Fields({"samplers": "kpit"}), 16).chain == (
        "top_k", "top_p", "infill", "temperature")
    with pytest.raises(InvalidRequest, match="'d', 'x' names no sampler"):
        llama_sampling(Fields({"samplers": "kdx"}), 16)


def test_samplers_and_bias_are_parsed(daemon):
    """typical_p, mirostat and logit_bias reach the sampling parameters (the real model's
    tests check their effect); bad values are 400."""
    from localinfer.daemon.requests import Fields, sampling

    params = sampling(Fields({"typical_p": 0.5, "mirostat": 2, "mirostat_tau": 3.0,
                              "mirostat_eta": 0.2, "logit_bias": {"7": -100, "8": 2.5}}),
                      max_tokens=None)
    assert (params.typical_p, params.mirostat, params.mirostat_tau, params.mirostat_eta) == (
        0.5, 2, 3.0, 0.2)
    assert params.logit_bias == ((7, float("-inf")), (8, 2.5))
    # llama-server's array form: [token id, bias], false bans (it was a 400).
    pairs = sampling(Fields({"logit_bias": [[7, False], [8, 2.5]]}), max_tokens=None)
    assert pairs.logit_bias == params.logit_bias
    for bad in ({"logit_bias": {"x": 1}}, {"logit_bias": {"7": 101}}, {"logit_bias": [1]},
                {"logit_bias": [["Hello", -1]]}, {"logit_bias": [[7, True]]}):
        with pytest.raises(InvalidRequest, match="logit_bias"):
            sampling(Fields(bad), max_tokens=None)
    with pytest.raises(InvalidRequest, match="vocabulary"):
        SamplingParams(logit_bias=((5000, 1.0),)).bounded(2048, 1000)
    with daemon.uds() as c:
        r = c.post("/v1/chat/completions", json={**CHAT, "logit_bias": {"99999": 1}})
        assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"]


def test_readme_table_is_generated_from_the_field_lists():
    readme = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
    assert fields_table() in readme, "docs/api.md: paste localinfer.daemon.fields.fields_table()"


def test_every_route_lists_each_field_once():
    for route, rule in ROUTES.items():
        names = [*rule.honoured, *rule.elsewhere, *rule.ignored, *rule.refused]
        assert len(names) == len(set(names)), route


def test_editor_shaped_requests_get_what_they_expect(daemon):
    """Continue's Ollama provider (options with its sampling and load settings, keep_alive),
    Continue's and Zed's OpenAI providers (max_tokens or max_completion_tokens, an empty
    stop list, stream_options), as they send them."""
    continue_ollama = {"model": "fake:1b", "stream": False, "keep_alive": 1800,
                       "messages": [{"role": "user", "content": "hi"}],
                       "options": {"num_predict": 64, "temperature": 0.7, "top_p": 0.9,
                                   "top_k": 40, "stop": ["<|im_end|>"], "num_ctx": 1024,
                                   "mirostat": 0, "num_thread": 8, "use_mmap": True,
                                   "num_gpu": 99, "min_p": 0.05}}
    continue_openai = {"model": "fake:1b", "stream": True, "max_tokens": 64, "temperature": 0.7,
                       "top_p": 0.9, "frequency_penalty": 0, "presence_penalty": 0,
                       "stop": ["\n\n"], "messages": [{"role": "user", "content": "hi"}]}
    zed_openai = {"model": "fake:1b", "stream": True, "max_completion_tokens": 64, "stop": [],
                  "temperature": 1.0, "stream_options": {"include_usage": True},
                  "prompt_cache_key": "thread-1",
                  "messages": [{"role": "system", "content": "You are Zed."},
                               {"role": "user", "content": "hi"}]}
    with daemon.uds() as c:
        r = c.post("/api/chat", json=continue_ollama)
        assert r.status_code == 200 and r.json()["message"]["content"], r.text
        for body in (continue_openai, zed_openai):
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                text = r.read().decode()
            assert text.rstrip().endswith("data: [DONE]") and '"content":"Hello' in text


# The request fields each route's reference documents today (OpenAI's "Create a model
# response", as the openai SDK's ResponseCreateParams has them): each must be honoured,
# ignored with a reason, or refused by name; a field added upstream fails the test below.
DOCUMENTED = {
    "/v1/responses": (
        "access_programs", "background", "background_options", "context_management",
        "conversation", "image", "include", "input", "instructions", "max_output_tokens",
        "max_tool_calls", "metadata", "model", "moderation", "parallel_tool_calls",
        "previous_response_id", "prompt", "prompt_cache_key", "prompt_cache_options",
        "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier", "store",
        "stream", "stream_options", "temperature", "text", "tool_choice", "tools",
        "top_logprobs", "top_p", "truncation", "user"),
    "/v1/responses/input_tokens": (
        "conversation", "input", "instructions", "model", "parallel_tool_calls",
        "personality", "previous_response_id", "reasoning", "text", "tool_choice", "tools",
        "truncation"),
}


@pytest.mark.parametrize("route", sorted(DOCUMENTED))
def test_every_documented_field_has_a_rule(route):
    rule = ROUTES[route]
    known = {*rule.honoured, *rule.elsewhere, *rule.ignored, *rule.refused}
    assert not set(DOCUMENTED[route]) - known


def test_the_documented_openai_fields_are_the_sdks():
    """Chat completions, completions and embeddings as the openai SDK documents them today:
    a field added upstream gets a rule (honoured, ignored with a reason, or refused)."""
    from openai.types import completion_create_params, embedding_create_params
    from openai.types.chat import completion_create_params as chat_params

    for route, types in (
            ("/v1/chat/completions", (chat_params.CompletionCreateParamsBase,
                                      chat_params.CompletionCreateParamsStreaming)),
            ("/v1/completions", (completion_create_params.CompletionCreateParamsBase,
                                 completion_create_params.CompletionCreateParamsStreaming)),
            ("/v1/embeddings", (embedding_create_params.EmbeddingCreateParams,))):
        rule = ROUTES[route]
        known = {*rule.honoured, *rule.elsewhere, *rule.ignored, *rule.refused}
        sdk = {name for t in types for name in t.__annotations__}
        assert sdk - known == set(), route


def test_the_documented_responses_fields_are_the_sdks():
    from openai.types.responses import input_token_count_params

    sdk = {*params.ResponseCreateParamsBase.__annotations__,
           *params.ResponseCreateParamsStreaming.__annotations__}
    assert sdk == set(DOCUMENTED["/v1/responses"])
    counted = set(input_token_count_params.InputTokenCountParams.__annotations__)
    assert counted == set(DOCUMENTED["/v1/responses/input_tokens"])


MESSAGE_REFUSED = [
    ({"role": "user", "content": "hi", "foo": 1}, "messages[0].foo"),
    ({"role": "user", "content": "hi", "images": ["aGk="]}, "messages[0].images"),
    ({"role": "assistant", "content": "", "refusal": "I can't"}, "messages[0].refusal"),
    ({"role": "assistant", "content": "", "audio": {"id": "a1"}}, "messages[0].audio"),
    ({"role": "user", "content": [{"type": "text"}]}, "messages[0].content[0].text"),
    ({"role": "assistant", "content": "Sure", "prefix": True}, "messages[0].prefix"),
]


@pytest.mark.parametrize(("message", "name"), MESSAGE_REFUSED,
                         ids=[n for _, n in MESSAGE_REFUSED])
def test_a_messages_unknown_or_refused_field_is_a_400_naming_it(daemon, message, name):
    with daemon.uds() as c:
        for path, base in (("/v1/chat/completions", CHAT), ("/api/chat", OLLAMA_CHAT)):
            r = c.post(path, json={**base, "messages": [message]})
            assert r.status_code == 400, (path, r.text)
            error = r.json()["error"]
            assert name in (error if isinstance(error, str) else error["message"])


def test_what_clients_echo_back_in_messages_is_accepted(daemon):
    """An assistant message as the openai SDK returns it (refusal, annotations, audio and
    function_call null), with an earlier turn's reasoning, and a user's name."""
    history = [{"role": "user", "content": "hi", "name": "ada"},
               {"role": "assistant", "content": "Hello", "refusal": None, "annotations": [],
                "audio": None, "function_call": None, "reasoning_content": "greet back",
                "reasoning_details": [{"type": "reasoning.text", "text": "greet back"}],
                "cache_control": {"type": "ephemeral"}},
               {"role": "user", "content": "again", "images": []}]
    with daemon.uds() as c:
        r = c.post("/v1/chat/completions", json={**CHAT, "messages": history})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(("path", "base", "extra", "name"), [
    ("/v1/chat/completions", CHAT, {"user": 7}, "user"),
    ("/v1/chat/completions", CHAT, {"metadata": "x"}, "metadata"),
    ("/v1/chat/completions", CHAT, {"store": "yes"}, "store"),
    ("/api/chat", OLLAMA_CHAT, {"options": {"num_thread": "four"}}, "options.num_thread"),
    ("/api/chat", OLLAMA_CHAT, {"options": {"use_mmap": 1}}, "options.use_mmap"),
])
def test_an_ignored_field_of_the_wrong_type_is_a_400(daemon, path, base, extra, name):
    with daemon.uds() as c:
        r = c.post(path, json={**base, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert f"'{name}'" in (error if isinstance(error, str) else error["message"])
