"""llama-server's own routes besides /infill: /completion, and /props, /apply-template,
/tokenize and /detokenize as llama.vscode calls them (src/language-model-token-limits.ts,
src/llama-server.ts: the context size from ``default_generation_settings.n_ctx``; a chat
prompt's exact token count by rendering it with /apply-template and counting it with /tokenize,
``add_special`` false, ``parse_special`` true). Fake backend, through the daemon; before these
routes clients got 404s (llama.vscode then estimated)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon_util import fake_factory, install_fake_models, openai_client, serve

MESSAGES = [{"role": "system", "content": "You are a careful coder."},
            {"role": "user", "content": "Rename x to count in: x = 1"}]


@pytest.fixture
def daemon(home):
    install_fake_models("chat:1b-f16", "other:1b-f16")
    with serve(fake_factory()) as d:
        yield d


def test_the_token_count_llama_vscode_asks_for_is_the_chat_prompts(daemon):
    with daemon.tcp() as http:
        rendered = http.post("/apply-template", json={"model": "chat:1b", "messages": MESSAGES})
        assert rendered.status_code == 200, rendered.text
        prompt = rendered.json()["prompt"]
        counted = http.post("/tokenize", json={"content": prompt, "add_special": False,
                                               "parse_special": True})
        assert counted.status_code == 200, counted.text
        tokens = counted.json()["tokens"]
    # The prompt the chat route reads for the same messages: as many tokens (its template
    # writes the BOS itself, or the count differs by the one the tokenizer adds).
    reply = openai_client(daemon).chat.completions.create(model="chat:1b", messages=MESSAGES,
                                                          max_tokens=1)
    engine = daemon.manager.loaded["chat:1b-f16"].engine
    assert prompt == engine.render_chat(engine_messages(MESSAGES))
    bos = 0 if engine.prompt_builder.adds_bos(prompt) is False else 1
    assert len(tokens) + bos == reply.usage.prompt_tokens
    assert "Rename x to count" in prompt


def engine_messages(raw):
    from localinfer.daemon.requests import parse_messages
    return parse_messages(raw)


def test_pieces_and_detokenize_spell_the_text_back(daemon):
    text = "def f(x):\n    return x <end_of_turn> é"
    with daemon.tcp() as http:
        plain = http.post("/tokenize", json={"model": "chat:1b", "content": text}).json()
        pieces = http.post("/tokenize", json={"model": "chat:1b", "content": text,
                                              "with_pieces": True}).json()["tokens"]
        back = http.post("/detokenize", json={"model": "chat:1b",
                                              "tokens": plain["tokens"]}).json()
        with_bos = http.post("/tokenize", json={"model": "chat:1b", "content": text,
                                                "add_special": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == plain["tokens"]
    assert "".join(p["piece"] for p in pieces) == text == back["content"]
    assert len(with_bos) == len(plain["tokens"]) + 1


def test_props_gives_the_context_editors_budget_by(daemon):
    with daemon.tcp() as http:
        refused = http.get("/props", params={"model": "other:1b", "autoload": "false"})
        props = http.get("/props", params={"model": "chat:1b"})
        loaded_only = http.get("/props", params={"model": "chat:1b", "autoload": "false"})
        unnamed = http.get("/props")  # llama-server serves one model: the one used last
        odd = http.get("/props", params={"slot": "0"})
    assert refused.status_code == 400
    assert "not loaded" in refused.json()["error"]["message"]
    assert "other:1b-f16" not in daemon.manager.loaded  # autoload=false loaded nothing
    info = daemon.manager.loaded["chat:1b-f16"].engine.info
    body = props.json()
    assert body["default_generation_settings"]["n_ctx"] == info.n_ctx > 0
    assert body["total_slots"] == info.n_slots
    assert body["chat_template"] and body["model_alias"] == "chat:1b-f16"
    assert loaded_only.json() == body and unnamed.json() == body
    # llama.vscode asks /props only of a model whose /v1/models entry has llama-server's meta.
    with daemon.tcp() as http:
        models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        one = http.get("/v1/models/chat:1b-f16").json()
    assert models["chat:1b-f16"]["meta"]["n_vocab"] == info.n_vocab == one["meta"]["n_vocab"]
    assert "meta" not in models["other:1b-f16"]  # not loaded: nothing read from its file
    assert odd.status_code == 400 and "'slot'" in odd.json()["error"]["message"]


@pytest.mark.parametrize("route, body, words", [
    ("/tokenize", {"model": "chat:1b", "content": "x", "parse_special": False},
     "'parse_special'"),
    ("/tokenize", {"model": "chat:1b", "content": ["x", 5]}, "'content'"),
    ("/tokenize", {"model": "chat:1b", "content": "x", "n_probs": 3}, "'n_probs'"),
    ("/detokenize", {"model": "chat:1b", "tokens": [1, "2"]}, "'tokens'"),
    ("/detokenize", {"model": "chat:1b", "tokens": [10 ** 9]}, "not in the model's vocab"),
    ("/detokenize", {"model": "chat:1b", "tokens": [-1]}, "not in the model's vocab"),
    ("/apply-template", {"model": "chat:1b", "messages": "hi"}, "'messages'"),
    ("/apply-template", {"model": "chat:1b", "messages": MESSAGES, "functions": []},
     "'functions'"),
])
def test_what_these_routes_do_not_take_is_a_400_naming_it(daemon, route, body, words):
    with daemon.tcp() as http:
        reply = http.post(route, json=body)
    assert reply.status_code == 400, reply.text
    assert words in reply.json()["error"]["message"]


def test_apply_template_renders_tools_and_ignores_sampling(home):
    install_fake_models("chat:1b-f16")
    qwen = (Path(__file__).parent / "templates" / "qwen2.5.jinja").read_text()
    tools = [{"type": "function", "function": {
        "name": "read_file", "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    with serve(fake_factory(chat_template=qwen)) as daemon, daemon.tcp() as http:
        bare = http.post("/apply-template", json={"model": "chat:1b", "messages": MESSAGES})
        with_tools = http.post("/apply-template", json={
            "model": "chat:1b", "messages": MESSAGES, "tools": tools, "tool_choice": "auto",
            "temperature": 0.2, "max_tokens": 5, "stream": True})
    assert with_tools.status_code == 200, with_tools.text
    assert "read_file" in with_tools.json()["prompt"]
    assert "read_file" not in bare.json()["prompt"]


def test_completion_continues_a_text_or_token_prompt(daemon):
    """llama-server's /completion: the same reply for the text and for its token ids; its
    reply object, or its server-sent events ending with ``stop: true``."""
    with daemon.tcp() as http:
        text = http.post("/completion", json={"model": "chat:1b", "prompt": "Once upon a time",
                                              "n_predict": 4, "temperature": 0})
        assert text.status_code == 200, text.text
        ids = http.post("/tokenize", json={"model": "chat:1b", "content": "Once upon a time",
                                           "add_special": True}).json()["tokens"]
        by_ids = http.post("/completions", json={"model": "chat:1b", "prompt": ids,
                                                 "n_predict": 4, "temperature": 0})
        with http.stream("POST", "/completion", json={
                "model": "chat:1b", "prompt": "Once upon a time", "n_predict": 4,
                "temperature": 0, "stream": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ")]
        only = http.post("/completion", json={"model": "chat:1b", "prompt": "Once upon",
                                              "n_predict": 0})
        several = http.post("/completion", json={"model": "chat:1b", "prompt": "Once upon",
                                                  "n_predict": 3, "n_cmpl": 2})
        with http.stream("POST", "/completion", json={
                "model": "chat:1b", "prompt": "Once upon", "n_predict": 3, "n_cmpl": 2,
                "stream": True}) as r:
            interleaved = [json.loads(line[6:]) for line in r.iter_lines()
                           if line.startswith("data: ")]
    reply = text.json()
    assert reply["content"] and reply["stop"] is True and reply["tokens_predicted"] == 4
    assert reply["tokens_evaluated"] == len(ids) and reply["timings"]["predicted_n"] == 4
    assert by_ids.json()["content"] == reply["content"]
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])
    assert "".join(e["content"] for e in events[:-1]) == reply["content"]
    # Each partial event counts, as llama-server's do, what was predicted and evaluated.
    assert [e["tokens_predicted"] for e in events[:-1]] == list(range(1, len(events)))
    assert {e["tokens_evaluated"] for e in events} == {events[-1]["tokens_evaluated"]}
    assert only.json()["content"] == "" and only.json()["tokens_predicted"] == 0
    assert [r["index"] for r in several.json()] == [0, 1]
    # Streamed, each completion's events carry its index and end with its own final event.
    for index, whole in enumerate(several.json()):
        mine = [e for e in interleaved if e["index"] == index]
        assert [e["stop"] for e in mine] == [False] * (len(mine) - 1) + [True]
        assert "".join(e["content"] for e in mine[:-1]) == whole["content"]
    assert {e["index"] for e in interleaved} == {0, 1}


@pytest.mark.parametrize("body, words", [
    ({"prompt": ["one", "two"]}, "'prompt'"),
    ({"prompt": ""}, "'prompt'"),
    ({"prompt": [1, 10 ** 9]}, "not in the model's vocab"),
    ({"prompt": "x", "n_probs": 5}, "'n_probs'"),
    ({"prompt": "x", "ignore_eos": True}, "'ignore_eos'"),
    ({"prompt": "x", "n_predict": 0, "n_cmpl": 2}, "'n_cmpl'"),
])
def test_completion_refuses_what_it_does_not_do(daemon, body, words):
    with daemon.tcp() as http:
        reply = http.post("/completion", json={"model": "chat:1b", **body})
    assert reply.status_code == 400, reply.text
    assert words in reply.json()["error"]["message"]


def test_continues_llama_cpp_provider(daemon):
    """Continue's "llama.cpp" provider (core/llm/llms/LlamaCpp.ts): /completion, streamed, no
    model (llama-server serves one: the loaded model used last answers), its options, and
    "Bearer undefined" where no API key is set."""
    body = {"prompt": "def add(a, b):\n", "stream": True, "n_predict": 8,
            "frequency_penalty": 0, "presence_penalty": 0, "min_p": 0.05, "mirostat": 0,
            "stop": ["\n\n"], "top_k": 40, "top_p": 0.95, "temperature": 0.2}
    with daemon.tcp() as http:
        http.post("/completion", json={"model": "chat:1b", "prompt": "x", "n_predict": 1})
        with http.stream("POST", "/completion", json=body,
                         headers={"Authorization": "Bearer undefined"}) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) and events[-1]["stop"] is True
    assert events[-1]["model"] == "chat:1b-f16"


def test_v1_completions_takes_token_ids_too(daemon):
    """OpenAI's /v1/completions takes a prompt as token ids (the SDK's ``prompt: list[int]``),
    read as /completion reads them; not with ``suffix`` (FIM needs the text)."""
    client = openai_client(daemon)
    with daemon.tcp() as http:
        ids = http.post("/tokenize", json={"model": "chat:1b", "content": "Once upon a time",
                                           "add_special": True}).json()["tokens"]
        fim = http.post("/v1/completions", json={"model": "chat:1b", "prompt": ids,
                                                 "suffix": "end"})
        outside = http.post("/v1/completions", json={"model": "chat:1b", "prompt": [10 ** 9]})
    by_ids = client.completions.create(model="chat:1b", prompt=ids, max_tokens=4,
                                       temperature=0)
    by_text = client.completions.create(model="chat:1b", prompt="Once upon a time",
                                        max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens == len(ids)
    assert fim.status_code == 400 and "'suffix'" in fim.json()["error"]["message"]
    assert outside.status_code == 400 and "vocabulary" in outside.json()["error"]["message"]
