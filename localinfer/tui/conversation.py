"""The conversation: the chat screen's controller. It sends a message, streams the reply from a
thread worker that posts its events back (as Textual's examples/mother.py and harlequin do), so
the UI never waits on the model; it cancels a reply, saves the chat as it goes, and asks what
to do when the context is full.

A reply streams into one Markdown widget that is appended to at most once per frame
(FRAME_S): the render cost per token does not grow with the reply, nor with the transcript,
whose other messages are never touched. The app (app.py) composes the screen and owns the
session; it is this screen's ``ChatHost``.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Protocol

from textual import on, work
from textual.screen import Screen
from textual.widgets import Static

from ..chats import Chat, ChatMessage, ChatStore, ReplyStats
from ..errors import ContextOverflow, DaemonError, LocalInferError
from ..runtime.types import Done, SamplingParams
from ..runtime.types import Message as ChatTurn
from ..session import PresetSession, Session
from .reply import Reply, ReplyDone, ReplyFailed, ReplyStarted, ReplyToken, reply_stats
from .screens import ChatChoice, ContextFullScreen, ErrorScreen
from .status import ChatFigures, StatusBar
from .widgets import AssistantMessage, ChatInput, Transcript, UserMessage

log = logging.getLogger(__name__)

FRAME_S = 1 / 30
"""A streaming reply is redrawn at most this often, however fast tokens arrive."""
SAVE_EVERY_S = 1.0
"""A streaming reply is saved at most this often (atomically), so that a crash or a kill
keeps the text streamed so far, marked "interrupted"."""


class ChatHost(Protocol):
    """What the conversation needs of the app around it (``ChatApp``)."""

    session: Session | None
    """The model replies come from; None while none is ready."""
    loading: str | None
    """What is getting ready, while a model loads."""
    model_name: str | None
    status: StatusBar

    def connect(self, model: str | None) -> None: ...

    def show_status(self) -> None: ...

    def action_new_chat(self) -> None:
        """A new chat (Ctrl+N): once the reply streaming now has ended, if one does."""
        ...


class ChatScreen(Screen[None]):
    """The chat screen (the app's default screen; the app composes its widgets): the
    conversation shown in the transcript, and the reply streaming into it. The conversation
    changes on this screen's message queue, in order with its reply's events: the app hands
    it what happens elsewhere (a model ready, Ctrl+N, a chat renamed) with ``call_later``."""

    def __init__(self, host: ChatHost, chats: ChatStore) -> None:
        super().__init__(id="_default")  # the id Textual gives its own default screen
        self.host = host
        self.chats = chats
        self.chat: Chat = chats.new(temperature=0.8, max_tokens=512)
        self.reply: Reply | None = None
        self.context_tokens: int | None = None
        self.last_stats: ReplyStats | None = None
        self._context_at_least = False
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

    def figures(self) -> ChatFigures:
        """What the status bar shows of the conversation."""
        reply = self.reply
        context = self.context_tokens
        at_least = self._context_at_least
        if reply is not None:
            n = reply.live.n_tokens if reply.live else 0
            if reply.prompt_tokens is not None:
                context, at_least = reply.prompt_tokens + n, False
            else:  # the daemon counts the prompt only when the reply ends
                context, at_least = (context or 0) + n, True
        return ChatFigures(context, at_least, streaming=reply is not None,
                           live=reply.live if reply else None,
                           samples=reply.tracker.samples if reply else [],
                           last=self.last_stats)

    # --- the model getting ready ----------------------------------------------------------
    def model_ready(self) -> None:
        """A session is ready: the context of a resumed chat is its last reply's, and the
        welcome names the model."""
        if self.context_tokens is None and self.last_stats is not None:
            self.context_tokens = self.last_stats.context_tokens
        session = self.host.session
        if isinstance(session, PresetSession) and not self.chat.messages:
            # A new chat on a preset starts at its temperature (Ctrl+S changes it).
            temperature = session.preset.parameters.get("temperature")
            if temperature is not None:
                self.chat.temperature = temperature
        welcome = self.query("#welcome")
        if welcome:
            welcome.first(Static).update(self._welcome_text())

    def send_waiting(self) -> None:
        """Send what waited for the model: a reply to resend after reconnecting, or the
        message typed while it loaded."""
        if self.host.session is None:  # it failed again meanwhile: the message still waits
            return
        if self._resend_after_connect:
            self._resend_after_connect = False
            self._start_reply()
        elif self._queued is not None:
            self._queued = None
            self._start_reply()

    # --- chats ----------------------------------------------------------------------------
    def resume(self, chat_id: str) -> Chat | None:
        """Open the saved chat ``chat_id`` ("latest": the most recent one) in place of the
        new one; None (and a notice) when it cannot be read."""
        try:
            chat = self.chats.load(chat_id) if chat_id != "latest" else \
                self.chats.latest()
        except LocalInferError as exc:
            chat = None
            self.notify(exc.message, title="Cannot resume", severity="error")
        if chat is not None:
            self.chat = chat
        return chat

    async def new_chat(self) -> None:
        """A new chat with this one's settings."""
        old = self.chat
        self.chat = self.chats.new(system_prompt=old.system_prompt,
                                   temperature=old.temperature, max_tokens=old.max_tokens)
        self.context_tokens = None
        self.last_stats = None
        await self.render_chat()
        self.host.status.clear_samples()
        self.host.show_status()
        self.query_one(ChatInput).focus()

    async def open_chat(self, choice: ChatChoice) -> None:
        if choice.action == "new":
            self.host.action_new_chat()
            return
        try:
            self.chat = self.chats.load(choice.chat_id or "")
        except LocalInferError as exc:
            self.notify(exc.message, title="Cannot open", severity="error")
            return
        await self.render_chat()
        self.host.status.clear_samples()
        self.host.show_status()
        session = self.host.session
        if self.chat.model and session is not None and \
                self.chat.model not in (session.model, session.info.name):
            self.notify(f"This chat used {self.chat.model}; Ctrl+O switches models.")

    async def chat_changed(self, chat_id: str, *, deleted: bool) -> None:
        """A chat was renamed or deleted on the chats screen: this one, perhaps."""
        if chat_id != self.chat.id:
            return
        if deleted:
            self.chat = self.chats.new(temperature=self.chat.temperature,
                                       max_tokens=self.chat.max_tokens)
            await self.render_chat()
        else:
            try:
                self.chat.title = self.chats.load(chat_id).title
            except LocalInferError:
                pass
        self.host.show_status()

    def save(self, streaming: ChatMessage | None = None) -> None:
        try:
            if self.chat.messages:
                self.chats.save(self.chat, streaming=streaming)
            else:  # its only message was taken back (or nothing was said yet)
                self.chats.delete(self.chat.id)
        except LocalInferError as exc:
            self.notify(exc.message, title="Chat not saved", severity="error")

    # --- the transcript -------------------------------------------------------------------
    async def render_chat(self) -> None:
        transcript = self.query_one("#transcript", Transcript)
        await transcript.show_chat(self.chat, self._welcome_text)
        messages = self.chat.messages
        self.last_stats = next((m.stats for m in reversed(messages) if m.stats), None)
        self.context_tokens = self.last_stats.context_tokens if self.last_stats else None
        self._context_at_least = False
        session = self.host.session
        self.app.sub_title = self.chat.display_title if session is None else \
            f"{session.info.name} · {self.chat.display_title}"
        transcript.anchor()  # at the end, and it stays there as replies stream in

    def _welcome_text(self) -> str:
        session = self.host.session
        model = session.info.name if session else (self.host.loading or "a model")
        keys = ("Enter sends · Shift+Enter or Ctrl+J: new line · Up: earlier prompts · Esc"
                " cancels a reply · F1: help and what the numbers mean.")
        if session and session.info.base_model:
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
        session = self.host.session
        if self.reply is not None:
            self.notify("A reply is still streaming: Esc cancels it. Your message stays in"
                        " the input.", severity="warning")
            return
        if session is None and self.host.loading is None:
            self.notify("No model is loaded: Ctrl+O picks one.", severity="error")
            return
        if self._queued is not None:
            self.notify("The model is still loading; your first message is waiting.",
                        severity="warning")
            return
        chat_input.accept(text)
        message = self.chat.add(ChatMessage("user", text))
        switching = self.host.loading is not None  # a model loads: it answers, not the old one
        if session is not None and not switching:
            self.chat.model = session.model
        self.save()
        welcome = self.query("#welcome")
        if welcome:
            await welcome.remove()
        await self.query_one("#transcript").mount(UserMessage(message))
        self.app.sub_title = f"{self.host.model_name or ''} · {self.chat.display_title}"
        if self.host.session is None or switching:
            self._queued = text  # sent as soon as the model is ready
            self.notify("Sending when the model is ready.")
            return
        self._start_reply()

    def _start_reply(self) -> None:
        session = self.host.session
        assert session is not None
        self._reply_ids += 1
        widget = AssistantMessage(ChatMessage("assistant", "", model=session.info.name),
                                  streaming=True)
        reply = Reply(self._reply_ids, widget, session.info.name)
        self.reply = reply
        transcript = self.query_one("#transcript", Transcript)
        transcript.mount(widget)
        transcript.anchor()
        self.chat.model = session.model
        self.host.show_status()
        self.app.refresh_bindings()
        params = self.chat.params()
        if isinstance(session, PresetSession):  # the preset's sampling, but the chat's own
            params = session.with_defaults(params, ("temperature", "max_tokens"))
        self._stream(reply, session, self.chat.prompt_messages(), params)

    @work(thread=True, exit_on_error=False, group="reply")
    def _stream(self, reply: Reply, session: Session, messages: Sequence[ChatTurn],
                params: SamplingParams) -> None:
        """Run one generation and post its events; never touches a widget."""
        try:
            prompt_tokens = session.count_tokens(messages)
            self.post_message(ReplyStarted(reply.id, prompt_tokens))
            generation = session.chat(messages, params)
            reply.generation = generation
            if reply.cancel_requested:
                generation.cancel()
            for event in generation:
                counted = generation.prompt_tokens  # the daemon counts it
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
            self.host.show_status()

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
                self.save(streaming=ChatMessage("assistant", "".join(reply.drawn),
                                                model=reply.model))
        self.host.show_status()

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
        status = self.host.status
        stats = reply_stats(done, reply,
                             status.reference.roofline if status.reference else None)
        message = ChatMessage("assistant", done.text, model=reply.model,
                              finish_reason=done.finish_reason, stats=stats)
        self.chat.add(message)
        self.save()
        self.reply = None
        self._drop_from = self._drop_next_for = None
        self.last_stats = stats
        status._check_roofline(stats.roofline_pct, done)
        if stats.prompt_tokens:
            self.context_tokens, self._context_at_least = stats.context_tokens, False
        else:  # a cancelled daemon reply: the prompt's size is not known
            self.context_tokens = (self.context_tokens or 0) + stats.completion_tokens
            self._context_at_least = True
        await reply.widget.finish(message)
        self.app.refresh_bindings()
        self.host.show_status()
        session = self.host.session
        n_ctx = session.info.n_ctx if session else 0
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
        self.app.refresh_bindings()
        error = event.error
        partial_text = "".join(reply.pending)
        if isinstance(error, ContextOverflow) and not reply.live:
            await reply.widget.remove()
            self.host.show_status()
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
        self.save()
        await reply.widget.finish(message)
        self.host.show_status()
        if await self._run_after_reply():
            return
        if isinstance(error, DaemonError):
            def chosen(answer: str | None) -> None:
                if answer == "reconnect":
                    self._resend_after_connect = True
                    self.host.connect(self.host.model_name)

            self.app.push_screen(ErrorScreen(
                "Daemon unreachable", f"{error.one_line()} The reply was not finished.",
                [("reconnect", "Reconnect and resend"), ("close", "Close")]), chosen)

    # --- cancelling -------------------------------------------------------------------------
    def cancel_reply(self) -> None:
        """Esc: stop the reply; its partial text is kept and saved."""
        reply = self.reply
        if reply is None:
            return
        reply.cancel_requested = True
        if reply.generation is not None:
            reply.generation.cancel()  # thread-safe: the engine stops within one token

    def cancel_reply_then(self, action: Callable[[], Awaitable[None] | None]) -> bool:
        """While a reply streams: cancel it (its partial text is kept and saved, as on Esc)
        and run ``action`` once it has ended. False when no reply streams."""
        if self.reply is None:
            return False
        self._after_reply = action
        self.cancel_reply()
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

    def keep_partial_reply(self) -> None:
        """Quitting mid-reply: keep what streamed so far, marked cancelled, like Esc."""
        reply = self.reply
        if reply is None:
            return
        self.cancel_reply()
        text = (reply.widget.markdown.source or "") + "".join(reply.pending)
        self.reply = None
        if text:
            self.chat.add(ChatMessage("assistant", text, model=reply.model,
                                      finish_reason="cancelled"))
            self.save()

    def stop_generation(self) -> None:
        """The app is closing: the reply's worker thread must end."""
        if self.reply is not None and self.reply.generation is not None:
            self.reply.generation.cancel()

    # --- a full context ---------------------------------------------------------------------
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
                self.save()
                await self.render_chat()
            self._too_long_alone(error)
            return
        session = self.host.session
        n_ctx = error.n_ctx or (session.info.n_ctx if session else 0)
        self._context_full(f"This conversation no longer fits in the model's context"
                           f" ({n_ctx:,} tokens): {error.message}", unanswered=True)

    async def _drop_oldest_turn_and_resend(self) -> None:
        self.chat.drop_oldest_turn()
        self.save()
        await self.render_chat()
        self._start_reply()

    def _too_long_alone(self, error: ContextOverflow) -> None:
        # An error rebuilt from the daemon's JSON carries neither figure.
        session = self.host.session
        n_ctx = error.n_ctx or (session.info.n_ctx if session else 0)
        n_prompt = error.n_prompt  # 0 through the daemon: not known
        system = " with the system prompt" if self.chat.system_prompt.strip() else ""
        size = (f": it needs {n_prompt:,} tokens{system}, the context holds {n_ctx:,} and one"
                f" must be left for the reply" if n_prompt else f" ({n_ctx:,} tokens)")
        text = (f"Your message does not fit in the model's context even alone{size}."
                " Dropping earlier turns cannot make room: shorten it, or load the model with"
                " a larger context (--ctx).")

        def chosen(answer: str | None) -> None:
            self.run_worker(self._context_choice("new" if answer == "new" else "edit",
                                                 unanswered=True), group="context")

        self.app.push_screen(ErrorScreen("The message is too long for this model", text,
                                         [("edit", "Edit it"), ("new", "Move to a new chat")]),
                             chosen)

    def _context_full(self, text: str, *, unanswered: bool) -> None:
        def chosen(answer: str | None) -> None:
            self.run_worker(self._context_choice(answer, unanswered), group="context")

        self.app.push_screen(ContextFullScreen(
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
            self.host.action_new_chat()
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
        self.save()
        await self.render_chat()
        self.query_one(ChatInput).load_text(text)
        return text
