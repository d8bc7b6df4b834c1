"""Log-probabilities in each API's shape: OpenAI chat's ``logprobs.content`` (also Ollama's
``logprobs``: the same entries), and the legacy completions' parallel lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..runtime.types import TokenLogprob


def entry_json(entry: TokenLogprob) -> dict[str, Any]:
    """One token as OpenAI chat completions and Ollama send it."""
    return {"token": entry.text, "logprob": entry.logprob, "bytes": list(entry.data),
            "top_logprobs": [{"token": t.text, "logprob": t.logprob, "bytes": list(t.data)}
                             for t in entry.top]}


def entries_json(entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    return [entry_json(e) for e in entries]


def completion_json(entries: Sequence[TokenLogprob], *, offset: int = 0) -> dict[str, Any]:
    """The legacy ``/v1/completions`` shape; ``offset`` is where the first token's text
    starts in the whole reply."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.text)
    return {"tokens": [e.text for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.text: t.logprob for t in e.top} for e in entries],
            "text_offset": offsets}
