"""``localinfer chat``: the Textual chat UI with live speed.

The app owns the screen and the chat history; the model, and what to show about models, are
reached through the core's ``localinfer.session`` from thread workers, which post messages back
(as Textual's examples/mother.py and harlequin do), so the UI never waits on the model. The app
keeps only state and rendering. A reply streams into one Markdown
widget that is appended to at most once per frame (FRAME_S): the render cost per token does not
grow with the reply, nor with the transcript, whose other messages are never touched.

``create_app`` builds the app for the CLI and for the tests and snapshots alike.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Button, Footer, Header, Sparkline, Static

from ..chats import Chat, ChatMessage, ChatStore, ReplyStats
from ..config import Config
from ..errors import ContextOverflow, DaemonError, LocalInferError
from ..planner import Roofline
from ..runtime.types import Done, LiveStats, Usage
from ..selection import pick_model
from ..session import (
    DecodeReference,
    EngineOpener,
    Launcher,
    LoadStep,
    Session,
    decode_reference,
    loaded_candidate,
    loaded_rows,
    with_loaded_backend,
)
from .screens import (
    ChatChoice,
    ChatsChanged,
    ChatSettings,
    ChatsScreen,
    ContextFullScreen,
    ErrorScreen,
    HelpScreen,
    ModelChoice,
    ModelsScreen,
    SettingsScreen,
)
from .speed import SpeedTracker
from .widgets import (
    AssistantMessage,
    ChatInput,
    ContextNote,
    LoadingPanel,
    StatusBar,
    UserMessage,
)

log = logging.getLogger(__name__)

FRAME_S = 1 / 30
"""A streaming reply is redrawn at most this often, however fast tokens arrive."""
SAVE_EVERY_S = 1.0
"""A streaming reply is saved at most this often (atomically), so that a crash or a kill
keeps the text streamed so far, marked "interrupted"."""
MOUNTED_MESSAGES = 60
BASE_MODEL_NOTE = "base model: continues text, does not follow instructions · Ctrl+O: models"
"""Under the title bar while a base model is loaded (it fits in 80 columns)."""
MAIN_SCREEN_ACTIONS = {"cancel_reply", "new_chat", "chats", "models", "settings",
                       "copy_reply", "help"}
"""A resumed chat shows its last messages; earlier ones are mounted on request."""


# --- messages from the workers ---------------------------------------------------------------
class LoadProgress(Message):
    def __init__(self, step: LoadStep) -> None:
        super().__init__()
        self.step = step


class SessionReady(Message):
    def __init__(self, session: Session, candidate: Any) -> None:
        super().__init__()
        self.session = session
        self.candidate = candidate


class SessionFailed(Message):
    def __init__(self, model: str | None, error: LocalInferError) -> None:
        super().__init__()
        self.model = model
        self.error = error


class HardwareReady(Message):
    def __init__(self, hardware: Any, calibration: dict[str, float]) -> None:
        super().__init__()
        self.hardware = hardware
        self.calibration = calibration


class ReplyStarted(Message):
    def __init__(self, reply_id: int, prompt_tokens: int | None) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.prompt_tokens = prompt_tokens


class ReplyToken(Message):
    def __init__(self, reply_id: int, text: str, live: LiveStats, at: float) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.text = text
        self.live = live
        self.at = at


class ReplyDone(Message):
    def __init__(self, reply_id: int, done: Done) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.done = done


class ReplyFailed(Message):
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
    generation: Any = None
    cancel_requested: bool = False
    pending: list[str] = field(default_factory=list)
    live: LiveStats | None = None
    prompt_tokens: int | None = None
    last_flush: float = 0.0
    flush_timer: Timer | None = None
    last_save: float = 0.0
    drawn: list[str] = field(default_factory=list)
    """The text drawn so far (what a streaming save writes)."""


class ChatApp(App[None]):
    """The chat screen: transcript, live status bar, input; other screens on keys."""

    CSS_PATH = "chat.tcss"
    TITLE = "localinfer chat"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("escape", "cancel_reply", "Cancel"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+r", "chats", "Chats"),
        Binding("ctrl+o", "models", "Models"),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("f2", "copy_reply", "Copy"),
        Binding("ctrl+t", "toggle_theme", "Theme", show=False),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("f12", "save_svg", "Screenshot", show=False),
    ]

    def __init__(self, launcher: Launcher, chats: ChatStore, *, model: str | None = None,
                 resume: str | None = None, hardware: Any = None,
                 calibration: dict[str, float] | None = None, theme: str | None = None,
                 measure_bandwidth: bool = True) -> None:
        super().__init__()
        if theme:
            self.theme = theme
        self.launcher = launcher
        self.chats = chats
        self.requested_model = model
        self.resume = resume
        self.hardware = hardware
        self.hardware_fixed = hardware is not None
        self.calibration = calibration or {}
        self.measure_bandwidth = measure_bandwidth and hardware is None
        self.chat: Chat = chats.new(temperature=0.8, max_tokens=512)
        self.session: Session | None = None
        self.loading: str | None = None
        self.load_error: LocalInferError | None = None
        self.model_name: str | None = model
        self.candidate: Any = None
        self.reference: DecodeReference | None = None
        self.reply: Reply | None = None
        self.context_tokens: int | None = None
        self._reply_ids = 0
        self._after_reply: Callable[[], Awaitable[None] | None] | None = None
        self._queued: str | None = None
        self._drop_from: int | None = None
        """While the oldest turns are dropped for the message being sent: the context start
        before (restored if even the message alone does not fit)."""
        self._drop_next_for: str | None = None
        """The chat whose next message drops the oldest turns it needs room from, without
        asking (the user chose so when a reply filled the context)."""
        self._resend_after_connect = False
        self._last_stats: ReplyStats | None = None
        self._hidden_messages = 0
        self._measuring = False
        self._remeasured = False
        """The bandwidth was measured again after a reply beat the roofline (once a session)."""
        self._context_at_least = False

    # --- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(BASE_MODEL_NOTE, id="model-note", markup=False)
        yield VerticalScroll(id="transcript")
        yield LoadingPanel(id="loading")
        yield StatusBar(id="status")
        yield ChatInput(id="input", placeholder="Message (Enter sends, Ctrl+J new line)")
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one(Footer).compact = True
        if self.resume:
            try:
                chat = self.chats.load(self.resume) if self.resume != "latest" else \
                    self.chats.latest()
            except LocalInferError as exc:
                chat = None
                self.notify(exc.message, title="Cannot resume", severity="error")
            if chat is not None:
                self.chat = chat
                self.model_name = self.model_name or chat.model
        await self._render_chat()
        self.query_one(ChatInput).focus()
        self._show_status()
        self.connect(self.model_name)

    # --- connecting -----------------------------------------------------------------------
    def connect(self, model: str | None) -> None:
        self.loading = model or "the model"
        self.load_error = None
        panel = self.query_one(LoadingPanel)
        panel.display = True
        panel.show_step(f"Getting {self.loading} ready…", None)
        self._show_status()
        self._connect(model, self.session)

    @work(thread=True, exclusive=True, exit_on_error=False, group="connect")
    def _connect(self, model: str | None, old: Session | None) -> None:
        try:
            if self.hardware is None:
                self.post_message(HardwareReady(
                    *self.launcher.probe_hardware(measure_bandwidth=False)))
            if model is None:
                model = pick_model(self.launcher.store, self.launcher.config, self.hardware)
            self.post_message(LoadProgress(LoadStep(f"Getting {model} ready…")))
            if old is not None and self.launcher.in_process:
                old.close()  # two models at once may not fit: free the old one first
            def on_step(step: LoadStep) -> None:
                self.post_message(LoadProgress(step))

            session = self.launcher.open(model, on_step)
            self.post_message(SessionReady(session, loaded_candidate(session.info)))
        except LocalInferError as exc:
            self.post_message(SessionFailed(model, exc))
        except Exception as exc:  # noqa: BLE001 - a bug shows in the UI, not as a traceback
            log.exception("connecting failed")
            self.post_message(SessionFailed(model, LocalInferError(
                f"internal error: {type(exc).__name__}: {exc}")))

    @work(thread=True, exclusive=True, exit_on_error=False, group="bandwidth")
    def _measure(self) -> None:
        try:
            self.post_message(HardwareReady(
                *self.launcher.probe_hardware(measure_bandwidth=True)))
        except Exception:  # noqa: BLE001 - the roofline stays unknown; chatting works
            log.warning("measuring the memory bandwidth failed", exc_info=True)
            self._measuring = False

    def _check_roofline(self, roofline_pct: float | None, done: Done) -> None:
        """Decode steps faster than the roofline mean the cached host bandwidth is too low
        (``after_reply`` decides): mark it and measure it again in the background, once per
        session."""
        from ..planner.calibration import after_reply  # the probes: only here

        if self.hardware is None or self.hardware_fixed or self._remeasured:
            return
        check = after_reply(done, hardware=self.hardware, roofline_pct=roofline_pct)
        if check.remeasure is None:
            return
        self._remeasured = True
        if check.note:
            self.notify(check.note)
        self._remeasure(check.remeasure)

    @work(thread=True, exclusive=True, exit_on_error=False, group="bandwidth")
    def _remeasure(self, reason: str) -> None:
        """Mark the host bandwidth figure (``reason``: ``ReplyCheck.remeasure``) and measure
        it again."""
        from ..planner.calibration import flag_bandwidth  # the probes: only here

        try:
            if self.hardware is not None and flag_bandwidth(self.hardware, reason):
                self.post_message(HardwareReady(
                    *self.launcher.probe_hardware(measure_bandwidth=True)))
        except Exception:  # noqa: BLE001 - the old figure stays; chatting works
            log.warning("measuring the memory bandwidth again failed", exc_info=True)

    @on(LoadProgress)
    def _load_progress(self, event: LoadProgress) -> None:
        if self.loading is not None:
            self.query_one(LoadingPanel).show_step(event.step.message, event.step.fraction)
            self.loading = event.step.message
            self._show_status()

    @on(HardwareReady)
    def _hardware_ready(self, event: HardwareReady) -> None:
        if self.hardware_fixed:
            return
        if event.hardware.host_bandwidth_gbps:
            self._measuring = False
        self.hardware = event.hardware
        self.calibration = event.calibration
        self._update_reference()
        self._show_status()

    @on(SessionReady)
    async def _session_ready(self, event: SessionReady) -> None:
        self.session = event.session
        self.candidate = event.candidate
        self.model_name = event.session.model
        self.loading = None
        self.query_one(LoadingPanel).display = False
        self.sub_title = f"{event.session.info.name} · {self.chat.display_title}"
        self.query_one("#model-note").display = event.session.info.base_model
        self._update_reference()
        if self.context_tokens is None and self._last_stats is not None:
            self.context_tokens = self._last_stats.context_tokens
        self._show_status()
        welcome = self.query("#welcome")
        if welcome:
            welcome.first(Static).update(self._welcome_text())
        if self.measure_bandwidth and self.hardware is not None and \
                not self.hardware.host_bandwidth_gbps:
            self.measure_bandwidth = False
            self._measuring = True
            self._measure()
        if self._resend_after_connect:
            self._resend_after_connect = False
            self._start_reply()
        elif self._queued is not None:
            self._queued = None
            self._start_reply()

    @on(SessionFailed)
    def _session_failed(self, event: SessionFailed) -> None:
        self.loading = None
        self.load_error = event.error
        self.session = None
        self.query_one(LoadingPanel).display = False
        self.query_one("#model-note").display = False
        self._show_status()
        error = event.error
        unreachable = isinstance(error, DaemonError)
        title = "Daemon unreachable" if unreachable else (
            "Model failed to load" if event.model else "No model")
        buttons = [("retry", "Retry"), ("models", "Pick another model")]
        if unreachable and not self.launcher.in_process:
            buttons.insert(1, ("in_process", "Run in this process"))
        buttons.append(("close", "Close"))

        def chosen(answer: str | None) -> None:
            if answer == "retry":
                self.connect(event.model)
            elif answer == "models":
                self.action_models()
            elif answer == "in_process":
                self.launcher.no_daemon = True
                self.connect(event.model)

        self.push_screen(ErrorScreen(title, error.one_line(), buttons), chosen)

    def _update_reference(self) -> None:
        if self.session is None or self.hardware is None:
            self.reference = None
            return
        self.hardware = with_loaded_backend(self.hardware, self.session.info)
        self.reference = decode_reference(self.session.info, self.hardware, self.candidate,
                                          self.launcher.config, self.calibration)

    # --- the transcript -------------------------------------------------------------------
    async def _render_chat(self) -> None:
        transcript = self.query_one("#transcript", VerticalScroll)
        await transcript.remove_children()
        messages = self.chat.messages
        start = max(0, len(messages) - MOUNTED_MESSAGES)
        self._hidden_messages = start
        widgets: list[Any] = []
        if start:
            widgets.append(Button(f"Show {start} earlier messages", id="show-earlier"))
        if not messages:
            widgets.append(Static(self._welcome_text(), id="welcome"))
        widgets.extend(self._message_widgets(start, len(messages)))
        await transcript.mount_all(widgets)
        self._last_stats = next((m.stats for m in reversed(messages) if m.stats), None)
        self.context_tokens = self._last_stats.context_tokens if self._last_stats else None
        self._context_at_least = False
        self.sub_title = self.chat.display_title if self.session is None else \
            f"{self.session.info.name} · {self.chat.display_title}"
        transcript.anchor()  # at the end, and it stays there as replies stream in

    def _message_widgets(self, start: int, end: int) -> list[Any]:
        out: list[Any] = []
        for i in range(start, end):
            m = self.chat.messages[i]
            if i == self.chat.context_start and i > 0:
                out.append(ContextNote(classes="context-note"))
            out.append(UserMessage(m) if m.role == "user" else AssistantMessage(m))
        return out

    @on(Button.Pressed, "#show-earlier")
    async def _show_earlier(self) -> None:
        transcript = self.query_one("#transcript", VerticalScroll)
        end = self._hidden_messages
        start = max(0, end - MOUNTED_MESSAGES)
        button = self.query_one("#show-earlier", Button)
        widgets = self._message_widgets(start, end)
        await transcript.mount_all(widgets, after=button)
        self._hidden_messages = start
        if start:
            button.label = f"Show {start} earlier messages"
        else:
            await button.remove()

    def _welcome_text(self) -> str:
        model = self.session.info.name if self.session else (self.loading or "a model")
        keys = ("Enter sends · Shift+Enter or Ctrl+J: new line · Up: earlier prompts · Esc"
                " cancels a reply · F1: help and what the numbers mean.")
        if self.session and self.session.info.base_model:
            return (f"{model} is a base model: it continues the text you give it; it does not"
                    " answer questions or follow instructions. Start a text for it to"
                    " continue, like “Once upon a time, in a village by the sea,” or “def"
                    " is_prime(n):”. To chat, Ctrl+O picks or pulls an instruct model (those"
                    f" that fit run well here).\n{keys}")
        return f"Chat with {model}. {keys}"

    # --- sending --------------------------------------------------------------------------
    @on(ChatInput.Submitted, "#input")
    async def _submitted(self, event: ChatInput.Submitted) -> None:
        await self.send(event.text)

    async def send(self, text: str) -> None:
        """Send ``text`` as the user's next message (the Enter key)."""
        chat_input = self.query_one(ChatInput)
        if self.reply is not None:
            self.notify("A reply is still streaming: Esc cancels it. Your message stays in"
                        " the input.", severity="warning")
            return
        if self.session is None and self.loading is None:
            self.notify("No model is loaded: Ctrl+O picks one.", severity="error")
            return
        if self._queued is not None:
            self.notify("The model is still loading; your first message is waiting.",
                        severity="warning")
            return
        chat_input.accept(text)
        message = self.chat.add(ChatMessage("user", text))
        switching = self.loading is not None  # a model is loading: it answers, not the old one
        if self.session is not None and not switching:
            self.chat.model = self.session.model
        self._save()
        welcome = self.query("#welcome")
        if welcome:
            await welcome.remove()
        await self.query_one("#transcript").mount(UserMessage(message))
        self.sub_title = f"{self.model_name or ''} · {self.chat.display_title}"
        if self.session is None or switching:
            self._queued = text  # sent as soon as the model is ready
            self.notify("Sending when the model is ready.")
            return
        self._start_reply()

    def _start_reply(self) -> None:
        session = self.session
        assert session is not None
        self._reply_ids += 1
        widget = AssistantMessage(ChatMessage("assistant", "", model=session.info.name),
                                  streaming=True)
        reply = Reply(self._reply_ids, widget, session.info.name)
        self.reply = reply
        transcript = self.query_one("#transcript", VerticalScroll)
        transcript.mount(widget)
        transcript.anchor()
        self.chat.model = session.model
        self._show_status()
        self.refresh_bindings()
        self._stream(reply, session, self.chat.prompt_messages(), self.chat.params())

    @work(thread=True, exit_on_error=False, group="reply")
    def _stream(self, reply: Reply, session: Session, messages: Sequence[Any],
                params: Any) -> None:
        """Run one generation and post its events; never touches a widget."""
        try:
            prompt_tokens = session.count_tokens(messages)
            self.post_message(ReplyStarted(reply.id, prompt_tokens))
            generation = session.chat(messages, params)
            reply.generation = generation
            if reply.cancel_requested:
                generation.cancel()
            for event in generation:
                counted = getattr(generation, "prompt_tokens", None)  # the daemon counts it
                if prompt_tokens is None and counted:
                    prompt_tokens = counted
                    self.post_message(ReplyStarted(reply.id, prompt_tokens))
                if isinstance(event, Done):
                    self.post_message(ReplyDone(reply.id, event))
                else:
                    self.post_message(ReplyToken(reply.id, event.text, event.live,
                                                 time.monotonic()))
        except LocalInferError as exc:
            self.post_message(ReplyFailed(reply.id, exc))
        except Exception as exc:  # noqa: BLE001 - a bug shows in the UI, not as a traceback
            log.exception("the reply failed")
            self.post_message(ReplyFailed(reply.id, LocalInferError(
                f"internal error: {type(exc).__name__}: {exc}")))

    @on(ReplyStarted)
    def _reply_started(self, event: ReplyStarted) -> None:
        if self.reply is not None and self.reply.id == event.reply_id:
            self.reply.prompt_tokens = event.prompt_tokens
            self._show_status()

    @on(ReplyToken)
    def _reply_token(self, event: ReplyToken) -> None:
        reply = self.reply
        if reply is None or reply.id != event.reply_id:
            return
        reply.pending.append(event.text)
        reply.live = event.live
        reply.tracker.add(event.live.n_tokens, event.at)
        if reply.flush_timer is None:
            delay = max(0.001, reply.last_flush + FRAME_S - time.monotonic())
            reply.flush_timer = self.set_timer(delay, partial(self._draw_reply, reply))

    async def _draw_reply(self, reply: Reply) -> None:
        """Draw what arrived since the last frame: one append, one status update."""
        reply.flush_timer = None
        if reply is not self.reply:
            return
        reply.last_flush = time.monotonic()
        text = "".join(reply.pending)
        reply.pending.clear()
        if text:
            reply.drawn.append(text)
            await reply.widget.write(text)
            if reply.last_flush - reply.last_save >= SAVE_EVERY_S:
                reply.last_save = reply.last_flush
                self._save(streaming=ChatMessage("assistant", "".join(reply.drawn),
                                                 model=reply.model))
        self._show_status()

    @on(ReplyDone)
    async def _reply_done(self, event: ReplyDone) -> None:
        reply = self.reply
        if reply is None or reply.id != event.reply_id:
            return
        if reply.flush_timer is not None:
            reply.flush_timer.stop()
            reply.flush_timer = None
        await self._draw_reply(reply)
        done = event.done
        stats = _reply_stats(done, reply,
                             self.reference.roofline if self.reference else None)
        message = ChatMessage("assistant", done.text, model=reply.model,
                              finish_reason=done.finish_reason, stats=stats)
        self.chat.add(message)
        self._save()
        self.reply = None
        self._drop_from = self._drop_next_for = None
        self._last_stats = stats
        self._check_roofline(stats.roofline_pct, done)
        if stats.prompt_tokens:
            self.context_tokens, self._context_at_least = stats.context_tokens, False
        else:  # a cancelled daemon reply: the prompt's size is not known
            self.context_tokens = (self.context_tokens or 0) + stats.completion_tokens
            self._context_at_least = True
        await reply.widget.finish(message)
        self.refresh_bindings()
        self._show_status()
        n_ctx = self.session.info.n_ctx if self.session else 0
        if await self._run_after_reply():
            return
        if done.finish_reason == "length" and n_ctx and stats.context_tokens >= n_ctx - 1:
            self._context_full(f"The reply stopped because the context is full"
                               f" ({stats.context_tokens:,} of {n_ctx:,} tokens).",
                               unanswered=False)

    @on(ReplyFailed)
    async def _reply_failed(self, event: ReplyFailed) -> None:
        reply = self.reply
        if reply is None or reply.id != event.reply_id:
            return
        if reply.flush_timer is not None:
            reply.flush_timer.stop()
        self.reply = None
        self.refresh_bindings()
        error = event.error
        partial_text = "".join(reply.pending)
        if isinstance(error, ContextOverflow) and not reply.live:
            await reply.widget.remove()
            self._show_status()
            if await self._run_after_reply():
                self._drop_from = None
                return
            await self._message_does_not_fit(error)
            return
        self._drop_from = None
        text = (reply.widget.markdown.source or "") + partial_text
        message = ChatMessage("assistant", text, model=reply.model, finish_reason="error",
                              error=error.one_line())
        self.chat.add(message)
        self._save()
        await reply.widget.finish(message)
        self._show_status()
        if await self._run_after_reply():
            return
        if isinstance(error, DaemonError):
            def chosen(answer: str | None) -> None:
                if answer == "reconnect":
                    self._resend_after_connect = True
                    self.connect(self.model_name)

            self.push_screen(ErrorScreen(
                "Daemon unreachable", f"{error.one_line()} The reply was not finished.",
                [("reconnect", "Reconnect and resend"), ("close", "Close")]), chosen)

    async def _message_does_not_fit(self, error: ContextOverflow) -> None:
        """The message just sent does not fit in the context with the turns before it: drop
        the oldest whole turns (a user message and its replies) one by one until it fits, when
        the user chose so; else ask. If it does not fit even alone, say so."""
        chat = self.chat
        alone = len(chat.turn_starts()) < 2  # only the new message is still sent
        if self._drop_from is None and self._drop_next_for == chat.id and not alone:
            self._drop_from = chat.context_start
        self._drop_next_for = None
        if self._drop_from is not None and not alone:
            await self._drop_oldest_turn_and_resend()
            return
        if alone:
            if self._drop_from is not None:
                chat.context_start = self._drop_from  # nothing was sent: nothing is dropped
                self._drop_from = None
                self._save()
                await self._render_chat()
            self._too_long_alone(error)
            return
        n_ctx = getattr(error, "n_ctx", 0) or (self.session.info.n_ctx if self.session else 0)
        self._context_full(f"This conversation no longer fits in the model's context"
                           f" ({n_ctx:,} tokens): {error.message}", unanswered=True)

    async def _drop_oldest_turn_and_resend(self) -> None:
        self.chat.drop_oldest_turn()
        self._save()
        await self._render_chat()
        self._start_reply()

    def _too_long_alone(self, error: ContextOverflow) -> None:
        n_ctx = getattr(error, "n_ctx", 0) or (self.session.info.n_ctx if self.session else 0)
        n_prompt = getattr(error, "n_prompt", 0)  # not known through the daemon
        system = " with the system prompt" if self.chat.system_prompt.strip() else ""
        size = (f": it needs {n_prompt:,} tokens{system}, the context holds {n_ctx:,} and one"
                f" must be left for the reply" if n_prompt else f" ({n_ctx:,} tokens)")
        text = (f"Your message does not fit in the model's context even alone{size}."
                " Dropping earlier turns cannot make room: shorten it, or load the model with"
                " a larger context (--ctx).")

        def chosen(answer: str | None) -> None:
            self.run_worker(self._context_choice("new" if answer == "new" else "edit",
                                                 unanswered=True), group="context")

        self.push_screen(ErrorScreen("The message is too long for this model", text,
                                     [("edit", "Edit it"), ("new", "Move to a new chat")]),
                         chosen)

    def _context_full(self, text: str, *, unanswered: bool) -> None:
        def chosen(answer: str | None) -> None:
            self.run_worker(self._context_choice(answer, unanswered), group="context")

        self.push_screen(ContextFullScreen(
            text + " Drop the oldest turns (they stay in the transcript but are no longer"
            " sent), or start a new chat.", id="context-full"), chosen)

    async def _context_choice(self, answer: str | None, unanswered: bool) -> None:
        if answer == "drop":
            if unanswered:  # drop turns until the message fits
                self._drop_from = self.chat.context_start
                await self._drop_oldest_turn_and_resend()
            else:
                self._drop_next_for = self.chat.id
                self.notify("Your next message will be sent after dropping as many of the"
                            " oldest turns as it needs to fit.")
        elif answer == "new":
            text = await self._take_back_last_message() if unanswered else None
            await self.action_new_chat()
            if text:
                self.query_one(ChatInput).load_text(text)
        elif unanswered:
            await self._take_back_last_message()

    async def _take_back_last_message(self) -> str | None:
        """Remove the unanswered last user message from the chat and put it back in the
        input, so nothing the user typed is lost."""
        messages = self.chat.messages
        if not messages or messages[-1].role != "user":
            return None
        text = messages.pop().content
        if not messages:  # it was the chat's only message: the chat is new again
            self.chat.title = ""
        self._save()
        await self._render_chat()
        self.query_one(ChatInput).load_text(text)
        return text

    def _save(self, streaming: ChatMessage | None = None) -> None:
        try:
            if self.chat.messages:
                self.chats.save(self.chat, streaming=streaming)
            else:  # its only message was taken back (or nothing was said yet)
                self.chats.delete(self.chat.id)
        except LocalInferError as exc:
            self.notify(exc.message, title="Chat not saved", severity="error")

    # --- the status bar -------------------------------------------------------------------
    def _show_status(self) -> None:
        status = self.query_one(StatusBar)
        session = self.session
        reply = self.reply
        info = session.info if session else None
        where = ("in-process" if session.in_process else "daemon") if session else ""
        context = self.context_tokens
        at_least = self._context_at_least
        if reply is not None:
            n = reply.live.n_tokens if reply.live else 0
            if reply.prompt_tokens is not None:
                context, at_least = reply.prompt_tokens + n, False
            else:  # the daemon counts the prompt only when the reply ends
                context, at_least = (context or 0) + n, True
        loading = f"{self.loading}" if self.loading else (
            f"no model: {self.load_error.one_line()}" if self.load_error else "")
        status.show_model(info, where, context, at_least=at_least, loading=loading)
        position = context or 0
        if reply is not None:
            live = reply.live
            status.show_speed(decode_tps=live.decode_tps if live else 0.0,
                              ttft_ms=live.ttft_ms if live else 0.0,
                              prefill_tps=live.prefill_tps if live else 0.0,
                              n_tokens=live.n_tokens if live else 0,
                              samples=reply.tracker.samples, waiting=live is None)
            decode = live.decode_tps if live else 0.0
        elif self._last_stats is not None:
            s = self._last_stats
            status.show_speed(decode_tps=s.decode_tps, ttft_ms=s.ttft_ms,
                              prefill_tps=s.prefill_tps, n_tokens=s.completion_tokens,
                              samples=status.query_one("#status-spark", Sparkline).data or [],
                              last=True)
            decode = s.decode_tps
        else:
            status.show_speed(decode_tps=0, ttft_ms=0, prefill_tps=0, n_tokens=0, samples=[])
            decode = 0.0
        if self.hardware is None:
            note = "roofline: probing the hardware…"
        elif self._measuring:
            note = "roofline: measuring the memory bandwidth (once per machine)…"
        else:
            note = "roofline: memory bandwidth unknown (`localinfer hw` measures it)"
        reference = self.reference if session else None
        predicted = reference.predicted_tps(position) if reference else None
        status.show_roofline(reference.roofline if reference else None, decode_tps=decode,
                             position=position, predicted_tps=predicted, bandwidth_note=note)

    # --- actions ----------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("quit", "toggle_theme", "save_svg"):
            return True
        if len(self.screen_stack) > 1 and action in MAIN_SCREEN_ACTIONS:
            return False  # the chat's keys are hidden while another screen is up
        if action == "cancel_reply":
            return self.reply is not None
        return True

    def action_cancel_reply(self) -> None:
        reply = self.reply
        if reply is None:
            return
        reply.cancel_requested = True
        if reply.generation is not None:
            reply.generation.cancel()  # thread-safe: the engine stops within one token

    def _cancel_reply_then(self, action: Callable[[], Awaitable[None] | None]) -> bool:
        """While a reply streams: cancel it (its partial text is kept and saved, as on Esc)
        and run ``action`` once it has ended. False when no reply streams."""
        if self.reply is None:
            return False
        self._after_reply = action
        self.action_cancel_reply()
        self.notify("Cancelled the reply; its partial text is kept (marked ✂).")
        return True

    async def _run_after_reply(self) -> bool:
        """Run what a key asked for while the reply streamed; whether there was such."""
        action, self._after_reply = self._after_reply, None
        if action is None:
            return False
        result = action()
        if inspect.isawaitable(result):
            await result
        return True

    async def action_new_chat(self) -> None:
        if self._cancel_reply_then(self.action_new_chat):
            return
        old = self.chat
        self.chat = self.chats.new(system_prompt=old.system_prompt,
                                   temperature=old.temperature, max_tokens=old.max_tokens)
        self.context_tokens = None
        self._last_stats = None
        await self._render_chat()
        self.query_one("#status-spark", Sparkline).data = []
        self._show_status()
        self.query_one(ChatInput).focus()

    def action_chats(self) -> None:
        if self._cancel_reply_then(self.action_chats):
            return

        def chosen(choice: ChatChoice | None) -> None:
            if choice is None:
                return
            self.run_worker(self._open_chat(choice), group="chats")

        self.push_screen(ChatsScreen(self.chats, self.chat.id if self.chat.messages else None),
                         chosen)

    async def _open_chat(self, choice: ChatChoice) -> None:
        if choice.action == "new":
            await self.action_new_chat()
            return
        try:
            self.chat = self.chats.load(choice.chat_id or "")
        except LocalInferError as exc:
            self.notify(exc.message, title="Cannot open", severity="error")
            return
        await self._render_chat()
        self.query_one("#status-spark", Sparkline).data = []
        self._show_status()
        if self.chat.model and self.session is not None and \
                self.chat.model not in (self.session.model, self.session.info.name):
            self.notify(f"This chat used {self.chat.model}; Ctrl+O switches models.")

    @on(ChatsChanged)
    async def _chats_changed(self, event: ChatsChanged) -> None:
        if event.chat_id != self.chat.id:
            return
        if event.deleted:
            self.chat = self.chats.new(temperature=self.chat.temperature,
                                       max_tokens=self.chat.max_tokens)
            await self._render_chat()
        else:
            try:
                self.chat.title = self.chats.load(event.chat_id).title
            except LocalInferError:
                pass
        self._show_status()

    def action_models(self) -> None:
        if self._cancel_reply_then(self.action_models):
            return

        def chosen(choice: ModelChoice | None) -> None:
            if choice is not None and choice.name != (self.session.model if self.session
                                                      else None):
                self.connect(choice.name)

        current = self.session.model if self.session else self.model_name
        session = self.session
        self.push_screen(ModelsScreen(self.launcher.store, self.hardware, current,
                                      self.launcher.config, calibration=self.calibration,
                                      loaded=lambda: loaded_rows(session)),
                         chosen)

    def action_settings(self) -> None:
        chat = self.chat

        def chosen(settings: ChatSettings | None) -> None:
            if settings is None:
                return
            chat.system_prompt = settings.system_prompt
            chat.temperature = settings.temperature
            chat.max_tokens = settings.max_tokens
            self._save()
            self.notify("Saved this chat's settings.")

        self.push_screen(SettingsScreen(ChatSettings(chat.system_prompt, chat.temperature,
                                                     chat.max_tokens)), chosen)

    def action_copy_reply(self) -> None:
        last = self.chat.last_reply()
        if last is None:
            self.notify("There is no reply to copy yet.")
            return
        self.copy_to_clipboard(last.content)
        self.notify(f"Copied the last reply ({len(last.content):,} characters).")

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_save_svg(self) -> None:
        path = self.save_screenshot(path=str(Path.cwd()))
        self.notify(f"Saved {path}")

    async def action_quit(self) -> None:
        reply = self.reply
        if reply is not None:
            # Quitting mid-reply: keep what streamed so far, marked cancelled, like Esc.
            self.action_cancel_reply()
            text = (reply.widget.markdown.source or "") + "".join(reply.pending)
            self.reply = None
            if text:
                self.chat.add(ChatMessage("assistant", text, model=reply.model,
                                          finish_reason="cancelled"))
                self._save()
        self.exit()

    def on_unmount(self) -> None:
        if self.reply is not None and self.reply.generation is not None:
            self.reply.generation.cancel()
        if self.session is not None:
            try:
                self.session.close()
            except Exception:  # noqa: BLE001 - leaving anyway
                log.debug("closing the session failed", exc_info=True)
        self.launcher.close()


