"""Fill-in-the-middle prompts: the tokens a code model reads to complete code at a cursor.

Built as llama-server's ``/infill`` builds them, so editors tuned for it get the same prompt:
repo-level context first (for families with ``<|repo_name|>``/``<|file_sep|>`` tokens, such as
Qwen2.5-Coder: the repository, then each extra file under its name, then the current file's
name; for others each extra file after a ``--- snippet ---`` line), then the prefix and the
text typed at the cursor, the suffix, and the middle token that asks for the completion. Most
families read prefix then suffix (PSM); a family trained suffix first (SPM) gets that order, in
which the suffix, which changes less often than the text before the cursor, comes first and
its KV cache is reused by the next keystroke's request.

The prefix, typed text and suffix are taken to fit one batch of ``FIM_BATCH`` tokens, as
llama-server takes them: the suffix's start in a quarter of it (with the typed text), the
prefix's end (next to the cursor) in the rest. When it does not all fit the context either,
with room left to generate, they shrink in the same 3:1 ratio, and whole extra files are left
out from the first (the farthest), so that what stays keeps its KV cache from keystroke to
keystroke.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import InvalidRequest
from .types import ModelInfo

REPO_NAME = "myproject"
"""The repository name written after ``<|repo_name|>``: llama-server's, which editors tuned
for it expect (no client sends one)."""
CURRENT_FILE = "filename"
"""The current file's name after the last ``<|file_sep|>`` (llama-server's placeholder)."""
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
"""Between extra files, for families without file tokens (llama-server's)."""
CUT_STEP = 256
"""A prefix too long loses its head in steps of this many tokens."""
FIM_BATCH = 1024
"""The prefix, typed text and suffix take at most this many tokens (llama-server's batch size
in llama.vscode's and llama.vim's settings, ``-b 1024``): one batch reads them, and a
keystroke's request reads again only the typed text and the suffix after it."""

FIM_TEXT_CHARS = 64 * FIM_BATCH
"""Of a prefix, its last this many characters are tokenized, and of a suffix its first (cut
at a line's start or end): far more than FIM_BATCH tokens of any text, and llama.cpp's
tokenizer takes time that grows faster than the text (a 5 MB prefix ran for minutes, out of
reach of a cancel; llama-server refuses such a body)."""


def _prefix_tail(text: str) -> str:
    """The prefix as tokenized: the whole, or from a line's start in its last FIM_TEXT_CHARS
    characters. That start moves in steps of a quarter of them, so that it stays put, and the
    prompt's cache with it, while the user types."""
    if len(text) <= FIM_TEXT_CHARS:
        return text
    step = FIM_TEXT_CHARS // 4
    start = -(-(len(text) - FIM_TEXT_CHARS) // step) * step
    line = text.find("\n", start, start + step)
    return text[line + 1 if line >= 0 else start:]


def _suffix_head(text: str) -> str:
    """The suffix as tokenized: its first FIM_TEXT_CHARS characters, to a line's end."""
    if len(text) <= FIM_TEXT_CHARS:
        return text
    end = text.rfind("\n", 0, FIM_TEXT_CHARS)
    return text[:end + 1 if end >= 0 else FIM_TEXT_CHARS]


@dataclass(frozen=True)
class FimFile:
    """An extra file (or a chunk of one) the editor sends as context."""

    filename: str
    text: str


class FimTokens(list[int]):
    """A FIM prompt's tokens, and where the text typed at the cursor begins in them
    (``cursor``; None where the client sent none apart): the next keystroke's prompt parts
    from this one there or after it, so the engine keeps the cache's state there
    (``CacheKeeper.reuse``), which a sliding-window cache could not otherwise be cut back
    to past the reply that follows."""

    cursor: int | None = None


class _Tokenizer(Protocol):
    fim_repo: tuple[str, str] | None
    fim_spm: bool

    def tokenize(self, text: str, *, add_special: bool) -> list[int]: ...


def fim_prompt(backend: _Tokenizer, info: ModelInfo, prefix: str, suffix: str, *,
               prompt: str | None = None, extra: Sequence[FimFile] = (),
               n_predict: int | None = None) -> FimTokens:
    """The FIM prompt's tokens (``info.fim`` must be set); ``prompt``, the text typed at the
    cursor sent apart from the prefix (llama-server's /infill), even empty: then its
    ``cursor`` is where the prefix ends (None: the prefix runs to the cursor, whose last
    token the next keystroke's may not share)."""
    assert info.fim is not None, "fim_prompt needs a model with FIM tokens"
    pre, suf, mid = info.fim

    def tokens(text: str) -> list[int]:
        return backend.tokenize(text, add_special=False) if text else []

    header: list[int] = []
    files: list[list[int]] = []
    repo = backend.fim_repo
    if repo is not None:
        header = tokens(f"{repo[0]}{REPO_NAME}\n")
    for file in extra:
        mark = f"{repo[1]}{file.filename or 'tmp'}\n" if repo is not None else SNIPPET_SEPARATOR
        files.append(tokens(mark) + tokens(file.text))
    current = tokens(f"{repo[1]}{CURRENT_FILE}\n") if repo is not None else []

    if prompt is not None and len(prompt) > FIM_TEXT_CHARS:
        raise InvalidRequest(f"the text typed at the cursor ('prompt') is {len(prompt):,}"
                             f" characters: at most {FIM_TEXT_CHARS:,} are read.")
    prefix_tokens = tokens(_prefix_tail(prefix))
    suffix_tokens = tokens(_suffix_head(suffix))
    typed = tokens(prompt or "")
    marks = tokens(pre) + tokens(suf) + tokens(mid)
    bos = backend.tokenize("", add_special=True) if info.add_bos else []
    n_ctx = info.n_ctx
    reserve = n_predict if n_predict and n_predict > 0 else max(16, n_ctx // 8)
    budget = (n_ctx - min(reserve, n_ctx // 2) - len(marks) - len(bos) - len(typed)
              - len(header) - len(current))
    if budget <= 0:
        raise InvalidRequest(f"the text typed at the cursor ('prompt') leaves no room in the"
                             f" context of {n_ctx} tokens.")
    # As llama-server: the suffix's start, in a quarter of FIM_BATCH with the typed text.
    suffix_tokens = suffix_tokens[:max(0, FIM_BATCH // 4 - len(typed))]
    window = max(0, min(budget, FIM_BATCH - len(typed)))
    if len(prefix_tokens) + len(suffix_tokens) > window:
        n_suffix = min(len(suffix_tokens), window // 4)
        n_prefix = min(len(prefix_tokens), window - n_suffix)
        # The prefix loses its head in whole steps, so that it stays put (and its KV cache
        # stays reusable) while the user types.
        drop = -(-(len(prefix_tokens) - n_prefix) // CUT_STEP) * CUT_STEP
        prefix_tokens = prefix_tokens[min(drop, len(prefix_tokens)):]
        suffix_tokens = suffix_tokens[:n_suffix]
    room = budget - len(prefix_tokens) - len(suffix_tokens)
    while files and sum(map(len, files)) > room:
        files.pop(0)  # whole files, the farthest first: what stays keeps its cache
    extra_tokens = header + [t for f in files for t in f] + current

    head = tokens(pre) + prefix_tokens + typed
    tail = tokens(suf) + suffix_tokens
    first, second = (tail, head) if backend.fim_spm else (head, tail)
    out = FimTokens(bos + extra_tokens + first + second + tokens(mid))
    if prompt is not None:
        before = len(bos) + len(extra_tokens) + (len(tail) if backend.fim_spm else 0)
        out.cursor = before + len(head) - len(typed)
    return out
