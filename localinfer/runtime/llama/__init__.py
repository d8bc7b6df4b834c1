"""The llama.cpp backend, through llama-cpp-python's low-level C API.

This package holds the only modules that import ``llama_cpp``. They use the C API directly
(batches, per-sequence native sampler chains, KV-cache trimming) rather than the ``Llama``
class, so no logits array is copied into Python per token and several sequences decode in one
batch. ``LlamaBackend`` is the engine's adapter; each of its concerns is a module:

    model.py         the model and its context: load (parameters, devices, flash attention),
                     describe (ModelInfo), free; LlamaBackend; llama-cpp-python's Llama to compare
    decode.py        the generation batch through llama_decode, thread counts, embeddings
    sampling.py      native sampler chains, grammar-constrained sampling, the logits
    state.py         cutting a sequence's cache, checkpoints of its window, swapping two
    vocab.py         tokenizing and spelling tokens; the scan for never-sampled tokens
    ggml_devices.py  the build's devices (local, and RPC workers'); the RPC server
    native.py        process-wide set-up: backend init, llama.cpp's log, the params setter

The names outside code uses are re-exported here.
"""

from __future__ import annotations

import llama_cpp as L

from .decode import EMBED_CTX_GENERATIVE, EMBED_CTX_MAX, EMBED_SEQS
from .ggml_devices import (
    RPC_MISSING,
    Device,
    devices,
    layers_per_device,
    rpc_devices,
    start_rpc_server,
    supports_gpu_offload,
    supports_rpc,
    system_info,
)
from .model import LlamaBackend, flash_attn_type, measure_raw_llama
from .native import _physical_cores
from .sampling import schema_rules
from .state import SeqState
from .vocab import HARMONY_TOKENS, harmony_tokens, never_sampled_tokens

__all__ = [
    "EMBED_CTX_GENERATIVE", "EMBED_CTX_MAX", "EMBED_SEQS", "HARMONY_TOKENS", "RPC_MISSING",
    "Device", "L", "LlamaBackend", "SeqState", "_physical_cores", "devices", "flash_attn_type",
    "harmony_tokens", "layers_per_device", "measure_raw_llama", "never_sampled_tokens",
    "rpc_devices", "schema_rules", "start_rpc_server", "supports_gpu_offload", "supports_rpc",
    "system_info",
]
