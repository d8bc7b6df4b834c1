"""Where localinfer keeps its files: config, data (models, chats), cache and runtime (socket).

The directories come from platformdirs; when ``LOCALINFER_HOME`` is set they all move under it
(tests always set it, so they never touch the real home). Nothing is created at import time:
callers ask for a directory with ``ensure=True`` when they are about to write into it.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from .errors import ConfigError

APP_NAME = "localinfer"
HOME_ENV = "LOCALINFER_HOME"


@dataclass(frozen=True)
class Paths:
    """The four directories localinfer uses."""

    config_dir: Path
    """Holds ``config.toml``."""
    data_dir: Path
    """Holds the model store (``models/``) and chat history (``chats/``)."""
    cache_dir: Path
    """Holds measurements and header caches that can be thrown away."""
    runtime_dir: Path
    """Holds the daemon's socket and pid file."""

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def chats_dir(self) -> Path:
        return self.data_dir / "chats"

    @property
    def prefix_cache_dir(self) -> Path:
        """The prefix cache's saved KV states (runtime/disk_cache.py)."""
        return self.cache_dir / "prefix-kv"

    @property
    def thread_counts_dir(self) -> Path:
        """The thread counts learned per model (runtime/threads.py; ``hw --reset`` forgets)."""
        return self.cache_dir / "hardware" / "threads"

    @property
    def workload_dir(self) -> Path:
        """What each model file was asked to do here (runtime/workload.py)."""
        return self.cache_dir / "workload"


def get_paths() -> Paths:
    """The directories for this process, read from the environment on every call."""
    home = os.environ.get(HOME_ENV)
    if home:
        base = Path(home).expanduser().absolute()
        if base.exists() and not base.is_dir():
            raise ConfigError(f"{HOME_ENV} is {home}, which is not a directory: point it at a"
                              " directory (a missing one is made).", title="bad configuration")
        return Paths(
            config_dir=base / "config",
            data_dir=base / "data",
            cache_dir=base / "cache",
            runtime_dir=base / "run",
        )
    dirs = platformdirs.PlatformDirs(APP_NAME, appauthor=False)
    with warnings.catch_warnings():  # no XDG_RUNTIME_DIR: platformdirs falls back to /tmp
        warnings.simplefilter("ignore")
        try:
            runtime = Path(dirs.user_runtime_dir)
        except PermissionError:  # /tmp/runtime-<uid> is another user's: one of our own instead
            runtime = Path(dirs.user_cache_dir) / "run"
    return Paths(
        config_dir=Path(dirs.user_config_dir),
        data_dir=Path(dirs.user_data_dir),
        cache_dir=Path(dirs.user_cache_dir),
        runtime_dir=runtime,
    )


def ensure_dir(path: Path, mode: int = 0o755) -> Path:
    """Create ``path`` (and parents) if missing and return it."""
    path.mkdir(parents=True, exist_ok=True, mode=mode)
    return path


def parse_json(text: str | bytes) -> Any:
    """``json.loads`` for files this project reads back: JSON nested deeper than Python's
    parser recurses (a hostile or damaged file) is a ValueError, as any other unreadable
    JSON, not a RecursionError that the readers' handling lets through."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("it nests JSON too deeply") from None


def read_json_object(path: Path) -> dict:
    """A JSON object from ``path``, or {} when it is missing or unreadable (caches)."""
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def atomic_write_text(path: Path, text: str, *, sync: bool = True) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new file, never a mix;
    ``sync=False`` for counts a crash may lose, written where an fsync's wait would hold up
    decoding."""
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def not_there(path: Path, shown: object = None) -> str:
    """Why ``path`` (shown as ``shown``, else itself) cannot be opened though it was named:
    a symbolic link that loops or points at nothing says so, rather than "does not exist"
    beside a link the user can see with ls."""
    shown = path if shown is None else shown
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python before 3.13: a loop
        return f"{shown} is a symbolic link that loops back on itself."
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{shown} is a symbolic link that loops back on itself."
        if path.is_symlink():
            return f"{shown} is a symbolic link to {os.readlink(path)}, which does not exist."
    return f"{shown} does not exist."
