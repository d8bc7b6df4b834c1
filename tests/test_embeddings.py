"""Embeddings: the engine's batched embed (fake backend and the real starter model, which as a
generative model is mean-pooled) and the routes /api/embed, /api/embeddings and /v1/embeddings
through the real ollama and openai clients: unit vectors, dimensions, the same vector alone or
in a batch, truncation, and what is refused."""

from __future__ import annotations

import base64
import math
import struct
import threading

import ollama
import openai
import pytest

from daemon_util import fake_factory, install_fake_models, ollama_client, openai_client, serve
from localinfer.config import Config
from localinfer.errors import ContextOverflow, InvalidRequest
from localinfer.loading import engine_factory, load_engine
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.types import Message, SamplingParams

TEXTS = ["The cat sat on the mat.", "Quantum chromodynamics describes the strong force.",
         "def add(a, b):\n    return a + b\n"]


def norm(v) -> float:
    return math.sqrt(sum(x * x for x in v))


def cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (norm(a) * norm(b))


def test_engine_embeds_many_inputs_in_one_call(fake_engine):
    engine = fake_engine()
    tokens = [engine.embedding_tokens(t) for t in TEXTS]
    together = engine.embed(tokens)
    alone = [engine.embed([t]).vectors[0] for t in tokens]
    assert together.vectors == alone
    assert engine.backend.embed_calls == [3, 1, 1, 1]
    assert together.prompt_tokens == sum(map(len, tokens))


def test_engine_embeds_while_generating(fake_engine):
    engine = fake_engine(reply="tok " * 300, step_delay_s=0.002)
    running = engine.complete("x", SamplingParams(max_tokens=300))
    events = iter(running)
    assert next(events).text  # generating
    engine.embed([engine.embedding_tokens("hello")])
    assert running.done is None  # answered between two of its steps
    assert list(events)[-1].finish_reason == "length"


def test_truncate_or_refuse_an_input_longer_than_the_context(fake_engine):
    engine = fake_engine(n_ctx=64)
    long = "word " * 100
    assert len(engine.embedding_tokens(long, truncate=True)) == 64
    with pytest.raises(ContextOverflow, match="shorten it, or split it"):
        engine.embedding_tokens(long, truncate=False)
    with pytest.raises(InvalidRequest):
        engine.embedding_input([5000])  # beyond the vocabulary


def test_a_huge_input_is_measured_by_its_bytes_before_it_is_tokenized(fake_engine):
    # llama.cpp's tokenizer takes time that grows faster than the text (1 MB: ~27 s, no cancel
    # stops it): an input longer than the longest tokens could fill is cut or refused first.
    engine = fake_engine(n_ctx=64)
    backend = engine.backend
    backend.longest_token = 8  # the most bytes one token spells
    seen: list[int] = []
    tokenize = backend.tokenize
    backend.tokenize = lambda text, **kw: seen.append(len(text)) or tokenize(text, **kw)
    huge = "word " * 20_000
    assert len(engine.embedding_tokens(huge, truncate=True)) == 64
    assert seen == [64 * 8]  # only what can hold its first 64 tokens
    with pytest.raises(ContextOverflow, match="at least 12,500 tokens"):
        engine.embedding_tokens(huge, truncate=False)
    for prompt in (lambda: engine.completion_tokens(huge),
                   lambda: engine.chat_tokens([Message("user", huge)])):
        with pytest.raises(ContextOverflow, match="the prompt is at least"):
            prompt()
    assert seen == [64 * 8]  # none of them tokenized
    assert engine.embedding_tokens("word " * 50, truncate=True)  # a short one as before
    # The bound is the context the model was trained for, not the one loaded: a daemon
    # grows that for a long prompt (a 33,000-token prompt was refused at 2,048).
    grows = fake_engine(n_ctx=64, n_ctx_train=100_000)
    grows.backend.longest_token = 8
    assert len(grows.completion_tokens(huge)) > 64


def test_an_embedding_model_generates_no_text(fake_engine):
    engine = fake_engine(embedding_only=True)
    with pytest.raises(InvalidRequest, match="embedding model"):
        engine.complete("hi")
    assert len(engine.embed([engine.embedding_tokens("hi")]).vectors[0]) == 16


@pytest.fixture
def embedder(home):
    install_fake_models("embed:1b-f16")
    with serve(fake_factory(embedding_only=True, n_ctx=64)) as d:
        yield d


