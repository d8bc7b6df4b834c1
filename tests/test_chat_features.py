"""The chat's features for instruct and thinking models, on the fake backend: the reasoning
folded apart from the answer (in this process and through the daemon), regenerate with the
replies kept and browsable, edit of the last message, files with their tokens counted before
anything is sent, summarising older turns when the context is full, per-model sampling
defaults, and the first run with only a base model."""

from __future__ import annotations

import asyncio

from daemon_util import fake_factory, install_fake_models, serve
from localinfer.catalog import load_catalog
from localinfer.chats import Chat, ChatMessage, ChatStore
from localinfer.client import DaemonClient
from localinfer.config import Config, ModelSettings
from localinfer.errors import LocalInferError
from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend
from localinfer.runtime.types import Message, SamplingParams, Token
from localinfer.sampling_defaults import model_defaults
from localinfer.session import DaemonSession, EngineSession, Thought
from localinfer.tui.app import create_app
from localinfer.tui.screens import ContextFullScreen, ErrorScreen, SettingsScreen
from localinfer.tui.widgets import AssistantMessage, ChatInput, FileChips, SummaryNote, ThoughtBlock
from template_fixtures import QWEN3_STYLE
from test_tui import finished, send
from tui_util import Opener, in_process_app, laptop, ready, text_of, until, until_screen

THOUGHT = "The user adds two and two. That is four."
ANSWER = "The answer is 4."
THINKING_REPLY = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"


def run(coro) -> None:
    asyncio.run(coro)


def thinking_opener(seen: list[str] | None = None, **kwargs) -> Opener:
    def reply(prompt: str) -> str:
        if seen is not None:
            seen.append(prompt)
        return THINKING_REPLY

    return Opener(lambda ref: FakeBackend(reply, name=ref, chat_template=QWEN3_STYLE,
                                          **kwargs))


# --- thinking --------------------------------------------------------------------------------
def test_the_session_splits_the_reasoning_in_process_and_through_the_daemon(home):
    messages = [Message("user", "What is 2+2?")]
    engine = Engine(FakeBackend(THINKING_REPLY, chat_template=QWEN3_STYLE))
    try:
        generation = EngineSession(engine).chat(messages, SamplingParams(max_tokens=64))
        events = list(generation)
    finally:
        engine.close()
    thought = "".join(e.text for e in events if isinstance(e, Thought))
    answer = "".join(e.text for e in events if isinstance(e, Token))
    assert (thought, answer, events[-1].text) == (THOUGHT, ANSWER, ANSWER)
    assert generation.thought is not None and generation.thought.text == THOUGHT
    assert generation.thought.tokens > 5 and generation.thought.answer_ttft_ms > 0

    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply=THINKING_REPLY, chat_template=QWEN3_STYLE),
               tcp=False) as daemon:
        client = DaemonClient(socket_path=daemon.socket)
        info = client.load("fake:1b-f16")
        session = DaemonSession(client, "fake:1b-f16", info)
        generation = session.chat(messages, SamplingParams(max_tokens=64))
        events = list(generation)
        assert "".join(e.text for e in events if isinstance(e, Thought)) == THOUGHT
        assert "".join(e.text for e in events if isinstance(e, Token)) == ANSWER
        assert events[-1].text == ANSWER and generation.thought.text == THOUGHT
        # Thinking off: Qwen3's switch closes the block in the prompt; a model that does
        # not think is refused thinking by name, as the daemon's other routes refuse it.
        events = list(session.chat(messages, SamplingParams(max_tokens=64), think=False))
        assert events[-1].text  # the fake replies the same: the split still holds
        # A file's tokens, counted by the daemon's model as in this process.
        text = "def add(a, b):\n    return a + b\n"
        engine = Engine(FakeBackend())
        try:
            assert session.count_text(text) == EngineSession(engine).count_text(text) > 5
        finally:
            engine.close()
        session.close()


