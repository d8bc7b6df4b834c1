"""Finding the one daemon of this user: its pid file (held locked while it runs) and socket.

Kept free of the web stack so that clients (the CLI, the chat UI) can look for a daemon
without importing it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from pathlib import Path

from .errors import DaemonError
from .paths import Paths, get_paths, parse_json

SOCKET_NAME = "localinfer.sock"
PID_NAME = "localinfer.pid"


def runtime_dir(paths: Paths | None = None) -> Path:
    """The directory of the daemon's socket and pid file, created when missing: under
    XDG_RUNTIME_DIR, else platformdirs' fallback ``/run/user/<uid>`` or
    ``/tmp/runtime-<uid>`` (containers, ssh sessions), or ``$LOCALINFER_HOME/run``. Under /tmp
    another user could have made it first, so every directory made here is private (0700),
    and the daemon refuses a directory that is not this user's own, in a parent that is
    neither this user's nor root's."""
    path = (paths or get_paths()).runtime_dir
    for directory in reversed([path, *path.parents]):
        if not directory.exists():
            directory.mkdir(mode=0o700, exist_ok=True)
    _check_private(path)
    return path


def _check_private(path: Path) -> None:
    uid = os.geteuid()
    info = os.lstat(path)
    owner = os.stat(path.parent).st_uid
    problem = ("is a symbolic link" if stat.S_ISLNK(info.st_mode)
               else "is not a directory" if not stat.S_ISDIR(info.st_mode)
               else f"belongs to uid {info.st_uid}, not to this user ({uid})"
               if info.st_uid != uid
               else f"is in {path.parent}, which belongs to uid {owner}, not to this user"
                    f" ({uid}) or root" if owner not in (uid, 0)
               else None)
    if problem:
        raise DaemonError(f"the daemon's runtime directory {path} {problem}: set"
                          " XDG_RUNTIME_DIR or LOCALINFER_HOME to a directory of your own.",
                          title="unsafe runtime directory")
    if info.st_mode & 0o077:
        path.chmod(0o700)  # ours, but open to others (made by an older version, or by hand)


def default_socket_path(paths: Paths | None = None) -> Path:
    """Where ``serve`` listens when not told (``--socket``): in ``runtime_dir``."""
    return (paths or get_paths()).runtime_dir / SOCKET_NAME


def pid_file(paths: Paths | None = None) -> Path:
    return (paths or get_paths()).runtime_dir / PID_NAME


def running_daemon(paths: Paths | None = None) -> dict | None:
    """What the pid file says about a live daemon, or None when none runs (or it is stale)."""
    return _read_locked(pid_file(paths))


def _read_locked(path: Path) -> dict | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held by the running daemon
            with os.fdopen(os.dup(fd), "r") as f:
                try:
                    return parse_json(f.read() or "{}")
                except ValueError:
                    return {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None  # nobody holds it: a crashed daemon's leftover
    finally:
        os.close(fd)


class InstanceLock:
    """The pid file, held with an exclusive flock for the daemon's whole life."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            info = _read_locked(self.path) or {}
            where = " and ".join(filter(None, [
                f"unix:{info['socket']}" if info.get("socket") else None,
                info.get("url")]))
            raise DaemonError(
                f"a daemon (pid {info.get('pid', '?')}) is already serving"
                + (f" on {where}" if where else "")
                + "; use it, or stop it first with `localinfer stop`.",
                title="localinfer serve is already running") from None
        self.fd = fd

    def write(self, info: dict) -> None:
        assert self.fd is not None
        data = json.dumps(info).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self.fd)
            self.fd = None


