"""``localinfer chat``: the Textual chat UI's shell.

The app composes the chat screen, holds the key bindings and opens the other screens; it gets
a model ready through the core's ``localinfer.session`` from a thread worker, which posts
messages back (as Textual's examples/mother.py and harlequin do), so the UI never waits on the
model. The conversation on the chat screen is conversation.py's, the status bar and the machine
figures behind it status.py's.

``create_app`` builds the app for the CLI and for the tests and snapshots alike.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from textual import events, on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ..chats import Chat, ChatStore
from ..config import Config, load_config
from ..errors import DaemonError, LocalInferError
from ..sampling_defaults import SamplingDefaults
from ..session import (
    EngineOpener,
    Launcher,
    LoadStep,
    ModelRow,
    Session,
    loaded_candidate,
    loaded_rows,
)
from .conversation import ChatScreen
from .reply import Reply
from .screens import (
    ChatChoice,
    ChatsChanged,
    ChatSettings,
    ChatsScreen,
    ErrorScreen,
    HelpScreen,
    ModelChoice,
    ModelsScreen,
    SettingsScreen,
    TextPrompt,
)
from .status import HardwareReady, StatusBar
from .widgets import ChatInput, FileChips, LoadingPanel, Transcript

if TYPE_CHECKING:
    from ..hardware import HardwareProfile
    from ..planner import Candidate
    from ..store import ModelStore

log = logging.getLogger(__name__)

BASE_MODEL_NOTE = "base model: continues text, does not follow instructions · Ctrl+O: models"
"""Under the title bar while a base model is loaded (it fits in 80 columns)."""
MAIN_SCREEN_ACTIONS = {"cancel_reply", "new_chat", "chats", "models", "settings",
                       "copy_reply", "help", "think", "attach", "regenerate", "edit",
                       "scroll_transcript", "interrupt"}
"""The chat screen's keys: hidden while another screen is up."""


# --- messages from the connecting worker -------------------------------------------------------
class LoadProgress(Message):
    def __init__(self, step: LoadStep) -> None:
        super().__init__()
        self.step = step


class SessionReady(Message):
    def __init__(self, session: Session, candidate: Candidate | None,
                 defaults: SamplingDefaults, offer: ModelRow | None = None) -> None:
        super().__init__()
        self.session = session
        self.candidate = candidate
        self.defaults = defaults
        self.offer = offer


class SessionFailed(Message):
    def __init__(self, model: str | None, error: LocalInferError) -> None:
        super().__init__()
        self.model = model
        self.error = error


SHORT_ROWS = 16
"""Below this many rows the title and key bars are hidden (the transcript had 2 rows at 10)."""
TINY_ROWS = 12
"""Below this many the status bar too: the message box and a few lines of the conversation."""


