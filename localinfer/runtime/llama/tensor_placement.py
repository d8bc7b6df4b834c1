"""Where llama.cpp puts a model's tensors: the buffer-type overrides that keep a mixture-of-experts
model's expert tensors in RAM (``tensor_buft_overrides``, llama-server's ``--n-cpu-moe``), and
what llama.cpp reported while it loaded (``LoadReport``: each buffer by device, the layers it
offloaded, the tensors an override moved)."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import BackendUnavailable
from .ggml_devices import _ggml_lib
from .native import _load_report

_BUFFER = re.compile(r"(\S+) (model|KV|compute|output|RS) buffer size = +([\d.]+) MiB")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_OVERRIDDEN = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")


def expert_patterns(n_layers: Sequence[int]) -> list[str]:
    """The regular expressions that match the expert tensors of these layers (the up, gate and
    down projections of every expert; llama-server's ``--n-cpu-moe`` writes the same)."""
    return [rf"blk\.{i}\.ffn_(up|down|gate|gate_up)_(ch|)exps" for i in n_layers]


class _Override(ctypes.Structure):
    # struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t
    # buft; } (llama.h); llama-cpp-python declares the field a void pointer.
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def cpu_overrides(patterns: Sequence[str]) -> ctypes.Array[_Override]:
    """A NULL-terminated array that puts the tensors matching ``patterns`` in the CPU's
    buffers. The caller keeps it alive while llama.cpp loads."""
    lib = _ggml_lib()
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    cpu = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    buft = lib.ggml_backend_dev_buffer_type(cpu) if cpu else None
    if not buft:
        raise BackendUnavailable("llama.cpp offers no CPU buffer type for expert tensors.")
    entries = [_Override(p.encode(), buft) for p in patterns] + [_Override(None, None)]
    return (_Override * len(entries))(*entries)


@dataclass(frozen=True)
class LoadReport:
    """What llama.cpp said about a load: buffers as (device, kind, bytes) with kind "model",
    "KV", "compute", "output" or "RS"; the layers it offloaded (None: it did not say); the
    tensors a buffer-type override moved, with the buffer type they went to."""

    buffers: tuple[tuple[str, str, int], ...]
    offloaded: int | None
    overridden: tuple[tuple[str, str], ...]


def start_report() -> None:
    """Forget what an earlier load reported."""
    _load_report.clear()


def read_report() -> LoadReport:
    buffers: list[tuple[str, str, int]] = []
    offloaded: int | None = None
    overridden: list[tuple[str, str]] = []
    for line in list(_load_report):
        if m := _BUFFER.search(line):
            buffers.append((m.group(1), m.group(2), round(float(m.group(3)) * 2**20)))
        elif m := _OFFLOADED.search(line):
            offloaded = int(m.group(1))
        elif m := _OVERRIDDEN.search(line):
            overridden.append((m.group(1), m.group(2)))
    return LoadReport(tuple(buffers), offloaded, tuple(overridden))


def on_host(device: str) -> bool:
    """Whether a buffer named ``device`` ("CPU", "CPU_Mapped", "Vulkan_Host", "CUDA0") is in
    the host's RAM."""
    return device.startswith("CPU") or device.endswith("_Host")
