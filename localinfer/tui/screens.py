"""The chat UI's other screens: models, chats, per-chat settings, help, and the dialogs for
errors and a full context. Slow work (planning, pulling) runs in thread workers that post
messages back; the screens only render and return the user's choice with ``dismiss``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import (
    Button,
    DataTable,
    Footer,
    Header,
    Input,
    Label,
    Markdown,
    ProgressBar,
    Static,
)

from ..chats import ChatStore, ChatSummary, check_settings
from ..errors import LocalInferError
from ..progress import human_bytes
from ..runtime.types import DEFAULT_SAMPLING
from ..sampling_defaults import SamplingDefaults
from ..session import Launcher, LoadedRow, ModelRow
from .figures import tps
from .widgets import EnterSubmits

if TYPE_CHECKING:
    from ..hardware import HardwareProfile
    from ..store import PullProgress

HELP = """\
# localinfer chat

| key | does |
|---|---|
| **Enter** | send the message |
| **Shift+Enter**, **Ctrl+J** | new line in the message |
| **Up** / **Down** on the first / last line | earlier prompts |
| **Esc**, **Ctrl+C** | cancel the reply (the partial text is kept, marked ✂) |
| **PageUp** / **PageDown** | scroll the conversation |
| **Ctrl+N** | new chat, with this chat's settings (system prompt, sampling, max tokens) |
| **Ctrl+R** | chats: resume, rename (r), delete (d) |
| **Ctrl+O** | models: switch, pull; the planner's verdict for this machine |
| **Ctrl+S** | this chat's system prompt, sampling and thinking (Enter saves, Esc cancels) |
| **F2** | copy the last reply to the clipboard |
| **F3** | attach a text file (`/file PATH`, or paste a path alone); a chip shows its tokens |
| **F4** | edit your last message and send it again (Esc stops editing) |
| **F5** | regenerate the last reply (the earlier ones are kept: **←/→** on the reply) |
| **Shift+Tab**, then **Enter** | focus the last reply; Enter unfolds its reasoning |
| **F8** | thinking: the model's default, on, off (or `/think on`, `off`, `low`...) |
| **Ctrl+T** | light / dark theme |
| **F1** | this help |
| **Ctrl+Q** | quit (the daemon keeps the model warm for editors) |

## The numbers

*Measured* while the reply streams, by the engine: **decode** tok/s (tokens after the first
over the time since the first), **TTFT** (submit to first token), **prefill** tok/s (prompt
tokens evaluated over the time to read them), tokens in the **context** / its size. The
**sparkline** is the decode rate over the current reply: tokens over wall time across the
last 8 tokens, measured by this UI as they arrive.

*Predicted*: the **roofline** is the fastest decode memory bandwidth allows: one token reads
every weight of the model (per layer, from the GGUF header) and the KV cache so far, so
ceiling = bandwidth ÷ bytes per token (with layers on a GPU: the sum of each device's bytes
over its bandwidth). The host bandwidth is *measured* (`localinfer hw`, cached), a GPU's is
its data sheet's. Decode as a **% of the roofline** says how close the machine runs to its
memory limit. **plan** is the planner's predicted decode speed for this placement
(`localinfer plan`), calibrated by earlier runs on this machine.

The line under each reply keeps its measured figures; **✂** marks a cancelled reply. A
thinking model's reasoning is folded above its answer ("Thought for N s", its tokens and
speed, measured by the session from its first token to the answer's first); the answer's own
TTFT and decode then count from its first token.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "close", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body", classes="dialog"):
            yield Markdown(HELP)

    def action_close(self) -> None:
        self.dismiss(None)


