"""The machine as the planner sees it: the constants fitted to published and measured runs
(``GPUClass`` per backend and device class, the CPU's rates, the quants' factors), what the
user asks of a plan (``PlanPrefs``), and one profile read once into budgets and rates
(``Machine``, ``memory_budget``).

The constants are fitted to published llama-bench results (tests/data/published_llama_bench.csv
lists them with their sources; bench/planner_published.py reports the fit) and to this
project's own measurements. They follow the llama.cpp builds users run now: a class's constants
are set on its fit rows of 2025-2026 builds (``bench/planner_published.py --fit``); the rows of
older builds, often slower (an RTX 3090's Q4_0 decode at 121 tok/s in Jan 2024, 158 in 2025),
are kept and reported but not followed."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..hardware.profile import GPUInfo, HardwareProfile

GIB = 2**30
MIB = 2**20


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


ROCM_VECTOR_MATRIX_ETA = 0.40
"""Prefill on HIP with the shader cores' int8 dot products (RDNA1-2, GCN: no matrix cores), as a
share of the FP16 figure (twice the FP32 rate on these generations): fitted on an RX 6700 XT
(ggml-org/llama.cpp#5835)."""
ROCM_RDNA3_MATRIX_ETA = 0.40
"""Prefill of RDNA3-4 discrete GPUs on HIP, a share of the WMMA FP16 figure (fitted on the RX
7900 XTX rows; GPU_GENERATIONS)."""
VULKAN_IGPU_MATRIX_ETA = 0.21
"""Prefill of integrated GPUs on Vulkan, a share of the FP16 figure (issue 38c refit on five rows
of 2025-2026 builds: Radeon 780M x2, Ryzen Z1, Strix Halo x2)."""
VULKAN_RDNA3_MATRIX_ETA = 0.36
"""Prefill of RDNA3-4 discrete GPUs on Vulkan with KHR_coopmat (issue 38b refit on seven rows)."""
ROCM_IGPU_MATRIX_ETA = ROCM_RDNA3_MATRIX_ETA * VULKAN_IGPU_MATRIX_ETA / VULKAN_RDNA3_MATRIX_ETA
"""AMD integrated GPUs on HIP (Strix Halo, 780M/890M): prefill at this share of the FP16 figure
(0.233): the RDNA3 discrete share on HIP times the integrated/discrete ratio the same silicon
family shows on Vulkan, where 12 fit rows set both. The ratio is the iGPU's (its sustained clocks
and power share, its memory system), not the API's, so it carries across backends; it replaces
0.19, set on the class's one fit row of a single-node llama-bench build (38d, ROCm 7 RC +
rocWMMA, Nov 2025), which the derivation predicts at 1.21 of its rate (in +-25%). Issue 38i:
the derivation was written here as a cross-check before batch 38i was collected (the 38h pass
left it out: the held rows then in view had suggested it); on 38i's two ROCm rows of a Feb 2026
ROCm 7.2 build it brings both within 25% (-27% and -34% at 0.19; -11% and -19%). Published rows
of this chip span 0.05-0.37 of the figure with the build, ROCm release and hipBLASLt (issue 38's
checker found earlier builds 1.5-5.7x slower; HSA_OVERRIDE_GFX_VERSION runs slower still): the
interval carries that spread. The other fit rows run llama.cpp through its RPC backend on one
node or AMD's own harness (published_rows.Row.fits leaves both out)."""
GPU_CLASSES: dict[tuple[str, str], GPUClass] = {
    # ggml-org/llama.cpp#15013 (Llama 2 7B Q4_0, RTX 30/40/50): 0.80-0.95 of bandwidth once
    # ~0.8 ms per token of launches is taken out; pp512 at ~0.55 of the FP16 tensor rate.
    # Issue 38: on the fit rows CUDA decode ran a median 4% below 0.86 and prefill 15% below
    # 0.55 (with PREFILL_QUANT): 0.83 and 0.47.
    # Issue 38b refit (14 fit rows, 2024-2025 builds): quantized decode at a median 0.93 of
    # 0.83, F16 at the same once FLOAT_DECODE_GAIN is applied; prefill at 1.00.
    ("CUDA", "discrete"): GPUClass(eta=0.77, layer_ms=0.014, matrix_eta=0.47),
    # DGX Spark (0.8, ggml-org/llama.cpp#15013): LPDDR5X shared with the CPU. (The Jetson AGX
    # Orin row it was also fitted on had no retrieved source and was removed.)
    ("CUDA", "integrated"): GPUClass(eta=0.75, layer_ms=0.03, matrix_eta=0.30),
    # ggml-org/llama.cpp#4167 (every M1-M4 chip): 0.85-0.9 of bandwidth; the Ultras lose to a
    # fixed ~4 ms per token; pp512 at ~0.6 of the FP32 rate (= the FP16 rate on Apple GPUs).
    ("Metal", "integrated"): GPUClass(eta=0.88, layer_ms=0.14, matrix_eta=0.62),
    # RDNA1-2 on HIP (ggml-org/llama.cpp#5835: RX 6700 XT fit, RX 5700 XT held out); RDNA3
    # has its own rule (GPU_GENERATIONS).
    ("ROCm", "discrete"): GPUClass(eta=0.75, layer_ms=0.03, matrix_eta=ROCM_VECTOR_MATRIX_ETA),
    # Strix Halo: decode at ~0.85 of LPDDR5X; prefill far below the WMMA rate (2025 builds
    # dequantize and multiply through hipBLAS on RDNA3/3.5, 2026 builds use MMQ): 574 tok/s on a
    # 3B model through the RPC backend (geerlingguy/ai-benchmarks#21), 1300-1500 on 7B with
    # AMD's tuned branch: 0.05-0.37 of the FP16 rate, the spread in the interval. Issue 38b
    # refit on its two fit rows (decode 0.89, prefill 1.21); issues 38f, 38i: ROCM_IGPU_MATRIX_ETA.
    ("ROCm", "integrated"): GPUClass(eta=0.76, layer_ms=0.05, matrix_eta=ROCM_IGPU_MATRIX_ETA),
    # ggml-org/llama.cpp#10879 (RX 7900 XTX RADV, RTX 30/40 on Vulkan).
    # Issue 38c refit (the rows that set constants, bench/planner_published.py --fit: four
    # RTX 30-50 rows of 2025 builds): decode 1.09, prefill 1.06 of the old figures.
    ("Vulkan", "discrete"): GPUClass(eta=0.87, layer_ms=0.03, matrix_eta=0.37),
    # Radeon 780M/8060S, Ryzen Z1 (brand-o/normiebench, llm-tracker copies): decode at ~0.8 of
    # LPDDR5(X); prefill at ~0.2 of the dual-issue FP16 rate.
    # Issue 38b refit on the 780M and Z1 fit rows (decode 0.97; prefill 1.41, then K-quants
    # at the legacy rate on AMD's Vulkan path: PREFILL_QUANT_BY_PATH). Issue 38c refit on its
    # five rows of 2025-2026 builds (780M x2, Z1, Strix Halo x2): prefill 0.96 (0.21).
    ("Vulkan", "integrated"): GPUClass(eta=0.78, layer_ms=0.05,
                                       matrix_eta=VULKAN_IGPU_MATRIX_ETA),
    ("SYCL", "discrete"): GPUClass(eta=0.60, layer_ms=0.05, matrix_eta=0.15),
    # Arc 140V (Lunar Lake): SYCL decode reaches ~0.42 of LPDDR5X (issue 38: predicted
    # +41-54% at 0.6).
    ("SYCL", "integrated"): GPUClass(eta=0.42, layer_ms=0.05, matrix_eta=0.15),
}
DEFAULT_GPU_CLASS = GPUClass(eta=0.60, layer_ms=0.05, matrix_eta=0.25)
"""Backends with no published rows here (OpenCL, MUSA, CANN)."""
GPU_GENERATIONS: tuple[tuple[str, str, str, str, GPUClass], ...] = (
    # (GPU name pattern, vendor, backend, kind ("" = either), class): the first match replaces
    # GPU_CLASSES' entry.
    # NVIDIA laptop GPUs: power limits hold the memory clock below the desktop part's data
    # sheet (an RTX 2070 Max-Q at 0.58 of 384 GB/s, brand-o/normiebench#39; issue 38: a laptop
    # RTX 3070 decoded 46% slower than its desktop figure predicts).
    (r"Laptop|Max-Q|Mobile", "nvidia", "CUDA", "",
     GPUClass(eta=0.58, layer_ms=0.02, matrix_eta=0.40)),
    # Data-centre NVIDIA (HBM, server hosts): ~2.5 ms per token of launches (A100 191 tok/s,
    # H100 268 on a 3.8 GB file, ggml-org/llama.cpp#15013); pp512 at ~0.2 of the tensor rate.
    (r"\b(A100|H100|H200|H20|B200|GH200|A800|H800)\b", "nvidia", "CUDA", "",
     GPUClass(eta=0.90, layer_ms=0.075, matrix_eta=0.16)),  # 38b refit: prefill 0.81
    # Data-centre NVIDIA on Vulkan: an A100 decodes at half its CUDA rate, prefills at 0.65 of
    # it (unchecked: the ggml-org/llama.cpp#17273 rows had no retrieved source).
    (r"\b(A100|H100|H200|H20|B200|GH200|A800|H800)\b", "nvidia", "Vulkan", "",
     GPUClass(eta=0.80, layer_ms=0.17, matrix_eta=0.13,
              immature="llama.cpp's Vulkan backend runs data-centre NVIDIA GPUs at about half"
                       " their CUDA speed")),
    # CDNA and GCN on ROCm: 13-21% of HBM bandwidth (MI300X 233 tok/s at 5.3 TB/s, MI210 125 at
    # 1.6 TB/s, ggml-org/llama.cpp#15021; Radeon VII 54 at 1 TB/s, llm-tracker.info; unchecked:
    # none of these rows was retrieved, only copies without an address). Issue 38: an MI300X
    # decoded 31% slower than 0.25 predicts and prefilled at a 1/11th of 0.15: llama.cpp's
    # HIP kernels use none of CDNA's matrix cores for quantized weights.
    # GCN (Vega, Radeon VII, Instinct MI25/MI50/MI60) has no matrix cores: llama.cpp's HIP
    # kernels multiply quantized weights with the int8 dot products of the shader cores (MMQ on
    # dp4a: only CDNA and RDNA3-4 leave it for hipBLAS on prompt batches, ggml-cuda/mmq.cu), as on
    # RDNA1-2, whose FP16:FP32:int8 rates GCN5 shares: prefill at the ROCm RDNA1-2 share of the
    # FP16 figure (ROCM_VECTOR_MATRIX_ETA), not CDNA's share of a matrix-core figure (issue 38f:
    # a 2x MI50 prefilled 7-40x faster than the CDNA rule predicted).
    # Decode (issue 38g): CDNA's 0.19 is not a bandwidth share but an MI300X's fixed per-token
    # cost spread over its 5.3 TB/s (3.8 GB read in 0.7 ms, a token in 4.3 ms); a GCN card at
    # 1 TB/s streams like the RDNA3 cards on HIP (0.62, fitted on the RX 7900 XTX rows) until its
    # shader cores bound dequantizing (DECODE_GBPS_PER_TFLOP, dequant_tflops: GCN5 issues its
    # data-sheet FP16): an MI50 decodes quantized weights at ~0.4 of its HBM, F16/BF16 at ~0.6.
    (r"\b(MI(?:25|50|60|8)|Radeon VII|Vega)\b", "amd", "ROCm", "",
     GPUClass(eta=0.62, layer_ms=0.03, matrix_eta=ROCM_VECTOR_MATRIX_ETA,
              immature="llama.cpp's HIP kernels dequantize on this GPU's shader cores (GCN):"
                       " quantized weights stream at about 0.4 of its HBM bandwidth")),
    (r"\bMI\d{3}X?\b", "amd", "ROCm", "",
     GPUClass(eta=0.19, layer_ms=0.03, matrix_eta=0.014,
              immature="llama.cpp's HIP kernels reach about a fifth of this GPU's HBM"
                       " bandwidth (CDNA)")),
    # Intel GPUs on Vulkan, fitted on an A770 and a Tiger Lake Xe remembered rather than
    # retrieved; the retrieved ggml-org/llama.cpp#10879 rows: an A770 decodes at 0.4 of its
    # bandwidth and prefills at ~0.1 of its XMX rate (as here), a B580 at 0.6 and 0.07.
    # RDNA3 on HIP: ~0.6 of GDDR6 (an RX 7900 XTX at 105 tok/s on an 8B Q4_K_M,
    # ggml-org/llama.cpp#26284); at 0.75 the RDNA3 rows decoded 20-48% slower than predicted
    # (issue 38).
    (r"\b(RX 7\d{3}|W7\d{3}|7900)", "amd", "ROCm", "discrete",
     GPUClass(eta=0.62, layer_ms=0.03, matrix_eta=ROCM_RDNA3_MATRIX_ETA)),
    # Turing and older NVIDIA on Vulkan: no cooperative-matrix support, prefill on the shader
    # cores (an RTX 2080 Ti at 7,094 tok/s on a 1.1B model, geerlingguy/ai-benchmarks#46).
    (r"\b(RTX 20\d{2}|GTX|TITAN RTX|T4|Quadro RTX)\b", "nvidia", "Vulkan", "",
     GPUClass(eta=0.80, layer_ms=0.03, matrix_eta=0.16)),
    # Battlemage (B580, fit: 70 tok/s at 456 GB/s) reaches 0.65; prefill ~0.07 of XMX.
    (r"\b(B\d{2,3}|Battlemage)\b", "intel", "Vulkan", "",
     GPUClass(eta=0.65, layer_ms=0.05, matrix_eta=0.07,
              immature="llama.cpp's Vulkan backend is immature on Intel GPUs (SYCL is faster)")),
    (r"", "intel", "Vulkan", "",
     GPUClass(eta=0.40, layer_ms=0.05, matrix_eta=0.12,
              immature="llama.cpp's Vulkan backend is immature on Intel GPUs (SYCL is faster)")),
    # AMD discrete on Vulkan (RADV): RDNA3/4 stream at ~0.92 of GDDR6 (RX 9070 XT fit, 7900 XTX,
    # R9700 held out, ggml-org/llama.cpp#10879 copies) with light launches.
    # AMD GPUs without matrix cores on Vulkan (GCN/Polaris, RDNA1-2): prefill on the shader
    # cores, at 0.64 of the RDNA3-4 share of their FP16 rate (issue 38b fit rows: RX 5700 XT,
    # 6700 XT, 6800 XT); decode as RDNA3-4.
    (r"\bRX [45]\d{2}\b|\bRX [56]\d{3}|\bW[56]\d{3}\b|Radeon VII|Vega", "amd", "Vulkan",
     "discrete", GPUClass(eta=0.87, layer_ms=0.015, matrix_eta=0.22)),
    # Issue 38b refit on seven fit rows on PC hosts: decode 0.95 of 0.92; prefill of RDNA3-4
    # (KHR_coopmat on WMMA: RX 7900 XTX, 9070, 9070 XT, AI PRO R9700) 1.02 of 0.35. Issue 38c
    # refit on its seven rows of 2025-2026 builds (the #10879 scoreboard and llama.cpp's -fa 1
    # rows of an RX 9070 XT): decode 1.09 (prefill 0.95, within the 5% left alone).
    (r"", "amd", "Vulkan", "discrete",
     GPUClass(eta=0.95, layer_ms=0.015, matrix_eta=VULKAN_RDNA3_MATRIX_ETA)),
)
FLOAT_DECODE_GAIN = 1.12
"""Off Apple, F16/BF16 weights stream at this many times the share quantized weights reach:
no dequantization, and cuBLAS's matrix-vector kernels (the fit rows: F16 at a median 1.04 of
the old prediction where the quantized rows ran at 0.93 of it, RTX 3090/4080/4090)."""
ARM_HOST_LAYER_MS = 0.30
ARM_HOST_PREFILL = 0.19
"""An AMD or Intel GPU on Vulkan behind an ARM host (Raspberry Pi 5/CM5/500+): Mesa's ARM
builds there report neither integer dot products nor matrix cores (an RX 9070 XT: `int dot: 0
| matrix cores: none`) and the board's PCIe path is slow, so each layer costs ~0.3 ms more and
prefill runs at ~0.2 of a PC host's rate (0.19; fit rows: RX 9070 XT and Arc A310 on a Pi 5/500+,
AI PRO R9700 on a CM5). NVIDIA's driver there runs near its PC speed (RTX 3060 on a CM5)."""
DECODE_GBPS_PER_TFLOP = 8.0
"""Off Apple, a GPU dequantizes and multiplies quantized weights with its shader cores: a small
one cannot keep up with its memory. Decode reads quantized weights at most this many GB/s per
dense FP16 TFLOPS (fitted on a Ryzen Z1's 4 CUs: 47 GB/s of 102, brand-o/normiebench#20), in
dequant_tflops' units; F16/BF16 weights need no dequantizing and are not bound by it."""
PREFILL_QUANT = {"legacy": 1.0, "k": 0.80, "iq": 0.65, "float": 0.85}
"""Prefill off Apple by the weights' type, a share of the legacy quants' rate (Q4_0, Q8_0: the
int8 MMQ kernels): K-quants unpack more per block, i-quants look up grids, F16/BF16 go through
BLAS with the activations converted (RTX 3090/4080/4090 rows: Q4_K_M at 0.75-0.9 of F16,
Q4_0 above it). Metal's kernels dequantize into its matrix units at one rate (its rows fit
without it)."""


PREFILL_LAYER_MS = 0.25
"""Off Apple, a GPU's prompt batch (one ubatch of N_UBATCH rows) pays this many milliseconds per
layer besides its matrix FLOPs: ~25 kernels a layer (norms, RoPE, attention, the activations'
int8 quantization before each quantized matrix multiply, the residual adds), each ~10 us of
launch and ramp; CUDA graphs serve only single-token batches. Set from that count, not fitted
(no fit row varies the model on one GPU); checked on held rows: a wide GPU's prompt of a small
model falls short of the matrix rate by about this (an RTX 5090 on Qwen2.5 3B to 32B, batch 38e,
~0.3 ms; an RTX 4090 on a 3B, batch 38f). The classes' matrix_eta were not refitted with it: a
refit to the fit rows' median (CUDA 1.15, Vulkan RDNA 1.15) raised no fit row into +-25% and
put held rows of older builds further off (issue 38f). Metal's rows fit without it."""


def quant_kind(quant: str) -> str:
    """"float", "legacy", "k" or "iq": how llama.cpp multiplies weights of this type."""
    q = quant.upper()
    if q.startswith(("F16", "BF16", "F32")):
        return "float"
    if q.startswith("IQ") or q.startswith("TQ"):
        return "iq"
    if "_K" in q:
        return "k"
    return "legacy"


PREFILL_QUANT_BY_PATH: dict[tuple[str, str], dict[str, float]] = {
    ("Vulkan", "amd"): {"k": 1.0},
    ("CUDA", "nvidia"): {"k": 1.0},
    ("ROCm", "amd"): {"k": 1.0},
}
"""Where a backend's matrix path treats the weight types differently from CUDA's int8 MMQ
kernels: Vulkan on AMD GPUs dequantizes each tile into shared memory as it loads it, so
K-quants prefill at the legacy quants' rate (issue 38b fit rows: an RX 6800 XT's Q6_K at 1.04
of its class's Q4_0 rows once K-quants are not discounted; the Radeon 780M and Ryzen Z1 rows,
Q4_K_M, then set the integrated class). CUDA's MMQ kernels of 2025-2026 builds multiply K-quants
at the legacy quants' rate too (issue 38c: the two K-quant CUDA rows of recent builds that set
constants, an RTX 2070 Max-Q and an RTX 4070 Laptop, prefilled at 1.19 and 1.29 of the 0.80
rate, i.e. at ~1.0; the 2024 tables' K-quant rows at 1.03 of 0.80: the planner follows the
builds users run now); HIP compiles the same kernels (ggml-cuda), so ROCm follows CUDA."""


DP4A_ONLY_HIP = (r"\bRX [56]\d{3}|\bW[56]\d{3}\b|Radeon VII|\bVega\b|\bMI(?:25|50|60)\b"
                 r"|\b6[0-9]0M\b|\bRX [45]\d{2}\b")
"""AMD GPUs without int8 matrix instructions (GCN, Polaris, RDNA1-2): llama.cpp's HIP MMQ
kernels multiply quantized weights with the shader cores' dp4a there, where unpacking a
K-quant block costs what it costs on the generic path (PREFILL_QUANT's 0.80), not the nothing
it costs behind RDNA3-4's WMMA or CDNA's MFMA int8 tiles (ggml-cuda/mmq.cuh; issue 38i: an
MI50's Q4_K_S prompt at 0.73 of its Q4_0 at ubatch 256 in ggml-org/llama.cpp#27841, the PR
that tuned GCN's MMQ tiles)."""


def prefill_quant_factor(quant: str, backend: str | None, vendor: str = "",
                         name: str = "") -> float:
    """The share of a GPU's fitted prefill rate that ``quant`` reaches (PREFILL_QUANT, with
    PREFILL_QUANT_BY_PATH's exceptions for ``backend`` on ``vendor``'s GPUs, but on HIP not for
    a GPU ``name`` of DP4A_ONLY_HIP); 1 on Metal."""
    if backend == "Metal":
        return 1.0
    kind = quant_kind(quant)
    if backend == "ROCm" and name and re.search(DP4A_ONLY_HIP, name):
        return PREFILL_QUANT[kind]
    return PREFILL_QUANT_BY_PATH.get((backend or "", vendor), {}).get(kind, PREFILL_QUANT[kind])


DECODE_INTERVAL: dict[str, tuple[float, float]] = {
    "Metal": (0.87, 1.06), "CUDA": (0.71, 1.17), "ROCm": (0.76, 1.17), "Vulkan": (0.72, 1.28),
    "SYCL": (0.56, 1.56), "CPU": (0.66, 1.32)}
"""The interval a plan shows around its decode figure, as factors: the 10th and 90th
percentiles of measured/predicted over the rows fitted on and the held-out rows of batches 16
and 38 (SYCL, with one row, a guessed 0.75-1.25), raised to the least power (in steps of 0.2)
that holds 80% of those held-out rows in both decode and prefill: 1.2 on Metal, 2 off Apple
(issue 38b; the
rows fitted on and of one publication sit closer together than publications of different
llama.cpp builds do: an RTX 3090's Q4_0 decode was 121 tok/s in Jan 2024 and 158 in 2025).
Batch 38b, then the clean hold-out, was not used; the 38c refit left them as they were (batch
38c, the hold-out of recent builds: 81% of decode and 65% of prefill figures inside). Issue 38g:
ROCm's (0.92, 1.80) carried the old GCN rule's under-prediction; re-set by the same recipe on
the ROCm rows of batches 16 and 38 with the 38g decode model (0.87-1.08, squared).
bench/planner_published.py reports the shares."""
PREFILL_INTERVAL: dict[str, tuple[float, float]] = {
    "Metal": (0.94, 1.19), "CUDA": (0.46, 1.27), "ROCm": (0.50, 1.37), "Vulkan": (0.39, 1.34),
    "SYCL": (0.25, 4.00), "CPU": (0.55, 1.61)}
"""The same for prefill (SYCL's base a guessed 0.5-2). Issue 38h re-set CUDA, ROCm and Vulkan by
the same recipe on the rows of 2025-2026 builds (the builds the constants follow; batch 38h left
out to check them): the 10th-90th percentiles of measured/predicted over those rows fitted on and
held out, raised to the least power (steps of 0.2) that holds 80% of their held rows (CUDA and
Vulkan 1.2, ROCm 1). The old figures held 43% of the held Vulkan rows (0.69-1.23: the fit rows,
scoreboards' best runs, sit closer together than the builds, drivers and flags of other
publications) and spanned 27x on ROCm. They lean low: a published run is more often slower than
the prediction (Vulkan without coopmat or with mid-2025 scalar flash attention, AMDVLK, old
drivers) than faster. Batch 38h, after: 12 of 15 Vulkan rows inside (4 before); its four ROCm
rows of a Radeon 890M run with gfx1151 kernels (HSA_OVERRIDE_GFX_VERSION) fall below. Issue 38i
re-set ROCm's by the same recipe once ROCM_IGPU_MATRIX_ETA moved (0.55-1.52 -> 0.50-1.37: 23 of
the 31 held ROCm rows inside, 22 with the old figures)."""
DEFAULT_INTERVAL = (0.6, 1.4)
"""A backend with no published rows here."""


def interval(backend: str | None, what: str = "decode") -> tuple[float, float]:
    """(low, high) factors around a predicted rate on ``backend`` ("CPU" when None)."""
    table = DECODE_INTERVAL if what == "decode" else PREFILL_INTERVAL
    return table.get(backend or "CPU", DEFAULT_INTERVAL)
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
# Issue 38b refit: the two fit rows with a prefill figure ran at 0.86 of the old table; issue
# 38c refit: the eight CPU rows of 2025-2026 builds at 1.08 of it.
CPU_FLOPS_PER_CYCLE = {"avx512": 26.0, "avx2": 15.0, "avx": 7.5, "neon-i8mm": 15.0,
                       "neon-dotprod": 7.5, "neon": 3.8, "scalar": 1.8}
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
    ("MI210", 181.0), ("8060S", 59.4), ("890M", 23.8), ("780M", 16.6),
    ("Arc B580", 116.0), ("Arc A770", 137.6), ("Arc A310", 24.6), ("Arc 140V", 32.0),
    ("RX 580", 6.2),
    # Issue 38f, from the data sheets (dense FP16: NVIDIA's tensor rate with FP16 accumulate,
    # RDNA3's WMMA rate, Intel's XMX rate, else the packed-FP16 shader rate; no row checks them):
    # a profile without fp16_tflops (the probe gives it only on Apple) otherwise gets a guess
    # from its bandwidth, far off for an integrated GPU.
    ("RTX 5060", 76.7), ("RTX 4080 SUPER", 208.9), ("RTX 4070 Ti SUPER", 176.4),
    ("RTX 4070 SUPER", 142.0), ("RTX 3090 Ti", 160.0), ("RTX 3080 Ti", 136.4),
    ("RTX 3070 Ti", 87.0), ("RTX 3050", 36.4), ("RTX 2080", 80.5), ("RTX A6000", 154.8),
    ("RTX A5000", 111.1), ("RTX A4000", 76.7), ("L4", 121.0), ("V100", 125.0),
    ("H200", 989.4),
    ("RX 7900 GRE", 92.0), ("RX 7700 XT", 70.3), ("RX 7600 XT", 45.1), ("RX 6950 XT", 47.3),
    ("RX 6900 XT", 46.1), ("RX 6800", 32.3), ("RX 6700 XT", 26.4), ("RX 6600 XT", 21.2),
    ("RX 6600", 17.9), ("RX 5700 XT", 19.5), ("Radeon VII", 27.7), ("MI50", 26.5),
    ("MI60", 29.5), ("RX 570", 5.1), ("RX 480", 5.8), ("8050S", 45.9), ("880M", 17.8),
    ("760M", 10.6), ("680M", 7.4),
    ("Arc A750", 117.6), ("Arc A580", 83.6), ("Arc A380", 32.8), ("Arc B570", 92.2),
    ("Arc 130V", 26.5), ("Iris Xe", 4.1), ("Iris(R) Xe", 4.1),
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


def gpu_class(gpu: GPUInfo, backend: str) -> GPUClass:
    """The class ``gpu`` falls in under ``backend``: a vendor/generation rule of GPU_GENERATIONS
    first, else by backend and kind (an Apple GPU is integrated)."""
    return gpu_class_for(gpu.name, gpu.vendor, gpu.kind, backend)


def gpu_class_for(name: str, vendor: str, kind: str, backend: str) -> GPUClass:
    kind = "integrated" if kind == "integrated" or vendor == "apple" else "discrete"
    for pattern, rule_vendor, on, rule_kind, found in GPU_GENERATIONS:
        if (vendor == rule_vendor and backend == on and rule_kind in ("", kind)
                and re.search(pattern, name)):
            return found
    return GPU_CLASSES.get((backend, kind), DEFAULT_GPU_CLASS)


def gpu_read_gbps(cls: GPUClass, q: float, bandwidth_gbps: float, tflops: float,
                  vendor: str, quant: str = "", name: str = "") -> float:
    """GB/s a GPU of class ``cls`` streams the weights of type ``quant`` at for decode: eta x q
    x its bandwidth (off Apple F16/BF16 weights x FLOAT_DECODE_GAIN), off Apple and for
    quantized weights at most DECODE_GBPS_PER_TFLOP x ``name``'s dequantizing rate
    (dequant_tflops of its FP16 figure ``tflops``)."""
    rate = cls.eta * q * bandwidth_gbps
    floating = bool(quant) and quant_kind(quant) == "float"
    if vendor != "apple" and floating:
        rate *= FLOAT_DECODE_GAIN
    if vendor != "apple" and tflops > 0 and not floating:
        rate = min(rate, DECODE_GBPS_PER_TFLOP * dequant_tflops(name, tflops))
    return rate


SINGLE_ISSUE_FP16 = (r"\bRX [56]\d{3}|\bW[56]\d{3}\b|Radeon VII|\bVega\b|\bMI(?:25|50|60)\b"
                     r"|\b6[0-9]0M\b")
"""AMD GPUs whose data-sheet FP16 rate is what their shader cores issue (GCN5 and RDNA1-2:
packed FP16, one instruction per lane and cycle). DECODE_GBPS_PER_TFLOP was fitted on an RDNA3
iGPU (Ryzen Z1), whose data-sheet FP16 figure counts RDNA3's dual issue, twice what the
dequantizing shader code issues: per FP16 operation it runs, a GCN5/RDNA1-2 GPU dequantizes as
fast, so its figure counts double for the cap (issue 38g). Polaris already counts double
(shader_tflops); NVIDIA's and Intel's figures are matrix-core rates far above the cap."""


def dequant_tflops(name: str, tflops: float) -> float:
    """``tflops`` (shader_tflops of a GPU's FP16 figure) in the units DECODE_GBPS_PER_TFLOP
    was fitted in: doubled for a GPU of SINGLE_ISSUE_FP16."""
    return tflops * 2 if re.search(SINGLE_ISSUE_FP16, name) else tflops


def host_gpu_class(cls: GPUClass, vendor: str, backend: str, host_simd: str) -> GPUClass:
    """``cls`` as an ARM host drives it: AMD and Intel GPUs on Vulkan behind an ARM board (a
    Raspberry Pi's PCIe lane) pay ARM_HOST_LAYER_MS more per layer and prefill at
    ARM_HOST_PREFILL of the rate a PC host reaches."""
    if backend == "Vulkan" and vendor in ("amd", "intel") and host_simd.startswith("neon"):
        return replace(cls, layer_ms=cls.layer_ms + ARM_HOST_LAYER_MS,
                       matrix_eta=cls.matrix_eta * ARM_HOST_PREFILL)
    return cls


FP16_AT_FP32_RATE = r"\bRX [45]\d{2}\b"
"""GPUs whose FP16 runs at the FP32 rate (Polaris: RX 460-590; Vulkan reports `fp16: 0`), so
their dense FP16 figure is their FP32 rate. The constants for shader-core work (the decode cap
DECODE_GBPS_PER_TFLOP, the no-matrix-core prefill shares) were fitted on GPUs with packed FP16
at twice the FP32 rate (RDNA1-3, GCN5), and dequantization and int8/FP32 dot products run at the
FP32 rate: such a GPU's figure counts double there (shader_tflops). Issue 38f: an RX 480 decoded
2.1x and prefilled 1.7x faster than its FP16 figure predicted."""


def shader_tflops(name: str, tflops: float) -> float:
    """``tflops`` (a GPU's dense FP16 figure) in the units the shader-core constants were fitted
    in: doubled for a GPU of FP16_AT_FP32_RATE."""
    return tflops * 2 if re.search(FP16_AT_FP32_RATE, name) else tflops


def matrix_tflops(gpu: GPUInfo) -> float:
    """The GPU's dense FP16 matrix rate: the profile's figure, else GPU_MATRIX_TFLOPS by name
    (the longest matching name), else a guess from its bandwidth."""
    return matrix_tflops_for(gpu.name, gpu.fp16_tflops, gpu.bandwidth_gbps)


def matrix_tflops_for(name: str, fp16_tflops: float, bandwidth_gbps: float) -> float:
    if fp16_tflops > 0:
        return fp16_tflops
    known = [(len(gpu), rate) for gpu, rate in GPU_MATRIX_TFLOPS
             if re.search(rf"(?<![\w-]){re.escape(gpu)}(?![\w-])", name)]
    if known:
        return max(known)[1]
    return bandwidth_gbps * MATRIX_TFLOPS_PER_GBPS


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


@dataclass(frozen=True)
class PlanPrefs:
    """What the user asks of a plan. Every field has a sensible default."""

    n_ctx: int | None = None
    """Context per sequence in tokens; None = memory.AGENT_CTX (at most the trained length, or
    less to fit)."""
    min_tps: float = 10.0
    """Decode speed (tokens/s) a variant should reach to be preferred."""
    n_slots: int | None = 1
    """Sequences decoded in parallel (the daemon's slots); None = as many (up to
    memory.MAX_AUTO_SLOTS) as fit without moving layers off the GPU."""
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


@dataclass(frozen=True)
class Machine:
    """A profile as one plan reads it, with the prefs applied: the budgets after their
    reserves, the one GPU used and its class, the host's bandwidth and compute rates."""

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


def machine_view(hw: HardwareProfile, prefs: PlanPrefs) -> Machine:
    """Read ``hw`` once for a plan with ``prefs``."""
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
    return Machine(ram_budget=ram_budget, gpu=gpu, gpu_backend=backend, gpu_budget=gpu_budget,
                   unified=unified, host_bw_gbps=host_bw, host_bw_1core_gbps=host_bw1,
                   cpu_eta=eta, threads=threads, simd=hw.cpu.simd,
                   ghz=hw.cpu.ghz or DEFAULT_GHZ, cores=hw.cpu.physical_cores,
                   kv_type=prefs.kv_type,
                   gpu_class=(host_gpu_class(gpu_class(gpu, backend), gpu.vendor, backend,
                                             hw.cpu.simd) if gpu and backend else None),
                   sockets=sockets)


def memory_budget(hw: HardwareProfile, prefs: PlanPrefs | None = None) -> tuple[int, int, bool]:
    """What loaded models may take together, in bytes: RAM and VRAM after their reserves (as
    one plan budgets them), and whether the two are one pool (unified memory)."""
    m = machine_view(hw, prefs or PlanPrefs())
    return m.ram_budget, m.gpu_budget, m.unified


def _estimated_host_bandwidth(hw: HardwareProfile) -> float:
    """No measurement: dual-channel DDR4-3200 (51 GB/s) for a desktop, less for few cores."""
    return min(51.2, 8.0 * max(1, hw.cpu.physical_cores))


def calibration_ratio(prefs: PlanPrefs, key: str) -> float:
    """This machine's measured/predicted decode ratio for a backend (1.0 when none)."""
    ratio = float(prefs.calibration.get(key, 1.0)) if prefs.calibration else 1.0
    if not (0.05 <= ratio <= 20.0) or not math.isfinite(ratio):
        ratio = 1.0  # a corrupt calibration must not produce absurd numbers
    return ratio
