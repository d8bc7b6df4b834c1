"""Interrupted steps (``Backend.interrupt``), on the scripted fake backend: a step whose every
request was cancelled stops at once instead of running to its end, and a long prompt chunk of
less urgent requests yields to an urgent arrival; each request goes on where its cache is."""

from __future__ import annotations

import time

from localinfer.runtime.types import Priority, SamplingParams, Token

GREEDY = SamplingParams(temperature=0)


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_step_whose_only_request_was_cancelled_stops(fake_engine):
    # Each decode takes half a second: the client leaves while the step after its first token
    # is in flight (an editor dropping a superseded completion).
    engine = fake_engine(reply="tok " * 50, n_slots=1, step_delay_s=0.5)
    generation = engine.complete("x", SamplingParams(max_tokens=None, speculative=False))
    stream = iter(generation)
    assert isinstance(next(stream), Token)
    generation.cancel()
    done = generation.result()
    assert done.finish_reason == "cancelled" and done.usage.completion_tokens == 1
    assert engine.backend.interrupted_calls == 1
    assert engine.stats().interrupted_steps_total == 1
    # The slot is free and its cache consistent: the next request runs as a fresh one would.
    engine.backend.step_delay_s = 0.0
    follow_up = engine.complete("x", SamplingParams(max_tokens=3)).result()
    fresh = fake_engine(reply="tok " * 50, n_slots=1).complete("x", SamplingParams(
        max_tokens=3)).result()
    assert follow_up.finish_reason == "length" and follow_up.text == fresh.text


def test_a_cancelled_stream_does_not_stop_a_step_others_share(fake_engine):
    engine = fake_engine(reply="tok " * 50, n_slots=2, step_delay_s=0.05)
    params = SamplingParams(max_tokens=None, speculative=False)
    first, second = engine.complete("a", params), engine.complete("b", params)
    stream = iter(first)
    next(stream)
    wait_for(lambda: engine.stats().active == 2)
    first.cancel()
    assert first.result().finish_reason == "cancelled"
    second.cancel()
    second.result()
    # Only steps that served nobody but the cancelled could stop: the first cancel left a
    # step that still served the second.
    assert engine.backend.interrupted_calls <= 1
    assert engine.stats().interrupted_steps_total == engine.backend.interrupted_calls


def test_a_long_prompt_chunk_yields_to_an_urgent_request(fake_engine):
    # A background request's 2,000-token prompt, read in 256-token chunks of a quarter second.
    engine = fake_engine(reply=lambda p: f"reply to {p.split()[0]}", n_slots=2, n_ctx=4096,
                         prompt_delay_s=0.001)
    long_prompt = "indexing " + "word " * 1000  # 2,000 tokens: a word and a space each
    background = engine.complete(long_prompt, GREEDY, priority=Priority.BACKGROUND)
    wait_for(lambda: engine.backend.decode_calls)  # its first chunk is being read
    urgent = engine.complete("keystroke here", GREEDY, priority=Priority.INTERACTIVE)
    assert urgent.result().text == "reply to keystroke"
    assert background.done is None  # the urgent one went first
    # Its prompt was read alone, not beside the next chunk of the background one.
    assert urgent.result().timings.prefill_tokens == len(engine.completion_tokens(
        "keystroke here"))
    assert 4 <= min(engine.backend.decode_calls) <= len(engine.completion_tokens(
        "keystroke here"))
    done = background.result()
    assert done.text == "reply to indexing" and done.finish_reason == "stop"
    assert engine.backend.interrupted_calls >= 1
    # The background prompt was read once, less what the interrupted chunk had not finished:
    # every token it holds is in the cache exactly once (the fake checks positions).
    assert done.usage.prompt_tokens == len(engine.completion_tokens(long_prompt))


def test_a_less_urgent_arrival_does_not_interrupt(fake_engine):
    engine = fake_engine(reply="done", n_slots=2, n_ctx=4096, prompt_delay_s=0.001)
    first = engine.complete("chat " + "word " * 700, GREEDY, priority=Priority.INTERACTIVE)
    wait_for(lambda: engine.backend.decode_calls)
    later = engine.complete("index this", GREEDY, priority=Priority.BACKGROUND)
    assert first.result().text == "done" and later.result().text == "done"
    assert engine.backend.interrupted_calls == 0
