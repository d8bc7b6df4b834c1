"""Speculative decoding by prompt lookup: guess the next tokens from what came before.

When the output repeats its input (an editor asking to rewrite a function with one change, a
model quoting its context), the tokens after the current n-gram's earlier occurrence are a good
draft. The engine verifies a draft in one batched step and keeps the longest prefix the model
agrees with, so the output is the model's own; only its speed changes.

Verifying costs more than a single-token step (every drafted position needs its logits), so
the draft length adapts: it doubles while drafts are fully accepted, shrinks to what was
accepted otherwise, and after a draft is rejected outright drafting pauses for a few steps.

Why at most 3 drafted tokens: a step of 1 + 3 rows is the best value per token (starter
model, 2-core x86: 1 row 21.5 ms, 4 rows 31.5 ms, 5-7 rows 46-53 ms), and on some CPUs
llama.cpp's matrix kernels compute batches of up to 7 rows like single rows (at 8 they switch
to a faster kernel that rounds differently); how a batch rounds depends on the CPU's
instruction set. Attention is the other half: flash attention computes a single-token step
over 512 or more cells with a split-KV kernel whose reduction rounds differently from the
multi-row kernel that verifies a draft, so on the CPU it is off by default
(runtime.llama.flash_attn_type). Measured on the starter's code edit: identical to plain
decoding without flash attention on AVX-512 and AVX2-only builds; with a q8_0 KV cache (which
needs flash attention) the text parts at token 259, at a near tie. Where greedy text parts,
it parts only where two tokens nearly tie (tests/test_engine_real.py).
"""

from __future__ import annotations

NGRAM_SIZES = (4, 3, 2)
"""Try the longest n-gram first: a longer match predicts the continuation better."""
MIN_DRAFT = 2
MAX_DRAFT = 3
EXACT_ROWS = 7
"""Largest batch that llama.cpp's CPU matrix kernels compute with the single-row kernels (on
some CPUs exactly like single rows; on others they round apart at near ties)."""


class PromptLookup:
    """Drafts for one sequence from an index of its own tokens (prompt and output)."""

    def __init__(self, tokens: list[int]) -> None:
        self.history: list[int] = list(tokens)
        # n-gram -> the position right after its latest occurrence. An n-gram is indexed only
        # once a token follows it, so the current tail never matches itself. Built on the
        # first draft, so that indexing a long prompt never delays the first token.
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in NGRAM_SIZES}
        self._indexed = 0
        # Where the last draft was copied from, and how long the history was then: a copy
        # keeps following its source rather than the latest look-alike n-gram.
        self._source: int | None = None
        self._source_len = 0
        self.draft_len = MIN_DRAFT
        self._pause = 0
        self._misses = 0

    def extend(self, tokens: list[int]) -> None:
        self.history.extend(tokens)

    def _update_index(self) -> None:
        history = self.history
        for end in range(max(self._indexed, 1), len(history)):
            # ``end`` is the position of a token: index the n-grams that end just before it.
            for n, index in self._index.items():
                if end >= n:
                    index[tuple(history[end - n:end])] = end
        self._indexed = len(history)

    def draft(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens predicted to follow the history ([] when none)."""
        if self._pause > 0:
            self._pause -= 1
            return []
        k = min(self.draft_len, limit)
        if k <= 0:
            return []
        self._update_index()
        history = self.history
        start = None
        if self._source is not None:
            follow = self._source + len(history) - self._source_len
            m = min(NGRAM_SIZES[0], follow)
            if 0 < follow < len(history) and history[follow - m:follow] == history[-m:]:
                start = follow  # still copying the same passage
        if start is None:
            for n in NGRAM_SIZES:
                if len(history) >= n:
                    start = self._index[n].get(tuple(history[-n:]))
                    if start is not None:
                        break
        if start is None:
            self._source = None
            return []
        self._source, self._source_len = start, len(history)
        return history[start:start + k]

    def feedback(self, drafted: int, accepted: int) -> None:
        """Adapt the draft length to how much of the last draft the model accepted."""
        if accepted == drafted:
            self.draft_len = min(self.draft_len * 2, MAX_DRAFT)
            self._misses = 0
        elif accepted == 0:
            self._misses += 1
            self.draft_len = MIN_DRAFT
            self._pause = min(2 ** self._misses, 32)  # back off while drafts keep failing
        else:
            self.draft_len = max(MIN_DRAFT, accepted + 1)
            self._misses = 0
