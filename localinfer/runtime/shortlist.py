"""The few tokens a grammar is asked about so that sampling among the ones it allows is exactly
sampling among all it allows (the grammar over the whole vocabulary, then top-k, top-p, min-p).

Asking the grammar about the whole vocabulary costs ~65 ns a token, 17 ms for a 262k-token
vocabulary: most of a small model's decode step. The tokens the truncating samplers can keep
are the best allowed ones by logit, so the walk asks about the logits in bands, largest first,
and stops as soon as the tokens not yet asked about cannot change what the chain keeps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LOGIT_BANDS = (0.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0)
"""How far below the largest logit each band of the walk reaches (0: the largest alone, which
is all greedy decoding usually needs); past the last, the whole vocabulary is asked about."""

_MARGIN = 1e-4
"""Relative slack on top-p's sums, so that a cut decided here is not one that float32
rounding in llama.cpp could move."""


@dataclass(frozen=True)
class Truncation:
    """What the sampler chain keeps of the tokens the grammar allows, as far as the walk needs
    it. The chain runs (after any never-sampled bias) top-k, typical-p, top-p, min-p, then
    temperature and the draw; typical-p and mirostat need the whole list."""

    greedy: bool = False
    top_k: int = 0
    """0: off."""
    top_p: float = 1.0
    """1: off."""
    min_p: float = 0.0
    """0: off."""
    whole: bool = False
    """The chain needs every allowed token (typical-p, mirostat, penalties or a logit bias,
    which reorder the logits): the walk is skipped."""


def best_allowed(logits: np.ndarray, allows: Callable[[np.ndarray], np.ndarray],
                 truncation: Truncation) -> np.ndarray | None:
    """The ids, in id order, of the allowed tokens the walk found: the chain, run on these
    alone, keeps the same tokens with the same probabilities as on the whole vocabulary with
    the grammar applied. None when the walk could not show that: the caller asks about the
    whole vocabulary. ``allows(ids)`` is the grammar's verdict on each of ``ids``;
    ``logits`` holds -inf for tokens no chain picks."""
    if truncation.whole:
        return None
    top = float(logits.max())
    if not math.isfinite(top):
        return None
    near = np.flatnonzero(logits >= top - LOGIT_BANDS[-1])
    values = logits[near]
    found: list[np.ndarray] = []
    upper = math.inf
    for gap in LOGIT_BANDS:
        lower = top - gap
        band = near[(values >= lower) & (values < upper)]
        upper = lower
        if len(band):
            allowed = band[allows(band)]
            if len(allowed):
                found.append(allowed)
        if found and _settled(np.concatenate(found), logits, lower, truncation,
                              n_unasked=len(logits) - int(np.count_nonzero(values >= lower))):
            return np.sort(np.concatenate(found))
    return None


def _settled(allowed: np.ndarray, logits: np.ndarray, lower: float, truncation: Truncation,
             *, n_unasked: int) -> bool:
    """Whether the chain keeps the same tokens from ``allowed`` (the grammar's choice among
    every token whose logit is at least ``lower``) as from all the allowed tokens, of which
    the others have logits below ``lower``."""
    n = len(allowed)
    if truncation.greedy:
        return True
    k = truncation.top_k
    if k and n >= k:  # top-k keeps the k best: every other token is below them
        return True
    # Top-k keeps all of ``allowed`` and at most ``unseen`` tokens more, each below ``lower``.
    unseen = k - n if k else n_unasked
    best = np.sort(logits[allowed].astype(np.float64))[::-1]
    head = best[0]
    # Min-p drops every token below head + ln(min_p): the unseen ones too, when below that.
    if truncation.min_p > 0.0:
        floor = head + math.log(truncation.min_p)
        kept_by_min_p = int(np.count_nonzero(best >= floor))
        unseen_dropped = lower <= floor - _MARGIN  # llama.cpp rounds its floor in float32
    else:
        kept_by_min_p, unseen_dropped = n, False
    if truncation.top_p >= 1.0:
        return unseen_dropped
    # Top-p keeps the shortest head whose share of the sum reaches top_p. The chain run on
    # ``allowed`` alone divides by their sum; the whole list's sum is larger by the unseen
    # tokens' share, at most ``unseen`` x exp(lower). The cut is the same for every sum in
    # between when it is the same at both ends; min-p then cuts at the same place.
    sums = np.cumsum(np.exp(best - head))
    seen = sums[-1]
    most = seen + unseen * math.exp(lower - head)

    def cut(total: float) -> int:
        return int(np.searchsorted(sums, truncation.top_p * total, side="left")) + 1

    low, high = cut(seen * (1 - _MARGIN)), cut(most * (1 + _MARGIN))
    if unseen_dropped and low >= kept_by_min_p:
        return True  # min-p alone decides, on the seen tokens
    return low == high and high <= n
