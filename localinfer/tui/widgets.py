"""The chat screen's widgets: the message box, the messages, the loading panel. They only render
what the app hands them and post what the user does; the model is reached by the workers of the
app (app.py) and of the conversation (conversation.py), never from here. The status bar, which
keeps the machine's figures too, is status.py's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from textual import events, on
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Button, Collapsible, Label, Markdown, ProgressBar, Static, TextArea
from textual.widgets.markdown import MarkdownStream

from ..chats import Attachment, Chat, ChatMessage
from .figures import summary_line, thought_title

HISTORY_LIMIT = 200


def reply_parser() -> MarkdownIt:
    """Textual's Markdown parser with a line break kept where the model wrote one: a poem, a
    list or code written without a fence would otherwise run into one paragraph (Markdown joins
    lines; chat front ends keep them, as markdown-it's ``breaks`` option does in HTML)."""
    parser = MarkdownIt("gfm-like")
    parser.core.ruler.push("keep_line_breaks", _keep_line_breaks)
    return parser


def _keep_line_breaks(state: StateCore) -> None:
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"

MOUNTED_MESSAGES = 60
"""A resumed chat shows its last messages; earlier ones are mounted on request."""


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
        await self.run_action(action)

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


def file_line(f: Attachment) -> str:
    return f"📎 {f.name} · {f.tokens:,} tok" if f.tokens else f"📎 {f.name}"


class UserMessage(Static):
    """What the user sent (plain text: no markup is interpreted), with its files' names."""

    def __init__(self, message: ChatMessage, **kwargs) -> None:
        text = "\n".join([message.content, *(file_line(f) for f in message.files)])
        super().__init__(text, markup=False, **kwargs)
        self.border_title = "You"


class SummaryNote(Static):
    """The summary that stands for the turns above it (they are no longer sent)."""

    def __init__(self, message: ChatMessage, **kwargs) -> None:
        super().__init__(message.content, markup=False, **kwargs)
        self.border_title = "Summary of the turns above (sent in their place)"


class ThoughtBlock(Collapsible):
    """A thinking model's reasoning, folded above its answer: "Thought for N s", its tokens
    and speed in the title."""

    def __init__(self, text: str, title: str) -> None:
        super().__init__(Static(text, markup=False, classes="thought-text"), title=title,
                         collapsed=True)

    def show(self, text: str, title: str) -> None:
        self.title = title
        self.query_one(".thought-text", Static).update(text)


class AssistantMessage(Vertical, can_focus=True):
    """A reply: its folded reasoning (a thinking model's), Markdown that grows while it
    streams, then a one-line summary under it. Focused, ←/→ show the other replies to the
    same message (regenerated), when there are any, and Enter unfolds the reasoning."""

    BINDINGS = [Binding("left", "browse(-1)", "Earlier reply", show=False),
                Binding("right", "browse(1)", "Later reply", show=False),
                Binding("enter", "toggle_thought", "Reasoning", show=False)]

    @dataclass
    class Browse(Message):
        """←/→ on a reply with alternatives."""

        widget: AssistantMessage
        step: int

    def __init__(self, message: ChatMessage, *, streaming: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.message = message
        self.streaming = streaming
        self.border_title = message.model or "assistant"
        self._stream: MarkdownStream | None = None
        self.thinking = message.thinking

    def compose(self):
        block = ThoughtBlock(self.thinking, thought_title(self.message.stats, streaming=False))
        block.display = bool(self.thinking)
        yield block
        yield Markdown("" if self.streaming else self.message.content, classes="reply",
                       parser_factory=reply_parser)
        yield Label(self._note(), classes="summary", markup=False)

    def on_mount(self) -> None:
        self._show_state()

    def action_toggle_thought(self) -> None:
        """Enter on the focused reply folds or unfolds its reasoning."""
        block = self.query_one(ThoughtBlock)
        if block.display:
            block.collapsed = not block.collapsed

    def action_browse(self, step: int) -> None:
        if self.message.alternatives and not self.streaming:
            self.post_message(self.Browse(self, step))

    @property
    def markdown(self) -> Markdown:
        return self.query_one(Markdown)

    def think(self, text: str, n_tokens: int) -> None:
        """Streamed reasoning: shown folded, its title counting."""
        self.thinking += text
        block = self.query_one(ThoughtBlock)
        block.display = True
        block.show(self.thinking, f"Thinking… {n_tokens:,} tok")

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
        self.thinking = message.thinking
        block = self.query_one(ThoughtBlock)
        block.display = bool(message.thinking)
        block.show(message.thinking, thought_title(message.stats, streaming=False))
        self.query_one(".summary", Label).update(self._note())
        self._show_state()
        # Always rendered again whole (after this refresh, not holding up the caller): what
        # the stream drew block by block while fragments arrived as it rendered can miss a
        # part of the text (an HTML block, seen once).
        self.call_after_refresh(self.markdown.update, message.content)

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
        if m.alternatives:
            line = f"‹ {m.version + 1}/{len(m.alternatives) + 1} › (←/→) · " + line
        return line


class FileChips(Horizontal):
    """The files attached to the message being written: one chip each (its size in tokens
    against the context left); pressing a chip takes its file off."""

    @dataclass
    class Removed(Message):
        index: int

    def show(self, files: list[Attachment], free_tokens: int | None) -> None:
        self.remove_children()
        free = f" of {free_tokens:,} free" if free_tokens is not None else ""
        self.mount_all([Button(f"{file_line(f)}{free} ✕", id=f"chip-{i}", classes="chip")
                        for i, f in enumerate(files)])
        self.display = bool(files)

    @on(Button.Pressed, ".chip")
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.post_message(self.Removed(int((event.button.id or "chip-0").split("-")[1])))


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


class Transcript(VerticalScroll):
    """The chat's messages, in order. A long chat shows its last MOUNTED_MESSAGES; a button
    above them mounts the earlier ones, as many again at a time."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.chat: Chat | None = None
        self._hidden_messages = 0

    async def show_chat(self, chat: Chat, welcome: Callable[[], str]) -> None:
        """Show ``chat`` in place of what is shown (``welcome()`` when it is empty)."""
        await self.remove_children()
        self.chat = chat
        messages = chat.messages
        start = max(0, len(messages) - MOUNTED_MESSAGES)
        self._hidden_messages = start
        widgets: list[Widget] = []
        if start:
            widgets.append(Button(f"Show {start} earlier messages", id="show-earlier"))
        if not messages:
            widgets.append(Static(welcome(), id="welcome"))
        widgets.extend(self._message_widgets(chat, start, len(messages)))
        await self.mount_all(widgets)

    @staticmethod
    def _message_widgets(chat: Chat, start: int, end: int) -> list[Widget]:
        out: list[Widget] = []
        for i in range(start, end):
            m = chat.messages[i]
            if i == chat.context_start and i > 0 and chat.messages[i - 1].role != "summary":
                out.append(ContextNote(classes="context-note"))
            if m.role == "user":
                out.append(UserMessage(m))
            elif m.role == "summary":
                out.append(SummaryNote(m))
            else:
                out.append(AssistantMessage(m))
        return out

    @on(Button.Pressed, "#show-earlier")
    async def _show_earlier(self) -> None:
        if self.chat is None:
            return
        end = self._hidden_messages
        start = max(0, end - MOUNTED_MESSAGES)
        button = self.query_one("#show-earlier", Button)
        widgets = self._message_widgets(self.chat, start, end)
        await self.mount_all(widgets, after=button)
        self._hidden_messages = start
        if start:
            button.label = f"Show {start} earlier messages"
        else:
            await button.remove()
