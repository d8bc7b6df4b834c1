"""Sequence state: cutting a sequence's cache back, and saving and restoring it through host
memory: checkpoints of the sliding-window layers, two sequences' cells swapped, and a whole
sequence's state for the prefix cache on disk (../disk_cache.py)."""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np

from ...errors import LocalInferError
from ..backend import window_can_cut
from .native import LlamaHandles, _llama_said


@dataclass(frozen=True)
class SeqState:
    """A checkpoint of a sequence's sliding-window layers: the first ``size`` bytes of
    ``buffer``, which may be larger (one an earlier checkpoint used, written over)."""

    buffer: ctypes.Array[ctypes.c_uint8]
    size: int


@functools.cache
def build_id() -> str:
    """This llama.cpp build: llama-cpp-python's version and its libraries' sizes and times
    (a state saved by one build is read by the same build only)."""
    lib = Path(L.__file__).parent / "lib"
    files = sorted(lib.glob("*")) if lib.is_dir() else []
    stats = [(f.name, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files if f.is_file()]
    return f"llama-cpp-python {L.__version__} {stats}"


class SeqStates(LlamaHandles):
    """LlamaBackend's cache cuts, checkpoints, swaps, and whole states for the disk."""

    _n_swa: int
    _window_cells: int
    cut_reach: int

    def seq_trim(self, seq_id: int, n_keep: int) -> int:
        if self._can_cut(seq_id, n_keep):
            return n_keep
        L.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
        return 0

    def can_cut(self, n_cached: int, n_keep: int) -> bool:
        return window_can_cut(self._n_swa, self.cut_reach, n_cached, n_keep)

    def _can_cut(self, seq_id: int, n_keep: int) -> bool:
        """Drop the cells at positions >= n_keep; True when the rest is usable."""
        if n_keep <= 0:
            return False
        if L.llama_memory_seq_pos_max(self._mem, seq_id) < n_keep:
            return True  # nothing to cut (a prompt read in part goes on where it stopped)
        # A sliding-window cache keeps only the last window: continuing at n_keep needs the
        # window before it to still be there, even for n_keep = 1 (the BOS alone). Asked
        # before the cut: a window wholly past n_keep is emptied by it, and an empty one reads
        # as position -1, as if it held all.
        if self._n_swa and \
                L.llama_memory_seq_pos_min(self._mem, seq_id) > max(0, n_keep - self._n_swa):
            return False
        return bool(L.llama_memory_seq_rm(self._mem, seq_id, n_keep, -1))

    def seq_checkpoint(self, seq_id: int, reuse: Any = None) -> SeqState:
        # The sliding-window layers only.
        return self._seq_state(seq_id, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY,
                               reuse if isinstance(reuse, SeqState) else None)

    def _seq_state(self, seq_id: int, flags: int, reuse: SeqState | None = None) -> SeqState:
        """The sequence's state, saved into ``reuse``'s memory where it fits."""
        size = L.llama_state_seq_get_size_ext(self._ctx, seq_id, flags)
        if reuse is not None and len(reuse.buffer) >= size:
            buffer = reuse.buffer
        else:
            room = size
            held = L.llama_memory_seq_pos_max(self._mem, seq_id) - \
                L.llama_memory_seq_pos_min(self._mem, seq_id) + 1
            if flags & L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY and held > 0:
                # Room for a full window, which the next checkpoints then fit into.
                room = max(size, size * self._window_cells // held)
            # Uninitialised: only the pages llama.cpp writes are ever touched.
            buffer = (ctypes.c_uint8 * room).from_buffer(np.empty(room, np.uint8))
        if L.llama_state_seq_get_data_ext(self._ctx, buffer, size, seq_id, flags) != size:
            raise LocalInferError(f"llama.cpp could not save a sequence's cache{_llama_said()}")
        return SeqState(buffer, size)

    def checkpoint_data(self, state: SeqState) -> np.ndarray:
        return np.ctypeslib.as_array(state.buffer)[:state.size].copy()

    def checkpoint_state(self, data: Any) -> SeqState:
        view = memoryview(data).cast("B")
        return SeqState((ctypes.c_uint8 * view.nbytes).from_buffer_copy(view), view.nbytes)

    def seq_swap(self, a: int, b: int) -> bool:
        # Through host memory: the cells of both, written back each into the other's stream
        # (llama_memory_seq_cp across streams copies a whole stream, later, at the next
        # decode, where a checkpoint taken or restored before it would be overwritten).
        states = [self._seq_state(seq, 0) if L.llama_memory_seq_pos_max(self._mem, seq) >= 0
                  else None for seq in (a, b)]
        ok = True
        for seq, state in zip((b, a), states, strict=True):
            L.llama_memory_seq_rm(self._mem, seq, -1, -1)
            if state is not None and L.llama_state_seq_set_data_ext(
                    self._ctx, state.buffer, state.size, seq, 0) != state.size:
                ok = False
        if not ok:
            for seq in (a, b):
                L.llama_memory_seq_rm(self._mem, seq, -1, -1)
        return ok

    def seq_restore(self, seq_id: int, n_keep: int, n_checkpoint: int, state: SeqState
                    ) -> int:
        if self._can_cut(seq_id, n_keep):
            return n_keep
        if n_checkpoint > 0 and L.llama_memory_seq_rm(self._mem, seq_id, n_checkpoint, -1):
            # The full-attention layers are cut at n_checkpoint; the sliding-window ones get
            # back the window they held then (llama.cpp saves only the cells in the window:
            # a checkpoint returns to its own length, no other).
            flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
            if L.llama_state_seq_set_data_ext(self._ctx, state.buffer, state.size, seq_id,
                                              flags) == state.size and \
                    L.llama_memory_seq_pos_max(self._mem, seq_id) == n_checkpoint - 1:
                return n_checkpoint
        L.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
        return 0

    def seq_save(self, seq_id: int, n_tokens: int) -> np.ndarray | None:
        # Every layer's cells of the sequence (a window layer's window), which must hold
        # exactly positions 0..n_tokens-1.
        if n_tokens <= 0 or L.llama_memory_seq_pos_max(self._mem, seq_id) != n_tokens - 1:
            return None
        size = L.llama_state_seq_get_size_ext(self._ctx, seq_id, 0)
        state = np.empty(size, np.uint8)
        pointer = state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        if not size or L.llama_state_seq_get_data_ext(self._ctx, pointer, size, seq_id, 0) != size:
            return None
        return state

    def seq_load(self, seq_id: int, state: np.ndarray, n_tokens: int) -> bool:
        L.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
        data = np.ascontiguousarray(state, dtype=np.uint8)
        pointer = data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        # llama.cpp checks the cell count, types and layout; a refusal leaves it empty.
        if L.llama_state_seq_set_data_ext(self._ctx, pointer, data.size, seq_id, 0) == \
                data.size and L.llama_memory_seq_pos_max(self._mem, seq_id) == n_tokens - 1:
            return True
        L.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
        return False
