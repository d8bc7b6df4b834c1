"""Memory, per device (bytes), for a placement of a candidate:

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

Automatic slots (none asked for) are added, up to MAX_AUTO_SLOTS, while they fit without
moving layers off the GPU and their KV cache stays within AUTO_KV_SHARE of each device's
usable memory (``kv_past_cap``): the context stays, slots give way.

The context (per sequence: each slot has its own n_ctx cells) is the one asked for, else
AGENT_CTX capped at the model's trained length and halved until the model fits (``ctx_ladder``)
and, with a GPU, until it fits without moving layers off the GPU (plan._evaluate). A longer
request reloads the model with more, up to the largest context that fits this machine at all
(``larger_contexts``: the trained length, then the powers of two below it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InvalidRequest
from ..runtime.types import kv_cache_types
from .machine import MIB, Machine, PlanPrefs

if TYPE_CHECKING:
    from .candidate import Candidate, LayerShape

AGENT_CTX = 32768
"""Context a plan gives a model when none is asked for, where it fits (capped at the model's
trained context, halved to fit: ``ctx_ladder``): what today's coding agents send (Cline, Roo
and aider put 20k-30k tokens of system prompt, tools and repository map before the question).
A longer request reloads the model with more, up to what fits (``larger_contexts``)."""
POOLED_CTX = 8192
"""The default context's ceiling for a model split across RPC workers (placement.py): there
every cell of KV takes memory on machines chosen for their layers, and a longer context pushes
layers onto slower devices or over the link; ``--ctx`` asks for more."""
UNKNOWN_TRAINED_CTX = 8192
"""The ceiling of the default context for a file whose header names no trained length: no
more than the model may have been trained for."""
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
"""Checkpoints of its window layers a slot keeps with 256-row batches (runtime/checkpoints.py
``CacheKeeper._chat``: where its last turn began and where its reply began), each the cells
of one window (llama.cpp saves no others)."""
KV_ELEMENT_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
"""Bytes per KV cache element, by cache type (Config.kv_type), as ggml stores it: Q8_0 keeps
blocks of 32 int8 values with one F16 scale, 34 bytes per 32 elements; Q4_0 32 4-bit values
with one F16 scale, 18 bytes."""
MAX_AUTO_SLOTS = 8
"""The most slots a plan gives a model when ``PlanPrefs.n_slots`` is None: an editor asks
several completions of each keystroke's prompt (llama.vscode: ``n_cmpl`` 3, each a sequence
once it writes otherwise than the first), and with one editor's three, another's and a chat
on four slots each request evicted another's cached prompt (the editor workload, 3 editors:
FIM prompts read 1,374 tokens at the median with 4 slots, 258 with 8)."""
NOTED_SLOTS = 4
"""Fewer automatic slots than this, held back by the KV cap, are explained (``slots_note``):
what this many would take, and the context at which they stay within it."""
AUTO_KV_SHARE = 0.25
"""The most of a device's usable memory (its budget) that automatic slots' KV cache may take
there (``kv_past_cap``; one slot may take more, up to what fits). Each slot holds its
whole context: at the agents' 32768, Llama 3.2 3B's 112 KiB a token are 3.5 GiB a slot, and
four slots would hold 14 GiB of RAM for requests that mostly come one at a time, memory the
daemon's other models and the machine's other programs then lack. Past the cap a plan keeps
the context and gives fewer slots, and says what more would take (``--slots`` asks for them;
a smaller ``--ctx`` fits more)."""


# Runtime overhead per device: the process and libraries on the host, the driver context,
# kernels and scratch on a GPU.
HOST_OVERHEAD = 256 * MIB
GPU_OVERHEAD = {"CUDA": 400 * MIB, "ROCm": 400 * MIB, "Vulkan": 256 * MIB, "Metal": 128 * MIB,
                "SYCL": 400 * MIB, "OpenCL": 256 * MIB, "MUSA": 400 * MIB, "CANN": 400 * MIB}


def kv_bytes_per_element(kv_type: str) -> float:
    """Bytes one element of a ``kv_type`` KV cache takes: the factor of every KV size and of
    the KV bytes a decoded token reads. With K and V of different types (``"q8_0,q4_0"``),
    their mean: K and V hold as many elements each in the models the planner reads."""
    try:
        k, v = kv_cache_types(kv_type)
    except ValueError as exc:
        raise InvalidRequest(f"{exc}.") from None
    return (KV_ELEMENT_BYTES[k] + KV_ELEMENT_BYTES[v]) / 2


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


def ctx_ladder(c: Candidate, prefs: PlanPrefs, ceiling: int = AGENT_CTX) -> list[int]:
    """The contexts to try, largest first: the one asked for, else ``ceiling`` (AGENT_CTX, or
    POOLED_CTX across workers; capped at the trained context) halved down to MIN_AUTO_CTX."""
    if prefs.n_ctx is not None:
        return [prefs.n_ctx]
    top = min(ceiling, c.context_length or UNKNOWN_TRAINED_CTX)
    ladder = [top]
    while ladder[-1] // 2 >= min(MIN_AUTO_CTX, top):
        ladder.append(ladder[-1] // 2)
    return ladder


def larger_contexts(c: Candidate) -> list[int]:
    """The contexts above the default a longer request may reload a model with, largest
    first: the trained length, then the powers of two below it down to AGENT_CTX (exclusive);
    none for a file whose header names no trained length."""
    trained = c.context_length
    if trained <= AGENT_CTX:
        return []
    steps = [trained]
    power = 1 << (trained - 1).bit_length() - 1  # the largest power of two below trained
    while power > AGENT_CTX:
        steps.append(power)
        power //= 2
    return steps


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


def device_memory(c: Candidate, machine: Machine, n_gpu_layers: int, n_ctx: int, n_slots: int,
                  n_cpu_moe: int = 0) -> tuple[DeviceUse, DeviceUse | None]:
    """Bytes on the host and on the GPU for a placement; ``n_cpu_moe``: the expert tensors of
    the first n_cpu_moe layers stay in RAM wherever their layer is."""
    n = c.n_layers
    k = max(0, min(n_gpu_layers, n + 1))
    first_gpu = n - min(k, n)
    moved = sum(layer.expert_bytes for layer in c.layers[first_gpu:max(first_gpu, n_cpu_moe)])
    output_on_gpu = k > n
    # CPU-only, flash attention is off unless a q8_0 cache needs it (runtime.llama).
    small = shrinks_window_cache(c, cpu_only=k == 0 and machine.kv_type == "f16")
    ubatch = CPU_WINDOW_UBATCH if small else N_UBATCH
    gpu_weights = sum(layer.weight_bytes for layer in c.layers[first_gpu:])
    gpu_kv = sum(layer_kv_bytes(layer, n_ctx, n_slots, machine.kv_type)
                 for layer in c.layers[first_gpu:])
    host_weights = (sum(layer.weight_bytes for layer in c.layers[:first_gpu])
                    + c.embedding_bytes + c.other_bytes + moved)
    gpu_weights -= moved
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
    # On a GPU the feed-forward's two n_ff-wide intermediates of a ubatch are live at once
    # (Vulkan on the starter: 18.6 MB of compute buffer where 3 x n_embd alone gave 3.9).
    gpu_compute = activations + 4 * ubatch * 2 * c.n_ff + (logits if output_on_gpu else 0)
    gpu_budget = machine.gpu_budget
    if machine.unified:
        # One pool: what the host part takes is not available to the GPU part.
        gpu_budget = min(gpu_budget, max(0, machine.ram_budget - host.total_bytes))
    gpu = DeviceUse(machine.gpu.name, machine.gpu_backend or "", gpu_weights, gpu_kv,
                    gpu_compute, overhead, gpu_budget)
    return host, gpu


def kv_total(host: DeviceUse, gpu: DeviceUse | None) -> int:
    """The KV cache's bytes, on every device."""
    return host.kv_bytes + (gpu.kv_bytes if gpu is not None else 0)


