"""Chat history: one JSON file per chat in ``<data>/chats/``, saved after every message and,
while a reply streams, every second or so (so a crash keeps the text streamed so far).

Each chat carries its messages, its own settings (system prompt, sampling, thinking) and,
for every reply, the speed figures measured while it streamed, a thinking model's reasoning
(kept, never sent back: templates drop earlier reasoning) and the other replies regenerated
for the same message (browsable; the chosen one is the one sent). A user message carries the
text of the files attached to it; a summary of turns that no longer fit stands in for them.
A save replaces that one file with a single rename (``atomic_write_text``): a crash leaves
the chat as it was before or after the save, never half-written, and never touches any other
chat. A file that cannot be read
(edited by hand, written by a newer version) is skipped by ``list`` and never overwritten.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .errors import InvalidRequest, LocalInferError
from .paths import Paths, atomic_write_text, get_paths, parse_json
from .runtime.types import Done, Message, SamplingParams

log = logging.getLogger(__name__)

SCHEMA = 1
TITLE_CHARS = 60
_ID_RE = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{4,8}$")


class ChatError(LocalInferError):
    title = "chat history error"
    exit_code = 1


@dataclass(frozen=True)
class ReplyStats:
    """What one reply cost, as measured while it streamed (the summary line under it)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    ttft_ms: float
    prefill_tps: float
    decode_tps: float
    finish_reason: str
    roofline_pct: float | None = None
    """Decode as a share of the memory-bandwidth ceiling (None when it could not be computed)."""
    thought_tokens: int = 0
    """A thinking model's reasoning: its tokens, its time and its decode rate (0: none)."""
    thought_ms: float = 0.0
    thought_tps: float = 0.0
    answer_ttft_ms: float = 0.0
    """With reasoning: from the request to the answer's first token."""
    answer_decode_tps: float = 0.0
    """With reasoning: the answer's tokens after its first over the time since it."""

    @classmethod
    def from_done(cls, done: Done, roofline_pct: float | None = None) -> ReplyStats:
        t = done.timings
        return cls(
            prompt_tokens=done.usage.prompt_tokens,
            completion_tokens=done.usage.completion_tokens,
            cached_tokens=done.usage.cached_tokens,
            ttft_ms=round(t.ttft_ms, 1),
            prefill_tps=round(t.prefill_tps, 1),
            decode_tps=round(t.decode_tps, 2),
            finish_reason=done.finish_reason,
            roofline_pct=None if roofline_pct is None else round(roofline_pct, 1),
        )

    @property
    def context_tokens(self) -> int:
        """Tokens the conversation held in the context after this reply."""
        return self.prompt_tokens + self.completion_tokens


@dataclass
class ChatMessage:
    role: str
    """"user" or "assistant"."""
    content: str
    at: float = field(default_factory=time.time)
    model: str | None = None
    """The model that wrote an assistant message."""
    finish_reason: str | None = None
    """An assistant message's end: "stop", "length", "cancelled" (partial text kept),
    "interrupted" (the chat was closed or killed while it streamed: the text saved so far is
    kept) or "error" (the reply failed; it is not sent to the model again)."""
    stats: ReplyStats | None = None
    error: str | None = None
    """Why the reply failed (with finish_reason "error")."""
    thinking: str = ""
    """A thinking model's reasoning before this reply (shown folded; never sent back)."""
    files: list[Attachment] = field(default_factory=list)
    """A user message's attached files, their text included (sent after the message)."""
    alternatives: list[ChatMessage] = field(default_factory=list)
    """The other replies to the same message (regenerated), in the order they were made;
    this one stands at index ``version`` among them."""
    version: int = 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stats"] = asdict(self.stats) if self.stats else None
        data["alternatives"] = [m.to_dict() for m in self.alternatives]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatMessage:
        stats = data.get("stats")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items()
                  if k in known and k not in ("stats", "files", "alternatives")}
        if values.get("role") not in ROLES or not isinstance(values.get("content"), str):
            raise ValueError(f"bad message {data!r:.80}")
        stat_fields = {f.name for f in fields(ReplyStats)}
        return cls(**values, stats=ReplyStats(**{k: v for k, v in stats.items()
                                                 if k in stat_fields}) if stats else None,
                   files=[Attachment(**f) for f in data.get("files") or []],
                   alternatives=[cls.from_dict(m) for m in data.get("alternatives") or []])

    @property
    def versions(self) -> list[ChatMessage]:
        """Every reply to its message, this one at ``version``."""
        at = min(self.version, len(self.alternatives))
        return [*self.alternatives[:at], self, *self.alternatives[at:]]

    def sent_text(self) -> str:
        """What the model is sent: the text, then each attached file's."""
        return self.content + "".join(f.as_text() for f in self.files)


