"""Chat prompts tokenized from where they part from a recent one (runtime/prompt_cache.py): the
same tokens as tokenizing the whole text, on the fake backend and on the real tokenizer."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localinfer.runtime.fake import FakeBackend
from localinfer.runtime.prompt_cache import PromptTokenizer, _Prompt, _split, common_prefix
from localinfer.runtime.types import Message

PARAGRAPH = ("The committee met on a grey Tuesday morning to review the budget. Revenue grew"
             " by eleven percent, while costs rose faster than planned. ")


def whole(engine, text: str) -> list[int]:
    """The tokens of ``text`` read all at once, as prompt_tokens reads a new prompt."""
    return engine.backend.tokenize(text, add_special=not text.startswith("<bos>"))


def conversation(turns: int) -> list[Message]:
    messages = []
    for i in range(turns):
        messages.append(Message("user", f"Turn {i + 1}. Tell me more. " + PARAGRAPH * 3))
        messages.append(Message("assistant", f"Here is turn {i + 1}. " + PARAGRAPH))
    return messages


def test_each_turn_reuses_the_last_and_gives_the_same_tokens(fake_engine):
    engine = fake_engine()
    messages: list[Message] = []
    last_user = len(whole(engine, "<start_of_turn>user\nQuestion 0? " + PARAGRAPH))
    previous = 0
    for i in range(5):
        messages.append(Message("user", f"Question {i}? " + PARAGRAPH))
        text = engine.render_chat(messages)
        reused = engine._prompts.reused_tokens
        tokens = engine.prompt_tokens(text)
        assert tokens == whole(engine, text)
        # All of the last prompt but its user message (within the longest special token).
        gained = engine._prompts.reused_tokens - reused
        assert gained >= previous - last_user - 8
        previous = len(tokens)
        messages.append(Message("assistant", f"Answer {i}. " + PARAGRAPH))
    assert gained > previous // 2  # the 5th turn: most of it


def test_an_edited_earlier_message_reuses_only_what_comes_before_it(fake_engine):
    engine = fake_engine()
    messages = conversation(4)
    engine.prompt_tokens(engine.render_chat(messages))
    before = engine._prompts.reused_tokens
    messages[2] = Message("user", "Something else entirely. " + PARAGRAPH)
    text = engine.render_chat(messages)
    assert engine.prompt_tokens(text) == whole(engine, text)
    head = whole(engine, engine.render_chat(messages[:2]))
    assert 0 < engine._prompts.reused_tokens - before <= len(head)


def test_special_token_text_in_a_message_and_odd_whitespace(fake_engine):
    engine = fake_engine()
    rng = random.Random(1)
    pieces = ["Hello", " world", "<start_of_turn>", "<end_of_turn>", "\n", "  ", "é", "🙂",
              "<", ">", "start_of_turn", "\t", "   \n\n", "<bos>", PARAGRAPH]
    for _ in range(30):
        messages = []
        for turn in range(4):
            content = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 10)))
            messages.append(Message("user" if turn % 2 == 0 else "assistant", content))
            text = engine.render_chat(messages)
            assert engine.prompt_tokens(text) == whole(engine, text)
    assert engine._prompts.reused_tokens > 0


def test_a_tokenizer_that_adds_a_bos_is_not_reused():
    backend = FakeBackend()
    prompts = PromptTokenizer(lambda text, add: backend.tokenize(text, add_special=add),
                              backend.special_piece, backend.token_bytes,
                              backend.max_special_bytes)
    text = "<start_of_turn>user\n" + PARAGRAPH * 4 + "<end_of_turn>\n"
    for extra in ("<start_of_turn>model\n", "<start_of_turn>model\nHi<end_of_turn>\n"):
        assert prompts.tokenize(text + extra, add_special=True) == backend.tokenize(
            text + extra, add_special=True)
    assert prompts.reused_tokens == 0


class Lowercasing(FakeBackend):
    """A tokenizer that normalises its text: its tokens do not spell the prompt."""

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        return super().tokenize(text.lower(), add_special=add_special)


def test_tokens_that_do_not_spell_the_text_are_never_reused():
    backend = Lowercasing()
    prompts = PromptTokenizer(lambda text, add: backend.tokenize(text, add_special=add),
                              backend.special_piece, backend.token_bytes,
                              backend.max_special_bytes)
    text = "<bos><start_of_turn>user\nHELLO " + PARAGRAPH * 4 + "<end_of_turn>\n"
    for extra in ("<start_of_turn>model\n", "<start_of_turn>model\nHi<end_of_turn>\n"):
        assert prompts.tokenize(text + extra, add_special=False) == backend.tokenize(
            text + extra, add_special=False)
    assert prompts.reused_tokens == 0


def test_the_split_keeps_the_longest_special_token_away_from_the_difference():
    # Tokens: "a" "<x>" "bb" "<y>" "c"; the texts part after "a<x>bb<y>c".
    specials = {1: b"<x>", 3: b"<y>"}
    plain = {0: b"a", 2: b"bb", 4: b"c"}
    kept = _Prompt(b"a<x>bb<y>c", [0, 1, 2, 3, 4], [1, 4, 6, 9, 10])
    new = b"a<x>bb<y>cZ"
    assert _split(kept, new, 0, specials.get) == 3  # before <y>, which ends at byte 9 <= 10
    assert _split(kept, new, 1, specials.get) == 3
    assert _split(kept, new, 2, specials.get) == 1  # <y> ends within 2 bytes of the end
    assert _split(kept, new, 7, specials.get) is None  # nothing before <x> to keep
    assert _split(kept, b"a<x>Q", 0, specials.get) == 1
    assert plain  # the ordinary tokens are never split before


def test_threads_tokenizing_different_chats_at_once_get_their_own_tokens(fake_engine):
    engine = fake_engine()
    failures = []

    def chat(seed: int) -> None:
        messages: list[Message] = []
        for turn in range(6):
            messages.append(Message("user", f"Chat {seed}, turn {turn}. " + PARAGRAPH))
            text = engine.render_chat(messages)
            if engine.prompt_tokens(text) != whole(engine, text):
                failures.append((seed, turn))
            messages.append(Message("assistant", f"Reply {turn} to chat {seed}."))

    threads = [threading.Thread(target=chat, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert engine._prompts.reused_tokens > 0


@pytest.mark.model
def test_real_tokenizer_gives_the_same_tokens_turn_after_turn(real_engine):
    rng = random.Random(7)
    pieces = ["Hello", " world", "<start_of_turn>", "<end_of_turn>", "\n", "  ", "é", "🙂",
              "<bos>", "<", ">", "<unused5>", "\t", "日本語", PARAGRAPH, "   \n\n",
              "```python\ndef f(x):\n    return x\n```"]
    before = real_engine._prompts.reused_tokens
    for _ in range(20):
        messages = []
        for turn in range(6):
            content = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
            messages.append(Message("user" if turn % 2 == 0 else "assistant", content))
            if turn % 2 == 0:
                text = real_engine.render_chat(messages)
                assert real_engine.prompt_tokens(text) == whole(real_engine, text), text
    messages = conversation(4)
    real_engine.prompt_tokens(real_engine.render_chat(messages[:-1]))
    text = real_engine.render_chat(messages + [Message("user", "Now summarise.")])
    assert real_engine.prompt_tokens(text) == whole(real_engine, text)
    assert real_engine._prompts.reused_tokens - before > 1000


@given(st.lists(st.integers(0, 2), max_size=300), st.lists(st.integers(0, 2), max_size=300),
       st.lists(st.integers(0, 2), max_size=300))
def test_common_prefix_is_where_two_sequences_part(shared, a_rest, b_rest):
    a, b = shared + a_rest, shared + b_rest
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
             min(len(a), len(b)))
    assert common_prefix(a, b) == common_prefix(b, a) == n
    text_a, text_b = "".join(map(str, a)), "".join(map(str, b))
    assert common_prefix(text_a, text_b) == n
