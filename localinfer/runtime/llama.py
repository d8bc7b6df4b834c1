"""The llama.cpp backend, through llama-cpp-python's low-level C API.

This is the only module that imports ``llama_cpp``. It uses the C API directly (batches,
per-sequence native sampler chains, KV-cache trimming) rather than the ``Llama`` class, so no
logits array is copied into Python per token and several sequences decode in one batch.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np
from llama_cpp.llama_grammar import SchemaConverter

from ..catalog import is_embedding_header
from ..errors import BackendUnavailable, InvalidRequest, LocalInferError, ModelLoadError
from ..gguf import GGUFHeader
from ..planner import Candidate, physical_batch, shrinks_window_cache
from .backend import LoadOptions, ProgressCallback
from .grammar import Grammar, integer_range, to_gbnf
from .shortlist import Truncation, best_allowed
from .types import ModelInfo, SamplingParams

log = logging.getLogger(__name__)

_init_lock = threading.Lock()
_initialised = False
_recent_log: collections.deque[str] = collections.deque(maxlen=40)
_log_line = ""

# ggml_log_level: 0 none, 1 info, 2 warn, 3 error, 4 debug, 5 continuation. llama.cpp's
# warnings are mostly notes about model files; errors surface through our own exceptions.
_LOG_LEVELS = {3: logging.INFO}


@L.llama_log_callback
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
            log.log(_LOG_LEVELS.get(level, logging.DEBUG), "llama.cpp: %s", line)


def _init() -> None:
    global _initialised
    with _init_lock:
        if not _initialised:
            L.llama_log_set(_log_callback, ctypes.c_void_p(0))
            L.llama_backend_init()
            _initialised = True


@dataclass(frozen=True)
class Device:
    """A compute device this llama.cpp build can use."""

    name: str
    kind: str
    """"cpu", "gpu", "igpu" or "accel"."""
    description: str
    backend: str
    """The ggml backend that drives it: "CPU", "CUDA", "Metal", "Vulkan", "ROCm"..."""
    memory_free: int
    memory_total: int


_DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
EMBED_SEQS = 32
"""Inputs embedded together in one decode (each its own sequence)."""
EMBED_CTX_MAX = 2048
"""The most tokens an input to embed may have. Every input is read in one micro-batch (a
bidirectional encoder must see its whole input at once), and without flash attention the
compute buffer holds n_ubatch^2 x n_head attention scores: 200 MB at 2,048 for 12 heads."""
EMBED_CTX_GENERATIVE = 512
"""The same for a generative model asked for embeddings: a second context on the same weights,
kept small (a 512-token cache and micro-batch) so that it costs little memory."""

_GGML_KV_TYPES = {"f16": 1, "q8_0": 8}  # ggml_type ids


def devices() -> list[Device]:
    """The devices llama.cpp can offload to (plus the CPU). A CPU-only build lists the CPU."""
    _init()
    lib = _ggml_lib()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = lib.ggml_backend_dev_backend_reg(dev)
        out.append(Device(
            name=(lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
            kind=_DEVICE_KINDS.get(lib.ggml_backend_dev_type(dev), "unknown"),
            description=(lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
            backend=(lib.ggml_backend_reg_name(reg) or b"").decode(errors="replace"),
            memory_free=free.value,
            memory_total=total.value,
        ))
    return out


def system_info() -> str:
    """llama.cpp's build summary: ``CPU : AVX2 = 1 | ... | REPACK = 1``."""
    _init()
    return L.llama_print_system_info().decode(errors="replace").strip()


def supports_gpu_offload() -> bool:
    _init()
    return bool(L.llama_supports_gpu_offload())


_ggml = None


def _ggml_lib() -> ctypes.CDLL:
    global _ggml
    if _ggml is None:
        from llama_cpp._ggml import libggml as lib

        p = ctypes.c_void_p
        for name, args, res in [
            ("ggml_backend_dev_count", [], ctypes.c_size_t),
            ("ggml_backend_dev_get", [ctypes.c_size_t], p),
            ("ggml_backend_dev_name", [p], ctypes.c_char_p),
            ("ggml_backend_dev_description", [p], ctypes.c_char_p),
            ("ggml_backend_dev_type", [p], ctypes.c_int),
            ("ggml_backend_dev_memory",
             [p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None),
            ("ggml_backend_dev_backend_reg", [p], p),
            ("ggml_backend_reg_name", [p], ctypes.c_char_p),
        ]:
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        _ggml = lib
    return _ggml


def _offloaded_layers(requested: int, n_layers: int, *, gpu_build: bool) -> int:
    """Layers llama.cpp puts on the GPU for ``n_gpu_layers=requested``, in its own count: the
    repeating layers and the output layer as one more (n_layers + 1 = all), as ``--gpu-layers``
    and the planner count them."""
    if not gpu_build:
        return 0
    return n_layers + 1 if requested < 0 else min(requested, n_layers + 1)


def flash_attn_type(options: LoadOptions, *, on_gpu: bool) -> int:
    """llama.cpp's ``flash_attn_type`` for these options: -1 auto, 0 off, 1 on.

    Auto means off when the model runs on the CPU. There, flash attention computes a
    one-token step over 512 or more cached cells with a split-KV kernel and a step of several
    rows (a speculative draft being verified, a batch of sequences) with another, which rounds
    differently, so greedy text with speculation could part from plain decoding. Without it,
    attention is two matrix products, and the starter's speculative greedy code edit was
    identical to plain decoding on AVX-512 and AVX2-only builds. It costs 0-4% of decode speed
    up to a 1,000-token position, 7% at 3,000 and 9% at 7,000 (starter model, 2-core x86;
    prefill measured the same), and a buffer of n_ubatch x n_ctx x n_head floats that the
    planner counts. llama-cpp-python's ``Llama`` leaves it off by default too. On a GPU
    llama.cpp decides.
    A quantized KV cache needs flash attention (llama.cpp quantizes V only with it), and
    with it both kinds of step use one kernel."""
    if options.kv_type != "f16":
        if options.flash_attn is False:
            raise InvalidRequest(f"a {options.kv_type} KV cache needs flash attention: use"
                                 " --flash-attn on or auto (flash_attn in config.toml,"
                                 " LOCALINFER_FLASH_ATTN), or --kv-type f16.")
        return 1
    if options.flash_attn is not None:
        return int(options.flash_attn)
    return -1 if on_gpu else 0


# Words in the text of a token that stands for an image, a sound or a video in a multimodal
# model's prompt (<start_of_image>, <image_soft_token>, <|vision_start|>, [multimodal]).
_MEDIA_WORDS = ("image", "audio", "video", "vision", "multimodal")
# Control tokens that open a tool call (Mistral's [TOOL_CALLS], Llama's <|python_tag|>,
# Phi-4's <|tool_call|>): the model means them as output, and tool calling parses them.
_TOOL_WORDS = ("tool", "python")


# OpenAI's harmony format (gpt-oss) writes its messages' structure with these; a reply is
# made of them (runtime/thinking.py and tools.py parse it), <|return|> and <|call|> end it.
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>",
                  "<|return|>", "<|call|>")