ROLES = ("user", "assistant", "summary")
"""A "summary" message stands for the turns before it that no longer fit the context: the
model wrote it; it is sent (with the system prompt) in their place."""


@dataclass(frozen=True)
class Attachment:
    """A text file attached to a user message, its text included (the chat file keeps it,
    so the conversation stays what the model saw)."""

    name: str
    path: str
    text: str
    tokens: int
    """Its size in the model's tokens when it was attached (0: not counted)."""

    def as_text(self) -> str:
        return f"\n\nFile {self.name}:\n```\n{self.text.rstrip()}\n```"


@dataclass
class Chat:
    id: str
    title: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    model: str | None = None
    """The model last used in this chat."""
    system_prompt: str = ""
    temperature: float | None = None
    """None: the model's default (``sampling.py``); set on the settings screen."""
    max_tokens: int = 512
    top_p: float | None = None
    top_k: int | None = None
    repeat_penalty: float | None = None
    think: bool | str | None = None
    """A thinking model's reasoning: on, off, an effort, or None for the model's default."""
    messages: list[ChatMessage] = field(default_factory=list)
    context_start: int = 0
    """Messages before this index were dropped from the context to make room: they stay in
    the transcript but are no longer sent to the model."""

    @property
    def display_title(self) -> str:
        return self.title or "New chat"

    def overrides(self) -> dict[str, float | int]:
        """The sampling set on this chat's settings screen, by SamplingParams name (over the
        model's defaults)."""
        return {name: value for name in CHAT_SAMPLING
                if (value := getattr(self, name)) is not None}

    def params(self, defaults: Mapping[str, float | int] | None = None) -> SamplingParams:
        """The sampling of this chat's next reply: the model's ``defaults``
        (``sampling_defaults.py``), then this chat's own settings."""
        values: dict[str, Any] = {**(defaults or {}), **self.overrides()}
        return SamplingParams(max_tokens=self.max_tokens, **values)

    def summary(self) -> ChatMessage | None:
        """The summary standing for the turns before the context start, if any."""
        at = self.context_start
        if 0 < at <= len(self.messages) and self.messages[at - 1].role == "summary":
            return self.messages[at - 1]
        return None

    def prompt_messages(self, upto: int | None = None) -> list[Message]:
        """What the model is sent: the system prompt (with the summary of the turns that no
        longer fit, if they were summarised), then the turns still in the context, up to
        message ``upto`` (excluded; None: all). A failed reply (``error``) is left out; a
        cancelled or interrupted one's partial text is kept; a reply's reasoning is never
        sent (the thinking templates drop earlier reasoning). A question left with no reply
        (it failed, or the chat was killed before the first word) is left out when another
        follows: turns alternate, as templates need."""
        system = self.system_prompt.strip()
        summary = self.summary()
        if summary is not None:
            system = (system + "\n\n" if system else "") + SUMMARY_LEAD + summary.content
        out = [Message("system", system)] if system else []
        turns = [m for m in self.messages[self.context_start:upto]
                 if m.role == "user" or (m.role == "assistant" and m.finish_reason != "error"
                                         and m.content)]
        for m, after in zip(turns, [*turns[1:], None], strict=True):
            if m.role == "user" and after is not None and after.role == "user":
                continue
            out.append(Message(m.role, m.sent_text()))
        return out

    def turn_starts(self) -> list[int]:
        """Indices of the user messages still in the context (where each turn begins)."""
        return [i for i, m in enumerate(self.messages)
                if i >= self.context_start and m.role == "user"]

    def summarise_turns(self) -> tuple[int, int] | None:
        """The messages a summary would stand for (start, end: the turns in the context but
        the last); None when only the last turn is left."""
        starts = self.turn_starts()
        if len(starts) < 2:
            return None
        return self.context_start, starts[-1]

    def add_summary(self, text: str, end: int) -> None:
        """Put the summary of the messages before ``end`` in their place: it is inserted
        there, marked in the history, and the context starts after it."""
        self.messages.insert(end, ChatMessage("summary", text))
        self.context_start = end + 1

    def drop_oldest_turn(self) -> bool:
        """Move the context start past the oldest turn still sent; False when only the last
        turn is left (it cannot be dropped: it is the question being asked)."""
        starts = self.turn_starts()
        if len(starts) < 2:
            return False
        self.context_start = starts[1]
        return True

    def last_reply(self) -> ChatMessage | None:
        return next((m for m in reversed(self.messages)
                     if m.role == "assistant" and m.content), None)

    def last_user_index(self) -> int | None:
        """Where the last user message is, when it is in the context (editable)."""
        i = next((i for i in range(len(self.messages) - 1, -1, -1)
                  if self.messages[i].role == "user"), None)
        return i if i is not None and i >= self.context_start else None

    def add(self, message: ChatMessage) -> ChatMessage:
        self.messages.append(message)
        if not self.title and message.role == "user":
            self.title = make_title(message.content)
        return message

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "id": self.id, "title": self.title, "created": self.created,
            "updated": self.updated, "model": self.model, "system_prompt": self.system_prompt,
            "temperature": self.temperature, "max_tokens": self.max_tokens,
            "top_p": self.top_p, "top_k": self.top_k, "repeat_penalty": self.repeat_penalty,
            "think": self.think, "context_start": self.context_start,
            "messages": [m.to_dict() for m in self.messages],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Chat:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError("not a chat file of this version")
        chat = cls(
            id=str(data["id"]), title=str(data.get("title") or ""),
            created=float(data["created"]), updated=float(data["updated"]),
            model=data.get("model"), system_prompt=str(data.get("system_prompt") or ""),
            temperature=_number(data.get("temperature"), float),
            max_tokens=int(data.get("max_tokens", 512)),
            top_p=_number(data.get("top_p"), float), top_k=_number(data.get("top_k"), int),
            repeat_penalty=_number(data.get("repeat_penalty"), float),
            think=data.get("think") if data.get("think") in THINK_VALUES else None,
            messages=[ChatMessage.from_dict(m) for m in data.get("messages", [])],
        )
        chat.context_start = max(0, min(int(data.get("context_start", 0)), len(chat.messages)))
        return chat


