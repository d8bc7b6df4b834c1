"""The chat UI, driven with Textual's Pilot on the fake backend (in-process, and through the
real daemon running in this process), plus one run on the real starter model."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest
from textual.widgets import Button

from daemon_util import fake_factory, install_fake_models, serve
from localinfer.chats import ChatStore
from localinfer.errors import ModelLoadError
from localinfer.runtime.fake import FakeBackend
from localinfer.tui.app import create_app
from localinfer.tui.screens import (
    ChatsScreen,
    ConfirmScreen,
    ContextFullScreen,
    ErrorScreen,
    HelpScreen,
    ModelsScreen,
    SettingsScreen,
    TextPrompt,
)
from localinfer.tui.widgets import AssistantMessage, ChatInput, ContextNote, UserMessage
from tui_util import (
    REPLY,
    GatedBackend,
    Opener,
    in_process_app,
    laptop,
    ready,
    streamed,
    text_of,
    until,
    until_screen,
)


def run(coro) -> None:
    asyncio.run(coro)


def gated_opener(**kwargs) -> tuple[Opener, list[GatedBackend]]:
    backends: list[GatedBackend] = []

    def make(ref):
        backend = GatedBackend(kwargs.pop("reply", REPLY), name=ref, **kwargs)
        backends.append(backend)
        return backend

    return Opener(make), backends


def keys(text: str) -> list[str]:
    return [{" ": "space", "\n": "ctrl+j"}.get(c, c) for c in text]


async def send(pilot, text: str) -> None:
    """Type ``text`` into the input as a user would (a long one is pasted), press Enter."""
    if len(text) > 40:
        pilot.app.query_one(ChatInput).insert(text)
        await pilot.press("enter")
    else:
        await pilot.press(*keys(text), "enter")


async def finished(pilot, n_messages: int) -> None:
    app = pilot.app
    await until(pilot, lambda: app.reply is None and len(app.chat.messages) >= n_messages,
                f"{n_messages} messages in the chat")


def decode_figure(text: str) -> float:
    match = re.search(r"decode ([\d.,]+) tok/s", text)
    assert match, text
    return float(match.group(1).replace(",", ""))


# --- streaming --------------------------------------------------------------------------------
def test_the_sparkline_has_no_spike_from_tokens_the_ui_took_together():
    from localinfer.tui.figures import SpeedTracker

    tracker = SpeedTracker(window=8)
    assert tracker.add(1, 10.000) is None and tracker.add(2, 10.001) is None  # 1,000 tok/s
    for n in range(3, 41):
        tracker.add(n, 10.001 + (n - 2) * 0.05)  # then 20 tok/s
    assert tracker.samples and max(tracker.samples) < 25


def test_a_reply_streams_token_by_token_with_live_speed(home):
    opener, backends = gated_opener()

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            backend = backends[0]
            await send(pilot, "Write an add function")
            await until(pilot, lambda: app.reply is not None, "a reply starts")
            speed = app.query_one("#status-speed")
            spark = app.query_one("#status-spark")
            reply_widget = app.query(AssistantMessage).last()
            assert "waiting for the first token" in text_of(speed)
            assert reply_widget.has_class("-streaming")

            backend.release(6)  # the prompt, then five decode steps
            await until(pilot, lambda: streamed(app, 6) and "6 tok" in text_of(speed),
                        "six tokens shown")
            first_text, first_samples = text_of(speed), list(spark.data)
            shown = reply_widget.markdown.source
            assert shown and REPLY.startswith(shown) and shown != REPLY

            for _ in range(12):  # one step at a time, as a model would produce them
                backend.release(1)
                n = app.reply.live.n_tokens
                await until(pilot, lambda n=n: app.reply.live.n_tokens > n, "one more token")
            await until(pilot, lambda: f"{app.reply.live.n_tokens} tok" in text_of(speed),
                        "the status bar catches up")
            later_text, later_samples = text_of(speed), list(spark.data)
            assert later_text != first_text
            assert decode_figure(later_text) > 0
            assert len(later_samples) > len(first_samples)  # none before 8 tokens came
            assert later_samples != first_samples and all(s > 0 for s in later_samples)
            longer = reply_widget.markdown.source
            assert len(longer) > len(shown) and REPLY.startswith(longer)
            assert "ctx" in text_of(app.query_one("#status-model"))

            backend.open()
            await finished(pilot, 2)
            reply = app.chat.messages[-1]
            assert reply.content == REPLY and reply.finish_reason == "stop"
            assert reply.stats.completion_tokens >= 20 and reply.stats.decode_tps > 0
            assert not reply_widget.has_class("-streaming")
            summary = text_of(reply_widget.query_one(".summary"))
            assert re.match(r"\d+ tok · decode [\d.,]+ tok/s · TTFT [\d,]+ ms", summary), summary
            assert reply_widget.markdown.source == REPLY
            assert reply_widget.query("MarkdownFence"), "the code block is a highlighted fence"
            assert "last reply: decode" in text_of(speed)
            # Saved after every message.
            saved = ChatStore().load(app.chat.id)
            assert [m.role for m in saved.messages] == ["user", "assistant"]
            assert saved.messages[1].stats == reply.stats
        opener.close()

    run(main())


def test_a_replys_single_line_breaks_stay_on_screen(home):
    """A poem or a list written without Markdown's blank lines keeps its lines (Markdown alone
    joins them into one paragraph)."""
    poem = "Roses are red,\nviolets are blue.\n1. one\n2. two"
    opener = Opener(lambda ref: FakeBackend(poem, name=ref))

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "A poem")
            await finished(pilot, 2)
            paragraph = app.query(AssistantMessage).last().query("MarkdownParagraph").first()
            assert "Roses are red,\nviolets are blue." in str(paragraph.content)
        opener.close()

    run(main())


@pytest.mark.parametrize("key", ["escape", "ctrl+c"])
def test_escape_cancels_and_keeps_the_partial_reply(home, key):
    """Esc, or Ctrl+C (which showed Textual's "Do you want to quit?" while the reply ran
    on), stops the reply."""
    opener, backends = gated_opener()

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            assert app.check_action("cancel_reply", ()) is False  # hidden: nothing streams
            await send(pilot, "Tell me a story")
            backends[0].release(5)
            await until(pilot, lambda: streamed(app, 5), "a few tokens")
            assert app.check_action("cancel_reply", ()) is True
            await pilot.press(key)
            backends[0].open()
            await finished(pilot, 2)
            reply = app.chat.messages[-1]
            assert reply.finish_reason == "cancelled"
            assert reply.content and REPLY.startswith(reply.content) and reply.content != REPLY
            widget = app.query(AssistantMessage).last()
            assert widget.has_class("-cancelled")
            assert text_of(widget.query_one(".summary")).startswith("✂ ")
            assert ChatStore().load(app.chat.id).messages[-1].finish_reason == "cancelled"
            # The next turn sends the partial reply as the context.
            assert app.chat.prompt_messages()[-1].content == reply.content
        opener.close()

    run(main())


def test_quitting_mid_reply_keeps_the_partial_reply(home):
    opener, backends = gated_opener()

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "Tell me more")
            backends[0].release(8)
            await until(pilot, lambda: streamed(app, 8) and app.reply.widget.markdown.source,
                        "a few tokens shown")
            chat_id = app.chat.id
            await pilot.press("ctrl+q")
            backends[0].open()
        saved = ChatStore().load(chat_id).messages
        assert [m.role for m in saved] == ["user", "assistant"]
        assert saved[1].finish_reason == "cancelled" and REPLY.startswith(saved[1].content)
        opener.close()

    run(main())


def test_new_chat_models_and_chats_keys_work_mid_reply(home):
    opener, backends = gated_opener()

    async def cancelled_by(pilot, key: str) -> None:
        """Send, let a few tokens stream, press ``key``: the reply ends cancelled and saved."""
        app = pilot.app
        backend = backends[0]
        backend.gated = True
        chat = app.chat
        await send(pilot, f"Tell me about {key}")
        backend.release(5)
        await until(pilot, lambda: streamed(app, 5) and app.reply.widget.markdown.source,
                    "a few tokens shown")
        await pilot.press(key)
        backend.open()
        await until(pilot, lambda: app.reply is None and chat.messages[-1].role == "assistant",
                    "the reply ended")
        reply = chat.messages[-1]
        assert reply.finish_reason == "cancelled"
        assert reply.content and REPLY.startswith(reply.content) and reply.content != REPLY
        assert ChatStore().load(chat.id).messages[-1] == reply

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            first = app.chat
            await cancelled_by(pilot, "ctrl+n")
            # The new chat is current before its (empty) view is rendered: wait for both.
            await until(pilot, lambda: app.chat is not first and not app.query(UserMessage),
                        "a new chat, shown empty")
            assert not app.chat.messages

            await cancelled_by(pilot, "ctrl+o")
            await until_screen(pilot, app, ModelsScreen, "the models")
            await pilot.press("escape")

            second = app.chat
            await cancelled_by(pilot, "ctrl+r")
            await until_screen(pilot, app, ChatsScreen, "the chats")
            assert {s.id for s in app.screen.summaries} == {first.id, second.id}
        opener.close()

    run(main())


def test_the_input_keys(home):
    opener, backends = gated_opener()

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            box = app.query_one(ChatInput)
            await pilot.press("l", "i", "n", "e", "1", "ctrl+j", "l", "i", "n", "e", "2")
            assert box.text == "line1\nline2"
            await pilot.press("enter")
            await until(pilot, lambda: app.reply is not None, "sent")
            assert app.chat.messages[0].content == "line1\nline2" and box.text == ""
            # The input stays usable while the reply streams; Enter then keeps the text.
            await pilot.press(*keys("next one"))
            await pilot.press("enter")
            assert box.text == "next one" and len(app.chat.messages) == 1
            backends[0].open()
            await finished(pilot, 2)
            box.clear()
            await pilot.press("up")
            assert box.text == "line1\nline2"  # Up recalls the previous prompt
            await pilot.press("down", "down")
            assert box.text == ""  # and Down goes back to the (empty) draft
            await pilot.press("f2")
            assert app.clipboard == REPLY
            await pilot.press("ctrl+t")
            assert app.theme == "textual-light"
            await pilot.press("f1")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            assert not isinstance(app.screen, HelpScreen)
            # A slash command that is not one is said, not sent to the model.
            await pilot.press(*keys("/help"), "enter")
            assert len(app.chat.messages) == 2 and box.text == "/help"
            assert any("/help is not a command" in str(n.message)
                       for n in app._notifications)
            box.clear()
            # The conversation scrolls from the message box.
            transcript = app.query_one("#transcript")
            scrolled: list[str] = []
            transcript.scroll_page_up = lambda *a, **k: scrolled.append("up")
            transcript.scroll_page_down = lambda *a, **k: scrolled.append("down")
            await pilot.press("pageup", "pagedown")
            assert scrolled == ["up", "down"] and app.focused is box
            await pilot.press("f1")  # another screen's lists page as they do
            assert app.check_action("scroll_transcript", (1,)) is False
            await pilot.press("escape")
            # F8 on a model that does not think says so and leaves thinking off (every
            # message was a 400 once it was on).
            await pilot.press("f8")
            assert app.chat.think is None
            assert any("does not think" in str(n.message) for n in app._notifications)
        opener.close()

    run(main())


def test_settings_reach_the_model_and_are_saved(home):
    seen: list[str] = []

    def reply(prompt: str) -> str:
        seen.append(prompt)
        return "ok"

    opener = Opener(lambda ref: FakeBackend(reply, name=ref))

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await pilot.press("ctrl+s")
            assert isinstance(app.screen, SettingsScreen)
            # A typed value shows whole in its field, the cursor after it ("2048" showed
            # as "048").
            field = app.screen.query_one("#max-tokens")
            field.focus()
            field.value = ""
            await pilot.press(*"204800")
            await pilot.pause()
            assert field.value == "204800" and field.content_region.width > len(field.value)
            app.screen.query_one("#system-prompt").load_text("Answer like a pirate.")
            app.screen.query_one("#temperature").value = "3000"
            await pilot.click("#save")
            assert "between 0 and 100" in text_of(app.screen.query_one("#settings-error"))
            app.screen.query_one("#temperature").value = "0"
            app.screen.query_one("#max-tokens").value = "32"
            await pilot.press("ctrl+s")
            assert not isinstance(app.screen, SettingsScreen)
            await send(pilot, "Hello")
            await finished(pilot, 2)
            assert "Answer like a pirate." in seen[-1]
            saved = ChatStore().load(app.chat.id)
            assert (saved.system_prompt, saved.temperature, saved.max_tokens) == (
                "Answer like a pirate.", 0.0, 32)
        opener.close()

    run(main())


def test_enter_saves_the_settings_and_escape_cancels(home):
    opener = Opener()

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await pilot.press("ctrl+s")
            await until_screen(pilot, app, SettingsScreen, "the settings")
            assert "Enter saves" in text_of(app.screen.query_one("#settings-hint"))
            assert app.focused.id == "system-prompt"
            await pilot.press(*keys("Be brief.\nUse lists."), "enter")  # Ctrl+J: a new line
            assert not isinstance(app.screen, SettingsScreen)
            assert app.chat.system_prompt == "Be brief.\nUse lists."
            await pilot.press("ctrl+s")
            await until_screen(pilot, app, SettingsScreen, "the settings")
            app.screen.query_one("#temperature").focus()
            app.screen.query_one("#temperature").value = ""
            await pilot.press("0", ".", "2", "enter")
            assert not isinstance(app.screen, SettingsScreen)
            assert app.chat.temperature == 0.2
            await pilot.press("ctrl+s")
            await until_screen(pilot, app, SettingsScreen, "the settings")
            app.screen.query_one("#max-tokens").focus()
            await pilot.press("9", "escape")
            assert not isinstance(app.screen, SettingsScreen)
            assert app.chat.max_tokens == 512  # Esc cancelled
            assert app.focused is app.query_one(ChatInput)
        opener.close()

    run(main())


def test_a_short_window_keeps_the_message_box_and_some_conversation(home):
    """At 40x10 the title, status and key bars left the transcript 2 rows, and below that the
    screen scrolled the message box away; they give way, and come back in a taller window."""
    from textual.widgets import Footer, Header

    install_fake_models("fake:1b-f16")
    opener = Opener(lambda ref: FakeBackend(REPLY, name=ref))

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(40, 10)) as pilot:
            await ready(pilot)
            await pilot.pause()
            box = app.query_one(ChatInput).region
            assert box.y >= 0 and box.bottom <= 10 and box.height == 3
            assert app.query_one("#transcript").region.height >= 5
            assert not any(w.display for w in (app.query_one(Header), app.query_one(Footer),
                                               app.status))
            await pilot.resize_terminal(100, 32)
            await pilot.pause()
            assert all(w.display for w in (app.query_one(Header), app.query_one(Footer),
                                           app.status))
        opener.close()

    run(main())


def test_a_base_model_is_said_to_continue_text_not_follow_instructions(home):
    install_fake_models("fake:1b-f16")
    opener = Opener(lambda ref: FakeBackend(REPLY, name=ref, base_model=ref == "fake:base"))

    async def main():
        app = in_process_app(opener, model="fake:base")
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            note = app.query_one("#model-note")
            await until(pilot, lambda: note.region.height, "the note laid out")
            assert note.display and note.region.y == 1  # right under the title bar
            assert text_of(note).startswith("base model: continues text, does not follow"
                                            " instructions")
            assert note.region.width >= len(text_of(note))  # all of it, at 80 columns
            welcome = text_of(app.query_one("#welcome"))
            assert "base model" in welcome and "to continue" in welcome
            assert "Ctrl+O" in welcome and "instruct" in welcome
            await pilot.press("ctrl+o")
            screen = app.screen
            await until(pilot, lambda: screen.rows, "the plan")
            await pilot.press("enter")  # the first row: the installed fake:1b-f16
            await until(pilot, lambda: app.session and app.session.model == "fake:1b-f16",
                        "switched")
            assert not note.display
            assert "base model" not in text_of(app.query_one("#welcome"))
        opener.close()

    run(main())


def test_a_reply_faster_than_the_roofline_measures_the_bandwidth_again(home):
    from localinfer.hardware import bandwidth as bw
    from localinfer.hardware import probe
    from localinfer.hardware.load import MachineLoad

    # A cached figure far too low (a measurement on a busy machine that slipped through).
    cache = home / "cache" / "hardware"
    key = bw.profile_key(probe(measure_bandwidth=False, with_build=False))
    bw.store(cache, key, bw.BandwidthMeasurement(
        bandwidth_gbps=0.0001, bandwidth_1core_gbps=0.0001, buffer_bytes=1, threads=1,
        seconds=0.1, measured_at=1e9, load=MachineLoad(0.0, 2, 0.1)))
    opener, backends = gated_opener(reply="Sure. " * 40)

    async def main():
        app = in_process_app(opener, hardware=None)  # this machine's profile, from the cache
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await until(pilot, lambda: app.hardware is not None, "the hardware probed")
            assert app.hardware.host_bandwidth_gbps == 0.0001
            backends[0].open()
            await send(pilot, "Hi")
            await finished(pilot, 2)
            reply = app.chat.messages[-1]
            assert reply.stats.roofline_pct > 110  # a 1 MB model at 0.1 MB/s
            await until(pilot, lambda: app.hardware.host_bandwidth_gbps > 0.0001,
                        "the bandwidth measured again", timeout_s=60)
            entry = bw.cached(cache, key)
            assert entry.suspect is None and entry.current.measured_at > 1e9
            assert any("of the roofline: the cached host bandwidth (0.0 GB/s) is too low"
                       in str(n.message) for n in app._notifications)

    run(main())


# --- models --------------------------------------------------------------------------------
def test_models_screen_opens_and_switches_through_the_daemon(home, monkeypatch):
    install_fake_models("fake:1b-f16", "fake:2b-f16")
    loads: list = []
    with serve(fake_factory(loads=loads, reply="Hi from the daemon."), tcp=False) as daemon:
        monkeypatch.setenv("LOCALINFER_HOST", f"unix:{daemon.socket}")

        async def main():
            app = create_app("fake:1b-f16", hardware=laptop())
            async with app.run_test(size=(100, 32)) as pilot:
                await ready(pilot)
                assert app.session.where.startswith("daemon")
                assert app.session.info.name == "fake:1b-f16"
                assert "daemon" in text_of(app.query_one("#status-model"))
                await pilot.press("ctrl+o")
                screen = app.screen
                assert isinstance(screen, ModelsScreen)
                await until(pilot, lambda: screen.rows, "the plan")
                names = [r.name for r in screen.rows]
                assert names[:2] == ["fake:1b-f16", "fake:2b-f16"]
                assert all(r.installed for r in screen.rows[:2])
                assert any(not r.installed for r in screen.rows[2:])  # the catalog
                first = screen.rows[0]
                assert first.fits and first.decode_tps > 0 and first.gpu_layers.startswith("0/")
                table = screen.query_one("DataTable")
                assert table.get_row_at(0)[0] == "●"  # the model in use
                assert [m.name for m in screen.loaded] == ["fake:1b-f16"]  # in the daemon
                assert table.get_row_at(0)[-1].endswith("100% CPU")
                assert table.get_row_at(1)[-1] == ""
                assert "1 loaded (daemon): fake:1b-f16" in text_of(
                    screen.query_one("#models-title"))
                await pilot.press("down", "enter")
                await until(pilot, lambda: app.session and
                            app.session.info.name == "fake:2b-f16", "switched")
                assert app.screen is app.screen_stack[0]
                await send(pilot, "hello")
                await finished(pilot, 2)
                assert app.chat.messages[-1].content == "Hi from the daemon."
                assert app.chat.messages[-1].model == "fake:2b-f16"
                assert app.chat.model == "fake:2b-f16"
            assert [name for name, _ in loads] == ["fake:1b-f16", "fake:2b-f16"]

        run(main())


def test_escape_cancels_a_reply_streamed_by_the_daemon(home, monkeypatch):
    install_fake_models("fake:1b-f16")
    words = " ".join(f"w{i}" for i in range(400))
    with serve(fake_factory(reply=words, step_delay_s=0.01), tcp=False) as daemon:
        monkeypatch.setenv("LOCALINFER_HOST", f"unix:{daemon.socket}")

        async def main():
            app = create_app("fake:1b-f16", hardware=laptop())
            async with app.run_test(size=(100, 32)) as pilot:
                await ready(pilot)
                await send(pilot, "count")
                await until(pilot, lambda: streamed(app, 10), "some tokens")
                await pilot.press("escape")
                await finished(pilot, 2)
                reply = app.chat.messages[-1]
                assert reply.finish_reason == "cancelled"
                assert words.startswith(reply.content) and len(reply.content) < len(words)
                # The daemon ended the stream with its own figures for the cancelled reply.
                assert reply.stats.completion_tokens >= 10 and reply.stats.decode_tps > 0
                assert reply.stats.ttft_ms > 0 and reply.stats.prompt_tokens > 0
                assert "≥" not in text_of(app.query_one("#status-model"))

        run(main())


def test_quitting_says_what_the_daemon_keeps_running(home, monkeypatch):
    from localinfer.cli.chat import daemon_note

    install_fake_models("fake:1b-f16")
    with serve(fake_factory(), tcp=False) as daemon:
        monkeypatch.setenv("LOCALINFER_HOST", f"unix:{daemon.socket}")

        async def main():
            app = create_app("fake:1b-f16", hardware=laptop())
            async with app.run_test(size=(100, 32)) as pilot:
                await ready(pilot)
                assert daemon_note(app.launcher, app.session) is not None
                await pilot.press("ctrl+q")
            return app

        app = asyncio.run(main())
        note = daemon_note(app.launcher, app.session)  # printed once the UI is gone
        assert note is not None and "\n" not in note
        assert f"pid {os.getpid()}" in note  # the daemon runs in this test process
        assert "keeps fake:1b-f16 loaded for editors for 5 minutes" in note
        assert "`localinfer stop`" in note and "exits after" not in note
        # A daemon the chat started itself also exits after its idle time.
        app.launcher.started_daemon_pid = os.getpid()
        note = daemon_note(app.launcher, app.session)
        assert "and exits after 30 minutes without requests" in note

    # In-process, nothing keeps running: nothing to say.
    opener = Opener()

    async def in_process():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await pilot.press("ctrl+q")
        return app

    app = asyncio.run(in_process())
    assert daemon_note(app.launcher, app.session) is None
    opener.close()


def test_models_screen_switches_an_in_process_engine(home):
    install_fake_models("fake:1b-f16", "fake:2b-f16")
    opener = Opener()

    async def main():
        app = in_process_app(opener, model="fake:2b-f16")
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await pilot.press("ctrl+o")
            screen = app.screen
            await until(pilot, lambda: screen.rows, "the plan")
            [held] = screen.loaded
            assert (held.name, held.where) == ("fake:2b-f16", "this process")
            await pilot.press("enter")  # the first row: fake:1b-f16
            await until(pilot, lambda: app.session and app.session.model == "fake:1b-f16",
                        "switched")
            assert opener.opened == ["fake:2b-f16", "fake:1b-f16"]
            assert opener.engines[0]._closing  # the old engine was closed first
        opener.close()

    run(main())


def test_enter_on_a_catalog_model_asks_before_downloading(home):
    opener = Opener()

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await pilot.press("ctrl+o")
            screen = app.screen
            await until(pilot, lambda: screen.rows, "the plan")
            started: list[str] = []
            screen.pull = lambda name, cancel: started.append(name)  # no download here
            big = next(i for i, r in enumerate(screen.rows) if r.name.startswith("gemma3:27b"))
            row = screen.rows[big]
            assert not row.installed and not row.fits
            screen.query_one("DataTable").move_cursor(row=big)
            await pilot.press("enter")
            await until_screen(pilot, app, ConfirmScreen, "the question")
            question = app.screen.message
            assert f"{row.size_bytes / 1e9:.1f} GB" in question
            assert "too big" in question and row.reason in question
            assert f"{row.decode_tps:.1f} tok/s" in question
            assert app.focused.id == "no"  # Cancel is the default
            await pilot.press("enter")
            assert app.screen is screen and not started and not screen.pulling
            await pilot.press("enter")
            await until_screen(pilot, app, ConfirmScreen, "the question")
            await pilot.click("#yes")
            assert started == [row.name] and screen.pulling == row.name
        opener.close()

    run(main())


# --- history --------------------------------------------------------------------------------
def test_history_survives_a_restart(home):
    opener = Opener()

    async def first():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "Remember the number 42")
            await finished(pilot, 2)
            await pilot.press("ctrl+n")
            await send(pilot, "A second chat")
            await finished(pilot, 2)

    async def second():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            assert not app.query(UserMessage)  # a new chat by default
            await pilot.press("ctrl+r")
            screen = app.screen
            assert isinstance(screen, ChatsScreen)
            assert [s.title for s in screen.summaries] == ["A second chat",
                                                           "Remember the number 42"]
            await pilot.press("down", "enter")
            await until(pilot, lambda: app.query(UserMessage), "the chat is shown")
            assert [text_of(w) for w in app.query(UserMessage)] == ["Remember the number 42"]
            assert app.query(AssistantMessage).last().markdown.source == REPLY
            assert "last reply: decode" in text_of(app.query_one("#status-speed"))
            # The conversation goes on where it was.
            await send(pilot, "What was the number?")
            await finished(pilot, 4)
            assert [m.content for m in app.chat.prompt_messages()][:2] == [
                "Remember the number 42", REPLY]

    async def third():
        app = in_process_app(opener, resume="latest")  # `localinfer chat --continue`
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            assert len(app.query(UserMessage)) == 2

    run(first())
    run(second())
    run(third())
    opener.close()


def test_chats_can_be_renamed_and_deleted(home):
    opener = Opener()

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "Plan a trip")
            await finished(pilot, 2)
            await pilot.press("ctrl+r", "r")
            assert isinstance(app.screen, TextPrompt)
            app.screen.query_one("Input").value = ""
            await pilot.press(*keys("Holidays"), "enter")
            chats = app.screen
            await until(pilot, lambda: chats.summaries[0].title == "Holidays", "renamed")
            assert app.chat.title == "Holidays"
            await pilot.press("d")
            await pilot.click("#yes")
            await until(pilot, lambda: not chats.summaries, "deleted")
            assert ChatStore().summaries() == []
            await pilot.press("escape")
            assert not app.query(UserMessage)  # the open chat was the deleted one
        opener.close()

    run(main())


def test_deleting_a_chat_needs_an_explicit_choice(home):
    opener = Opener()

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "Keep me")
            await finished(pilot, 2)
            await pilot.press("ctrl+r", "d")
            await until_screen(pilot, app, ConfirmScreen, "the confirmation")
            assert app.screen.title_text == "Delete this chat?"
            assert app.focused.id == "no"  # Cancel is the default
            await pilot.press("enter")
            assert isinstance(app.screen, ChatsScreen)
            assert [s.title for s in ChatStore().summaries()] == ["Keep me"]
            await pilot.press("d")
            await until_screen(pilot, app, ConfirmScreen, "the confirmation")
            await pilot.press("escape")
            assert len(ChatStore().summaries()) == 1
        opener.close()

    run(main())


# --- errors --------------------------------------------------------------------------------
def test_daemon_unreachable_is_shown_and_offers_running_in_process(home, monkeypatch):
    monkeypatch.delenv("LOCALINFER_HOST", raising=False)
    opener = Opener()

    async def main():
        app = create_app("fake:1b", hardware=laptop(), start_daemon=False,
                         open_engine=opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await until_screen(pilot, app, ErrorScreen, "an error")
            assert app.screen.title_text == "Daemon unreachable"
            assert "no localinfer daemon is running" in app.screen.message
            assert "no model" in text_of(app.query_one("#status-model"))
            # The bandwidth is known (a laptop's profile): there is only no model to weigh.
            assert text_of(app.query_one("#status-roofline")) == "roofline: no model loaded"
            await pilot.pause()
            # All four buttons show whole (the last, Close, was cut off).
            dialog = app.screen.query_one(".dialog")
            buttons = list(app.screen.query(Button))
            assert [b.id for b in buttons] == ["retry", "in_process", "models", "close"]
            for button in buttons:
                assert dialog.content_region.contains_region(button.region), button.id
                assert button.region.width >= len(str(button.label)) + 2, button.id
            await pilot.click("#in_process")
            await until(pilot, lambda: app.session is not None, "the in-process engine")
            assert app.session.where == "in this process"
            assert opener.opened == ["fake:1b"]
        opener.close()

    run(main())


def test_a_model_that_fails_to_load_is_shown(home):
    opener = Opener(fail=ModelLoadError("llama.cpp could not load /m.gguf: out of memory"))

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await until_screen(pilot, app, ErrorScreen, "an error")
            assert app.screen.title_text == "Model failed to load"
            assert "out of memory" in app.screen.message
            await pilot.click("#close")
            await send(pilot, "anyone there?")
            assert not app.chat.messages  # nothing is sent without a model
            await pilot.click("#close") if isinstance(app.screen, ErrorScreen) else None

    run(main())


LONG = " ".join(f"word{i}" for i in range(24))  # ~48 fake tokens


def test_a_full_context_offers_to_drop_the_oldest_turns(home):
    opener = Opener(lambda ref: FakeBackend("ok", name=ref, n_ctx=100))

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "first " + LONG)
            await finished(pilot, 2)
            await send(pilot, "second " + LONG)
            await until_screen(pilot, app, ContextFullScreen, "the dialog")
            assert "no longer fits" in app.screen.message
            await pilot.click("#drop")
            await finished(pilot, 4)
            assert app.chat.messages[-1].content == "ok"
            assert app.chat.context_start == 2
            assert [m.content for m in app.chat.prompt_messages()] == ["second " + LONG, "ok"]
            assert app.query(ContextNote)  # the transcript shows where the context starts
            assert len(app.query(UserMessage)) == 2  # nothing was deleted

    run(main())
    opener.close()


def test_a_full_context_can_move_the_message_to_a_new_chat(home):
    opener = Opener(lambda ref: FakeBackend("ok", name=ref, n_ctx=100))

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "first " + LONG)
            await finished(pilot, 2)
            old_id = app.chat.id
            await send(pilot, "second " + LONG)
            await until_screen(pilot, app, ContextFullScreen, "the dialog")
            await pilot.click("#new")
            await until(pilot, lambda: app.chat.id != old_id, "a new chat")
            assert app.query_one(ChatInput).text == "second " + LONG
            assert [m.content for m in ChatStore().load(old_id).messages] == [
                "first " + LONG, "ok"]  # the unanswered message moved, nothing was lost

    run(main())
    opener.close()


def words(tag: str, n: int) -> str:
    return tag + " " + " ".join(f"w{i}" for i in range(n))  # 2n + 1 fake tokens


def test_a_reply_that_filled_the_context_drops_whole_turns_for_the_next_message(home):
    # The first reply runs until the context is full; the next message then needs room.
    opener = Opener(lambda ref: FakeBackend(
        lambda prompt: "ok" if "second" in prompt else words("story", 200), name=ref,
        n_ctx=100))

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "first")
            await until_screen(pilot, app, ContextFullScreen, "the dialog")
            assert "context is full" in app.screen.message
            assert app.chat.messages[-1].finish_reason == "length"
            # The reply says why it stopped, and the status never shows more than fits.
            assert app.chat.messages[-1].stats.finish_reason == "context"
            assert "context full" in text_of(app.query(AssistantMessage)[-1].query_one(
                ".summary"))
            assert "ctx 100/100" in text_of(app.query_one("#status-model"))
            await pilot.click("#drop")  # nothing to shorten: the reply is the model's
            assert not isinstance(app.screen, (ContextFullScreen, ErrorScreen))
            assert app.query_one(ChatInput).text == ""
            await send(pilot, "second")
            await finished(pilot, 4)
            assert not isinstance(app.screen, (ContextFullScreen, ErrorScreen))
            assert app.chat.context_start == 2  # the whole first turn, question and reply
            assert [m.content for m in app.chat.prompt_messages()] == ["second", "ok"]
            assert len(app.query(AssistantMessage)) == 2 and app.query(ContextNote)

    run(main())
    opener.close()


def test_dropping_turns_drops_as_many_whole_turns_as_the_new_message_needs(home):
    opener = Opener(lambda ref: FakeBackend("ok", name=ref, n_ctx=100))

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            for i, tag in enumerate(("one", "two", "three")):
                await send(pilot, words(tag, 8))
                await finished(pilot, 2 * i + 2)
            await send(pilot, words("four", 20))
            await until_screen(pilot, app, ContextFullScreen, "the dialog")
            await pilot.click("#drop")
            await finished(pilot, 8)
            assert app.chat.context_start == 4  # one turn was not enough: two went
            assert [m.content for m in app.chat.prompt_messages()] == [
                words("three", 8), "ok", words("four", 20), "ok"]
            assert len(app.query(UserMessage)) == 4

    run(main())
    opener.close()


def test_a_message_too_long_even_alone_is_said_so_and_can_be_edited_or_moved(home):
    opener = Opener(lambda ref: FakeBackend("ok", name=ref, n_ctx=100))
    too_long = words("long", 60)

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await send(pilot, "hello")
            await finished(pilot, 2)
            await send(pilot, too_long)
            # Said at once: no dropping or summarising of earlier turns is offered first.
            await until_screen(pilot, app, ErrorScreen, "the dialog")
            assert not isinstance(app.screen, ContextFullScreen)
            assert app.screen.title_text == "The message is too long for this model"
            assert "even alone" in app.screen.message and "100" in app.screen.message
            assert [b.id for b in app.screen.query("Button")] == ["edit", "new"]
            await pilot.click("#edit")
            await until(pilot, lambda: app.query_one(ChatInput).text == too_long,
                        "the message is back in the input")
            assert [m.content for m in app.chat.messages] == ["hello", "ok"]
            assert app.chat.context_start == 0  # nothing was sent: nothing stays dropped
            assert not app.query(ContextNote)

            # The first message of a chat: there is nothing to drop, so no Drop is offered.
            await pilot.press("ctrl+n")
            old_id = app.chat.id
            app.query_one(ChatInput).load_text(too_long)
            await pilot.press("enter")
            await until_screen(pilot, app, ErrorScreen, "the dialog")
            assert app.screen.title_text == "The message is too long for this model"
            await pilot.click("#new")
            await until(pilot, lambda: app.chat.id != old_id, "a new chat")
            assert app.query_one(ChatInput).text == too_long and not app.chat.messages

    run(main())
    opener.close()


# --- the real model ---------------------------------------------------------------------------
@pytest.mark.model
def test_chat_with_the_starter_model_through_a_real_daemon(home, monkeypatch, starter_path):
    from localinfer.config import Config
    from localinfer.loading import engine_factory

    with serve(engine_factory(Config(ctx=2048)), tcp=False) as daemon:
        monkeypatch.setenv("LOCALINFER_HOST", f"unix:{daemon.socket}")

        async def main():
            app = create_app("gemma3:270m")  # this machine's own hardware profile
            async with app.run_test(size=(100, 32)) as pilot:
                await until(pilot, lambda: app.session is not None or app.load_error,
                            "the starter model is loaded", timeout_s=240)
                assert app.load_error is None, app.load_error
                assert app.session.info.name == "gemma3:270m-q4_k_m"
                assert "CPU only" in text_of(app.query_one("#status-model")) or \
                    "GPU" in text_of(app.query_one("#status-model"))
                await until(pilot, lambda: app.hardware is not None and
                            app.hardware.host_bandwidth_gbps > 0, "the bandwidth",
                            timeout_s=120)
                app.chat.max_tokens = 24
                app.chat.temperature = 0.0
                await send(pilot, "The capital of France is")
                await finished(pilot, 2)
                reply = app.chat.messages[-1]
                assert reply.content.strip() and reply.finish_reason in ("stop", "length")
                s = reply.stats
                assert s.decode_tps > 0 and s.ttft_ms > 0 and s.prompt_tokens > 5
                assert s.roofline_pct is not None and 0 < s.roofline_pct < 100
                assert "% of roofline" in text_of(app.query(AssistantMessage).last()
                                                  .query_one(".summary"))
                assert "predicted" in text_of(app.query_one("#status-roofline"))

        run(main())


# --- starting the daemon ----------------------------------------------------------------------
def _stop(client) -> None:
    from localinfer.instance import running_daemon

    client.shutdown()
    client.close()
    deadline = time.monotonic() + 30
    while running_daemon() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running_daemon() is None


def test_a_daemon_is_started_in_the_background_when_none_runs(home, monkeypatch):
    from localinfer.config import Config
    from localinfer.instance import running_daemon
    from localinfer.session import Launcher

    monkeypatch.delenv("LOCALINFER_HOST", raising=False)
    launcher = Launcher(Config(), serve_args=["--no-tcp"])
    steps = []
    client = launcher.client(steps.append)
    try:
        assert [s.message for s in steps] == ["Starting the localinfer daemon…"]
        info = running_daemon()
        assert info["pid"] == launcher.started_daemon_pid and info["url"] is None
        assert client.status()["loaded"] == []
        assert launcher.client() is client  # reused while it answers
        command = open(f"/proc/{info['pid']}/cmdline", "rb").read().split(b"\0")
        assert command[-5:-1] == [b"serve", b"--idle-exit", b"1800", b"--no-tcp"]
    finally:
        _stop(client)
    assert "listening on unix:" in (home / "cache" / "daemon.log").read_text()


def test_a_busy_port_falls_back_to_the_unix_socket(home, monkeypatch):
    import socket

    from localinfer.config import load_config
    from localinfer.instance import running_daemon
    from localinfer.session import Launcher

    monkeypatch.delenv("LOCALINFER_HOST", raising=False)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    monkeypatch.setenv("LOCALINFER_PORT", str(taken.getsockname()[1]))
    try:
        launcher = Launcher(load_config())
        client = launcher.client()
        try:
            assert running_daemon()["url"] is None  # started again with --no-tcp
        finally:
            _stop(client)
    finally:
        taken.close()
    assert "in use" in (home / "cache" / "daemon.log").read_text()


# --- pulling ----------------------------------------------------------------------------------
pytest_plugins = ["hub_fixtures"]  # the local Hub of the store's pull tests


def test_a_pull_shows_progress_and_a_cancelled_pull_is_shown(hub_home, local_hub):
    from localinfer.store import ModelStore

    local_hub.faults.pause_at = 30_000_000
    opener = Opener()

    async def main():
        app = in_process_app(opener)
        async with app.run_test(size=(100, 32)) as pilot:
            await ready(pilot)
            await pilot.press("ctrl+o")
            screen = app.screen
            await until(pilot, lambda: screen.rows, "the plan")
            row = next(i for i, r in enumerate(screen.rows) if r.name.startswith(
                "tinygemma:270m"))
            screen.query_one("DataTable").move_cursor(row=row)
            await pilot.press("p")
            await until(pilot, lambda: local_hub.faults.paused.is_set(), "the download")
            await until(pilot, lambda: screen.query_one("#pull-bar").progress > 0,
                        "the progress bar moves")
            assert screen.query_one("#pull-row").display
            assert "MB" in text_of(screen.query_one("#pull-text"))
            await pilot.press("escape")  # cancels the pull, not the screen
            assert screen.pulling and isinstance(app.screen, ModelsScreen)
            local_hub.release()
            await until_screen(pilot, app, ErrorScreen, "the dialog")
            assert app.screen.title_text == "Pull cancelled"
            assert "resumes" in app.screen.message
            await pilot.pause()
            await pilot.click("#ok")
            assert not screen.pulling and not screen.query_one("#pull-row").display
        assert ModelStore().installed() == [] and ModelStore().partials()
        opener.close()

    run(main())


def test_the_status_names_a_split_over_workers():
    # A model split over workers showed "CPU only".
    import dataclasses

    from localinfer.tui.figures import placement

    info = dataclasses.replace(FakeBackend().info, split=(
        ("CPU", 6), ("127.0.0.1:18500 #0", 6), ("127.0.0.1:18510 #0", 7)))
    assert placement(info) == "CPU 6 + 13 layers on 2 workers"
    assert placement(FakeBackend().info) == "CPU only"
