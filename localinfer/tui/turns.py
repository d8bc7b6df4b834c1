"""The chat screen's ways of changing the conversation besides sending: regenerating the last
reply (the earlier ones kept, browsable with ←/→), editing the last message, summarising the
turns that no longer fit, switching a thinking model's reasoning, and attaching files after
counting their tokens against the context left. ``ChatScreen`` (conversation.py) is this
class with the sending and the streaming; ``ChatHost`` is what both need of the app."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from textual import on
from textual.screen import Screen

from ..chats import THINK_VALUES, Attachment, Chat, ChatMessage, read_text_file
from ..errors import LocalInferError
from ..runtime.thinking import thinking_format
from ..sampling_defaults import SamplingDefaults
from ..session import Launcher, ModelRow, Session
from .reply import Reply
from .screens import ErrorScreen
from .status import StatusBar
from .widgets import AssistantMessage, ChatInput, FileChips


class ChatHost(Protocol):
    """What the conversation needs of the app around it (``ChatApp``)."""

    session: Session | None
    """The model replies come from; None while none is ready."""
    loading: str | None
    """What is getting ready, while a model loads."""
    model_name: str | None
    status: StatusBar
    defaults: SamplingDefaults
    """The loaded model's default sampling (the chat's settings go over it)."""
    offer: ModelRow | None
    """With only base models installed: the instruct model to offer for download."""
    launcher: Launcher

    def action_models(self, pull: str | None = None) -> None: ...

    def connect(self, model: str | None) -> None: ...

    def show_status(self) -> None: ...

    def action_new_chat(self) -> None:
        """A new chat (Ctrl+N): once the reply streaming now has ended, if one does."""
        ...


class TurnEditing(Screen[None]):
    """Regenerate, browse, edit, summarise, think, attach: the conversation's state is
    ChatScreen's (declared here), and so are ``_start_reply``, ``save`` and ``render_chat``."""

    host: ChatHost
    chat: Chat
    reply: Reply | None
    context_tokens: int | None
    files: list[Attachment]
    editing: int | None
    _think_once: bool | str | None
    _summary_continues = False

    def _start_reply(self, *, replaces: Sequence[ChatMessage] = (),
                     summary_of: tuple[int, int] | None = None) -> None:
        raise NotImplementedError

    def save(self, streaming: ChatMessage | None = None) -> None:
        raise NotImplementedError

    async def render_chat(self) -> None:
        raise NotImplementedError

    # --- summarising older turns ---------------------------------------------------------
    _summary_continues = False

    async def _summary_done(self, reply: Reply, message: ChatMessage) -> None:
        """The summary came: it takes the place of the turns it stands for (marked in the
        history), and the unanswered message is sent again after it."""
        self.reply = None
        await reply.widget.remove()
        self.app.refresh_bindings()
        assert reply.summary_of is not None
        start, end = reply.summary_of
        if message.finish_reason == "cancelled" or not message.content.strip():
            self.notify("The summary was cancelled; nothing was changed.", severity="warning")
            self.host.show_status()
            return
        self.chat.add_summary(message.content.strip(), end)
        self.save()
        await self.render_chat()
        self.host.show_status()
        n = sum(1 for m in self.chat.messages[start:end] if m.role == "user")
        if self._summary_continues and self.host.session is not None:
            self.notify(f"Summarised {n} earlier turn{'s' if n != 1 else ''}; answering your"
                        " message with the summary in their place.")
            self._start_reply()
        else:
            self.notify(f"Summarised {n} earlier turn{'s' if n != 1 else ''}: the summary is"
                        " sent in their place from now on.")

    def _summarise_fewer(self, span: tuple[int, int]) -> bool:
        """The turns to summarise do not fit the context themselves: summarise those after
        the oldest (which are then left out of the summary). False when one turn is left."""
        start, end = span
        starts = [i for i in range(start + 1, end) if self.chat.messages[i].role == "user"]
        if not starts:
            return False
        self._start_reply(summary_of=(starts[0], end))
        return True

    def _summary_failed(self, error: LocalInferError) -> None:
        self.host.show_status()
        self.app.refresh_bindings()
        self.app.push_screen(ErrorScreen("Cannot summarise", f"{error.one_line()} Nothing was"
                                         " changed: drop the oldest turns or start a new chat"
                                         " instead.", [("ok", "OK")]))

    # --- regenerate, browse, edit ----------------------------------------------------------
    def _join_versions(self, message: ChatMessage, reply: Reply) -> None:
        """A regenerated reply joins the earlier ones to the same message, as the newest."""
        if reply.replaces:
            message.alternatives = [replace(m, alternatives=[], version=0)
                                    for m in reply.replaces]
            message.version = len(reply.replaces)

    def _restore_versions(self, reply: Reply) -> bool:
        """A regenerated reply that never came: the earlier ones stand again."""
        versions = reply.replaces
        if not versions:
            return False
        self.chat.add(replace(versions[-1], alternatives=versions[:-1],
                              version=len(versions) - 1))
        return True

    async def regenerate(self) -> None:
        """Ask for another reply to the last message; the earlier ones are kept (←/→)."""
        messages = self.chat.messages
        if self.reply is not None or self.host.session is None:
            self.notify("Wait for the reply (Esc cancels it) and the model.",
                        severity="warning")
            return
        if not messages or messages[-1].role != "assistant" or \
                len(messages) - 1 < self.chat.context_start:
            self.notify("There is no reply to regenerate.", severity="warning")
            return
        last = messages.pop()
        widgets = self.query(AssistantMessage)
        if widgets:
            await widgets.last().remove()
        self._start_reply(replaces=last.versions)

    @on(AssistantMessage.Browse)
    def _browse(self, event: AssistantMessage.Browse) -> None:
        messages = self.chat.messages
        if self.reply is not None or not messages or event.widget.message is not messages[-1]:
            self.notify("Only the last reply's versions can be browsed.")
            return
        versions = messages[-1].versions
        k = max(0, min(len(versions) - 1, messages[-1].version + event.step))
        if k == messages[-1].version:
            return
        chosen = replace(versions[k], alternatives=versions[:k] + versions[k + 1:], version=k)
        messages[-1] = chosen
        self.save()
        self.call_later(event.widget.finish, chosen)

    async def edit_last(self) -> None:
        """Put the last user message back in the input: sending it replaces it and what
        follows (the KV cache of the conversation before it is reused)."""
        if self.reply is not None:
            self.notify("A reply is streaming: Esc cancels it first.", severity="warning")
            return
        index = self.chat.last_user_index()
        if index is None:
            self.notify("There is no message of yours to edit.", severity="warning")
            return
        message = self.chat.messages[index]
        self.editing = index
        chat_input = self.query_one(ChatInput)
        chat_input.load_text(message.content)
        chat_input.move_cursor(chat_input.document.end)
        chat_input.focus()
        self.files = list(message.files)
        self._show_files()
        self.app.refresh_bindings()
        self.notify("Editing your last message: Enter re-sends it (its reply is replaced);"
                    " Esc stops editing.")

    def stop_editing(self) -> None:
        self.editing = None
        self.files = []
        self._show_files()
        self.query_one(ChatInput).clear()
        self.app.refresh_bindings()

    # --- thinking ----------------------------------------------------------------------------
    def _think_command(self, command: str) -> str | None:
        """``/think on|off|low|medium|high|default`` sets this chat's thinking; with a message
        after it, that message alone is sent so. Returns the message to send, if any."""
        words = command.split(maxsplit=2)
        values = {"on": True, "off": False, "default": None, "low": "low",
                  "medium": "medium", "high": "high"}
        if len(words) < 2 or words[1] not in values:
            self.notify("/think on, off, low, medium, high or default (the model's); then a"
                        " message to send it with that alone.", severity="warning")
            return None
        value = values[words[1]]
        if not self._thinks(value):
            return None
        if len(words) == 3 and words[2].strip():
            self._think_once = value
            return words[2]
        self.set_think(value)
        return None

    def _thinks(self, value: bool | str | None) -> bool:
        """Whether the loaded model can think as ``value`` asks; says so when it cannot
        (every message was refused then, until thinking was turned back off)."""
        session = self.host.session
        if value in (None, False) or session is None or \
                thinking_format(session.info.chat_template) is not None:
            return True
        self.notify(f"{session.info.name} does not think (its chat template has no"
                    " reasoning): thinking stays off.", severity="warning")
        return False

    def set_think(self, value: bool | str | None) -> None:
        assert value in THINK_VALUES
        if not self._thinks(value):
            return
        self.chat.think = value
        if self.chat.messages:
            self.save()
        self.notify(f"Thinking: {think_text(value)} for this chat.")
        self.host.show_status()

    def cycle_think(self) -> None:
        """F8: the model's default, on, off."""
        order: list[bool | str | None] = [None, True, False]
        now = self.chat.think if self.chat.think in order else None
        self.set_think(order[(order.index(now) + 1) % len(order)])  # refused if it cannot

    # --- files ---------------------------------------------------------------------------------
    def free_tokens(self) -> int | None:
        """Tokens left in the context for more text: its size, less the conversation so far
        and the reply's room (max tokens)."""
        session = self.host.session
        if session is None:
            return None
        return session.info.n_ctx - (self.context_tokens or 0) - self.chat.max_tokens

    async def attach(self, path_text: str) -> None:
        """Attach a text file to the message being written, once it is known to fit."""
        if not path_text:
            self.notify("/file PATH attaches a text file (or paste its path alone).",
                        severity="warning")
            return
        if self.host.session is None:
            self.notify("Wait for the model: a file is attached once its tokens are counted.",
                        severity="warning")
            return
        path = Path(path_text).expanduser()
        try:
            text = await asyncio.to_thread(read_text_file, path)
        except LocalInferError as exc:
            self._refuse_file(path.name, exc.message)
            return
        tokens = await self._count_text(text) or 0
        attachment = Attachment(path.name, str(path.resolve()), text, tokens)
        if await self._files_fit([*self.files, attachment]):
            self.files.append(attachment)
            self._show_files()

    async def _count_text(self, text: str) -> int | None:
        session = self.host.session
        if session is None:
            return None
        try:
            return await asyncio.to_thread(session.count_text, text)
        except LocalInferError as exc:
            self.notify(f"Cannot count the file's tokens: {exc.one_line()}",
                        severity="warning")
            return None

    async def _files_fit(self, files: Sequence[Attachment]) -> bool:
        """Whether ``files`` fit the context left (counted when attached); if not, say so
        with the figures, before anything is sent."""
        free = self.free_tokens()
        need = sum(f.tokens for f in files)
        if free is None or need <= free:
            return True
        session = self.host.session
        n_ctx = session.info.n_ctx if session else 0
        names = ", ".join(f.name for f in files)
        self._refuse_file(names, f"{names} {'is' if len(files) == 1 else 'are'} {need:,}"
                          f" tokens; the context has {max(free, 0):,} free ({n_ctx:,} in all:"
                          f" the conversation takes {self.context_tokens or 0:,} and the"
                          f" reply's room {self.chat.max_tokens:,}). Attach a part of it, start"
                          " a new chat, or load the model with a larger context (ctx in"
                          " config.toml, or LOCALINFER_CTX).")
        return False

    def _refuse_file(self, name: str, message: str) -> None:
        self.app.push_screen(ErrorScreen(f"Cannot attach {name}", message, [("ok", "OK")]))

    def _show_files(self) -> None:
        self.app.query_one(FileChips).show(self.files, self.free_tokens())

    @on(FileChips.Removed)
    def _file_removed(self, event: FileChips.Removed) -> None:
        if 0 <= event.index < len(self.files):
            del self.files[event.index]
        self._show_files()


def think_text(value: bool | str | None) -> str:
    return {None: "the model's default", True: "on", False: "off"}.get(
        value, f"on, {value} effort") if not isinstance(value, str) else f"on, {value} effort"


def is_file(text: str) -> bool:
    """A path pasted alone (an existing file), to attach rather than send."""
    if not text or len(text) > 4096 or not (text.startswith(("/", "~", "./", "../"))):
        return False
    try:
        return Path(text).expanduser().is_file()
    except OSError:
        return False