# --- dialogs ---------------------------------------------------------------------------------
class ErrorScreen(ModalScreen[str | None]):
    """An error the user can act on: a title, what happened, and buttons (the first is the
    default: highlighted, and focused, so Enter chooses it)."""

    BINDINGS = [Binding("escape", "close", "Close")]

    def __init__(self, title: str, message: str, buttons: list[tuple[str, str]],
                 *, icon: str = "⚠ ", **kwargs: str | None) -> None:
        super().__init__(**kwargs)
        self.icon = icon
        self.title_text = title
        self.message = message
        self.buttons = buttons

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog error-dialog"):
            yield Label(f"{self.icon}{self.title_text}", classes="dialog-title", markup=False)
            yield Static(self.message, classes="dialog-text", markup=False)
            with Horizontal(classes="buttons"):
                for i, (ident, label) in enumerate(self.buttons):
                    yield Button(label, id=ident, variant="primary" if i == 0 else "default")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id)

    def action_close(self) -> None:
        self.dismiss(None)


class ContextFullScreen(ErrorScreen):
    """The conversation no longer fits the model's context."""

    def __init__(self, message: str, *, id: str | None = None) -> None:
        super().__init__("The context is full", message,
                         [("summarise", "Summarise older turns"),
                          ("drop", "Drop oldest"), ("new", "New chat"),
                          ("cancel", "Cancel")], id=id)


class ConfirmScreen(ErrorScreen):
    """A yes/no question before something that cannot be taken back. Cancel comes first, so
    it is the focused default: Enter alone never confirms."""

    def __init__(self, title: str, message: str, confirm: str, **kwargs: str | None) -> None:
        super().__init__(title, message, [("no", "Cancel"), ("yes", confirm)], icon="",
                         **kwargs)


class TextPrompt(ModalScreen[str | None]):
    """Ask for one line of text (a chat's new name)."""

    BINDINGS = [Binding("escape", "close", "Cancel")]

    def __init__(self, title: str, value: str, **kwargs: str | None) -> None:
        super().__init__(**kwargs)
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Input(self.value, id="prompt-input")
            yield Label("Enter saves, Esc cancels", classes="dialog-hint")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_close(self) -> None:
        self.dismiss(None)


@dataclass(frozen=True)
class ChatSettings:
    system_prompt: str
    temperature: float | None
    """None: the model's default (as the other sampling fields)."""
    max_tokens: int
    top_p: float | None = None
    top_k: int | None = None
    repeat_penalty: float | None = None
    think: bool | str | None = None


_THINK_CHOICES = {"": None, "default": None, "on": True, "off": False, "low": "low",
                  "medium": "medium", "high": "high"}


