"""The planner: which model variant fits this machine, how to split it between GPU and CPU (or
across machines), and how fast it will run, with the reasons in numbers. Pure: data in, data
out, no I/O (but calibration.py and attention.py, which keep measured figures).

    plan(hardware, candidates, prefs) -> Plan

    machine.py      the fitted constants (GPUClass by backend and device class, the CPU's rates),
                    PlanPrefs, and a profile as the planner reads it (Machine, memory_budget)
    candidate.py    Candidate and LayerShape: one model file, from a GGUF header or the catalog
    memory.py       bytes per device: weights, KV cache, compute buffer (DeviceUse); the most
                    GPU layers that fit; the contexts tried (ctx_ladder) and those a longer
                    request may reload a model with (larger_contexts)
    speed.py        bytes read per decoded token (DecodeReads), the Roofline, predict()
    placement.py    one model across this machine and llama.cpp RPC workers (plan_split,
                    WorkerSplit)
    calibration.py  measured over predicted decode per machine, learnt from real runs;
                    after_reply(), which both front ends call after a reply (not loaded here:
                    it probes the hardware and reads GGUF headers)
    attention.py    flash attention and the physical batch of a CPU load, from this
                    machine's measurements of each set-up (``bench --prefill``; not loaded
                    here: a cache file, like calibration.py)
    selfcheck.py    `localinfer bench`'s measured decode and prefill against the plan and its
                    interval, kept per machine; `hw --report`'s anonymous JSON line

This module: ``plan()``, its result (``Plan``, an ``Evaluation`` per candidate) and the choice.
Every candidate is placed and predicted; with RPC workers in the profile it is also pooled
across them (placement.py), and kept pooled when that fits and decodes faster than this machine
alone, or only pooling fits.

Variant choice: among candidates that fit, the best quality (the model's published benchmark
score from models.toml, else one estimated from its parameters, x the share its quant keeps by
published perplexity, catalog.QUANT_QUALITY) whose predicted decode reaches ``min_tps``; if
none does, the fastest that fits; if none fits, no choice and a summary of what is missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from ..errors import InvalidRequest
from .candidate import Candidate, LayerShape, candidates_for_specs, estimated_score
from .machine import (
    GIB,
    GPUClass,
    Machine,
    PlanPrefs,
    calibration_ratio,
    gpu_class,
    interval,
    machine_view,
    matrix_tflops,
    memory_budget,
    quant_factor,
)
from .memory import (
    AGENT_CTX,
    CHAT_CHECKPOINTS,
    CPU_WINDOW_UBATCH,
    KV_ELEMENT_BYTES,
    MAX_AUTO_SLOTS,
    N_UBATCH,
    NOTED_SLOTS,
    POOLED_CTX,
    WINDOW_SHARE_MIN,
    DeviceUse,
    all_fit,
    ctx_ladder,
    device_memory,
    kv_bytes_per_element,
    kv_cells,
    kv_past_cap,
    larger_contexts,
    layer_kv_bytes,
    most_gpu_layers,
    physical_batch,
    shrinks_window_cache,
)
from .placement import SplitDevice, WorkerSplit, fastest_split, plan_split
from .speed import (
    DecodeReads,
    Prediction,
    Roofline,
    decode_bytes_per_token,
    decode_reads,
    predict,
    predict_on,
    roofline_for,
)

if TYPE_CHECKING:
    from ..hardware.profile import HardwareProfile

__all__ = [
    "AGENT_CTX", "CHAT_CHECKPOINTS", "CPU_WINDOW_UBATCH", "KV_ELEMENT_BYTES", "MAX_AUTO_SLOTS",
    "N_UBATCH", "WINDOW_SHARE_MIN", "Candidate", "DecodeReads", "DeviceUse", "Evaluation",
    "GPUClass", "LayerShape", "Placement", "Plan", "PlanPrefs", "Prediction", "Roofline",
    "SplitDevice", "WorkerSplit", "candidates_for_specs", "decode_bytes_per_token", "decode_reads",
    "estimated_score", "gpu_class", "kv_bytes_per_element", "kv_cells", "largest_context",
    "layer_kv_bytes", "matrix_tflops", "memory_budget", "physical_batch", "plan", "plan_split",
    "predict", "quant_factor", "roofline_for", "shrinks_window_cache", "smallest_file"
]


@dataclass(frozen=True)
class Placement:
    """One way to put a mixture-of-experts model on this machine's GPU, as the plan weighs it:
    a layer split (``n_cpu_moe`` 0), or every layer on the GPU with the expert tensors of the
    first ``n_cpu_moe`` layers in RAM."""

    n_gpu_layers: int
    n_cpu_moe: int
    decode_tps: float
    prefill_tps: float
    vram_bytes: int
    ram_bytes: int
    fits: bool

    @property
    def label(self) -> str:
        return (f"experts of {self.n_cpu_moe} layers in RAM" if self.n_cpu_moe
                else "layer split")


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
    ctx_max: int = 0
    """The largest context a longer request may reload the model with on this machine (the
    trained length or a power of two below it that fits, GPU layers or not); worked out for
    the choice only (``largest_context``), 0 for the others."""
    ctx_reason: str = ""
    """Why the choice has its context, in words (``context_reason``); "" for the others."""
    split: WorkerSplit | None = None
    """The layers across this machine and RPC workers, when the plan pools them (then
    ``n_gpu_layers`` is llama.cpp's count over every offload device, ``gpu`` this machine's)."""
    slots_note: str = ""
    """Why automatic slots stopped short of NOTED_SLOTS although more fit (the KV cap,
    ``memory.auto_kv_cap``); "" otherwise."""
    n_cpu_moe: int = 0
    """A mixture of experts: the first n_cpu_moe layers keep their expert tensors in RAM
    (llama.cpp's tensor buffer-type overrides; llama-server's ``--n-cpu-moe``)."""
    placements: tuple[Placement, ...] = ()
    """A mixture of experts too large for the GPU: the two placements weighed (the layer
    split, and the experts in RAM), the faster chosen."""

    @property
    def n_layers_total(self) -> int:
        return self.candidate.n_layers + 1

    @property
    def interval_backend(self) -> str:
        """The backend whose published rows set the intervals: the GPU's when it takes most of
        a token's time, else the CPU's."""
        ms = self.decode_ms
        on_gpu = self.split is not None or ms.get("gpu", 0.0) >= ms.get("cpu", 0.0)
        if self.gpu_backend and on_gpu:
            return self.gpu_backend
        return "CPU"

    @property
    def decode_range(self) -> tuple[float, float]:
        """The decode rate's interval (machine.DECODE_INTERVAL: ~80% of the published rows of
        this backend fell inside it)."""
        low, high = interval(self.interval_backend, "decode")
        return self.decode_tps * low, self.decode_tps * high

    @property
    def prefill_range(self) -> tuple[float, float]:
        low, high = interval(self.interval_backend, "prefill")
        return self.prefill_tps * low, self.prefill_tps * high

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
            "decode_tps_range": None if c.embedding_only else [
                round(v, 2) for v in self.decode_range],
            "embedding_only": c.embedding_only,
            "prefill_tps": round(self.prefill_tps, 1),
            "prefill_tps_range": [round(v, 1) for v in self.prefill_range],
            "decode_ms": {k: round(v, 3) for k, v in self.decode_ms.items()},
            "calibration": self.calibration, "verdict": self.verdict, "reason": self.reason,
            "ctx_max": self.ctx_max or None, "ctx_reason": self.ctx_reason or None,
            "slots_note": self.slots_note or None,
            "split": self.split.to_dict() if self.split else None,
            "n_cpu_moe": self.n_cpu_moe,
            "placements": [{**asdict(p), "label": p.label, "decode_tps": round(p.decode_tps, 2),
                            "prefill_tps": round(p.prefill_tps, 1)} for p in self.placements],
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


def plan(hardware: HardwareProfile, candidates: Sequence[Candidate],
         prefs: PlanPrefs | None = None) -> Plan:
    """Place and predict every candidate, and choose one. Raises InvalidRequest for a
    context no candidate can take."""
    prefs = prefs or PlanPrefs()
    if not candidates:
        raise InvalidRequest("there is nothing to plan: no candidate models.")
    _check_prefs(prefs, candidates)
    machine = machine_view(hardware, prefs)
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


def _evaluate(c: Candidate, hw: HardwareProfile, m: Machine, prefs: PlanPrefs) -> Evaluation:
    slots = prefs.n_slots or 1
    note = ""
    ladder = ctx_ladder(c, prefs)
    if prefs.n_ctx is not None and c.context_length and prefs.n_ctx > c.context_length:
        host, gpu = device_memory(c, m, 0, c.context_length, slots)
        return _verdict(c, m, prefs, False, 0, prefs.n_ctx, slots, host, gpu, "context",
                        f"trained for {c.context_length} tokens, less than the"
                        f" {prefs.n_ctx} asked")

    # The bottom rung first: whether the model fits at all, and how many layers the GPU
    # takes with the least context (a longer default never moves layers off the GPU).
    k_floor, host, gpu = _placement(c, m, prefs, ladder[-1], slots)
    if not all_fit(host, gpu):
        return _verdict(c, m, prefs, False, k_floor, ladder[-1], slots, host, gpu, "too big",
                        _missing(c, m, prefs, host, gpu, ladder[-1]))
    chosen = (ladder[-1], k_floor, host, gpu)
    fits_slower = None  # the largest rung that fits only with layers moved off the GPU
    for n_ctx in ladder[:-1]:
        k, host, gpu = _placement(c, m, prefs, n_ctx, slots)
        if all_fit(host, gpu) and k >= k_floor:
            chosen = (n_ctx, k, host, gpu)
            break
        if all_fit(host, gpu) and fits_slower is None:
            fits_slower = (n_ctx, k)
    n_ctx, k, host, gpu = chosen
    if n_ctx != ladder[0] and fits_slower is not None:
        note = (f"context {n_ctx} (at {fits_slower[0]} only {fits_slower[1]}/{c.n_layers + 1}"
                f" layers fit the GPU, not {k})")
    elif n_ctx != ladder[0]:
        note = f"context {n_ctx} (the default {ladder[0]} does not fit)"
    slots_note = ""
    if prefs.n_slots is None:
        slots, k, host, gpu, slots_note = _auto_slots(c, m, prefs, ladder, n_ctx, k, host, gpu)
    evaluation = replace(_verdict(c, m, prefs, True, k, n_ctx, slots, host, gpu, "fits", note),
                         slots_note=slots_note)
    return _experts_in_ram(evaluation, m, prefs)


def _auto_slots(c: Candidate, m: Machine, prefs: PlanPrefs, ladder: list[int], n_ctx: int,
                k: int, host: DeviceUse, gpu: DeviceUse | None
                ) -> tuple[int, int, DeviceUse, DeviceUse | None, str]:
    """As many slots (up to MAX_AUTO_SLOTS) as fit without moving layers off the GPU and
    keep the KV cache within AUTO_KV_SHARE of each device (``kv_past_cap``); and, when that
    held them below NOTED_SLOTS, why: what more would take, and the context at which
    NOTED_SLOTS would stay within it."""
    past: tuple[int, str] | None = None  # the most slots that fit, but past the cap
    chosen = (1, k, host, gpu)
    for more in range(MAX_AUTO_SLOTS, 1, -1):
        k2, host2, gpu2 = _placement(c, m, prefs, n_ctx, more)
        if k2 < k or not all_fit(host2, gpu2):
            continue
        over = kv_past_cap(host2, gpu2, m.unified)
        if not over:
            chosen = (more, k2, host2, gpu2)
            break
        if more <= NOTED_SLOTS:
            past = past or (more, over)
    if past is None:
        return (*chosen, "")
    slots = chosen[0]
    note = (f"{slots} slot{'s' if slots > 1 else ''}: {past[0]} of {n_ctx} tokens would put"
            f" {past[1]}; --slots {past[0]} asks for them")
    for smaller in (ctx for ctx in ladder if ctx < n_ctx):
        k3, host3, gpu3 = _placement(c, m, prefs, smaller, NOTED_SLOTS)
        if k3 >= k and all_fit(host3, gpu3) and not kv_past_cap(host3, gpu3, m.unified):
            note += f", or --ctx {smaller} fits {NOTED_SLOTS} slots within it"
            break
    return (*chosen, note)


def _experts_in_ram(e: Evaluation, m: Machine, prefs: PlanPrefs) -> Evaluation:
    """A mixture of experts whose layers do not all fit a discrete GPU: weigh the layer split
    against every layer on the GPU with the experts of as few leading layers as needed in RAM
    (attention, shared tensors and the KV cache stay on the GPU), and keep the faster decode."""
    c = e.candidate
    n = c.n_layers
    if (not c.has_experts or m.gpu is None or m.unified or e.n_gpu_layers > n
            or prefs.n_gpu_layers is not None):
        return e
    for n_cpu_moe in range(1, n + 1):
        host, gpu = device_memory(c, m, n + 1, e.n_ctx, e.n_slots, n_cpu_moe)
        if all_fit(host, gpu):
            break
    else:
        return e
    experts = _verdict(c, m, prefs, True, n + 1, e.n_ctx, e.n_slots, host, gpu, "fits",
                       e.reason, n_cpu_moe=n_cpu_moe)
    placements = tuple(
        Placement(x.n_gpu_layers, x.n_cpu_moe, x.decode_tps, x.prefill_tps,
                  x.gpu.total_bytes if x.gpu else 0, x.host.total_bytes, x.fits)
        for x in (e, experts))
    best = experts if experts.decode_tps > e.decode_tps else e
    return replace(best, placements=placements)


def _placement(c: Candidate, m: Machine, prefs: PlanPrefs, n_ctx: int, slots: int
               ) -> tuple[int, DeviceUse, DeviceUse | None]:
    if prefs.n_gpu_layers is not None and m.gpu is not None:
        k = c.n_layers + 1 if prefs.n_gpu_layers < 0 else min(prefs.n_gpu_layers,
                                                               c.n_layers + 1)
        host, gpu = device_memory(c, m, k, n_ctx, slots)
        return k, host, gpu
    return most_gpu_layers(c, m, n_ctx, slots)


def _verdict(c: Candidate, m: Machine, prefs: PlanPrefs, fits: bool, k: int, n_ctx: int,
             slots: int, host: DeviceUse, gpu: DeviceUse | None, verdict: str, reason: str,
             n_cpu_moe: int = 0) -> Evaluation:
    k = k if m.gpu is not None else 0
    short = predict_on(c, m, k, min(prefs.decode_position, n_ctx), n_cpu_moe)
    full = predict_on(c, m, k, n_ctx, n_cpu_moe)
    ratio = calibration_ratio(prefs, short.key)
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
        gpu_backend=m.gpu_backend if k else None, ctx_note=note, n_cpu_moe=n_cpu_moe,
    )


def _with_workers(e: Evaluation, hw: HardwareProfile, m: Machine, prefs: PlanPrefs
                  ) -> Evaluation:
    """The candidate pooled across this machine and the workers when that fits and decodes
    faster than this machine alone (or when only pooling fits); else ``e``, this machine's."""
    c = e.candidate
    if c.embedding_only:
        return e
    split = None
    for n_ctx in ctx_ladder(c, prefs, POOLED_CTX):
        split = fastest_split(c, hw, m, prefs, n_ctx, prefs.n_slots or 1, require_workers=True)
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
    ladder = ctx_ladder(c, prefs, POOLED_CTX)
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
        calibration=calibration_ratio(prefs, (m.gpu_backend or "") if gpu else "CPU"),
        verdict=verdict, reason=reason, gpu_backend=m.gpu_backend if gpu else None,
        ctx_note=note, split=split)