def never_sampled_tokens(attrs: np.ndarray, *, is_eog: Callable[[int], bool],
                  text: Callable[[int], str]) -> np.ndarray:
    """The tokens a text-only runtime must never emit, from llama.cpp's attribute of each
    token (``attrs[token]``): unused and unknown tokens; control tokens that do not end the
    generation (<bos>, <pad>, <start_of_turn>), which mean nothing as text; and the
    placeholders of images, sounds and videos, which only a multimodal prompt holds.
    User-defined tokens stay (Qwen's <think> and <tool_call> are printed and parsed), and so
    do control tokens that open a tool call and, in a harmony vocabulary, the harmony
    markers. ``text`` is asked only about the few control and user-defined tokens: a
    vocabulary has hundreds among a quarter of a million."""
    unused = L.LLAMA_TOKEN_ATTR_UNUSED | L.LLAMA_TOKEN_ATTR_UNKNOWN
    banned = [token for token in np.flatnonzero(attrs & unused).tolist() if not is_eog(token)]
    named = _named_specials(attrs, is_eog=is_eog, text=text)
    kept = set(_harmony_markers(named))
    for token, name in named.items():
        name = name.lower()
        if token not in kept and (any(word in name for word in _MEDIA_WORDS) or (
                attrs[token] & L.LLAMA_TOKEN_ATTR_CONTROL
                and not any(word in name for word in _TOOL_WORDS))):
            banned.append(token)
    return np.array(sorted(banned), dtype=np.intp)


def harmony_tokens(attrs: np.ndarray, *, is_eog: Callable[[int], bool],
                   text: Callable[[int], str]) -> list[int]:
    """The harmony markers that do not end the generation, in a harmony vocabulary (one that
    has <|channel|> and <|message|>); none in any other."""
    return _harmony_markers(_named_specials(attrs, is_eog=is_eog, text=text))


def _named_specials(attrs: np.ndarray, *, is_eog: Callable[[int], bool],
                    text: Callable[[int], str]) -> dict[int, str]:
    """The text of each control or user-defined token that is used and does not end the
    generation."""
    unused = L.LLAMA_TOKEN_ATTR_UNUSED | L.LLAMA_TOKEN_ATTR_UNKNOWN
    special = np.flatnonzero((attrs & (L.LLAMA_TOKEN_ATTR_CONTROL
                                       | L.LLAMA_TOKEN_ATTR_USER_DEFINED) != 0)
                             & (attrs & unused == 0))
    return {token: text(token) for token in special.tolist() if not is_eog(token)}


def _harmony_markers(named: dict[int, str]) -> list[int]:
    markers = {name: token for token, name in named.items() if name in HARMONY_TOKENS}
    if "<|channel|>" not in markers or "<|message|>" not in markers:
        return []
    return sorted(markers.values())


def _use_extra_buffer_types() -> bool:
    """Whether to let llama.cpp repack weights into its extra CPU buffer types (AMX, REPACK).

    Builds with AMX segfault in ggml_backend_amx_mul_mat on some Sapphire Rapids machines
    (llama.cpp issue #20824, unfixed), which is what a default source build produces on such
    a CPU. Repacking measured no faster for the starter model, so AMX builds skip it unless
    LOCALINFER_LLAMA_EXTRA_BUFTS=1.
    """
    forced = os.environ.get("LOCALINFER_LLAMA_EXTRA_BUFTS")
    if forced is not None:
        return forced not in ("0", "", "false", "no")
    return "AMX_INT8 = 1" not in system_info()


@dataclass(frozen=True)
class SeqState:
    """A checkpoint of a sequence's sliding-window layers: the first ``size`` bytes of
    ``buffer``, which may be larger (one an earlier checkpoint used, written over)."""

    buffer: ctypes.Array[ctypes.c_uint8]
    size: int


