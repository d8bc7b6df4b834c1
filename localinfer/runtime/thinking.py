"""Thinking models: whether a chat template thinks, how a request switches it, and splitting
the reasoning text from the answer as it streams.

A template thinks when it writes ``<think>`` (Qwen3, the DeepSeek-R1 distills) or speaks
OpenAI's harmony channels (gpt-oss). Qwen3's template takes ``enable_thinking``; gpt-oss's
takes ``reasoning_effort`` ("low", "medium", "high"). The reasoning is what the model writes
between ``<think>`` and ``</think>``; a template may open the block itself at the end of the
prompt (the R1 distills do), and then the reply starts inside it. A harmony reply is a run of
messages, ``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final
<|message|>...``: the analysis channel is the reasoning, the others the answer (a message to
``functions.NAME`` is a tool call, which runtime/tools.py parses).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidRequest
from .types import ReasoningBudget

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
    harmony: bool = False
    """The reply is harmony messages (gpt-oss), split by HarmonySplitter."""


def thinking_format(template: str | None) -> ThinkingFormat | None:
    """How the chat template ``template`` (Jinja source) thinks; None when it does not."""
    if not template:
        return None
    if "<|channel|>" in template:  # harmony: the reasoning is the "analysis" channel
        return ThinkingFormat(HARMONY_ANALYSIS, "<|end|>",
                              None, "reasoning_effort" in template, harmony=True)
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


HARMONY_MESSAGE = "<|message|>"
HARMONY_ANALYSIS = "<|channel|>analysis<|message|>"
"""How a harmony reply's reasoning opens."""
HARMONY_TO_FINAL = "<|end|><|start|>assistant<|channel|>final<|message|>"
"""The end of the analysis message and the final message's header: what ends a harmony
reply's reasoning when its budget is spent."""
HARMONY_ENDS = ("<|end|>", "<|return|>", "<|call|>")
"""What ends a harmony message: the end of one message, of the turn, of a tool call (the
last two end the generation, so a reply's text seldom holds them)."""
_HARMONY_HEADS = ("<|start|>", "<|channel|>", "to=")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def harmony_call(name: str, arguments: str) -> str:
    """A harmony tool call as HarmonySplitter hands it on (and gpt-oss writes it)."""
    return (f"<|channel|>commentary to=functions.{name} <|constrain|>json{HARMONY_MESSAGE}"
            f"{arguments}<|call|>")


class HarmonySplitter:
    """Splits a harmony reply (gpt-oss), piece by piece, like ThinkingSplitter: the analysis
    channel is reasoning, the final and commentary channels the answer, and the markers are
    dropped. A message to a function (a header with ``to=functions.NAME``, in the channel's
    or the role's part) goes to the answer whole, once it ends, written as ``harmony_call``
    for runtime/tools.py to parse; the model may write its recipient in either place, and a
    call may follow the reasoning or a preamble."""

    def __init__(self, *, thinking: bool = False) -> None:
        self._kind = "thinking" if thinking else ""  # "" while a header is read
        self._held = ""
        self._call = ""  # the function a message being read is sent to
        self._arguments = ""  # and what it has been sent so far
        self.thinking = ""
        self.content = ""

    def push(self, text: str) -> tuple[str, str]:
        self._held += text
        thinking = content = ""
        while True:
            if not self._kind:
                head = self._held.lstrip()
                if head and not any(h.startswith(head[:len(h)]) for h in _HARMONY_HEADS):
                    self._kind = "content"  # plain text, not a message: the answer
                    continue
                at = self._held.find(HARMONY_MESSAGE)
                if at < 0:
                    break  # a header is short: wait for its end
                self._open(self._held[:at])
                self._held = self._held[at + len(HARMONY_MESSAGE):]
                continue
            ends = [(at, end) for end in HARMONY_ENDS if (at := self._held.find(end)) >= 0]
            if not ends:
                keep = max(_partial_tag(self._held, end) for end in HARMONY_ENDS)
                body, self._held = self._held[:len(self._held) - keep], self._held[
                    len(self._held) - keep:]
                t, c = self._body(body, ended=False)
                thinking, content = thinking + t, content + c
                break
            at, end = min(ends)
            body, self._held = self._held[:at], self._held[at + len(end):]
            t, c = self._body(body, ended=True)
            thinking, content = thinking + t, content + c
            self._kind = ""
        return self._record(thinking, content)

    def _open(self, header: str) -> None:
        # gpt-oss-20b sometimes writes a stray "<|channel|>commentary to=assistant" before
        # the real channel (llama.cpp's parser says so): the last channel counts, and a
        # message "to=assistant" is no call.
        recipients = [r for r in _RECIPIENT.findall(header) if r != "assistant"]
        channels = _CHANNEL.findall(header)
        if recipients:
            # A call to a built-in tool (browser, python) that no request offers is dropped.
            self._kind = "call" if recipients[0].startswith("functions.") else "dropped"
            self._call = recipients[0].removeprefix("functions.")
        elif channels and channels[-1] == "analysis":
            self._kind = "thinking"
        else:
            self._kind = "content"

    def _body(self, body: str, *, ended: bool) -> tuple[str, str]:
        if self._kind == "thinking":
            return body, ""
        if self._kind == "content":
            return "", body
        if self._kind == "dropped":
            return "", ""
        self._arguments += body
        if not ended:
            return "", ""
        call, self._arguments = harmony_call(self._call, self._arguments), ""
        return "", call

    def flush(self) -> tuple[str, str]:
        """The end of the reply: what was held back. A call cut off (by max_tokens) is
        handed on as it stands; a header cut off is dropped."""
        held, self._held = self._held, ""
        if not self._kind:
            return self._record("", "")
        t, c = self._body(held, ended=True)
        return self._record(t, c)

    def _record(self, thinking: str, content: str) -> tuple[str, str]:
        self.thinking += thinking
        self.content += content
        return thinking, content


