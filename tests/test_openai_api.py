"""The OpenAI-compatible routes (/v1), driven by the official openai client library over the
Unix socket and TCP, with the scripted fake backend."""

from __future__ import annotations

import openai
import pytest

from daemon_util import REPLY, STARTER, openai_client
from template_fixtures import QWEN3_CALL, QWEN3_REASONING

pytest_plugins = ["daemon_fixtures"]  # daemon, qwen3


@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_openai_chat_streaming_and_not(daemon, tcp):
    client = openai_client(daemon, tcp)
    messages = [{"role": "user", "content": "hi"}]
    full = client.chat.completions.create(model="fake:1b", messages=messages)
    assert full.choices[0].message.content == REPLY
    assert full.choices[0].finish_reason == "stop"
    assert full.usage.completion_tokens > 5 and full.usage.prompt_tokens > 0
    assert full.model == "fake:1b-f16"
    chunks = list(client.chat.completions.create(
        model="fake:1b", messages=messages, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == REPLY
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens
    # localinfer's extra: every content chunk carries live timings, the final one all of them
    timed = [c.model_extra["timings"] for c in chunks if c.model_extra.get("timings")]
    assert timed[-1]["decode_tps"] > 0 and "prefill_ms" in timed[-1]
    assert any("n_tokens" in t for t in timed)


def test_openai_completions_and_max_tokens(daemon):
    client = openai_client(daemon)
    out = client.completions.create(model="fake:1b", prompt="Once", max_tokens=3)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 3
    stream = client.completions.create(model="fake:1b", prompt="Once", stream=True,
                                       max_tokens=4)
    assert "".join(c.choices[0].text for c in stream) == out.choices[0].text + " "
    chat = client.chat.completions.create(model="fake:1b", messages=[
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        max_completion_tokens=2)
    assert chat.choices[0].finish_reason == "length"


def test_openai_n_choices_of_one_prompt(daemon):
    """n: several choices, each a completion of the one prompt (the others copy its cache
    once it is read); usage counts the prompt once and every choice's tokens."""
    client = openai_client(daemon)
    one = client.chat.completions.create(model="fake:1b", messages=[
        {"role": "user", "content": "hi"}])
    out = client.chat.completions.create(model="fake:1b", n=3, messages=[
        {"role": "user", "content": "hi"}])
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.message.content == REPLY and c.finish_reason == "stop" for c in out.choices)
    assert out.usage.prompt_tokens == one.usage.prompt_tokens
    assert out.usage.completion_tokens == 3 * one.usage.completion_tokens
    text = client.completions.create(model="fake:1b", prompt="Once", max_tokens=3, n=2)
    assert [c.index for c in text.choices] == [0, 1] and text.usage.completion_tokens == 6


def test_openai_n_choices_streamed(daemon):
    """n with stream: the choices' chunks interleave, each with its index, each choice has
    its role chunk and its finish_reason, and the usage chunk comes after them all, counting
    the prompt once and every choice's tokens."""
    client = openai_client(daemon)
    messages = [{"role": "user", "content": "hi"}]
    one = client.chat.completions.create(model="fake:1b", messages=messages)
    chunks = list(client.chat.completions.create(
        model="fake:1b", n=3, stream=True, messages=messages,
        stream_options={"include_usage": True}))
    choices = [c.choices[0] for c in chunks if c.choices]
    for index in range(3):
        mine = [c for c in choices if c.index == index]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == REPLY
        assert [c.finish_reason for c in mine if c.finish_reason] == ["stop"]
    assert {c.index for c in choices} == {0, 1, 2}
    assert not chunks[-1].choices and all(c.choices for c in chunks[:-1])
    assert chunks[-1].usage.prompt_tokens == one.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == 3 * one.usage.completion_tokens
    whole = client.completions.create(model="fake:1b", prompt="Once", max_tokens=3)
    texts, offsets = ["", ""], [[], []]
    for chunk in client.completions.create(model="fake:1b", prompt="Once", max_tokens=3, n=2,
                                           stream=True, logprobs=1):
        choice = chunk.choices[0]
        texts[choice.index] += choice.text
        offsets[choice.index] += choice.logprobs.text_offset if choice.logprobs else []
    assert texts == [whole.choices[0].text] * 2
    assert offsets[0] == offsets[1] and offsets[0][0] == 0  # each choice's own text
    with pytest.raises(openai.BadRequestError, match="'n_predict': 0"):
        client.completions.create(model="fake:1b", prompt="Once", n=2,
                                  extra_body={"n_predict": 0})


def test_openai_n_choices_of_a_thinking_model(qwen3):
    """Each choice's reply is split into reasoning and answer on its own, whole and streamed
    (the choices once shared one splitter: the second choice's reasoning came as its
    content)."""
    client = openai_client(qwen3)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    out = client.chat.completions.create(model="qwen3:1b", n=2, messages=messages)
    assert [(c.message.model_extra["reasoning_content"], c.message.content)
            for c in out.choices] == [(QWEN3_REASONING, QWEN3_CALL)] * 2
    reasoning, content = ["", ""], ["", ""]
    for chunk in client.chat.completions.create(model="qwen3:1b", n=2, stream=True,
                                                messages=messages):
        choice = chunk.choices[0]
        reasoning[choice.index] += (choice.delta.model_extra or {}).get("reasoning_content", "")
        content[choice.index] += choice.delta.content or ""
    assert (reasoning, content) == ([QWEN3_REASONING] * 2, [QWEN3_CALL] * 2)


def test_openai_models_and_stop(daemon):
    client = openai_client(daemon)
    ids = {m.id for m in client.models.list()}
    assert ids == {"fake:1b-f16", "other:2b-f16", STARTER}  # the starter: before first use
    out = client.chat.completions.create(model="fake:1b", messages=[
        {"role": "user", "content": "hi"}], stop=["model"], seed=1, temperature=0.2, top_p=0.9)
    assert out.choices[0].message.content == "Hello from the fake "


def test_openai_errors_have_openai_shape(daemon):
    client = openai_client(daemon)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope:1b", messages=[{"role": "user",
                                                                   "content": "x"}])
    assert info.value.body["code"] == "model_not_found"
    assert "nope:1b" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="'n' must be at most 4"):
        client.chat.completions.create(model="fake:1b", n=5, messages=[
            {"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="must not be empty"):
        client.chat.completions.create(model="fake:1b", messages=[])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake:1b", messages=[
            {"role": "user", "content": "word " * 3000}])
    assert info.value.body["code"] == "context_length_exceeded"
    assert "2048 tokens" in info.value.body["message"]
