"""The prefix cache on disk: the KV cache of long prompt prefixes, saved so that a later request
that starts with the same tokens, in this process or after a restart, an unload or an eviction,
reads only what follows them.

A saved prefix is one file, ``<model>-<n_tokens>-<hash>.kv`` in one directory shared by every
model and every daemon of a home (``cache/prefix-kv``): a header naming the model's identity
(the file, the load options that shape its KV cache, the llama.cpp build: ``identity``), the
prefix's tokens, and the sequence's state as llama.cpp saves it (``Backend.seq_save``; for a
sliding-window model, with its window layers' checkpoint at the prefix's end: ``Saved``), with a
CRC-32 of the tokens and the state. A file is written to a unique temporary name, synced and
renamed, so that a reader sees a whole file or none, and two daemons writing the same prefix
both leave a whole one; a file that is torn, truncated, of another model or another build is
skipped with a warning and removed, never given to llama.cpp. The directory is kept under its
size (least recently used first, under an advisory lock); a write that fails (a full disk)
leaves no file and the engine goes on.

Which prefixes are saved (``PrefixCache.plan``): the points of a prompt where a later prompt is
likely to part from it, the end of each turn and the end of the prompt (less the tail every
request reads again, checkpoints.REREAD_TAIL), that are at least ``min_tokens`` long and either
were in an earlier request's prompt (read at least once before, in any process of the home:
the directory keeps a ledger of their hashes) or belong to a request that asked for it
(Anthropic's ``cache_control``: ``SamplingParams.cache_prompt``). The engine saves
one where its reading reaches it (the prompt's chunk ends there) or, read before and still in
the slot, after the request's first token (checkpoints.CacheKeeper.first_token; where the
slot holds no checkpoint there on a sliding-window cache, when the request is admitted); the
file is written on a thread of its own, at a lower priority than the engine's.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import queue
import secrets
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..paths import parse_json

log = logging.getLogger(__name__)

MAGIC = b"LIKVPC01"
SUFFIX = ".kv"
TMP_PREFIX = ".tmp-"
DEFAULT_MAX_GB = 4.0
"""The directory's default bound (``prefix_cache_gb`` in config.toml; 0 turns it off)."""
DEFAULT_MIN_TOKENS = 1024
"""The shortest prefix saved (``prefix_cache_min_tokens``): shorter ones are read again in
less time than a file costs to write and keep."""
SEEN_CAPACITY = 4096
"""Prefixes remembered as read (by hash): the ledger keeps the newest (33 bytes each)."""
LEDGER = "read-prefixes"
"""The ledger of prefixes read, in the directory: "read at least once before" holds across
restarts and between the daemons (and ``localinfer run``) of a home."""
MAX_PENDING = 2
"""Saves waiting for the writer at most; a save beyond them is skipped (their states are
held in memory until written)."""
SAVES_PER_REQUEST = 2
WRITER_NICENESS = 10


def token_bytes(tokens: Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype="<i4").tobytes()


def prefix_hash(identity: str, tokens: Sequence[int]) -> str:
    h = hashlib.blake2b(identity.encode(), digest_size=16)
    h.update(token_bytes(tokens))
    return h.hexdigest()


def model_file_id(path: str | os.PathLike[str]) -> str:
    """A model file's identity: its size, modification time and first 64 KiB (its header),
    cheap for a file of many GB; a file pulled again or edited is another file."""
    st = os.stat(path)
    with open(path, "rb") as f:
        head = f.read(65536)
    return f"{st.st_size}:{st.st_mtime_ns}:{hashlib.sha256(head).hexdigest()[:32]}"


