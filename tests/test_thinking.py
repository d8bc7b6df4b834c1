"""Thinking models: the template's switch, the streaming split of reasoning from answer, and
both APIs' shapes for it (Ollama's ``thinking``, OpenAI-style ``reasoning_content``) on the
fake backend with a Qwen3-style template."""

from __future__ import annotations

import dataclasses
import json

import ollama
import openai
import pytest

from daemon_util import fake_factory, install_fake_models, ollama_client, openai_client, serve
from localinfer.errors import InvalidRequest
from localinfer.runtime.chat_template import BUILTIN_TEMPLATES
from localinfer.runtime.thinking import (
    HARMONY_TO_FINAL,
    BudgetWatch,
    ThinkingSplitter,
    _whole_utf8,
    split_reply,
    starts_thinking,
    template_vars,
    thinking_format,
)
from localinfer.runtime.types import ReasoningBudget
from template_fixtures import QWEN3_STYLE, R1_STYLE

QWEN = thinking_format(QWEN3_STYLE)
REASONING_REPLY = "<think>\nTwo and two.\n</think>\n\nFour."


def test_formats_from_templates():
    assert QWEN is not None and QWEN.switch == "enable_thinking" and not QWEN.takes_effort
    r1 = thinking_format(R1_STYLE)
    assert r1 is not None and r1.switch is None
    assert thinking_format(BUILTIN_TEMPLATES["gemma"]) is None
    assert thinking_format(None) is None
    harmony = thinking_format("<|channel|>analysis {{ reasoning_effort }}")
    assert harmony is not None and harmony.takes_effort


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 100])
def test_split_is_the_same_however_the_text_is_cut(size):
    splitter = ThinkingSplitter(QWEN)
    parts = [splitter.push(REASONING_REPLY[i:i + size])
             for i in range(0, len(REASONING_REPLY), size)] + [splitter.flush()]
    assert "".join(t for t, _ in parts) == "Two and two."
    assert "".join(c for _, c in parts) == "Four."


def test_split_edge_cases():
    assert split_reply(QWEN, "No reasoning; <think> is a word here.") == (
        "", "No reasoning; <think> is a word here.")
    assert split_reply(QWEN, "Already thinking</think>Answer", thinking=True) == (
        "Already thinking", "Answer")
    assert split_reply(QWEN, "<think>cut off by max_tokens") == ("cut off by max_tokens", "")
    assert split_reply(QWEN, "<thi") == ("", "<thi")  # not a tag after all
    assert starts_thinking(thinking_format(R1_STYLE), "<｜Assistant｜><think>\n")


def test_template_vars_follow_ollama():
    assert template_vars(QWEN, None, model="q") == {}
    assert template_vars(QWEN, False, model="q") == {"enable_thinking": False}
    assert template_vars(None, False, model="g") == {}  # off on a model that cannot think
    with pytest.raises(InvalidRequest, match='"g" does not support thinking'):
        template_vars(None, True, model="g")
    assert template_vars(QWEN, "high", model="q") == {"enable_thinking": True}
    harmony = thinking_format("<|channel|> {{ reasoning_effort }}")
    assert template_vars(harmony, "low", model="o") == {"reasoning_effort": "low"}
    with pytest.raises(InvalidRequest, match="'think' must be"):
        template_vars(harmony, "extreme", model="o")
    with pytest.raises(InvalidRequest, match="always thinks"):
        template_vars(thinking_format(R1_STYLE), False, model="r1")


@pytest.fixture
def qwen(home):
    install_fake_models("qwen:1b-f16", "plain:1b-f16")

    def factory(model, num_ctx, progress=None):
        template = QWEN3_STYLE if model.name.startswith("qwen") else None

        def reply(prompt):  # thinking switched off in the prompt: the answer alone
            return "Four." if prompt.endswith("</think>\n\n") else REASONING_REPLY

        return fake_factory(reply=reply, chat_template=template)(model, num_ctx, progress)

    with serve(factory) as d:
        yield d