def _compare_alone(result: Plan, alone: list[Evaluation], prefs: PlanPrefs, m: Machine,
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
    split = fastest_split(choice.candidate, hw, m, prefs, choice.n_ctx, choice.n_slots,
                          require_workers=True)
    if not split.fits:
        return result
    workers = ", ".join(dict.fromkeys(d.endpoint for d in split.remote_devices if d.gpu_layers))
    return replace(result, summary=result.summary + (
        f" The workers are left out: pooled with {workers} it would decode at"
        f" ~{split.decode_tps:.1f} tok/s (network {split.network_ms:.1f} ms per token)."))


def _missing(c: Candidate, m: Machine, prefs: PlanPrefs, host: DeviceUse,
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
            if all_fit(h2, g2):
                return text + f"; fits with --ctx {ctx}"
            ctx //= 2
    return text


def _choose(evaluations: list[Evaluation], prefs: PlanPrefs, m: Machine,
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
        if not choice.candidate.embedding_only and choice.split is None:
            ctx_max = largest_context(choice.candidate, m, prefs, choice.n_ctx)
            choice = replace(choice, ctx_max=ctx_max,
                             ctx_reason=context_reason(choice, prefs, ctx_max))
        evaluations = [choice if e.candidate is choice.candidate else _explain(e, choice)
                       for e in evaluations]
    return Plan(choice=choice, evaluations=tuple(evaluations), summary=summary, prefs=prefs)


def largest_context(c: Candidate, m: Machine, prefs: PlanPrefs, n_ctx: int) -> int:
    """The largest context ``c`` fits this machine with (its trained length, a power of two
    below it, or a default rung; at ``prefs.n_slots`` or one slot, GPU layers as they come),
    ``n_ctx`` (the one it is planned with) when none larger does: what a longer request may
    reload the model with."""
    slots = prefs.n_slots or 1
    for ctx in larger_contexts(c) + ctx_ladder(c, replace(prefs, n_ctx=None)):
        if ctx <= n_ctx:
            break
        if all_fit(*_placement(c, m, prefs, ctx, slots)[1:]):
            return ctx
    return n_ctx


def context_reason(e: Evaluation, prefs: PlanPrefs, ctx_max: int) -> str:
    """Why ``e`` (a choice) has its context, with the KV cache it takes and the decode at a
    full context: "32768 tokens per request: the model's trained length; KV cache 489 MiB for 4
    slots; ..."."""
    c = e.candidate
    trained = c.context_length
    if prefs.n_ctx is not None:
        why = "as asked (the ctx setting)"
    elif e.ctx_note:
        why = e.ctx_note.split(" (", 1)[1].rstrip(")") if " (" in e.ctx_note else e.ctx_note
    elif trained and e.n_ctx == trained:
        why = "the model's trained length"
    elif not trained:
        why = f"the file names no trained length: {e.n_ctx} at most"
    else:
        why = f"what coding agents send (trained for {trained})"
    kv = e.host.kv_bytes + (e.gpu.kv_bytes if e.gpu else 0)
    slots = f" for {e.n_slots} slots" if e.n_slots > 1 else ""
    text = f"{e.n_ctx} tokens per request: {why}; KV cache {kv / 2**20:,.0f} MiB{slots}"
    if ctx_max > e.n_ctx:
        text += f"; a longer request reloads it with up to {ctx_max}"
    if e.decode_tps_full and e.decode_tps_full < e.decode_tps:
        text += (f"; decode ~{e.decode_tps_full:.1f} tok/s with the context full"
                 f" ({e.decode_tps:.1f} near its start)")
    if e.slots_note:
        text += f"; {e.slots_note}"
    return text


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
