"""A request's thinking, between the wire and the runtime: the template variables its
``think`` / ``reasoning_effort`` asks for, and the splitting of its reply into reasoning
(Ollama's ``thinking``, OpenAI-style ``reasoning_content``) and answer.

Models that do not think reply with content alone. A thinking model's reasoning is split out
whether or not the request said ``think``: left out, the model's template decides.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidRequest
from ..runtime.engine import Engine
from ..runtime.thinking import (
    EFFORTS,
    HARMONY_ANALYSIS,
    HARMONY_TO_FINAL,
    HarmonySplitter,
    Splitter,
    ThinkingFormat,
    ThinkingSplitter,
    new_splitter,
    splitter_for,
    starts_thinking,
    template_vars,
    thinking_format,
)
from ..runtime.types import Message, ReasoningBudget


class Thinking:
    """One chat request's thinking. ``chat_tokens`` runs on the model's engine (it knows the
    template); the route then splits each piece of the reply with ``split``."""

    def __init__(self, think: bool | str | None,
                 extra_vars: Mapping[str, Any] | None = None, *,
                 effort: str | None = None, budget: int | None = None) -> None:
        self.think = think
        self.budget = budget
        """The most tokens the reasoning may take (Anthropic's budget_tokens), if capped."""
        self.extra_vars = dict(extra_vars or {})
        self.effort = effort
        """An effort for a template that takes one (gpt-oss), where the request's API says
        it for the whole reply (Anthropic's output_config.effort): other templates have no
        such setting, and a model that does not think is not refused for it."""
        self.splitter: Splitter | None = None
        self.format: ThinkingFormat | None = None
        """The model's thinking format, once ``chat_tokens`` has rendered the prompt."""
        self.opened = False
        """The rendered prompt ends inside an open reasoning block."""

    def chat_tokens(self, engine: Engine, messages: Sequence[Message], *,
                    tools: Sequence[dict[str, Any]] | None = None, prefill: str = ""
                    ) -> list[int]:
        """The prompt's tokens; ``prefill``: the reply's start, written by the client (the
        reply continues it)."""
        return engine.prompt_tokens(self.chat_text(engine, messages, tools=tools,
                                                   prefill=prefill))

    def chat_text(self, engine: Engine, messages: Sequence[Message], *,
                  tools: Sequence[dict[str, Any]] | None = None, prefill: str = "") -> str:
        """The prompt as the model's template renders it (``chat_tokens``' text)."""
        fmt = self.format = thinking_format(engine.chat_template_source)
        variables = {**self.extra_vars,
                     **template_vars(fmt, self.think, model=engine.info.name)}
        if self.effort and fmt is not None and fmt.takes_effort and self.think is not False:
            variables.setdefault("reasoning_effort", self.effort)
        text = engine.render_chat(messages, tools=tools, template_vars=variables) + prefill
        if fmt is not None:
            self.opened = starts_thinking(fmt, text)
            self.splitter = new_splitter(fmt, text)
        return text

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

    def reasoning_budget(self) -> ReasoningBudget | None:
        """The cap on the reasoning for the sampler, once the prompt is rendered: the
        model's closing tag is forced after ``budget`` reasoning tokens (harmony's: the end
        of the analysis message and the final channel's header, where the answer goes)."""
        splitter = self.splitter
        if self.budget is None or splitter is None or self.think is False:
            return None
        if isinstance(splitter, HarmonySplitter):
            return ReasoningBudget(self.budget, HARMONY_ANALYSIS, HARMONY_TO_FINAL, "<|end|>",
                                   opened=self.opened)
        fmt = splitter.fmt
        return ReasoningBudget(self.budget, fmt.open_tag, f"\n{fmt.close_tag}\n\n",
                               fmt.close_tag, opened=self.opened)

    def another_choice(self) -> Thinking:
        """The thinking of another choice of the same reply (``n``): the same prompt, a
        splitter of its own (a splitter follows one reply's text)."""
        other = copy.copy(self)
        if self.format is not None:
            other.splitter = splitter_for(self.format, thinking=self.opened)
        return other

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


_ANTHROPIC_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high",
                      "max": "high"}


def anthropic_think(value: Any, max_tokens: int | None, effort: Any = None
                    ) -> tuple[Thinking, bool]:
    """Anthropic's ``thinking``: {"type": "enabled", "budget_tokens": N} switches thinking on
    (the budget checked as Anthropic does: at least 1,024 and below max_tokens; the reasoning
    and the answer together stop at max_tokens; the reasoning alone is closed after
    budget_tokens, see ``Thinking.reasoning_budget``), "disabled" off, "adaptive" or none leaves
    it to the model's template; ``output_config.effort`` is the reasoning effort of a
    template that takes one (above "high", high). The second value: whether to send the
    reasoning's text (``display: "omitted"`` sends empty thinking blocks)."""
    if effort is not None and (not isinstance(effort, str) or effort not in _ANTHROPIC_EFFORTS):
        raise InvalidRequest("'output_config.effort' must be one of"
                             f" {', '.join(_ANTHROPIC_EFFORTS)}; got {effort!r}.")
    level = _ANTHROPIC_EFFORTS.get(effort) if effort is not None else None
    if value is None:
        return Thinking(None, effort=level), True
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return Thinking(False), True
    if kind == "adaptive":
        return Thinking(None, effort=level), value.get("display") != "omitted"
    if kind != "enabled":
        raise InvalidRequest("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N},"
                             " {\"type\": \"disabled\"} or {\"type\": \"adaptive\"}.")
    budget = value.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1024:
        raise InvalidRequest("'thinking.budget_tokens' must be an integer of at least 1024.")
    if max_tokens is not None and budget >= max_tokens:
        raise InvalidRequest(f"'thinking.budget_tokens' ({budget}) must be less than"
                             f" 'max_tokens' ({max_tokens}).")
    display = value.get("display")
    if display not in (None, "summarized", "omitted"):
        raise InvalidRequest("'thinking.display' must be \"summarized\" or \"omitted\".")
    return Thinking(True, effort=level, budget=budget), display != "omitted"