def test_ollama_chat_splits_thinking_streaming_and_not(qwen):
    client = ollama_client(qwen)
    messages = [{"role": "user", "content": "2+2?"}]
    whole = client.chat(model="qwen:1b", messages=messages)
    assert (whole.message.thinking, whole.message.content) == ("Two and two.", "Four.")
    parts = list(client.chat(model="qwen:1b", messages=messages, stream=True, think=True))
    assert "".join(p.message.thinking or "" for p in parts) == "Two and two."
    assert "".join(p.message.content for p in parts) == "Four."
    off = client.chat(model="qwen:1b", messages=messages, think=False)
    assert (off.message.thinking, off.message.content) == (None, "Four.")
    generated = client.generate(model="qwen:1b", prompt="2+2?")
    assert (generated.thinking, generated.response) == ("Two and two.", "Four.")


def test_thinking_asked_of_a_model_that_cannot_think_is_400(qwen):
    client = ollama_client(qwen)
    with pytest.raises(ollama.ResponseError, match="does not support thinking") as info:
        client.chat(model="plain:1b", messages=[{"role": "user", "content": "x"}], think=True)
    assert info.value.status_code == 400
    # think: false is what such a model does anyway (Ollama accepts it too)
    assert client.chat(model="plain:1b", messages=[{"role": "user", "content": "x"}],
                       think=False).message.content
    with qwen.uds() as c:
        r = c.post("/api/chat", json={"model": "qwen:1b", "think": "highest",
                                      "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and "'think' must be" in r.json()["error"]
        r = c.post("/api/generate", json={"model": "qwen:1b", "prompt": "x", "raw": True,
                                          "think": True})
        assert r.status_code == 400 and "'think'" in r.json()["error"]


def test_openai_reasoning_content_and_effort(qwen):
    client = openai_client(qwen)
    messages = [{"role": "user", "content": "2+2?"}]
    whole = client.chat.completions.create(model="qwen:1b", messages=messages)
    message = whole.choices[0].message
    assert message.content == "Four." and message.model_extra["reasoning_content"] == (
        "Two and two.")
    chunks = list(client.chat.completions.create(model="qwen:1b", messages=messages,
                                                 stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content", "") for d in deltas) == (
        "Two and two.")
    assert "".join(d.content or "" for d in deltas) == "Four."
    off = client.chat.completions.create(model="qwen:1b", messages=messages,
                                         reasoning_effort="none")
    assert off.choices[0].message.content == "Four."
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})
    kwargs = client.chat.completions.create(
        model="qwen:1b", messages=messages,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert kwargs.choices[0].message.content == "Four."
    with pytest.raises(openai.BadRequestError, match="does not support thinking"):
        client.chat.completions.create(model="plain:1b", messages=messages,
                                       reasoning_effort="high")
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        client.chat.completions.create(model="qwen:1b", messages=messages,
                                       reasoning_effort="extreme")


def test_show_reports_thinking(qwen):
    with qwen.uds() as c:
        # The fake models' GGUF files carry no template: once loaded, the engine's counts.
        assert c.post("/api/chat", json={"model": "qwen:1b", "messages": []}).status_code == 200
        shown = c.post("/api/show", json={"model": "qwen:1b"}).json()
        assert shown["capabilities"] == ["completion", "thinking"]
        assert shown["template"] == QWEN3_STYLE
        assert shown["parameters"].splitlines() == [
            f"{'num_ctx':<30} 2048", f"{'stop':<30} \"<|im_end|>\""]
        assert c.post("/api/show", json={"model": "plain:1b"}).json()["capabilities"] == [
            "completion"]


def test_zed_and_open_webui_shaped_requests(qwen):
    """Zed's Ollama provider sends keep_alive, options.num_ctx and think; Open WebUI sends
    options with its sampling settings and keep_alive as a duration."""
    zed = {"model": "qwen:1b", "stream": True, "keep_alive": "5m", "think": True,
           "options": {"num_ctx": 1024, "stop": ["<|im_end|>"], "temperature": 0.7},
           "messages": [{"role": "system", "content": "You are Zed."},
                        {"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "Four.", "thinking": "Easy."},
                        {"role": "user", "content": "Again?"}]}
    webui = {"model": "qwen:1b", "stream": False, "keep_alive": -1,
             "options": {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "num_predict": 64,
                         "repeat_penalty": 1.1, "seed": 7, "mirostat": 0, "num_thread": 4},
             "messages": [{"role": "user", "content": "2+2?"}]}
    with qwen.uds() as c:
        with c.stream("POST", "/api/chat", json=zed) as r:
            assert r.status_code == 200
            lines = [json.loads(line) for line in r.iter_lines() if line]
        assert "".join(x["message"].get("thinking", "") for x in lines) == "Two and two."
        assert lines[-1]["done"] is True
        r = c.post("/api/chat", json=webui)
        assert r.status_code == 200, r.text
        assert r.json()["message"] == {"role": "assistant", "content": "Four.",
                                       "thinking": "Two and two."}


def test_show_shows_model_info_as_ollama_does(qwen):
    with qwen.uds() as c:
        shown = c.post("/api/show", json={"model": "plain:1b"}).json()
        assert shown["model_info"]["tokenizer.ggml.tokens"] is None
        assert shown["model_info"]["general.architecture"]
        assert "num_ctx" not in shown["parameters"]  # not loaded: the plan decides at load
        r = c.post("/api/show", json={"model": "plain:1b", "verbose": True})
        assert r.status_code == 400 and "'verbose'" in r.json()["error"]


def _watch(tokens: list[bytes], budget: ReasoningBudget) -> list[bool]:
    watch = BudgetWatch(budget)
    return [watch.push(piece) for piece in tokens]


def test_the_budget_counts_the_reasoning_tokens():
    think = ReasoningBudget(3, "<think>", "\n</think>\n\n", "</think>")
    # The opening tag (even in pieces, after whitespace) starts the count; 3 tokens spend it.
    assert _watch([b"\n", b"<th", b"ink>", b"a", b"b", b"c", b"d"], think) == \
        [False, False, False, False, False, True, False]
    # A reply that closes the block itself within the budget is left alone.
    assert not any(_watch([b"<think>", b"a", b"</think>", b"x", b"y", b"z"], think))
    # A reply that does not open with the tag does not reason: nothing to count.
    assert not any(_watch([b"Hello", b"<think>", b"a", b"b", b"c", b"d"], think))
    # The prompt opened the block: the count starts at once.
    opened = dataclasses.replace(think, opened=True)
    assert _watch([b"a", b"b", b"c"], opened) == [False, False, True]


def test_the_budget_ends_at_a_whole_character():
    """Spent inside a UTF-8 character (its bytes split over tokens), the close waits for
    the character's end, as llama.cpp's budget does."""
    budget = ReasoningBudget(2, "<think>", "</think>", "</think>", opened=True)
    euro = "\u20ac".encode()  # three bytes
    assert _watch([b"a", euro[:1], euro[1:2], euro[2:], b"b"], budget) == \
        [False, False, False, True, False]
    assert _whole_utf8(b"") and _whole_utf8(b"ab" + euro) and not _whole_utf8(euro[:2])


def test_harmony_closes_into_the_final_channel():
    """gpt-oss's budget ends the analysis message and opens the final one (where the answer
    goes); its own <|end|> ends the count."""
    from localinfer.daemon.reasoning_fields import Thinking
    from localinfer.runtime.thinking import HarmonySplitter

    thinking = Thinking(True, budget=1024)
    assert thinking.reasoning_budget() is None  # no prompt rendered yet
    thinking.splitter = HarmonySplitter()
    budget = thinking.reasoning_budget()
    assert budget is not None and budget.tokens == 1024
    assert budget.close == HARMONY_TO_FINAL and budget.close_tag == "<|end|>"
    splitter = HarmonySplitter()
    splitter.push("<|channel|>analysis<|message|>so" + HARMONY_TO_FINAL + "4")
    splitter.flush()
    assert (splitter.thinking, splitter.content) == ("so", "4")
