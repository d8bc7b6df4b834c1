"""The chat screen's widgets. They only render what the app hands them and post what the user
does; the model is reached by the app's workers (app.py), never from here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from textual import events
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Label, Markdown, ProgressBar, Sparkline, Static, TextArea
from textual.widgets.markdown import MarkdownStream

from ..chats import ChatMessage
from ..planner import Roofline
from ..protocol import ModelInfo
from ..runtime.types import LiveStats
from .speed import placement, summary_line, thousands, tps

HISTORY_LIMIT = 200


class EnterSubmits(TextArea):
    """A multi-line text box where Enter submits and Shift+Enter or Ctrl+J starts a new line
    (the message box, and the system prompt in the settings)."""

    # Handled in _on_key, in order with the typed characters (a priority binding would run
    # ahead of characters still queued: "abc" + Enter typed fast would send "").
    KEYS = {"enter": "submit", "shift+enter": "newline", "ctrl+j": "newline"}

    @dataclass
    class Submitted(Message):
        area: EnterSubmits
        text: str

        @property
        def control(self) -> EnterSubmits:
            return self.area

    def __init__(self, text: str = "", **kwargs) -> None:
        super().__init__(text, soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         **kwargs)

    async def _on_key(self, event: events.Key) -> None:
        action = self.KEYS.get(event.key)
        if action is None or self.read_only:
            await super()._on_key(event)
            return
        event.stop()
        event.prevent_default()
        getattr(self, f"action_{action}")()

    def action_submit(self) -> None:
        self.post_message(self.Submitted(self, self.text))

    def action_newline(self) -> None:
        start, end = self.selection
        self._replace_via_keyboard("\n", start, end)


class ChatInput(EnterSubmits):
    """The message box: Enter sends, Shift+Enter or Ctrl+J starts a new line, Up on the first
    line recalls earlier prompts (Down goes back towards the draft)."""

    KEYS = {**EnterSubmits.KEYS, "up": "history_back", "down": "history_forward"}

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.prompts: list[str] = []
        self._recall: int | None = None  # index into history while recalling
        self._draft = ""

    def action_submit(self) -> None:
        if self.text.strip():
            super().action_submit()

    def accept(self, text: str) -> None:
        """The app took ``text``: remember it for Up, and clear the input."""
        if not self.prompts or self.prompts[-1] != text:
            self.prompts.append(text)
            del self.prompts[:-HISTORY_LIMIT]
        self._recall = None
        self._draft = ""
        self.clear()

    def action_history_back(self) -> None:
        row, _ = self.cursor_location
        if row > 0 or not self.prompts or self._recall == 0:
            if row > 0:
                self.action_cursor_up()
            return
        if self._recall is None:
            self._draft = self.text
            self._recall = len(self.prompts)
        self._recall -= 1
        self._show(self.prompts[self._recall])

    def action_history_forward(self) -> None:
        row, _ = self.cursor_location
        if self._recall is None or row < self.document.line_count - 1:
            self.action_cursor_down()
            return
        self._recall += 1
        if self._recall >= len(self.prompts):
            self._recall = None
            self._show(self._draft)
        else:
            self._show(self.prompts[self._recall])

    def _show(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)


class UserMessage(Static):
    """What the user sent (plain text: no markup is interpreted)."""

    def __init__(self, message: ChatMessage, **kwargs) -> None:
        super().__init__(message.content, markup=False, **kwargs)
        self.border_title = "You"


class AssistantMessage(Vertical):
    """A reply: Markdown that grows while it streams, then a one-line summary under it."""

    def __init__(self, message: ChatMessage, *, streaming: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.message = message
        self.streaming = streaming
        self.border_title = message.model or "assistant"
        self._stream: MarkdownStream | None = None

    def compose(self):
        yield Markdown("" if self.streaming else self.message.content, classes="reply")
        yield Label(self._note(), classes="summary", markup=False)

    def on_mount(self) -> None:
        self._show_state()

    @property
    def markdown(self) -> Markdown:
        return self.query_one(Markdown)

    async def write(self, text: str) -> None:
        """Append streamed text. The stream appends to the Markdown incrementally (only its
        last block is parsed again) and merges fragments that arrive while it renders."""
        if self._stream is None:
            self._stream = Markdown.get_stream(self.markdown)
        await self._stream.write(text)

    async def finish(self, message: ChatMessage) -> None:
        """The reply ended: settle the text on the final one and show the summary."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.message = message
        self.streaming = False
        if self.markdown.source != message.content:
            await self.markdown.update(message.content)
        self.query_one(".summary", Label).update(self._note())
        self._show_state()

    def _show_state(self) -> None:
        m = self.message
        self.set_class(self.streaming, "-streaming")
        self.set_class(m.finish_reason in ("cancelled", "interrupted"), "-cancelled")
        self.set_class(m.finish_reason == "error", "-error")

    def _note(self) -> str:
        m = self.message
        if self.streaming:
            return "…"
        if m.finish_reason == "error":
            return f"⚠ {m.error or 'the reply failed'}"
        line = summary_line(m.stats) if m.stats else ""
        if m.finish_reason == "cancelled" and not m.stats:
            line = "cancelled"
        if m.finish_reason == "cancelled":
            line = "✂ " + line
        if m.finish_reason == "interrupted":
            line = "✂ interrupted: the chat closed while this reply streamed"
        return line


