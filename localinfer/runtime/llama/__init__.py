"""The llama.cpp backend, through llama-cpp-python's low-level C API.

This package holds the only modules that import ``llama_cpp``. They use the C API directly
(batches, per-sequence native sampler chains, KV-cache trimming) rather than the ``Llama``
class, so no logits array is copied into Python per token and several sequences decode in one
batch. ``LlamaBackend`` is the engine's adapter; each of its concerns is a module:

    model.py         the model and its context: load (parameters, devices, flash attention),
                     describe (ModelInfo), free; LlamaBackend; llama-cpp-python's Llama to compare
    decode.py        the generation batch through llama_decode, thread counts, embeddings
    sampling.py      native sampler chains, grammar-constrained sampling, the logits
    seq_state.py     cutting a sequence's cache, checkpoints of its window, swapping two
    vocab.py         tokenizing and spelling tokens; the scan for never-sampled tokens
    ggml_devices.py  the build's devices (local, and RPC workers'); the RPC server
    tensor_placement.py  expert tensors kept in RAM (buffer-type overrides); what a load put where
    native.py        process-wide set-up: backend init, llama.cpp's log, the params setter
    quantize.py      llama.cpp's quantizer (llama_model_quantize), for `create --quantize`

The names outside code uses are re-exported here, loaded on first use (PEP 562): the
hardware probe imports ``ggml_devices`` alone, without the engine's adapter (``model.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as the type checker sees them; at run time __getattr__ loads them
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
    from .seq_state import SeqState
    from .vocab import HARMONY_TOKENS, harmony_tokens, never_sampled_tokens

_MODULE_OF = {
    "L": None,  # llama_cpp itself
    "EMBED_CTX_GENERATIVE": "decode", "EMBED_CTX_MAX": "decode", "EMBED_SEQS": "decode",
    "RPC_MISSING": "ggml_devices", "Device": "ggml_devices", "devices": "ggml_devices",
    "layers_per_device": "ggml_devices", "rpc_devices": "ggml_devices",
    "start_rpc_server": "ggml_devices", "supports_gpu_offload": "ggml_devices",
    "supports_rpc": "ggml_devices", "system_info": "ggml_devices",
    "LlamaBackend": "model", "flash_attn_type": "model", "measure_raw_llama": "model",
    "_physical_cores": "native",
    "schema_rules": "sampling",
    "SeqState": "seq_state",
    "HARMONY_TOKENS": "vocab", "harmony_tokens": "vocab", "never_sampled_tokens": "vocab",
}

__all__ = [
    "EMBED_CTX_GENERATIVE", "EMBED_CTX_MAX", "EMBED_SEQS", "HARMONY_TOKENS", "RPC_MISSING",
    "Device", "L", "LlamaBackend", "SeqState", "_physical_cores", "devices", "flash_attn_type",
    "harmony_tokens", "layers_per_device", "measure_raw_llama", "never_sampled_tokens",
    "rpc_devices", "schema_rules", "start_rpc_server", "supports_gpu_offload", "supports_rpc",
    "system_info",
]
assert sorted(__all__) == sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:  # a submodule not imported yet is found after this
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _MODULE_OF[name]
    if module is None:
        return importlib.import_module("llama_cpp")
    return getattr(importlib.import_module(f".{module}", __name__), name)