def kv_past_cap(host: DeviceUse, gpu: DeviceUse | None, unified: bool) -> str:
    """Where the KV cache takes more than AUTO_KV_SHARE of a device's usable memory, in
    words ("" where it does not): the GPU's and the host's each, or the one pool of unified
    memory."""
    devices = [(host, kv_total(host, gpu) if unified else host.kv_bytes, host.budget_bytes)]
    if gpu is not None and not unified:
        devices.append((gpu, gpu.kv_bytes, gpu.budget_bytes))
    for device, kv, budget in devices:
        if kv > AUTO_KV_SHARE * budget:
            where = "RAM" if device is host else device.device
            return (f"{kv / 2**30:.1f} GiB of KV cache in {where}, more than"
                    f" {AUTO_KV_SHARE:.0%} of its {budget / 2**30:.1f} GiB usable")
    return ""


def all_fit(host: DeviceUse, gpu: DeviceUse | None) -> bool:
    return host.fits and (gpu is None or gpu.fits)


def most_gpu_layers(c: Candidate, machine: Machine, n_ctx: int, n_slots: int
                    ) -> tuple[int, DeviceUse, DeviceUse | None]:
    """The most GPU layers that fit the GPU (output layer last); may not fit the host."""
    if machine.gpu is None:
        host, gpu = device_memory(c, machine, 0, n_ctx, n_slots)
        return 0, host, gpu
    best = 0
    for k in range(c.n_layers + 1, 0, -1):  # GPU use grows with k: take the first that fits
        host, gpu = device_memory(c, machine, k, n_ctx, n_slots)
        if gpu is None or gpu.fits:
            best = k
            break
    host, gpu = device_memory(c, machine, best, n_ctx, n_slots)
    return best, host, gpu
