"""The reply being streamed: its state, the messages its thread worker posts to the chat screen,
and the figures that stay under it once it has ended."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from textual.message import Message
from textual.timer import Timer

from ..chats import ChatMessage, ReplyStats
from ..errors import LocalInferError
from ..planner import Roofline
from ..runtime.types import Done, LiveStats, Usage
from ..session import Generation, ThoughtStats
from .figures import SpeedTracker
from .widgets import AssistantMessage


class ReplyStarted(Message, bubble=False):
    def __init__(self, reply_id: int, prompt_tokens: int | None) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.prompt_tokens = prompt_tokens


class ReplyToken(Message, bubble=False):
    def __init__(self, reply_id: int, text: str, live: LiveStats, at: float, *,
                 thought: bool = False) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.text = text
        self.live = live
        self.at = at
        self.thought = thought
        """A piece of the reasoning (else of the answer)."""


class ReplyDone(Message, bubble=False):
    def __init__(self, reply_id: int, done: Done, thought: ThoughtStats | None = None
                 ) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.done = done
        self.thought = thought


class ReplyFailed(Message, bubble=False):
    def __init__(self, reply_id: int, error: LocalInferError) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.error = error


@dataclass(eq=False)
class Reply:
    """The reply being streamed."""

    id: int
    widget: AssistantMessage
    model: str
    tracker: SpeedTracker = field(default_factory=SpeedTracker)
    generation: Generation | None = None
    cancel_requested: bool = False
    pending: list[str] = field(default_factory=list)
    live: LiveStats | None = None
    prompt_tokens: int | None = None
    last_flush: float = 0.0
    flush_timer: Timer | None = None
    last_save: float = 0.0
    drawn: list[str] = field(default_factory=list)
    """The text drawn so far (what a streaming save writes)."""
    thought_pending: list[str] = field(default_factory=list)
    thought_tokens: int = 0
    replaces: list[ChatMessage] = field(default_factory=list)
    """Regenerating: the replies to the same message so far (the new one joins them)."""
    summary_of: tuple[int, int] | None = None
    """Summarising: the messages the summary stands for (it is not shown as a reply)."""


def reply_stats(done: Done, reply: Reply, roofline: Roofline | None,
                thought: ThoughtStats | None = None) -> ReplyStats:
    """The figures that stay under a reply (with its reasoning's, and the answer's own TTFT
    and decode, after a thinking model's reasoning)."""
    stats = _reply_stats(done, reply, roofline)
    if thought is None:
        return stats
    return replace(stats, thought_tokens=thought.tokens, thought_ms=thought.ms,
                   thought_tps=thought.decode_tps, answer_ttft_ms=thought.answer_ttft_ms,
                   answer_decode_tps=thought.answer_decode_tps)


def _reply_stats(done: Done, reply: Reply, roofline: Roofline | None) -> ReplyStats:
    """One cancelled through the daemon ends without the engine's timings (the stream is
    closed): the last token's measured figures stand in."""
    live = reply.live
    if done.timings.completion_tokens or live is None or done.finish_reason != "cancelled":
        return ReplyStats.from_done(done, _roofline_pct(roofline, done.timings.decode_tps,
                                                        done.usage))
    prompt = done.usage.prompt_tokens or reply.prompt_tokens or 0
    pct = _roofline_pct(roofline, live.decode_tps, Usage(prompt, live.n_tokens))
    return replace(ReplyStats.from_done(done, pct), completion_tokens=live.n_tokens,
                   decode_tps=round(live.decode_tps, 2), ttft_ms=round(live.ttft_ms, 1),
                   prefill_tps=round(live.prefill_tps, 1), prompt_tokens=prompt)


def _roofline_pct(roofline: Roofline | None, decode_tps: float, usage: Usage) -> float | None:
    """Decode as a share of the roofline at the reply's middle position."""
    if roofline is None:
        return None
    return roofline.percent(decode_tps, usage.prompt_tokens + usage.completion_tokens // 2)
