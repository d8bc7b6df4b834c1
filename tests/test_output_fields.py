"""What the reply must look like, on every generation route that takes it: OpenAI's
``response_format``, llama-server's ``json_schema`` (a JSON schema) and ``grammar`` (GBNF text)
reach the sampler as one grammar, two at once are refused; with logprobs alongside. And the
embedding routes' field audit. The fake backend records the grammars; the real model's
sampling with them is in test_tools_real.py."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from daemon_util import fake_factory, install_fake_models, openai_client, serve
from localinfer.runtime.grammar import (
    MAX_GBNF_NESTING,
    REASONED_RULE,
    Grammar,
    _text_through,
    gbnf_grammar,
    to_gbnf,
)
from template_fixtures import QWEN3_STYLE, R1_STYLE

pytest_plugins = ["daemon_fixtures"]

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
GBNF = 'root ::= "yes" | "no" # a comment with a ( that opens nothing\n'
CHAT = {"model": "fake:1b", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "fake:1b", "prompt": "hi"}


@pytest.fixture
def served(home):
    install_fake_models("fake:1b-f16", "coder:1b-f16")
    with serve(fake_factory(fim=True)) as d:
        yield d


def grammars(d, name="fake:1b-f16") -> list[Grammar]:
    return d.manager.loaded[name].engine.backend.grammars


def test_gbnf_text_is_the_grammar_as_sent():
    assert to_gbnf(gbnf_grammar(GBNF), lambda schema, rule: "") == GBNF
    for bad, message in [(" \n", "empty"), ("root ::= " + "(" * 101 + '"x"' + ")" * 101,
                                               str(MAX_GBNF_NESTING)),
                         ('root ::= "a" <[99999]>', "token references"),
                         ("root ::= <think>", "token references"),
                         ('root ::= "\\x00"', "NUL"), ('root ::= "a\\u0000"', "NUL"),
                         ('root ::= "\0"', "NUL")]:
        with pytest.raises(ValueError, match=message):
            gbnf_grammar(bad)
    # Parentheses inside literals and character classes are not groups.
    assert gbnf_grammar('root ::= "' + "(" * 200 + '" [(]')
    # As llama.cpp's JSON grammar has them: NUL in a negated class, an escaped quote; and a "<"
    # in a literal and in a comment.
    assert gbnf_grammar('root ::= "\\"<" [^"\\\\\\x7F\\x00-\\x1F]* # <a> "\\x00"\n')


@pytest.mark.parametrize(("path", "base"), [("/v1/chat/completions", CHAT),
                                            ("/v1/completions", COMPLETION)])
def test_each_output_field_reaches_the_sampler(served, path, base):
    with served.uds() as http:
        for extra in ({"response_format": {"type": "json_schema",
                                           "json_schema": {"name": "n", "schema": SCHEMA}}},
                      {"json_schema": SCHEMA}, {"grammar": GBNF},
                      {"response_format": {"type": "json_object"}},
                      {"response_format": {"type": "text"}, "grammar": GBNF}):
            r = http.post(path, json={**base, **extra})
            assert r.status_code == 200, (extra, r.text)
    assert [(g.gbnf, g.schema_json if g.gbnf is None else None) for g in grammars(served)] == [
        (None, SCHEMA), (None, SCHEMA), (GBNF, None), (None, {"type": "object"}), (GBNF, None)]


@pytest.mark.parametrize(("path", "base"), [("/v1/chat/completions", CHAT),
                                            ("/v1/completions", COMPLETION),
                                            ("/infill", {"model": "coder:1b",
                                                         "input_prefix": "a"})])
def test_two_at_once_and_bad_values_are_400s(served, path, base):
    cases = [({"json_schema": SCHEMA, "grammar": GBNF}, "'json_schema' and 'grammar'"),
             ({"json_schema": "{}"}, "'json_schema' must be"),
             ({"grammar": {"root": "x"}}, "'grammar' must be"),
             ({"grammar": "  "}, "'grammar' cannot be used: the grammar is empty")]
    if path != "/infill":
        cases.append(({"response_format": {"type": "json_object"}, "json_schema": SCHEMA},
                      "'response_format' and 'json_schema'"))
    else:
        cases.append(({"response_format": {"type": "json_object"}}, "'response_format'"))
    with served.uds() as http:
        for extra, message in cases:
            r = http.post(path, json={**base, **extra})
            assert r.status_code == 400, (extra, r.text)
            error = r.json()["error"]
            assert message in (error["message"] if isinstance(error, dict) else error), extra


def test_tools_with_an_output_field_is_400(served):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with served.uds() as http:
        r = http.post("/v1/chat/completions", json={**CHAT, "tools": [tool],
                                                    "grammar": GBNF})
    assert r.status_code == 400 and "'grammar' and 'tools'" in r.json()["error"]["message"]


def test_infill_takes_a_grammar_or_a_schema(served):
    with served.tcp() as http:
        for extra in ({"grammar": GBNF}, {"json_schema": SCHEMA}):
            r = http.post("/infill", json={"model": "coder:1b", "input_prefix": "a",
                                           "input_suffix": "b", **extra})
            assert r.status_code == 200, r.text
        r = http.post("/infill", json={"model": "coder:1b", "input_prefix": "a",
                                       "cache_prompt": True, "id_slot": -1, "n_probs": 0,
                                       "return_tokens": False, "t_max_prompt_ms": 500})
        assert r.status_code == 200, r.text
    assert [g.gbnf or g.schema_json for g in grammars(served, "coder:1b-f16")] == [GBNF, SCHEMA]


def test_logprobs_with_structured_output(served):
    """The grammar constrains the reply, and the logprobs still come (the constrained
    distribution's are the real model's test)."""
    client = openai_client(served)
    chat = client.chat.completions.create(
        model="fake:1b", messages=[{"role": "user", "content": "hi"}], logprobs=True,
        top_logprobs=2, response_format={"type": "json_object"})
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    legacy = client.completions.create(model="fake:1b", prompt="hi", logprobs=2,
                                       extra_body={"grammar": GBNF})
    assert "".join(legacy.choices[0].logprobs.tokens) == legacy.choices[0].text
    assert [g.gbnf for g in grammars(served)] == [None, GBNF]


@pytest.fixture
def embedder(home):
    install_fake_models("embed:1b-f16")
    with serve(fake_factory(embedding_only=True, n_ctx=64)) as d:
        yield d


def test_embedding_routes_audit_their_fields(embedder):
    with embedder.uds() as http:
        for path, body in [
            ("/api/embed", {"input": "x", "truncate": True, "dimensions": 4, "keep_alive": "5m",
                            "options": {"num_ctx": 64, "num_thread": 2, "use_mmap": True,
                                        "temperature": 0}}),  # sampling: ignored
            ("/api/embeddings", {"prompt": "x", "keep_alive": 300,
                                 "options": {"num_gpu": 0}}),
            ("/v1/embeddings", {"input": "x", "user": "u1", "encoding_format": "float",
                                "dimensions": 4}),
        ]:
            r = http.post(path, json={"model": "embed:1b", **body})
            assert r.status_code == 200, (path, r.text)
        for path, body, name in [
            ("/api/embed", {"input": "x", "truncat": True}, "'truncat'"),
            ("/api/embed", {"input": "x", "options": {"temprature": 0}},
             "'options.temprature'"),
            ("/api/embeddings", {"prompt": "x", "input": "y"}, "'input'"),
            ("/v1/embeddings", {"input": "x", "truncate": True}, "'truncate'"),
            ("/v1/embeddings", {"input": "x", "options": {}}, "'options'"),
        ]:
            r = http.post(path, json={"model": "embed:1b", **body})
            error = r.json()["error"]
            assert r.status_code == 400 and name in (
                error["message"] if isinstance(error, dict) else error), (path, r.text)


def _gbnf_regex(rule: str) -> str:
    """A Python regex for GBNF ``rule`` in the subset _text_through writes (literals,
    negated classes, groups, ``*``, ``|``)."""
    out, i = [], 0
    while i < len(rule):
        char = rule[i]
        if char == '"':
            end = i + 1
            while rule[end] != '"':
                end += 2 if rule[end] == "\\" else 1
            out.append(re.escape(json.loads(rule[i:end + 1])))
            i = end + 1
        elif char == "[":
            end = rule.index("]", i + 2)
            out.append(rule[i:end + 1])
            i = end + 1
        elif char == "(":
            out.append("(?:")
            i += 1
        else:
            out.append("" if char == " " else char)
            i += 1
    return "".join(out)


@pytest.mark.parametrize("tag", ["</think>", "<|end|>"])
def test_reasoning_text_is_exactly_text_through_the_first_tag(tag):
    """Every text of up to four pieces (the tag, its prefixes, its later characters, another
    character) and then the tag: the grammar's reasoning matches it exactly when the tag
    appears nowhere before the end."""
    pattern = re.compile(_gbnf_regex(_text_through(tag)), re.DOTALL)
    pieces = [tag[:k] for k in range(1, len(tag) + 1)] + [tag[1], tag[-1], "x"]
    matched = 0
    for n in range(5):
        for chosen in itertools.product(pieces, repeat=n):
            text = "".join(chosen) + tag
            expected = text.find(tag) == len(text) - len(tag)
            assert bool(pattern.fullmatch(text)) == expected, text
            matched += expected
    assert 0 < matched < len(pieces) ** 4  # both kinds were tried


@pytest.fixture
def thinkers(home):
    """A model whose template opens the reasoning (R1-style), and a Qwen3-style one that
    thinks unless switched off."""
    install_fake_models("opened:1b-f16", "qwen3:1b-f16")

    def factory(model, num_ctx, progress=None):
        template = (R1_STYLE if model.name.startswith("opened") else QWEN3_STYLE)
        return fake_factory(reply="<think>Hm.</think>{}", chat_template=template)(
            model, num_ctx, progress)

    with serve(factory) as d:
        yield d


def test_a_grammar_lets_a_thinking_model_reason_first(thinkers):
    json_object = {"response_format": {"type": "json_object"}}
    with thinkers.uds() as http:
        for model, extra, tags in [
            ("opened:1b", json_object, ("", "</think>")),
            ("qwen3:1b", json_object, ("<think>", "</think>")),
            ("qwen3:1b", {**json_object, "reasoning_effort": "none"}, None),
        ]:
            r = http.post("/v1/chat/completions", json={**CHAT, "model": model, **extra})
            assert r.status_code == 200, r.text
            assert grammars(thinkers, f"{model}-f16")[-1].reasoning == tags, (model, extra)
        for path, body in [("/api/chat", {"messages": CHAT["messages"], "format": "json"}),
                           ("/api/generate", {"prompt": "hi", "format": "json"})]:
            r = http.post(path, json={"model": "opened:1b", "stream": False, **body})
            assert r.status_code == 200, r.text
            assert grammars(thinkers, "opened:1b-f16")[-1].reasoning == ("", "</think>")
        r = http.post("/api/generate", json={"model": "opened:1b", "stream": False,
                                             "prompt": "hi", "raw": True, "format": "json"})
        assert r.status_code == 200 and grammars(thinkers, "opened:1b-f16")[-1].reasoning is None
    gbnf = to_gbnf(Grammar(gbnf=GBNF, reasoning=("", "</think>")), lambda schema, rule: "")
    assert gbnf.startswith(GBNF) and f"{REASONED_RULE} ::= reasoning-text root" in gbnf