CHAT_SAMPLING = ("temperature", "top_p", "top_k", "repeat_penalty")
"""The sampling a chat's settings screen sets over the model's defaults."""
THINK_VALUES = (None, True, False, "low", "medium", "high")
SUMMARY_LEAD = "A summary of the earlier conversation, which no longer fits:\n"
SUMMARY_REQUEST = ("Summarise the conversation above in a few short paragraphs: the facts,"
                   " decisions, names, numbers and open questions someone continuing it needs."
                   " Write only the summary.")


def _number(value: Any, kind: type) -> Any:
    return None if value is None else kind(value)


def summary_messages(chat: Chat, start: int, end: int) -> list[Message]:
    """The request for a summary of messages ``start`` to ``end``: those turns (with the
    system prompt and any earlier summary), then the request."""
    shadow = replace(chat, messages=chat.messages[:end], context_start=start)
    turns = shadow.prompt_messages()
    if turns and turns[-1].role == "user":
        turns = turns[:-1]  # an unanswered question is not part of what is summarised
    return [*turns, Message("user", SUMMARY_REQUEST)]


@dataclass(frozen=True)
class ChatSummary:
    """One line of the chat list."""

    id: str
    title: str
    updated: float
    n_messages: int
    model: str | None


def make_title(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def new_chat_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{stamp}-{secrets.token_hex(3)}"


MAX_FILE_BYTES = 4 * 1024 * 1024
"""A larger file is refused before it is read: no local model's context holds it."""


def read_text_file(path: Path) -> str:
    """A file to attach, as text; InvalidRequest, saying why, for what cannot be attached:
    no such file, a binary (a NUL byte, or not UTF-8), or more than MAX_FILE_BYTES."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise InvalidRequest(f"{path} is not a file.")
        if size > MAX_FILE_BYTES:
            raise InvalidRequest(f"{path.name} is {size:,} bytes: far more than a model's"
                                 " context holds. Attach a part of it.")
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidRequest(f"there is no file {path}.") from None
    except OSError as exc:
        raise InvalidRequest(f"cannot read {path}: {exc.strerror or exc}.") from None
    try:
        if b"\0" in data[:65536]:
            raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL byte")
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(f"{path.name} is a binary file, not text: only text files can be"
                             " attached.") from None


def check_settings(max_tokens: int, **sampling: float | int | None) -> None:
    """Raise InvalidRequest for settings no sampler takes (the settings screen shows it)."""
    values: dict[str, Any] = {k: v for k, v in sampling.items() if v is not None}
    SamplingParams(max_tokens=max_tokens, **values).validate()


class ChatStore:
    """The chats in the data directory. Nothing is created until the first save."""

    def __init__(self, paths: Paths | None = None) -> None:
        self.paths = paths or get_paths()

    @property
    def root(self) -> Path:
        return self.paths.chats_dir

    def new(self, **settings: Any) -> Chat:
        """A new chat in memory (saved with its first message)."""
        return Chat(id=new_chat_id(), **settings)

    def _file(self, chat_id: str) -> Path:
        if not _ID_RE.match(chat_id):
            raise InvalidRequest(f"invalid chat id {chat_id!r}.")
        return self.root / f"{chat_id}.json"

    def save(self, chat: Chat, *, streaming: ChatMessage | None = None) -> None:
        """Replace the chat's file (one rename). ``streaming`` is a reply still being made,
        saved after the messages as "interrupted" (what a crash then leaves) but not added to
        the chat: the reply's own save, when it ends, replaces it."""
        chat.updated = time.time()
        data = chat.to_dict()
        if streaming is not None:
            data["messages"].append(replace(streaming, finish_reason="interrupted").to_dict())
        text = json.dumps(data, ensure_ascii=False, indent=1) + "\n"
        try:
            atomic_write_text(self._file(chat.id), text)
        except OSError as exc:
            raise ChatError(f"cannot save the chat in {self.root}: {exc.strerror or exc}."
                            " Earlier chats are unchanged.") from None

    def load(self, chat_id: str) -> Chat:
        path = self._file(chat_id)
        try:
            return Chat.from_dict(parse_json(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise ChatError(f"there is no chat {chat_id} (deleted?).") from None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ChatError(f"{path} cannot be read ({exc}); it is left as it is.") from None

    def _read_all(self) -> list[tuple[Path, Chat | None]]:
        """Every chat file, with its chat, or None where it cannot be read (left as it is)."""
        if not self.root.is_dir():
            return []
        out: list[tuple[Path, Chat | None]] = []
        for path in self.root.glob("*.json"):
            if not _ID_RE.match(path.stem):
                continue
            try:
                out.append((path, Chat.from_dict(parse_json(path.read_text(encoding="utf-8")))))
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning("skipping unreadable chat %s: %s", path, exc)
                out.append((path, None))
        return out

    def summaries(self) -> list[ChatSummary]:
        """Every readable chat, the most recently updated first."""
        out = [ChatSummary(chat.id, chat.display_title, chat.updated, len(chat.messages),
                           chat.model) for _, chat in self._read_all() if chat is not None]
        out.sort(key=lambda s: (s.updated, s.id), reverse=True)
        return out

    def latest(self) -> Chat | None:
        for summary in self.summaries():
            try:
                return self.load(summary.id)
            except ChatError:
                continue
        return None

    def unreadable(self) -> list[Path]:
        """The chat files that cannot be read, the most recently written first (``summaries``
        leaves them out; the chat UI says so rather than open an older chat in silence)."""
        bad = [path for path, chat in self._read_all() if chat is None]
        return sorted(bad, key=lambda p: p.stat().st_mtime if p.exists() else 0, reverse=True)

    def rename(self, chat_id: str, title: str) -> Chat:
        title = make_title(title)
        if not title:
            raise InvalidRequest("a chat's name cannot be empty.")
        chat = self.load(chat_id)
        chat = replace(chat, title=title)
        self.save(chat)
        return chat

    def delete(self, chat_id: str) -> None:
        try:
            self._file(chat_id).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ChatError(f"cannot delete the chat: {exc.strerror or exc}.") from None