class ChatApp(App[None]):
    """The chat screen (transcript, live status bar, input: ``ChatScreen`` runs the
    conversation, ``StatusBar`` the figures), the session it talks to, and the other screens on
    keys."""

    CSS_PATH = "chat.tcss"
    TITLE = "localinfer chat"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("escape", "cancel_reply", "Cancel"),
        # Ctrl+C stops a reply, as in a terminal program; otherwise Textual's hint to quit.
        Binding("ctrl+c", "interrupt", show=False),
        # The conversation scrolls from the message box (which keeps the focus).
        Binding("pageup", "scroll_transcript(-1)", show=False, priority=True),
        Binding("pagedown", "scroll_transcript(1)", show=False, priority=True),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+r", "chats", "Chats"),
        Binding("ctrl+o", "models", "Models"),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("f2", "copy_reply", "Copy"),
        Binding("f3", "attach", "File"),
        Binding("f4", "edit", "Edit"),
        Binding("f5", "regenerate", "Regen"),
        Binding("f8", "think", "Think"),
        Binding("ctrl+t", "toggle_theme", "Theme", show=False),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("f12", "save_svg", "Screenshot", show=False),
    ]

    def __init__(self, launcher: Launcher, chats: ChatStore, *, model: str | None = None,
                 resume: str | None = None, hardware: HardwareProfile | None = None,
                 calibration: dict[str, float] | None = None, theme: str | None = None,
                 measure_bandwidth: bool = True) -> None:
        super().__init__()
        if theme:
            self.theme = theme
        self.launcher = launcher
        self.chats = chats
        self.requested_model = model
        self.resume = resume
        self.session: Session | None = None
        self.loading: str | None = None
        self.load_error: LocalInferError | None = None
        self.model_name: str | None = model
        self.defaults = SamplingDefaults()
        """The loaded model's default sampling."""
        self.offer: ModelRow | None = None
        """With only base models installed: the instruct model the planner picks here."""
        self.status = StatusBar(launcher, hardware=hardware, calibration=calibration,
                                measure_bandwidth=measure_bandwidth, id="status")
        self.conversation = ChatScreen(self, chats)

    @property
    def chat(self) -> Chat:
        return self.conversation.chat

    @property
    def reply(self) -> Reply | None:
        """The reply streaming now."""
        return self.conversation.reply

    @property
    def hardware(self) -> HardwareProfile | None:
        return self.status.hardware

    # --- layout ---------------------------------------------------------------------------
    def get_default_screen(self) -> Screen:
        return self.conversation

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(BASE_MODEL_NOTE, id="model-note", markup=False)
        yield Transcript(id="transcript")
        yield LoadingPanel(id="loading")
        yield self.status
        yield FileChips(id="files")
        yield ChatInput(id="input", placeholder="Message (Enter sends, Ctrl+J new line)")
        yield Footer()

    def on_resize(self, event: events.Resize) -> None:
        """Make room for the message box in a short window: the title and key bars go first,
        then the status bar (below SHORT_ROWS and TINY_ROWS rows)."""
        self.conversation.set_class(event.size.height < SHORT_ROWS, "-short")
        self.conversation.set_class(event.size.height < TINY_ROWS, "-tiny")

    async def on_mount(self) -> None:
        self.query_one(Footer).compact = True
        self.query_one(FileChips).display = False
        if self.resume:
            chat = self.conversation.resume(self.resume)
            if chat is not None:
                self.model_name = self.model_name or chat.model
        await self.conversation.render_chat()
        self.query_one(ChatInput).focus()
        self.show_status()
        self.connect(self.model_name)

    def show_status(self) -> None:
        loading = f"{self.loading}" if self.loading else (
            f"no model: {self.load_error.one_line()}" if self.load_error else "")
        self.status.show(self.session, self.conversation.figures(), loading=loading)

    # --- connecting -----------------------------------------------------------------------
    def connect(self, model: str | None) -> None:
        self.loading = model or "the model"
        self.load_error = None
        panel = self.query_one(LoadingPanel)
        panel.display = True
        panel.show_step(f"Getting {self.loading} ready…", None)
        self.show_status()
        self._connect(model, self.session)

    @work(thread=True, exclusive=True, exit_on_error=False, group="connect")
    def _connect(self, model: str | None, old: Session | None) -> None:
        try:
            if self.hardware is None:
                self.post_message(HardwareReady(
                    *self.launcher.probe_hardware(measure_bandwidth=False)))
            if model is None:
                model = self.launcher.pick_model(self.hardware)
            self.post_message(LoadProgress(LoadStep(f"Getting {model} ready…")))
            if old is not None and self.launcher.in_process:
                old.close()  # two models at once may not fit: free the old one first
            def on_step(step: LoadStep) -> None:
                self.post_message(LoadProgress(step))

            session = self.launcher.open(model, on_step)
            offer = None
            if session.info.base_model and self.hardware is not None:
                offer = self.launcher.instruct_offer(self.hardware,
                                                     calibration=self.status.calibration)
            self.post_message(SessionReady(session, loaded_candidate(session.info),
                                           self.launcher.sampling_defaults(session), offer))
        except LocalInferError as exc:
            self.post_message(SessionFailed(model, exc))
        except Exception as exc:  # noqa: BLE001 - a bug shows in the UI, not as a traceback
            log.exception("connecting failed")
            self.post_message(SessionFailed(model, LocalInferError(
                f"internal error: {type(exc).__name__}: {exc}")))

    @on(LoadProgress)
    def _load_progress(self, event: LoadProgress) -> None:
        if self.loading is not None:
            self.query_one(LoadingPanel).show_step(event.step.message, event.step.fraction)
            self.loading = event.step.message
            self.show_status()

    @on(HardwareReady)
    def _hardware_ready(self, event: HardwareReady) -> None:
        if self.status.use_hardware(event.hardware, event.calibration, self.session):
            self.show_status()

    @on(SessionReady)
    async def _session_ready(self, event: SessionReady) -> None:
        self.session = event.session
        self.defaults = event.defaults
        self.offer = event.offer
        self.model_name = event.session.model
        self.loading = None
        self.query_one(LoadingPanel).display = False
        self.sub_title = f"{event.session.info.name} · {self.chat.display_title}"
        self.query_one("#model-note").display = event.session.info.base_model
        self.status.model_loaded(event.session, event.candidate)
        self.conversation.model_ready()
        self.show_status()
        self.status.measure_if_unknown()
        self.conversation.call_later(self.conversation.send_waiting)

    @on(SessionFailed)
    def _session_failed(self, event: SessionFailed) -> None:
        self.loading = None
        self.load_error = event.error
        self.session = None
        self.query_one(LoadingPanel).display = False
        self.query_one("#model-note").display = False
        self.show_status()
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

        self.push_screen(ErrorScreen(title, error.one_line(), buttons, id="session-failed"),
                         chosen)

    # --- actions ----------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("quit", "toggle_theme", "save_svg"):
            return True
        if len(self.screen_stack) > 1 and action in MAIN_SCREEN_ACTIONS:
            return False  # the chat's keys are hidden while another screen is up
        if action == "cancel_reply":
            return self.reply is not None or self.conversation.editing is not None
        return True

    def action_cancel_reply(self) -> None:
        if self.reply is None and self.conversation.editing is not None:
            self.conversation.stop_editing()
            return
        self.conversation.cancel_reply()

    def action_scroll_transcript(self, pages: int) -> None:
        transcript = self.query_one("#transcript", Transcript)
        if pages < 0:
            transcript.scroll_page_up()
        else:
            transcript.scroll_page_down()

    def action_interrupt(self) -> None:
        if self.reply is not None:
            self.conversation.cancel_reply()
        else:
            self.action_help_quit()

    def action_think(self) -> None:
        self.conversation.cycle_think()

    def action_attach(self) -> None:
        def chosen(path: str | None) -> None:
            if path:
                self.conversation.call_later(self.conversation.attach, path.strip())

        self.push_screen(TextPrompt("Attach a text file: its path", ""), chosen)

    def action_regenerate(self) -> None:
        self.conversation.call_later(self.conversation.regenerate)

    def action_edit(self) -> None:
        self.conversation.call_later(self.conversation.edit_last)

    def action_new_chat(self) -> None:
        if self.conversation.cancel_reply_then(self.action_new_chat):
            return
        self.conversation.call_later(self.conversation.new_chat)

    def action_chats(self) -> None:
        if self.conversation.cancel_reply_then(self.action_chats):
            return

        def chosen(choice: ChatChoice | None) -> None:
            if choice is None:
                return
            self.run_worker(self.conversation.open_chat(choice), group="chats")

        self.push_screen(ChatsScreen(self.chats, self.chat.id if self.chat.messages else None),
                         chosen)

    @on(ChatsChanged)
    def _chats_changed(self, event: ChatsChanged) -> None:
        self.conversation.call_later(self.conversation.chat_changed, event.chat_id,
                                     deleted=event.deleted)

    def action_models(self, pull: str | None = None) -> None:
        """Ctrl+O; ``pull``: a catalog model whose download the user agreed to (the first
        run's offer), started at once."""
        if self.conversation.cancel_reply_then(self.action_models):
            return

        def chosen(choice: ModelChoice | None) -> None:
            if choice is not None and choice.name != (self.session.model if self.session
                                                      else None):
                self.connect(choice.name)

        current = self.session.model if self.session else self.model_name
        session = self.session
        self.push_screen(ModelsScreen(self.launcher, self.hardware, current,
                                      calibration=self.status.calibration,
                                      loaded=lambda: loaded_rows(session), pull=pull),
                         chosen)

    def action_settings(self) -> None:
        chat = self.chat

        def chosen(settings: ChatSettings | None) -> None:
            if settings is None:
                return
            chat.system_prompt = settings.system_prompt
            chat.temperature = settings.temperature
            chat.max_tokens = settings.max_tokens
            chat.top_p, chat.top_k = settings.top_p, settings.top_k
            chat.repeat_penalty = settings.repeat_penalty
            chat.think = settings.think
            if chat.messages:
                self.conversation.save()
            self.notify("Saved this chat's settings.")

        self.push_screen(SettingsScreen(ChatSettings(
            chat.system_prompt, chat.temperature, chat.max_tokens, chat.top_p, chat.top_k,
            chat.repeat_penalty, chat.think), self.defaults), chosen)

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
        self.conversation.keep_partial_reply()
        self.exit()

    def on_unmount(self) -> None:
        self.conversation.stop_generation()
        if self.session is not None:
            try:
                self.session.close()
            except Exception:  # noqa: BLE001 - leaving anyway
                log.debug("closing the session failed", exc_info=True)
        self.launcher.close()


def create_app(model: str | None = None, *, config: Config | None = None,
               no_daemon: bool = False, resume: str | None = None,
               hardware: HardwareProfile | None = None,
               calibration: dict[str, float] | None = None,
               open_engine: EngineOpener | None = None, serve_args: Sequence[str] = (),
               start_daemon: bool = True, store: ModelStore | None = None,
               chats: ChatStore | None = None, theme: str | None = None) -> ChatApp:
    """The chat app, as ``localinfer chat`` runs it. Tests pass a recorded ``hardware``
    profile and an ``open_engine`` that builds an engine on the fake backend."""
    config = config or load_config()
    launcher = Launcher(config, no_daemon=no_daemon, open_engine=open_engine, store=store,
                        serve_args=serve_args, if_no_daemon="start" if start_daemon else "fail")
    return ChatApp(launcher, chats or ChatStore(), model=model, resume=resume,
                   hardware=hardware, calibration=calibration, theme=theme)
