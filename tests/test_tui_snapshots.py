"""Snapshots (pytest-textual-snapshot) of the chat UI's main screens, built with the factory the
CLI uses, on the fake backend, a recorded hardware profile and a chat saved with fixed
figures and times: nothing in the picture depends on this machine or the clock.

After a deliberate change of the UI: ``pytest tests/test_tui_snapshots.py --snapshot-update``,
then look at the SVGs in tests/__snapshots__/ before committing them.
"""

from __future__ import annotations

import json
import time

import pytest

from daemon_util import install_fake_models
from localinfer.chats import Chat, ChatMessage, ChatStore, ReplyStats
from localinfer.runtime.fake import FakeBackend
from localinfer.tui.app import create_app
from localinfer.tui.screens import ContextFullScreen, ErrorScreen, ModelsScreen
from tui_util import Opener, in_process_app, laptop, until

FIXED_TIME = 1_700_000_000.0  # 2023-11-14 22:13 UTC
CHAT_ID = "20231114-221320-abcdef"
ANSWER = """\
A list comprehension builds a list in one expression:

```python
squares = [n * n for n in range(10) if n % 2 == 0]
```

- the **expression** (`n * n`) comes first,
- then the loop, then an optional filter.
"""


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def saved_chat() -> Chat:
    """A two-turn chat as the app saves it, with fixed times and measured figures."""
    stats = ReplyStats(prompt_tokens=31, completion_tokens=52, cached_tokens=0, ttft_ms=41.0,
                       prefill_tps=912.0, decode_tps=44.7, finish_reason="stop",
                       roofline_pct=61.0)
    cancelled = ReplyStats(prompt_tokens=97, completion_tokens=9, cached_tokens=83,
                           ttft_ms=22.0, prefill_tps=640.0, decode_tps=43.9,
                           finish_reason="cancelled", roofline_pct=60.2)
    chat = Chat(id=CHAT_ID, title="List comprehensions", created=FIXED_TIME,
                updated=FIXED_TIME, model="fake:1b", max_tokens=256)
    chat.add(ChatMessage("user", "What is a list comprehension?", at=FIXED_TIME))
    chat.add(ChatMessage("assistant", ANSWER, at=FIXED_TIME, model="fake:1b",
                         finish_reason="stop", stats=stats))
    chat.add(ChatMessage("user", "And a dict comprehension?", at=FIXED_TIME))
    chat.add(ChatMessage("assistant", "The same with braces and a key:", at=FIXED_TIME,
                         model="fake:1b", finish_reason="cancelled", stats=cancelled))
    return store_chat(chat)


def store_chat(chat: Chat) -> Chat:
    store = ChatStore()
    store.root.mkdir(parents=True, exist_ok=True)
    # Written as ChatStore.save writes it, but with `updated` left at the fixed time.
    (store.root / f"{chat.id}.json").write_text(json.dumps(chat.to_dict()), encoding="utf-8")
    return chat


async def loaded(pilot) -> None:
    app = pilot.app
    await until(pilot, lambda: app.session is not None or app.load_error is not None,
                "the model is ready")
    await pilot.pause()


def chat_app(**kwargs):
    return in_process_app(Opener(lambda ref: FakeBackend("ok", name=ref)), **kwargs)


def test_main_screen(home, utc, snap_compare):
    saved_chat()
    assert snap_compare(chat_app(resume=CHAT_ID), terminal_size=(80, 24), run_before=loaded)


def test_main_screen_light_and_wide(home, utc, snap_compare):
    saved_chat()
    app = chat_app(resume=CHAT_ID, theme="textual-light")
    assert snap_compare(app, terminal_size=(120, 36), run_before=loaded)