class ContextNote(Static):
    """Marks where the context starts after the oldest turns were dropped."""

    def __init__(self, **kwargs) -> None:
        super().__init__("— earlier messages are kept here but no longer sent to the model —",
                         **kwargs)


class LoadingPanel(Vertical):
    """What is happening while a model gets ready."""

    def compose(self):
        yield Label("", id="loading-text", markup=False)
        yield ProgressBar(total=1.0, show_eta=False, id="loading-bar")

    def show_step(self, message: str, fraction: float | None) -> None:
        self.query_one("#loading-text", Label).update(message)
        bar = self.query_one(ProgressBar)
        if fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=fraction)


class StatusBar(Vertical):
    """Model, placement and context on the first line; live speed with a sparkline on the
    second; the roofline and the plan's prediction on the third."""

    info: reactive[ModelInfo | None] = reactive(None, always_update=True)

    def compose(self):
        yield Label("", id="status-model", markup=False)
        with Horizontal(id="status-speed-row"):
            yield Label("", id="status-speed", markup=False)
            yield Sparkline([], id="status-spark")
        yield Label("", id="status-roofline", markup=False)

    def show_model(self, info: ModelInfo | None, where: str, context_tokens: int | None,
                   *, at_least: bool = False, loading: str = "") -> None:
        label = self.query_one("#status-model", Label)
        if info is None:
            label.update(loading or "no model loaded: ctrl+o picks one")
            return
        ctx = "?" if context_tokens is None else ("≥" if at_least else "") + thousands(
            context_tokens)
        label.update(f"{info.name} · {info.quant} · {placement(info)} · ctx {ctx}/"
                     f"{thousands(info.n_ctx)} · {where}")

    def show_speed(self, *, decode_tps: float, ttft_ms: float, prefill_tps: float,
                   n_tokens: int, samples: Sequence[float], waiting: bool = False,
                   last: bool = False) -> None:
        label = self.query_one("#status-speed", Label)
        if waiting:
            label.update("waiting for the first token…")
        elif n_tokens == 0 and not last:
            label.update("decode – tok/s · TTFT – · prefill – (measured while a reply streams)")
        else:
            prefix = "last reply: " if last else ""
            label.update(f"{prefix}decode {tps(decode_tps)} tok/s · TTFT {thousands(ttft_ms)}"
                         f" ms · prefill {tps(prefill_tps)} tok/s · {n_tokens} tok")
        self.query_one(Sparkline).data = list(samples)

    def show_roofline(self, roofline: Roofline | None, *, decode_tps: float, position: int,
                      predicted_tps: float | None, bandwidth_note: str = "") -> None:
        label = self.query_one("#status-roofline", Label)
        parts = []
        ceiling = roofline.ceiling_tps(position) if roofline else None
        if roofline is None or ceiling is None:
            parts.append(bandwidth_note or "roofline: memory bandwidth not known yet")
        else:
            pct = roofline.percent(decode_tps, position)
            share = f"{pct:.0f}% of " if pct is not None and pct >= 10 else \
                f"{pct:.1f}% of " if pct is not None else ""
            bw = []
            if roofline.reads.cpu_weight_bytes:
                bw.append(f"host {roofline.host_bandwidth_gbps:.1f} GB/s"
                          f" {roofline.host_bandwidth_source}")
            if roofline.reads.gpu_weight_bytes:
                bw.append(f"GPU {roofline.gpu_bandwidth_gbps:.0f} GB/s spec")
            approx = "" if roofline.exact else "~"
            parts.append(f"{share}roofline {approx}{tps(ceiling)} tok/s ({', '.join(bw)})")
        if predicted_tps:
            parts.append(f"plan {tps(predicted_tps)} tok/s predicted")
        label.update(" · ".join(parts))


def live_values(live: LiveStats) -> dict:
    return {"decode_tps": live.decode_tps, "ttft_ms": live.ttft_ms,
            "prefill_tps": live.prefill_tps, "n_tokens": live.n_tokens}
