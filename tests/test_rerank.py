"""/v1/rerank and /rerank in llama-server's shape, on a tiny BERT cross-encoder with rank
pooling the tests write (ggufgen.reranker_model) and llama.cpp really loads and runs. Its
scores mean nothing; what is tested is the plumbing: one score per document, each the model's
own for that pair, sorted, cut to top_n, and the refusals."""

from __future__ import annotations

import pytest

import ggufgen
from daemon_util import fake_factory, install_fake_models, serve
from localinfer.config import Config
from localinfer.loading import engine_factory, load_engine
from localinfer.runtime.backend import LoadOptions
from localinfer.store import ModelStore

DOCUMENTS = ["the cat sat on the mat", "the dog ran in the park", "paris is the capital",
             "a hot sun", "where is the cat"]


@pytest.fixture
def reranker(home, tmp_path):
    path = tmp_path / "tiny-reranker.gguf"
    path.write_bytes(ggufgen.reranker_model())
    return ModelStore().add(path, name="tinyrank:1m")


def test_the_engine_scores_each_pair_as_llama_cpp_does(reranker):
    engine = load_engine(reranker.path, LoadOptions(n_ctx=128), name=reranker.name)
    try:
        assert engine.info.reranker and engine.info.embedding_only
        ranking = engine.rank("where is the cat", DOCUMENTS)
        alone = [engine.rank("where is the cat", [doc]).scores[0] for doc in DOCUMENTS]
        tokens = engine.backend.rank_tokens("where is the cat", "the cat")
    finally:
        engine.close()
    assert len(ranking.scores) == len(DOCUMENTS) and len(set(ranking.scores)) == len(DOCUMENTS)
    # Batched pairs score as each does alone: no pair sees another's tokens.
    assert ranking.scores == pytest.approx(alone, abs=1e-4)
    # llama-server's layout for a BERT vocabulary: [CLS] query [SEP] [SEP] document [SEP].
    assert tokens[0] == 2 and tokens.count(3) == 3 and tokens[-1] == 3


def test_v1_rerank_answers_in_llama_servers_shape(reranker):
    with serve(engine_factory(Config())) as d, d.uds() as c:
        full = c.post("/v1/rerank", json={"model": "tinyrank:1m", "query": "where is the cat",
                                          "documents": DOCUMENTS, "return_documents": True})
        top = c.post("/rerank", json={"model": "tinyrank:1m", "query": "where is the cat",
                                      "documents": DOCUMENTS, "top_n": 2})
        embed = c.post("/api/embed", json={"model": "tinyrank:1m", "input": "hi"})
        many = c.post("/v1/rerank", json={"model": "tinyrank:1m", "query": "q",
                                          "documents": ["the cat"] * 10_000})
    assert full.status_code == 200, full.text
    body = full.json()
    assert body["object"] == "list" and body["model"] == "tinyrank:1m-f32"
    assert body["usage"]["prompt_tokens"] > 0
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert all(r["document"] == DOCUMENTS[r["index"]] for r in results)
    assert top.json()["results"] == [{k: v for k, v in r.items() if k != "document"}
                                     for r in results[:2]]
    assert embed.status_code == 400 and "is a reranker" in embed.json()["error"]
    # llama-server's (and OpenAI's) error shape
    assert many.status_code == 400
    assert "at most 1000 documents" in many.json()["error"]["message"]


def test_rerank_on_a_model_that_is_no_reranker_is_refused(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory()) as d, d.uds() as c:
        reply = c.post("/v1/rerank", json={"model": "fake:1b", "query": "q",
                                           "documents": ["a", "b"]})
        texts = c.post("/v1/rerank", json={"model": "fake:1b", "query": "q", "texts": ["a"]})
    assert reply.status_code == 400
    assert "is not a reranker" in reply.json()["error"]["message"]
    assert texts.status_code == 400 and "'texts'" in texts.json()["error"]["message"]
