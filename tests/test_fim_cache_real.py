"""Autocomplete's checkpoints on the real starter (Gemma 3: a 512-token sliding window whose cache
cannot be cut back far): keystrokes in the middle of a long prompt reuse its start, and the
reply is a cold read's."""

from __future__ import annotations

import threading

import pytest

from localinfer.bench.editor_workload import source_file
from localinfer.bench.engine_bench import first_divergence
from localinfer.runtime.fim import FimTokens
from localinfer.runtime.types import SamplingParams

pytestmark = pytest.mark.model


def test_keystrokes_mid_prompt_reuse_the_prefix_through_a_checkpoint(real_engine):
    text = source_file(7, 150)
    middle = text.find("\n", len(text) // 2) + 1
    prefix = real_engine.backend.tokenize(text[:middle], add_special=True)
    suffix = real_engine.tokenize(text[middle:])
    assert len(suffix) > 512  # past the window: the cut needs the checkpoint
    params = SamplingParams(temperature=0, max_tokens=12, speculative=False,
                            supersede="editor")
    real_engine.clear_cache()
    runs = []
    for typed in ("    r", "    re", "    res"):
        runs.append(real_engine.submit(prefix + real_engine.tokenize(typed) + suffix, params))
        runs[-1].result()
    cached = [r.done.usage.cached_tokens for r in runs if r.done is not None]
    # The second parts from the first at the typed text, cannot cut there, and takes a
    # checkpoint; the third restores it.
    assert cached[:2] == [0, 0] and cached[2] >= len(prefix)
    real_engine.clear_cache()
    cold = real_engine.submit(runs[-1].request.prompt, SamplingParams(
        temperature=0, max_tokens=12, speculative=False))
    cold.result()
    divergence = first_divergence(real_engine, cold, runs[-1])
    assert divergence is None or divergence.near_tie, divergence


def test_a_superseded_read_past_the_cursor_stops_and_the_next_reads_as_cold(real_engine,
                                                                           monkeypatch):
    """The next keystroke stops a step reading only what follows the previous one's cursor:
    llama.cpp aborts it, and the next keystroke restores the checkpoint there and replies as
    a cold read does."""
    text = source_file(7, 150)
    middle = text.find("\n", len(text) // 2) + 1
    prefix = real_engine.backend.tokenize(text[:middle], add_special=True)
    suffix = real_engine.tokenize(text[middle:])[:300]  # a keystroke's ~300 tokens
    params = SamplingParams(temperature=0, max_tokens=8, speculative=False, supersede="editor")

    def keystroke(typed: str):
        tokens = FimTokens(prefix + real_engine.tokenize(typed) + suffix)
        tokens.cursor = len(prefix)
        return real_engine.submit(tokens, params)

    real_engine.clear_cache()
    keystroke("    r").result()  # read cold, with a checkpoint where the typed text begins
    backend, decode = real_engine.backend, real_engine.backend.decode
    reading, go = threading.Event(), threading.Event()
    starts = []

    def held(tokens, positions, seq_ids, outputs):  # the next read waits for the next key
        if len(tokens) > 100 and not go.is_set():
            starts.append(positions[0])
            reading.set()
            go.wait(60)
        return decode(tokens, positions, seq_ids, outputs)

    monkeypatch.setattr(backend, "decode", held)
    before = real_engine.stats().interrupted_steps_total
    second = keystroke("    re")
    assert reading.wait(60)
    third = keystroke("    res")
    go.set()
    assert second.result().finish_reason == "cancelled"
    done = third.result()
    assert starts and starts[0] >= len(prefix)  # the second's read was all past its cursor
    assert real_engine.stats().interrupted_steps_total == before + 1
    assert done.usage.cached_tokens >= len(prefix)
    monkeypatch.undo()
    real_engine.clear_cache()
    cold = real_engine.submit(third.request.prompt, SamplingParams(
        temperature=0, max_tokens=8, speculative=False))
    cold.result()
    divergence = first_divergence(real_engine, cold, third)
    assert divergence is None or divergence.near_tie, divergence