def _think_word(value: bool | str | None) -> str:
    return {None: "", True: "on", False: "off"}.get(value, str(value)) if not isinstance(
        value, str) else value


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """This chat's system prompt, sampling and thinking. A sampling field left empty takes
    the model's default, shown greyed with its source (the catalog's model card, the file's
    metadata, config.toml, or llama.cpp's). Enter saves from any field, as it sends from the
    message box (Ctrl+J starts a new line in the system prompt, as there)."""

    BINDINGS = [Binding("escape", "close", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, settings: ChatSettings, defaults: SamplingDefaults | None = None,
                 **kwargs: str | None) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.defaults = defaults or SamplingDefaults()

    def _default(self, name: str) -> str:
        value = self.defaults.values.get(name, getattr(DEFAULT_SAMPLING, name))
        return f"{value:g}"

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical(classes="dialog", id="settings"):
            yield Label("This chat's settings", classes="dialog-title")
            yield Label("System prompt (sent before the conversation)")
            yield EnterSubmits(s.system_prompt, id="system-prompt")
            with Horizontal(classes="fields"):
                yield Label("Temperature")
                yield Input(_blank(s.temperature), placeholder=self._default("temperature"),
                            id="temperature")
                yield Label("Top-p")
                yield Input(_blank(s.top_p), placeholder=self._default("top_p"), id="top-p")
                yield Label("Top-k")
                yield Input(_blank(s.top_k), placeholder=self._default("top_k"), id="top-k",
                            type="integer")
            with Horizontal(classes="fields"):
                yield Label("Repeat penalty")
                yield Input(_blank(s.repeat_penalty),
                            placeholder=self._default("repeat_penalty"), id="repeat-penalty")
                yield Label("Max tokens")
                yield Input(str(s.max_tokens), id="max-tokens", type="integer")
                yield Label("Think")
                yield Input(_think_word(s.think), placeholder="model", id="think")
            sources = self.defaults.summary() or "none: llama.cpp's"
            yield Static(f"A field left empty takes the model's default (greyed). Its defaults:"
                         f" {sources}. Think: on, off, low, medium or high.",
                         id="settings-defaults", classes="dialog-hint", markup=False)
            yield Label("Enter saves · Ctrl+J: new line in the system prompt · Esc cancels",
                        id="settings-hint", classes="dialog-hint")
            yield Label("", id="settings-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save", id="save", variant="primary")
                yield Button("Cancel", id="cancel")

    def action_save(self) -> None:
        error = self.query_one("#settings-error", Label)

        def field(ident: str) -> str:
            return self.query_one(f"#{ident}", Input).value.strip()

        try:
            temperature = _optional(field("temperature"), float)
            top_p = _optional(field("top-p"), float)
            top_k = _optional(field("top-k"), int)
            repeat_penalty = _optional(field("repeat-penalty"), float)
            max_tokens = int(field("max-tokens"))
        except ValueError:
            error.update("Sampling fields must be numbers (top-k and max tokens whole ones),"
                         " or empty for the model's default.")
            return
        think_word = field("think").lower()
        if think_word not in _THINK_CHOICES:
            error.update("Think must be on, off, low, medium, high, or empty.")
            return
        try:
            check_settings(max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                           repeat_penalty=repeat_penalty)
        except LocalInferError as exc:
            error.update(exc.message)
            return
        self.dismiss(ChatSettings(self.query_one("#system-prompt", EnterSubmits).text.strip(),
                                  temperature, max_tokens, top_p, top_k, repeat_penalty,
                                  _THINK_CHOICES[think_word]))

    @on(Button.Pressed, "#save")
    @on(Input.Submitted)
    @on(EnterSubmits.Submitted)
    def save_pressed(self, event: Message) -> None:
        event.stop()  # the main screen's message box must not take it as a message to send
        self.action_save()

    @on(Button.Pressed, "#cancel")
    def action_close(self) -> None:
        self.dismiss(None)


def _blank(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def _optional(text: str, kind: type) -> Any:
    return None if not text else kind(text)


# --- chats -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChatChoice:
    action: str
    """"open" or "new"."""
    chat_id: str | None = None


class ChatsScreen(Screen[ChatChoice | None]):
    """Previous chats, most recent first: resume, rename, delete."""

    BINDINGS = [
        Binding("escape", "close", "Back"),
        Binding("enter", "open", "Open", priority=True),
        Binding("n", "new", "New chat"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
    ]

    def __init__(self, store: ChatStore, current_id: str | None, **kwargs: str | None) -> None:
        super().__init__(**kwargs)
        self.store = store
        self.current_id = current_id
        self.summaries: list[ChatSummary] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield Label("", id="chats-title")
        yield DataTable(id="chats-table", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Chats"
        table = self.query_one(DataTable)
        table.add_column("", key="mark", width=1)
        table.add_column("CHAT", key="title")
        table.add_column("MSGS", key="n")
        table.add_column("UPDATED", key="updated")
        table.add_column("MODEL", key="model")
        self.reload()

    def reload(self) -> None:
        self.summaries = self.store.summaries()
        table = self.query_one(DataTable)
        table.clear()
        for s in self.summaries:
            table.add_row("●" if s.id == self.current_id else "", s.title, str(s.n_messages),
                          time.strftime("%Y-%m-%d %H:%M", time.localtime(s.updated)),
                          s.model or "", key=s.id)
        n = len(self.summaries)
        self.query_one("#chats-title", Label).update(
            f"{n} saved chat{'s' if n != 1 else ''}, the most recent first" if n else
            "No saved chats yet: a chat is saved with its first message.")

    def _selected(self) -> ChatSummary | None:
        table = self.query_one(DataTable)
        if not self.summaries or table.cursor_row is None:
            return None
        return self.summaries[min(table.cursor_row, len(self.summaries) - 1)]

    def action_open(self) -> None:
        chosen = self._selected()
        if chosen is not None:
            self.dismiss(ChatChoice("open", chosen.id))

    @on(DataTable.RowSelected)
    def row_selected(self) -> None:
        self.action_open()

    def action_new(self) -> None:
        self.dismiss(ChatChoice("new"))

    def action_close(self) -> None:
        self.dismiss(None)

    def action_rename(self) -> None:
        chosen = self._selected()
        if chosen is None:
            return

        def done(title: str | None) -> None:
            if title is None:
                return
            try:
                self.store.rename(chosen.id, title)
            except LocalInferError as exc:
                self.notify(exc.message, title="Cannot rename", severity="error")
            self.reload()
            self.app.post_message(ChatsChanged(chosen.id))

        self.app.push_screen(TextPrompt("Rename the chat", chosen.title), done)

    def action_delete(self) -> None:
        chosen = self._selected()
        if chosen is None:
            return

        def done(answer: str | None) -> None:
            if answer != "yes":
                return
            try:
                self.store.delete(chosen.id)
            except LocalInferError as exc:
                self.notify(exc.message, title="Cannot delete", severity="error")
            self.reload()
            self.app.post_message(ChatsChanged(chosen.id, deleted=True))

        self.app.push_screen(ConfirmScreen(
            "Delete this chat?", f"“{chosen.title}” ({chosen.n_messages} messages) will be"
            " deleted from the disk.", "Delete"), done)


class ChatsChanged(Message):
    def __init__(self, chat_id: str, deleted: bool = False) -> None:
        super().__init__()
        self.chat_id = chat_id
        self.deleted = deleted


# --- models ----------------------------------------------------------------------------------
def download_question(row: ModelRow) -> str:
    """What a user weighs before pulling a catalog model: its size, and the plan's verdict and
    predicted speed for this machine."""
    size = human_bytes(row.size_bytes) + (" (estimated from the catalog)"
                                          if row.size_estimated else "")
    verdict = "cannot tell" if row.fits is None else row.verdict
    speed = f"{tps(row.decode_tps)} tok/s" if row.decode_tps > 0 else "unknown"
    return (f"{size} to download.\nThe plan for this machine: {verdict} — {row.reason}.\n"
            f"Predicted decode: {speed}.")


def loaded_text(model: LoadedRow) -> str:
    """A loaded model's cell (the title says where): its memory and device split, and
    whether it is answering now."""
    return f"{model.memory}, {model.processor}" + (", answering" if model.in_use else "")


def loaded_summary(loaded: list[LoadedRow], error: str = "") -> str:
    """What the title says is loaded now."""
    if error:
        return f"what is loaded is unknown ({error})"
    if not loaded:
        return "none loaded"
    places = ", ".join(sorted({m.where for m in loaded}))
    return f"{len(loaded)} loaded ({places}): " + ", ".join(m.name for m in loaded)


@dataclass(frozen=True)
class ModelChoice:
    name: str


class ModelsScreen(Screen[ModelChoice | None]):
    """Installed and catalog models with the planner's verdict for this machine, and which are
    loaded now (in the daemon, with each one's memory and device split, or in this process)."""

    BINDINGS = [
        Binding("escape", "close", "Back / cancel pull"),
        Binding("enter", "choose", "Switch / pull", priority=True),
        Binding("p", "pull", "Pull"),
    ]

    class RowsReady(Message):
        def __init__(self, rows: list[ModelRow] | None, error: str = "",
                     loaded: list[LoadedRow] | None = None, loaded_error: str = "") -> None:
            super().__init__()
            self.rows = rows
            self.error = error
            self.loaded = loaded or []
            self.loaded_error = loaded_error

    class PullUpdate(Message):
        def __init__(self, name: str, fraction: float | None, text: str) -> None:
            super().__init__()
            self.name = name
            self.fraction = fraction
            self.text = text

    class PullEnded(Message):
        def __init__(self, name: str, error: LocalInferError | None, cancelled: bool) -> None:
            super().__init__()
            self.name = name
            self.error = error
            self.cancelled = cancelled

    def __init__(self, launcher: Launcher, hardware: HardwareProfile | None,
                 current: str | None, *, calibration: dict[str, float] | None = None,
                 loaded: Callable[[], list[LoadedRow]] | None = None,
                 pull: str | None = None) -> None:
        super().__init__()
        self.launcher = launcher
        self.pull_first = pull
        """A catalog model to pull once the list is ready (the user agreed to it already)."""
        self.loaded_source = loaded
        """What is loaded now (blocking: it may ask the daemon; run on the worker)."""
        self.loaded: list[LoadedRow] = []
        self.hardware = hardware
        self.current = current
        self.calibration = calibration or {}
        self.rows: list[ModelRow] = []
        self._pull_cancel: threading.Event | None = None
        self.pulling: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Label("Planning for this machine…", id="models-title", markup=False)
        yield DataTable(id="models-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="models-detail", markup=False)
        with Horizontal(id="pull-row"):
            yield Label("", id="pull-text", markup=False)
            yield ProgressBar(total=1.0, id="pull-bar")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Models"
        table = self.query_one(DataTable)
        for label, key in (("", "mark"), ("MODEL", "name"), ("SIZE", "size"),
                           ("FITS", "fits"), ("GPU", "gpu"), ("DECODE*", "tps"),
                           ("WHERE", "where"), ("LOADED", "loaded")):
            table.add_column(label, key=key)
        self.query_one("#pull-row").display = False
        self.plan_rows()

    @work(thread=True, exclusive=True, exit_on_error=False, group="models-plan")
    def plan_rows(self) -> None:
        if self.hardware is None:
            self.post_message(self.RowsReady(None, "the hardware profile is not ready yet."))
            return
        try:
            rows = self.launcher.model_rows(self.hardware, calibration=self.calibration)
        except LocalInferError as exc:
            self.post_message(self.RowsReady(None, exc.one_line()))
            return
        loaded: list[LoadedRow] = []
        loaded_error = ""
        if self.loaded_source is not None:
            try:
                loaded = self.loaded_source()
            except LocalInferError as exc:  # the daemon gone: the list is still useful
                loaded_error = exc.one_line()
        self.post_message(self.RowsReady(rows, loaded=loaded, loaded_error=loaded_error))

    @on(RowsReady)
    def rows_ready(self, event: RowsReady) -> None:
        title = self.query_one("#models-title", Label)
        if event.rows is None:
            title.update(f"Cannot plan: {event.error}")
            return
        self.rows = event.rows
        self.loaded = event.loaded
        by_name = {m.name: m for m in self.loaded}
        table = self.query_one(DataTable)
        table.clear()
        for row in self.rows:
            mark = "●" if self.current and row.name == self.current else ""
            size = human_bytes(row.size_bytes) + ("~" if row.size_estimated else "")
            fits = "?" if row.fits is None else ("yes" if row.fits else "no")
            held = by_name.get(row.name)
            table.add_row(mark, row.name, size, fits, row.gpu_layers or "–",
                          tps(row.decode_tps), "installed" if row.installed else "catalog",
                          loaded_text(held) if held else "", key=row.name)
        n_installed = sum(r.installed for r in self.rows)
        title.update(f"{n_installed} installed, {len(self.rows) - n_installed} more in the"
                     f" catalog; {loaded_summary(self.loaded, event.loaded_error)}."
                     " Enter switches to an installed model or pulls a catalog one.")
        self._show_detail()
        wanted, self.pull_first = self.pull_first, None
        for i, row in enumerate(self.rows):
            if wanted and row.name == wanted and not row.installed and not self.pulling:
                table.move_cursor(row=i)
                self._start_pull(row)

    @on(DataTable.RowHighlighted)
    def _row_highlighted(self) -> None:
        self._show_detail()

    def _selected(self) -> ModelRow | None:
        table = self.query_one(DataTable)
        if not self.rows or table.cursor_row is None:
            return None
        return self.rows[min(table.cursor_row, len(self.rows) - 1)]

    def _show_detail(self) -> None:
        row = self._selected()
        detail = self.query_one("#models-detail", Static)
        note = ("* DECODE: tok/s predicted by the planner for this machine; SIZE ~ = estimated"
                " from the catalog.")
        if row is None:
            detail.update(note)
            return
        what = row.description or ("installed" if row.installed else "")
        detail.update(f"{row.name}: {row.reason}" + (f" — {what}" if what else "") + "\n"
                      + note)

    def action_choose(self) -> None:
        """Switch to an installed model; a catalog one is pulled after the user agrees to the
        download (it may be many GB, and too big or too slow for this machine)."""
        row = self._selected()
        if row is None or self.pulling:
            return
        if row.installed:
            self.dismiss(ModelChoice(row.name))
            return

        def answered(answer: str | None) -> None:
            if answer == "yes" and not self.pulling:
                self._start_pull(row)

        self.app.push_screen(ConfirmScreen(f"Download {row.name}?", download_question(row),
                                           "Download"), answered)

    def action_pull(self) -> None:
        row = self._selected()
        if row is None or self.pulling:
            return
        if row.installed:
            self.notify(f"{row.name} is already installed: Enter switches to it.")
            return
        self._start_pull(row)

    def _start_pull(self, row: ModelRow) -> None:
        self.pulling = row.name
        self._pull_cancel = threading.Event()
        self.query_one("#pull-row").display = True
        self._show_pull(row.name, 0.0, f"Pulling {row.name}…")
        self.pull(row.name, self._pull_cancel)

    @work(thread=True, exclusive=True, exit_on_error=False, group="models-pull")
    def pull(self, name: str, cancel: threading.Event) -> None:
        def on_progress(p: PullProgress) -> None:
            total, done = p.total, p.completed
            text = p.message or p.status
            if total:
                text = f"{text} {human_bytes(done)}/{human_bytes(total)}".strip()
            self.post_message(self.PullUpdate(name, done / total if total else None, text))

        try:
            self.launcher.pull(name, progress=on_progress, cancel=cancel)
        except LocalInferError as exc:
            self.post_message(self.PullEnded(name, exc, cancel.is_set()))
            return
        except Exception as exc:  # noqa: BLE001 - shown in the UI, not as a traceback
            self.post_message(self.PullEnded(
                name, LocalInferError(f"{type(exc).__name__}: {exc}"), cancel.is_set()))
            return
        self.post_message(self.PullEnded(name, None, cancel.is_set()))

    @on(PullUpdate)
    def _pull_update(self, event: PullUpdate) -> None:
        self._show_pull(event.name, event.fraction, event.text)

    def _show_pull(self, name: str, fraction: float | None, text: str) -> None:
        self.query_one("#pull-text", Label).update(text or f"Pulling {name}…")
        bar = self.query_one("#pull-bar", ProgressBar)
        if fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=fraction)

    @on(PullEnded)
    def _pull_ended(self, event: PullEnded) -> None:
        self.pulling = None
        self._pull_cancel = None
        self.query_one("#pull-row").display = False
        if event.cancelled:
            self.app.push_screen(ErrorScreen(
                "Pull cancelled", f"The download of {event.name} was cancelled. What was"
                " downloaded so far is kept; pulling it again resumes.", [("ok", "OK")]))
        elif event.error is not None:
            self.app.push_screen(ErrorScreen(
                f"Cannot pull {event.name}", event.error.one_line(), [("ok", "OK")]))
        else:
            self.notify(f"{event.name} is installed: Enter switches to it.")
        self.plan_rows()

    def action_close(self) -> None:
        if self._pull_cancel is not None:
            self._pull_cancel.set()
            self.query_one("#pull-text", Label).update("Cancelling the pull…")
            return
        self.dismiss(None)
