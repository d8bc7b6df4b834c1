"""Decoding: the generation batch through llama_decode (and the one-token warm-up), the
thread counts the next step uses, and the embedding contexts, which decode inputs as
separate sequences and read their pooled vectors."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp as L
import numpy as np

from ...errors import LocalInferError, StepInterrupted
from ...gguf import GGUFHeader
from ..types import ModelInfo
from .native import LlamaHandles, _llama_said, _set

EMBED_SEQS = 32
"""Inputs embedded together in one decode (each its own sequence)."""
EMBED_CTX_MAX = 2048
"""The most tokens an input to embed may have. Every input is read in one micro-batch (a
bidirectional encoder must see its whole input at once), and without flash attention the
compute buffer holds n_ubatch^2 x n_head attention scores: 200 MB at 2,048 for 12 heads."""
EMBED_CTX_GENERATIVE = 512
"""The same for a generative model asked for embeddings: a second context on the same weights,
kept small (a 512-token cache and micro-batch) so that it costs little memory."""


def _flag_reader() -> int | None:
    """The address of a C function that reads a flag without Python: libc's ``strlen``, on a
    two-byte buffer (``b"\\0"``: 0, go on; ``b"x"``: 1, stop), as llama.cpp's abort callback
    (``bool (*)(void *)``; a bool is returned in the low byte of the return register, where
    strlen leaves 0 or 1). ggml's CPU backend calls it between every two nodes of a graph on
    its first thread: a Python callback there would take the GIL a thousand times a step.
    None where no C library is found (the decode then always runs to its end)."""
    for name in (None, ctypes.util.find_library("c"), "msvcrt"):
        try:
            address = ctypes.cast(ctypes.CDLL(name).strlen, ctypes.c_void_p).value
        except (OSError, AttributeError, TypeError):
            continue
        if address:
            return int(address)
    return None


_FLAG_READER = _flag_reader()

HIDDEN_STATES = b"result_embd_pooled"
"""The graph node a context that pools nothing names its last hidden states by (llama.cpp's
``build_pooling`` gives the final norm's output this name); the output layer reads it, so
it comes after in the graph's order."""


@functools.cache
def _tensor_name_reader() -> Any:
    """ggml's ``ggml_get_name``, or None where no ggml library of this build exports it."""
    try:
        from llama_cpp._ggml import libggml as lib

        fn = lib.ggml_get_name
    except (ImportError, OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_char_p
    return fn


class ComputeThread:
    """The one thread that runs every llama.cpp decode of the process's models with layers
    or experts on the CPU. llama.cpp's CPU threads are OpenMP's, and libgomp keeps a team of
    them for each thread that calls into it; once the teams hold more threads than the
    machine has CPUs (a daemon's chat engine and embedding engine each with one on 2 cores),
    it stops spinning at the barriers between the graph's nodes and sleeps there instead:
    hundreds of context switches a step, and a decode step of the starter 1.4-1.7x slower
    than with one team (docs/benchmarks.md). Engines take turns on the cores anyway
    (turns.py), so running their decodes on one thread costs them nothing but a hand-over
    of ~20 us."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], list[Any],
                                             threading.Lock]] = queue.SimpleQueue()
        self._start = threading.Lock()
        self._ident: int | None = None

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the compute thread; its result, or its exception raised here."""
        if threading.get_ident() == self._ident:
            return fn(*args)
        if self._ident is None:  # started by the first call: none where nothing decodes
            with self._start:
                if self._ident is None:
                    thread = threading.Thread(target=self._run, name="localinfer-compute",
                                              daemon=True)
                    thread.start()
                    self._ident = thread.ident
        done = threading.Lock()
        done.acquire()
        box: list[Any] = [None, None]
        self._calls.put((fn, args, box, done))
        done.acquire()  # released by the compute thread once fn has returned or raised
        if box[1] is not None:
            raise box[1]
        return box[0]

    def _run(self) -> None:
        while True:
            fn, args, box, done = self._calls.get()
            try:
                box[0] = fn(*args)
            except BaseException as exc:  # raised again in the caller's thread
                box[1] = exc
            finally:
                done.release()


CPU_COMPUTE = ComputeThread()


class HiddenStatesOnly:
    """ggml's eval callback for a generative model's embedding context: the graph stops once
    the last hidden states are computed, so the output layer (n_vocab x n_embd per token:
    for Gemma 3 270M, 262k x 640, more work than all its layers) never runs for an input
    whose logits nobody reads. ``stopped`` says whether it did, for the decode just run.

    ggml's scheduler asks it of every node (``ask``); the answer "yes" at the hidden states
    has the scheduler compute up to that node and call again, and "stop" then ends the graph
    split. A later split (the output layer on another device) runs only its first node.
    Where the node is not found (another naming), the whole graph runs as before."""

    def __init__(self, name_of: Any) -> None:
        self._name_of = name_of
        self.stopped = False
        self.callback = L.ggml_backend_sched_eval_callback(self._on_node)

    def _on_node(self, tensor: int, ask: bool, user_data: int) -> bool:
        if self.stopped:
            return ask
        if ask:
            return bool(self._name_of(tensor) == HIDDEN_STATES)
        self.stopped = True
        return False


class Decoding(LlamaHandles):
    """LlamaBackend's decode steps and embeddings."""

    embedding_only: bool
    n_ctx_embed: int
    _batch: Any
    _embed_ctx: Any
    _embed_batch: Any
    _lora: Any
    _threads: tuple[int, int]
    _interrupt_flag: Any
    _abort_callback: Any
    _hidden_only: HiddenStatesOnly | None
    info: ModelInfo

    def _compute(self, ctx: Any, batch: Any) -> int:
        if self.info.computes_on_cpu:
            return int(CPU_COMPUTE.call(L.llama_decode, ctx, batch))
        return int(L.llama_decode(ctx, batch))

    def warm_up(self) -> None:
        """Decode one token and forget it, as llama.cpp's own tools do: the first decode
        pages the weights in and builds the compute graph, which would otherwise land on
        the first request's time to first token. Called on the engine's worker thread (the
        decode itself runs on CPU_COMPUTE for a model with layers on the CPU)."""
        bos = L.llama_vocab_bos(self._vocab)
        if self.embedding_only:
            self.embed([[bos if bos >= 0 else 0]])
            return
        self.decode([bos if bos >= 0 else 0], [0], [0], [True])
        L.llama_memory_clear(self._mem, True)

    def enable_interrupt(self) -> None:
        """Give llama.cpp the abort callback that ``interrupt`` sets (called once the context
        exists; kept referenced here, as llama.cpp holds only the pointers)."""
        self._interrupt_flag = ctypes.create_string_buffer(2)
        self._abort_callback = None
        if _FLAG_READER is not None:
            self._abort_callback = L.ggml_abort_callback(_FLAG_READER)
            L.llama_set_abort_callback(self._ctx, self._abort_callback,
                                       ctypes.cast(self._interrupt_flag, ctypes.c_void_p))

    def interrupt(self) -> None:
        self._interrupt_flag[0] = b"x"

    def clear_interrupt(self) -> None:
        self._interrupt_flag[0] = b"\0"

    def seq_length(self, seq_id: int) -> int:
        return max(0, int(L.llama_memory_seq_pos_max(self._mem, seq_id)) + 1)

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        # Two fields of each context, read by its next llama_decode: cheap between steps. The
        # embedding context (made later, with the counts set last) follows the same counts.
        self._threads = (n_threads, n_threads_batch)
        L.llama_set_n_threads(self._ctx, n_threads, n_threads_batch)
        if self._embed_ctx is not None and self._embed_ctx != self._ctx:
            L.llama_set_n_threads(self._embed_ctx, n_threads, n_threads_batch)

    def decode(self, tokens: Sequence[int], positions: Sequence[int], seq_ids: Sequence[int],
               outputs: Sequence[bool]) -> None:
        batch = self._batch
        assert batch is not None  # freed only by close()
        n = len(tokens)
        batch.n_tokens = n
        tok, pos, nseq, seq, logits = (batch.token, batch.pos, batch.n_seq_id, batch.seq_id,
                                       batch.logits)
        for i in range(n):
            tok[i] = tokens[i]
            pos[i] = positions[i]
            nseq[i] = 1
            seq[i][0] = seq_ids[i]
            logits[i] = outputs[i]
        rc = self._compute(self._ctx, batch)
        if rc == 2 and self._interrupt_flag[0] != b"\0":
            raise StepInterrupted("the step was interrupted")
        if rc != 0:
            reason = {1: "no room left in the KV cache", 2: "aborted"}.get(rc, f"error {rc}")
            raise LocalInferError(f"llama_decode failed: {reason}{_llama_said()}")

    # --- embeddings ------------------------------------------------------------------------
    @staticmethod
    def _pooling(header: GGUFHeader) -> int:
        """The model's own pooling when its file declares one, else the mean (as Ollama
        pools a generative model)."""
        declared = header.arch_value("pooling_type")
        if isinstance(declared, int) and declared > 0:
            return L.LLAMA_POOLING_TYPE_UNSPECIFIED  # llama.cpp reads it from the file
        return L.LLAMA_POOLING_TYPE_MEAN

    def _embedding_context(self) -> ctypes.c_void_p:
        """The context that embeds: the model's own for an embedding model; for a generative
        one a small second context on the same weights, made on first use, whose last hidden
        states ``embed`` mean-pools (llama.cpp pools nothing there, and its output layer is
        skipped: ``HiddenStatesOnly``)."""
        if self._embed_ctx is None:
            cparams = L.llama_context_default_params()
            n = self.n_ctx_embed
            _set(cparams, n_ctx=n, n_batch=n, n_ubatch=n, n_seq_max=EMBED_SEQS,
                 kv_unified=True, embeddings=True, pooling_type=L.LLAMA_POOLING_TYPE_NONE,
                 n_threads=self._threads[0], n_threads_batch=self._threads[1], no_perf=True,
                 flash_attn_type=0)
            name_of = _tensor_name_reader()
            if name_of is not None:
                self._hidden_only = HiddenStatesOnly(name_of)
                _set(cparams, cb_eval=self._hidden_only.callback)
            ctx = L.llama_init_from_model(self._model, cparams)
            if not ctx:
                raise LocalInferError(f"llama.cpp could not create a context for embeddings"
                                      f"{_llama_said()}")
            if self._lora is not None:  # the same weights as the generation's context
                L.llama_set_adapters_lora(ctx, *self._lora)
            if self._abort_callback is not None:  # another engine's turn may stop it
                L.llama_set_abort_callback(ctx, self._abort_callback,
                                           ctypes.cast(self._interrupt_flag, ctypes.c_void_p))
            self._embed_ctx = ctx
        if self._embed_batch is None:
            self._embed_batch = L.llama_batch_init(self.n_ctx_embed, 0, 1)
        return self._embed_ctx

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        ctx = self._embedding_context()
        batch = self._embed_batch
        assert batch is not None  # made with the context
        mem = L.llama_get_memory(ctx)
        # A reranker's pooled output is its classifier's scores, not a hidden state.
        n_embd = (L.llama_model_n_cls_out(self._model)
                  if L.llama_pooling_type(ctx) == L.LLAMA_POOLING_TYPE_RANK
                  else L.llama_model_n_embd(self._model))
        vectors: list[list[float]] = []
        i = 0
        while i < len(inputs):
            group: list[Sequence[int]] = []
            n = 0
            while (i < len(inputs) and len(group) < EMBED_SEQS
                   and n + len(inputs[i]) <= self.n_ctx_embed):
                group.append(inputs[i])
                n += len(inputs[i])
                i += 1
            if not group:
                raise LocalInferError(f"an input of {len(inputs[i])} tokens is longer than"
                                      f" the {self.n_ctx_embed} tokens embedded at once")
            k = 0
            for seq, tokens in enumerate(group):
                for pos, token in enumerate(tokens):
                    batch.token[k] = token
                    batch.pos[k] = pos
                    batch.n_seq_id[k] = 1
                    batch.seq_id[k][0] = seq
                    batch.logits[k] = True
                    k += 1
            batch.n_tokens = k
            if self._hidden_only is not None:
                self._hidden_only.stopped = False
            try:
                rc = self._compute(ctx, batch)
                if rc == 2 and self._interrupt_flag[0] != b"\0":
                    raise StepInterrupted("the embedding was interrupted")
                if rc != 0:
                    raise LocalInferError(f"llama_decode failed while embedding (error {rc})"
                                          f"{_llama_said()}")
                if self.embedding_only:
                    for seq in range(len(group)):
                        row = L.llama_get_embeddings_seq(ctx, seq)
                        if not row:
                            raise LocalInferError("llama.cpp returned no pooled embedding")
                        vectors.append(np.ctypeslib.as_array(row, shape=(n_embd,)).tolist())
                else:  # every token's last hidden state, in the batch's order: their means
                    rows = L.llama_get_embeddings(ctx)
                    if not rows:
                        raise LocalInferError("llama.cpp returned no hidden states")
                    states = np.ctypeslib.as_array(
                        rows, shape=(k, L.llama_model_n_embd_out(self._model)))
                    start = 0
                    for tokens in group:
                        vectors.append(states[start:start + len(tokens)].mean(axis=0).tolist())
                        start += len(tokens)
            finally:
                if mem:
                    L.llama_memory_clear(mem, True)
        return vectors
