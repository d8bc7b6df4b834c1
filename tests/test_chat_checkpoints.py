"""A chat on a window cache that can be cut back only a little (the starter's with 256-row
batches) keeps checkpoints where its turn and its reply began, so that a regenerated reply or
an edited last message reuses the conversation after a reply longer than the reach."""

from __future__ import annotations

import pytest

import localinfer.runtime.engine as engine_module
from localinfer.protocol import Message
from localinfer.runtime.engine import CHECKPOINT_MIN_TOKENS, REREAD_TAIL
from localinfer.runtime.types import SamplingParams
from test_engine_fake import OPENING, read_ahead

WINDOW = 48
"""The fake's cut reach: a sequence cannot be cut back further without a checkpoint."""
LONG_REPLY = " ".join(f"w{i}" for i in range(3 * WINDOW))
QUESTION = " ".join(f"q{i}" for i in range(80))  # longer than the reach
GREEDY = SamplingParams(temperature=0, max_tokens=400)


@pytest.fixture(autouse=True)
def no_read_ahead(monkeypatch):
    """The engine reads the next turn's opening ahead only where a test asks (and takes a
    checkpoint there): not when a slow machine happens to pause between two requests."""
    monkeypatch.setattr(engine_module, "READ_AHEAD_IDLE_S", 60.0)


@pytest.fixture
def chat_engine(fake_engine):
    def make(reply: str = LONG_REPLY, *, checkpoints: bool = True):
        engine = fake_engine(reply=reply, n_slots=1, n_ctx=4096, window=WINDOW,
                             chat_checkpoints=checkpoints)
        taken: list[int] = []
        save = engine.backend.seq_checkpoint

        def counted(seq_id: int, reuse: list[int] | None = None) -> list[int]:
            state = save(seq_id, reuse)
            taken.append(len(state))
            return state

        engine.backend.seq_checkpoint = counted  # type: ignore[method-assign]
        return engine, taken
    return make


def ask(engine, messages):
    return engine.chat(messages, GREEDY).result()


@pytest.mark.parametrize("checkpoints", [True, False])
def test_a_regenerated_reply_reuses_the_conversation_past_the_reach(chat_engine, checkpoints):
    engine, taken = chat_engine(checkpoints=checkpoints)
    messages = [Message("user", QUESTION)]
    first = ask(engine, messages)
    assert first.usage.completion_tokens > WINDOW  # the reply moved the window past its start
    again = ask(engine, messages)
    reply_start = len(engine.chat_tokens(messages)) - REREAD_TAIL
    if checkpoints:
        # A prompt longer than the reach: its reading stopped where the reply would begin,
        # for a checkpoint there, which the regenerated reply restores.
        assert taken == [reply_start]
        assert again.usage.cached_tokens == reply_start
        assert engine.backend.restored == [reply_start]
    else:  # the control: without it the prompt is read again whole
        assert taken == [] and again.usage.cached_tokens == 0
    assert again.text == first.text


@pytest.mark.parametrize("long_question", [False, True])
def test_an_edited_last_message_reuses_the_turns_before_it(chat_engine, long_question):
    engine, taken = chat_engine()
    question = " ".join(f"x{i}" for i in range(2 * WINDOW)) if long_question else "next one"
    history = [Message("user", QUESTION)]
    history.append(Message("assistant", ask(engine, history).text))
    before = len(taken)
    second = ask(engine, [*history, Message("user", question)])
    kept = second.usage.cached_tokens  # where the second turn's reading began
    assert kept >= CHECKPOINT_MIN_TOKENS
    # One checkpoint where the turn began, taken before reading it; a message longer than the
    # reach also one where its reply began.
    assert taken[before] == kept and len(taken) - before == (2 if long_question else 1)
    edited = [*history, Message("user", "edited " + question)]
    assert ask(engine, edited).usage.cached_tokens == kept
    # The edited turn regenerated: from where its reply began if its message is longer than
    # the reach, else from where the turn began (its short message read again).
    reply_start = len(engine.chat_tokens(edited)) - REREAD_TAIL
    assert ask(engine, edited).usage.cached_tokens == (reply_start if long_question else kept)


def test_a_short_first_turn_takes_no_checkpoint(chat_engine):
    engine, taken = chat_engine(reply="short answer")
    messages = [Message("user", "a short question")]
    ask(engine, messages)
    again = ask(engine, messages)
    assert taken == [] and engine.backend.restored == []
    assert again.usage.cached_tokens == len(engine.chat_tokens(messages)) - REREAD_TAIL


