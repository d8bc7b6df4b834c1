"""The Responses API's stored responses (``store: true``): one JSON file per response under
the data dir's ``responses/``, written atomically, so that ``previous_response_id``, GET and
DELETE work across daemon restarts. Bounded: past ``max_count`` files or ``max_bytes`` in
all, the oldest go first. A torn or corrupt file is skipped with a warning, as if missing.

A record is ``{"response": <the response object>, "conversation": [<input items>]}``: the
conversation is every input item of the chain so far and this response's output items, so
that a request naming it as its ``previous_response_id`` continues from there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import LocalInferError
from ..paths import atomic_write_text, get_paths, parse_json

log = logging.getLogger(__name__)

MAX_COUNT = 1000
MAX_BYTES = 256 * 1024 * 1024

_ID = re.compile(r"resp_[A-Za-z0-9]{1,64}")


class ResponseNotFound(LocalInferError):
    title = "response not found"
    http_status = 404


class ResponseStore:
    def __init__(self, root: Path | None = None, *, max_count: int = MAX_COUNT,
                 max_bytes: int = MAX_BYTES) -> None:
        self.root = root if root is not None else get_paths().data_dir / "responses"
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def _file(self, ident: str) -> Path | None:
        """The file of a well-formed id; None for anything else (never a path outside)."""
        return self.root / f"{ident}.json" if _ID.fullmatch(ident) else None

    def put(self, ident: str, record: dict[str, Any]) -> None:
        path = self._file(ident)
        if path is None:
            raise ValueError(f"not a response id: {ident!r}")
        with self._lock:
            atomic_write_text(path, json.dumps(record, ensure_ascii=False))
            self._prune()

    def get(self, ident: str) -> dict[str, Any]:
        """The stored record; ResponseNotFound when there is none (or it cannot be read)."""
        path = self._file(ident)
        record = _read(path) if path is not None else None
        if record is None:
            raise ResponseNotFound(f"no stored response with id {ident!r} (responses are"
                                   " kept only when created with 'store': true, the"
                                   f" latest {self.max_count}).")
        return record

    def delete(self, ident: str) -> None:
        path = self._file(ident)
        with self._lock:
            try:
                if path is None:
                    raise FileNotFoundError
                path.unlink()
            except FileNotFoundError:
                raise ResponseNotFound(f"no stored response with id {ident!r}.") from None

    def _prune(self) -> None:
        """Remove the oldest files past the bounds (the newest one always stays), and what a
        write cut off by a crash left (a temporary file older than a minute)."""
        stale = time.time() - 60
        for path in self.root.glob(".resp_*.tmp"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < stale:
                    path.unlink()
        files = []
        for path in self.root.glob("resp_*.json"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime_ns, path.name, st.st_size, path))
        files.sort(reverse=True)
        total = 0
        for i, (_, _, size, path) in enumerate(files):
            total += size
            if i > 0 and (i >= self.max_count or total > self.max_bytes):
                path.unlink(missing_ok=True)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("stored response %s cannot be read (%s); skipped", path.name, exc)
        return None
    try:
        record = parse_json(text)
    except ValueError as exc:
        log.warning("stored response %s is torn or corrupt (%s); skipped", path.name, exc)
        return None
    if not (isinstance(record, dict) and isinstance(record.get("response"), dict)
            and isinstance(record.get("conversation"), list)):
        log.warning("stored response %s is not a stored response; skipped", path.name)
        return None
    return record
