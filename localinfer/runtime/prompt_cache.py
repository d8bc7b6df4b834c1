"""Tokenizing a chat prompt that starts like a recent one: only what follows their shared part is
read again.

Each chat turn resends the whole conversation, rendered anew. Tokenizing it all again costs time
before the first token that grows with the conversation: llama.cpp looks for every special token
of the vocabulary in the whole text (the starter's 1,300-token 5th turn: ~4 ms of CPU, a fresh
message 0.1 ms). llama.cpp splits a text at its special tokens (``<start_of_turn>``), left to
right, and tokenizes the text between them piece by piece, so a split that lies where both
prompts agree, more than the longest special token before their first difference, is the same
in both: the new prompt's tokens are the old one's up to a special token there, then the rest
tokenized alone. Each prompt's tokens are kept with where each one ends in its text (the tokens'
bytes, special ones as written); a prompt whose tokens do not spell its text exactly (a
tokenizer that adds a space or normalises) is never reused.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

CAPACITY = 8
"""Prompts kept, the most recently used (each chat resends its conversation, each editor its
file): a few MB each for a long context."""


@dataclass
class _Prompt:
    text: bytes
    tokens: list[int]
    ends: list[int]
    """Where each token's text ends in ``text`` (bytes)."""


class PromptTokenizer:
    """Chat prompts to tokens, reusing the tokens of the recent prompt that shares the longest
    start with each. Thread-safe (the daemon tokenizes on several threads)."""

    def __init__(self, tokenize: Callable[[str, bool], list[int]],
                 special_piece: Callable[[int], bytes | None],
                 token_bytes: Callable[[int], bytes], max_special_bytes: int,
                 capacity: int = CAPACITY) -> None:
        self._tokenize = tokenize
        self._special_piece = special_piece
        self._token_bytes = token_bytes
        self._margin = max_special_bytes
        self._capacity = capacity
        self._prompts: list[_Prompt] = []  # the most recently used last
        self._lock = threading.Lock()
        self._adds: dict[bool, bool] = {}
        self.reused_tokens = 0
        """Tokens taken from a kept prompt instead of tokenized again, in all (for tests)."""

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        if self._adds_tokens(add_special):
            # The tokenizer adds a BOS or EOS of its own: the tokens do not spell the text.
            return self._tokenize(text, add_special)
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # the tokenizer says what is wrong with it
            return self._tokenize(text, add_special)
        with self._lock:
            kept = max(self._prompts, key=lambda p: common_prefix(p.text, data), default=None)
        split = _split(kept, data, self._margin, self._special_piece) if kept else None
        if split is None:
            head, head_ends, start = [], [], 0
        else:
            assert kept is not None  # a split is only found in a kept prompt
            head, head_ends, start = kept.tokens[:split], kept.ends[:split], kept.ends[split - 1]
        tail = self._tokenize(data[start:].decode("utf-8"), add_special)
        tokens = head + tail
        ends = self._spell(tail, data, start, head_ends)
        if ends is not None:
            self._keep(_Prompt(data, tokens, ends))
        if split is not None:
            with self._lock:
                self.reused_tokens += split
        return tokens

    def _adds_tokens(self, add_special: bool) -> bool:
        adds = self._adds.get(add_special)
        if adds is None:
            adds = self._adds[add_special] = bool(self._tokenize("", add_special))
        return adds

    def _spell(self, tail: Sequence[int], data: bytes, start: int, head_ends: list[int]
               ) -> list[int] | None:
        """The ends of every token when the tail's tokens spell ``data[start:]`` exactly,
        else None."""
        ends = list(head_ends)
        at = start
        for token in tail:
            special = self._special_piece(token)
            piece = self._token_bytes(token) if special is None else special
            if data[at:at + len(piece)] != piece:
                return None
            at += len(piece)
            ends.append(at)
        return ends if at == len(data) else None

    def _keep(self, prompt: _Prompt) -> None:
        with self._lock:
            # A prompt that another one starts with adds nothing to it (a chat's last turn).
            self._prompts = [p for p in self._prompts
                             if not (prompt.text.startswith(p.text) or p.text == prompt.text)]
            self._prompts.append(prompt)
            del self._prompts[:-self._capacity]


def _split(kept: _Prompt, data: bytes, margin: int,
           special_piece: Callable[[int], bytes | None]) -> int | None:
    """How many of ``kept``'s tokens the new prompt ``data`` starts with: those before the
    last special token that ends more than ``margin`` bytes before the two texts differ (None
    when there is none). Closer to the difference, a special token of the new text could
    overlap it and split the text elsewhere."""
    limit = common_prefix(kept.text, data) - margin
    k = bisect.bisect_right(kept.ends, limit) - 1  # the last token that ends by the limit
    while k > 0 and special_piece(kept.tokens[k]) is None:
        k -= 1
    return k if k > 0 else None


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many items two sequences (token lists, texts) start with in common.

    Slices compare at C speed, but each one copies its items: blocks that double in size
    from the start find where the sequences part while copying about twice the common
    part, then a binary search within the last block. The engine asks this of every free
    slot for every request; a slot that parts near the start costs a block or two (halving
    from the whole length, as before, copied ~2.5x the length: 34 us a slot for a
    1,200-token chat)."""
    n = min(len(a), len(b))
    lo, size = 0, 32
    while lo < n:
        hi = min(n, lo + size)
        if a[lo:hi] != b[lo:hi]:
            break
        lo, size = hi, 2 * size
    else:
        return n
    while lo < hi - 1:  # a[:lo] == b[:lo], and they part before hi
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
