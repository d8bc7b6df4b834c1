"""The chat's thinking split on the real starter model: a copy of the starter whose header
carries a Qwen3-style thinking template (``template_fixtures.QWEN3_TOOLS``: Qwen 2.5's
template with Qwen3's ``enable_thinking`` switch; the model opens ``<think>`` itself), read
from the file as any thinking model's is. The starter is a base model and never writes
``<think>`` on its own: a grammar makes it write a reasoning block and then an answer, so the
split runs on the real tokenizer's pieces (tags cut across tokens), through the session and
in the chat UI."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from localinfer import gguf
from localinfer.loading import load_engine
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.grammar import Grammar
from localinfer.runtime.thinking import split_reply, thinking_format
from localinfer.runtime.types import Message, SamplingParams, Token
from localinfer.session import EngineSession, Thought
from localinfer.tui.app import create_app
from localinfer.tui.widgets import AssistantMessage, ThoughtBlock
from template_fixtures import QWEN3_TOOLS
from tui_util import laptop, ready, until

pytestmark = pytest.mark.model

TEMPLATE_KEY = "tokenizer.chat_template"
THINK_THEN_ANSWER = Grammar(gbnf='root ::= "<think>\\n" [a-zA-Z ,.]{8,60} "\\n</think>\\n\\n"'
                                 ' [a-zA-Z ,.]{4,60}')
MESSAGES = [Message("user", "What is the capital of France?")]


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def with_template(source: Path, target: Path, template: str) -> Path:
    """A copy of the GGUF ``source`` whose ``tokenizer.chat_template`` is ``template`` (the
    starter has none: the key is added after the preamble, and the key count raised): the
    header is rewritten (then the tensor table, padded to the alignment) and the tensor data
    copied as it is (tensor offsets are relative to it)."""
    header = gguf.read_header(source)
    with open(source, "rb") as f:
        head = f.read(header.data_offset)
        first = header.tensors[0]
        infos_at = head.rindex(_string(first.name), 0, header.data_offset)
        infos_size = sum(8 + len(t.name.encode()) + 4 + 8 * len(t.shape) + 4 + 8
                         for t in header.tensors)
        head = head[:infos_at + infos_size]
        key = _string(TEMPLATE_KEY) + struct.pack("<I", 8)  # 8: a string value
        if key in head:
            at = head.index(key) + len(key)
            (old_len,) = struct.unpack_from("<Q", head, at)
            new_head = head[:at] + _string(template) + head[at + 8 + old_len:]
        else:  # magic, version, tensor count, key count (u64 at byte 16), then the keys
            (n_kv,) = struct.unpack_from("<Q", head, 16)
            new_head = (head[:16] + struct.pack("<Q", n_kv + 1) + key + _string(template)
                        + head[24:])
        pad = -len(new_head) % header.alignment
        with open(target, "wb") as out:
            out.write(new_head + b"\0" * pad)
            f.seek(header.data_offset)
            while chunk := f.read(1 << 24):
                out.write(chunk)
    return target


@pytest.fixture(scope="module")
def thinking_starter(starter_path, tmp_path_factory):
    path = with_template(starter_path, tmp_path_factory.mktemp("thinking") / "starter.gguf",
                         QWEN3_TOOLS)
    assert gguf.read_header(path).chat_template == QWEN3_TOOLS
    engine = load_engine(path, LoadOptions(n_ctx=2048, n_slots=2), name="thinking-starter")
    yield engine
    engine.close()


def test_the_session_splits_a_real_models_reasoning(thinking_starter):
    engine = thinking_starter
    fmt = thinking_format(engine.chat_template_source)
    assert fmt is not None and fmt.switch == "enable_thinking"  # read from the file
    # Without speculation: whether a step verifies a draft depends on the step times it has
    # measured, and a draft's rows round apart from single rows at a near tie (the two
    # replies parted after 13 tokens in 4 of 10 runs with it, in none of 20 without).
    params = SamplingParams(temperature=0.0, max_tokens=80, grammar=THINK_THEN_ANSWER,
                            speculative=False)
    raw = engine.chat(MESSAGES, params).result().text  # the same greedy reply, unsplit
    assert raw.startswith("<think>") and "</think>" in raw
    generation = EngineSession(engine).chat(MESSAGES, params)
    events = list(generation)
    thought = "".join(e.text for e in events if isinstance(e, Thought))
    answer = "".join(e.text for e in events if isinstance(e, Token))
    assert (thought, answer) == split_reply(fmt, raw)
    assert thought and answer and events[-1].text == answer
    assert "<think>" not in thought + answer and "</think>" not in thought + answer
    assert generation.thought is not None and generation.thought.tokens >= 3
    # Thinking off: the template closes the block in the prompt, and the whole reply is the
    # answer.
    plain = SamplingParams(temperature=0.0, max_tokens=12)
    events = list(EngineSession(engine).chat(MESSAGES, plain, think=False))
    assert not any(isinstance(e, Thought) for e in events) and events[-1].text
    assert engine.render_chat(MESSAGES, template_vars={"enable_thinking": False}).endswith(
        "<think>\n\n</think>\n\n")


def test_the_chat_folds_a_real_models_reasoning(thinking_starter, home, monkeypatch):
    engine = thinking_starter
    # The chat's sampling, with the grammar that makes the base model think first.
    monkeypatch.setattr("localinfer.chats.Chat.params", lambda self, defaults=None:
                        SamplingParams(temperature=0.0, max_tokens=80,
                                       grammar=THINK_THEN_ANSWER))

    class Shared(EngineSession):
        def close(self) -> None:  # the module's engine outlives the app
            pass

    def open_engine(ref, config, *, on_copy=None, on_load=None):
        return engine

    async def main():
        app = create_app("thinking-starter", no_daemon=True, open_engine=open_engine,
                         hardware=laptop())
        monkeypatch.setattr("localinfer.session.EngineSession.close", Shared.close)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            app.query_one("#input").insert("What is the capital of France?")
            await pilot.press("enter")
            await until(pilot, lambda: app.reply is None and len(app.chat.messages) == 2,
                        "the reply", timeout_s=120)
            reply = app.chat.messages[-1]
            assert reply.thinking and reply.content and "<think>" not in reply.content
            widget = app.query(AssistantMessage).last()
            await until(pilot, lambda: not widget.streaming, "the reply settles")
            block = widget.query_one(ThoughtBlock)
            assert widget.markdown.source == reply.content and block.display
            assert block.collapsed and block.title.startswith("Thought for")

    asyncio.run(main())
