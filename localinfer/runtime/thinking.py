"""Thinking models: whether a chat template thinks, how a request switches it, and splitting
the reasoning text from the answer as it streams.

A template thinks when it writes ``<think>`` (Qwen3, the DeepSeek-R1 distills) or speaks
OpenAI's harmony channels (gpt-oss). Qwen3's template takes ``enable_thinking``; gpt-oss's
takes ``reasoning_effort`` ("low", "medium", "high"). The reasoning is what the model writes
between ``<think>`` and ``</think>``; a template may open the block itself at the end of the
prompt (the R1 distills do), and then the reply starts inside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidRequest

EFFORTS = ("low", "medium", "high")
"""The reasoning efforts a harmony template (gpt-oss) takes."""


@dataclass(frozen=True)
class ThinkingFormat:
    """How one chat template thinks."""

    open_tag: str
    close_tag: str
    switch: str | None
    """The template variable that turns thinking on and off (``enable_thinking``), if any."""
    takes_effort: bool
    """The template takes ``reasoning_effort`` (low, medium, high)."""


def thinking_format(template: str | None) -> ThinkingFormat | None:
    """How the chat template ``template`` (Jinja source) thinks; None when it does not."""
    if not template:
        return None
    if "<|channel|>" in template:  # harmony: the reasoning is the "analysis" channel
        return ThinkingFormat("<|channel|>analysis<|message|>", "<|end|>",
                              None, "reasoning_effort" in template)
    if "<think>" in template:
        switch = "enable_thinking" if "enable_thinking" in template else None
        return ThinkingFormat("<think>", "</think>", switch, False)
    return None


def template_vars(fmt: ThinkingFormat | None, think: bool | str | None, *, model: str
                  ) -> dict[str, object]:
    """The template variables for a request's ``think`` (True, False, an effort, or None for
    the model's default; an effort switches thinking on where the template takes no effort).
    Refuses what the template cannot do, as Ollama does, naming the model: thinking asked of
    a model that does not think, and "off" for a template that always thinks."""
    if think is None:
        return {}
    if fmt is None:
        if think is False:
            return {}
        raise InvalidRequest(f"\"{model}\" does not support thinking")
    if isinstance(think, str):
        if think not in EFFORTS:
            raise InvalidRequest(f"'think' must be true, false, or one of {', '.join(EFFORTS)};"
                                 f" got {think!r}.")
        if fmt.takes_effort:
            return {"reasoning_effort": think}
        think = True  # a template that takes no effort thinks at its one level
    if fmt.switch is not None:
        return {fmt.switch: think}
    if think:
        return {}
    raise InvalidRequest(f"\"{model}\" always thinks: its chat template has no switch to turn"
                         " thinking off.")


def starts_thinking(fmt: ThinkingFormat, prompt: str) -> bool:
    """Whether the rendered prompt ends inside an open reasoning block (the reply then
    begins with reasoning, without writing the opening tag itself)."""
    tail = prompt.rstrip()
    return tail.endswith(fmt.open_tag)


class ThinkingSplitter:
    """Splits a reply's text, piece by piece, into reasoning and answer.

    ``push`` returns ``(thinking, content)`` that is safe to show now; text that may be part
    of a tag is held back until the next piece (or ``flush``) decides. Only a block that opens
    the reply is reasoning: an answer that mentions the tag later keeps it as text. The tags
    are dropped, and so is the whitespace between the reasoning and the answer."""

    def __init__(self, fmt: ThinkingFormat, *, thinking: bool = False) -> None:
        self.fmt = fmt
        self._phase = "thinking" if thinking else "start"  # then "answer"
        self._held = ""
        self._strip = False  # the reasoning just closed: drop the whitespace that follows
        self.thinking = ""
        self.content = ""

    def push(self, text: str) -> tuple[str, str]:
        self._held += text
        thinking = content = ""
        if self._phase == "start":
            head = self._held.lstrip()
            if head.startswith(self.fmt.open_tag):
                self._held = head[len(self.fmt.open_tag):]
                self._phase = "thinking"
            elif not self.fmt.open_tag.startswith(head):  # not a tag: the answer began
                self._phase = "answer"
            else:
                return "", ""  # whitespace, or a tag's beginning: wait for more
        if self._phase == "thinking":
            if not self.thinking:  # the reasoning starts at its first visible character
                self._held = self._held.lstrip()
            at = self._held.find(self.fmt.close_tag)
            if at < 0:
                # Held back: what may begin the closing tag, and the whitespace before it
                # (the reasoning ends at its last visible character).
                cut = len(self._held) - _partial_tag(self._held, self.fmt.close_tag)
                cut = len(self._held[:cut].rstrip())
                thinking, self._held = self._held[:cut], self._held[cut:]
                return self._record(thinking, "")
            thinking = self._held[:at].rstrip()
            self._held = self._held[at + len(self.fmt.close_tag):]
            self._phase, self._strip = "answer", True
        if self._strip:
            self._held = self._held.lstrip()
            self._strip = not self._held
        content, self._held = self._held, ""
        return self._record(thinking, content)

    def flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        if self._phase == "thinking":
            return self._record(held.strip() if not self.thinking else held.rstrip(), "")
        return self._record("", "" if self._strip else held)

    def _record(self, thinking: str, content: str) -> tuple[str, str]:
        self.thinking += thinking
        self.content += content
        return thinking, content


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split_reply(fmt: ThinkingFormat, text: str, *, thinking: bool = False) -> tuple[str, str]:
    """A whole reply's ``(thinking, content)``."""
    splitter = ThinkingSplitter(fmt, thinking=thinking)
    splitter.push(text)
    splitter.flush()
    return splitter.thinking, splitter.content
