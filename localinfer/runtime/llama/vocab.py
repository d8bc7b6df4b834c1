"""The vocabulary: tokenizing and spelling tokens, and the scan of every token's attributes
that finds the tokens no sampler may pick (unused, control, media placeholders) and a
harmony vocabulary's markers."""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import time
from collections.abc import Callable

import llama_cpp as L
import numpy as np

from ...errors import InvalidRequest, LocalInferError
from .native import LlamaHandles

log = logging.getLogger(__package__)

# Words in the text of a token that stands for an image, a sound or a video in a multimodal
# model's prompt (<start_of_image>, <image_soft_token>, <|vision_start|>, [multimodal]).
_MEDIA_WORDS = ("image", "audio", "video", "vision", "multimodal")
# Control tokens that open a tool call (Mistral's [TOOL_CALLS], Llama's <|python_tag|>,
# Phi-4's <|tool_call|>): the model means them as output, and tool calling parses them.
_TOOL_WORDS = ("tool", "python")


# OpenAI's harmony format (gpt-oss) writes its messages' structure with these; a reply is
# made of them (runtime/thinking.py and tools.py parse it), <|return|> and <|call|> end it.
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>",
                  "<|return|>", "<|call|>")


def never_sampled_tokens(attrs: np.ndarray, *, is_eog: Callable[[int], bool],
                  text: Callable[[int], str]) -> np.ndarray:
    """The tokens a text-only runtime must never emit, from llama.cpp's attribute of each
    token (``attrs[token]``): unused and unknown tokens; control tokens that do not end the
    generation (<bos>, <pad>, <start_of_turn>), which mean nothing as text; and the
    placeholders of images, sounds and videos, which only a multimodal prompt holds.
    User-defined tokens stay (Qwen's <think> and <tool_call> are printed and parsed), and so
    do control tokens that open a tool call and, in a harmony vocabulary, the harmony
    markers. ``text`` is asked only about the few control and user-defined tokens: a
    vocabulary has hundreds among a quarter of a million."""
    unused = L.LLAMA_TOKEN_ATTR_UNUSED | L.LLAMA_TOKEN_ATTR_UNKNOWN
    banned = [token for token in np.flatnonzero(attrs & unused).tolist() if not is_eog(token)]
    named = _named_specials(attrs, is_eog=is_eog, text=text)
    kept = set(_harmony_markers(named))
    for token, name in named.items():
        name = name.lower()
        if token not in kept and (any(word in name for word in _MEDIA_WORDS) or (
                attrs[token] & L.LLAMA_TOKEN_ATTR_CONTROL
                and not any(word in name for word in _TOOL_WORDS))):
            banned.append(token)
    return np.array(sorted(banned), dtype=np.intp)


def harmony_tokens(attrs: np.ndarray, *, is_eog: Callable[[int], bool],
                   text: Callable[[int], str]) -> list[int]:
    """The harmony markers that do not end the generation, in a harmony vocabulary (one that
    has <|channel|> and <|message|>); none in any other."""
    return _harmony_markers(_named_specials(attrs, is_eog=is_eog, text=text))


def _named_specials(attrs: np.ndarray, *, is_eog: Callable[[int], bool],
                    text: Callable[[int], str]) -> dict[int, str]:
    """The text of each control or user-defined token that is used and does not end the
    generation."""
    unused = L.LLAMA_TOKEN_ATTR_UNUSED | L.LLAMA_TOKEN_ATTR_UNKNOWN
    special = np.flatnonzero((attrs & (L.LLAMA_TOKEN_ATTR_CONTROL
                                       | L.LLAMA_TOKEN_ATTR_USER_DEFINED) != 0)
                             & (attrs & unused == 0))
    return {token: text(token) for token in special.tolist() if not is_eog(token)}


def _harmony_markers(named: dict[int, str]) -> list[int]:
    markers = {name: token for token, name in named.items() if name in HARMONY_TOKENS}
    if "<|channel|>" not in markers or "<|message|>" not in markers:
        return []
    return sorted(markers.values())