def test_ollama_embed_and_legacy_embeddings(embedder):
    client = ollama_client(embedder)
    out = client.embed(model="embed:1b", input=TEXTS)
    assert len(out.embeddings) == 3
    assert all(abs(norm(v) - 1) < 1e-6 for v in out.embeddings)
    one = client.embed(model="embed:1b", input=TEXTS[1]).embeddings[0]
    assert one == pytest.approx(out.embeddings[1], abs=1e-6)
    cut = client.embed(model="embed:1b", input=TEXTS[0], dimensions=8).embeddings[0]
    assert len(cut) == 8 and abs(norm(cut) - 1) < 1e-6
    assert cosine(cut, out.embeddings[0][:8]) == pytest.approx(1.0)
    legacy = client.embeddings(model="embed:1b", prompt=TEXTS[0]).embedding
    assert cosine(legacy, out.embeddings[0]) == pytest.approx(1.0)
    assert abs(norm(legacy) - 1) > 1e-3  # the legacy route returns the vector as pooled
    assert client.embed(model="embed:1b", input=[]).embeddings == []  # load only
    assert client.embed(model="embed", input="x").model == "embed"  # as asked, as Ollama
    with pytest.raises(ollama.ResponseError) as info:
        client.embed(model="embed:1b", input="word " * 100, truncate=False)
    assert info.value.status_code == 400 and "leave out truncate: false" in info.value.error
    assert len(client.embed(model="embed:1b", input="word " * 100).embeddings) == 1
    # Sampling options, as a client sends one options object to every route: ignored (an
    # embedding samples nothing), as Ollama ignores them.
    assert client.embed(model="embed:1b", input="x", options={"temperature": 0}).embeddings \
        == client.embed(model="embed:1b", input="x").embeddings
    with pytest.raises(ollama.ResponseError) as info:
        client.embed(model="embed:1b", input="x", options={"temprature": 0})
    assert info.value.status_code == 400 and "options.temprature" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.embed(model="embed:1b", input="x", dimensions=17)
    assert info.value.status_code == 400 and "dimensions" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model="embed:1b", prompt="hi")
    assert info.value.status_code == 400 and "embedding model" in info.value.error


def test_openai_embeddings(embedder):
    client = openai_client(embedder)
    out = client.embeddings.create(model="embed:1b", input=TEXTS)
    assert [d.index for d in out.data] == [0, 1, 2]
    assert all(abs(norm(d.embedding) - 1) < 1e-6 for d in out.data)
    assert out.usage.prompt_tokens > 10 and out.usage.total_tokens == out.usage.prompt_tokens
    # The client asks for base64 by default and decodes it; ask for floats too.
    floats = client.embeddings.create(model="embed:1b", input=TEXTS[0], encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(out.data[0].embedding, abs=1e-6)
    short = client.embeddings.create(model="embed:1b", input=TEXTS[0], dimensions=4,
                                     encoding_format="float")
    assert len(short.data[0].embedding) == 4
    tokens = client.embeddings.create(model="embed:1b", input=[[5, 6, 7], [8, 9]],
                                      encoding_format="float")
    assert len(tokens.data) == 2
    with embedder.uds() as http:
        raw = http.post("/v1/embeddings", json={"model": "embed:1b", "input": "x",
                                                "encoding_format": "base64"}).json()
        packed = base64.b64decode(raw["data"][0]["embedding"])
        assert len(struct.unpack(f"<{len(packed) // 4}f", packed)) == 16
        for body, word in [({"input": ""}, "input"), ({"input": [[]]}, "input"),
                           ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
                           ({"input": "word " * 100}, "split it into parts")]:
            reply = http.post("/v1/embeddings", json={"model": "embed:1b", **body})
            assert reply.status_code == 400 and word in reply.text, (body, reply.text)
            # No advice to send a field /v1/embeddings refuses (it said "send truncate").
            assert "truncate" not in reply.text
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="embed:1b", input="x", dimensions=100)


def test_openai_embeddings_without_a_model_use_the_loaded_embedding_model(embedder):
    """llama.vscode's request ({"input", "encoding_format"}, no model unless one is set):
    the embedding model loaded answers, as llama-server's one model does; none loaded: a 400
    that names 'model'."""
    with embedder.uds() as http:
        first = http.post("/v1/embeddings", json={"input": "x", "encoding_format": "float"})
        assert first.status_code == 400 and "'model'" in first.json()["error"]["message"]
        named = http.post("/v1/embeddings", json={"model": "embed:1b", "input": "x",
                                                  "encoding_format": "float"}).json()
        bare = http.post("/v1/embeddings", json={"input": "x", "encoding_format": "float"})
        assert bare.status_code == 200, bare.text
        assert bare.json()["model"] == named["model"]
        assert bare.json()["data"][0]["embedding"] == named["data"][0]["embedding"]


