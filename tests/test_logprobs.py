"""Log-probabilities: the log-softmax and top-n picking, the engine's bookkeeping (computed
only when asked), and each API's shape on the fake backend."""

from __future__ import annotations

import math

import numpy as np
import pytest

from daemon_util import REPLY, ollama_client, openai_client
from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend
from localinfer.runtime.logprobs import Distribution
from localinfer.runtime.types import Message, SamplingParams

pytest_plugins = ["daemon_fixtures"]


def test_distribution_and_top():
    row = np.array([1000.0, 1000.0 + math.log(3), -5.0], dtype=np.float32)
    distribution = Distribution(row, 2)
    entry = distribution.entry(0, float(row[0]), lambda t: f"t{t}".encode())
    assert entry.text == "t0" and entry.data == b"t0"
    assert entry.logprob == pytest.approx(math.log(0.25), abs=1e-4)  # float32 logits
    assert [t.text for t in entry.top] == ["t1", "t0"]
    assert entry.top[0].logprob == pytest.approx(math.log(0.75), abs=1e-4)
    assert sum(math.exp(t.logprob) for t in entry.top) == pytest.approx(1.0, abs=1e-4)
    half = Distribution(row, 0).entry(2, float(row[2]), lambda t: b"\xe2")
    assert half.text == "\ufffd" and half.top == ()  # half a character


class CountingBackend(FakeBackend):
    raw_logits_calls = 0

    def raw_logits(self, index):
        CountingBackend.raw_logits_calls += 1
        return super().raw_logits(index)


def test_engine_reports_logprobs_only_when_asked():
    engine = Engine(CountingBackend(reply="one two three"))
    try:
        plain = engine.chat([Message("user", "hi")], SamplingParams(temperature=0)).result()
        assert plain.logprobs == () and CountingBackend.raw_logits_calls == 0
        asked = engine.chat([Message("user", "hi")],
                            SamplingParams(temperature=0, logprobs=3))
        events = list(asked)
        done = events[-1]
        # One entry per generated token but the end of turn, in the order of the text.
        assert len(done.logprobs) == done.usage.completion_tokens - 1
        assert "".join(e.text for e in done.logprobs) == done.text == "one two three"
        streamed = [e for ev in events[:-1] for e in ev.logprobs]
        assert streamed == list(done.logprobs)
        assert all(len(e.top) == 3 and e.logprob <= 0 for e in done.logprobs)
    finally:
        engine.close()


def test_openai_chat_logprobs(daemon):
    client = openai_client(daemon)
    reply = client.chat.completions.create(
        model="fake:1b", messages=[{"role": "user", "content": "hi"}], logprobs=True,
        top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert "".join(t.token for t in content) == REPLY
    assert all(len(t.top_logprobs) == 2 and t.bytes == list(t.token.encode())
               for t in content)
    chunks = list(client.chat.completions.create(
        model="fake:1b", messages=[{"role": "user", "content": "hi"}], logprobs=True,
        stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert "".join(t.token for t in streamed) == REPLY
    assert all(t.top_logprobs == [] for t in streamed)
    plain = client.chat.completions.create(model="fake:1b",
                                           messages=[{"role": "user", "content": "hi"}])
    assert plain.choices[0].logprobs is None


def test_openai_completions_legacy_logprobs(daemon):
    client = openai_client(daemon)
    reply = client.completions.create(model="fake:1b", prompt="hi", logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert "".join(logprobs.tokens) == REPLY
    assert len(logprobs.token_logprobs) == len(logprobs.tokens)
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset[1] == len(logprobs.tokens[0])
    text, offsets = "", []
    for chunk in client.completions.create(model="fake:1b", prompt="hi", logprobs=0,
                                           stream=True):
        if chunk.choices[0].logprobs:
            offsets += chunk.choices[0].logprobs.text_offset
        text += chunk.choices[0].text
    assert text == REPLY and offsets == logprobs.text_offset


def test_ollama_logprobs(daemon):
    client = ollama_client(daemon)
    reply = client.chat(model="fake:1b", messages=[{"role": "user", "content": "hi"}],
                        logprobs=True, top_logprobs=3)
    assert "".join(e.token for e in reply.logprobs) == REPLY
    assert all(len(e.top_logprobs) == 3 for e in reply.logprobs)
    parts = list(client.generate(model="fake:1b", prompt="hi", logprobs=True, stream=True))
    assert "".join(e.token for p in parts for e in (p.logprobs or [])) == REPLY
    assert client.generate(model="fake:1b", prompt="hi").logprobs is None
    with daemon.uds() as c:
        r = c.post("/api/chat", json={"model": "fake:1b", "top_logprobs": 2,
                                      "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "needs 'logprobs': true" in r.json()["error"]
        r = c.post("/api/chat", json={"model": "fake:1b", "logprobs": True,
                                      "top_logprobs": 21,
                                      "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "top_logprobs" in r.json()["error"]


def test_logprobs_follow_speculative_drafts():
    """Drafted tokens that the model accepts are sampled from rows of one batch: each still
    gets its own entry, in order."""
    text = "alpha beta gamma delta epsilon zeta eta theta"
    engine = Engine(FakeBackend(reply=text + " " + text))
    try:
        done = engine.chat([Message("user", text + " " + text)],
                           SamplingParams(temperature=0, logprobs=1, speculative=True)).result()
        assert done.timings.accepted_tokens > 0
        assert "".join(e.text for e in done.logprobs) == done.text == text + " " + text
        assert all(len(e.top) == 1 for e in done.logprobs)
    finally:
        engine.close()
