"""One model across machines (``plan_split``, for a profile's llama.cpp RPC workers).

The devices in llama.cpp's order: this machine's CPU (the first layers), the workers' devices
in registration order, this machine's GPU (the last layers); the output head on the last device
that takes layers. Each worker device is a device like a local one (its free memory less the
reserve of its kind; its bandwidth, or where unknown this machine's one-core figure for a CPU
and UNKNOWN_REMOTE_GPU_GBPS for a GPU; a worker on loopback is this machine's cores and RAM),
and per token it adds one round trip, a fixed hop (RPC_HOP_MS) and its activations (4 x n_embd
bytes in, out to the next machine; from the last device the logits, 4 x n_vocab) and masks over
its link (bench/rpc_link.py measures them over shaped links). Layers go to
the device that reads them fastest, as many as its memory takes, then the next; every subset
of the worker devices is tried and the fastest split wins (``WorkerSplit``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from ..errors import InvalidRequest
from .machine import (
    CPU_DOT_GBPS_PER_GHZ,
    CPU_ETA_MEASURED,
    CPU_FLOPS_PER_CYCLE,
    CPU_LAYER_MS,
    GIB,
    MIB,
    PREFILL_LAYER_MS,
    SAMPLING_NS_PER_VOCAB,
    TOKEN_MS,
    Machine,
    PlanPrefs,
    calibration_ratio,
    gpu_class_for,
    gpu_read_gbps,
    machine_view,
    matrix_tflops,
    matrix_tflops_for,
    prefill_quant_factor,
    quant_factor,
    shader_tflops,
)
from .memory import (
    GPU_OVERHEAD,
    HOST_OVERHEAD,
    N_UBATCH,
    POOLED_CTX,
    DeviceUse,
    ctx_ladder,
    kv_bytes_per_element,
    layer_kv_bytes,
)

if TYPE_CHECKING:
    from ..hardware.profile import HardwareProfile
    from .candidate import Candidate, LayerShape

LAN_RTT_MS = 0.5
"""A worker's round trip when its profile gives none: a wired LAN through a switch (0.2-0.5 ms);
the upper end, so that an unmeasured link is never counted faster than it may be."""
LAN_LINK_GBPS = 0.117
"""A link's throughput when its profile gives none: gigabit Ethernet's payload (~117 MB/s),
the slowest wired link."""
RPC_HOP_MS = 2.0
"""Per worker device per decoded token, besides the round trip and the bytes: the client
serialises and sends the graph_compute command, the worker process wakes, runs the graph on its
threads and wakes the client again. Fitted to a loopback worker (bench/rpc_split.py: ~2.5 ms a
token against 0.4-0.5 ms of round trip and bytes); on a machine whose cores are busy each wake
waits for a time slice and the hop costs several times more (bench/rpc_link.py)."""
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
    prefill_layer_ms: float = 0.0
    """A prompt batch's fixed time per layer on it (machine.PREFILL_LAYER_MS off Apple)."""

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
    m = machine_view(hardware, prefs)
    ladder = [n_ctx] if n_ctx is not None else ctx_ladder(candidate, prefs, POOLED_CTX)
    if layers is not None:
        return _given_split(candidate, hardware, m, prefs, ladder[0], list(layers))
    best = None
    for ctx in ladder:
        best = fastest_split(candidate, hardware, m, prefs, ctx, prefs.n_slots or 1,
                             require_workers)
        if best.fits:
            break
    assert best is not None
    return best


def _devices(c: Candidate, hw: HardwareProfile, m: Machine, prefs: PlanPrefs
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
    cpu_ratio = calibration_ratio(prefs, "CPU")
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
                if worker.is_loopback or worker.same_machine:
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
            cls = gpu_class_for(gpu_name, vendor, "integrated" if unified else "discrete", backend)
            tflops = shader_tflops(gpu_name, matrix_tflops_for(gpu_name, 0.0, bandwidth))
            devices.append(_Device(
                worker.endpoint, dev.name, "gpu", backend, budget,
                f"{worker.endpoint}/ram" if unified else f"{worker.endpoint}/{dev.name}",
                gpu_read_gbps(cls, q, bandwidth, tflops, "apple" if unified else vendor, c.quant,
                              gpu_name),
                cls.layer_ms, GPU_OVERHEAD.get(backend, 256 * MIB),
                tflops * 1e12 * cls.matrix_eta
                * prefill_quant_factor(c.quant, backend, vendor, gpu_name),
                bandwidth,
                note, 0.0 if unified else PREFILL_LAYER_MS))
    if len(devices) - 1 > MAX_REMOTE_DEVICES:
        raise InvalidRequest(f"the workers offer {len(devices) - 1} devices; a split is planned"
                             f" over {MAX_REMOTE_DEVICES} at most.")
    if m.gpu is not None and m.gpu_class is not None:
        cls = m.gpu_class
        ratio = calibration_ratio(prefs, m.gpu_backend or "")
        tflops = shader_tflops(m.gpu.name, matrix_tflops(m.gpu))
        devices.append(_Device(
            "", m.gpu.name, "gpu", m.gpu_backend or "", m.gpu_budget,
            "local/ram" if m.unified else "local/gpu",
            gpu_read_gbps(cls, q, m.gpu.bandwidth_gbps, tflops, m.gpu.vendor, c.quant,
                          m.gpu.name) * ratio,
            cls.layer_ms / ratio,
            GPU_OVERHEAD.get(m.gpu_backend or "", 256 * MIB),
            tflops * 1e12 * cls.matrix_eta
            * prefill_quant_factor(c.quant, m.gpu_backend, m.gpu.vendor, m.gpu.name),
            m.gpu.bandwidth_gbps,
            prefill_layer_ms=0.0 if m.gpu.vendor == "apple" else PREFILL_LAYER_MS))
    return devices, notes


def fastest_split(c: Candidate, hw: HardwareProfile, m: Machine, prefs: PlanPrefs, n_ctx: int,
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


def _given_split(c: Candidate, hw: HardwareProfile, m: Machine, prefs: PlanPrefs, n_ctx: int,
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
    (n_vocab x 4 bytes); and RPC_HOP_MS of serialising and waking. No graph bytes: the veth
    counters of bench/rpc_link.py show a token moves what is counted here (within a few
    percent), the graph being cached on the worker."""
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
        ms += rtt + RPC_HOP_MS + (into + out) / (gbps * 1e9) * 1e3
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
        seconds += (c.prefill_flops_per_token * k / max(1, c.n_layers) / d.flops
                    + k * d.prefill_layer_ms / 1e3 / N_UBATCH)
        if d.remote:
            rtt, gbps = _link(hw, d.endpoint)
            seconds += 2 * 4 * c.n_embd / (gbps * 1e9) + rtt / 1e3 / N_UBATCH
    return 1.0 / seconds if seconds > 0 else 0.0


def _build_split(c: Candidate, hw: HardwareProfile, m: Machine, devices: Sequence[_Device],
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


def _unfit_split(c: Candidate, hw: HardwareProfile, m: Machine, devices: Sequence[_Device],
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
