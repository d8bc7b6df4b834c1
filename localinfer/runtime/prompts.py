"""Prompts as the model reads them: a chat rendered with the model's template, a raw
completion, a fill-in-the-middle request, an embedding's input, each turned into tokens.

The engine holds one ``PromptBuilder`` and its public prompt methods (``chat_tokens``,
``infill_tokens``...) are this one's, through ``Prompting``. Rendered chat prompts are
tokenized through the prompt cache (prompt_cache.py), which reuses the tokens of a recent
prompt that starts alike.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ContextOverflow, InvalidRequest
from .backend import Backend
from .chat_template import ChatTemplate
from .fim import FimFile, FimTokens, fim_prompt
from .prompt_cache import PromptTokenizer
from .tools import ToolFormat, detect_format
from .types import Message, ModelInfo

log = logging.getLogger(__name__)


SURE_CHARS_PER_TOKEN = 8
"""A text of more characters than this per token of room is measured against the longest
token before it is tokenized (shorter ones are tokenized quickly, and counted)."""


class PromptBuilder:
    """One model's prompts: its chat template, its tokenizer, its FIM and embedding limits."""

    def __init__(self, backend: Backend, chat_template: ChatTemplate | None = None) -> None:
        self.backend = backend
        self.info: ModelInfo = backend.info
        self.template = chat_template or template_for(self.info)
        """The template chats are rendered with (the model's, its family's, or the caller's)."""
        self.tokenizer = PromptTokenizer(
            lambda text, add_special: backend.tokenize(text, add_special=add_special),
            backend.special_piece, backend.token_bytes, backend.max_special_bytes)
        """Rendered chat prompts to tokens, reusing a recent prompt's (prompt_cache.py)."""
        self._turn_marks: tuple[list[int], list[int]] | None = None
        """(a chat prompt's last tokens, the next user turn's opening): ``chat_turn_marks``."""
        self._turn_marks_known = False

    def completion_tokens(self, prompt: str) -> list[int]:
        if not prompt:
            raise InvalidRequest("prompt must not be empty.")
        self._refuse_surely_too_long(prompt)
        return self.backend.tokenize(prompt, add_special=True)

    def _surely_more_tokens(self, text: str, n_tokens: int) -> int:
        """A lower bound of the tokens ``text`` takes, where it is more than ``n_tokens``,
        known without tokenizing it (its bytes over the most one token spells); else 0.
        llama.cpp's tokenizer takes time that grows faster than the text (1 MB: ~27 s on a
        2-core x86, and no cancel stops it) only to be told that it does not fit."""
        if len(text) <= SURE_CHARS_PER_TOKEN * n_tokens:
            return 0  # tokenized quickly; the count decides
        longest = self.backend.max_token_bytes()
        if longest <= 0:
            return 0
        least = len(text.encode("utf-8", "surrogatepass")) // longest
        return least if least > n_tokens else 0

    def _refuse_surely_too_long(self, text: str) -> None:
        """Refuse, before it is tokenized, a prompt that no context of this model could hold
        (its length in bytes tells): more than it was trained for, not the context loaded
        now, which a daemon grows for a long prompt."""
        info = self.info
        limit = info.most_context
        least = self._surely_more_tokens(text, limit - 1)
        if least:
            raise ContextOverflow(
                f"the prompt is at least {least:,} tokens ({len(text):,} characters), more than"
                f" any context of {info.name} holds ({limit} tokens: what it was trained for)."
                " Shorten it.", n_prompt=least, n_ctx=limit)

    def check_prompt(self, prompt: Sequence[int]) -> None:
        """Refuse a prompt this model cannot generate after."""
        info, n_ctx = self.info, self.info.n_ctx
        if info.embedding_only:
            raise InvalidRequest(f"{info.name} is an embedding model: it returns vectors"
                                 " and generates no text. Use /api/embed or /v1/embeddings,"
                                 " or a chat or code model here.")
        if not prompt:
            raise InvalidRequest("the prompt is empty after tokenization.")
        if len(prompt) >= n_ctx:
            fix = ("Shorten the prompt, start a new chat, or load the model with a larger"
                   " context (--ctx)." if not info.n_ctx_train or n_ctx < info.n_ctx_train else
                   f"Shorten the prompt or start a new chat ({n_ctx} tokens is the most"
                   f" {info.name} was trained for).")
            raise ContextOverflow(
                f"the prompt is {len(prompt)} tokens but the context window is {n_ctx} tokens"
                f" (and at least one token must be left to generate). {fix}",
                n_prompt=len(prompt),
                n_ctx=n_ctx,
            )

    def infill_tokens(self, prefix: str, suffix: str, *, prompt: str | None = None,
                      extra: Sequence[FimFile] = (), n_predict: int | None = None,
                      ) -> FimTokens:
        """The FIM prompt, built as llama-server's /infill builds it (see fim.py): ``extra``
        files as repo-level context (``<|file_sep|>`` for families that have it), then prefix,
        ``prompt`` (text typed at the cursor), suffix, in the family's order."""
        if self.info.fim is None:
            raise InvalidRequest(f"{self.info.name} has no fill-in-the-middle tokens; use a"
                                 " code model (e.g. qwen2.5-coder) for completions with a"
                                 " suffix.")
        return fim_prompt(self.backend, self.info, prefix, suffix, prompt=prompt,
                          extra=extra, n_predict=n_predict)

    @property
    def template_source(self) -> str:
        """The Jinja source chats are rendered with (the model's, its family's, or one the
        caller gave)."""
        return self.template.source

    def render_chat(self, messages: Sequence[Message], *,
                    add_generation_prompt: bool = True,
                    tools: Sequence[dict[str, Any]] | None = None,
                    template_vars: Mapping[str, Any] | None = None) -> str:
        return self.template.render(messages, add_generation_prompt=add_generation_prompt,
                                     tools=tools, template_vars=template_vars)

    def chat_tokens(self, messages: Sequence[Message], *,
                    add_generation_prompt: bool = True,
                    tools: Sequence[dict[str, Any]] | None = None,
                    template_vars: Mapping[str, Any] | None = None) -> list[int]:
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt,
                                tools=tools, template_vars=template_vars)
        return self.prompt_tokens(text)

    def prompt_tokens(self, text: str) -> list[int]:
        """A rendered chat prompt's tokens."""
        self._refuse_surely_too_long(text)
        return self.tokenizer.tokenize(text, add_special=self.adds_bos(text))

    def adds_bos(self, text: str) -> bool:
        """Whether a rendered prompt needs the tokenizer's BOS: templates usually write it
        themselves; it is added only when they do not."""
        bos = self.info.bos_text
        return not (bos and text.startswith(bos))

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return self.backend.tokenize(text, add_special=add_special)

    def piece(self, token: int) -> bytes:
        """What ``token`` stands for, a special token's text included (``<end_of_turn>``),
        as llama-server's ``/tokenize`` and ``/detokenize`` spell it."""
        check_ids([token], self.info.n_vocab)
        special = self.backend.special_piece(token)
        return special if special is not None else self.backend.token_bytes(token)

    def embedding_tokens(self, text: str, *, truncate: bool = True) -> list[int]:
        """``text`` as the model reads it for an embedding: cut to the embedding context
        when ``truncate``, else refused when longer."""
        if not isinstance(text, str) or not text:
            raise InvalidRequest("an input to embed must be a non-empty string.")
        n_max = self.backend.n_ctx_embed
        least = self._surely_more_tokens(text, n_max)
        if least and not truncate:
            raise ContextOverflow(
                f"an input is at least {least:,} tokens ({len(text):,} characters) but"
                f" {self.info.name} embeds at most {n_max} at a time; shorten it, or split"
                " it into parts.", n_prompt=least, n_ctx=n_max)
        if least:  # only its start is read: tokenize what that can be
            text = text[:n_max * self.backend.max_token_bytes()]
        return self.embedding_input(self.backend.tokenize(text, add_special=True),
                                    truncate=truncate)

    def embedding_input(self, tokens: list[int], *, truncate: bool = True) -> list[int]:
        n_max = self.backend.n_ctx_embed
        if not tokens:
            raise InvalidRequest("an input to embed must not be empty.")
        if any(not 0 <= t < self.info.n_vocab for t in tokens):
            raise InvalidRequest(f"token ids must be between 0 and {self.info.n_vocab - 1}.")
        if len(tokens) <= n_max:
            return tokens
        if not truncate:
            raise ContextOverflow(
                f"an input is {len(tokens)} tokens but {self.info.name} embeds at most"
                f" {n_max} at a time; shorten it, or split it into parts.",
                n_prompt=len(tokens), n_ctx=n_max)
        return tokens[:n_max]

    def rank_inputs(self, query: str, documents: Sequence[str]) -> list[list[int]]:
        """Each (query, document) pair as a reranker reads it; a refusal for a model that is
        no reranker, no documents, or a pair longer than it reads at once."""
        if not self.info.reranker:
            raise InvalidRequest(
                f"{self.info.name} is not a reranker: its GGUF declares no rank pooling. Use a"
                " reranker model (e.g. bge-reranker-v2-m3 or qwen3-reranker).")
        if not documents:
            raise InvalidRequest("there is nothing to rank: send at least one document.")
        inputs = [self.backend.rank_tokens(query, doc) for doc in documents]
        limit = self.backend.n_ctx_embed
        for i, tokens in enumerate(inputs):
            if len(tokens) > limit:
                raise InvalidRequest(
                    f"the query and documents[{i}] are {len(tokens)} tokens together; this"
                    f" reranker reads at most {limit} at once: shorten the document (or the"
                    " query).")
        return inputs

    def tool_format(self) -> ToolFormat:
        """How this model writes a tool call; InvalidRequest (a clear 400) for a model whose
        template has no tools, or writes them in a format localinfer does not parse."""
        if not self.template.supports_tools:
            raise InvalidRequest(f"{self.info.name}'s chat template has no tool support, so"
                                 " it was not taught to call functions: send the request"
                                 " without 'tools', or use a model that has it (qwen3,"
                                 " llama3.1, mistral...).")
        return detect_format(self.template.source)

    def chat_turn_marks(self) -> tuple[list[int], list[int]] | None:
        """(the tokens the template ends a chat prompt with, the tokens it opens the next
        user turn with after a reply), worked out once by rendering a made-up chat; None
        where the template cannot render it or where those texts do not tokenize the same
        alone as in a prompt (the opening must start with a special token: then the reply
        before it cannot merge into it)."""
        if self._turn_marks_known:
            return self._turn_marks
        self._turn_marks_known = True
        first, reply, question = "LocalinferFirst", "LocalinferReply", "LocalinferQuestion"
        try:
            user = [Message("user", first)]
            asked = self.render_chat(user)
            told = self.render_chat(user, add_generation_prompt=False)
            chat = self.render_chat(user + [Message("assistant", reply),
                                            Message("user", question)])
        except Exception as exc:  # noqa: BLE001 - a template's own error: no read-ahead
            log.debug("no next-turn read-ahead: the template cannot render a chat (%s)", exc)
            return None
        end, start = chat.find(reply) + len(reply), chat.find(question)
        if not asked.startswith(told) or asked == told or chat.find(reply) < 0 or start <= end:
            return None
        tokens = self._uncached_prompt_tokens
        generation = self.backend.tokenize(asked[len(told):], add_special=False)
        opening = self.backend.tokenize(chat[end:start], add_special=False)
        head = tokens(chat[:end])
        if (not generation or not opening or tokens(asked)[-len(generation):] != generation
                or self.backend.special_piece(opening[0]) is None
                or tokens(chat)[:len(head) + len(opening)] != head + opening):
            return None
        self._turn_marks = (generation, opening)
        return self._turn_marks

    def _uncached_prompt_tokens(self, text: str) -> list[int]:
        """``prompt_tokens`` without keeping the prompt for reuse (a made-up one)."""
        return self.backend.tokenize(text, add_special=self.adds_bos(text))