def online(monkeypatch) -> None:
    """Not offline, whatever an earlier test left in the environment (``--offline`` sets
    HF_HUB_OFFLINE for the process): the first run then offers a download."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("LOCALINFER_OFFLINE", raising=False)


def test_new_chat(home, snap_compare):
    assert snap_compare(chat_app(), terminal_size=(80, 24), run_before=loaded)


def test_new_chat_with_a_base_model(home, monkeypatch, snap_compare):
    monkeypatch.setenv("LOCALINFER_OFFLINE", "true")  # the welcome then says how to add one
    app = in_process_app(Opener(lambda ref: FakeBackend("ok", name=ref, base_model=True)))
    assert snap_compare(app, terminal_size=(80, 24), run_before=loaded)


def test_models_screen(home, snap_compare):
    install_fake_models("fake:1b-f16")

    async def open_models(pilot):
        await loaded(pilot)
        await pilot.press("ctrl+o")
        screen = pilot.app.screen
        assert isinstance(screen, ModelsScreen)
        await until(pilot, lambda: screen.rows, "the plan")
        await pilot.pause()

    app = chat_app(model="fake:1b-f16")
    assert snap_compare(app, terminal_size=(100, 30), run_before=open_models)


def test_chats_screen(home, utc, snap_compare):
    saved_chat()

    async def open_chats(pilot):
        await loaded(pilot)
        await pilot.press("ctrl+r")
        await pilot.pause()

    assert snap_compare(chat_app(), terminal_size=(80, 24), run_before=open_chats)


def test_help_screen(home, snap_compare):
    async def open_help(pilot):
        await loaded(pilot)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(chat_app(), terminal_size=(80, 24), run_before=open_help)


def test_context_full_dialog(home, snap_compare):
    chat = Chat(id=CHAT_ID, title="hi", created=FIXED_TIME, updated=FIXED_TIME, model="fake:1b")
    chat.add(ChatMessage("user", "hi", at=FIXED_TIME))
    chat.add(ChatMessage("assistant", "ok", at=FIXED_TIME, model="fake:1b",
                         finish_reason="stop", stats=ReplyStats(
                             prompt_tokens=9, completion_tokens=1, cached_tokens=0,
                             ttft_ms=3.0, prefill_tps=3000.0, decode_tps=0.0,
                             finish_reason="stop")))
    store_chat(chat)
    app = in_process_app(Opener(lambda ref: FakeBackend("ok", name=ref, n_ctx=40)),
                         resume=CHAT_ID)

    async def overflow(pilot):
        await loaded(pilot)
        pilot.app.query_one("ChatInput").insert(" ".join(["word"] * 14))  # fits only alone
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, ContextFullScreen),
                    "the dialog")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=overflow)


def test_message_too_long_dialog(home, snap_compare):
    app = in_process_app(Opener(lambda ref: FakeBackend("ok", name=ref, n_ctx=40)))

    async def overflow(pilot):
        await loaded(pilot)
        pilot.app.query_one("ChatInput").insert(" ".join(["word"] * 30))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, ErrorScreen), "the dialog")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=overflow)


def test_daemon_unreachable(home, monkeypatch, snap_compare):
    monkeypatch.delenv("LOCALINFER_HOST", raising=False)
    app = create_app("fake:1b", hardware=laptop(), start_daemon=False)

    async def failed(pilot):
        await until(pilot, lambda: isinstance(pilot.app.screen, ErrorScreen), "the error")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=failed)


THOUGHT = ("The user asks what a generator is. A generator yields values lazily; I should show"
           " a short example with yield and say when it helps.")


def instruct_chat() -> Chat:
    """A chat with a thinking model: a file attached, a folded reasoning before the answer,
    a reply regenerated once (‹ 2/2 ›), and a summary standing for the turns above it."""
    from localinfer.chats import Attachment

    stats = ReplyStats(prompt_tokens=120, completion_tokens=96, cached_tokens=88,
                       ttft_ms=35.0, prefill_tps=850.0, decode_tps=41.2, finish_reason="stop",
                       roofline_pct=58.0, thought_tokens=41, thought_ms=1020.0,
                       thought_tps=40.2, answer_ttft_ms=1062.0, answer_decode_tps=42.0)
    chat = Chat(id=CHAT_ID, title="Generators", created=FIXED_TIME, updated=FIXED_TIME,
                model="qwen3:8b", max_tokens=256)
    chat.add(ChatMessage("user", "Hello", at=FIXED_TIME))
    chat.add(ChatMessage("assistant", "Hello! How can I help?", at=FIXED_TIME,
                         model="qwen3:8b", finish_reason="stop"))
    chat.add_summary("The user greeted the assistant, who offered help.", 2)
    chat.add(ChatMessage("user", "What does this file's generator do?", at=FIXED_TIME,
                         files=[Attachment("gen.py", "/tmp/gen.py",
                                           "def count():\n    yield 1\n", 12)]))
    first = ChatMessage("assistant", "It counts.", at=FIXED_TIME, model="qwen3:8b",
                        finish_reason="stop", stats=stats, thinking="I will be brief.")
    chat.add(ChatMessage("assistant", "`count()` is a **generator**: each `next()` runs it"
                         " to the next `yield`, so it gives 1 and then stops.", at=FIXED_TIME,
                         model="qwen3:8b", finish_reason="stop", stats=stats,
                         thinking=THOUGHT, alternatives=[first], version=1))
    return store_chat(chat)


def thinking_app(**kwargs):
    return in_process_app(Opener(lambda ref: FakeBackend("ok", name=ref)), model="qwen3:8b",
                          **kwargs)


def test_a_thinking_reply_regenerated_with_a_file_and_a_summary(home, utc, snap_compare):
    instruct_chat()
    assert snap_compare(thinking_app(resume=CHAT_ID), terminal_size=(100, 30),
                        run_before=loaded)


def test_the_reasoning_unfolded_wide(home, utc, snap_compare):
    instruct_chat()

    async def unfold(pilot):
        await loaded(pilot)
        block = pilot.app.query("ThoughtBlock").last()
        block.collapsed = False
        await pilot.pause()

    assert snap_compare(thinking_app(resume=CHAT_ID), terminal_size=(160, 45),
                        run_before=unfold)


def test_settings_with_the_model_defaults(home, snap_compare):
    async def open_settings(pilot):
        await loaded(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()

    assert snap_compare(thinking_app(), terminal_size=(100, 30), run_before=open_settings)


def test_a_file_chip(home, tmp_path, snap_compare):
    path = tmp_path / "notes.txt"
    path.write_text("alpha beta gamma delta\n")

    async def attach(pilot):
        await loaded(pilot)
        pilot.app.query_one("ChatInput").insert(f"/file {path}")
        await pilot.press("enter")
        await until(pilot, lambda: pilot.app.conversation.files, "attached")
        await pilot.pause()

    assert snap_compare(chat_app(), terminal_size=(100, 30), run_before=attach)


def test_first_run_offers_an_instruct_model(home, monkeypatch, snap_compare):
    online(monkeypatch)
    app = in_process_app(Opener(lambda ref: FakeBackend("ok", name=ref, base_model=True)),
                         model="gemma3:270m")

    async def offered(pilot):
        await loaded(pilot)
        await until(pilot, lambda: pilot.app.query("#offer-download"), "the offer")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(100, 30), run_before=offered)