class LlamaBackend:
    """A model loaded with llama.cpp, driven by the engine's worker thread."""

    def __init__(self, path: str | os.PathLike[str], options: LoadOptions, *, name: str,
                 header: GGUFHeader, progress: ProgressCallback | None = None) -> None:
        _init()
        self._model = None
        self._ctx = None
        self._batch = None
        self._embed_ctx = None
        self._embed_batch = None
        gpu = ([d for d in devices() if d.kind in ("gpu", "igpu")]
               if L.llama_supports_gpu_offload() else [])
        # Checked before the weights load: a bad combination fails at once.
        flash_attn = flash_attn_type(options, on_gpu=bool(gpu) and options.n_gpu_layers != 0)
        path = Path(path)
        self._progress = progress
        mparams = L.llama_model_default_params()
        _set(mparams, n_gpu_layers=options.n_gpu_layers,
             use_extra_bufts=_use_extra_buffer_types())
        if not options.use_mmap:
            _set(mparams, load_mode=L.LLAMA_LOAD_MODE_NONE)
        self._split: tuple[tuple[str, int], ...] = ()
        if options.rpc_servers:
            self._rpc_arrays = _use_workers(mparams, options)  # kept: llama.cpp reads them
        if progress is not None:
            # Kept on self: ctypes must not free the callback while llama.cpp holds it.
            self._progress_cb = L.llama_progress_callback(self._on_progress)
            _set(mparams, progress_callback=self._progress_cb)
        _recent_log.clear()
        t0 = time.perf_counter()
        self._model = L.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {path}{_llama_said()}")
        self._vocab = L.llama_model_get_vocab(self._model)
        self._n_vocab = L.llama_vocab_n_tokens(self._vocab)
        self.never_sampled = self._scan_vocab()
        """The ids of the tokens no sampler chain of this model picks."""
        # One -inf bias each, for every sampler chain (llama.cpp copies the array).
        self._never_bias = (L.llama_logit_bias * len(self.never_sampled))(
            *(L.llama_logit_bias(token, -np.inf) for token in self.never_sampled.tolist()))

        self.embedding_only = options.embedding_only or is_embedding_header(
            header.architecture, header.arch_value("pooling_type"))
        n_slots = 1 if self.embedding_only else max(1, options.n_slots)
        threads = options.n_threads or _physical_cores()
        self._threads = (threads, options.n_threads_batch or threads)
        self.adaptive_threads = max(self._threads) if options.adapt_threads else 0
        n_layers = L.llama_model_n_layer(self._model)
        offloaded = _offloaded_layers(options.n_gpu_layers, n_layers, gpu_build=bool(gpu))
        if options.rpc_servers:
            self._split = _worker_split(n_layers, options, self._rpc_arrays[2])
            offloaded = 0  # no local GPU takes layers (info.split says where they are)
        cpu_only = not offloaded and not options.rpc_servers and flash_attn == 0
        shape = Candidate.from_header(header, name=name)
        n_ubatch = physical_batch(options.n_batch, shape, cpu_only=cpu_only)
        chat_checkpoints = shrinks_window_cache(shape, cpu_only=cpu_only)
        cparams = L.llama_context_default_params()
        _set(
            cparams,
            n_ctx=options.n_ctx * n_slots,
            n_batch=options.n_batch,
            n_ubatch=n_ubatch,
            n_seq_max=n_slots,
            n_threads=threads,
            n_threads_batch=options.n_threads_batch or threads,
            n_outputs_max_per_seq=0,  # speculative verification samples several per sequence
            kv_unified=False,  # each slot gets its own n_ctx cells
            swa_full=False,  # sliding-window layers keep only their window
            no_perf=True,
            flash_attn_type=flash_attn,
        )
        if self.embedding_only:
            # Inputs are separate sequences in one shared cache (an encoder has none), each
            # read whole in one micro-batch; the model's own pooling, else the mean.
            n_embed = min(options.n_ctx, EMBED_CTX_MAX)
            _set(cparams, n_ctx=n_embed, n_batch=n_embed, n_ubatch=n_embed,
                 n_seq_max=EMBED_SEQS, kv_unified=True, embeddings=True,
                 pooling_type=self._pooling(header))
        if options.kv_type != "f16":
            kv = _GGML_KV_TYPES.get(options.kv_type)
            if kv is None:
                raise ModelLoadError(f"unknown KV cache type {options.kv_type!r}; use one of"
                                     f" {', '.join(_GGML_KV_TYPES)}.")
            _set(cparams, type_k=kv, type_v=kv)
        self._ctx = L.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise ModelLoadError(
                f"llama.cpp could not create a context of {options.n_ctx} tokens x {n_slots}"
                f" slots for {path} (out of memory?){_llama_said()} Try a smaller --ctx."
            )
        self._mem = L.llama_get_memory(self._ctx)
        self.n_batch = options.n_batch
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)
        self.fim_spm = options.fim_spm
        self._embed_ctx = self._ctx if self.embedding_only else None
        self._embed_batch = None
        self.n_ctx_embed = (L.llama_n_ctx(self._ctx) if self.embedding_only
                            else min(EMBED_CTX_GENERATIVE, L.llama_n_ctx_seq(self._ctx)))
        self.load_ms = (time.perf_counter() - t0) * 1000.0
        self._piece_buf = ctypes.create_string_buffer(256)
        self._pieces: dict[int, bytes] = {}
        self._token_buf_len = 0
        self._token_buf = None
        self._n_swa = L.llama_model_n_swa(self._model)
        self.needs_checkpoints = bool(self._n_swa) and not self.embedding_only
        # The window layers keep window + n_ubatch cells: the n_ubatch positions before the
        # newest still have their window. With 256-row batches (a model whose window
        # attention weighs, planner.shrinks_window_cache) that is too short for a regenerated
        # reply, and the engine keeps checkpoints of chats; a checkpoint holds one window,
        # small for such a model (the starter: 7.5 MiB) and not for the others (Gemma 3 4B:
        # ~120 MB), which keep 512 rows and no chat checkpoints.
        self.cut_reach = n_ubatch if self.needs_checkpoints and chat_checkpoints else 0
        self._window_cells = self._n_swa + n_ubatch
        self._argmax_chains: set[int] = set()  # id() of the chains the engine holds
        self._grammars: dict[int, _Constrained] = {}  # id() of a chain -> its grammar
        self._gbnf: dict[Grammar, str] = {}
        self._candidates: np.ndarray | None = None
        self._vocab_ids: np.ndarray | None = None
        self.info = self._describe(path, name, header, options, n_slots, n_layers=n_layers,
                                   offloaded=offloaded, gpu=gpu, flash_attn=flash_attn)
        repo, sep = L.llama_vocab_fim_rep(self._vocab), L.llama_vocab_fim_sep(self._vocab)
        self.fim_repo = ((self._special_text(repo), self._special_text(sep))
                         if repo >= 0 and sep >= 0 else None)

    def _scan_vocab(self) -> np.ndarray:
        """``never_sampled_tokens`` of this vocabulary (and its harmony markers, printed as
        text). Reading the attribute of each of the starter's 262k tokens takes 80 ms of CPU
        on a 2-core x86 (one ctypes call each), sorting out its 6,400 special ones 5 ms
        more; it bans 6,250 (6,242 <unusedN>, <pad>, <bos>, <unk>, <mask>, <start_of_turn>,
        [multimodal], <start_of_image> and <end_of_image>)."""
        started = time.perf_counter()
        vocab, n = self._vocab, self._n_vocab
        attrs = np.fromiter(map(L.llama_vocab_get_attr, itertools.repeat(vocab, n), range(n)),
                            dtype=np.int32, count=n)

        # Cached: the banned tokens and the harmony markers both read the special ones.
        @functools.cache
        def text(token: int) -> str:
            return (L.llama_vocab_get_text(vocab, token) or b"").decode(errors="replace")

        @functools.cache
        def is_eog(token: int) -> bool:
            return bool(L.llama_vocab_is_eog(vocab, token))

        banned = never_sampled_tokens(attrs, is_eog=is_eog, text=text)
        self._printed_markers = frozenset(harmony_tokens(attrs, is_eog=is_eog, text=text))
        """Control tokens token_bytes prints: a harmony model's markers."""
        # The tokens llama.cpp's tokenizer reads whole out of a text (its special tokens cache).
        self._special = (attrs & (L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_USER_DEFINED
                                  | L.LLAMA_TOKEN_ATTR_UNKNOWN)) != 0
        self._special_texts: dict[int, bytes] = {}
        self.max_special_bytes = max(
            (len(L.llama_vocab_get_text(vocab, token) or b"")
             for token in np.flatnonzero(self._special).tolist()), default=0)
        log.debug("%d of %d tokens are never sampled (vocabulary scanned in %.0f ms)",
                  len(banned), n, (time.perf_counter() - started) * 1000.0)
        return banned

    def warm_up(self) -> None:
        """Decode one token and forget it, as llama.cpp's own tools do: the first decode
        pages the weights in and builds the compute graph, which would otherwise land on
        the first request's time to first token. Called on the engine's worker thread: all
        compute must happen on one thread, or llama.cpp's OpenMP threads slow down by a
        third (libgomp stops spinning once it manages more threads than there are CPUs)."""
        bos = L.llama_vocab_bos(self._vocab)
        if self.embedding_only:
            self.embed([[bos if bos >= 0 else 0]])
            return
        self.decode([bos if bos >= 0 else 0], [0], [0], [True])
        L.llama_memory_clear(self._mem, True)

    def _on_progress(self, fraction: float, user_data: ctypes.c_void_p) -> bool:
        try:
            progress = self._progress
            assert progress is not None  # this callback is registered only with one
            progress(float(fraction))
        except Exception:  # a UI error must not abort the load from inside C
            log.exception("progress callback failed")
        return True

    def _describe(self, path: Path, name: str, header: GGUFHeader, options: LoadOptions,
                  n_slots: int, *, n_layers: int, offloaded: int, gpu: list[Device],
                  flash_attn: int) -> ModelInfo:
        model, vocab = self._model, self._vocab
        template = L.llama_model_chat_template(model, None)
        bos = L.llama_vocab_bos(vocab)
        eos = L.llama_vocab_eos(vocab)
        return ModelInfo(
            name=name,
            path=str(path),
            architecture=header.architecture,
            quant=header.quant,
            size_bytes=L.llama_model_size(model),
            n_params=L.llama_model_n_params(model),
            n_layers=n_layers,
            n_gpu_layers=offloaded,
            n_ctx_train=L.llama_model_n_ctx_train(model),
            n_ctx=L.llama_n_ctx_seq(self._ctx),
            n_slots=n_slots,
            n_vocab=self._n_vocab,
            gpu_backend=gpu[0].backend if offloaded else None,
            flash_attn={0: False, 1: True}.get(flash_attn),
            kv_type=options.kv_type,
            # A file with no chat template of its own, and none from its family, was most
            # likely never taught to chat.
            base_model=options.base_model or (not template and not options.chat_template),
            chat_template=(template.decode(errors="replace") if template
                           else options.chat_template),
            bos_text=self._special_text(bos),
            eos_text=self._special_text(eos),
            add_bos=bool(L.llama_vocab_get_add_bos(vocab)),
            fim=self._fim_texts(),
            embedding_only=self.embedding_only,
            split=self._split,
        )

    def _fim_texts(self) -> tuple[str, str, str] | None:
        ids = (L.llama_vocab_fim_pre(self._vocab), L.llama_vocab_fim_suf(self._vocab),
               L.llama_vocab_fim_mid(self._vocab))
        if any(i < 0 for i in ids):
            return None
        return tuple(self._special_text(i) for i in ids)  # type: ignore[return-value]

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        n = L.llama_token_to_piece(self._vocab, token, self._piece_buf, 256, 0, True)
        return self._piece_buf.raw[: max(n, 0)].decode(errors="replace")

    # --- the Backend contract ------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800"): not text
            raise InvalidRequest(f"the prompt contains {exc.object[exc.start:exc.end]!r},"
                                 " an unpaired UTF-16 surrogate, which is not text; send"
                                 " whole characters.") from None
        n_max = len(data) + 8
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, True)
        if n < 0:
            raise LocalInferError(f"tokenization failed ({n})")
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        """The token's text; a control token's is empty, but for the harmony markers of a
        harmony vocabulary (gpt-oss's replies are parsed by them)."""
        piece = self._pieces.get(token)
        if piece is None:
            special = token in self._printed_markers
            buf = ctypes.create_string_buffer(256)  # its own: prompts are spelled on any thread
            n = L.llama_token_to_piece(self._vocab, token, buf, 256, 0, special)
            if n < 0:  # longer than the buffer
                big = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self._vocab, token, big, -n, 0, special)
                piece = big.raw[:n]
            else:
                piece = buf.raw[:n]
            self._pieces[token] = piece
        return piece

    def special_piece(self, token: int) -> bytes | None:
        if not self._special[token]:
            return None
        text = self._special_texts.get(token)
        if text is None:
            buf = ctypes.create_string_buffer(256)  # its own: prompts tokenize on any thread
            n = L.llama_token_to_piece(self._vocab, token, buf, 256, 0, True)
            text = self._special_texts[token] = buf.raw[:max(n, 0)]
        return text

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self._vocab, token))

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        # Two fields of the context, read by the next llama_decode: cheap between steps.
        L.llama_set_n_threads(self._ctx, n_threads, n_threads_batch)

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
        rc = L.llama_decode(self._ctx, batch)
        if rc != 0:
            reason = {1: "no room left in the KV cache", 2: "aborted"}.get(rc, f"error {rc}")
            raise LocalInferError(f"llama_decode failed: {reason}{_llama_said()}")

    def new_sampler(self, params: SamplingParams, seed: int) -> ctypes.c_void_p:
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        add = L.llama_sampler_chain_add
        if len(self._never_bias):
            add(chain, L.llama_sampler_init_logit_bias(self._n_vocab, len(self._never_bias),
                                                       self._never_bias))
        if params.penalized:
            add(chain, L.llama_sampler_init_penalties(
                self._n_vocab, params.repeat_last_n, params.repeat_penalty,
                params.frequency_penalty, params.presence_penalty))
        if params.logit_bias:
            bias = (L.llama_logit_bias * len(params.logit_bias))(
                *(L.llama_logit_bias(token, value) for token, value in params.logit_bias))
            add(chain, L.llama_sampler_init_logit_bias(self._n_vocab, len(bias), bias))
        if params.grammar is not None:
            try:
                grammar = self._grammar_sampler(params.grammar)
            except LocalInferError:
                L.llama_sampler_free(chain)
                raise
            self._grammars[id(chain)] = _Constrained(
                grammar,
                L.llama_sampler_chain_get(chain, 1 if len(self._never_bias) else 0)
                if params.penalized else None, _truncation(params))
        if params.greedy:
            add(chain, L.llama_sampler_init_greedy())
            if not params.penalized and not params.logit_bias and params.grammar is None:
                self._argmax_chains.add(id(chain))
            return chain
        if params.mirostat:
            # As llama.cpp's common sampler: mirostat replaces the truncating samplers.
            add(chain, L.llama_sampler_init_temp(params.temperature))
            if params.mirostat == 1:
                add(chain, L.llama_sampler_init_mirostat(
                    self._n_vocab, seed, params.mirostat_tau, params.mirostat_eta, 100))
            else:
                add(chain, L.llama_sampler_init_mirostat_v2(
                    seed, params.mirostat_tau, params.mirostat_eta))
            return chain
        if params.top_k > 0:
            add(chain, L.llama_sampler_init_top_k(params.top_k))
        if params.typical_p < 1.0:
            add(chain, L.llama_sampler_init_typical(params.typical_p, 1))
        if params.top_p < 1.0:
            add(chain, L.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            add(chain, L.llama_sampler_init_min_p(params.min_p, 1))
        add(chain, L.llama_sampler_init_temp(params.temperature))
        add(chain, L.llama_sampler_init_dist(seed))
        return chain

    def sample(self, sampler: ctypes.c_void_p, index: int) -> int:
        if id(sampler) in self._argmax_chains:
            # Greedy with no penalty before it picks the first largest logit of the tokens
            # that may be sampled. numpy finds it in the logits llama.cpp holds (a view, no
            # copy) in ~20 us, after setting the never-sampled ones to -inf in place (~15 us
            # for the starter's 6,250); llama_sampler_sample first fills a candidate array of
            # the whole vocabulary, 0.6 ms a token for the starter's 262k entries, 3% of its
            # decode time. Greedy keeps no state to update.
            logits = self.raw_logits(index)
            logits[self.never_sampled] = -np.inf
            return int(logits.argmax())
        constrained = self._grammars.get(id(sampler))
        if constrained is not None:
            return self._sample_constrained(sampler, constrained, index)
        return L.llama_sampler_sample(sampler, self._ctx, index)

    # --- grammars ------------------------------------------------------------------------
    def check_grammar(self, grammar: Grammar) -> None:
        """Raise InvalidRequest for a grammar llama.cpp cannot use (a schema the converter
        does not take, rules llama.cpp does not parse), before the request is queued."""
        L.llama_sampler_free(self._grammar_sampler(grammar))

    def _grammar_sampler(self, grammar: Grammar) -> ctypes.c_void_p:
        gbnf = self._gbnf.get(grammar)
        if gbnf is None:
            try:
                gbnf = to_gbnf(grammar, schema_rules)
            except (ValueError, KeyError, TypeError, AssertionError, RecursionError) as exc:
                raise InvalidRequest(f"the JSON schema cannot be turned into a grammar: {exc}"
                                     ) from None
            if len(self._gbnf) > 64:  # a few schemas are in use at once; forget the rest
                self._gbnf.clear()
            self._gbnf[grammar] = gbnf
        if grammar.triggers:
            patterns = (ctypes.c_char_p * len(grammar.triggers))(
                *(p.encode() for p in grammar.triggers))
            sampler = L.llama_sampler_init_grammar_lazy_patterns(
                self._vocab, gbnf.encode(), grammar.start_rule.encode(), patterns,
                len(grammar.triggers), None, 0)
        else:
            sampler = L.llama_sampler_init_grammar(self._vocab, gbnf.encode(),
                                                   grammar.start_rule.encode())
        if not sampler:
            if grammar.gbnf is not None:
                raise InvalidRequest("the grammar is not GBNF that llama.cpp can parse"
                                     f"{_llama_said()} Its start rule must be named root.")
            raise InvalidRequest(f"llama.cpp could not parse the grammar{_llama_said()}")
        return sampler

    def _sample_constrained(self, chain: ctypes.c_void_p, constrained: _Constrained,
                            index: int) -> int:
        """Sample as the chain would from the whole vocabulary with the grammar applied, asking
        the grammar only about the best tokens (see shortlist.best_allowed) where that is
        exact; else about the whole vocabulary, 17-31 ms for the starter's 262k tokens on a
        loaded 2-core x86 (a decode step there: 25 ms unloaded). llama.cpp's common sampler
        instead samples first and asks the grammar about that token only: cheaper, but it
        favours the tokens the grammar-free chain keeps, so it is not the same distribution."""
        logits = self.raw_logits(index)
        logits[self.never_sampled] = -np.inf  # as the chain's bias would, and in place
        grammar = constrained.grammar
        ids = best_allowed(logits, lambda band: self._allows(grammar, band),
                           constrained.truncation)
        if ids is None:
            token = self._pick(chain, self._candidates_of(logits, None), grammar)
        else:
            token = self._pick(chain, self._candidates_of(logits, ids), None)
        L.llama_sampler_accept(grammar, token)
        L.llama_sampler_accept(chain, token)
        return token

    @staticmethod
    def _allows(grammar: ctypes.c_void_p, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the grammar allows next (its verdict does not depend on logits)."""
        candidates = np.zeros(len(ids), dtype=_TOKEN_DATA)
        candidates["id"] = ids
        L.llama_sampler_apply(grammar, ctypes.byref(_data_array(candidates)))
        return np.isfinite(candidates["logit"])

    def _candidates_of(self, logits: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
        """A llama_token_data array of the given tokens (None: the whole vocabulary, in a
        buffer kept for it: only the worker thread samples)."""
        if ids is not None:
            candidates = np.empty(len(ids), dtype=_TOKEN_DATA)
            candidates["id"] = ids
            candidates["logit"] = logits[ids]
            candidates["p"] = 0.0
            return candidates
        if self._candidates is None:
            self._candidates = np.empty(self._n_vocab, dtype=_TOKEN_DATA)
            self._vocab_ids = np.arange(self._n_vocab, dtype=np.int32)
        candidates = self._candidates
        candidates["id"] = self._vocab_ids  # again each time: samplers reorder the array
        candidates["logit"] = logits
        candidates["p"] = 0.0
        return candidates

    def _pick(self, chain: ctypes.c_void_p, candidates: np.ndarray,
              grammar: ctypes.c_void_p | None) -> int:
        """The chain's choice among ``candidates`` (after the grammar's, if given)."""
        array = _data_array(candidates)
        if grammar is not None:
            L.llama_sampler_apply(grammar, ctypes.byref(array))
            if not np.isfinite(candidates["logit"][:array.size]).any():
                # Accepting any token now would abort the process inside llama.cpp
                # ("Unexpected empty grammar stack"): end this request instead.
                raise InvalidRequest("the grammar allows no token the model can write here"
                                     " (check the grammar or JSON schema: e.g. a character"
                                     " class no token can match).")
        L.llama_sampler_apply(chain, ctypes.byref(array))
        if array.selected < 0:
            raise LocalInferError("the sampler chain selected no token")
        if grammar is not None and not np.isfinite(candidates["logit"][array.selected]):
            # The request's logit_bias banned every token the grammar allows: accepting this
            # one would abort the process inside llama.cpp.
            raise InvalidRequest("'logit_bias' bans every token the grammar allows here (an"
                                 " end-of-generation token banned with -100 after the JSON"
                                 " is complete does so): remove that bias.")
        return int(candidates["id"][array.selected])

    def logits(self, index: int) -> list[float]:
        return self.raw_logits(index).tolist()

    def raw_logits(self, index: int) -> np.ndarray:
        """Batch entry ``index``'s logits as a view of llama.cpp's buffer (no copy)."""
        return np.ctypeslib.as_array(L.llama_get_logits_ith(self._ctx, index),
                                     shape=(self._n_vocab,))

    def accept(self, sampler: ctypes.c_void_p, tokens: Sequence[int]) -> None:
        constrained = self._grammars.get(id(sampler))
        if constrained is not None:
            # The prompt feeds the repetition penalty only: a grammar constrains the reply.
            if constrained.penalties is not None:
                for token in tokens:
                    L.llama_sampler_accept(constrained.penalties, token)
            return
        for token in tokens:
            L.llama_sampler_accept(sampler, token)

    def free_sampler(self, sampler: ctypes.c_void_p) -> None:
        self._argmax_chains.discard(id(sampler))
        constrained = self._grammars.pop(id(sampler), None)
        if constrained is not None:
            L.llama_sampler_free(constrained.grammar)
        L.llama_sampler_free(sampler)

    def seq_trim(self, seq_id: int, n_keep: int) -> int:
        if self._can_cut(seq_id, n_keep):
            return n_keep
        L.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
        return 0

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
        one a small second context on the same weights, made on first use, that mean-pools
        the last hidden states."""
        if self._embed_ctx is None:
            cparams = L.llama_context_default_params()
            n = self.n_ctx_embed
            _set(cparams, n_ctx=n, n_batch=n, n_ubatch=n, n_seq_max=EMBED_SEQS,
                 kv_unified=True, embeddings=True, pooling_type=L.LLAMA_POOLING_TYPE_MEAN,
                 n_threads=self._threads[0], n_threads_batch=self._threads[1], no_perf=True,
                 flash_attn_type=0)
            ctx = L.llama_init_from_model(self._model, cparams)
            if not ctx:
                raise LocalInferError(f"llama.cpp could not create a context for embeddings"
                                      f"{_llama_said()}")
            self._embed_ctx = ctx
        if self._embed_batch is None:
            self._embed_batch = L.llama_batch_init(self.n_ctx_embed, 0, 1)
        return self._embed_ctx

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        ctx = self._embedding_context()
        batch = self._embed_batch
        assert batch is not None  # made with the context
        mem = L.llama_get_memory(ctx)
        n_embd = L.llama_model_n_embd(self._model)
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
            try:
                rc = L.llama_decode(ctx, batch)
                if rc != 0:
                    raise LocalInferError(f"llama_decode failed while embedding (error {rc})"
                                          f"{_llama_said()}")
                for seq in range(len(group)):
                    row = L.llama_get_embeddings_seq(ctx, seq)
                    if not row:
                        raise LocalInferError("llama.cpp returned no pooled embedding")
                    vectors.append(np.ctypeslib.as_array(row, shape=(n_embd,)).tolist())
            finally:
                if mem:
                    L.llama_memory_clear(mem, True)
        return vectors

    def close(self) -> None:
        if self._embed_batch is not None:
            L.llama_batch_free(self._embed_batch)
            self._embed_batch = None
        if self._embed_ctx is not None and self._embed_ctx != self._ctx:
            L.llama_free(self._embed_ctx)
        self._embed_ctx = None
        if self._batch is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            L.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            L.llama_model_free(self._model)
            self._model = None


@dataclass(frozen=True)
class _Constrained:
    """A sampler chain's grammar (kept out of the chain: see _sample_constrained), the
    chain's penalties sampler, which alone is fed the prompt, and what the chain keeps."""

    grammar: ctypes.c_void_p
    penalties: ctypes.c_void_p | None
    truncation: Truncation


def _truncation(params: SamplingParams) -> Truncation:
    """The truncation new_sampler's chain for ``params`` applies after the grammar."""
    if params.greedy:
        # The first largest logit: penalties or a bias reorder the logits before it.
        return Truncation(greedy=True, whole=params.penalized or bool(params.logit_bias))
    return Truncation(top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
                      whole=params.penalized or bool(params.logit_bias) or bool(params.mirostat)
                      or params.typical_p < 1.0)


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def _data_array(candidates: np.ndarray) -> L.llama_token_data_array:
    """A llama_token_data_array over a numpy array of _TOKEN_DATA (no copy: llama.cpp's
    samplers edit it in place; the numpy array must outlive the call)."""
    return L.llama_token_data_array(
        data=candidates.ctypes.data_as(ctypes.POINTER(L.llama_token_data)),
        size=len(candidates), selected=-1, sorted=False)


def schema_rules(schema: object, rule: str) -> str:
    """GBNF rules defining ``rule`` as JSON that matches ``schema``, by the converter that
    llama-cpp-python ships (llama.cpp's json_schema_to_grammar.py; local $refs only)."""
    converter = _SchemaConverter(prop_order={}, allow_fetch=False, dotall=False,
                                 raw_pattern=False)
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema must be an object")
    defined = converter.visit(converter.resolve_refs(schema, "request"), rule)
    rules = str(converter.format_grammar())
    # A primitive schema comes back as a built-in rule's name ("string"), not ``rule``.
    return rules if defined == rule else f"{rule} ::= {defined}\n{rules}"


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


class _SchemaConverter(SchemaConverter):
    """The shipped converter, plus the numeric bounds it would silently ignore."""

    def visit(self, schema: Any, name: str) -> str:
        if isinstance(schema, dict) and any(k in schema for k in _BOUNDS):
            kind = schema.get("type")
            if kind == "integer":
                return str(self._add_rule(name or "integer-range",
                                          f"({integer_range(schema)}) space"))
            if kind == "number":
                raise ValueError("bounds on a 'number' cannot be enforced; use an integer"
                                 " or leave them out")
        return str(super().visit(schema, name))


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
    errors = [line for line in recent if "error" in line.lower() or "failed" in line.lower()]
    return f" (llama.cpp: {errors[-1]})." if errors else "."


def measure_raw_llama(path: str, *, prompt: str, max_tokens: int, n_ctx: int, n_threads: int,
                      prefill_tokens: int, prefill_text: str, flash_attn: bool = False) -> dict:
    """llama-cpp-python's own high-level ``Llama`` class on the same model, for comparison
    (``localinfer bench`` runs this in a child process: two threads driving llama.cpp in one
    process slow each other down). Returns create_completion's streaming decode rate between
    its first and last chunk, and ``Llama.eval``'s prefill rate on ``prefill_tokens`` tokens."""
    _init()
    if not _use_extra_buffer_types():  # the same AMX guard as LlamaBackend
        original = L.llama_model_default_params

        def params() -> L.llama_model_params:
            p = original()
            p.use_extra_bufts = False
            return p

        L.llama_cpp.llama_model_default_params = params
    llm = L.Llama(model_path=path, n_ctx=n_ctx, n_threads=n_threads,
                  n_threads_batch=n_threads, n_batch=512, flash_attn=flash_attn, verbose=False)
    llm.create_completion("Warm up", max_tokens=4, temperature=0.0)
    started = time.perf_counter()
    times = [time.perf_counter() for _ in llm.create_completion(
        prompt, max_tokens=max_tokens, temperature=0.0, stream=True)]
    tokens = llm.tokenize(prefill_text.encode())[:prefill_tokens]
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(tokens)
    prefill_s = time.perf_counter() - t0
    return {
        "ttft_ms": (times[0] - started) * 1000.0,
        "decode_tps": (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0,
        "chunks": len(times),
        "prefill_tokens": len(tokens),
        "prefill_tps": len(tokens) / prefill_s,
    }


# --- RPC workers (llama.cpp's ggml-rpc backend) ---------------------------------------------
RPC_MISSING = ("this llama-cpp-python was built without llama.cpp's RPC backend; rebuild it"
               " with: CMAKE_ARGS=\"-DGGML_RPC=on\" pip install --force-reinstall --no-cache-dir"
               " --no-deps llama-cpp-python==0.3.36")
_RPC_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_RPC_START_SERVER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                     ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))


