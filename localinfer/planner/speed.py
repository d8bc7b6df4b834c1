"""How fast a placement runs: the bytes a decoded token reads on each device, the roofline
they set for a loaded model, and the predicted decode and prefill rates.

Decode, per token:
    t = sum over devices d of bytes_d / (eta_d x q x bw_d)  +  layers_d x s_d  +  t_token
bytes_d = the weights read on d (for a mixture of experts only the active experts' share) and
the KV cache read at the current position (``decode_reads``; the ``Roofline`` of a loaded model
is the same bytes over the bare bandwidth); eta_d = the achieved share of the bandwidth for the
backend and device class (GPU_CLASSES, GPU_GENERATIONS; a multi-socket CPU gets one
socket's), q = a factor < 1 for the low-bit quants whose kernels do more arithmetic per byte
(off Apple F16/BF16 weights x FLOAT_DECODE_GAIN: no dequantization),
s_d = a fixed dispatch/synchronisation cost per layer, t_token = sampling and logits. On the CPU
the bandwidth term is max(bytes / (eta x bw(threads)), bytes / (threads x per-core dequant
throughput)): with few cores llama.cpp is compute-bound before memory-bound. The constants
(machine.py) are fitted to published llama-bench results (tests/data/published_llama_bench.csv
lists them with their sources; bench/planner_published.py reports the fit) and to this
project's own measurements.

Off Apple a GPU's read rate of quantized weights is also capped by its shader cores
(DECODE_GBPS_PER_TFLOP x dequant_tflops: a 4-CU iGPU cannot dequantize as fast as its LPDDR5
delivers; F16/BF16 weights need no dequantizing).

Prefill, per token: 2 x (non-embedding parameters in use) FLOPs over the device's achievable
FLOP/s: a GPU's data-sheet dense FP16 matrix rate (GPU_MATRIX_TFLOPS; shader_tflops doubles it
for a GPU whose FP16 runs at its FP32 rate) x its class's matrix_eta (fitted per backend and
generation: llama.cpp's quantized matrix kernels, not the data sheet, bound it; GPUs without
matrix cores get a shader-core share) x the share its weights' type reaches (PREFILL_QUANT:
legacy quants, K-quants, i-quants, F16; PREFILL_QUANT_BY_PATH where a backend's kernels
differ), plus off Apple PREFILL_LAYER_MS per GPU layer and prompt batch of N_UBATCH rows; a
CPU's cores x clock x FLOPs per cycle of its ISA. An AMD or Intel GPU on Vulkan behind an ARM host
gets ARM_HOST_LAYER_MS more per layer and ARM_HOST_PREFILL of its prefill rate
(machine.host_gpu_class).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .machine import (
    CPU_DOT_GBPS_PER_GHZ,
    CPU_FLOPS_PER_CYCLE,
    CPU_LAYER_MS,
    PREFILL_LAYER_MS,
    SAMPLING_NS_PER_VOCAB,
    TOKEN_MS,
    Machine,
    PlanPrefs,
    gpu_read_gbps,
    machine_view,
    matrix_tflops,
    prefill_quant_factor,
    quant_factor,
    shader_tflops,
)
from .memory import N_UBATCH, kv_bytes_per_element

EXPERT_COPY_GBPS = 25.0
"""Host to GPU copy rate of expert tensors kept in RAM: a prompt's physical batch of 512 rows
makes llama.cpp copy them to the GPU and multiply there (its op offload), so prefill pays
their bytes over PCIe (4.0 x16 moves ~25 GB/s) once per batch (unchecked: no published row
separates this term)."""

if TYPE_CHECKING:
    from ..hardware.profile import HardwareProfile
    from ..runtime.types import ModelInfo
    from .candidate import Candidate, LayerShape


@dataclass(frozen=True)
class DecodeReads:
    """What one decoded token reads on each device: the weights placed there (for a mixture of
    experts only the active experts' share; the output head on the device that holds it) and,
    per layer, the KV bytes per cached position with the layer's sliding window (such a layer
    reads at most its window of cells)."""

    cpu_weight_bytes: float
    gpu_weight_bytes: float
    cpu_kv: tuple[tuple[float, int | None], ...] = ()
    gpu_kv: tuple[tuple[float, int | None], ...] = ()

    def bytes_at(self, position: int) -> tuple[float, float]:
        """(host bytes, GPU bytes) read to decode one token at ``position``."""
        return (self.cpu_weight_bytes + _kv_read(self.cpu_kv, position),
                self.gpu_weight_bytes + _kv_read(self.gpu_kv, position))


def _kv_read(layers: tuple[tuple[float, int | None], ...], position: int) -> float:
    return sum(per_position * (position if window is None else min(position, window))
               for per_position, window in layers)


def decode_reads(c: Candidate, n_gpu_layers: int, kv_type: str, n_cpu_moe: int = 0
                 ) -> DecodeReads:
    """The bytes per token of ``c`` with its last ``n_gpu_layers`` on the GPU (llama.cpp
    offloads the last layers first; n_layers + 1 adds the output head), and the experts of
    the first ``n_cpu_moe`` layers read in RAM."""
    n = c.n_layers
    k = max(0, min(n_gpu_layers, n + 1))
    first_gpu = n - min(k, n)
    moved = float(sum(layer.expert_read_bytes
                      for layer in c.layers[first_gpu:max(first_gpu, n_cpu_moe)]))
    per_element = kv_bytes_per_element(kv_type)

    def kv(layers: Sequence[LayerShape]) -> tuple[tuple[float, int | None], ...]:
        return tuple((layer.kv_elements_per_token * per_element, layer.sliding_window)
                     for layer in layers)

    cpu_layers, gpu_layers = c.layers[:first_gpu], c.layers[first_gpu:]
    cpu_bytes = float(sum(layer.read_bytes for layer in cpu_layers)) + moved
    gpu_bytes = float(sum(layer.read_bytes for layer in gpu_layers)) - moved
    if k > n:
        gpu_bytes += c.output_bytes
    else:
        cpu_bytes += c.output_bytes
    return DecodeReads(cpu_bytes, gpu_bytes, kv(cpu_layers), kv(gpu_layers))


def decode_bytes_per_token(c: Candidate, position: int, kv_type: str = "f16") -> float:
    """Bytes one decoded token reads at ``position``, all devices together. Divided into the
    memory bandwidth, it is the roofline of the decode rate."""
    return sum(decode_reads(c, 0, kv_type).bytes_at(position))


@dataclass(frozen=True)
class Roofline:
    """The decode rate memory bandwidth allows a loaded model:

        ceiling tok/s = 1 / sum over devices d of (bytes read per token on d / bandwidth of d)

    with the bytes of ``reads`` at the current context length, and the host's measured read
    bandwidth (``localinfer hw``) or the GPU's data-sheet figure."""

    reads: DecodeReads
    host_bandwidth_gbps: float
    host_bandwidth_source: str
    """"measured", "spec" or "estimated" (how the host figure was obtained)."""
    gpu_bandwidth_gbps: float = 0.0
    exact: bool = True
    """False when the weights per token are the file size (no header could be read)."""

    def ceiling_tps(self, position: int) -> float | None:
        """The decode rate memory bandwidth allows at ``position`` (None if unknown)."""
        cpu, gpu = self.reads.bytes_at(position)
        seconds = 0.0
        if cpu:
            if self.host_bandwidth_gbps <= 0:
                return None
            seconds += cpu / (self.host_bandwidth_gbps * 1e9)
        if gpu:
            if self.gpu_bandwidth_gbps <= 0:
                return None
            seconds += gpu / (self.gpu_bandwidth_gbps * 1e9)
        return 1.0 / seconds if seconds > 0 else None

    def percent(self, decode_tps: float, position: int) -> float | None:
        """Decode as a percent of the ceiling: how close the machine runs to its memory
        limit."""
        ceiling = self.ceiling_tps(position)
        if not ceiling or decode_tps <= 0:
            return None
        return 100.0 * decode_tps / ceiling


