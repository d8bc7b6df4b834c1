"""Log-probabilities, llama.cpp's extra samplers and the thinking split on the real starter
model, through the real openai and ollama clients. The starter's own template does not think:
the daemon here renders chats with a DeepSeek-R1-style fixture template, whose prompt opens
``<think>``, so the reply streams as reasoning until the model closes the block."""

from __future__ import annotations

import math

import ollama
import openai
import pytest

from daemon_util import serve
from localinfer import gguf
from localinfer.loading import with_batches
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.chat_template import ChatTemplate
from localinfer.runtime.engine import Engine
from localinfer.runtime.llama import LlamaBackend
from localinfer.runtime.thinking import split_reply, thinking_format
from localinfer.runtime.types import Message
from template_fixtures import R1_STYLE

pytestmark = pytest.mark.model

MODEL = "gemma3:270m"
PROMPT = "The capital of France is"


def r1_templated(model, num_ctx, progress=None):
    header = gguf.read_header(model.path)
    options = with_batches(LoadOptions(n_ctx=2048, n_slots=2), header, model.name)
    backend = LlamaBackend(model.path, options, name=model.name, header=header)
    info = backend.info
    return Engine(backend, chat_template=ChatTemplate(R1_STYLE, bos_token=info.bos_text,
                                                      eos_token=info.eos_text))


@pytest.fixture(scope="module")
def daemon(starter_path):
    with serve(r1_templated) as d:
        yield d


@pytest.fixture(scope="module")
def clients(daemon):
    return (openai.OpenAI(base_url=daemon.url + "/v1", api_key="x", max_retries=0),
            ollama.Client(host=daemon.url))


def test_logprobs_are_the_models_distribution(clients):
    oai, _ = clients
    greedy = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                    logprobs=5).choices[0]
    lp = greedy.logprobs
    assert "".join(lp.tokens) == greedy.text and len(lp.tokens) == 8
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        best = max(top, key=top.get)
        assert best == token and top[best] == pytest.approx(logprob)  # greedy takes the top
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-6
    # Before the sampling filters: a hot, truncated sampler sees the same first distribution.
    hot = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=1.5,
                                 seed=1, logprobs=5, extra_body={"top_k": 3})
    first = hot.choices[0].logprobs.top_logprobs[0]
    assert first.keys() == lp.top_logprobs[0].keys()
    for token, value in first.items():
        assert value == pytest.approx(lp.top_logprobs[0][token], abs=1e-3)


def cold(daemon) -> None:
    """The next request reads its prompt cold: one asked again would find it cached, and a
    prompt read in part rounds apart from a cold read (see engine.REREAD_TAIL)."""
    daemon.manager.loaded["gemma3:270m-q4_k_m"].engine.clear_cache()


def test_chat_logprobs_agree_across_the_apis(daemon, clients):
    # Without speculation: whether a step verifies a draft depends on what the engine has
    # measured so far, and a verified draft's rows round apart from one-row steps (llama.cpp
    # computes one row's logits with another kernel: seen as 0.0045 apart, AVX-512).
    oai, olla = clients
    messages = [{"role": "user", "content": "Name a colour."}]
    cold(daemon)
    v1 = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=6,
                                     temperature=0, logprobs=True, top_logprobs=2,
                                     extra_body={"speculative": False})
    cold(daemon)
    api = olla.chat(model=MODEL, messages=messages, logprobs=True, top_logprobs=2,
                    options={"num_predict": 6, "temperature": 0, "speculative": False})
    v1_entries = v1.choices[0].logprobs.content
    assert [e.token for e in v1_entries] == [e.token for e in api.logprobs]
    for a, b in zip(v1_entries, api.logprobs, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3) and a.logprob <= 0
        assert len(a.top_logprobs) == len(b.top_logprobs) == 2


def test_logit_bias_bans_the_greedy_token(daemon, clients):
    oai, _ = clients
    greedy = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0)
    engine = daemon.manager.loaded["gemma3:270m-q4_k_m"].engine
    [token] = engine.tokenize(greedy.choices[0].text)
    banned = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                    logit_bias={str(token): -100})
    assert banned.choices[0].text != greedy.choices[0].text
    pushed = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                    logit_bias={str(token): -100, "236787": 100})
    assert engine.tokenize(pushed.choices[0].text) == [236787]


@pytest.mark.parametrize("options", [{"mirostat": 1}, {"mirostat": 2, "mirostat_tau": 3.0},
                                     {"typical_p": 0.5}])
def test_llama_cpp_samplers_run_and_follow_the_seed(clients, options):
    _, olla = clients
    runs = [olla.generate(model=MODEL, prompt=PROMPT, raw=True,
                          options={"num_predict": 12, "temperature": 1.0, "seed": 5,
                                   **options}).response for _ in range(2)]
    assert runs[0] == runs[1] and runs[0]


def test_a_requests_own_chain_runs_in_its_order_with_the_infill_sampler(daemon):
    """llama-server's ``samplers`` (llama.vscode's ``top_k``, ``top_p``, ``infill``) build
    llama.cpp's chain in that order, its fill-in-the-middle sampler in it; those left out do
    not run. Without a chain of its own a request gets the standard one."""
    import llama_cpp as L

    from localinfer.runtime.types import SamplingParams

    backend = daemon.manager.loaded["gemma3:270m-q4_k_m"].engine.backend

    def names(params: SamplingParams) -> list[str]:
        chain = backend.new_sampler(params, 1)
        try:
            return [L.llama_sampler_name(L.llama_sampler_chain_get(chain, i)).decode()
                    for i in range(L.llama_sampler_chain_n(chain))]
        finally:
            backend.free_sampler(chain)

    editor = SamplingParams(chain=("top_k", "top_p", "infill"), top_p=0.99, min_p=0.0)
    assert names(editor)[-4:] == ["top-k", "top-p", "infill", "dist"]
    assert names(SamplingParams(chain=("infill", "top_k")))[-3:] == ["infill", "top-k", "dist"]
    assert names(SamplingParams())[-5:] == ["top-k", "top-p", "min-p", "temp", "dist"]


def test_thinking_splits_the_real_reply(daemon, clients):
    oai, olla = clients
    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    cold(daemon)
    streamed = list(olla.chat(model=MODEL, messages=messages, stream=True,
                              options={"num_predict": 24, "temperature": 0}))
    thinking = "".join(p.message.thinking or "" for p in streamed)
    content = "".join(p.message.content for p in streamed)
    engine = daemon.manager.loaded["gemma3:270m-q4_k_m"].engine
    prompt = engine.render_chat([Message("user", "Why is the sky blue?")])
    assert prompt.endswith("<think>\n")
    # A raw prompt gets its BOS from the tokenizer; the template wrote it into this one.
    cold(daemon)
    raw = olla.generate(model=MODEL, prompt=prompt.removeprefix(engine.info.bos_text), raw=True,
                        options={"num_predict": 24, "temperature": 0}).response
    assert (thinking, content) == split_reply(thinking_format(R1_STYLE), raw, thinking=True)
    assert thinking  # the reply starts inside the block the prompt opened
    cold(daemon)
    v1 = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                     temperature=0).choices[0].message
    assert (v1.model_extra.get("reasoning_content", ""), v1.content) == (thinking, content)
    with pytest.raises(ollama.ResponseError, match="always thinks"):
        olla.chat(model=MODEL, messages=messages, think=False)
