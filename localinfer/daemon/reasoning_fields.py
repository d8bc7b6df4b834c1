"""A request's thinking, between the wire and the runtime: the template variables its
``think`` / ``reasoning_effort`` asks for, and the splitting of its reply into reasoning
(Ollama's ``thinking``, OpenAI-style ``reasoning_content``) and answer.

Models that do not think reply with content alone. A thinking model's reasoning is split out
whether or not the request said ``think``: left out, the model's template decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidRequest
from ..runtime.engine import Engine
from ..runtime.thinking import (
    EFFORTS,
    Splitter,
    ThinkingSplitter,
    new_splitter,
    starts_thinking,
    template_vars,
    thinking_format,
)
from ..runtime.types import Message


class Thinking:
    """One chat request's thinking. ``chat_tokens`` runs on the model's engine (it knows the
    template); the route then splits each piece of the reply with ``split``."""

    def __init__(self, think: bool | str | None,
                 extra_vars: Mapping[str, Any] | None = None) -> None:
        self.think = think
        self.extra_vars = dict(extra_vars or {})
        self.splitter: Splitter | None = None
        self.opened = False
        """The rendered prompt ends inside an open reasoning block."""

    def chat_tokens(self, engine: Engine, messages: Sequence[Message], *,
                    tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        fmt = thinking_format(engine.chat_template_source)
        variables = {**self.extra_vars,
                     **template_vars(fmt, self.think, model=engine.info.name)}
        text = engine.render_chat(messages, tools=tools, template_vars=variables)
        if fmt is not None:
            self.opened = starts_thinking(fmt, text)
            self.splitter = new_splitter(fmt, text)
        return engine.prompt_tokens(text)

    def reasoning_tags(self) -> tuple[str, str] | None:
        """The tags of the ``<think>`` block a reply may begin with, for a grammar that must
        let the model reason before the constrained part (an empty open tag: the prompt
        opened it); None when the model does not think this way or thinking is off.
        Harmony's answer has a channel header of its own after the reasoning: not here."""
        splitter = self.splitter
        if not isinstance(splitter, ThinkingSplitter) or self.think is False or \
                splitter.fmt.open_tag != "<think>":
            return None
        fmt = splitter.fmt
        return ("" if self.opened else fmt.open_tag, fmt.close_tag)

    def split(self, text: str) -> tuple[str, str]:
        """A piece of the reply as ``(thinking, content)``."""
        return ("", text) if self.splitter is None else self.splitter.push(text)

    def flush(self) -> tuple[str, str]:
        """What the splitter held back, at the end of the reply."""
        return ("", "") if self.splitter is None else self.splitter.flush()

    def whole(self, text: str) -> tuple[str, str]:
        """A whole (non-streamed) reply as ``(thinking, content)``."""
        thinking, content = self.split(text)
        rest_thinking, rest_content = self.flush()
        return thinking + rest_thinking, content + rest_content


def ollama_think(value: Any) -> bool | str | None:
    """Ollama's ``think``: true, false, or an effort ("low", "medium", "high")."""
    if value is None or isinstance(value, bool) or value in EFFORTS:
        return value
    raise InvalidRequest(f"'think' must be true, false, or one of {', '.join(EFFORTS)};"
                         f" got {value!r}.")


_OFF_EFFORTS = ("none", "minimal")


def openai_think(effort: Any, template_kwargs: Any, *, field: str = "reasoning_effort"
                 ) -> Thinking:
    """OpenAI's ``reasoning_effort`` (the Responses API's ``reasoning.effort``, named by
    ``field`` in errors: "none" and "minimal" switch thinking off; "low", "medium", "high"
    switch it on, at that effort where the template takes one) and llama-server's
    ``chat_template_kwargs`` (more variables for the template)."""
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise InvalidRequest("'chat_template_kwargs' must be an object.")
    reserved = {"messages", "add_generation_prompt", "bos_token", "eos_token"} & set(
        template_kwargs or {})
    if reserved:
        raise InvalidRequest(f"'chat_template_kwargs.{sorted(reserved)[0]}' is set by"
                             " localinfer; leave it out.")
    if effort is None:
        return Thinking(None, template_kwargs)
    if effort in _OFF_EFFORTS:
        return Thinking(False, template_kwargs)
    if effort in EFFORTS:
        return Thinking(effort, template_kwargs)
    raise InvalidRequest(f"'{field}' must be one of "
                         f"{', '.join(_OFF_EFFORTS + EFFORTS)}; got {effort!r}.")