def test_a_thinking_reply_shows_a_folded_block_and_a_clean_answer(home):
    seen: list[str] = []
    opener = thinking_opener(seen)

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "What is 2+2?")
            await finished(pilot, 2)
            reply = app.chat.messages[-1]
            assert (reply.content, reply.thinking) == (ANSWER, THOUGHT)
            assert reply.stats.thought_tokens > 5 and reply.stats.answer_ttft_ms > 0
            widget = app.query(AssistantMessage).last()
            await until(pilot, lambda: not widget.streaming, "the reply settles")
            block = widget.query_one(ThoughtBlock)
            assert block.display and block.collapsed
            assert block.title.startswith("Thought for ") and " tok · " in block.title
            assert widget.markdown.source == ANSWER
            summary = text_of(widget.query_one(".summary"))
            assert summary.startswith("answer: TTFT ") and "all: " in summary
            # The next turn sends the answer alone: the reasoning is not sent back.
            await send(pilot, "And 3+3?")
            await finished(pilot, 4)
            assert ANSWER in seen[-1] and THOUGHT not in seen[-1]
            # /think off: this chat's thinking is switched off in the template.
            await send(pilot, "/think off")
            assert app.chat.think is False and app.chat.messages[-1].role == "assistant"
            await send(pilot, "Once more")
            await finished(pilot, 6)
            assert seen[-1].endswith("<think>\n\n</think>\n\n")
            # Saved and shown again after a restart of the chat.
            saved = ChatStore().load(app.chat.id)
            assert saved.messages[1].thinking == THOUGHT and saved.think is False
        opener.close()

    run(main())


# --- regenerate and edit -------------------------------------------------------------------------
def counting_opener(seen: list[str]) -> Opener:
    def reply(prompt: str) -> str:
        seen.append(prompt)
        return f"reply number {len(seen)}"

    return Opener(lambda ref: FakeBackend(reply, name=ref))


def test_regenerate_keeps_the_replies_browsable_and_edit_resends(home):
    seen: list[str] = []
    opener = counting_opener(seen)

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "Hello")
            await finished(pilot, 2)
            await send(pilot, "Tell me a story")
            await finished(pilot, 4)
            assert app.chat.messages[-1].content == "reply number 2"
            await pilot.press("f5")
            await until(pilot, lambda: app.reply is None and
                        app.chat.messages[-1].content == "reply number 3", "regenerated")
            assert seen[-1] == seen[-2]  # the same prompt: its KV cache is reused
            last = app.chat.messages[-1]
            assert last.stats.cached_tokens > 0
            assert [m.content for m in last.versions] == ["reply number 2", "reply number 3"]
            widget = app.query(AssistantMessage).last()
            await until(pilot, lambda: not widget.streaming, "the reply settles")
            assert "‹ 2/2 ›" in text_of(widget.query_one(".summary"))
            widget.focus()
            await pilot.press("left")
            await until(pilot, lambda: app.chat.messages[-1].content == "reply number 2",
                        "the earlier reply chosen")
            await until(pilot, lambda: widget.markdown.source == "reply number 2", "shown")
            assert ChatStore().load(app.chat.id).messages[-1].content == "reply number 2"
            # Edit the last message: it and its reply are replaced; the first turn's KV
            # cache is reused.
            await pilot.press("f4")
            await until(pilot, lambda: app.conversation.editing is not None, "editing")
            chat_input = app.query_one(ChatInput)
            assert chat_input.text == "Tell me a story" and app.conversation.editing == 2
            chat_input.load_text("Tell me a poem")
            await pilot.press("enter")
            await until(pilot, lambda: app.reply is None and len(app.chat.messages) == 4
                        and app.chat.messages[2].content == "Tell me a poem"
                        and app.chat.messages[3].content == "reply number 4", "re-sent")
            assert "Tell me a story" not in seen[-1] and "Tell me a poem" in seen[-1]
            assert app.chat.messages[-1].stats.cached_tokens > 0
            assert len(app.query(AssistantMessage)) == 2
            await pilot.press("f5")
            await until(pilot, lambda: app.reply is None and
                        app.chat.messages[-1].content == "reply number 5", "regenerated")
            chat_id = app.chat.id
        # After a restart of the chat: the versions are still there; regenerate and edit work.
        app = in_process_app(opener, resume=chat_id)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            assert [m.content for m in app.chat.messages[-1].versions] == [
                "reply number 4", "reply number 5"]
            await pilot.press("f5")
            await until(pilot, lambda: app.reply is None and
                        app.chat.messages[-1].content == "reply number 6", "regenerated")
            assert len(app.chat.messages[-1].versions) == 3
            await pilot.press("f4")
            await until(pilot, lambda: app.conversation.editing is not None, "editing")
            app.query_one(ChatInput).load_text("Tell me a joke")
            await pilot.press("enter")
            await until(pilot, lambda: app.reply is None and
                        app.chat.messages[-1].content == "reply number 7", "re-sent")
            assert [m.content for m in app.chat.messages] == [
                "Hello", "reply number 1", "Tell me a joke", "reply number 7"]
        opener.close()

    run(main())