def roofline_for(info: ModelInfo, hardware: HardwareProfile, candidate: Candidate | None,
                 kv_type: str) -> Roofline:
    """The roofline of a loaded model: exact per layer from its header (``candidate``) with a
    ``kv_type`` KV cache, else the whole file read once per token, all from one device."""
    gpu_bw = 0.0
    if info.n_gpu_layers > 0 and hardware.gpus:
        gpu = next((g for g in hardware.gpus if info.gpu_backend in g.drivers),
                   hardware.gpus[0])
        gpu_bw = gpu.bandwidth_gbps
    host_bw, source = hardware.host_bandwidth_gbps, hardware.bandwidth_source
    if candidate is None:
        on_gpu = info.n_gpu_layers > info.n_layers  # all, the output layer included
        size = float(info.size_bytes)
        reads = DecodeReads(cpu_weight_bytes=0.0 if on_gpu else size,
                            gpu_weight_bytes=size if on_gpu else 0.0)
        return Roofline(reads, host_bw, source, gpu_bw, exact=False)
    return Roofline(decode_reads(candidate, info.n_gpu_layers, kv_type), host_bw, source,
                    gpu_bw)


# --- prediction ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    decode_tps: float
    decode_ms: Mapping[str, float]
    prefill_tps: float
    key: str
    """The calibration key: the backend that takes most of a token's time."""


