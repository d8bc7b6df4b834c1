"""Process-wide llama.cpp set-up shared by this package's modules: the backend initialised
once, llama.cpp's log routed to ``logging`` (its last lines kept for error messages), the
params-struct setter that refuses unknown fields, and the physical core count."""

from __future__ import annotations

import _thread
import collections
import ctypes
import logging
import os
import re
import signal
import sys
import threading
import time
from typing import Any

import llama_cpp as L

from ...errors import LocalInferError

# The package's name: llama.cpp's lines are logged as they always were.
log = logging.getLogger(__package__)

_init_lock = threading.Lock()
_initialised = False
_recent_log: collections.deque[str] = collections.deque(maxlen=40)
_log_line = ""
_load_report: list[str] = []
"""What llama.cpp said while a model loaded about where it put it: each buffer's size by device,
the layers it offloaded, the tensors moved by a buffer-type override (``LoadReport``)."""
_REPORTED = ("buffer size =", "offloaded ", "buffer type overridden")

# ggml_log_level: 0 none, 1 info, 2 warn, 3 error, 4 debug, 5 continuation. llama.cpp's
# warnings are mostly notes about model files; errors surface through our own exceptions.
_LOG_LEVELS = {3: logging.INFO}


_interrupted = False
_callbacks: set[Any] = set()
"""The code of the Python functions llama.cpp calls back (``called_back``)."""


def called_back(function: Any) -> Any:
    """Mark ``function`` as one llama.cpp calls from C: a Ctrl-C that lands inside it is put
    off until llama.cpp has returned to Python (raised inside it, ctypes would print the
    KeyboardInterrupt and drop it, and the load it meant to stop would go on)."""
    _callbacks.add(function.__code__)
    return function


def _on_sigint(signum: int, frame: Any) -> None:
    """Python's default SIGINT handler (KeyboardInterrupt), except inside a ``called_back``
    function: there ``interrupted()`` turns true (a load's progress stops it) and a watcher
    sends the signal again once the main thread is outside such a function (llama.cpp has
    returned to Python, or runs C code between its calls back)."""
    global _interrupted
    if _inside_callback(frame):
        if not _interrupted:
            _interrupted = True
            threading.Thread(target=_redeliver, args=(signal.Signals(signum),), daemon=True,
                             name="localinfer-sigint").start()
        return
    _interrupted = False
    signal.default_int_handler(signum, frame)


def _inside_callback(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code in _callbacks:
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: signal.Signals) -> None:
    main = threading.main_thread().ident
    while True:
        time.sleep(0.01)
        frame = sys._current_frames().get(main) if main is not None else None
        if frame is None or not _interrupted:
            return  # raised already (raise_if_interrupted, or the handler outside)
        if not _inside_callback(frame) and _interrupted:
            _thread.interrupt_main(signum)
            time.sleep(0.05)  # handled at the main thread's next line of Python


def interrupted() -> bool:
    """Whether a Ctrl-C waits for llama.cpp to return (a load's progress callback stops it)."""
    return _interrupted


def raise_if_interrupted() -> None:
    """After a load that a Ctrl-C stopped: raise it now (not the load's failure)."""
    global _interrupted
    if _interrupted:
        _interrupted = False
        raise KeyboardInterrupt


@L.llama_log_callback
@called_back
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp writes to stderr by default, which would corrupt a TUI; route it to logging
    # and keep the last lines so a load failure can say what llama.cpp complained about.
    global _log_line
    _log_line += text.decode("utf-8", errors="replace")
    if _log_line.endswith("\n"):
        line = _log_line.strip()
        _log_line = ""
        if line:
            _recent_log.append(line)
            if any(word in line for word in _REPORTED):
                _load_report.append(line)
            log.log(_LOG_LEVELS.get(level, logging.DEBUG), "llama.cpp: %s", line)


def _init() -> None:
    global _initialised
    with _init_lock:
        if not _initialised:
            if threading.current_thread() is threading.main_thread() and \
                    signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                signal.signal(signal.SIGINT, _on_sigint)  # the default's, but for called_back
            L.llama_log_set(_log_callback, ctypes.c_void_p(0))
            L.llama_backend_init()
            _initialised = True


class LlamaHandles:
    """The llama.cpp handles the parts of ``LlamaBackend`` share (its load sets them)."""

    _model: Any
    _ctx: Any
    _vocab: Any
    _mem: Any
    _n_vocab: int


def _set(struct: ctypes.Structure, **values: object) -> None:
    """Set fields of a llama.cpp params struct, refusing names the binding does not have
    (ctypes would silently accept them as plain attributes and llama.cpp never see them)."""
    known = {name for name, *_ in type(struct)._fields_}
    for name, value in values.items():
        if name not in known:
            raise LocalInferError(f"this llama-cpp-python has no {type(struct).__name__}.{name};"
                                  " install the version localinfer requires.")
        setattr(struct, name, value)


def _physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except Exception:
        return os.cpu_count() or 1


def _llama_said() -> str:
    recent = list(_recent_log)  # one copy: llama.cpp may log from another thread meanwhile
    errors = [line for line in recent
              if any(word in line.lower() for word in ("error", "failed", "unsupported"))]
    return f" (llama.cpp: {errors[-1]})." if errors else "."


_ALLOC_FAILED = re.compile(r"failed to allocate (\S+) buffer of size (\d+)")


def _failed_allocation() -> tuple[str, int] | None:
    """The buffer llama.cpp last failed to allocate since its log was cleared (ggml-alloc's
    "failed to allocate Vulkan0 buffer of size N"): its buffer type ("Vulkan0", "CUDA0",
    "CPU", "Vulkan_Host") and size in bytes. None if none failed."""
    for line in reversed(list(_recent_log)):
        if m := _ALLOC_FAILED.search(line):
            return m.group(1), int(m.group(2))
    return None
