"""The model and its context: loading a GGUF with llama.cpp (weights, devices, the context's
parameters), describing what loaded, and freeing it: ``LlamaBackend``, made of this package's
parts. Also llama-cpp-python's own ``Llama`` class on the same file, for comparison."""

from __future__ import annotations

import ctypes
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np

from ...catalog import is_embedding_header, is_reranker_header
from ...errors import InvalidRequest, ModelLoadError
from ...gguf import GGUFHeader
from ..backend import LoadOptions, ProgressCallback
from ..inflight import loading
from ..types import ModelInfo, kv_cache_types
from .decode import EMBED_CTX_GENERATIVE, EMBED_CTX_MAX, EMBED_SEQS, Decoding
from .ggml_devices import Device, _use_workers, _worker_split, devices, system_info
from .native import (
    _failed_allocation,
    _init,
    _llama_said,
    _physical_cores,
    _recent_log,
    _set,
    called_back,
    interrupted,
    raise_if_interrupted,
)
from .sampling import Sampling
from .seq_state import SeqStates, build_id
from .tensor_placement import cpu_overrides, expert_patterns, on_host, read_report, start_report
from .vocab import VocabScan

log = logging.getLogger(__package__)

_GGML_KV_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}  # ggml_type ids


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


def _file_stamp(path: str) -> str:
    """A file as a saved state's validity knows it: its path, size and modification time."""
    try:
        st = os.stat(path)
    except OSError:
        return path
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


