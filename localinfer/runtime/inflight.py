"""How many model loads are inside llama.cpp now, in this process (stdlib only: the CLI asks
it when Ctrl-C ends the process, without loading the engine)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_loads = 0


@contextmanager
def loading() -> Iterator[None]:
    """Around a call that loads a model into llama.cpp."""
    global _loads
    with _lock:
        _loads += 1
    try:
        yield
    finally:
        with _lock:
            _loads -= 1


def loads_in_progress() -> int:
    return _loads
