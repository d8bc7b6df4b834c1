"""The planner: which model variant fits this machine, how to split it between GPU and CPU, and
how fast it will run, with the reasons in numbers. Pure: data in, data out, no I/O.

    plan(hardware, candidates, prefs) -> Plan

Memory, per device (bytes):
    weights of the layers placed there (exact per-layer bytes from a GGUF header, else spread
    evenly from the catalog's file size) + the KV cache of those layers for n_slots x n_ctx
    tokens (x kv_bytes_per_element of the cache type; a sliding-window layer keeps
    min(n_ctx, window + n_ubatch) cells per slot, as llama.cpp allocates it) + a compute buffer
    (the logits of one ubatch, 4 x n_ubatch x n_vocab, on the device with the output layer,
    plus activations; CPU-only, at least the attention scores of one ubatch,
    4 x n_ubatch x n_ctx x n_head) + a fixed runtime overhead; each
    device keeps a reserve free (VRAM: 10% and at least 512 MiB; RAM: 10% and at least 1 GiB).
    The token embedding always stays in RAM (llama.cpp keeps it on the CPU).

Layer split: as many repeating layers on the GPU as fit, counted from the last one (llama.cpp's
``n_gpu_layers``), then the output layer; the rest must fit in RAM. On unified memory (Apple
Silicon, integrated GPUs) both parts come out of the same RAM.

Decode, per token:
    t = sum over devices d of bytes_d / (eta_d x q x bw_d)  +  layers_d x s_d  +  t_token
bytes_d = the weights read on d (for a mixture of experts only the active experts' share) and
the KV cache read at the current position (``decode_reads``; the ``Roofline`` of a loaded model
is the same bytes over the bare bandwidth); eta_d = the achieved share of the bandwidth for the
backend and device class (GPU_CLASSES, GPU_GENERATIONS; a multi-socket CPU gets one
socket's), q = a factor < 1 for the low-bit quants whose kernels do more arithmetic per byte,
s_d = a fixed dispatch/synchronisation cost per layer, t_token = sampling and logits. On the CPU
the bandwidth term is max(bytes / (eta x bw(threads)), bytes / (threads x per-core dequant
throughput)): with few cores llama.cpp is compute-bound before memory-bound. The constants
below are fitted to published llama-bench results (tests/data/published_llama_bench.csv lists
them with their sources; bench/planner_published.py reports the fit) and to this project's own
measurements.

Prefill, per token: 2 x (non-embedding parameters in use) FLOPs over the device's achievable
FLOP/s: a GPU's data-sheet dense FP16 matrix rate (GPU_MATRIX_TFLOPS) x its class's
matrix_eta; a CPU's cores x clock x FLOPs per cycle of its ISA.

Across machines (``plan_split``, for a profile's llama.cpp RPC workers): the devices in
llama.cpp's order, this machine's CPU (the first layers), the workers' devices in registration
order, this machine's GPU (the last layers); the output head on the last device that takes
layers. Each worker device is a device like a local one (its free memory less the reserve of
its kind; its bandwidth, or where unknown this machine's one-core figure for a CPU and
UNKNOWN_REMOTE_GPU_GBPS for a GPU; a worker on loopback is this machine's cores and RAM), and
per token it adds one round trip and its activations (4 x n_embd bytes in, out to the next
machine; from the last device the logits, 4 x n_vocab) and masks over its link. Layers go to
the device that reads them fastest, as many as its memory takes, then the next; every subset
of the worker devices is tried and the fastest split wins. A candidate is pooled when that
fits and decodes faster than this machine alone, or only pooling fits.

Variant choice: among candidates that fit, the best quality (the model's published benchmark
score from models.toml, else one estimated from its parameters, x the share its quant keeps by
published perplexity, catalog.QUANT_QUALITY) whose predicted decode reaches ``min_tps``; if
none does, the fastest that fits; if none fits, no choice and a summary of what is missing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from ..catalog import QUANT_QUALITY, is_embedding_header
from ..errors import InvalidRequest

if TYPE_CHECKING:
    from ..catalog import ModelSpec, Variant
    from ..gguf import GGUFHeader
    from ..hardware.profile import GPUInfo, HardwareProfile
    from ..protocol import ModelInfo

GIB = 2**30
MIB = 2**20

DEFAULT_CTX = 8192
"""Context used when none is asked for (capped at the model's trained context)."""
MIN_AUTO_CTX = 2048
"""The default context is halved down to this to make a model fit, never further."""
N_UBATCH = 512
"""llama.cpp's physical batch (the runtime's n_ubatch): sizes the compute buffer."""
CPU_WINDOW_UBATCH = 256
"""The physical batch, on a CPU without flash attention, of a model whose sliding-window
layers' attention weighs (``Candidate.window_attention_share``). llama.cpp gives such a layer
window + n_ubatch cells (padded to 256) and, without flash attention, computes attention over
every cell in use, in the window or not: with 256 rows instead of 512 the starter's window
cache is 768 cells instead of 1,024, a chat turn's 20 new tokens after 1,184 cached read in
1.10-1.16x the time of 20 fresh ones instead of 1.25x (2-core EPYC, AVX-512), a 2,048-token
prompt at 1.06-1.10x the rate, decode the same. The cells past the window are also how far the
cache can be cut back (a regenerated reply): 256 tokens instead of 512, which the engine's
checkpoints make up for (CHAT_CHECKPOINTS). 128 rows measured slower than 256."""
WINDOW_SHARE_MIN = 0.04
"""Below this share of a token's arithmetic (attention over 256 more window cells against the
layers' weights) 256-row batches save too little to pay for the checkpoints: Gemma 3 270M 7.9%,
1B 1.7%, 4B 1.0%."""
CHAT_CHECKPOINTS = 2
"""Checkpoints of its window layers a slot keeps with 256-row batches (runtime.engine's
``_chat_checkpoints``: where its last turn began and where its reply began), each the cells
of one window (llama.cpp saves no others)."""
KV_ELEMENT_BYTES = {"f16": 2.0, "q8_0": 34 / 32}
"""Bytes per KV cache element, by cache type (Config.kv_type), as ggml stores it: Q8_0 keeps
blocks of 32 int8 values with one F16 scale, 34 bytes per 32 elements."""
MAX_AUTO_SLOTS = 4

# --- fitted constants (see the module docstring) ---------------------------------------------
# Fitted on the rows marked "fit" of tests/data/published_llama_bench.csv (llama-bench tg128 and
# pp512 on data-sheet bandwidths and matrix rates; bench/planner_published.py reports the fit and
# the held-out rows). Where a comment says "unchecked", the rows it was fitted on were later
# removed (no retrieved source for them) and no retrieved row tests it.
@dataclass(frozen=True)
class GPUClass:
    """How one class of GPU (backend x discrete/integrated x vendor/generation) runs llama.cpp."""

    eta: float
    """Decode: the share of the data-sheet memory bandwidth the weights stream at."""
    layer_ms: float
    """Decode: fixed dispatch/synchronisation cost per layer, milliseconds."""
    matrix_eta: float
    """Prefill: the share of the data-sheet dense FP16 matrix rate (fp16_tflops) reached."""
    immature: str = ""
    """Why the backend is immature on this class (said in the plan); "" = mature."""


GPU_CLASSES: dict[tuple[str, str], GPUClass] = {
    # ggml-org/llama.cpp#15013 (Llama 2 7B Q4_0, RTX 30/40/50): 0.80-0.95 of bandwidth once
    # ~0.8 ms per token of launches is taken out; pp512 at ~0.55 of the FP16 tensor rate.
    ("CUDA", "discrete"): GPUClass(eta=0.86, layer_ms=0.014, matrix_eta=0.55),
    # DGX Spark (0.8, ggml-org/llama.cpp#15013): LPDDR5X shared with the CPU. (The Jetson AGX
    # Orin row it was also fitted on had no retrieved source and was removed.)
    ("CUDA", "integrated"): GPUClass(eta=0.75, layer_ms=0.03, matrix_eta=0.30),
    # ggml-org/llama.cpp#4167 (every M1-M4 chip): 0.85-0.9 of bandwidth; the Ultras lose to a
    # fixed ~4 ms per token; pp512 at ~0.6 of the FP32 rate (= the FP16 rate on Apple GPUs).
    ("Metal", "integrated"): GPUClass(eta=0.88, layer_ms=0.14, matrix_eta=0.62),
    # Fitted on ggml-org/llama.cpp#15021 rows (RX 7900 XT/XTX, W7900) since removed (no retrieved
    # source); the retrieved RDNA1-3 rows (PRs #5835, #26284) decode within +10-32%.
    ("ROCm", "discrete"): GPUClass(eta=0.75, layer_ms=0.03, matrix_eta=0.40),
    # Radeon 780M, Strix Halo: decode reaches 0.8-0.9 of the LPDDR5(X) bandwidth (unchecked).
    ("ROCm", "integrated"): GPUClass(eta=0.85, layer_ms=0.05, matrix_eta=0.40),
    # ggml-org/llama.cpp#10879 (RX 7900 XTX RADV, RTX 30/40 on Vulkan).
    ("Vulkan", "discrete"): GPUClass(eta=0.80, layer_ms=0.03, matrix_eta=0.35),
    ("Vulkan", "integrated"): GPUClass(eta=0.80, layer_ms=0.05, matrix_eta=0.35),
    ("SYCL", "discrete"): GPUClass(eta=0.60, layer_ms=0.05, matrix_eta=0.15),
    # Arc 140V: SYCL decode reaches ~0.6 of LPDDR5X (issue 16: predicted +27-37% at 0.85).
    ("SYCL", "integrated"): GPUClass(eta=0.60, layer_ms=0.05, matrix_eta=0.15),
}
DEFAULT_GPU_CLASS = GPUClass(eta=0.60, layer_ms=0.05, matrix_eta=0.25)
"""Backends with no published rows here (OpenCL, MUSA, CANN)."""
GPU_GENERATIONS: tuple[tuple[str, str, str, GPUClass], ...] = (
    # (GPU name pattern, vendor, backend, class): the first match replaces GPU_CLASSES' entry.
    # Data-centre NVIDIA (HBM, server hosts): ~2.5 ms per token of launches (A100 191 tok/s,
    # H100 268 on a 3.8 GB file, ggml-org/llama.cpp#15013); pp512 at ~0.2 of the tensor rate.
    (r"\b(A100|H100|H200|H20|B200|GH200|A800|H800)\b", "nvidia", "CUDA",
     GPUClass(eta=0.90, layer_ms=0.075, matrix_eta=0.20)),
    # Data-centre NVIDIA on Vulkan: an A100 decodes at half its CUDA rate, prefills at 0.65 of
    # it (unchecked: the ggml-org/llama.cpp#17273 rows had no retrieved source).
    (r"\b(A100|H100|H200|H20|B200|GH200|A800|H800)\b", "nvidia", "Vulkan",
     GPUClass(eta=0.80, layer_ms=0.17, matrix_eta=0.13,
              immature="llama.cpp's Vulkan backend runs data-centre NVIDIA GPUs at about half"
                       " their CUDA speed")),
    # CDNA and GCN on ROCm: 13-21% of HBM bandwidth (MI300X 233 tok/s at 5.3 TB/s, MI210 125 at
    # 1.6 TB/s, ggml-org/llama.cpp#15021; Radeon VII 54 at 1 TB/s, llm-tracker.info; unchecked:
    # none of these rows was retrieved, only copies without an address).
    (r"\b(MI\d{2,3}X?|Radeon VII|Vega)\b", "amd", "ROCm",
     GPUClass(eta=0.25, layer_ms=0.03, matrix_eta=0.15,
              immature="llama.cpp's HIP kernels reach about a fifth of this GPU's HBM"
                       " bandwidth (CDNA/GCN)")),
    # Intel GPUs on Vulkan, fitted on an A770 and a Tiger Lake Xe remembered rather than
    # retrieved; the retrieved ggml-org/llama.cpp#10879 rows: an A770 decodes at 0.4 of its
    # bandwidth and prefills at ~0.1 of its XMX rate (as here), a B580 at 0.6 and 0.07.
    (r"", "intel", "Vulkan",
     GPUClass(eta=0.40, layer_ms=0.05, matrix_eta=0.12,
              immature="llama.cpp's Vulkan backend is immature on Intel GPUs (SYCL is faster)")),
)
CPU_LAYER_MS = 0.30
"""Thread barriers between a layer's ~30 graph nodes (~10 us each)."""
CPU_ETA_MEASURED = 0.80
"""Decode reaches ~80% of the read bandwidth numpy measures with all cores."""
ACHIEVABLE_FRACTION_OF_SPEC = 0.80
"""A data-sheet bandwidth: reads reach ~80% of it (STREAM-style), so eta x 0.8."""
# Per-thread throughput of llama.cpp's quantized dot-product kernels, GB/s of weights per GHz.
CPU_DOT_GBPS_PER_GHZ = {"avx512": 3.6, "avx2": 3.0, "avx": 1.5, "neon-i8mm": 2.0,
                        "neon-dotprod": 1.6, "neon": 1.0, "scalar": 0.5}
# Effective prefill FLOPs per cycle per core (int8 dot-product kernels on quantized weights).
CPU_FLOPS_PER_CYCLE = {"avx512": 28.0, "avx2": 16.0, "avx": 8.0, "neon-i8mm": 16.0,
                       "neon-dotprod": 8.0, "neon": 4.0, "scalar": 2.0}
# Dense FP16 matrix rate (TFLOPS, FP16 accumulate, no sparsity) of common GPUs, from the
# vendors' data sheets (Intel Arc: the XMX rate), for profiles that do not give fp16_tflops.
# Apple GPUs are not
# double-rate: FP16 runs at the FP32 rate (philipturner/metal-benchmarks), the figures below.
GPU_MATRIX_TFLOPS: tuple[tuple[str, float], ...] = (
    ("RTX PRO 6000", 503.8), ("RTX 5090", 419.0), ("RTX 5080", 225.1), ("RTX 5070 Ti", 175.8),
    ("RTX 5070", 123.5), ("RTX 5060 Ti", 94.8), ("RTX 4090", 330.3), ("RTX 4080", 194.9),
    ("RTX 4070 Ti", 160.4), ("RTX 4070", 116.8), ("RTX 4060 Ti", 88.4), ("RTX 4060", 60.5),
    ("RTX 3090", 142.0), ("RTX 3080", 119.0), ("RTX 3070", 81.3), ("RTX 3060 Ti", 64.8),
    ("RTX 3060", 51.2), ("RTX 2080 Ti", 107.6), ("RTX 2070", 59.7), ("RTX 2060", 51.6),
    ("H100", 989.4), ("A100", 312.0), ("L40S", 362.1), ("A10", 125.0), ("T4", 65.0),
    ("RX 9070 XT", 195.0), ("RX 7900 XTX", 122.8), ("RX 7900 XT", 103.0), ("W7900", 122.6),
    ("RX 7800 XT", 74.6), ("RX 7600", 43.5), ("RX 6800 XT", 41.5), ("MI300X", 1307.4),
    ("MI210", 181.0), ("8060S", 59.4), ("890M", 23.8), ("780M", 8.9),
    ("Arc B580", 116.0), ("Arc A770", 137.6), ("Arc 140V", 32.0),
    ("M1 Ultra", 21.2), ("M1 Max", 10.4), ("M1 Pro", 5.2), ("M1", 2.6),
    ("M2 Ultra", 27.2), ("M2 Max", 13.6), ("M2 Pro", 6.8), ("M2", 3.6),
    ("M3 Ultra", 28.4), ("M3 Max", 16.4), ("M3 Pro", 7.4), ("M3", 4.1),
    ("M4 Max", 18.4), ("M4 Pro", 9.2), ("M4", 4.3), ("M5", 5.7),
)
MATRIX_TFLOPS_PER_GBPS = 0.1
"""A GPU in no table: its matrix rate guessed from its bandwidth (a mid-range ratio)."""
TOKEN_MS = 0.3
"""Per-token cost outside the layers (graph launch, sampling setup)."""
SAMPLING_NS_PER_VOCAB = {"cpu": 5.0, "gpu": 2.0}
"""Logits handling and sampling scale with the vocabulary (Gemma 3's 262k entries: ~1.3 ms)."""
DEFAULT_GHZ = 2.5

# Runtime overhead per device: the process and libraries on the host, the driver context,
# kernels and scratch on a GPU.
HOST_OVERHEAD = 256 * MIB
GPU_OVERHEAD = {"CUDA": 400 * MIB, "ROCm": 400 * MIB, "Vulkan": 256 * MIB, "Metal": 128 * MIB,
                "SYCL": 400 * MIB, "OpenCL": 256 * MIB, "MUSA": 400 * MIB, "CANN": 400 * MIB}


def gpu_class(gpu: GPUInfo, backend: str) -> GPUClass:
    """The class ``gpu`` falls in under ``backend``: a vendor/generation rule of GPU_GENERATIONS
    first, else by backend and kind (an Apple GPU is integrated)."""
    return _gpu_class(gpu.name, gpu.vendor, gpu.kind, backend)


def _gpu_class(name: str, vendor: str, kind: str, backend: str) -> GPUClass:
    for pattern, rule_vendor, on, found in GPU_GENERATIONS:
        if vendor == rule_vendor and backend == on and re.search(pattern, name):
            return found
    kind = "integrated" if kind == "integrated" or vendor == "apple" else "discrete"
    return GPU_CLASSES.get((backend, kind), DEFAULT_GPU_CLASS)


def matrix_tflops(gpu: GPUInfo) -> float:
    """The GPU's dense FP16 matrix rate: the profile's figure, else GPU_MATRIX_TFLOPS by name
    (the longest matching name), else a guess from its bandwidth."""
    return _matrix_tflops(gpu.name, gpu.fp16_tflops, gpu.bandwidth_gbps)


def _matrix_tflops(name: str, fp16_tflops: float, bandwidth_gbps: float) -> float:
    if fp16_tflops > 0:
        return fp16_tflops
    known = [(len(gpu), rate) for gpu, rate in GPU_MATRIX_TFLOPS
             if re.search(rf"(?<![\w-]){re.escape(gpu)}(?![\w-])", name)]
    if known:
        return max(known)[1]
    return bandwidth_gbps * MATRIX_TFLOPS_PER_GBPS


def estimated_score(params: float) -> float:
    """A benchmark score for a model with no published one, kept below the published scores of
    models its size so that a guess never outranks a measurement: MMLU 5-shot of the catalog's
    scored models grows about 6 points per doubling of parameters from ~50 at 1B (Llama 3.2 1B
    49.3, Llama 3.1 8B 69.4, Qwen3 32B 83.6), capped at 80, 25 being chance on four choices."""
    return max(25.0, min(80.0, 50.0 + 6.0 * math.log2(max(params, 1.0) / 1e9)))


def quant_factor(quant: str) -> float:
    """Low-bit quants decode below the roofline: their kernels do more work per byte."""
    q = quant.upper()
    if q.startswith("Q2") or q.startswith("IQ1") or q.startswith("IQ2") or q.startswith("TQ"):
        return 0.80
    if q.startswith("Q3") or q.startswith("IQ3"):
        return 0.88
    if q.startswith("IQ4"):
        return 0.92
    return 1.0


def kv_bytes_per_element(kv_type: str) -> float:
    """Bytes one element of a ``kv_type`` KV cache takes: the factor of every KV size and of
    the KV bytes a decoded token reads."""
    try:
        return KV_ELEMENT_BYTES[kv_type]
    except KeyError:
        raise InvalidRequest(f"unknown KV cache type {kv_type!r}; use one of"
                             f" {', '.join(KV_ELEMENT_BYTES)}.") from None


# --- inputs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerShape:
    """What one repeating layer weighs and keeps per token."""

    weight_bytes: int
    read_bytes: int
    """Bytes read per decoded token (less than weight_bytes for a mixture of experts)."""
    kv_elements_per_token: int
    sliding_window: int | None = None


@dataclass(frozen=True)
class Candidate:
    """One model file the planner may choose: exact from a GGUF header, or estimated from the
    catalog."""

    name: str
    """What to call it: ``gemma3:270m-q4_k_m`` or a file name."""
    model: str
    """The model without the quant (``gemma3:270m``), or the file name."""
    quant: str
    file_bytes: int
    layers: tuple[LayerShape, ...]
    output_bytes: int
    """The output head and final norm (for tied embeddings: the embedding table)."""
    embedding_bytes: int
    """The token embedding table, which llama.cpp keeps in RAM."""
    tied_embeddings: bool
    other_bytes: int
    n_embd: int
    n_ff: int
    n_vocab: int
    context_length: int
    """Trained context (0 = unknown)."""
    params: int
    active_params: int
    """Parameters used per token (= params unless mixture-of-experts)."""
    quality: float
    """Quant quality 0..1 (catalog.QUANT_QUALITY)."""
    estimated: bool
    """True when the sizes come from the catalog, not a header."""
    installed: bool = False
    n_head: int = 0
    """Attention (query) heads: size the attention scores when flash attention is off."""
    head_dims: int = 0
    """Key plus value length of one attention head."""
    benchmark: float = 0.0
    """The model's published benchmark score at full precision, 0..100 (0 = none)."""
    benchmark_source: str = ""
    embedding_only: bool = False
    """An embedding model: no decode speed (it generates nothing); its prefill rate is its
    embedding throughput, and a plan never picks it over a model that generates text."""

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def weight_bytes(self) -> int:
        return (sum(layer.weight_bytes for layer in self.layers) + self.embedding_bytes
                + self.other_bytes + (0 if self.tied_embeddings else self.output_bytes))

    @property
    def full_precision_score(self) -> float:
        """The published benchmark score, else one estimated from the parameters (MoE: the
        geometric mean of total and active)."""
        if self.benchmark:
            return self.benchmark
        effective = math.sqrt(self.params * self.active_params) if self.active_params \
            else self.params
        return estimated_score(effective)

    @property
    def quality_score(self) -> float:
        """The benchmark score this file keeps: full-precision score x the quant's share."""
        return self.full_precision_score * self.quality

    @property
    def quality_reason(self) -> str:
        """How quality_score was reached, in words for the plan."""
        if self.benchmark:
            what = f"{self.benchmark:g} ({self.benchmark_source})"
        else:
            what = f"{self.full_precision_score:.0f} (estimated from {self.params / 1e9:.2g}B" \
                   " parameters: no published score)"
        return (f"quality {self.quality_score:.1f} = {what} x {self.quality:.3f} for"
                f" {self.quant} (perplexity, llama-quantize's table)")

    @property
    def prefill_flops_per_token(self) -> float:
        """2 x parameters used per prompt token outside the embedding and output head (the
        head runs once per prompt, for the last token)."""
        body = self.params - self._embedding_params() * (1 if self.tied_embeddings else 2)
        active = self.active_params or self.params
        share = active / self.params if self.params else 1.0
        return 2.0 * max(body, self.params * 0.1) * min(1.0, share * 1.15)

    def _embedding_params(self) -> int:
        return self.n_vocab * self.n_embd

    def window_attention_share(self, cells: int = 256) -> float:
        """What attending over ``cells`` more cells in every sliding-window layer adds to a
        prompt token's arithmetic: 2 x heads x (key + value length) a cell and layer, against
        prefill_flops_per_token."""
        window_layers = sum(1 for layer in self.layers if layer.sliding_window is not None)
        per_token = self.prefill_flops_per_token
        if not window_layers or not per_token:
            return 0.0
        return cells * window_layers * 2.0 * self.n_head * self.head_dims / per_token

    # --- constructors ----------------------------------------------------------------------
    @classmethod
    def from_header(cls, header: GGUFHeader, *, name: str, model: str | None = None,
                    installed: bool = True) -> Candidate:
        n_layers = header.block_count
        weights = header.layer_bytes()[:n_layers]
        experts = [0] * n_layers
        for t in header.tensors:
            m = re.match(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.", t.name)
            if m and int(m.group(1)) < n_layers:
                experts[int(m.group(1))] += t.n_bytes
        used, total = header.expert_used_count, header.expert_count
        share = used / total if used and total else 1.0
        kv = header.layer_kv()
        layers = tuple(
            LayerShape(weight_bytes=weights[i],
                       read_bytes=int(weights[i] - experts[i] * (1 - share)),
                       kv_elements_per_token=kv[i].elements_per_token,
                       sliding_window=kv[i].sliding_window)
            for i in range(n_layers))
        params = header.parameter_count
        expert_params = sum(t.n_elements for t in header.tensors if "_exps." in t.name)
        active = int(params - expert_params * (1 - share)) if expert_params else params
        tied = not any(t.name == "output.weight" for t in header.tensors)
        quant = header.quant
        return cls(
            name=name, model=model or name, quant=quant, file_bytes=header.file_size,
            layers=layers, output_bytes=header.output_bytes,
            embedding_bytes=header.embedding_bytes, tied_embeddings=tied,
            other_bytes=header.other_bytes, n_embd=header.embedding_length,
            n_ff=header.feed_forward_length, n_vocab=header.vocab_size,
            context_length=header.context_length, params=params, active_params=active,
            quality=QUANT_QUALITY.get(quant, 0.9), estimated=False, installed=installed,
            n_head=header.head_count, head_dims=header.key_length + header.value_length,
            embedding_only=is_embedding_header(header.architecture,
                                               header.arch_value("pooling_type")),
        )

    @classmethod
    def from_spec(cls, spec: ModelSpec, variant: Variant, *, installed: bool = False
                  ) -> Candidate:
        """Estimate per-layer bytes from the catalog: the file's bytes per parameter, spread
        over the embedding, the output head and the layers."""
        per_param = variant.size_bytes / spec.params
        embedding = int(spec.vocab * spec.embedding * per_param)
        tied = spec.tied_embeddings
        output = embedding if tied else int(spec.vocab * spec.embedding * per_param)
        body = max(variant.size_bytes - embedding - (0 if tied else output), spec.layers)
        per_layer = body // spec.layers
        share = 1.0
        if spec.active_params:
            embed_params = spec.vocab * spec.embedding * (1 if tied else 2)
            body_params = max(spec.params - embed_params, 1)
            share = min(1.0, max(spec.active_params - embed_params, 0) / body_params)
        head_v = spec.head_dim_v or spec.head_dim
        elements = spec.kv_heads * (spec.head_dim + head_v)
        layers = []
        for i in range(spec.layers):
            window = None
            if spec.sliding_window and (not spec.swa_period or (i + 1) % spec.swa_period):
                window = spec.sliding_window
            layers.append(LayerShape(per_layer, int(per_layer * share), elements, window))
        return cls(
            name=spec.variant_name(variant), model=spec.name, quant=variant.quant,
            file_bytes=variant.size_bytes, layers=tuple(layers), output_bytes=output,
            embedding_bytes=embedding, tied_embeddings=tied, other_bytes=0,
            n_embd=spec.embedding, n_ff=spec.feed_forward or 4 * spec.embedding,
            n_vocab=spec.vocab, context_length=spec.context, params=spec.params,
            active_params=spec.active_params or spec.params, quality=variant.quality,
            estimated=variant.estimated, installed=installed, n_head=spec.heads,
            head_dims=spec.head_dim + head_v,
            benchmark=spec.quality, benchmark_source=spec.quality_source,
            embedding_only=spec.embedding_only,
        )


@dataclass(frozen=True)
class PlanPrefs:
    """What the user asks of a plan. Every field has a sensible default."""

    n_ctx: int | None = None
    """Context per sequence in tokens; None = DEFAULT_CTX (or less, to fit)."""
    min_tps: float = 10.0
    """Decode speed (tokens/s) a variant should reach to be preferred."""
    n_slots: int | None = 1
    """Sequences decoded in parallel (the daemon's slots); None = as many (up to
    MAX_AUTO_SLOTS) as fit without moving layers off the GPU."""
    n_gpu_layers: int | None = None
    """Force this many GPU layers (llama.cpp semantics, -1 = all); None = as many as fit."""
    n_threads: int | None = None
    """CPU threads; None = the profile's (physical cores)."""
    kv_type: str = "f16"
    """KV cache type (Config.kv_type): sizes the cache and the KV bytes read per token."""
    vram_reserve_fraction: float = 0.10
    vram_reserve_min_bytes: int = 512 * MIB
    ram_reserve_fraction: float = 0.10
    ram_reserve_min_bytes: int = 1 * GIB
    decode_position: int = 64
    """Position in the context at which decode speed is predicted (llama-bench's tg128
    averages ~64)."""
    calibration: Mapping[str, float] = field(default_factory=dict)
    """measured/predicted decode ratios for this machine, by backend ("CPU", "CUDA"...)."""


# --- outputs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceUse:
    """Memory a plan puts on one device, in bytes, and what the device can give."""

    device: str
    """"RAM" or the GPU's name."""
    backend: str
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    overhead_bytes: int
    budget_bytes: int
    """What the device can give after its reserve."""

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.overhead_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.budget_bytes


@dataclass(frozen=True)
class Evaluation:
    """One candidate, placed and predicted."""

    candidate: Candidate
    fits: bool
    n_gpu_layers: int
    """llama.cpp's n_gpu_layers: the last N repeating layers, N = n_layers + 1 adds the output."""
    n_ctx: int
    n_slots: int
    n_threads: int
    host: DeviceUse
    gpu: DeviceUse | None
    decode_tps: float
    """Predicted at ``decode_position``, calibrated when a ratio is known."""
    decode_tps_full: float
    """Predicted with the context full."""
    prefill_tps: float
    decode_ms: Mapping[str, float]
    """Where a token's time goes: "gpu", "cpu" (bandwidth/compute terms), "fixed"."""
    calibration: float
    """The measured/predicted ratio applied (1.0 = uncalibrated)."""
    verdict: str
    """"chosen", "fits", "slow", "too big", "context"."""
    reason: str
    gpu_backend: str | None = None
    ctx_note: str = ""
    split: WorkerSplit | None = None
    """The layers across this machine and RPC workers, when the plan pools them (then
    ``n_gpu_layers`` is llama.cpp's count over every offload device, ``gpu`` this machine's)."""

    @property
    def n_layers_total(self) -> int:
        return self.candidate.n_layers + 1

    def to_dict(self) -> dict:
        c = self.candidate
        return {
            "name": c.name, "model": c.model, "quant": c.quant, "file_bytes": c.file_bytes,
            "sizes_estimated": c.estimated, "installed": c.installed, "fits": self.fits,
            "n_gpu_layers": self.n_gpu_layers, "n_layers_total": self.n_layers_total,
            "n_ctx": self.n_ctx, "n_slots": self.n_slots, "n_threads": self.n_threads,
            "gpu_backend": self.gpu_backend,
            "ram": {**asdict(self.host), "total_bytes": self.host.total_bytes},
            "vram": ({**asdict(self.gpu), "total_bytes": self.gpu.total_bytes}
                     if self.gpu else None),
            "decode_tps": None if c.embedding_only else round(self.decode_tps, 2),
            "decode_tps_full_ctx": None if c.embedding_only else round(self.decode_tps_full, 2),
            "embedding_only": c.embedding_only,
            "prefill_tps": round(self.prefill_tps, 1),
            "decode_ms": {k: round(v, 3) for k, v in self.decode_ms.items()},
            "calibration": self.calibration, "verdict": self.verdict, "reason": self.reason,
            "split": self.split.to_dict() if self.split else None,
        }


@dataclass(frozen=True)
class Plan:
    choice: Evaluation | None
    evaluations: tuple[Evaluation, ...]
    summary: str
    """One or two sentences: what was chosen and why, or what is missing."""
    prefs: PlanPrefs

    @property
    def n_gpu_layers(self) -> int:
        return self.choice.n_gpu_layers if self.choice else 0

    @property
    def n_ctx(self) -> int:
        return self.choice.n_ctx if self.choice else 0

    @property
    def n_slots(self) -> int:
        return self.choice.n_slots if self.choice else 1

    @property
    def n_threads(self) -> int:
        return self.choice.n_threads if self.choice else 0

    def to_dict(self) -> dict:
        return {
            "choice": self.choice.to_dict() if self.choice else None,
            "summary": self.summary,
            "min_tps": self.prefs.min_tps,
            "requested_ctx": self.prefs.n_ctx,
            "candidates": [e.to_dict() for e in self.evaluations],
        }


# --- the machine, as the planner sees it ---------------------------------------------------------
@dataclass(frozen=True)
class _Machine:
    ram_budget: int
    gpu: GPUInfo | None
    gpu_backend: str | None
    gpu_budget: int
    unified: bool
    host_bw_gbps: float
    host_bw_1core_gbps: float
    cpu_eta: float
    threads: int
    simd: str
    ghz: float
    cores: int
    kv_type: str
    gpu_class: GPUClass | None = None
    sockets: int = 1


def _machine(hw: HardwareProfile, prefs: PlanPrefs) -> _Machine:
    ram_total = int(hw.ram_total_gib * GIB)
    ram_reserve = max(prefs.ram_reserve_min_bytes, int(prefs.ram_reserve_fraction * ram_total))
    ram_budget = max(0, int(hw.ram_available_gib * GIB) - ram_reserve)
    usable = hw.usable_gpus()
    gpu = backend = None
    gpu_budget = 0
    unified = False
    if usable and prefs.n_gpu_layers != 0:
        # One GPU: the one with the most free memory (multi-GPU splits are not planned).
        gpu, backend = max(usable, key=lambda gb: (gb[0].vram_free_gib, gb[0].bandwidth_gbps))
        free = int(gpu.vram_free_gib * GIB)
        if gpu.unified_memory:
            unified = True
            gpu_budget = min(free, ram_budget)  # the working-set cap already leaves room
        else:
            reserve = max(prefs.vram_reserve_min_bytes,
                          int(prefs.vram_reserve_fraction * gpu.vram_total_gib * GIB))
            gpu_budget = max(0, free - reserve)
    threads = prefs.n_threads or hw.cpu.runtime_threads
    host_bw = hw.host_bandwidth_gbps or _estimated_host_bandwidth(hw)
    sockets = max(1, hw.cpu.sockets)
    if hw.bandwidth_source != "measured":
        # NUMA: a data-sheet figure sums every socket's channels, but one process's pages and
        # threads mostly meet on one socket (a dual EPYC 9175F decodes at 0.83 x one socket's
        # bandwidth, ggml-org/llama.cpp#11744). A measurement is what this process got.
        host_bw /= sockets
    host_bw1 = hw.host_bandwidth_1core_gbps or host_bw / max(1, min(hw.cpu.physical_cores, 4))
    eta = CPU_ETA_MEASURED
    if hw.bandwidth_source != "measured":
        eta *= ACHIEVABLE_FRACTION_OF_SPEC
    return _Machine(ram_budget=ram_budget, gpu=gpu, gpu_backend=backend, gpu_budget=gpu_budget,
                    unified=unified, host_bw_gbps=host_bw, host_bw_1core_gbps=host_bw1,
                    cpu_eta=eta, threads=threads, simd=hw.cpu.simd,
                    ghz=hw.cpu.ghz or DEFAULT_GHZ, cores=hw.cpu.physical_cores,
                    kv_type=prefs.kv_type,
                    gpu_class=gpu_class(gpu, backend) if gpu and backend else None,
                    sockets=sockets)


def memory_budget(hw: HardwareProfile, prefs: PlanPrefs | None = None) -> tuple[int, int, bool]:
    """What loaded models may take together, in bytes: RAM and VRAM after their reserves (as
    one plan budgets them), and whether the two are one pool (unified memory)."""
    m = _machine(hw, prefs or PlanPrefs())
    return m.ram_budget, m.gpu_budget, m.unified


def _estimated_host_bandwidth(hw: HardwareProfile) -> float:
    """No measurement: dual-channel DDR4-3200 (51 GB/s) for a desktop, less for few cores."""
    return min(51.2, 8.0 * max(1, hw.cpu.physical_cores))


# --- memory --------------------------------------------------------------------------------------
def shrinks_window_cache(c: Candidate, *, cpu_only: bool) -> bool:
    """On a CPU-only build without flash attention (``cpu_only``), a model whose window
    layers' attention weighs at least WINDOW_SHARE_MIN is read in CPU_WINDOW_UBATCH rows,
    and its chats keep CHAT_CHECKPOINTS."""
    return cpu_only and c.window_attention_share() >= WINDOW_SHARE_MIN


def physical_batch(n_batch: int, c: Candidate, *, cpu_only: bool) -> int:
    """llama.cpp's n_ubatch for a context of ``n_batch``: N_UBATCH or CPU_WINDOW_UBATCH
    (``shrinks_window_cache``), at most n_batch."""
    small = shrinks_window_cache(c, cpu_only=cpu_only)
    return min(n_batch, CPU_WINDOW_UBATCH if small else N_UBATCH)


def kv_cells(layer: LayerShape, n_ctx: int, n_slots: int, n_ubatch: int = N_UBATCH) -> int:
    """KV cells llama.cpp allocates for one layer: n_ctx per slot, or for a sliding-window
    layer min(n_ctx, window + n_ubatch) rounded up to 256."""
    if layer.sliding_window is None:
        return n_ctx * n_slots
    swa = -(-(layer.sliding_window + n_ubatch) // 256) * 256
    return min(n_ctx, swa) * n_slots


def layer_kv_bytes(layer: LayerShape, n_ctx: int, n_slots: int, kv_type: str,
                   n_ubatch: int = N_UBATCH) -> int:
    return int(kv_cells(layer, n_ctx, n_slots, n_ubatch) * layer.kv_elements_per_token
               * kv_bytes_per_element(kv_type))


def memory(c: Candidate, machine: _Machine, n_gpu_layers: int, n_ctx: int, n_slots: int
           ) -> tuple[DeviceUse, DeviceUse | None]:
    """Bytes on the host and on the GPU for a placement."""
    n = c.n_layers
    k = max(0, min(n_gpu_layers, n + 1))
    first_gpu = n - min(k, n)
    output_on_gpu = k > n
    # CPU-only, flash attention is off unless a q8_0 cache needs it (runtime.llama).
    small = shrinks_window_cache(c, cpu_only=k == 0 and machine.kv_type == "f16")
    ubatch = CPU_WINDOW_UBATCH if small else N_UBATCH
    gpu_weights = sum(layer.weight_bytes for layer in c.layers[first_gpu:])
    gpu_kv = sum(layer_kv_bytes(layer, n_ctx, n_slots, machine.kv_type)
                 for layer in c.layers[first_gpu:])
    host_weights = (sum(layer.weight_bytes for layer in c.layers[:first_gpu])
                    + c.embedding_bytes + c.other_bytes)
    host_kv = sum(layer_kv_bytes(layer, n_ctx, n_slots, machine.kv_type, ubatch)
                  for layer in c.layers[:first_gpu])
    if small:  # and the checkpoints that make up for it: each the window's cells
        host_kv += CHAT_CHECKPOINTS * n_slots * sum(
            int(min(n_ctx, layer.sliding_window) * layer.kv_elements_per_token
                * kv_bytes_per_element(machine.kv_type))
            for layer in c.layers if layer.sliding_window is not None)
    logits = 4 * ubatch * c.n_vocab
    activations = 4 * ubatch * 3 * c.n_embd
    if output_on_gpu:
        gpu_weights += c.output_bytes
    else:
        # A tied head is the embedding table already counted; a separate head is extra.
        host_weights += c.output_bytes - (c.embedding_bytes if c.tied_embeddings else 0)
    # CPU-only, attention runs without flash attention (runtime.llama.flash_attn_type): the
    # scores of one ubatch against the whole context are a buffer of their own, which llama.cpp
    # reuses for the logits later in the graph, so the larger of the two counts.
    scores = 4 * ubatch * n_ctx * c.n_head if k == 0 else 0
    host_logits = max(0 if output_on_gpu else logits, scores)
    host_compute = activations + host_logits + 4 * c.n_vocab * n_slots
    host = DeviceUse("RAM", "CPU", host_weights, host_kv, host_compute, HOST_OVERHEAD,
                     machine.ram_budget)
    if machine.gpu is None or k == 0:
        return host, None
    overhead = GPU_OVERHEAD.get(machine.gpu_backend or "", 256 * MIB)
    gpu_compute = activations + (logits if output_on_gpu else 0)
    gpu_budget = machine.gpu_budget
    if machine.unified:
        # One pool: what the host part takes is not available to the GPU part.
        gpu_budget = min(gpu_budget, max(0, machine.ram_budget - host.total_bytes))
    gpu = DeviceUse(machine.gpu.name, machine.gpu_backend or "", gpu_weights, gpu_kv,
                    gpu_compute, overhead, gpu_budget)
    return host, gpu


def _fits(host: DeviceUse, gpu: DeviceUse | None) -> bool:
    return host.fits and (gpu is None or gpu.fits)


def _best_split(c: Candidate, machine: _Machine, n_ctx: int, n_slots: int
                ) -> tuple[int, DeviceUse, DeviceUse | None]:
    """The most GPU layers that fit the GPU (output layer last); may not fit the host."""
    if machine.gpu is None:
        host, gpu = memory(c, machine, 0, n_ctx, n_slots)
        return 0, host, gpu
    best = 0
    for k in range(c.n_layers + 1, 0, -1):  # GPU use grows with k: take the first that fits
        host, gpu = memory(c, machine, k, n_ctx, n_slots)
        if gpu is None or gpu.fits:
            best = k
            break
    host, gpu = memory(c, machine, best, n_ctx, n_slots)
    return best, host, gpu


# --- bytes read per token, and the roofline ------------------------------------------------------
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


def decode_reads(c: Candidate, n_gpu_layers: int, kv_type: str) -> DecodeReads:
    """The bytes per token of ``c`` with its last ``n_gpu_layers`` on the GPU (llama.cpp
    offloads the last layers first; n_layers + 1 adds the output head)."""
    n = c.n_layers
    k = max(0, min(n_gpu_layers, n + 1))
    first_gpu = n - min(k, n)
    per_element = kv_bytes_per_element(kv_type)

    def kv(layers: Sequence[LayerShape]) -> tuple[tuple[float, int | None], ...]:
        return tuple((layer.kv_elements_per_token * per_element, layer.sliding_window)
                     for layer in layers)

    cpu_layers, gpu_layers = c.layers[:first_gpu], c.layers[first_gpu:]
    cpu_bytes = float(sum(layer.read_bytes for layer in cpu_layers))
    gpu_bytes = float(sum(layer.read_bytes for layer in gpu_layers))
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
    return _predict(c, _machine(hw, prefs), n_gpu_layers, position)


def _predict(c: Candidate, m: _Machine, n_gpu_layers: int, position: int) -> Prediction:
    n = c.n_layers
    k = max(0, min(n_gpu_layers, n + 1)) if m.gpu is not None else 0
    first_gpu = n - min(k, n)
    output_on_gpu = k > n
    q = quant_factor(c.quant)
    n_gpu, n_cpu = n - first_gpu, first_gpu
    cpu_bytes, gpu_bytes = decode_reads(c, k, m.kv_type).bytes_at(position)
    ms: dict[str, float] = {"gpu": 0.0, "cpu": 0.0, "fixed": TOKEN_MS}
    if n_gpu or output_on_gpu:
        assert m.gpu is not None and m.gpu_class is not None
        ms["gpu"] = gpu_bytes / (m.gpu_class.eta * q * m.gpu.bandwidth_gbps * 1e9) * 1e3
        ms["fixed"] += n_gpu * m.gpu_class.layer_ms
    if n_cpu or not output_on_gpu:
        threads = max(1, m.threads)
        bandwidth = min(m.host_bw_gbps, threads * m.host_bw_1core_gbps) * m.cpu_eta * q
        dot = threads * m.ghz * CPU_DOT_GBPS_PER_GHZ.get(m.simd, 1.0) * q
        ms["cpu"] = cpu_bytes / (min(bandwidth, dot) * 1e9) * 1e3
        ms["fixed"] += n_cpu * CPU_LAYER_MS
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
        rate = matrix_tflops(m.gpu) * 1e12 * m.gpu_class.matrix_eta
        prefill_s += flops * share_gpu / rate
    return Prediction(decode_tps=1000.0 / total_ms, decode_ms=ms,
                      prefill_tps=1.0 / prefill_s if prefill_s > 0 else 0.0, key=key)


# --- RPC workers: one model split across machines ---------------------------------------------
LAN_RTT_MS = 0.5
"""A worker's round trip when its profile gives none: a wired LAN through a switch (0.2-0.5 ms);
the upper end, so that an unmeasured link is never counted faster than it may be."""
LAN_LINK_GBPS = 0.117
"""A link's throughput when its profile gives none: gigabit Ethernet's payload (~117 MB/s),
the slowest wired link."""
UNKNOWN_REMOTE_GPU_GBPS = 100.0
"""A worker's GPU of unknown bandwidth (a stock ``rpc-server`` does not say): an entry-level
GPU or an iGPU's LPDDR5, below nearly every discrete GPU."""
LOOPBACK_NOTE = "on this machine: it shares this machine's cores and RAM"
MAX_REMOTE_DEVICES = 10
"""Splits are searched over every subset of the workers' devices: 2^10 subsets at most."""
RPC_BACKENDS = {"CUDA": "nvidia", "ROCm": "amd", "Metal": "apple", "SYCL": "intel",
                "Vulkan": "other", "OpenCL": "other", "MUSA": "other", "CANN": "other"}
"""A worker's GPU device name ("CUDA0", "Vulkan1"; Metal's "MTL0") without its number -> the
vendor whose GPU class (GPU_CLASSES, GPU_GENERATIONS) predicts its speed."""


@dataclass(frozen=True)
class _Device:
    """A device that can hold layers, as the split search sees it."""

    endpoint: str
    """"" = this machine; else the worker's "host:port"."""
    name: str
    kind: str
    """"cpu" or "gpu"."""
    backend: str
    budget_bytes: int
    """What it may take after its reserve."""
    pool: str
    """Devices that draw on one memory (a unified-memory GPU and its host's RAM; a worker on
    loopback and this machine) share a pool, whose budget caps them together."""
    read_gbps: float
    """The rate its layers' weights and KV are read at while decoding: eta x q x bandwidth
    (on a CPU, the lower of that and its cores' dequantisation throughput)."""
    layer_ms: float
    overhead_bytes: int
    flops: float
    """Prefill FLOP/s."""
    bandwidth_gbps: float
    """The bandwidth figure used (given, or assumed: see ``note``)."""
    note: str = ""
    """What was assumed about it, in words for the plan."""

    @property
    def remote(self) -> bool:
        return bool(self.endpoint)


@dataclass(frozen=True)
class SplitDevice:
    """One device of a split: where it is, which layers it holds, its memory and its share of
    a decoded token's time."""

    endpoint: str
    """"" = this machine; else the worker's "host:port"."""
    device: str
    """"CPU", the local GPU's name, or the worker's device name ("CUDA0")."""
    kind: str
    first_layer: int
    n_layers: int
    """Repeating layers ``first_layer .. first_layer + n_layers - 1``."""
    holds_output: bool
    """The output head (llama.cpp puts it on the last device that takes layers)."""
    memory: DeviceUse
    bandwidth_gbps: float
    decode_ms: float
    """Reading its weights and KV, plus its per-layer costs, for one token."""
    note: str = ""

    @property
    def remote(self) -> bool:
        return bool(self.endpoint)

    @property
    def label(self) -> str:
        return f"{self.endpoint} {self.device}" if self.endpoint else \
            f"this machine's {self.device}"

    @property
    def gpu_layers(self) -> int:
        """Its count in llama.cpp's n_gpu_layers and tensor_split: the output head counts as
        one layer."""
        return self.n_layers + (1 if self.holds_output else 0)


@dataclass(frozen=True)
class WorkerSplit:
    """A model's layers across this machine and RPC workers, as llama.cpp will place them, and
    the decode rate predicted for it. Load it with ``n_gpu_layers`` and ``tensor_split()``."""

    model: str
    fits: bool
    reason: str
    """Why it does not fit (what is missing), else ""."""
    n_ctx: int
    n_slots: int
    devices: tuple[SplitDevice, ...]
    """In llama.cpp's order: this machine's CPU (the first layers and the token embedding),
    then every worker's devices in registration order (``hw.workers``, each worker's devices
    as listed), then this machine's GPU when one is usable."""
    decode_tps: float
    """Predicted at the plan's decode position (this machine's devices, a loopback worker's
    included, scaled by its calibration when ``prefs.calibration`` has one)."""
    decode_tps_full: float
    """Predicted with the context full."""
    prefill_tps: float
    decode_ms: Mapping[str, float]
    """A token's time: "local" (this machine's devices), "remote" (the workers' devices),
    "network" (round trips and bytes over the links), "fixed" (launch, logits, sampling)."""
    round_trips: int
    """Network round trips per decoded token: one per worker device that holds layers (the
    host reads its output back, or has its server copy it to the next device)."""
    network_bytes: int
    """Bytes per decoded token over the links, both ways."""
    notes: tuple[str, ...] = ()
    """What was assumed (unknown bandwidth, round trip or link) and which devices got nothing."""

    @property
    def remote_devices(self) -> tuple[SplitDevice, ...]:
        return tuple(d for d in self.devices if d.remote)

    @property
    def remote_layers(self) -> tuple[int, ...]:
        """Repeating layers on each worker device, in registration order."""
        return tuple(d.n_layers for d in self.remote_devices)

    @property
    def local_cpu_layers(self) -> int:
        return self.devices[0].n_layers

    @property
    def local_gpu_layers(self) -> int:
        return sum(d.n_layers for d in self.devices[1:] if not d.remote)

    @property
    def uses_workers(self) -> bool:
        return any(d.gpu_layers for d in self.remote_devices)

    @property
    def n_gpu_layers(self) -> int:
        """llama.cpp's ``n_gpu_layers``: every layer not on this machine's CPU, the output head
        counting as one."""
        return sum(d.gpu_layers for d in self.devices[1:])

    @property
    def n_remote_layers(self) -> int:
        """The layers on workers, the output head counting as one when a worker holds it:
        llama.cpp's ``n_gpu_layers`` when only workers' devices offload."""
        return sum(d.gpu_layers for d in self.remote_devices)

    @property
    def network_ms(self) -> float:
        return self.decode_ms.get("network", 0.0)

    def placement_text(self) -> str:
        """The layers per device in words: "layers 1 on this machine's CPU, 63 + output on
        192.168.1.20:50052 CUDA0"."""
        parts = [f"{d.n_layers}{' + output' if d.holds_output else ''} on {d.label}"
                 for d in self.devices if d.n_layers or d.holds_output]
        return "layers " + ", ".join(parts)

    def tensor_split(self) -> tuple[float, ...]:
        """llama.cpp's ``tensor_split``: one weight per offload device in its order (the
        workers' devices in registration order, then this machine's GPU when the split uses
        it), as whole layer counts (the output head counting on its device). llama.cpp turns
        the weights into cumulative float split points and gives layer i of the n_gpu_layers
        offloaded to the first device whose point exceeds i / n_gpu_layers; whole counts make
        those points land exactly on layer boundaries, where normalised shares could round a
        layer onto the neighbour."""
        weights = [float(d.gpu_layers) for d in self.devices[1:]]
        while weights and not weights[-1]:
            weights.pop()  # a trailing 0 is llama.cpp's default for the devices not listed
        return tuple(weights)

    def to_dict(self) -> dict:
        return {
            "fits": self.fits, "reason": self.reason, "n_ctx": self.n_ctx,
            "n_slots": self.n_slots, "n_gpu_layers": self.n_gpu_layers,
            "n_remote_layers": self.n_remote_layers, "tensor_split": list(self.tensor_split()),
            "devices": [{"endpoint": d.endpoint or None, "device": d.device, "kind": d.kind,
                         "first_layer": d.first_layer, "n_layers": d.n_layers,
                         "holds_output": d.holds_output,
                         "memory": {**asdict(d.memory), "total_bytes": d.memory.total_bytes},
                         "bandwidth_gbps": d.bandwidth_gbps,
                         "decode_ms": round(d.decode_ms, 3), "note": d.note}
                        for d in self.devices],
            "decode_tps": round(self.decode_tps, 2),
            "decode_tps_full_ctx": round(self.decode_tps_full, 2),
            "prefill_tps": round(self.prefill_tps, 1),
            "decode_ms": {k: round(v, 3) for k, v in self.decode_ms.items()},
            "round_trips": self.round_trips, "network_bytes": self.network_bytes,
            "notes": list(self.notes),
        }


def plan_split(candidate: Candidate, hardware: HardwareProfile,
               prefs: PlanPrefs | None = None, *, n_ctx: int | None = None,
               require_workers: bool = False, layers: Sequence[int] | None = None
               ) -> WorkerSplit:
    """The fastest placement of ``candidate`` over this machine and ``hardware.workers`` that
    fits every device's memory with its reserve, for ``n_ctx`` tokens per slot (None: the
    largest of the plan's contexts that fits) and ``prefs.n_slots`` slots (None = 1).

    Layers go where a token reads them fastest, each worker device counting one network round
    trip and its activations (and, on the last device, the logits) over its link; every subset
    of the workers' devices is tried, so a worker that costs more on the link than it saves is
    left out (``require_workers``: only splits that put layers on a worker). When nothing fits,
    the split returned has ``fits`` False and a ``reason`` in GiB.

    ``layers`` asks for a given split instead (a user's ``--tensor-split``, or a test's): the
    repeating layers per device in llama.cpp's order (``WorkerSplit.devices``), predicted and
    checked against each device's memory as they are."""
    prefs = prefs or PlanPrefs()
    m = _machine(hardware, prefs)
    ladder = [n_ctx] if n_ctx is not None else _ctx_ladder(candidate, prefs)
    if layers is not None:
        return _given_split(candidate, hardware, m, prefs, ladder[0], list(layers))
    best = None
    for ctx in ladder:
        best = _split(candidate, hardware, m, prefs, ctx, prefs.n_slots or 1, require_workers)
        if best.fits:
            break
    assert best is not None
    return best


def _devices(c: Candidate, hw: HardwareProfile, m: _Machine, prefs: PlanPrefs
             ) -> tuple[list[_Device], list[str]]:
    """This machine's CPU, the workers' devices in registration order, this machine's GPU (if
    usable): llama.cpp's device order. And the notes on what was assumed."""
    q = quant_factor(c.quant)
    threads = max(1, m.threads)
    cpu_read = min(min(m.host_bw_gbps, threads * m.host_bw_1core_gbps) * m.cpu_eta,
                   threads * m.ghz * CPU_DOT_GBPS_PER_GHZ.get(m.simd, 1.0)) * q
    cpu_flops = threads * m.ghz * 1e9 * CPU_FLOPS_PER_CYCLE.get(m.simd, 4.0)
    # This machine's calibration (measured/predicted decode) scales its devices' time; the
    # workers' devices have none.
    cpu_ratio = _calibration_ratio(prefs, "CPU")
    cpu_read, cpu_layer_ms = cpu_read * cpu_ratio, CPU_LAYER_MS / cpu_ratio
    devices = [_Device("", "CPU", "cpu", "CPU", m.ram_budget, "local/ram", cpu_read,
                       cpu_layer_ms, HOST_OVERHEAD, cpu_flops, m.host_bw_gbps)]
    notes: list[str] = []
    ram_reserve = (prefs.ram_reserve_fraction, prefs.ram_reserve_min_bytes)
    gpu_reserve = (prefs.vram_reserve_fraction, prefs.vram_reserve_min_bytes)
    for worker in hw.workers:
        if not worker.rtt_ms:
            notes.append(f"{worker.endpoint}: round trip not measured, {LAN_RTT_MS:g} ms"
                         " assumed (a wired LAN)")
        if not worker.link_gbps:
            notes.append(f"{worker.endpoint}: link throughput not measured,"
                         f" {LAN_LINK_GBPS:g} GB/s assumed (gigabit Ethernet)")
        for dev in worker.devices:
            fraction, minimum = gpu_reserve if dev.kind == "gpu" else ram_reserve
            total = int(dev.memory_total_gib * GIB)
            budget = max(0, int(dev.memory_free_gib * GIB) - max(minimum, int(fraction * total)))
            note = ""
            if dev.kind == "cpu":
                if worker.is_loopback:
                    # The same cores and RAM as this process: the same rates, one memory.
                    devices.append(_Device(worker.endpoint, dev.name, "cpu", "CPU",
                                           min(budget, m.ram_budget), "local/ram", cpu_read,
                                           cpu_layer_ms, HOST_OVERHEAD, cpu_flops,
                                           m.host_bw_gbps, LOOPBACK_NOTE))
                    continue
                bandwidth = dev.bandwidth_gbps
                if not bandwidth:
                    bandwidth = m.host_bw_1core_gbps
                    note = (f"bandwidth unknown: this machine's one-core figure,"
                            f" {bandwidth:.1f} GB/s, assumed")
                # Its cores are unknown: the plan assumes they keep up with its memory.
                devices.append(_Device(worker.endpoint, dev.name, "cpu", "CPU", budget,
                                       f"{worker.endpoint}/ram", bandwidth * CPU_ETA_MEASURED * q,
                                       CPU_LAYER_MS, HOST_OVERHEAD, cpu_flops, bandwidth, note))
                continue
            backend = re.sub(r"\d+$", "", dev.name)
            backend = "Metal" if backend == "MTL" else backend
            vendor = RPC_BACKENDS.get(backend, "other")
            bandwidth = dev.bandwidth_gbps
            if not bandwidth:
                bandwidth = UNKNOWN_REMOTE_GPU_GBPS
                note = f"bandwidth unknown: {bandwidth:g} GB/s assumed (an entry-level GPU)"
            unified = vendor == "apple"
            gpu_name = dev.description or dev.name
            cls = _gpu_class(gpu_name, vendor, "integrated" if unified else "discrete", backend)
            devices.append(_Device(
                worker.endpoint, dev.name, "gpu", backend, budget,
                f"{worker.endpoint}/ram" if unified else f"{worker.endpoint}/{dev.name}",
                cls.eta * q * bandwidth, cls.layer_ms, GPU_OVERHEAD.get(backend, 256 * MIB),
                _matrix_tflops(gpu_name, 0.0, bandwidth) * 1e12 * cls.matrix_eta, bandwidth,
                note))
    if len(devices) - 1 > MAX_REMOTE_DEVICES:
        raise InvalidRequest(f"the workers offer {len(devices) - 1} devices; a split is planned"
                             f" over {MAX_REMOTE_DEVICES} at most.")
    if m.gpu is not None and m.gpu_class is not None:
        cls = m.gpu_class
        ratio = _calibration_ratio(prefs, m.gpu_backend or "")
        devices.append(_Device(
            "", m.gpu.name, "gpu", m.gpu_backend or "", m.gpu_budget,
            "local/ram" if m.unified else "local/gpu",
            cls.eta * q * m.gpu.bandwidth_gbps * ratio, cls.layer_ms / ratio,
            GPU_OVERHEAD.get(m.gpu_backend or "", 256 * MIB),
            matrix_tflops(m.gpu) * 1e12 * cls.matrix_eta, m.gpu.bandwidth_gbps))
    return devices, notes


def _split(c: Candidate, hw: HardwareProfile, m: _Machine, prefs: PlanPrefs, n_ctx: int,
           slots: int, require_workers: bool) -> WorkerSplit:
    """The fastest split for this context: every subset of the offload devices (the workers'
    and this machine's GPU) is filled fastest device first; the fastest that fits wins."""
    devices, notes = _devices(c, hw, m, prefs)
    position = min(prefs.decode_position, n_ctx)
    best: tuple[float, list[int], bool] | None = None
    for mask in range(1 << (len(devices) - 1)):
        used = [0] + [i for i in range(1, len(devices)) if mask >> (i - 1) & 1]
        if require_workers and not any(devices[i].remote for i in used):
            continue
        flash = any(devices[i].kind == "gpu" for i in used)
        counts = _fill(c, devices, used, m.kv_type, n_ctx, slots, position, flash)
        if counts is None:
            continue
        ms = sum(_split_ms(c, hw, devices, counts, used[-1], position, m.kv_type).values())
        if best is None or ms < best[0]:
            best = (ms, counts, flash)
    if best is None:
        return _unfit_split(c, hw, m, devices, notes, n_ctx, slots, position)
    _, counts, flash = best
    holder = max(i for i, k in enumerate(counts) if k) if any(counts[1:]) else 0
    return _build_split(c, hw, m, devices, counts, holder, flash, notes, n_ctx, slots, position,
                        fits=True, reason="")


def _given_split(c: Candidate, hw: HardwareProfile, m: _Machine, prefs: PlanPrefs, n_ctx: int,
                 counts: list[int]) -> WorkerSplit:
    devices, notes = _devices(c, hw, m, prefs)
    if len(counts) != len(devices) or sum(counts) != c.n_layers or min(counts) < 0:
        raise InvalidRequest(
            f"a split of {c.name} names the layers of {len(devices)} devices (this machine's"
            f" CPU, the workers' devices, this machine's GPU) adding up to {c.n_layers}; got"
            f" {counts}.")
    slots = prefs.n_slots or 1
    holder = max(i for i, k in enumerate(counts) if k) if any(counts[1:]) else 0
    flash = any(d.kind == "gpu" for d, k in zip(devices, counts, strict=True) if k)
    split = _build_split(c, hw, m, devices, counts, holder, flash, notes, n_ctx, slots,
                         min(prefs.decode_position, n_ctx), fits=True, reason="")
    use: dict[str, int] = {}
    for d, placed in zip(devices, split.devices, strict=True):
        use[d.pool] = use.get(d.pool, 0) + placed.memory.total_bytes
    pools = _pool_budgets(devices, range(len(devices)))
    over = [f"{p.label} needs {p.memory.total_bytes / GIB:.1f} GiB of"
            f" {p.memory.budget_bytes / GIB:.1f}" for p in split.devices if not p.memory.fits]
    over += [f"{'this machine' if pool.startswith('local/') else pool.split('/')[0]}'s memory"
             f" needs {use[pool] / GIB:.1f} GiB of {pools[pool] / GIB:.1f}"
             for pool in use if use[pool] > pools[pool] and len(
                 [d for d in devices if d.pool == pool]) > 1]
    return replace(split, fits=not over, reason="; ".join(over))


def _fixed_use(c: Candidate, d: _Device, host: bool, holds_output: bool, n_ctx: int,
               slots: int, flash: bool) -> tuple[int, int, int]:
    """(weights, compute, overhead) bytes a device takes besides its layers and their KV: the
    token embedding on this machine's CPU, the output head on the last device, the compute
    buffer (activations of one ubatch; the logits on the output's device; without flash
    attention, a CPU's attention scores), the runtime overhead."""
    weights = c.embedding_bytes + c.other_bytes if host else 0
    logits = 4 * N_UBATCH * c.n_vocab if holds_output else 0
    if holds_output:
        shared = c.embedding_bytes if host and c.tied_embeddings else 0
        weights += c.output_bytes - shared
    scores = 4 * N_UBATCH * n_ctx * c.n_head if d.kind == "cpu" and not flash else 0
    compute = 4 * N_UBATCH * 3 * c.n_embd + max(logits, scores)
    if host:
        compute += 4 * c.n_vocab * slots  # the logits the host reads back
    return weights, compute, d.overhead_bytes


def _layer_ms(layer: LayerShape, d: _Device, position: int, per_element: float) -> float:
    kv = layer.kv_elements_per_token * per_element * (
        position if layer.sliding_window is None else min(position, layer.sliding_window))
    return (layer.read_bytes + kv) / (d.read_gbps * 1e9) * 1e3 + d.layer_ms


def _pool_budgets(devices: Sequence[_Device], used: Sequence[int]) -> dict[str, int]:
    """A pool's budget: the largest of its devices' (each of which is also capped alone)."""
    budgets: dict[str, int] = {}
    for i in used:
        d = devices[i]
        budgets[d.pool] = max(budgets.get(d.pool, 0), d.budget_bytes)
    return budgets


def _fill(c: Candidate, devices: Sequence[_Device], used: Sequence[int], kv_type: str,
          n_ctx: int, slots: int, position: int, flash: bool) -> list[int] | None:
    """Layers per device (index as ``devices``) with the devices ``used`` (this machine's CPU
    first, the last holding the output head): one on each used offload device, then the
    fastest device per layer takes as many as its memory (and its pool's) allows, then the
    next. None when the layers do not all fit or a used offload device has no room for one."""
    holder = used[-1]
    left_pool = _pool_budgets(devices, used)
    left: dict[int, int] = {}
    for i in used:
        fixed = sum(_fixed_use(c, devices[i], i == 0, i == holder, n_ctx, slots, flash))
        left[i] = devices[i].budget_bytes - fixed
        left_pool[devices[i].pool] -= fixed
    if min(left.values()) < 0 or min(left_pool.values()) < 0:
        return None
    # Layers differ (a sliding-window layer keeps less KV): count each as the largest, so the
    # counts fit whichever layers llama.cpp's order gives a device.
    footprint = max((layer.weight_bytes + layer_kv_bytes(layer, n_ctx, slots, kv_type)
                     for layer in c.layers), default=1) or 1
    per_element = kv_bytes_per_element(kv_type)
    speed = {i: sum(_layer_ms(layer, devices[i], position, per_element) for layer in c.layers)
             for i in used}
    counts = [0] * len(devices)
    remaining = c.n_layers
    # A used offload device takes at least one layer (else this subset is a smaller one),
    # then the fastest take as many as fit.
    for pass_cap in (1, c.n_layers):
        for i in sorted(used, key=lambda i: (speed[i], devices[i].remote, i)):
            if pass_cap == 1 and i == 0:
                continue
            pool = devices[i].pool
            room = max(0, min(left[i], left_pool[pool]) // footprint)
            take = min(remaining, room, pass_cap)
            counts[i] += take
            left[i] -= take * footprint
            left_pool[pool] -= take * footprint
            remaining -= take
    if remaining or not all(counts[i] for i in used[1:]):
        return None
    return counts


def _ranges(counts: Sequence[int]) -> list[tuple[int, int]]:
    """(first layer, count) per device: llama.cpp gives the offload devices consecutive
    ranges in device order, after this machine's CPU's."""
    out, first = [], 0
    for k in counts:
        out.append((first, k))
        first += k
    return out


def _link(hw: HardwareProfile, endpoint: str) -> tuple[float, float]:
    """(round trip ms, throughput GB/s) to a worker, LAN figures where unmeasured."""
    worker = next(w for w in hw.workers if w.endpoint == endpoint)
    return worker.rtt_ms or LAN_RTT_MS, worker.link_gbps or LAN_LINK_GBPS


def _mask_bytes(c: Candidate, position: int) -> int:
    """The attention masks the host sends each worker device per token: n_kv cells (padded to
    256) x 4 bytes, one mask per kind of layer (full and sliding-window)."""
    kinds = len({layer.sliding_window is None for layer in c.layers})
    return 4 * 256 * -(-(position + 1) // 256) * kinds


def _network(c: Candidate, hw: HardwareProfile, devices: Sequence[_Device],
             counts: Sequence[int], holder: int, position: int) -> tuple[float, int, int]:
    """(ms, bytes, round trips) a decoded token spends on the links. Per worker device that
    holds layers (ggml-rpc: the host sends its input and the graph_compute command without
    waiting, then waits once for the device's output: a GET_TENSOR, or a COPY_TENSOR to the
    next device when that is on the same server): one round trip, the activations in
    (n_embd x 4 bytes, unless they come from a device of the same server) with the masks, and
    out the activations for the next machine or, from the last device, the logits
    (n_vocab x 4 bytes)."""
    active = [i for i, k in enumerate(counts) if k or i == holder]
    ms, total, trips = 0.0, 0, 0
    act = 4 * c.n_embd
    for pos, i in enumerate(active):
        d = devices[i]
        if not d.remote:
            continue
        prev = devices[active[pos - 1]] if pos else None
        nxt = devices[active[pos + 1]] if pos + 1 < len(active) else None
        into = (0 if prev is not None and prev.endpoint == d.endpoint else act) \
            + _mask_bytes(c, position)
        out = 4 * c.n_vocab if i == holder else (
            0 if nxt is not None and nxt.endpoint == d.endpoint else act)
        rtt, gbps = _link(hw, d.endpoint)
        ms += rtt + (into + out) / (gbps * 1e9) * 1e3
        total += into + out
        trips += 1
    return ms, total, trips


def _device_ms(c: Candidate, d: _Device, first: int, k: int, holds_output: bool,
               position: int, kv_type: str) -> float:
    per_element = kv_bytes_per_element(kv_type)
    ms = sum(_layer_ms(layer, d, position, per_element) for layer in c.layers[first:first + k])
    if holds_output:
        ms += c.output_bytes / (d.read_gbps * 1e9) * 1e3
    return ms


def _split_ms(c: Candidate, hw: HardwareProfile, devices: Sequence[_Device],
              counts: Sequence[int], holder: int, position: int, kv_type: str
              ) -> dict[str, float]:
    """A decoded token's time: per device, its layers' bytes over its read rate and its
    per-layer costs; the links; launch, logits and sampling."""
    ms = {"local": 0.0, "remote": 0.0, "network": 0.0, "fixed": TOKEN_MS}
    for i, (first, k) in enumerate(_ranges(counts)):
        d = devices[i]
        ms["remote" if d.remote else "local"] += _device_ms(c, d, first, k, i == holder,
                                                             position, kv_type)
    ms["network"] = _network(c, hw, devices, counts, holder, position)[0]
    ms["fixed"] += c.n_vocab * SAMPLING_NS_PER_VOCAB[devices[holder].kind] / 1e6
    return ms


def _prefill_tps(c: Candidate, hw: HardwareProfile, devices: Sequence[_Device],
                 counts: Sequence[int]) -> float:
    """Prompt tokens per second: each device's share of the FLOPs at its rate, plus per worker
    device the activations each way over its link and a round trip per ubatch."""
    seconds = 0.0
    for d, k in zip(devices, counts, strict=True):
        if not k:
            continue
        seconds += c.prefill_flops_per_token * k / max(1, c.n_layers) / d.flops
        if d.remote:
            rtt, gbps = _link(hw, d.endpoint)
            seconds += 2 * 4 * c.n_embd / (gbps * 1e9) + rtt / 1e3 / N_UBATCH
    return 1.0 / seconds if seconds > 0 else 0.0


def _build_split(c: Candidate, hw: HardwareProfile, m: _Machine, devices: Sequence[_Device],
                 counts: Sequence[int], holder: int, flash: bool, notes: Sequence[str],
                 n_ctx: int, slots: int, position: int, *, fits: bool, reason: str
                 ) -> WorkerSplit:
    out = []
    for i, (first, k) in enumerate(_ranges(counts)):
        d = devices[i]
        weights, compute, overhead = _fixed_use(c, d, i == 0, i == holder, n_ctx, slots, flash)
        layers = c.layers[first:first + k]
        use = DeviceUse(f"{d.endpoint} {d.name}" if d.remote else "RAM" if i == 0 else d.name,
                        d.backend,
                        weights + sum(layer.weight_bytes for layer in layers),
                        sum(layer_kv_bytes(layer, n_ctx, slots, m.kv_type) for layer in layers),
                        compute if k or i in (0, holder) else 0,
                        overhead if k or i in (0, holder) else 0, d.budget_bytes)
        out.append(SplitDevice(d.endpoint, d.name, d.kind, first, k, i == holder, use,
                               d.bandwidth_gbps,
                               _device_ms(c, d, first, k, i == holder, position, m.kv_type),
                               d.note))
    notes = list(notes)
    for d in devices:
        if d.remote and d.note == LOOPBACK_NOTE:
            notes.append(f"{d.endpoint} {d.name} is {d.note}")
    if fits:
        notes += _idle_notes(c, devices, out, n_ctx, slots, m.kv_type)
    ms = _split_ms(c, hw, devices, counts, holder, position, m.kv_type)
    full = _split_ms(c, hw, devices, counts, holder, n_ctx, m.kv_type)
    _, net_bytes, trips = _network(c, hw, devices, counts, holder, position)
    return WorkerSplit(
        model=c.name, fits=fits, reason=reason, n_ctx=n_ctx, n_slots=slots, devices=tuple(out),
        decode_tps=1000.0 / sum(ms.values()), decode_tps_full=1000.0 / sum(full.values()),
        prefill_tps=_prefill_tps(c, hw, devices, counts), decode_ms=ms, round_trips=trips,
        network_bytes=net_bytes, notes=tuple(notes))


def _idle_notes(c: Candidate, devices: Sequence[_Device], placed: Sequence[SplitDevice],
                n_ctx: int, slots: int, kv_type: str) -> list[str]:
    """Why a worker device holds nothing: too little memory for one layer, or slower."""
    notes: list[str] = []
    layer = max(c.layers, key=lambda layer: layer.weight_bytes, default=None)
    if layer is None:
        return notes
    one = layer.weight_bytes + layer_kv_bytes(layer, n_ctx, slots, kv_type)
    for d, p in zip(devices, placed, strict=True):
        if not d.remote or p.gpu_layers:
            continue
        need = one + d.overhead_bytes + 4 * N_UBATCH * 3 * c.n_embd
        if d.budget_bytes < need:
            notes.append(f"{d.endpoint} {d.name}: no layers: {d.budget_bytes / GIB:.1f} GiB"
                         f" usable after its reserve, less than one layer with its overhead"
                         f" ({need / GIB:.1f} GiB)")
        else:
            notes.append(f"{d.endpoint} {d.name}: no layers: decode is faster without it (its"
                         " round trip and link cost more than its memory saves)")
    return notes


def _unfit_split(c: Candidate, hw: HardwareProfile, m: _Machine, devices: Sequence[_Device],
                 notes: Sequence[str], n_ctx: int, slots: int, position: int) -> WorkerSplit:
    """No subset fits: every layer on this machine's CPU, and what is missing in GiB."""
    flash = any(d.kind == "gpu" for d in devices)
    counts = [c.n_layers] + [0] * (len(devices) - 1)
    used = range(len(devices))
    pools = _pool_budgets(devices, used)
    need = (c.weight_bytes + sum(layer_kv_bytes(layer, n_ctx, slots, m.kv_type)
                                 for layer in c.layers)
            + sum(sum(_fixed_use(c, devices[i], False, False, n_ctx, slots, flash)[1:])
                  for i in used) + 4 * c.n_vocab * slots + 4 * N_UBATCH * c.n_vocab)
    parts = " + ".join(f"{'this machine' if pool.startswith('local/') else pool.split('/')[0]}"
                       f" {budget / GIB:.1f}" for pool, budget in pools.items())
    reason = (f"needs {need / GIB:.1f} GiB across this machine and its workers,"
              f" {sum(pools.values()) / GIB:.1f} GiB usable ({parts})")
    return _build_split(c, hw, m, devices, counts, 0, flash, notes, n_ctx, slots, position,
                        fits=False, reason=reason)


# --- planning ------------------------------------------------------------------------------------
def plan(hardware: HardwareProfile, candidates: Sequence[Candidate],
         prefs: PlanPrefs | None = None) -> Plan:
    """Place and predict every candidate, and choose one. Raises InvalidRequest for a
    context no candidate can take."""
    prefs = prefs or PlanPrefs()
    if not candidates:
        raise InvalidRequest("there is nothing to plan: no candidate models.")
    _check_prefs(prefs, candidates)
    machine = _machine(hardware, prefs)
    evaluations = [_evaluate(c, hardware, machine, prefs) for c in candidates]
    if not hardware.workers:
        return _choose(evaluations, prefs, machine, hardware)
    pooled = [_with_workers(e, hardware, machine, prefs) for e in evaluations]
    return _compare_alone(_choose(pooled, prefs, machine, hardware), evaluations, prefs, machine,
                          hardware)


def _check_prefs(prefs: PlanPrefs, candidates: Sequence[Candidate]) -> None:
    if prefs.n_ctx is not None:
        if prefs.n_ctx <= 0:
            raise InvalidRequest(f"the context must be at least 1 token, got {prefs.n_ctx}.")
        limits = [c.context_length for c in candidates if c.context_length]
        if limits and prefs.n_ctx > max(limits):
            which = candidates[0].model if len({c.model for c in candidates}) == 1 \
                else "any of these models"
            raise InvalidRequest(
                f"a context of {prefs.n_ctx} tokens is beyond what {which} was trained for"
                f" ({max(limits)}); use --ctx {max(limits)} or less.")
    if prefs.min_tps < 0 or not math.isfinite(prefs.min_tps):
        raise InvalidRequest(f"min_tps must be 0 or more, got {prefs.min_tps}.")
    if prefs.n_slots is not None and prefs.n_slots < 1:
        raise InvalidRequest(f"the number of slots must be at least 1, got {prefs.n_slots}.")
    if prefs.n_threads is not None and prefs.n_threads < 1:
        raise InvalidRequest(f"threads must be at least 1, got {prefs.n_threads}.")
    kv_bytes_per_element(prefs.kv_type)  # an unknown cache type fails here, with its name


def _evaluate(c: Candidate, hw: HardwareProfile, m: _Machine, prefs: PlanPrefs) -> Evaluation:
    slots = prefs.n_slots or 1
    note = ""
    ladder = _ctx_ladder(c, prefs)
    if prefs.n_ctx is not None and c.context_length and prefs.n_ctx > c.context_length:
        host, gpu = memory(c, m, 0, c.context_length, slots)
        return _verdict(c, m, prefs, False, 0, prefs.n_ctx, slots, host, gpu, "context",
                        f"trained for {c.context_length} tokens, less than the"
                        f" {prefs.n_ctx} asked")

    chosen = None
    for n_ctx in ladder:
        k, host, gpu = _placement(c, m, prefs, n_ctx, slots)
        if _fits(host, gpu):
            chosen = (n_ctx, k, host, gpu)
            break
    if chosen is None:
        n_ctx = ladder[-1]
        k, host, gpu = _placement(c, m, prefs, n_ctx, slots)
        return _verdict(c, m, prefs, False, k, n_ctx, slots, host, gpu, "too big",
                        _missing(c, m, prefs, host, gpu, n_ctx))
    n_ctx, k, host, gpu = chosen
    if n_ctx != ladder[0]:
        note = f"context {n_ctx} (the default {ladder[0]} does not fit)"
    if prefs.n_slots is None:
        # More slots only while they fit without moving layers off the GPU.
        for more in range(MAX_AUTO_SLOTS, 1, -1):
            k2, host2, gpu2 = _placement(c, m, prefs, n_ctx, more)
            if k2 >= k and _fits(host2, gpu2):
                slots, k, host, gpu = more, k2, host2, gpu2
                break
    return _verdict(c, m, prefs, True, k, n_ctx, slots, host, gpu, "fits", note)


def _ctx_ladder(c: Candidate, prefs: PlanPrefs) -> list[int]:
    """The contexts to try, largest first: the one asked for, else the default (capped at the
    trained context) halved down to MIN_AUTO_CTX."""
    if prefs.n_ctx is not None:
        return [prefs.n_ctx]
    top = min(DEFAULT_CTX, c.context_length or DEFAULT_CTX)
    ladder = [top]
    while ladder[-1] // 2 >= min(MIN_AUTO_CTX, top):
        ladder.append(ladder[-1] // 2)
    return ladder


def _placement(c: Candidate, m: _Machine, prefs: PlanPrefs, n_ctx: int, slots: int
               ) -> tuple[int, DeviceUse, DeviceUse | None]:
    if prefs.n_gpu_layers is not None and m.gpu is not None:
        k = c.n_layers + 1 if prefs.n_gpu_layers < 0 else min(prefs.n_gpu_layers,
                                                               c.n_layers + 1)
        host, gpu = memory(c, m, k, n_ctx, slots)
        return k, host, gpu
    return _best_split(c, m, n_ctx, slots)


def _verdict(c: Candidate, m: _Machine, prefs: PlanPrefs, fits: bool, k: int, n_ctx: int,
             slots: int, host: DeviceUse, gpu: DeviceUse | None, verdict: str, reason: str
             ) -> Evaluation:
    k = k if m.gpu is not None else 0
    short = _predict(c, m, k, min(prefs.decode_position, n_ctx))
    full = _predict(c, m, k, n_ctx)
    ratio = _calibration_ratio(prefs, short.key)
    decode = short.decode_tps * ratio
    note = reason if fits else ""
    if c.embedding_only:  # it generates nothing: no decode speed to predict or to miss
        return Evaluation(
            candidate=c, fits=fits, n_gpu_layers=k, n_ctx=n_ctx, n_slots=slots,
            n_threads=m.threads, host=host, gpu=gpu, decode_tps=0.0, decode_tps_full=0.0,
            prefill_tps=short.prefill_tps, decode_ms={}, calibration=1.0, verdict=verdict,
            reason=reason, gpu_backend=m.gpu_backend if k else None, ctx_note=note)
    if fits and decode < prefs.min_tps:
        verdict = "slow"
        reason = (f"{decode:.1f} tok/s predicted, below the {prefs.min_tps:g} tok/s target"
                  + (f"; {reason}" if reason else ""))
    return Evaluation(
        candidate=c, fits=fits, n_gpu_layers=k, n_ctx=n_ctx, n_slots=slots,
        n_threads=m.threads, host=host, gpu=gpu, decode_tps=decode,
        decode_tps_full=full.decode_tps * ratio, prefill_tps=short.prefill_tps,
        decode_ms=short.decode_ms, calibration=ratio, verdict=verdict, reason=reason,
        gpu_backend=m.gpu_backend if k else None, ctx_note=note,
    )


def _with_workers(e: Evaluation, hw: HardwareProfile, m: _Machine, prefs: PlanPrefs
                  ) -> Evaluation:
    """The candidate pooled across this machine and the workers when that fits and decodes
    faster than this machine alone (or when only pooling fits); else ``e``, this machine's."""
    c = e.candidate
    if c.embedding_only:
        return e
    split = None
    for n_ctx in _ctx_ladder(c, prefs):
        split = _split(c, hw, m, prefs, n_ctx, prefs.n_slots or 1, require_workers=True)
        if split.fits:
            break
    assert split is not None
    if not split.fits:
        return e if e.fits else replace(e, reason=f"{e.reason}; with the workers too:"
                                                  f" {split.reason}")
    if e.fits and e.decode_tps >= split.decode_tps:
        return e
    workers = ", ".join(dict.fromkeys(d.endpoint for d in split.remote_devices if d.gpu_layers))
    note = f"pooled with {workers}"
    ladder = _ctx_ladder(c, prefs)
    if split.n_ctx != ladder[0]:
        note += f"; context {split.n_ctx} (the default {ladder[0]} does not fit)"
    gpu = next((d for d in split.devices[1:] if not d.remote and d.gpu_layers), None)
    verdict, reason = "fits", note
    if split.decode_tps < prefs.min_tps:
        verdict = "slow"
        reason = (f"{split.decode_tps:.1f} tok/s predicted, below the {prefs.min_tps:g} tok/s"
                  f" target; {note}")
    return Evaluation(
        candidate=c, fits=True, n_gpu_layers=split.n_gpu_layers, n_ctx=split.n_ctx,
        n_slots=split.n_slots, n_threads=m.threads, host=split.devices[0].memory,
        gpu=gpu.memory if gpu else None, decode_tps=split.decode_tps,
        decode_tps_full=split.decode_tps_full, prefill_tps=split.prefill_tps,
        decode_ms=split.decode_ms,
        calibration=_calibration_ratio(prefs, (m.gpu_backend or "") if gpu else "CPU"),
        verdict=verdict, reason=reason, gpu_backend=m.gpu_backend if gpu else None,
        ctx_note=note, split=split)


def _compare_alone(result: Plan, alone: list[Evaluation], prefs: PlanPrefs, m: _Machine,
                   hw: HardwareProfile) -> Plan:
    """Say how pooling compares with this machine alone: the pooled choice's rate against
    what this machine would choose alone, or, when this machine's own choice stands, what
    pooling would have run and how much slower."""
    choice = result.choice
    if choice is None:
        return result
    own = _choose(alone, prefs, m, hw).choice
    if choice.split is not None:
        workers = ", ".join(dict.fromkeys(d.endpoint for d in choice.split.remote_devices
                                          if d.gpu_layers))
        text = (f" Pooling with {workers} decodes at ~{choice.decode_tps:.1f} tok/s"
                f" (network {choice.split.network_ms:.1f} ms of"
                f" {1000 / choice.decode_tps:.1f} ms per token)")
        if own is None:
            text += "; nothing fits this machine alone."
        elif own.decode_tps > choice.decode_tps:
            text += (f"; {own.candidate.name} alone on this machine at {own.decode_tps:.1f}"
                     " tok/s.")
        else:
            text += (f", faster than {own.candidate.name} alone on this machine"
                     f" ({own.decode_tps:.1f} tok/s).")
        return replace(result, summary=result.summary + text)
    pooled = [e for e in result.evaluations if e.split is not None and e.fits
              and e.candidate.quality_score > choice.candidate.quality_score]
    if pooled:
        best = max(pooled, key=lambda e: (e.candidate.quality_score, e.decode_tps))
        workers = ", ".join(dict.fromkeys(d.endpoint for d in best.split.remote_devices
                                          if d.gpu_layers)) if best.split else ""
        text = (f" Pooling with {workers} would run {best.candidate.name} at"
                f" ~{best.decode_tps:.1f} tok/s: slower than {choice.candidate.name} alone on"
                f" this machine ({choice.decode_tps:.1f} tok/s).")
        return replace(result, summary=result.summary + text)
    if choice.candidate.embedding_only:
        return result
    split = _split(choice.candidate, hw, m, prefs, choice.n_ctx, choice.n_slots,
                   require_workers=True)
    if not split.fits:
        return result
    workers = ", ".join(dict.fromkeys(d.endpoint for d in split.remote_devices if d.gpu_layers))
    return replace(result, summary=result.summary + (
        f" The workers are left out: pooled with {workers} it would decode at"
        f" ~{split.decode_tps:.1f} tok/s (network {split.network_ms:.1f} ms per token)."))


def _calibration_ratio(prefs: PlanPrefs, key: str) -> float:
    """This machine's measured/predicted decode ratio for a backend (1.0 when none)."""
    ratio = float(prefs.calibration.get(key, 1.0)) if prefs.calibration else 1.0
    if not (0.05 <= ratio <= 20.0) or not math.isfinite(ratio):
        ratio = 1.0  # a corrupt calibration must not produce absurd numbers
    return ratio


def _missing(c: Candidate, m: _Machine, prefs: PlanPrefs, host: DeviceUse,
             gpu: DeviceUse | None, n_ctx: int) -> str:
    """What is missing, in GiB, and the largest context that would fit when one would."""
    need = host.total_bytes + (gpu.total_bytes if gpu else 0)
    have = host.budget_bytes + (gpu.budget_bytes if gpu and not m.unified else 0)
    text = f"needs {need / GIB:.1f} GiB, {have / GIB:.1f} GiB usable"
    if gpu is not None and not m.unified:
        text += f" ({host.budget_bytes / GIB:.1f} RAM + {gpu.budget_bytes / GIB:.1f} VRAM)"
    if prefs.n_ctx is not None and prefs.n_ctx > 512:
        ctx = prefs.n_ctx // 2
        while ctx >= 512:
            k, h2, g2 = _placement(c, m, prefs, ctx, prefs.n_slots or 1)
            if _fits(h2, g2):
                return text + f"; fits with --ctx {ctx}"
            ctx //= 2
    return text


def _choose(evaluations: list[Evaluation], prefs: PlanPrefs, m: _Machine,
            hw: HardwareProfile) -> Plan:
    embedders = [e for e in evaluations if e.candidate.embedding_only]
    if embedders and len(embedders) < len(evaluations):
        # Embedding models are listed, never picked to generate text.
        plan = _choose([e for e in evaluations if not e.candidate.embedding_only], prefs, m, hw)
        return replace(plan, evaluations=plan.evaluations + tuple(
            replace(e, verdict="embedding", reason="an embedding model: it makes no text")
            for e in embedders))
    fitting = [e for e in evaluations if e.fits]
    fast = [e for e in fitting if e.decode_tps >= prefs.min_tps]
    choice: Evaluation | None
    if embedders and fitting:  # only embedding models: the best that fits, at any speed
        choice = max(fitting, key=lambda e: (e.candidate.quality_score, e.prefill_tps))
        summary = (f"{choice.candidate.name}: the best quality that fits (embeds a predicted"
                   f" {choice.prefill_tps:.0f} tokens/s);")
    elif fast:
        choice = max(fast, key=lambda e: (e.candidate.quality_score, e.decode_tps))
        summary = (f"{choice.candidate.name}: the best quality that fits and reaches"
                   f" {prefs.min_tps:g} tok/s (predicted {choice.decode_tps:.1f} tok/s;"
                   f" {choice.candidate.quality_reason});")
    elif fitting:
        choice = max(fitting, key=lambda e: (e.decode_tps, e.candidate.quality_score))
        summary = (f"{choice.candidate.name}: nothing reaches {prefs.min_tps:g} tok/s here;"
                   f" this is the fastest that fits (predicted {choice.decode_tps:.1f} tok/s);")
    else:
        choice = None
        smallest = smallest_file(evaluations)
        summary = f"nothing fits: the smallest, {smallest.candidate.name}, {smallest.reason}."
    if choice is not None:
        where = (choice.split.placement_text() if choice.split else
                 f"{choice.n_gpu_layers}/{choice.n_layers_total} layers on"
                 f" {choice.gpu.device}" if choice.gpu else "all layers on the CPU")
        summary += f" {where}, context {choice.n_ctx}"
        if choice.n_slots > 1:
            summary += f" x {choice.n_slots} slots"
        summary += "."
        if choice.n_gpu_layers and m.gpu is not None and m.gpu_class and m.gpu_class.immature:
            summary += (f" {m.gpu_backend} on {m.gpu.name} is an immature backend:"
                        f" {m.gpu_class.immature}; the prediction allows for it.")
        if m.gpu is None and hw.gpus and prefs.n_gpu_layers != 0:
            names = ", ".join(g.name for g in hw.gpus)
            summary += (f" The llama.cpp build is CPU-only: it cannot use {names}."
                        if not hw.can_offload else
                        f" No backend of this llama.cpp build drives {names}.")
        why = ("best quality that fits" if embedders else
               f"best quality at the target speed: {choice.candidate.quality_reason}" if fast
               else "fastest that fits")
        choice = replace(choice, verdict="chosen",
                         reason=why + (f"; {choice.ctx_note}" if choice.ctx_note else ""))
        evaluations = [choice if e.candidate is choice.candidate else _explain(e, choice)
                       for e in evaluations]
    return Plan(choice=choice, evaluations=tuple(evaluations), summary=summary, prefs=prefs)


def smallest_file(evaluations: Sequence[Evaluation]) -> Evaluation:
    """The evaluation of the smallest file: the one a plan's summary names when nothing fits,
    and what ``selection.best_or_smallest`` falls back to (so `plan` and `pull` agree)."""
    return min(evaluations, key=lambda e: e.candidate.file_bytes)


def _explain(e: Evaluation, choice: Evaluation) -> Evaluation:
    if e.verdict != "fits":
        return e
    if e.candidate.quality_score > choice.candidate.quality_score:
        reason = (f"higher quality ({e.candidate.quality_score:.1f}) but slower"
                  f" ({e.decode_tps:.1f} tok/s)")
    else:
        reason = (f"fits, lower quality ({e.candidate.quality_score:.1f}) than"
                  f" {choice.candidate.name}")
    if e.ctx_note:
        reason += f"; {e.ctx_note}"
    return replace(e, reason=reason)


def candidates_for_specs(specs: Iterable[ModelSpec], installed: Iterable[str] = ()
                         ) -> list[Candidate]:
    """Every variant of every spec, estimated from the catalog."""
    have = set(installed)
    return [Candidate.from_spec(s, v, installed=s.variant_name(v) in have)
            for s in specs for v in s.variants]
