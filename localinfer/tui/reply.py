"""The reply being streamed: its state, the messages its thread worker posts to the chat screen,
and the figures that stay under it once it has ended."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from textual.message import Message
from textual.timer import Timer

from ..chats import ReplyStats
from ..errors import LocalInferError
from ..planner import Roofline
from ..runtime.types import Done, LiveStats, Usage
from ..session import Generation
from .figures import SpeedTracker
from .widgets import AssistantMessage


class ReplyStarted(Message, bubble=False):
    def __init__(self, reply_id: int, prompt_tokens: int | None) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.prompt_tokens = prompt_tokens


class ReplyToken(Message, bubble=False):
    def __init__(self, reply_id: int, text: str, live: LiveStats, at: float) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.text = text
        self.live = live
        self.at = at


class ReplyDone(Message, bubble=False):
    def __init__(self, reply_id: int, done: Done) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.done = done


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



def reply_stats(done: Done, reply: Reply, roofline: Roofline | None) -> ReplyStats:
    """The figures that stay under a reply. One cancelled through the daemon ends without the
    engine's timings (the stream is closed): the last token's measured figures stand in."""
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