class Prompting:
    """The prompt side of an engine, callable from any thread: its ``PromptBuilder``'s
    methods, under the engine's name (``Engine`` derives from it)."""

    prompt_builder: PromptBuilder

    def completion_tokens(self, prompt: str) -> list[int]:
        return self.prompt_builder.completion_tokens(prompt)

    def infill_tokens(self, prefix: str, suffix: str, *, prompt: str | None = None,
                      extra: Sequence[FimFile] = (), n_predict: int | None = None,
                      ) -> FimTokens:
        """The FIM prompt (``PromptBuilder.infill_tokens``)."""
        return self.prompt_builder.infill_tokens(prefix, suffix, prompt=prompt, extra=extra,
                                                 n_predict=n_predict)

    @property
    def chat_template_source(self) -> str:
        """The Jinja source chats are rendered with (the model's, its family's, or one the
        caller gave)."""
        return self.prompt_builder.template_source

    def render_chat(self, messages: Sequence[Message], *,
                    add_generation_prompt: bool = True,
                    tools: Sequence[dict[str, Any]] | None = None,
                    template_vars: Mapping[str, Any] | None = None) -> str:
        return self.prompt_builder.render_chat(
            messages, add_generation_prompt=add_generation_prompt, tools=tools,
            template_vars=template_vars)

    def chat_tokens(self, messages: Sequence[Message], *,
                    add_generation_prompt: bool = True,
                    tools: Sequence[dict[str, Any]] | None = None,
                    template_vars: Mapping[str, Any] | None = None) -> list[int]:
        return self.prompt_builder.chat_tokens(
            messages, add_generation_prompt=add_generation_prompt, tools=tools,
            template_vars=template_vars)

    def prompt_tokens(self, text: str) -> list[int]:
        """A rendered chat prompt's tokens."""
        return self.prompt_builder.prompt_tokens(text)

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return self.prompt_builder.tokenize(text, add_special=add_special)

    def piece(self, token: int) -> bytes:
        return self.prompt_builder.piece(token)

    def embedding_tokens(self, text: str, *, truncate: bool = True) -> list[int]:
        """``text`` as the model reads it for an embedding (``PromptBuilder``)."""
        return self.prompt_builder.embedding_tokens(text, truncate=truncate)

    def embedding_input(self, tokens: list[int], *, truncate: bool = True) -> list[int]:
        return self.prompt_builder.embedding_input(tokens, truncate=truncate)

    def tool_format(self) -> ToolFormat:
        """How this model writes a tool call (``PromptBuilder.tool_format``)."""
        return self.prompt_builder.tool_format()


def template_for(info: ModelInfo) -> ChatTemplate:
    """The model's own chat template, else ChatML."""
    tokens = {"bos_token": info.bos_text, "eos_token": info.eos_text}
    if info.chat_template:
        return ChatTemplate(info.chat_template, **tokens)
    return ChatTemplate.named("chatml", **tokens)  # the loader found no better one


def check_ids(tokens: Sequence[int], n_vocab: int) -> None:
    """Refuse a token id outside the model's vocabulary, naming it (a client's token ids)."""
    for token in tokens:
        if not 0 <= token < n_vocab:
            raise InvalidRequest(f"token {token} is not in the model's vocabulary (0 to"
                                 f" {n_vocab - 1}).")