class LlamaBackend(VocabScan, Decoding, Sampling, SeqStates):
    """A model loaded with llama.cpp, driven by the engine's worker thread: the ``Backend``
    contract, its parts in this package's modules."""

    def __init__(self, path: str | os.PathLike[str], options: LoadOptions, *, name: str,
                 header: GGUFHeader, progress: ProgressCallback | None = None) -> None:
        _init()
        self._model = None
        self._ctx = None
        self._batch = None
        self._embed_ctx = None
        self._embed_batch = None
        self._hidden_only = None
        self._lora: tuple[Any, int, Any] | None = None
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
        if options.n_cpu_moe > 0:
            if not header.expert_count:
                raise InvalidRequest(f"n_cpu_moe {options.n_cpu_moe}: {path.name} is not a"
                                     " mixture-of-experts model (its header names no experts).")
            # Kept on self: llama.cpp reads the array while it loads.
            self._overrides = cpu_overrides(expert_patterns(range(options.n_cpu_moe)))
            _set(mparams, tensor_buft_overrides=ctypes.cast(self._overrides, ctypes.c_void_p))
        if progress is not None:
            # Kept on self: ctypes must not free the callback while llama.cpp holds it.
            self._progress_cb = L.llama_progress_callback(self._on_progress)
            _set(mparams, progress_callback=self._progress_cb)
        _recent_log.clear()
        start_report()
        t0 = time.perf_counter()
        with loading():
            self._model = L.llama_model_load_from_file(str(path).encode(), mparams)
        raise_if_interrupted()
        if not self._model:
            raise _out_of_memory(path, "its weights", options, header.block_count) or \
                ModelLoadError(f"llama.cpp could not load {path}{_llama_said()}")
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
        # The plan's physical batch, fewer rows for a window-heavy model read on the CPU
        # (LoadOptions.cpu_window_ubatch), whose chats then keep checkpoints.
        chat_checkpoints = cpu_only and options.cpu_window_ubatch > 0
        n_ubatch = min(options.n_batch, options.cpu_window_ubatch if chat_checkpoints
                       else options.n_ubatch)
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
            try:
                k, v = kv_cache_types(options.kv_type)
            except ValueError as exc:
                raise ModelLoadError(f"{exc}.") from None
            _set(cparams, type_k=_GGML_KV_TYPES[k], type_v=_GGML_KV_TYPES[v])
        with loading():
            self._ctx = L.llama_init_from_model(self._model, cparams)
        raise_if_interrupted()
        if not self._ctx:
            self.close()
            slots = f"{options.n_ctx} tokens x {n_slots} slot{'s' * (n_slots != 1)}"
            part = (f"its KV cache ({slots})" if "kv cache" in _llama_said().lower() else
                    f"its compute buffers ({slots}, batches of {n_ubatch})")
            raise _out_of_memory(path, part, options, n_layers) or ModelLoadError(
                f"llama.cpp could not create a context of {options.n_ctx} tokens x {n_slots}"
                f" slots for {path} (out of memory?){_llama_said()} Try a smaller --ctx."
            )
        try:
            self._lora = _lora_adapters(self._model, options.lora_adapters)
        except ModelLoadError:
            self.close()
            raise
        if self._lora is not None and L.llama_set_adapters_lora(self._ctx, *self._lora) != 0:
            self.close()
            raise ModelLoadError(f"llama.cpp could not apply the LoRA adapters"
                                 f" {', '.join(options.lora_adapters)}{_llama_said()}")
        self._mem = L.llama_get_memory(self._ctx)
        self.enable_interrupt()
        # What llama.cpp took, not what was asked: it caps the batch at the context asked
        # for (320 gives 320) and rounds the context up (to 512), and a decode of more
        # tokens than its batch aborts the process (GGML_ASSERT), not the call.
        self.n_batch = min(options.n_batch, int(L.llama_n_batch(self._ctx)))
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)
        self.fim_spm = options.fim_spm
        self._embed_ctx = self._ctx if self.embedding_only else None
        self._embed_batch = None
        self.n_ctx_embed = (L.llama_n_ctx(self._ctx) if self.embedding_only
                            else min(EMBED_CTX_GENERATIVE, L.llama_n_ctx_seq(self._ctx)))
        self.load_ms = (time.perf_counter() - t0) * 1000.0
        self._piece_buf = ctypes.create_string_buffer(256)
        self._pieces = {}
        self._token_buf_len = 0
        self._token_buf = None
        self._n_swa = L.llama_model_n_swa(self._model)
        self.needs_checkpoints = bool(self._n_swa) and not self.embedding_only
        self.tokenizes_here = True
        # The window layers keep window + n_ubatch cells: the n_ubatch positions before the
        # newest still have their window. With 256-row batches (a model whose window
        # attention weighs, planner.shrinks_window_cache) that is too short for a regenerated
        # reply, and the engine keeps checkpoints of chats; a checkpoint holds one window,
        # small for such a model (the starter: 7.5 MiB) and not for the others (Gemma 3 4B:
        # ~120 MB), which keep 512 rows and no chat checkpoints.
        self.cut_reach = n_ubatch if self.needs_checkpoints and chat_checkpoints else 0
        self._window_cells = self._n_swa + n_ubatch
        self._argmax_chains = set()  # id() of the chains the engine holds
        self._grammars = {}  # id() of a chain -> its grammar
        self._gbnf = {}
        self._candidates = None
        self._vocab_ids = None
        report = read_report()
        if report.offloaded is not None and not options.rpc_servers and gpu:
            offloaded = report.offloaded  # llama.cpp's own count, as it says it (a CPU build
            # says "offloaded 19/19 layers to GPU" for -1 too, and offloads none)
        self.info = self._describe(path, name, header, options, n_slots, n_layers=n_layers,
                                   offloaded=offloaded, gpu=gpu, flash_attn=flash_attn)
        # What a sequence's state saved on disk is valid for, besides the file (a state
        # holds one cell list per slot, the KV types and the V layout flash attention picks).
        self.state_format = "" if self.embedding_only else (
            f"{build_id()} {system_info()} slots={n_slots} kv={options.kv_type}"
            f" flash_attn={flash_attn} ubatch={n_ubatch} offloaded={offloaded}"
            f" rpc={','.join(options.rpc_servers)}"
            # A LoRA adapter changes every layer's keys and values: its file is part of it.
            f" lora={','.join(_file_stamp(p) for p in options.lora_adapters)}")
        self.info = replace(self.info, buffers=report.buffers,
                            n_cpu_moe=min(options.n_cpu_moe, n_layers))
        self.overridden = report.overridden
        """The tensors llama.cpp put elsewhere for n_cpu_moe, with their buffer type."""
        repo, sep = L.llama_vocab_fim_rep(self._vocab), L.llama_vocab_fim_sep(self._vocab)
        self.fim_repo = ((self._special_text(repo), self._special_text(sep))
                         if repo >= 0 and sep >= 0 else None)

    @called_back
    def _on_progress(self, fraction: float, user_data: ctypes.c_void_p) -> bool:
        try:
            progress = self._progress
            assert progress is not None  # this callback is registered only with one
            if progress(float(fraction)) is False:
                return False  # its owner stops the load (a daemon shutting down)
        except Exception:  # a UI error must not abort the load from inside C
            log.exception("progress callback failed")
        return not interrupted()  # a Ctrl-C stops the load (raised once it returns)

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
            reranker=self.embedding_only and is_reranker_header(
                header.arch_value("pooling_type")),
            split=self._split,
        )

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