def _reply_stats(done: Done, reply: Reply, roofline: Roofline | None) -> ReplyStats:
    """The figures that stay under a reply. One cancelled through the daemon ends without the
    engine's timings (the stream is closed): the last token's measured figures stand in."""
    live = reply.live
    if done.timings.completion_tokens or live is None or done.finish_reason != "cancelled":
        usage, decode_tps = done.usage, done.timings.decode_tps
        figures: dict[str, Any] = {}
    else:
        prompt = done.usage.prompt_tokens or reply.prompt_tokens or 0
        usage, decode_tps = Usage(prompt, live.n_tokens), live.decode_tps
        figures = {"completion_tokens": live.n_tokens, "decode_tps": round(decode_tps, 2),
                   "ttft_ms": round(live.ttft_ms, 1), "prefill_tps": round(live.prefill_tps, 1),
                   "prompt_tokens": prompt}
    pct = None
    if roofline is not None:
        pct = roofline.percent(decode_tps, usage.prompt_tokens + usage.completion_tokens // 2)
    return replace(ReplyStats.from_done(done, pct), **figures)


def create_app(model: str | None = None, *, config: Config | None = None,
               no_daemon: bool = False, resume: str | None = None,
               hardware: Any = None, calibration: dict[str, float] | None = None,
               open_engine: EngineOpener | None = None, serve_args: Sequence[str] = (),
               start_daemon: bool = True, store: Any = None, chats: ChatStore | None = None,
               theme: str | None = None) -> ChatApp:
    """The chat app, as ``localinfer chat`` runs it. Tests pass a recorded ``hardware``
    profile and an ``open_engine`` that builds an engine on the fake backend."""
    from ..config import load_config

    config = config or load_config()
    launcher = Launcher(config, no_daemon=no_daemon, open_engine=open_engine, store=store,
                        serve_args=serve_args, if_no_daemon="start" if start_daemon else "fail")
    return ChatApp(launcher, chats or ChatStore(), model=model, resume=resume,
                   hardware=hardware, calibration=calibration, theme=theme)
