"""A chat reply in the parts every API's chat route sends: reasoning, content and tool calls,
split out of the engine's text as it streams (``reply_parts``) or whole (``whole_parts``).
The routes only put these parts into their wire format."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

from ..runtime.tools import PartialCall
from ..runtime.types import Done, Event, LiveStats, TokenLogprob, ToolCall
from .reasoning_fields import Thinking
from .state import DaemonState
from .structured import Constraints


@dataclass(frozen=True)
class Piece:
    """A streamed piece of the reply: reasoning and content (either may be empty)."""

    reasoning: str
    content: str
    live: LiveStats
    logprobs: tuple[TokenLogprob, ...] = ()
    calls: tuple[PartialCall, ...] = ()
    """The calls written so far (their arguments so far), when they grew with this piece;
    a route that streams a call's arguments sends what is new."""


@dataclass(frozen=True)
class End:
    """The end of the reply: what the splitters held back, the calls, and the engine's
    ``Done`` (usage, timings, finish reason)."""

    done: Done
    reasoning: str
    content: str
    calls: list[ToolCall]


async def reply_parts(state: DaemonState, events: AsyncIterable[Event],
                      thinking: Thinking | None, constraints: Constraints | None
                      ) -> AsyncIterator[Piece | End]:
    """The reply's pieces (only those that carry something), then its ``End``; the
    generation is counted for /metrics. A cancelled generation raises: its reply is cut."""
    splitter = constraints.splitter() if constraints is not None else None
    calls: tuple[PartialCall, ...] = ()
    async for event in events:
        if not isinstance(event, Done):
            reasoning, content = thinking.split(event.text) if thinking else ("", event.text)
            grown: tuple[PartialCall, ...] = ()
            if splitter is not None:
                content = splitter.push(content)
                if tuple(splitter.calls) != calls:
                    grown = calls = tuple(splitter.calls)
            if reasoning or content or event.logprobs or grown:
                yield Piece(reasoning, content, event.live, event.logprobs, grown)
            continue
        state.record(event)
        if event.finish_reason == "cancelled":
            raise state.cut_off(event)
        reasoning, content = thinking.flush() if thinking else ("", "")
        whole: list[ToolCall] = []
        if splitter is not None:
            content, whole = splitter.finish(content)
        yield End(event, reasoning, content, whole)


def whole_parts(done: Done, thinking: Thinking | None, constraints: Constraints | None
                ) -> tuple[str, str, list[ToolCall]]:
    """A whole (non-streamed) reply as ``(reasoning, content, calls)``."""
    reasoning, content = thinking.whole(done.text) if thinking else ("", done.text)
    calls: list[ToolCall] = []
    if constraints is not None:
        content, calls = constraints.reply(content)
    return reasoning, content, calls


def cut_calls(done: Done, thinking: Thinking | None, constraints: Constraints | None,
              content: str, calls: list[ToolCall]) -> tuple[str, list[PartialCall]]:
    """Where a whole reply ended inside its calls (max_tokens, a stop sequence): the text
    before them and the calls its stream would have shown past the whole ones (``calls``),
    as far as they were written; ``content`` and none otherwise. A whole reply then holds
    what its stream sent."""
    splitter = constraints.splitter() if constraints is not None else None
    if splitter is None:
        return content, []
    text = thinking.whole(done.text)[1] if thinking else done.text
    shown = splitter.push(text)
    cut = splitter.calls[len(calls):]
    return (shown if cut else content), cut