def _size_text(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _out_of_memory(path: Path, part: str, options: LoadOptions,
                   n_layers: int) -> ModelLoadError | None:
    """The error for a load that failed because llama.cpp could not allocate a buffer (of
    ``part``: its weights, its KV cache...), saying on which device, how much it asked for and
    what to change; None when the log names no failed allocation."""
    failed = _failed_allocation()
    if failed is None:
        return None
    buffer_type, size = failed
    weights = part == "its weights"
    smaller = "a smaller quantization" if weights else "a smaller --ctx (a request's num_ctx)"
    if not weights and options.kv_type == "f16":
        smaller += ", a q8_0 KV cache (--kv-type q8_0)"
    if on_host(buffer_type):
        return ModelLoadError(
            f"out of memory loading {path.name}: llama.cpp could not allocate"
            f" {_size_text(size)} of RAM ({buffer_type} buffer) for {part}. Use {smaller},"
            " or free memory (other loaded models: `localinfer ps`; other programs).",
            title="out of memory")
    device = next((d for d in devices() if d.name == buffer_type), None)
    where = buffer_type
    if device is not None:
        where += f" ({device.description}"
        if device.memory_total:
            where += (f"; it reports {_size_text(device.memory_free)} free of"
                      f" {_size_text(device.memory_total)}")
        where += ")"
    total = n_layers + 1  # the repeating layers and the output layer, as --gpu-layers counts
    on_gpu = total if options.n_gpu_layers < 0 else min(options.n_gpu_layers, total)
    fewer = (f"fewer layers on the GPU (e.g. --gpu-layers {on_gpu // 2}, or gpu_layers ="
             f" {on_gpu // 2} in config.toml; 0 keeps the model in RAM)")
    if not on_gpu:  # a buffer of the GPU's with no layer there: nothing to move off it
        todo = f"Use {smaller}"
    else:
        todo = f"Put {fewer}, use {smaller}" if weights else f"Use {smaller}, put {fewer}"
    return ModelLoadError(
        f"out of GPU memory loading {path.name}: llama.cpp could not allocate"
        f" {_size_text(size)} on {where} for {part}, with {on_gpu}/{total} layers on the GPU."
        f" {todo}, or free GPU memory (other loaded models: `localinfer ps`; other programs).",
        title="out of GPU memory")


def _lora_adapters(model, paths: tuple[str, ...]) -> tuple[Any, int, Any] | None:
    """The adapters at ``paths`` loaded for ``model``, as llama_set_adapters_lora takes them
    (array, count, scales); kept by the backend: llama.cpp reads them. None without any.
    The model frees them when it is freed."""
    if not paths:
        return None
    adapters = []
    for path in paths:
        adapter = L.llama_adapter_lora_init(model, os.fsencode(path))
        if not adapter:
            raise ModelLoadError(f"llama.cpp could not load the LoRA adapter {path}"
                                 f"{_llama_said()}")
        adapters.append(adapter)
    array = (L.llama_adapter_lora_p_ctypes * len(adapters))(*adapters)
    scales = (ctypes.c_float * len(adapters))(*[1.0] * len(adapters))
    return array, len(adapters), scales


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
