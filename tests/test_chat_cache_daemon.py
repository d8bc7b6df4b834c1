"""A chat's next turn finds its conversation cached on an engine with many slots (the daemon's
eight), even where the reply it resends reads back as other tokens than were sampled."""

from __future__ import annotations

import pytest

from localinfer.runtime.types import Message, SamplingParams

GREEDY = SamplingParams(temperature=0)
QUESTIONS = ("Question: What is 2+2? Answer:", "Question: What is 3+3? Answer:")


def reply_read_back_otherwise(words: int) -> str:
    """A reply with a control token early (it prints as nothing, so the resent text parts
    from the sampled tokens there: as the starter's "=" "?" came back as "=?"), then
    ``words`` words, ending in no white space (so its next turn's opening is read ahead)."""
    return "Four. <pad>" + " ".join(["more"] * words)


def two_turns(engine) -> tuple[int, int, int]:
    """(the first turn's prompt tokens, what the second turn found cached, the tokens the
    second turn shares with the slot the first turn ran in)."""
    chat = [Message("user", QUESTIONS[0])]
    first = engine.chat(chat, GREEDY).result()
    assert first.finish_reason == "stop"
    held = [list(s.cached) for s in engine._slots if s.cached]
    assert len(held) == 1
    chat += [Message("assistant", first.text), Message("user", QUESTIONS[1])]
    second = engine.chat(chat, GREEDY).result()
    shared = next(n for n in range(len(held[0])) if held[0][n] != engine.chat_tokens(chat)[n])
    return first.usage.prompt_tokens, second.usage.cached_tokens, shared


@pytest.mark.parametrize("window", [None, 64], ids=["full", "sliding-window"])
def test_the_next_turn_keeps_its_conversation_where_the_reply_reads_back_otherwise(
        fake_engine, window):
    """The reply parts from its slot's cache two tokens in, well before half of what the slot
    holds: the next turn still takes that slot and keeps the conversation up to there, not an
    empty slot (which read the whole conversation again: the daemon's cached_tokens 0)."""
    engine = fake_engine(reply=reply_read_back_otherwise(20), n_slots=8, window=window,
                         chat_checkpoints=window is not None)
    n_prompt, cached, shared = two_turns(engine)
    assert shared == n_prompt + 2  # "Four." and " ", then the control token
    assert cached == shared


def test_a_conversation_that_cannot_be_cut_back_is_left_for_an_empty_slot(fake_engine):
    """Where the window has moved past where the resent reply parts from the cache (and no
    checkpoint fits), that slot would read from the start too: the next turn takes an empty
    slot, and the cache of the turn before stays (a regenerated reply still finds it)."""
    engine = fake_engine(reply=reply_read_back_otherwise(40), n_slots=8, window=16,
                         chat_checkpoints=True)
    chat = [Message("user", QUESTIONS[0])]
    first = engine.chat(chat, GREEDY).result()
    kept = list(engine.backend._seqs[0])
    chat += [Message("assistant", first.text), Message("user", QUESTIONS[1])]
    second = engine.chat(chat, GREEDY).result()
    assert second.usage.cached_tokens == 0
    assert engine.backend._seqs[0][:len(kept)] == kept