def predict(c: Candidate, hw: HardwareProfile, n_gpu_layers: int, *, position: int,
            n_threads: int | None = None, kv_type: str | None = None,
            prefs: PlanPrefs | None = None) -> Prediction:
    """Uncalibrated decode and prefill speed of ``c`` placed with ``n_gpu_layers`` on ``hw``,
    decoding at ``position`` tokens into the context."""
    prefs = prefs or PlanPrefs(n_threads=n_threads)
    if n_threads:
        prefs = replace(prefs, n_threads=n_threads)
    if kv_type:
        prefs = replace(prefs, kv_type=kv_type)
    return predict_on(c, machine_view(hw, prefs), n_gpu_layers, position)


def predict_on(c: Candidate, m: Machine, n_gpu_layers: int, position: int, n_cpu_moe: int = 0
               ) -> Prediction:
    """``n_cpu_moe``: the expert tensors of the first n_cpu_moe layers are read in RAM (each
    such layer on the GPU adds a hand-over to the CPU and back: CPU_LAYER_MS), and for a
    prompt llama.cpp copies them to the GPU once per physical batch (EXPERT_COPY_GBPS)."""
    n = c.n_layers
    k = max(0, min(n_gpu_layers, n + 1)) if m.gpu is not None else 0
    first_gpu = n - min(k, n)
    output_on_gpu = k > n
    q = quant_factor(c.quant)
    n_gpu, n_cpu = n - first_gpu, first_gpu
    n_moved = max(0, min(n_cpu_moe, n) - first_gpu)
    cpu_bytes, gpu_bytes = decode_reads(c, k, m.kv_type, n_cpu_moe).bytes_at(position)
    ms: dict[str, float] = {"gpu": 0.0, "cpu": 0.0, "fixed": TOKEN_MS}
    tflops = shader_tflops(m.gpu.name, matrix_tflops(m.gpu)) if m.gpu is not None else 0.0
    if n_gpu or output_on_gpu:
        assert m.gpu is not None and m.gpu_class is not None
        read = gpu_read_gbps(m.gpu_class, q, m.gpu.bandwidth_gbps, tflops, m.gpu.vendor, c.quant,
                             m.gpu.name)
        ms["gpu"] = gpu_bytes / (read * 1e9) * 1e3
        ms["fixed"] += n_gpu * m.gpu_class.layer_ms
    if n_cpu or not output_on_gpu or n_moved:
        threads = max(1, m.threads)
        bandwidth = min(m.host_bw_gbps, threads * m.host_bw_1core_gbps) * m.cpu_eta * q
        dot = threads * m.ghz * CPU_DOT_GBPS_PER_GHZ.get(m.simd, 1.0) * q
        ms["cpu"] = cpu_bytes / (min(bandwidth, dot) * 1e9) * 1e3
        ms["fixed"] += (n_cpu + n_moved) * CPU_LAYER_MS
    on_gpu_output = output_on_gpu and m.gpu is not None
    ms["fixed"] += c.n_vocab * SAMPLING_NS_PER_VOCAB["gpu" if on_gpu_output else "cpu"] / 1e6
    total_ms = ms["gpu"] + ms["cpu"] + ms["fixed"]
    key = (m.gpu_backend or "CPU") if ms["gpu"] >= ms["cpu"] and m.gpu is not None else "CPU"

    # Prefill: the layers' FLOPs on each device, one after the other.
    flops = c.prefill_flops_per_token
    share_gpu = n_gpu / n if n else 0.0
    cpu_flops = max(1, m.threads) * m.ghz * 1e9 * CPU_FLOPS_PER_CYCLE.get(m.simd, 4.0)
    prefill_s = flops * (1 - share_gpu) / cpu_flops
    if share_gpu:
        assert m.gpu is not None and m.gpu_class is not None
        rate = (tflops * 1e12 * m.gpu_class.matrix_eta
                * prefill_quant_factor(c.quant, m.gpu_backend, m.gpu.vendor, m.gpu.name))
        prefill_s += flops * share_gpu / rate
        if m.gpu.vendor != "apple":
            prefill_s += n_gpu * PREFILL_LAYER_MS / 1e3 / N_UBATCH
        moved = sum(layer.expert_bytes for layer in c.layers[first_gpu:first_gpu + n_moved])
        if moved and not m.unified:
            prefill_s += moved / (EXPERT_COPY_GBPS * 1e9) / N_UBATCH
    return Prediction(decode_tps=1000.0 / total_ms, decode_ms=ms,
                      prefill_tps=1.0 / prefill_s if prefill_s > 0 else 0.0, key=key)
