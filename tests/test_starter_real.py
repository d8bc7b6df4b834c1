"""The starter model as a user first meets it: a base model that continues text, and prints no
control or placeholder token (Gemma 3's vocabulary makes <start_of_image> a printable token)."""

from __future__ import annotations

import pytest

from localinfer.runtime.types import SamplingParams

pytestmark = pytest.mark.model

README_PROMPT = "Write a haiku about the sea"  # an instruction to a base model, as the README shows


@pytest.fixture
def sampled(real_engine, monkeypatch) -> list[int]:
    """Every token the engine samples during the test."""
    backend = real_engine.backend
    tokens: list[int] = []
    sample = backend.sample

    def recording(sampler, index):
        token = sample(sampler, index)
        tokens.append(token)
        return token

    monkeypatch.setattr(backend, "sample", recording)
    return tokens


def test_the_starter_is_labelled_a_base_model(real_engine):
    assert real_engine.info.base_model


def test_the_never_sampled_tokens_are_the_placeholders_and_control_tokens(real_engine):
    backend = real_engine.backend
    banned = set(backend.never_sampled.tolist())
    named = {backend.token_bytes(t) for t in banned} - {b""}
    # USER_DEFINED in Gemma 3's vocabulary, so printed as text: the ones the issue saw.
    assert named == {b"<start_of_image>", b"<end_of_image>", b"[multimodal]"}
    by_text = {backend.tokenize(text, add_special=False)[0]
               for text in ("<unused0>", "<bos>", "<pad>", "<start_of_turn>")}
    assert by_text <= banned
    ends = {backend.tokenize(text, add_special=False)[0] for text in ("<eos>", "<end_of_turn>")}
    assert not ends & banned and all(backend.is_eog(t) for t in ends)
    # HTML and whitespace tokens are user-defined too, and ordinary text.
    assert not {backend.tokenize(text, add_special=False)[0] for text in ("<img>", "<table>")
                } & banned


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=64),
    SamplingParams(temperature=0, max_tokens=64, repeat_penalty=1.1),  # greedy in a chain
    *(SamplingParams(temperature=0.7, seed=seed, max_tokens=64) for seed in (1, 2, 3)),
], ids=["greedy", "greedy-penalized", "seed1", "seed2", "seed3"])
def test_the_readme_prompt_prints_no_placeholder(real_engine, sampled, params):
    done = real_engine.complete(README_PROMPT, params).result()
    assert "<start_of_image>" not in done.text and "<end_of_image>" not in done.text
    assert done.usage.completion_tokens == len(sampled) > 0
    assert not set(sampled) & set(real_engine.backend.never_sampled.tolist())
    assert done.text.strip()


def test_a_prompt_that_holds_a_placeholder_is_still_read(real_engine, sampled):
    # The ban is on output only: the tokens still mean what they mean in a prompt.
    done = real_engine.complete("<start_of_image> A photo of the sea",
                                SamplingParams(temperature=0, max_tokens=16)).result()
    assert done.usage.prompt_tokens >= 6 and "<start_of_image>" not in done.text
    assert not set(sampled) & set(real_engine.backend.never_sampled.tolist())
