"""llama.vim's instruction requests (autoload/llama.vim: llama#inst, llama#inst_send) to its
``endpoint_inst``, /v1/chat/completions, as it sends them: the warm-up while the user types the
instruction (``n_predict`` 0, no samplers, ``response_fields`` [""], its request id as
``id_slot``) and the instruction, streamed, with min_p and temperature its only samplers; no
``model`` (its ``model_inst`` is empty by default: llama-server serves one model). And
llama-server's reading of these fields on /v1/completions. Fake backend, through the daemon."""

from __future__ import annotations

import json

import pytest

from daemon_util import fake_factory, install_fake_models, openai_client, serve
from localinfer.runtime.types import Priority

SYSTEM = (  # llama#inst_build's system message: its instructions, then the buffer around
    "You are a text-editing assistant. Respond ONLY with the result of applying INSTRUCTION to"
    " SELECTION given the CONTEXT. Maintain the existing text indentation. Do not add extra"
    " code blocks. Respond only with the modified block. If the INSTRUCTION is a question,"
    " answer it directly. Do not output any extra separators. Consider the local context"
    " before (PREFIX) and after (SUFFIX) the SELECTION.\n\n"
    f"--- CONTEXT     {'-' * 40}\n\n"
    f"--- PREFIX      {'-' * 40}\nimport os\n\n"
    f"--- SELECTION   {'-' * 40}\ndef main():\n    print(os.getcwd())\n"
    f"--- SUFFIX      {'-' * 40}\n\n")


def warm_up(req_id: int) -> dict:
    """llama#inst's request, sent as the instruction prompt opens."""
    return {"id_slot": req_id,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ""}],
            "samplers": [], "n_predict": 0, "stream": False, "cache_prompt": True,
            "response_fields": [""]}


def instruction(req_id: int, text: str) -> dict:
    """llama#inst_send's request, once the instruction is typed."""
    return {"id_slot": req_id,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "INSTRUCTION: " + text}],
            "min_p": 0.1, "temperature": 0.1, "samplers": ["min_p", "temperature"],
            "stream": True, "cache_prompt": True}


def echo(prompt: str) -> str:
    """A reply that shows the end of the prompt the model read (its marks spelled out)."""
    return "|" + prompt[-80:].replace("<", "[").replace(">", "]") + "|"


@pytest.fixture
def vim(home):
    """A daemon whose default model is a fake chat model; ``vim.seen`` holds each request's
    sampling as the engine got it, ``vim.priorities`` each one's priority."""
    install_fake_models("chat:1b-f16")
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "config.toml").write_text('default_model = "chat:1b"\n')
    seen: list = []
    priorities: list = []

    def factory(model, num_ctx, progress=None):
        engine = fake_factory(reply=echo)(model, num_ctx, progress)
        sampler = engine.backend.new_sampler

        def recording(params, seed):
            seen.append(params)
            return sampler(params, seed)

        engine.backend.new_sampler = recording
        submit = engine.submit

        def submitting(prompt, params, **kwargs):
            priorities.append(kwargs["priority"])
            return submit(prompt, params, **kwargs)

        engine.submit = submitting
        return engine

    with serve(factory) as d:
        d.seen, d.priorities = seen, priorities
        yield d


def post(http, body: dict):
    """As llama.vim posts: curl with the JSON on stdin and a Content-Type header."""
    return http.post("/v1/chat/completions", content=json.dumps(body),
                     headers={"Content-Type": "application/json"})


def test_llama_vim_warm_up_then_instruction(vim):
    with vim.tcp() as http:
        reply = post(http, warm_up(3))
        assert reply.status_code == 200, reply.text
        body = reply.json()
        # llama-server applies response_fields only on /infill and /completion: the reply
        # keeps OpenAI's shape, with nothing predicted
        assert body["object"] == "chat.completion" and body["model"] == "chat:1b-f16"
        choice = body["choices"][0]
        assert choice["message"]["content"] == "" and choice["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] > 50
        with http.stream("POST", "/v1/chat/completions", content=json.dumps(
                instruction(3, "print the home directory instead")),
                headers={"Content-Type": "application/json"}) as streamed:
            assert streamed.status_code == 200
            lines = [line for line in streamed.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    # what llama#inst_on_response reads: choices[0].delta.content of each chunk
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text.endswith("INSTRUCTION: print the home directory instead[end_of_turn]\n"
                         "[start_of_turn]model\n|")
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # the warm-up read the system prompt into the cache: the instruction found it there
    assert chunks[-1]["timings"]["cached_tokens"] > 50
    warm, inst = vim.seen
    # no one waits for the warm-up; the instruction goes as any chat request
    assert vim.priorities == [Priority.BACKGROUND, Priority.NORMAL]
    # samplers []: none runs (top-k, top-p and min-p off, temperature 1); the one token that
    # finishes the read is dropped
    assert (warm.max_tokens, warm.top_k, warm.top_p, warm.min_p, warm.temperature) == (
        1, 0, 1.0, 0.0, 1.0)
    assert (inst.max_tokens, inst.top_k, inst.top_p, inst.min_p, inst.temperature) == (
        None, 0, 1.0, 0.1, 0.1)


def test_llama_server_fields_on_the_openai_routes(vim):
    client = openai_client(vim)
    # n_predict wins over max_tokens, as in llama-server (it is max_tokens' alias there)
    out = client.completions.create(model="chat:1b", prompt="Once upon a time", max_tokens=50,
                                    extra_body={"n_predict": 2})
    assert out.usage.completion_tokens == 2 and out.choices[0].finish_reason == "length"
    assert vim.seen[-1].max_tokens == 2
    out = client.completions.create(model="chat:1b", prompt="Once", extra_body={
        "n_predict": -1, "samplers": ["top_k"], "top_k": 5})
    assert vim.seen[-1].max_tokens is None and (vim.seen[-1].top_k, vim.seen[-1].top_p) == (
        5, 1.0)
    # a streamed warm-up: no text, only its end
    chunks = list(client.chat.completions.create(
        model="chat:1b", messages=[{"role": "user", "content": "hi"}], stream=True,
        extra_body={"n_predict": 0}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    assert chunks[-1].choices[0].finish_reason == "length"
    with vim.tcp() as http:
        for body, word in [({"samplers": ["dry"]}, "dry"), ({"samplers": "kdt"}, "samplers"),
                           ({"n_predict": -2}, "n_predict")]:
            reply = post(http, {**instruction(0, "x"), "stream": False, **body})
            assert reply.status_code == 400 and word in reply.json()["error"]["message"]


def test_no_model_named_and_none_to_pick(home):
    install_fake_models("chat:1b-f16")
    with serve(fake_factory()) as d, d.tcp() as http:
        reply = post(http, warm_up(0))
    assert reply.status_code == 400
    assert "'model'" in reply.json()["error"]["message"]