def test_a_checkpoint_held_already_is_not_taken_again(chat_engine):
    engine, taken = chat_engine()
    messages = [Message("user", QUESTION)]
    for _ in range(3):
        ask(engine, messages)
    assert len(taken) == 1 and len(engine.backend.restored) == 2


def test_the_next_turns_checkpoint_is_taken_while_idle_not_on_its_way(chat_engine,
                                                                        monkeypatch):
    monkeypatch.setattr(engine_module, "READ_AHEAD_IDLE_S", 0.0)
    engine, taken = chat_engine()
    history = [Message("user", QUESTION)]
    history.append(Message("assistant", ask(engine, history).text))
    assert read_ahead(engine) == OPENING
    begins = taken[-1]  # after the opening read ahead: where the next turn's message begins
    before = len(taken)
    second = ask(engine, [*history, Message("user", "next one")])
    assert second.usage.cached_tokens == begins
    assert begins not in taken[before:]  # not again before its first token: it was held
    edited = ask(engine, [*history, Message("user", "edited one")])
    assert edited.usage.cached_tokens == begins and engine.backend.restored[-1] == begins
    assert edited.text == second.text


def test_the_idle_checkpoint_leaves_a_long_last_turns_own(chat_engine, monkeypatch):
    """After a message longer than the reach, the slot holds where that turn and its reply
    began: the next turn's checkpoint is not taken while idle in place of either, so an
    edited last message still comes back from where its turn began."""
    engine, taken = chat_engine()
    history = [Message("user", QUESTION)]
    history.append(Message("assistant", ask(engine, history).text))
    monkeypatch.setattr(engine_module, "READ_AHEAD_IDLE_S", 0.0)
    before = len(taken)
    history.append(Message("user", "turn two " + QUESTION))
    history.append(Message("assistant", ask(engine, history).text))
    assert len(taken) - before == 2  # where turn two began, where its reply began
    begins = taken[before]
    assert read_ahead(engine) == OPENING  # the idle engine took no checkpoint there
    assert len(taken) - before == 2
    edited = ask(engine, [*history[:-2], Message("user", "edited " + QUESTION)])
    assert edited.usage.cached_tokens == begins and engine.backend.restored[-1] == begins


def test_checkpoints_are_saved_into_the_memory_of_those_they_replace(chat_engine):
    """A long chat takes two checkpoints a turn (the first turn one, where its reply began);
    from the third on, each overwrites the oldest (the
    fake, like llama.cpp, writes into the state passed), and the conversation of another
    chat in the same slot overwrites the dropped ones. The fake fails a restore of a state
    that was written over while still held."""
    engine, taken = chat_engine()
    history: list[Message] = []
    for turn in range(4):
        history.append(Message("user", f"turn {turn} " + QUESTION))
        history.append(Message("assistant", ask(engine, history).text))
    assert len(taken) == 7 and engine.backend.checkpoints_reused == 5
    fourth_begins = taken[-2]
    again = ask(engine, history[:-1])  # the last reply regenerated
    reply_start = len(engine.chat_tokens(history[:-1])) - REREAD_TAIL
    assert again.usage.cached_tokens == reply_start and again.text == history[-1].content
    edited = [*history[:-2], Message("user", "edited " + QUESTION)]
    assert ask(engine, edited).usage.cached_tokens == fourth_begins
    reused = engine.backend.checkpoints_reused
    other = ask(engine, [Message("user", "another chat " + QUESTION)])  # the same, one slot
    assert other.usage.cached_tokens < CHECKPOINT_MIN_TOKENS
    assert engine.backend.checkpoints_reused == reused + 1  # a dropped one's memory


def test_questions_in_turn_after_one_chat_share_its_checkpoint(chat_engine):
    """Questions asked one after another at the end of one conversation (each replacing the
    last) part at the turn's start or a word or two after it: the checkpoint taken there for
    the first serves them all, and an edit after a long reply still comes back through it."""
    engine, taken = chat_engine(reply="short answer")
    history = [Message("user", QUESTION)]
    history.append(Message("assistant", ask(engine, history).text))
    before = len(taken)
    ask(engine, [*history, Message("user", "tell me first")])
    assert len(taken) == before + 1
    begins = taken[-1]  # where the first question's turn began
    for question in ("which two are alike", "which one is oldest", "what else is there"):
        reply = ask(engine, [*history, Message("user", question)])
        assert reply.usage.cached_tokens >= begins
    assert len(taken) == before + 1  # none taken again on the way to their first tokens
    long_edit = " ".join(f"e{i}" for i in range(3 * WINDOW))
    ask(engine, [*history, Message("user", long_edit)])  # the window moves past the start
    back = ask(engine, [*history, Message("user", "which one again")])
    assert back.usage.cached_tokens == begins and engine.backend.restored[-1] == begins
