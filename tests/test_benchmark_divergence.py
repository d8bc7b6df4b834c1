"""benchmark.first_divergence on the fake backend: where two greedy runs part, and the check
that they parted only at a near tie (its real-model use is in test_engine_real)."""

from __future__ import annotations

import math

import pytest

from localinfer.bench.engine_bench import NEAR_TIE_LOGITS, first_divergence
from localinfer.runtime.types import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=20)


def _replies(*texts: str):
    """A fake model that gives each request the next of ``texts``."""
    script = iter(texts)
    return lambda prompt: next(script)


def _run(engine, prompt="Tell me", params=GREEDY):
    generation = engine.complete(prompt, params)
    generation.result()
    return generation


def test_identical_runs_have_no_divergence(fake_engine):
    engine = fake_engine(reply="one two three")
    assert first_divergence(engine, _run(engine), _run(engine)) is None


def test_runs_part_at_their_first_different_token(fake_engine):
    engine = fake_engine(reply=_replies("one two three", "one two four"))
    reference, other = _run(engine), _run(engine)
    divergence = first_divergence(engine, reference, other)
    # Tokens: "one", " ", "two", " ", then "three" against "four". The fake scores every
    # token alike, so it is a tie.
    assert divergence.index == 4
    assert divergence.margin == 0.0 and divergence.near_tie
    # It read the prompt and the 4 shared tokens on sequence 0, and left it empty.
    assert engine.backend.decode_calls[-1] == len(reference.request.prompt) + 4
    assert engine.backend._seqs[0] == []


def test_a_clear_preference_is_not_a_near_tie(fake_engine, monkeypatch):
    engine = fake_engine(reply=_replies("one two three", "one two four"))
    reference, other = _run(engine), _run(engine)
    three, four = reference.request.generated[4], other.request.generated[4]
    scores = [0.0] * 1000
    scores[three], scores[four] = 9.0, 9.0 - NEAR_TIE_LOGITS
    monkeypatch.setattr(engine.backend, "logits", lambda index: scores)
    divergence = first_divergence(engine, reference, other)
    assert divergence.margin == NEAR_TIE_LOGITS and not divergence.near_tie
    scores[99] = 9.25  # a third token scored best: both are measured against it
    assert first_divergence(engine, reference, other).margin == 0.25 + NEAR_TIE_LOGITS


def test_a_run_that_stopped_early_did_not_part_at_a_tie(fake_engine):
    engine = fake_engine(reply="one two three")
    reference = _run(engine)
    other = _run(engine, params=SamplingParams(temperature=0, max_tokens=3))
    divergence = first_divergence(engine, reference, other)
    assert divergence.index == 3 and divergence.margin == math.inf and not divergence.near_tie


def test_runs_of_different_prompts_are_refused(fake_engine):
    engine = fake_engine()
    with pytest.raises(ValueError, match="one prompt"):
        first_divergence(engine, _run(engine, "Tell me"), _run(engine, "Ask me"))
