"""A Backend that runs the llama.cpp backend in a child process, for models with RPC workers:
llama.cpp aborts its whole process when a worker dies mid-decode, so that process must not
be the daemon. The child's death becomes ``WorkerLost`` naming the worker(s) that stopped
answering; the engine ends its requests with it and the daemon loads the model afresh.

The parent speaks to ``python -m localinfer.runtime.isolated FD`` over a socket pair with
``multiprocessing.connection`` (pickled calls and results). Samplers stay in the child (the
parent holds their ids); token texts and end-of-generation flags are cached here, so a
decode step costs two round trips (decode, sample). Every wait has a deadline.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import LocalInferError, ModelLoadError, WorkerLost
from .backend import LoadOptions, ProgressCallback, window_can_cut
from .grammar import Grammar
from .types import ModelInfo, SamplingParams

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 300.0
"""The longest one call may take (a decode of a full batch over a slow link) before the child
is taken for hung (a worker whose machine vanished without closing the connection) and killed."""
LOAD_STALL_S = 300.0
"""The longest a load may go without progress (weights sent to a worker over the link)."""
CLOSE_TIMEOUT_S = 10.0
_POLL_S = 0.25


class IsolatedBackend:
    """The llama.cpp backend of one model, in a child process."""

    def __init__(self, path: str | os.PathLike[str], options: LoadOptions, *, name: str,
                 progress: ProgressCallback | None = None,
                 answers: Callable[[str], bool] | None = None) -> None:
        """``answers(endpoint)``: whether a worker is still there (hardware.rpc's
        ``worker_answers``), asked when the child dies to name the workers that stopped; without
        it, every worker is named."""
        self._endpoints = options.rpc_servers
        self._answers = answers
        self._lock = threading.Lock()
        self._lost: WorkerLost | None = None
        self._token_bytes: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        parent, child = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "localinfer.runtime.isolated", str(child.fileno())],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                # No gdb backtrace when llama.cpp aborts on a lost worker: expected, and slow.
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
                     "GGML_NO_BACKTRACE": "1"})
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        try:
            self._send(("load", str(path), options, name))
            reply = self._load_reply(progress)
        except BaseException:
            self._kill()
            raise
        self.info: ModelInfo = reply["info"]
        self.n_batch: int = reply["n_batch"]
        self.fim_repo: tuple[str, str] | None = reply["fim_repo"]
        self.fim_spm: bool = reply["fim_spm"]
        self.n_ctx_embed: int = reply["n_ctx_embed"]
        self.needs_checkpoints: bool = reply["needs_checkpoints"]
        self.tokenizes_here = False
        self.cut_reach: int = reply["cut_reach"]
        self._n_swa: int = reply["n_swa"]
        self.load_ms: float = reply["load_ms"]
        self.adaptive_threads: int = reply["adaptive_threads"]
        self.max_special_bytes: int = reply["max_special_bytes"]
        self._max_token_bytes: int | None = None
        self.state_format: str = reply["state_format"]
        self._special_pieces: dict[int, bytes] = reply["special_pieces"]

    @property
    def lost(self) -> WorkerLost | None:
        """Why this model is gone (its process died), once a call found out; else None."""
        return self._lost

    # --- the channel -------------------------------------------------------------------------
    def _send(self, message: Any) -> None:
        try:
            self._conn.send(message)
        except OSError:
            raise self._dead() from None

    def _receive(self, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._conn.poll(_POLL_S):
                    return self._conn.recv()
            except (EOFError, OSError):
                raise self._dead() from None
            if self._proc.poll() is not None and not self._conn.poll(0):
                raise self._dead()
            if time.monotonic() > deadline:
                raise self._dead(f"no answer in {timeout_s:.0f} s")

    def _load_reply(self, progress: ProgressCallback | None) -> dict[str, Any]:
        while True:
            kind, value = self._receive(LOAD_STALL_S)
            if kind == "progress":
                if progress is not None:
                    progress(value)
            elif kind == "ok":
                return value
            else:  # "error": the load failed in the child, which has exited
                raise value

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:
            if self._lost is not None:
                raise self._lost
            self._send((method, *args))
            kind, value = self._receive(CALL_TIMEOUT_S)
        if kind == "error":
            raise value
        return value

    def _dead(self, why: str | None = None) -> WorkerLost:
        """The child is gone (or hung, ``why``: killed now): which workers stopped
        answering, and the error every later call raises."""
        if self._lost is None:
            self._kill()
            why = why or f"its process ended with {_exit_text(self._proc)}"
            answers = self._answers
            gone = [e for e in self._endpoints if answers is None or not answers(e)] \
                or list(self._endpoints)
            names = ", ".join(gone)
            self._lost = WorkerLost(
                f"worker{'s' if len(gone) > 1 else ''} {names} stopped responding; the model"
                f" was unloaded ({why}). It loads again on the next request, without a"
                " worker that still does not answer.")
            log.error("%s", self._lost.message)
        return self._lost

    def _kill(self) -> None:
        try:  # a child that closed its end is exiting: let it say how
            self._proc.wait(1.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        try:
            self._proc.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.error("the model's process %d did not exit after SIGKILL", self._proc.pid)
        self._conn.close()

    # --- the Backend contract ----------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        result: list[int] = self._call("tokenize", text, add_special)
        return result

    def rank_tokens(self, query: str, document: str) -> list[int]:
        result: list[int] = self._call("rank_tokens", query, document)
        return result

    def max_token_bytes(self) -> int:
        if self._max_token_bytes is None:
            self._max_token_bytes = int(self._call("max_token_bytes"))
        return self._max_token_bytes

    def token_bytes(self, token: int) -> bytes:
        piece = self._token_bytes.get(token)
        if piece is None:
            piece = self._token_bytes[token] = self._call("token_bytes", token)
        return piece

    def special_piece(self, token: int) -> bytes | None:
        return self._special_pieces.get(token)

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = self._call("is_eog", token)
        return eog

    # A decode runs in the child, whose abort flag this process cannot set between two of
    # its graph's nodes: here a step always runs to its end.
    def interrupt(self) -> None:
        pass

    def clear_interrupt(self) -> None:
        pass

    def seq_length(self, seq_id: int) -> int:
        length: int = self._call("seq_length", seq_id)
        return length

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        self._call("set_threads", n_threads, n_threads_batch)

    def decode(self, tokens: Sequence[int], positions: Sequence[int], seq_ids: Sequence[int],
               outputs: Sequence[bool]) -> None:
        self._call("decode", list(tokens), list(positions), list(seq_ids), list(outputs))

    def new_sampler(self, params: SamplingParams, seed: int) -> int:
        sampler: int = self._call("new_sampler", params, seed)
        return sampler

    def check_grammar(self, grammar: Grammar) -> None:
        self._call("check_grammar", grammar)

    def sample(self, sampler: int, index: int) -> int:
        token: int = self._call("sample", sampler, index)
        return token

    def logits(self, index: int) -> list[float]:
        return self.raw_logits(index).tolist()

    def raw_logits(self, index: int) -> np.ndarray:
        row: np.ndarray = self._call("raw_logits", index)
        return row

    def accept(self, sampler: int, tokens: Sequence[int]) -> None:
        if self._lost is None:
            self._call("accept", sampler, list(tokens))

    def force(self, sampler: int, token: int) -> None:
        self._call("force", sampler, token)

    def free_sampler(self, sampler: int) -> None:
        if self._lost is None:  # a dead child freed everything
            self._call("free_sampler", sampler)

    def can_cut(self, n_cached: int, n_keep: int) -> bool:
        return window_can_cut(self._n_swa, self.cut_reach, n_cached, n_keep)

    def seq_trim(self, seq_id: int, n_keep: int) -> int:
        if self._lost is not None:
            return 0  # the engine drops a failed request's cache: there is none left
        kept: int = self._call("seq_trim", seq_id, n_keep)
        return kept

    def seq_checkpoint(self, seq_id: int, reuse: Any = None) -> bytes:
        # The state crosses the pipe as new bytes each time: nothing to reuse here.
        state: bytes = self._call("seq_checkpoint", seq_id)
        return state

    def seq_restore(self, seq_id: int, n_keep: int, n_checkpoint: int, state: bytes) -> int:
        kept: int = self._call("seq_restore", seq_id, n_keep, n_checkpoint, state)
        return kept

    def checkpoint_data(self, state: bytes) -> bytes:
        return state  # bytes already, and never written over (``seq_checkpoint``)

    def checkpoint_state(self, data: Any) -> bytes:
        return bytes(data)

    def seq_swap(self, a: int, b: int) -> bool:
        swapped: bool = self._call("seq_swap", a, b)
        return swapped

    def seq_save(self, seq_id: int, n_tokens: int) -> bytes | None:
        state: bytes | None = self._call("seq_save", seq_id, n_tokens)
        return state

    def seq_load(self, seq_id: int, state: Any, n_tokens: int) -> bool:
        loaded: bool = self._call("seq_load", seq_id, bytes(state), n_tokens)
        return loaded

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        vectors: list[list[float]] = self._call("embed", [list(i) for i in inputs])
        return vectors

    def warm_up(self) -> None:
        self._call("warm_up")

    def close(self) -> None:
        if self._proc.poll() is None and self._lost is None:
            try:
                with self._lock:
                    self._conn.send(("close",))
                self._proc.wait(CLOSE_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()


def _exit_text(proc: subprocess.Popen) -> str:
    code = proc.returncode
    if code == -signal.SIGABRT:
        return "llama.cpp's abort, as when a worker stops answering"
    return f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"


# --- the child -----------------------------------------------------------------------------------
class _Child:
    """Runs the calls of the parent on a LlamaBackend, with samplers by id."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.samplers: dict[int, Any] = {}
        self.next_id = 1

    def load(self, path: str, options: LoadOptions, name: str) -> Any:
        from .. import gguf
        from .llama import LlamaBackend

        def progress(fraction: float) -> None:
            self.conn.send(("progress", fraction))

        header = gguf.read_header(path)
        self.backend = LlamaBackend(Path(path), options, name=name, header=header,
                                    progress=progress)
        b = self.backend
        return {"info": b.info, "n_batch": b.n_batch, "fim_repo": b.fim_repo,
                "fim_spm": b.fim_spm, "n_ctx_embed": b.n_ctx_embed,
                "needs_checkpoints": b.needs_checkpoints, "cut_reach": b.cut_reach,
                "n_swa": b._n_swa,
                "load_ms": b.load_ms,
                "adaptive_threads": b.adaptive_threads,
                "max_special_bytes": b.max_special_bytes,
                "state_format": b.state_format,
                # Every special token's text at once: the prompt tokenizer asks about each
                # token of a prompt, too many for a call each.
                "special_pieces": {token: piece for token in range(b.info.n_vocab)
                                   if (piece := b.special_piece(token)) is not None}}

    def new_sampler(self, params: SamplingParams, seed: int) -> int:
        sampler_id = self.next_id
        self.next_id += 1
        self.samplers[sampler_id] = self.backend.new_sampler(params, seed)
        return sampler_id

    def sample(self, sampler: int, index: int) -> int:
        return self.backend.sample(self.samplers[sampler], index)

    def accept(self, sampler: int, tokens: list[int]) -> None:
        self.backend.accept(self.samplers[sampler], tokens)

    def force(self, sampler: int, token: int) -> None:
        self.backend.force(self.samplers[sampler], token)

    def free_sampler(self, sampler: int) -> None:
        self.backend.free_sampler(self.samplers.pop(sampler))

    def raw_logits(self, index: int) -> np.ndarray:
        return np.array(self.backend.raw_logits(index))  # a copy: the view dies next step

    def seq_checkpoint(self, seq_id: int) -> bytes:
        state = self.backend.seq_checkpoint(seq_id)
        return ctypes.string_at(state.buffer, state.size)

    def seq_save(self, seq_id: int, n_tokens: int) -> bytes | None:
        state = self.backend.seq_save(seq_id, n_tokens)
        return None if state is None else state.tobytes()

    def seq_load(self, seq_id: int, state: bytes, n_tokens: int) -> bool:
        return self.backend.seq_load(seq_id, np.frombuffer(state, np.uint8), n_tokens)

    def seq_restore(self, seq_id: int, n_keep: int, n_checkpoint: int, state: bytes) -> int:
        from .llama import SeqState

        array = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        return self.backend.seq_restore(seq_id, n_keep, n_checkpoint,
                                        SeqState(array, len(state)))

    def serve(self) -> None:
        while True:
            try:
                method, *args = self.conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            if method == "close":
                self.backend.close()
                return
            handler = getattr(self, method, None) or getattr(self.backend, method)
            try:
                if method == "tokenize":
                    result = handler(args[0], add_special=args[1])
                else:
                    result = handler(*args)
                reply: tuple[str, Any] = ("ok", result)
            except Exception as exc:  # delivered to the caller in the parent
                reply = ("error", _picklable(exc))
            self.conn.send(reply)


def _picklable(exc: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return LocalInferError(f"{type(exc).__name__}: {exc}")


def main(fd: int) -> None:
    conn = Connection(fd)
    child = _Child(conn)
    try:
        _, path, options, name = conn.recv()
    except (EOFError, OSError):
        return
    try:
        info = child.load(path, options, name)
    except Exception as exc:
        error = exc if isinstance(exc, LocalInferError) else ModelLoadError(str(exc))
        conn.send(("error", _picklable(error)))
        return
    conn.send(("ok", info))
    child.serve()


if __name__ == "__main__":
    main(int(sys.argv[1]))
