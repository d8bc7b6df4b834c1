"""Log-probabilities of generated tokens, from the raw logits llama.cpp computes.

They are the log-softmax of the model's logits before any sampling step (no temperature, no
top-k/top-p/min-p, no penalties or biases), as llama-server reports them with ``n_probs``
by default and as OpenAI documents them: the model's own distribution, the same whatever the
sampling settings. Computed only for requests that ask (a pass over the vocabulary per token).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .types import TokenLogprob


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """``log(softmax(logits))`` in float64, stable for large logits; a new array."""
    row = np.asarray(logits, dtype=np.float64)
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def token_logprob(logprobs: np.ndarray, token: int, n_top: int,
                  piece: Callable[[int], bytes]) -> TokenLogprob:
    """The entry for ``token`` sampled from the distribution ``logprobs`` (a log-softmax row),
    with its ``n_top`` most likely alternatives, most likely first."""
    top: tuple[TokenLogprob, ...] = ()
    if n_top > 0:
        n = min(n_top, len(logprobs))
        best = np.argpartition(-logprobs, n - 1)[:n]
        best = best[np.argsort(-logprobs[best], kind="stable")]
        top = tuple(_entry(int(t), float(logprobs[t]), piece) for t in best)
    return _entry(token, float(logprobs[token]), piece, top)


def _entry(token: int, logprob: float, piece: Callable[[int], bytes],
           top: tuple[TokenLogprob, ...] = ()) -> TokenLogprob:
    data = piece(token)
    return TokenLogprob(data.decode("utf-8", errors="replace"), data, logprob, top)