def supports_rpc() -> bool:
    """Whether this llama.cpp build has the RPC backend (``-DGGML_RPC=on``)."""
    _init()
    return bool(L.llama_supports_rpc())


def _rpc_function(name: str, prototype: Any) -> Any:
    """A function of the RPC backend, found through ggml's registry (as llama.cpp's own
    tools find it: it may live in libggml-rpc or be loaded dynamically)."""
    _init()
    lib = _rpc_registry_lib()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    address = lib.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not address:
        raise BackendUnavailable(RPC_MISSING, title="no RPC support in this build")
    return prototype(address)


def _rpc_registry_lib() -> ctypes.CDLL:
    lib = _ggml_lib()
    p = ctypes.c_void_p
    for name, args, res in [
        ("ggml_backend_reg_by_name", [ctypes.c_char_p], p),
        ("ggml_backend_reg_get_proc_address", [p, ctypes.c_char_p], p),
        ("ggml_backend_reg_dev_count", [p], ctypes.c_size_t),
        ("ggml_backend_reg_dev_get", [p, ctypes.c_size_t], p),
        ("ggml_backend_dev_by_name", [ctypes.c_char_p], p),
    ]:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def rpc_devices(endpoints: Sequence[str]) -> list[int]:
    """The devices of each RPC worker, in order (llama.cpp connects to each here and ABORTS
    the process if one cannot be reached: probe them with hardware.rpc first)."""
    add_server = _rpc_function("ggml_backend_rpc_add_server", _RPC_ADD_SERVER)
    lib = _rpc_registry_lib()
    out: list[int] = []
    for endpoint in endpoints:
        reg = add_server(endpoint.encode())
        if not reg:
            raise ModelLoadError(f"RPC worker {endpoint} offers no device.")
        out += [lib.ggml_backend_reg_dev_get(reg, i)
                for i in range(lib.ggml_backend_reg_dev_count(reg))]
    return out


