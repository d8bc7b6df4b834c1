"""The OpenAI-compatible routes (/v1), driven by the official openai client library over the
Unix socket and TCP, with the scripted fake backend."""

from __future__ import annotations

import openai
import pytest

from daemon_util import REPLY, STARTER, openai_client

pytest_plugins = ["daemon_fixtures"]  # daemon


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
    with pytest.raises(openai.BadRequestError, match="'n' above 1 is answered whole"):
        client.chat.completions.create(model="fake:1b", n=2, stream=True, messages=[
            {"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="must not be empty"):
        client.chat.completions.create(model="fake:1b", messages=[])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake:1b", messages=[
            {"role": "user", "content": "word " * 3000}])
    assert info.value.body["code"] == "context_length_exceeded"
    assert "2048 tokens" in info.value.body["message"]