# --- the real starter model ------------------------------------------------------------------
@pytest.mark.model
def test_starter_embeddings_mean_pooled_same_alone_or_batched(real_engine):
    tokens = [real_engine.embedding_tokens(t) for t in TEXTS]
    together = real_engine.embed(tokens).vectors
    alone = [real_engine.embed([t]).vectors[0] for t in tokens]
    assert len(together[0]) == 640  # Gemma 3 270M's hidden size
    for a, b in zip(together, alone, strict=True):
        assert cosine(a, b) > 0.9999  # batches of other sizes round a little differently
    # Closer meanings, closer vectors.
    cat, physics, code = together
    kitten = real_engine.embed([real_engine.embedding_tokens("A kitten sat on a rug.")]).vectors[0]
    assert cosine(cat, kitten) > cosine(cat, physics)


@pytest.mark.model
def test_starter_embeddings_through_both_clients(starter_path):
    with serve(engine_factory(Config(ctx=2048), n_slots=1)) as d:
        olla = ollama.Client(host=d.url)
        out = olla.embed(model="gemma3:270m", input=TEXTS, dimensions=256)
        assert [len(v) for v in out.embeddings] == [256] * 3
        assert all(abs(norm(v) - 1) < 1e-5 for v in out.embeddings)
        client = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0)
        alone = client.embeddings.create(model="gemma3:270m", input=TEXTS[2])
        full = olla.embed(model="gemma3:270m", input=TEXTS).embeddings[2]
        assert cosine(alone.data[0].embedding, full) > 0.9999


@pytest.mark.model
def test_an_embedding_only_load_embeds_in_its_own_context(starter_path, real_engine):
    """The embedding-model path (a context made for embeddings, many sequences at once), on
    the starter loaded as if it were one: its mean-pooled vectors are the generative model's."""
    engine = load_engine(starter_path, LoadOptions(n_ctx=512, embedding_only=True),
                         name="gemma3:270m", family="gemma3").wait_ready()
    try:
        assert engine.info.embedding_only and engine.info.n_slots == 1
        with pytest.raises(InvalidRequest, match="embedding model"):
            engine.complete("hi")
        tokens = [engine.embedding_tokens(t) for t in TEXTS]
        own = engine.embed(tokens).vectors  # llama.cpp's pooling, after the whole graph
        pooled = real_engine.embed(tokens).vectors
        # The generative model's context stopped its graph before the output layer, and
        # its means of the hidden states are llama.cpp's pooled vectors.
        assert real_engine.backend._hidden_only.stopped
        for a, b in zip(own, pooled, strict=True):
            assert cosine(a, b) > 0.9999
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-3
        assert len(engine.embedding_tokens("word " * 600)) == 512
    finally:
        engine.close()


def test_every_cpu_models_decodes_run_on_one_thread(starter_path, real_engine, monkeypatch):
    """A daemon's chat and embedding engines each have a worker thread; llama.cpp's OpenMP
    keeps a team of threads for every thread that decodes, and once the teams outnumber the
    cores it sleeps at each of a step's barriers (1.4-1.7x slower steps on 2 cores). So the
    decodes of every model with layers or experts on the CPU run on one thread
    (decode.CPU_COMPUTE)."""
    import llama_cpp

    decoded_on = set()
    original = llama_cpp.llama_decode

    def recording(ctx, batch):
        decoded_on.add(threading.get_ident())
        return original(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", recording)
    engine = load_engine(starter_path, LoadOptions(n_ctx=512, embedding_only=True),
                         name="gemma3:270m", family="gemma3").wait_ready()
    try:
        engine.embed([engine.embedding_tokens(TEXTS[0])])
        real_engine.complete("Once upon a time", SamplingParams(max_tokens=2)).result()
        real_engine.embed([real_engine.embedding_tokens(TEXTS[1])])
        workers = {engine._thread.ident, real_engine._thread.ident}
        assert len(decoded_on) == 1 and not decoded_on & workers
    finally:
        engine.close()


def test_the_compute_thread_answers_in_the_callers_thread():
    from localinfer.runtime.llama.decode import ComputeThread

    def fail(message):
        raise ValueError(message)

    compute = ComputeThread()
    assert compute.call(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ValueError, match="bad input"):
        compute.call(fail, "bad input")
    ran_on = {compute.call(threading.get_ident) for _ in range(3)}
    nested = compute.call(lambda: compute.call(threading.get_ident))  # no deadlock
    assert ran_on == {nested} and threading.get_ident() not in ran_on