# --- files --------------------------------------------------------------------------------------
def test_files_are_counted_and_refused_before_sending(home, tmp_path):
    seen: list[str] = []
    opener = Opener(lambda ref: FakeBackend(lambda p: seen.append(p) or "read it", name=ref,
                                            n_ctx=8192))
    big = tmp_path / "big.py"
    big.write_text("".join(f"value_{i} = compute({i}) + 1\n" for i in range(2000)))
    small = tmp_path / "notes.txt"
    small.write_text("alpha beta gamma\n")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x00\x01\x02binary")

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, f"/file {big}")
            await until_screen(pilot, app, ErrorScreen, "the refusal")
            assert app.screen.title_text == "Cannot attach big.py"
            assert "tokens; the context has" in app.screen.message and "8,192" in \
                app.screen.message
            await pilot.click("#ok")
            assert not app.conversation.files and not app.chat.messages
            await send(pilot, f"/file {binary}")
            await until_screen(pilot, app, ErrorScreen, "the binary's refusal")
            assert "binary file" in app.screen.message
            await pilot.click("#ok")
            app.query_one(ChatInput).insert(str(small))  # a path pasted alone
            await pilot.press("enter")
            await until(pilot, lambda: app.conversation.files, "attached")
            chips = app.query_one(FileChips)
            assert chips.display and "notes.txt" in str(chips.children[0].label)
            assert " tok of " in str(chips.children[0].label)
            await send(pilot, "Explain this file")
            await finished(pilot, 2)
            message = app.chat.messages[0]
            assert [f.name for f in message.files] == ["notes.txt"]
            assert "alpha beta gamma" in seen[-1] and not chips.display
            assert ChatStore().load(app.chat.id).messages[0].files[0].text.startswith("alpha")
        opener.close()

    run(main())


# --- a full context ------------------------------------------------------------------------------
LONG = " ".join(f"word{i}" for i in range(80))  # ~160 fake tokens: two do not fit in 300


def test_summarise_older_turns_continues_a_chat_that_no_longer_fits(home):
    opener = Opener(lambda ref: FakeBackend(
        lambda p: "short summary" if "Summarise the conversation" in p else "ok", name=ref,
        n_ctx=300))

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "first " + LONG)
            await finished(pilot, 2)
            await send(pilot, "second " + LONG)
            await until_screen(pilot, app, ContextFullScreen, "the dialog")
            await pilot.click("#summarise")
            await until(pilot, lambda: app.reply is None and len(app.chat.messages) == 5,
                        "summarised and answered")
            roles = [m.role for m in app.chat.messages]
            assert roles == ["user", "assistant", "summary", "user", "assistant"]
            assert app.chat.messages[2].content == "short summary"
            assert app.chat.context_start == 3
            sent = app.chat.prompt_messages()
            assert sent[0].role == "system" and "short summary" in sent[0].content
            assert [m.content for m in sent[1:]] == ["second " + LONG, "ok"]
            assert app.query(SummaryNote)
        opener.close()

    run(main())


# --- sampling defaults ---------------------------------------------------------------------------
def test_sampling_defaults_come_from_the_card_the_file_and_the_config():
    catalog = load_catalog()
    config = Config(models={"qwen3:8b": ModelSettings(top_k=30)})
    defaults = model_defaults(catalog, "qwen3:8b", {"general.sampling.temp": 0.7,
                                                    "general.sampling.penalty_repeat": 1.1},
                              config)
    assert defaults.values == {"temperature": 0.7, "top_p": 0.95, "top_k": 30, "min_p": 0.0,
                               "repeat_penalty": 1.1}
    assert defaults.sources["top_p"].startswith("catalog: https://huggingface.co/Qwen/")
    assert defaults.sources["temperature"] == "GGUF general.sampling.temp"
    assert defaults.sources["top_k"] == "config.toml [models]"
    assert model_defaults(catalog, "llama3.2:1b", None, Config()).values == {}
    chat = Chat(id="x", temperature=0.2)
    params = chat.params(defaults.values)
    assert (params.temperature, params.top_k, params.repeat_penalty) == (0.2, 30, 1.1)