Splitter = ThinkingSplitter | HarmonySplitter


def new_splitter(fmt: ThinkingFormat, prompt: str) -> Splitter:
    """The splitter of a reply to the rendered ``prompt``."""
    return splitter_for(fmt, thinking=starts_thinking(fmt, prompt))


def splitter_for(fmt: ThinkingFormat, *, thinking: bool) -> Splitter:
    """The splitter of a reply that begins inside the reasoning (``thinking``: the prompt
    opened the block) or before it."""
    if fmt.harmony:
        return HarmonySplitter(thinking=thinking)
    return ThinkingSplitter(fmt, thinking=thinking)


def split_reply(fmt: ThinkingFormat, text: str, *, thinking: bool = False) -> tuple[str, str]:
    """A whole reply's ``(thinking, content)``."""
    splitter = splitter_for(fmt, thinking=thinking)
    splitter.push(text)
    splitter.flush()
    return splitter.thinking, splitter.content


class BudgetWatch:
    """Counts a reply's reasoning tokens against a ``ReasoningBudget``, token by token (their
    bytes), as llama.cpp's reasoning-budget sampler does: the count starts after the opening
    tag (or at once when the prompt opened the block), stops when the model writes the
    closing tag itself, and ``push`` says when the budget is spent (at a whole UTF-8
    character, never inside one): the engine then forces the budget's ``close``."""

    def __init__(self, budget: ReasoningBudget) -> None:
        self.budget = budget
        self._open = budget.open_tag.encode()
        self._close = budget.close_tag.encode()
        self._phase = "thinking" if budget.opened else "start"  # then "done"
        self._text = b""  # the reply so far, while it matters (start: the lead; thinking: a tail)
        self.used = 0
        """Reasoning tokens so far."""
        self.forced = False

    def push(self, piece: bytes) -> bool:
        """One generated token's bytes; True when the budget is spent now (force the close)."""
        if self._phase == "done":
            return False
        self._text += piece
        if self._phase == "start":
            lead = self._text.lstrip()
            if lead.startswith(self._open):
                self._phase, self._text = "thinking", lead[len(self._open):]
                return self._spent()
            if not self._open.startswith(lead):
                self._phase = "done"  # the reply does not reason
            return False
        if self._close in self._text:
            self._phase = "done"  # the model closed it itself
            return False
        self._text = self._text[-len(self._close):]
        self.used += 1
        return self._spent()

    def _spent(self) -> bool:
        if self.used < self.budget.tokens or not _whole_utf8(self._text):
            return False
        self._phase, self.forced = "done", True
        return True


def _whole_utf8(text: bytes) -> bool:
    """Whether ``text`` does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(text)) + 1):
        byte = text[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): how long is its character?
            return back >= (1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0
                            else 4)
    return True  # nothing, or no lead byte in reach: nothing to wait for