def identity(model_id: str, state_format: str) -> str:
    """What a saved state is valid for: the model file and the backend's ``state_format``
    (the build and the load options that shape the KV cache), as one hash."""
    return hashlib.sha256(f"{model_id}|{state_format}".encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One saved prefix, as its file name says."""

    path: Path
    model: str
    """The first 16 hex digits of its identity."""
    n_tokens: int
    digest: str
    size: int
    mtime: float


@dataclass(frozen=True)
class Saved:
    """A sequence's state saved for a prefix: ``state`` (``Backend.seq_save``) holds
    ``n_full`` positions, the prefix's or more. A sliding-window model's cache, which cannot be
    cut back, is saved after the first token past the prefix (before it, the copy would delay
    that token); ``window`` is then the checkpoint of its window layers at the prefix's end
    (``Backend.checkpoint_data``), which returns the restored cache there."""

    state: Any
    n_full: int
    window: Any = None


@dataclass
class Counters:
    lookups: int = 0
    hits: int = 0
    restored_tokens: int = 0
    saves: int = 0
    saved_bytes: int = 0
    failed_saves: int = 0
    bad_files: int = 0
    evicted: int = 0


class PrefixStore:
    """One directory of saved prefixes, shared by the models of a process (thread-safe) and by
    the daemons of a home (files renamed into place, evictions under a lock)."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.counters = Counters()
        self._lock = threading.Lock()
        self._queue: queue.Queue[Callable[[], None]] = queue.Queue()
        self._pending = 0
        self._writer: threading.Thread | None = None
        self._swept = False
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        """The prefixes read (their hashes, which name the model), the most recent last: in
        this process, and as the ledger file says (``remember``)."""
        self._ledger_at = 0
        self._ledger_lock = threading.Lock()

    # --- reading ------------------------------------------------------------------------------
    def entries(self, model: str | None = None) -> list[Entry]:
        """The saved prefixes (of one model's identity prefix), the most recently used last."""
        found = []
        try:
            scan = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        for item in scan:
            name = item.name
            if not name.endswith(SUFFIX) or name.startswith("."):
                continue
            parts = name[:-len(SUFFIX)].split("-")
            if len(parts) != 3 or not parts[1].isdigit():
                continue
            if model is not None and parts[0] != model:
                continue
            try:
                st = item.stat()
            except FileNotFoundError:  # another daemon evicted it just now
                continue
            found.append(Entry(Path(item.path), parts[0], int(parts[1]), parts[2],
                               st.st_size, st.st_mtime))
        return sorted(found, key=lambda e: e.mtime)

    def size(self) -> int:
        return sum(e.size for e in self.entries())

    def label(self, entry: Entry) -> str:
        """The model name a file's header gives ("?" where it cannot be read)."""
        return str(self.header(entry).get("model") or "?")

    @staticmethod
    def header(entry: Entry) -> dict[str, Any]:
        """A file's header, unchecked ({} where it cannot be read)."""
        try:
            with open(entry.path, "rb") as f:
                head = f.read(len(MAGIC) + 4)
                (n_header,) = struct.unpack("<I", head[len(MAGIC):])
                if head[:len(MAGIC)] != MAGIC or n_header > 65536:
                    return {}
                header = parse_json(f.read(n_header))
                return header if isinstance(header, dict) else {}
        except (OSError, ValueError, struct.error):
            return {}

    def read(self, entry: Entry, ident: str, tokens: Sequence[int]) -> Saved | None:
        """The state saved in ``entry`` for ``tokens`` (its first ``entry.n_tokens``), checked
        whole; None, with a warning and the file removed, where it is not that."""
        try:
            return self._read(entry, ident, tokens)
        except FileNotFoundError:
            return None  # evicted by another daemon since it was listed
        except (_Bad, OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("prefix cache: skipping %s: %s; removing it", entry.path.name, exc)
            with self._lock:
                self.counters.bad_files += 1
            with contextlib.suppress(OSError):
                entry.path.unlink()
            return None

    def _read(self, entry: Entry, ident: str, tokens: Sequence[int]) -> Saved | None:
        with open(entry.path, "rb") as f:
            head = f.read(len(MAGIC) + 4)
            if len(head) < len(MAGIC) + 4 or head[:len(MAGIC)] != MAGIC:
                raise _Bad("it is not a prefix cache file of this version")
            (n_header,) = struct.unpack("<I", head[len(MAGIC):])
            if n_header > 65536:
                raise _Bad("its header is damaged")
            header = parse_json(f.read(n_header))
            n = int(header["n_tokens"])
            n_state = int(header["state_bytes"])
            n_window = int(header.get("window_bytes", 0))
            n_full = int(header.get("full_tokens", n))
            if header["identity"] != ident or n != entry.n_tokens:
                raise _Bad("it was saved for another model, other load options or another"
                           " llama.cpp build")
            if n_full < n or min(n, n_state, n_window) < 0 or (n_full > n) != (n_window > 0):
                raise _Bad("its header is damaged")
            if 4 * n + n_state + n_window > entry.size:  # before any memory is taken for them
                raise _Bad("it is truncated or has extra bytes")
            stored = np.empty(n, dtype="<i4")
            state = np.empty(n_state, dtype=np.uint8)
            window = np.empty(n_window, dtype=np.uint8)
            if f.readinto(stored.data.cast("B")) != 4 * n or \
                    f.readinto(state.data) != n_state or \
                    f.readinto(window.data) != n_window or f.read(1):
                raise _Bad("it is truncated or has extra bytes")
        crc = zlib.crc32(stored.data.cast("B"))
        for part in (state, window):
            crc = zlib.crc32(part.data, crc)
        if crc != header.get("crc32"):
            raise _Bad("its checksum does not match (a torn or damaged file)")
        if stored.tolist() != list(tokens[:n]):
            return None  # a hash collision: another prefix (left alone: it is valid)
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # recently used
        return Saved(state, n_full, window if n_window else None)

    def remember(self, digests: Sequence[str]) -> set[str]:
        """Record prefixes as read, in memory and in the directory's ledger (``LEDGER``: one
        hash a line, appended; other processes' lines are read as they come): which of them
        were read before. A ledger that cannot be read or written leaves memory alone."""
        with self._ledger_lock:
            self._read_ledger()
            before = {d for d in digests if d in self._seen}
            for digest in digests:
                self._seen[digest] = None
                self._seen.move_to_end(digest)
            while len(self._seen) > SEEN_CAPACITY:
                self._seen.popitem(last=False)
            new = [d for d in digests if d not in before]
            if new:
                self._append_ledger(new)
            return before

    def _read_ledger(self) -> None:
        path = self.directory / LEDGER
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self._ledger_at:  # compacted by another process: read it all
                    self._ledger_at = 0
                f.seek(self._ledger_at)
                data = f.read()
        except OSError:
            return
        whole = data[:data.rfind(b"\n") + 1]  # a line still being appended: next time
        self._ledger_at += len(whole)
        for line in whole.split():
            digest = line.decode("ascii", "replace")
            self._seen[digest] = None
            self._seen.move_to_end(digest)

    def _append_ledger(self, digests: list[str]) -> None:
        path = self.directory / LEDGER
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, "".join(f"{d}\n" for d in digests).encode())
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            self._ledger_at = size  # what this process appended is already in memory
            if size > 2 * SEEN_CAPACITY * 33:
                kept = "".join(f"{d}\n" for d in self._seen).encode()
                tmp = self.directory / f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
                tmp.write_bytes(kept)
                os.replace(tmp, path)
                self._ledger_at = len(kept)
        except OSError as exc:
            log.debug("prefix cache: the ledger of read prefixes is not written: %s", exc)

    # --- writing ------------------------------------------------------------------------------
    def save(self, ident: str, tokens: Sequence[int], state: Saved, label: str = "") -> bool:
        """Write ``state`` (buffers the caller no longer touches) for ``tokens``, on the
        writer thread; False when too many saves wait already (it is dropped). ``label``: the
        model's name, for ``localinfer cache``."""
        with self._lock:
            if self._pending >= MAX_PENDING:
                return False
            self._pending += 1
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                                name="localinfer-prefix-cache")
                self._writer.start()
        tokens = list(tokens)
        self._queue.put(lambda: self._write(ident, tokens, state, label))
        return True

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for the saves queued so far (tests; a closing engine)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending:
                    return
            time.sleep(0.01)

    def _write_loop(self) -> None:
        if sys.platform.startswith("linux"):  # a thread's own niceness (a tid, not a pid)
            # Below the engine's threads: a save must not slow the reading of the prompt
            # after it and the reply (the checksum and the copy of ~50 MB take a core ~50 ms).
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)
        while True:
            job = self._queue.get()
            try:
                job()
            except Exception:  # never let the writer die: the next save must still run
                log.exception("prefix cache: a save failed")
            finally:
                with self._lock:
                    self._pending -= 1

    def _write(self, ident: str, tokens: list[int], saved: Saved, label: str) -> None:
        data = token_bytes(tokens)
        view = memoryview(saved.state).cast("B")
        window = memoryview(saved.window if saved.window is not None else b"").cast("B")
        header = json.dumps({
            "identity": ident, "n_tokens": len(tokens), "state_bytes": view.nbytes,
            "full_tokens": saved.n_full, "window_bytes": window.nbytes,
            "crc32": zlib.crc32(window, zlib.crc32(view, zlib.crc32(data))),
            "created": time.time(), "model": label,
        }).encode()
        name = f"{ident[:16]}-{len(tokens)}-{prefix_hash(ident, tokens)}{SUFFIX}"
        total = len(MAGIC) + 4 + len(header) + len(data) + view.nbytes + window.nbytes
        if total > self.max_bytes:
            log.info("prefix cache: a %d-token prefix (%d bytes) is larger than the cache's"
                     " bound; not saved", len(tokens), total)
            return
        tmp = self.directory / f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        try:
            self._sweep()
            self.evict(self.max_bytes - total)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(header)) + header)
                f.write(data)
                f.write(view)
                f.write(window)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.directory / name)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            with self._lock:
                self.counters.failed_saves += 1
            why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else str(exc)
            log.warning("prefix cache: could not save a %d-token prefix (%s); going on"
                        " without it", len(tokens), why)
            return
        with self._lock:
            self.counters.saves += 1
            self.counters.saved_bytes += total

    def _sweep(self) -> None:
        """Create the directory, and remove the temporary files of writers that died (a kill
        in the middle of a save), once per process."""
        if self._swept:
            return
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._swept = True
        for item in os.scandir(self.directory):
            if not item.name.startswith(TMP_PREFIX):
                continue
            pid = item.name[len(TMP_PREFIX):].split("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(item.path)

    def evict(self, room: int) -> None:
        """Remove the least recently used files until the directory holds at most ``room``
        bytes, under the directory's lock (two daemons do not evict for each other twice)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.directory / ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            entries = self.entries()
            total = sum(e.size for e in entries)
            for entry in entries:
                if total <= room:
                    break
                with contextlib.suppress(FileNotFoundError):
                    entry.path.unlink()
                    with self._lock:
                        self.counters.evicted += 1
                total -= entry.size

    def discard(self, entry: Entry, why: str) -> None:
        """Remove a file llama.cpp refused (``why``), with a warning."""
        log.warning("prefix cache: %s: %s; removing it", entry.path.name, why)
        with self._lock:
            self.counters.bad_files += 1
        with contextlib.suppress(OSError):
            entry.path.unlink()

    def clear(self, model: str | None = None) -> tuple[int, int]:
        """Remove every saved prefix (of one model): how many files, how many bytes."""
        entries = self.entries(model)
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                entry.path.unlink()
        return len(entries), sum(e.size for e in entries)

    def status(self) -> dict[str, Any]:
        """Size, bound and this process's hit rate, for /localinfer/status and ``ps``."""
        entries = self.entries()
        c = self.counters
        return {"directory": str(self.directory), "max_bytes": self.max_bytes,
                "bytes": sum(e.size for e in entries), "entries": len(entries),
                "lookups": c.lookups, "hits": c.hits,
                "hit_rate": c.hits / c.lookups if c.lookups else 0.0,
                "restored_tokens": c.restored_tokens, "saves": c.saves,
                "failed_saves": c.failed_saves, "bad_files": c.bad_files,
                "evicted": c.evicted}


class _Bad(Exception):
    """A file that is not a whole prefix cache file for the model that asks."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_stores: dict[Path, PrefixStore] = {}
_stores_lock = threading.Lock()


def open_store(directory: Path, max_bytes: int) -> PrefixStore:
    """The process's store of ``directory`` (one per directory: its counters and its writer
    are shared by the models that use it), bounded to ``max_bytes``."""
    with _stores_lock:
        store = _stores.get(directory)
        if store is None:
            store = _stores[directory] = PrefixStore(directory, max_bytes)
            # The saves still queued when the process ends are written first.
            atexit.register(store.flush, 30.0)
        store.max_bytes = max_bytes
        return store


class PrefixCache:
    """One loaded model's view of a ``PrefixStore``: its identity, and which prefixes of its
    requests to save and restore."""

    def __init__(self, store: PrefixStore, ident: str, *, min_tokens: int,
                 reread_tail: int, label: str = "", cut_back: bool = False) -> None:
        self.store = store
        self.label = label
        self.identity = ident
        self.model = ident[:16]
        self.min_tokens = max(1, min_tokens)
        self.reread_tail = reread_tail
        self.cut_back = cut_back
        """Whether a restored state can be cut back (no sliding-window layers, whose saved
        state holds only the window): then a whole prompt is saved after its first token,
        and restored for a request that starts with it, cut to leave the tail."""

    def lookup(self, target: Sequence[int], at_least: int) -> tuple[Entry, Saved] | None:
        """The longest saved prefix of ``target`` that gives more than ``at_least`` tokens
        once cut to leave the tail every request reads again (a whole prompt saved is cut
        back on restoring): (its file, its state), or None."""
        limit = len(target) - self.reread_tail
        if limit < self.min_tokens or limit <= at_least:
            return None
        longest = len(target) if self.cut_back else limit
        candidates = [e for e in self.store.entries(self.model)
                      if at_least < min(e.n_tokens, limit) and e.n_tokens <= longest]
        with self.store._lock:
            self.store.counters.lookups += 1
        for entry in sorted(candidates, key=lambda e: -e.n_tokens):
            if entry.digest != prefix_hash(self.identity, target[:entry.n_tokens]):
                continue
            state = self.store.read(entry, self.identity, target)
            if state is not None:
                return entry, state
        return None

    def restored(self, n_tokens: int) -> None:
        with self.store._lock:
            self.store.counters.hits += 1
            self.store.counters.restored_tokens += n_tokens

    def plan(self, prompt: Sequence[int], turn_end: int | None, marked: bool) -> list[int]:
        """Where to save this prompt's cache: the first and the last of its points (turn ends,
        its end less the tail read again) long enough and read before (or ``marked``), not
        saved yet. Every point is remembered as read."""
        limit = len(prompt) - self.reread_tail
        if max(limit, len(prompt)) < self.min_tokens:
            return []
        points = [i + 1 for i, t in enumerate(prompt) if t == turn_end] \
            if turn_end is not None else []
        points.append(limit)
        points = sorted({n for n in points if n >= self.min_tokens})
        if not points:
            return []
        saved = {(e.n_tokens, e.digest) for e in self.store.entries(self.model)}
        digests = [prefix_hash(self.identity, prompt[:n]) for n in points]
        before = self.store.remember(digests)
        # The end less the tail is saved as the whole prompt where the slot held it already
        # (checkpoints.CacheKeeper.first_token): either counts as that point saved.
        whole = (len(prompt), prefix_hash(self.identity, prompt)) if self.cut_back else None
        chosen = [n for n, digest in zip(points, digests, strict=True)
                  if n <= limit and (digest in before or marked) and (n, digest) not in saved
                  and not (n == limit and whole in saved)]
        if len(chosen) > SAVES_PER_REQUEST:
            chosen = [chosen[0], chosen[-1]]
        return chosen

    def save(self, tokens: Sequence[int], state: Saved) -> bool:
        return self.store.save(self.identity, tokens, state, self.label)
