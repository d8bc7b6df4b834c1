"""The devices ggml offers this llama.cpp build: the local ones (with their memory, and whether
the build offloads at all) and those of RPC workers (llama.cpp's ggml-rpc backend), which a
model's layers are shared out over, and the RPC server that lends this machine's."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp as L
import numpy as np

from ...errors import BackendUnavailable, InvalidRequest, ModelLoadError
from ..backend import LoadOptions
from .native import _init, _set


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


def registries() -> list[str]:
    """The ggml backends compiled into this build ("CPU", "RPC", "Vulkan"...), whether or not
    they found a device (Vulkan hides a CPU-type device such as llvmpipe by default)."""
    _init()
    lib = _ggml_lib()
    return [(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)) or b"").decode(
        errors="replace") for i in range(lib.ggml_backend_reg_count())]


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
            ("ggml_backend_reg_count", [], ctypes.c_size_t),
            ("ggml_backend_reg_get", [ctypes.c_size_t], p),
        ]:
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        _ggml = lib
    return _ggml


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
    n_workers = len(handles)
    lib = _ggml_lib()
    labels: list[str] = []
    for handle in handles:
        # The RPC backend describes each of its devices by the worker's endpoint.
        endpoint = (lib.ggml_backend_dev_description(handle) or b"").decode()
        labels.append(f"{endpoint} #{sum(x.startswith(endpoint + ' #') for x in labels)}")
    if options.local_gpu:
        local = _local_gpu()
        if local is None:
            raise InvalidRequest("the split puts layers on this machine's GPU, and llama.cpp"
                                 " lists no GPU device here.")
        handles.append(local[0])
        labels.append(local[1])
    # Devices past the last share take no layers (llama.cpp reads the array as zeros there):
    # a split that gives the last worker none names one share fewer.
    if len(options.tensor_split) > len(handles):
        raise InvalidRequest(f"the layer split names {len(options.tensor_split)} devices, and"
                             f" the workers have {n_workers}"
                             + (" and this machine's GPU one." if options.local_gpu else "."))
    array = (ctypes.c_void_p * (len(handles) + 1))(*handles, None)  # NULL-terminated
    split = (ctypes.c_float * L.llama_max_devices())(*(options.tensor_split or ()))
    _set(mparams, devices=ctypes.cast(array, ctypes.c_void_p).value,
         split_mode=L.LLAMA_SPLIT_MODE_LAYER,
         tensor_split=ctypes.cast(split, ctypes.POINTER(ctypes.c_float)) if options.tensor_split
         else None)
    return array, split, labels


def _local_gpu() -> tuple[int, str] | None:
    """This machine's first GPU device (handle, name), as llama.cpp lists it."""
    lib = _ggml_lib()
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if _DEVICE_KINDS.get(lib.ggml_backend_dev_type(dev)) in ("gpu", "igpu"):
            return dev, (lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace")
    return None


def _worker_split(n_layers: int, options: LoadOptions, labels: list[str]
                  ) -> tuple[tuple[str, int], ...]:
    """Layers per device, the local CPU first (as ModelInfo.split shows them)."""
    shares = options.tensor_split or tuple(1.0 for _ in labels)
    shares = (*shares, *(0.0 for _ in labels[len(shares):]))  # the devices past the last: 0
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