def layers_per_device(n_layers: int, n_gpu_layers: int, tensor_split: Sequence[float]
                      ) -> list[int]:
    """How many of the n_layers + 1 layers (repeating layers, then the output layer)
    llama.cpp puts on each offload device for ``n_gpu_layers`` and ``tensor_split``
    (llama_model_base::load_tensors' rule); the CPU keeps the rest."""
    n_devices = len(tensor_split)
    counts = [0] * n_devices
    offloaded = max(0, min(n_gpu_layers if n_gpu_layers >= 0 else n_layers + 1, n_layers + 1))
    if not n_devices or not offloaded or sum(tensor_split) <= 0:
        return counts
    # In float32, as llama.cpp computes it, so that a layer on a boundary lands alike.
    bounds = np.cumsum(np.array(tensor_split, dtype=np.float32), dtype=np.float32)
    bounds = bounds / bounds[-1]
    for j in range(offloaded):
        position = np.float32(j) / np.float32(offloaded)
        index = int(np.searchsorted(bounds, position, side="right"))
        counts[min(index, n_devices - 1)] += 1
    return counts


def _use_workers(mparams: L.llama_model_params, options: LoadOptions
                 ) -> tuple[ctypes.Array[ctypes.c_void_p], ctypes.Array[ctypes.c_float], list[str]]:
    """Put ``options.n_gpu_layers`` layers on the RPC workers' devices, shared out by
    ``options.tensor_split``; the rest stays on the local CPU. Returns the arrays llama.cpp
    reads while it loads, and a label for each device ("HOST:PORT #i")."""
    handles = rpc_devices(options.rpc_servers)
    if len(options.tensor_split) not in (0, len(handles)):
        raise InvalidRequest(f"tensor_split has {len(options.tensor_split)} shares for"
                             f" {len(handles)} worker devices.")
    lib = _ggml_lib()
    labels: list[str] = []
    for handle in handles:
        # The RPC backend describes each of its devices by the worker's endpoint.
        endpoint = (lib.ggml_backend_dev_description(handle) or b"").decode()
        labels.append(f"{endpoint} #{sum(x.startswith(endpoint + ' #') for x in labels)}")
    array = (ctypes.c_void_p * (len(handles) + 1))(*handles, None)  # NULL-terminated
    split = (ctypes.c_float * L.llama_max_devices())(*(options.tensor_split or ()))
    _set(mparams, devices=ctypes.cast(array, ctypes.c_void_p).value,
         split_mode=L.LLAMA_SPLIT_MODE_LAYER,
         tensor_split=ctypes.cast(split, ctypes.POINTER(ctypes.c_float)) if options.tensor_split
         else None)
    return array, split, labels


def _worker_split(n_layers: int, options: LoadOptions, labels: list[str]
                  ) -> tuple[tuple[str, int], ...]:
    """Layers per device, the local CPU first (as ModelInfo.split shows them)."""
    shares = options.tensor_split or tuple(1.0 for _ in labels)
    counts = layers_per_device(n_layers, options.n_gpu_layers, shares)
    return (("CPU", n_layers + 1 - sum(counts)), *zip(labels, counts, strict=True))


def start_rpc_server(endpoint: str, cache_dir: str | None, n_threads: int,
                     device_names: Sequence[str]) -> None:
    """Run llama.cpp's RPC server for these local devices (blocks while it serves; returns
    when it could not listen)."""
    start = _rpc_function("ggml_backend_rpc_start_server", _RPC_START_SERVER)
    lib = _rpc_registry_lib()
    handles = []
    for name in device_names:
        dev = lib.ggml_backend_dev_by_name(name.encode())
        if not dev:
            known = ", ".join(d.name for d in devices())
            raise InvalidRequest(f"no device {name!r} in this llama.cpp build (it has: {known}).")
        handles.append(dev)
    array = (ctypes.c_void_p * len(handles))(*handles)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads,
          len(handles), array)