def test_the_settings_screen_shows_the_model_defaults(home):
    opener = thinking_opener()

    async def main():
        app = in_process_app(opener, model="qwen3:8b")
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            assert app.defaults.values["temperature"] == 0.6
            await pilot.press("ctrl+s")
            await until_screen(pilot, app, SettingsScreen, "settings")
            assert app.screen.query_one("#temperature").placeholder == "0.6"
            assert "huggingface.co/Qwen" in text_of(app.screen.query_one("#settings-defaults"))
            app.screen.query_one("#think").value = "off"
            app.screen.query_one("#top-k").value = "12"
            await pilot.press("ctrl+s")
            assert app.chat.think is False and app.chat.top_k == 12
            assert app.conversation.params().top_k == 12
            assert app.conversation.params().temperature == 0.6
        opener.close()

    run(main())


def test_old_chat_files_still_load():
    old = {"schema": 1, "id": "20260101-000000-abcd", "created": 1.0, "updated": 1.0,
           "temperature": 0.8, "max_tokens": 512,
           "messages": [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello"}]}
    chat = Chat.from_dict(old)
    assert chat.temperature == 0.8 and chat.think is None
    assert chat.messages[1] == ChatMessage("assistant", "hello", at=chat.messages[1].at)
    assert create_app  # the factory the CLI uses is the one the tests above build
    assert laptop()


# --- the first run -------------------------------------------------------------------------------
def test_with_only_the_base_starter_the_chat_offers_the_planners_instruct_model(home,
                                                                               monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # an earlier test may have set it
    monkeypatch.delenv("LOCALINFER_OFFLINE", raising=False)
    opener = Opener(lambda ref: FakeBackend("once upon a time", name=ref, base_model=True))
    pulled: list[str] = []

    def pull(name, *, progress=None, cancel=None):
        pulled.append(name)
        raise LocalInferError("the test's store is offline")

    async def main():
        app = in_process_app(opener, model="gemma3:270m")
        app.launcher.pull = pull
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await until(pilot, lambda: app.query("#offer-download"), "the offer")
            offer = app.offer
            assert offer is not None and not offer.installed and offer.fits
            assert offer.decode_tps > 0 and offer.name.split(":")[0] != "gemma3:270m"
            welcome = text_of(app.query_one("#welcome"))
            assert "good for" in welcome and offer.name in welcome
            button = app.query_one("#offer-download")
            assert offer.name in str(button.label) and "tok/s predicted" in str(button.label)
            button.focus()
            await pilot.press("enter")
            await until_screen(pilot, app, ErrorScreen, "the question")
            assert app.screen.title_text == f"Download {offer.name}?"
            await pilot.press("enter")  # Cancel is the default
            assert not pulled and not isinstance(app.screen, ErrorScreen)
            button.press()
            await until_screen(pilot, app, ErrorScreen, "the question")
            await pilot.click("#yes")
            await until(pilot, lambda: pulled, "the pull")
            assert pulled == [offer.name]
        opener.close()

    run(main())


def test_offline_the_first_run_says_how_to_add_a_gguf(home, monkeypatch):
    monkeypatch.setenv("LOCALINFER_OFFLINE", "true")
    opener = Opener(lambda ref: FakeBackend("once upon a time", name=ref, base_model=True))

    async def main():
        app = in_process_app(opener, model="gemma3:270m")
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await until(pilot, lambda: "localinfer add" in text_of(app.query_one("#welcome")),
                        "the offline advice")
            assert app.offer is None and not app.query("#offer-download")
        opener.close()

    run(main())


def test_run_takes_the_model_defaults_for_the_flags_left_out():
    import argparse

    from localinfer.cli.common import add_sampling_flags, sampling_params

    parser = argparse.ArgumentParser()
    add_sampling_flags(parser)
    defaults = model_defaults(load_catalog(), "gemma3:270m", None, Config()).values
    assert defaults["repeat_penalty"] == 1.1 and defaults["top_k"] == 64  # size, family
    params = sampling_params(parser.parse_args(["--top-k", "5"]), defaults)
    assert (params.top_k, params.temperature, params.repeat_penalty) == (5, 1.0, 1.1)
    plain = sampling_params(parser.parse_args([]))
    assert (plain.temperature, plain.top_k, plain.repeat_penalty) == (0.8, 40, 1.0)
