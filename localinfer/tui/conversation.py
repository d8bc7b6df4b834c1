"""The conversation: the chat screen's controller. It sends a message, streams the reply from a
thread worker that posts its events back (as Textual's examples/mother.py and harlequin do), so
the UI never waits on the model; it cancels a reply, saves the chat as it goes, and asks what
to do when the context is full. A thinking model's reasoning streams into a folded block above
the answer. Regenerating, editing, summarising, thinking on/off and attaching files are
turns.py's (this screen's base class); the commands typed in the input (``/think``,
``/file``, a path pasted alone) are read here.

A reply streams into one Markdown widget that is appended to at most once per frame
(FRAME_S): the render cost per token does not grow with the reply, nor with the transcript,
whose other messages are never touched. The app (app.py) composes the screen and owns the
session; it is this screen's ``ChatHost``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from functools import partial

from textual import on, work
from textual.widgets import Button, Static

from ..chats import (
    Attachment,
    Chat,
    ChatMessage,
    ChatStore,
    ReplyStats,
    summary_messages,
)
from ..errors import ContextOverflow, DaemonError, LocalInferError
from ..progress import human_bytes
from ..runtime.types import Done, SamplingParams
from ..runtime.types import Message as ChatTurn
from ..session import PresetSession, Session, Thought
from .figures import tps
from .reply import Reply, ReplyDone, ReplyFailed, ReplyStarted, ReplyToken, reply_stats
from .screens import ChatChoice, ConfirmScreen, ContextFullScreen, ErrorScreen, download_question
from .status import ChatFigures
from .turns import ChatHost, TurnEditing, is_file
from .widgets import AssistantMessage, ChatInput, Transcript, UserMessage

log = logging.getLogger(__name__)

FRAME_S = 1 / 30
"""A streaming reply is redrawn at most this often, however fast tokens arrive."""
SAVE_EVERY_S = 1.0
"""A streaming reply is saved at most this often (atomically), so that a crash or a kill
keeps the text streamed so far, marked "interrupted"."""


class ChatScreen(TurnEditing):
    """The chat screen (the app's default screen; the app composes its widgets): the
    conversation shown in the transcript, and the reply streaming into it. The conversation
    changes on this screen's message queue, in order with its reply's events: the app hands
    it what happens elsewhere (a model ready, Ctrl+N, a chat renamed) with ``call_later``."""

    def __init__(self, host: ChatHost, chats: ChatStore) -> None:
        super().__init__(id="_default")  # the id Textual gives its own default screen
        self.host = host
        self.chats = chats
        self.chat: Chat = chats.new(max_tokens=512)
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
        self.files: list[Attachment] = []
        """Files attached to the message being written."""
        self.editing: int | None = None
        """Editing the last user message: its index (sending replaces it and what follows)."""
        self._think_once: bool | str | None = None

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
            offer = self.host.offer
            if offer is not None and not self.query("#offer-download"):
                size = ("about " if offer.size_estimated else "") + human_bytes(
                    offer.size_bytes)
                speed = f", ~{tps(offer.decode_tps)} tok/s predicted here" if \
                    offer.decode_tps > 0 else ""
                self.query_one("#transcript", Transcript).mount(
                    Button(f"Download {offer.name} ({size}{speed})…", id="offer-download"),
                    after=welcome.first())

    @on(Button.Pressed, "#offer-download")
    def _download_offer(self, event: Button.Pressed) -> None:
        event.stop()
        offer = self.host.offer
        if offer is None:
            return

        def answered(answer: str | None) -> None:
            if answer == "yes":
                self.host.action_models(pull=offer.name)

        self.app.push_screen(ConfirmScreen(f"Download {offer.name}?", download_question(offer),
                                           "Download"), answered)

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
        if chat_id == "latest":
            bad = self.chats.unreadable()
            newer = [path for path in bad if chat is None or not path.exists()
                     or path.stat().st_mtime >= chat.updated]
            if newer:
                self.notify(f"{newer[0]} cannot be read; it is left as it is"
                            + (" (and " + str(len(newer) - 1) + " more)" if len(newer) > 1
                               else "") + ("; the chat before it is open." if chat else "."),
                            title="A newer chat cannot be read", severity="warning")
        if chat is not None:
            self.chat = chat
        return chat

    async def new_chat(self) -> None:
        """A new chat with this one's settings."""
        old = self.chat
        self.chat = self.chats.new(system_prompt=old.system_prompt,
                                   temperature=old.temperature, max_tokens=old.max_tokens,
                                   top_p=old.top_p, top_k=old.top_k,
                                   repeat_penalty=old.repeat_penalty, think=old.think)
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
                                       max_tokens=self.chat.max_tokens, think=self.chat.think)
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
            offer = self.host.offer
            if offer is not None:
                chat = (f"To chat, the planner's pick of an instruct model for this machine is"
                        f" {offer.name}" + (f" ({offer.description.rstrip('.')})"
                                            if offer.description else "")
                        + ": the button below downloads it after"
                        " asking; Ctrl+O lists the others.")
            elif self.host.launcher.config.offline:
                chat = ("To chat, add an instruct model: offline, `localinfer add"
                        " PATH.gguf` registers a GGUF file you have (a Qwen3, Llama 3.2 or"
                        " Gemma 3 instruct file, for one), then Ctrl+O switches to it.")
            else:
                chat = ("To chat, Ctrl+O picks or pulls an instruct model (those that fit run"
                        " well here).")
            return (f"{model} is a base model: it continues the text you give it; it does not"
                    " answer questions or follow instructions. It is good for seeing the speed"
                    " figures and for continuing text: start a text for it to continue, like"
                    " “Once upon a time, in a village by the sea,” or “def is_prime(n):”."
                    f" {chat}\n{keys}")
        return f"Chat with {model}. {keys}"

    # --- sending --------------------------------------------------------------------------
    @on(ChatInput.Submitted, "#input")
    async def _submitted(self, event: ChatInput.Submitted) -> None:
        await self.send(event.text)

    async def send(self, text: str) -> None:
        """Send ``text`` as the user's next message (the Enter key): a command (``/think``,
        ``/file``) or a file's path alone is done here instead."""
        chat_input = self.query_one(ChatInput)
        session = self.host.session
        command = text.strip()
        if command.startswith("/think"):
            rest = self._think_command(command)
            if rest is None:
                chat_input.clear()
                return
            text = rest
        elif command.startswith("/file"):
            chat_input.clear()
            await self.attach(command.removeprefix("/file").strip())
            return
        elif "\n" not in command and is_file(command):
            chat_input.clear()
            await self.attach(command)
            return
        elif re.fullmatch(r"/[A-Za-z]\w*", command.split(maxsplit=1)[0] if command else ""):
            # /help, /clear... typed as in other chat programs: said, not sent to the model
            # (with the files waiting to go); a message that starts with a path is sent.
            self.notify(f"{command.split()[0]} is not a command here: /think and /file are"
                        " (F1 lists the keys). Your text stays in the input.",
                        severity="warning")
            return
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
        if self.files and not await self._files_fit(self.files):
            return
        chat_input.accept(text)
        if self.editing is not None:
            del self.chat.messages[self.editing:]
            self.editing = None
            await self.render_chat()
        message = self.chat.add(ChatMessage("user", text, files=self.files))
        self.files = []
        self._show_files()
        switching = self.host.loading is not None  # a model loads: it answers, not the old one
        if session is not None and not switching:
            self.chat.model = session.model
        self.save()
        welcome = self.query("#welcome, #offer-download")
        if welcome:
            await welcome.remove()
        await self.query_one("#transcript").mount(UserMessage(message))
        self.app.sub_title = f"{self.host.model_name or ''} · {self.chat.display_title}"
        if self.host.session is None or switching:
            self._queued = text  # sent as soon as the model is ready
            self.notify("Sending when the model is ready.")
            return
        self._start_reply()

    def params(self) -> SamplingParams:
        """The next reply's sampling: the model's defaults, then this chat's settings."""
        return self.chat.params(self.host.defaults.values)

    def _start_reply(self, *, replaces: Sequence[ChatMessage] = (),
                     summary_of: tuple[int, int] | None = None) -> None:
        session = self.host.session
        assert session is not None
        self._reply_ids += 1
        widget = AssistantMessage(ChatMessage("assistant", "", model=session.info.name),
                                  streaming=True)
        if summary_of is not None:
            widget.border_title = "Summarising the turns that no longer fit…"
        reply = Reply(self._reply_ids, widget, session.info.name, replaces=list(replaces),
                      summary_of=summary_of)
        self.reply = reply
        transcript = self.query_one("#transcript", Transcript)
        transcript.mount(widget)
        transcript.anchor()
        self.chat.model = session.model
        self.host.show_status()
        self.app.refresh_bindings()
        think, self._think_once = (self._think_once if self._think_once is not None
                                   else self.chat.think), None
        messages = (summary_messages(self.chat, *summary_of) if summary_of is not None
                    else self.chat.prompt_messages())
        params = self.params()
        if isinstance(session, PresetSession):  # the preset's sampling, but the chat's own
            params = session.with_defaults(params, ("temperature", "max_tokens"))
        self._stream(reply, session, messages, params, think)

    @work(thread=True, exit_on_error=False, group="reply")
    def _stream(self, reply: Reply, session: Session, messages: Sequence[ChatTurn],
                params: SamplingParams, think: bool | str | None = None) -> None:
        """Run one generation and post its events; never touches a widget."""
        try:
            prompt_tokens = session.count_tokens(messages)
            self.post_message(ReplyStarted(reply.id, prompt_tokens))
            generation = session.chat(messages, params, think=think)
            reply.generation = generation
            if reply.cancel_requested:
                generation.cancel()
            for event in generation:
                counted = generation.prompt_tokens  # the daemon counts it
                if prompt_tokens is None and counted:
                    prompt_tokens = counted
                    self.post_message(ReplyStarted(reply.id, prompt_tokens))
                if isinstance(event, Done):
                    self.post_message(ReplyDone(reply.id, event, generation.thought))
                else:
                    self.post_message(ReplyToken(reply.id, event.text, event.live,
                                                 time.monotonic(),
                                                 thought=isinstance(event, Thought)))
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
        if event.thought:
            reply.thought_pending.append(event.text)
            reply.thought_tokens = event.live.n_tokens
        else:
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
        if reply.thought_pending:
            reply.widget.think("".join(reply.thought_pending), reply.thought_tokens)
            reply.thought_pending.clear()
        text = "".join(reply.pending)
        reply.pending.clear()
        if text and reply.summary_of is None:
            reply.drawn.append(text)
            await reply.widget.write(text)
            if reply.last_flush - reply.last_save >= SAVE_EVERY_S:
                reply.last_save = reply.last_flush
                self.save(streaming=ChatMessage("assistant", "".join(reply.drawn),
                                                model=reply.model,
                                                thinking=reply.widget.thinking))
        elif text:
            reply.drawn.append(text)
            await reply.widget.write(text)
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
                             status.reference.roofline if status.reference else None,
                             event.thought)
        session = self.host.session
        n_ctx = session.info.n_ctx if session else 0
        if done.finish_reason == "length" and n_ctx and stats.context_tokens >= n_ctx - 1:
            stats = replace(stats, finish_reason="context")  # "context full", not the limit
        message = ChatMessage("assistant", done.text, model=reply.model,
                              finish_reason=done.finish_reason, stats=stats,
                              thinking=event.thought.text if event.thought else "")
        if reply.summary_of is not None:
            await self._summary_done(reply, message)
            return
        self._join_versions(message, reply)
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
        if await self._run_after_reply():
            return
        if stats.finish_reason == "context":
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
        if isinstance(error, ContextOverflow) and not reply.live and \
                reply.summary_of is None:
            await reply.widget.remove()
            if self._restore_versions(reply):  # regenerating: the earlier replies stand
                await self.render_chat()
            self.host.show_status()
            if await self._run_after_reply():
                self._drop_from = None
                return
            await self._message_does_not_fit(error)
            return
        self._drop_from = None
        if reply.summary_of is not None:
            await reply.widget.remove()
            if isinstance(error, ContextOverflow) and self._summarise_fewer(reply.summary_of):
                return
            self._summary_failed(error)
            return
        text = (reply.widget.markdown.source or "") + partial_text
        message = ChatMessage("assistant", text, model=reply.model, finish_reason="error",
                              error=error.one_line(), thinking=reply.widget.thinking)
        self._join_versions(message, reply)
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
        if reply.summary_of is not None:
            return
        if text:
            message = ChatMessage("assistant", text, model=reply.model,
                                  finish_reason="cancelled", thinking=reply.widget.thinking)
            self._join_versions(message, reply)
            self.chat.add(message)
            self.save()
        elif self._restore_versions(reply):
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
        # Only the new message is still sent, or its text alone takes the context: no turn
        # dropped or summarised can make room (it offered both, then said so).
        alone = len(chat.turn_starts()) < 2 or await self._too_long_by_its_text(error)
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

    async def _too_long_by_its_text(self, error: ContextOverflow) -> bool:
        """Whether the last message's text and the system prompt's take the whole context
        by themselves (the template adds to them). Against the context the error names, else
        the most the model takes (a daemon grows the loaded one before it refuses)."""
        session = self.host.session
        n_ctx = error.n_ctx or (session.info.most_context if session else 0)
        messages = self.chat.prompt_messages()
        if session is None or not n_ctx or not messages:
            return False
        # At most 8 characters a token of the context each: a prefix that already fills it
        # tells, and a pasted megabyte is not tokenized whole (that takes tens of seconds).
        texts = [m.content[:8 * n_ctx] for m in messages[:1] if m.role == "system"] + [
            messages[-1].content[:8 * n_ctx]]
        try:
            n = await asyncio.to_thread(lambda: sum(session.count_text(t) for t in texts))
        except LocalInferError:
            return False
        return n >= n_ctx - 1

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
                " Dropping earlier turns cannot make room: shorten it, or give the model a"
                " larger context (ctx in config.toml, or the daemon's --ctx).")

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
            text + " Summarise the older turns (the model writes a summary that is sent in"
            " their place), drop them (they stay in the transcript but are no longer sent),"
            " or start a new chat.", id="context-full"), chosen)

    async def _context_choice(self, answer: str | None, unanswered: bool) -> None:
        if answer == "summarise":
            span = self.chat.summarise_turns()
            if span is None:
                self.notify("Only the last turn is left: there is nothing older to summarise.",
                            severity="warning")
                return
            self._summary_continues = unanswered
            self._start_reply(summary_of=span)
        elif answer == "drop":
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
