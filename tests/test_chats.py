"""Chat history: saved atomically per chat, listed newest first, unreadable files left alone."""

from __future__ import annotations

import json
import os

import pytest

from localinfer.chats import Chat, ChatError, ChatMessage, ChatStore, ReplyStats, make_title
from localinfer.errors import InvalidRequest
from localinfer.runtime.types import Done, Message, Timings, Usage


def stats(**kw) -> ReplyStats:
    values = {"prompt_tokens": 10, "completion_tokens": 5, "cached_tokens": 0, "ttft_ms": 12.0,
              "prefill_tps": 800.0, "decode_tps": 40.0, "finish_reason": "stop",
              "roofline_pct": 55.0}
    return ReplyStats(**{**values, **kw})


def a_chat(store: ChatStore, *turns: tuple[str, str], **settings) -> Chat:
    chat = store.new(**settings)
    for question, answer in turns:
        chat.add(ChatMessage("user", question))
        chat.add(ChatMessage("assistant", answer, model="m", finish_reason="stop",
                             stats=stats()))
    return chat


def test_round_trip_keeps_messages_settings_and_stats(home):
    store = ChatStore()
    chat = a_chat(store, ("What is 2+2?", "4"), system_prompt="Be brief.", temperature=0.2,
                  max_tokens=64)
    store.save(chat)
    loaded = store.load(chat.id)
    assert loaded.title == "What is 2+2?"
    assert (loaded.system_prompt, loaded.temperature, loaded.max_tokens) == ("Be brief.", 0.2, 64)
    assert [(m.role, m.content) for m in loaded.messages] == [("user", "What is 2+2?"),
                                                              ("assistant", "4")]
    assert loaded.messages[1].stats == stats()
    assert loaded.params().max_tokens == 64 and loaded.params().temperature == 0.2
    assert (home / "data" / "chats" / f"{chat.id}.json").is_file()


def test_nothing_is_written_until_a_save(home):
    store = ChatStore()
    store.new()
    assert store.summaries() == [] and not (home / "data" / "chats").exists()


def test_list_is_newest_first_and_latest_resumes_it(home):
    store = ChatStore()
    first = a_chat(store, ("one", "1"))
    store.save(first)
    second = a_chat(store, ("two", "2"))
    store.save(second)
    os.utime(store.root / f"{first.id}.json")  # mtime does not matter: `updated` does
    assert [s.title for s in store.summaries()] == ["two", "one"]
    store.save(first)  # a new message in the first chat makes it the newest
    assert [s.title for s in store.summaries()] == ["one", "two"]
    assert store.latest().id == first.id
    assert store.summaries()[0].n_messages == 2


def test_prompt_messages_skip_failed_replies_and_dropped_turns(home):
    chat = a_chat(ChatStore(), ("q1", "a1"), ("q2", "a2"), system_prompt="sys")
    chat.add(ChatMessage("user", "q3"))
    chat.add(ChatMessage("assistant", "", finish_reason="error", error="daemon gone"))
    chat.add(ChatMessage("user", "q3 again"))
    # The unanswered q3 is left out: user and assistant turns alternate.
    assert [m.content for m in chat.prompt_messages()] == ["sys", "q1", "a1", "q2", "a2",
                                                           "q3 again"]
    assert chat.drop_oldest_turn()
    assert chat.prompt_messages()[:3] == [Message("system", "sys"), Message("user", "q2"),
                                          Message("assistant", "a2")]
    while chat.drop_oldest_turn():
        pass
    assert [m.content for m in chat.prompt_messages()] == ["sys", "q3 again"]
    assert len(chat.messages) == 7  # dropped turns stay in the transcript


def test_a_cancelled_reply_is_kept_and_sent_again(home):
    chat = a_chat(ChatStore())
    chat.add(ChatMessage("user", "tell me"))
    chat.add(ChatMessage("assistant", "Once upon", finish_reason="cancelled"))
    assert chat.prompt_messages()[-1] == Message("assistant", "Once upon")
    assert chat.last_reply().content == "Once upon"


def test_a_crash_while_saving_leaves_the_previous_version(home, monkeypatch):
    store = ChatStore()
    chat = a_chat(store, ("first question", "first answer"))
    store.save(chat)
    other = a_chat(store, ("other", "chat"))
    store.save(other)
    before = (store.root / f"{chat.id}.json").read_bytes()

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    chat.add(ChatMessage("user", "second question"))
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(ChatError, match="Earlier chats are unchanged"):
        store.save(chat)
    monkeypatch.undo()
    assert (store.root / f"{chat.id}.json").read_bytes() == before
    # No temporary file is left behind either.
    assert sorted(p.name for p in store.root.iterdir()) == sorted(
        [f"{chat.id}.json", f"{other.id}.json"])
    assert len(store.load(chat.id).messages) == 2
    assert len(store.load(other.id).messages) == 2


def test_unreadable_files_are_skipped_and_left_alone(home):
    store = ChatStore()
    good = a_chat(store, ("fine", "yes"))
    store.save(good)
    broken = store.root / "20240101-000000-abcdef.json"
    broken.write_text("{ not json", encoding="utf-8")
    newer = store.root / "20240101-000001-abcdef.json"
    newer.write_text(json.dumps({"schema": 99, "id": "x"}), encoding="utf-8")
    (store.root / "notes.txt").write_text("mine", encoding="utf-8")
    nested = store.root / "20240101-000002-abcdef.json"
    nested.write_text("[" * 100_000, encoding="utf-8")  # deeper than Python's json recurses
    assert [s.id for s in store.summaries()] == [good.id]
    for path in (broken, nested):
        with pytest.raises(ChatError, match="left as it is"):
            store.load(path.stem)
    assert broken.read_text(encoding="utf-8") == "{ not json"
    # Listed, so that resuming the latest chat can say a newer one was left out.
    assert set(store.unreadable()) == {broken, newer, nested}


def test_rename_and_delete(home):
    store = ChatStore()
    chat = a_chat(store, ("a long first message " * 10, "ok"))
    store.save(chat)
    assert len(store.summaries()[0].title) <= 60 and store.summaries()[0].title.endswith("…")
    store.rename(chat.id, "  Trip   planning ")
    assert store.load(chat.id).title == "Trip planning"
    with pytest.raises(InvalidRequest):
        store.rename(chat.id, "   ")
    store.delete(chat.id)
    assert store.summaries() == []
    with pytest.raises(ChatError, match="no chat"):
        store.load(chat.id)


@pytest.mark.parametrize("bad", ["../../etc/passwd", "x", "20240101-000000-ABCDEF/../a"])
def test_chat_ids_cannot_reach_outside_the_folder(home, bad):
    with pytest.raises(InvalidRequest):
        ChatStore().load(bad)


def test_reply_stats_from_a_done_event():
    done = Done("hi", "length", Usage(20, 8, cached_tokens=12),
                Timings(prompt_tokens=20, cached_tokens=12, prefill_tokens=8, prefill_ms=10.0,
                        ttft_ms=15.0, completion_tokens=8, decode_tokens=7, decode_ms=100.0))
    s = ReplyStats.from_done(done, 61.234)
    assert (s.prompt_tokens, s.completion_tokens, s.cached_tokens) == (20, 8, 12)
    assert (s.prefill_tps, s.decode_tps, s.ttft_ms) == (800.0, 70.0, 15.0)
    assert s.roofline_pct == 61.2 and s.context_tokens == 28 and s.finish_reason == "length"


def test_make_title():
    assert make_title("  hello\n  world ") == "hello world"
    assert make_title("x" * 100).endswith("…") and len(make_title("x" * 100)) == 60