class VocabScan(LlamaHandles):
    """LlamaBackend's vocabulary: the scan at load and the token texts."""

    _printed_markers: frozenset[int]
    _special: np.ndarray
    _special_texts: dict[int, bytes]
    _pieces: dict[int, bytes]
    _piece_buf: ctypes.Array[ctypes.c_char]
    max_special_bytes: int

    def _scan_vocab(self) -> np.ndarray:
        """``never_sampled_tokens`` of this vocabulary (and its harmony markers, printed as
        text). Reading the attribute of each of the starter's 262k tokens takes 80 ms of CPU
        on a 2-core x86 (one ctypes call each), sorting out its 6,400 special ones 5 ms
        more; it bans 6,250 (6,242 <unusedN>, <pad>, <bos>, <unk>, <mask>, <start_of_turn>,
        [multimodal], <start_of_image> and <end_of_image>)."""
        started = time.perf_counter()
        vocab, n = self._vocab, self._n_vocab
        attrs = np.fromiter(map(L.llama_vocab_get_attr, itertools.repeat(vocab, n), range(n)),
                            dtype=np.int32, count=n)

        # Cached: the banned tokens and the harmony markers both read the special ones.
        @functools.cache
        def text(token: int) -> str:
            return (L.llama_vocab_get_text(vocab, token) or b"").decode(errors="replace")

        @functools.cache
        def is_eog(token: int) -> bool:
            return bool(L.llama_vocab_is_eog(vocab, token))

        banned = never_sampled_tokens(attrs, is_eog=is_eog, text=text)
        self._printed_markers = frozenset(harmony_tokens(attrs, is_eog=is_eog, text=text))
        """Control tokens token_bytes prints: a harmony model's markers."""
        # The tokens llama.cpp's tokenizer reads whole out of a text (its special tokens cache).
        self._special = (attrs & (L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_USER_DEFINED
                                  | L.LLAMA_TOKEN_ATTR_UNKNOWN)) != 0
        self._special_texts: dict[int, bytes] = {}
        self.max_special_bytes = max(
            (len(L.llama_vocab_get_text(vocab, token) or b"")
             for token in np.flatnonzero(self._special).tolist()), default=0)
        log.debug("%d of %d tokens are never sampled (vocabulary scanned in %.0f ms)",
                  len(banned), n, (time.perf_counter() - started) * 1000.0)
        return banned

    def _fim_texts(self) -> tuple[str, str, str] | None:
        ids = (L.llama_vocab_fim_pre(self._vocab), L.llama_vocab_fim_suf(self._vocab),
               L.llama_vocab_fim_mid(self._vocab))
        if any(i < 0 for i in ids):
            return None
        return tuple(self._special_text(i) for i in ids)  # type: ignore[return-value]

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        n = L.llama_token_to_piece(self._vocab, token, self._piece_buf, 256, 0, True)
        return self._piece_buf.raw[: max(n, 0)].decode(errors="replace")

    # --- tokens (the Backend contract) ---------------------------------------------------
    def max_token_bytes(self) -> int:
        # A token's text in the vocabulary is never shorter than what it spells: SPM's
        # "\u2581" (3 bytes) is a space, "<0x0A>" one byte.
        longest: int | None = getattr(self, "_max_token_bytes", None)
        if longest is None:
            vocab = self._vocab
            longest = self._max_token_bytes = max(
                len(L.llama_vocab_get_text(vocab, token) or b"")
                for token in range(self._n_vocab))
        return longest

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800"): not text
            raise InvalidRequest(f"the prompt contains {exc.object[exc.start:exc.end]!r},"
                                 " an unpaired UTF-16 surrogate, which is not text; send"
                                 " whole characters.") from None
        n_max = len(data) + 8
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, True)
        if n < 0 and -n > n_max:
            # More tokens than bytes: a vocabulary whose byte fallback spells a character
            # in several tokens. llama.cpp said how many: ask again with room for them.
            n_max = -n
            buf = (L.llama_token * n_max)()
            n = L.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, True)
        if n < 0:
            raise LocalInferError(f"tokenization failed ({n})")
        return list(buf[:n])

    def rank_tokens(self, query: str, document: str) -> list[int]:
        vocab = self._vocab
        eos = L.llama_vocab_eos(vocab)
        if eos < 0:
            eos = L.llama_vocab_sep(vocab)
        tokens = [L.llama_vocab_bos(vocab)] if L.llama_vocab_get_add_bos(vocab) else []
        tokens += self.tokenize(query, add_special=False)
        if L.llama_vocab_get_add_eos(vocab):
            tokens.append(eos)
        if L.llama_vocab_get_add_sep(vocab):
            tokens.append(L.llama_vocab_sep(vocab))
        tokens += self.tokenize(document, add_special=False)
        if L.llama_vocab_get_add_eos(vocab):
            tokens.append(eos)
        return tokens

    def token_bytes(self, token: int) -> bytes:
        """The token's text; a control token's is empty, but for the harmony markers of a
        harmony vocabulary (gpt-oss's replies are parsed by them)."""
        piece = self._pieces.get(token)
        if piece is None:
            special = token in self._printed_markers
            buf = ctypes.create_string_buffer(256)  # its own: prompts are spelled on any thread
            n = L.llama_token_to_piece(self._vocab, token, buf, 256, 0, special)
            if n < 0:  # longer than the buffer
                big = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self._vocab, token, big, -n, 0, special)
                piece = big.raw[:n]
            else:
                piece = buf.raw[:n]
            self._pieces[token] = piece
        return piece

    def special_piece(self, token: int) -> bytes | None:
        if not self._special[token]:
            return None
        text = self._special_texts.get(token)
        if text is None:
            buf = ctypes.create_string_buffer(256)  # its own: prompts tokenize on any thread
            n = L.llama_token_to_piece(self._vocab, token, buf, 256, 0, True)
            text = self._special_texts[token] = buf.raw[:max(n, 0)]
        return text

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self._vocab, token))
