"""Autocomplete's checkpoints on the real starter (Gemma 3: a 512-token sliding window whose cache
cannot be cut back far): keystrokes in the middle of a long prompt reuse its start, and the
reply is a cold read's."""

from __future__ import annotations

import pytest

from localinfer.bench.editor_workload import source_file
from localinfer.bench.engine_bench import first_divergence
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
