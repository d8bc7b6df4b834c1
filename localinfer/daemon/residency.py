"""How much memory each model the daemon loads takes, and how much the machine gives to them
all: the planner's figures (weights + KV cache + compute buffers + runtime overhead on each
device; the budget is what is free before any model loads, less the reserve). The model
manager keeps models loaded side by side while their footprints fit the budget together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .. import gguf
from ..config import Config
from ..errors import ModelTooLarge
from ..hardware import HardwareProfile, probe
from ..hardware.rpc import parse_endpoints
from ..loading import model_config, options_for, worker_split
from ..planner import Candidate, memory_budget, plan
from ..progress import human_bytes
from ..selection import plan_prefs
from ..store import ResolvedModel


@dataclass(frozen=True)
class Footprint:
    """What one loaded model takes, in bytes, and how its layers are split."""

    ram_bytes: int
    vram_bytes: int = 0
    n_gpu_layers: int = 0
    n_layers_total: int = 1
    """Repeating layers + the output layer (llama.cpp's count for n_gpu_layers)."""

    @property
    def total_bytes(self) -> int:
        return self.ram_bytes + self.vram_bytes

    @property
    def processor(self) -> str:
        """Where it runs, as ``ollama ps`` says it: "100% CPU", "100% GPU", "40%/60% CPU/GPU"."""
        if self.n_gpu_layers <= 0 or not self.vram_bytes:
            return "100% CPU"
        if self.n_gpu_layers >= self.n_layers_total:
            return "100% GPU"
        gpu = round(100 * self.vram_bytes / self.total_bytes)
        return f"{100 - gpu}%/{gpu}% CPU/GPU"

    def to_json(self) -> dict[str, Any]:
        return {"ram_bytes": self.ram_bytes, "vram_bytes": self.vram_bytes,
                "total_bytes": self.total_bytes, "n_gpu_layers": self.n_gpu_layers,
                "n_layers_total": self.n_layers_total, "processor": self.processor}


@dataclass(frozen=True)
class MemoryBudget:
    """What the loaded models may take together."""

    ram_bytes: int
    vram_bytes: int = 0
    unified: bool = False
    """RAM and VRAM are one pool (Apple Silicon, integrated GPUs): both parts count in RAM."""

    def fits(self, footprints: list[Footprint]) -> bool:
        ram = sum(f.ram_bytes for f in footprints)
        vram = sum(f.vram_bytes for f in footprints)
        if self.unified:
            return ram + vram <= self.ram_bytes
        return ram <= self.ram_bytes and vram <= self.vram_bytes

    def too_large(self, name: str, need: Footprint) -> ModelTooLarge | None:
        """Why ``need`` can never fit, even with no other model loaded; None when it can."""
        if self.fits([need]):
            return None
        if self.unified or need.ram_bytes > self.ram_bytes:
            have, wanted, what = self.ram_bytes, need.ram_bytes, "RAM"
            if self.unified:
                wanted, what = need.total_bytes, "memory"
        else:
            have, wanted, what = self.vram_bytes, need.vram_bytes, "GPU memory"
        return ModelTooLarge(
            f"{name} needs {human_bytes(wanted)} of {what} (weights, KV cache and compute"
            f" buffers) but this machine can give models {human_bytes(have)} (what was free"
            " when the daemon started, less the reserve). Use a smaller quant or model, a"
            " smaller context (--ctx / options.num_ctx), or fewer --gpu-layers.")

    def to_json(self) -> dict[str, Any]:
        return {"ram_bytes": self.ram_bytes, "vram_bytes": self.vram_bytes,
                "unified": self.unified}


FootprintEstimate = Callable[[ResolvedModel, "int | None"], Footprint]
"""A model about to load (with a request's context, or None) -> what it will take (blocking:
it reads the file's header)."""
LargestContext = Callable[[ResolvedModel], int]
"""A model -> the largest context it fits this machine with alone (blocking): what a longer
request may reload it with (0: not known, the trained length counts)."""


class MemoryPlan:
    """The budget and each model's footprint, from a fixed budget and estimate (tests), or
    from the planner on this machine (``for_machine``)."""

    def __init__(self, budget: Callable[[], MemoryBudget], estimate: FootprintEstimate,
                 largest_context: LargestContext | None = None) -> None:
        self._budget_source = budget
        self._budget: MemoryBudget | None = None
        self._lock = threading.Lock()
        self.estimate = estimate
        self.largest_context: LargestContext = largest_context or (lambda model: 0)

    @property
    def budget(self) -> MemoryBudget:
        """Computed on first use (blocking: it may probe the machine), then fixed."""
        with self._lock:
            if self._budget is None:
                self._budget = self._budget_source()
            return self._budget

    @classmethod
    def fixed(cls, budget: MemoryBudget, estimate: FootprintEstimate,
              largest_context: LargestContext | None = None) -> MemoryPlan:
        return cls(lambda: budget, estimate, largest_context)

    @classmethod
    def for_machine(cls, config: Config, hardware: HardwareProfile | None = None
                    ) -> MemoryPlan:
        """The planner's figures with the settings the daemon loads models with
        (loading.engine_factory): the same placement, context and slots."""
        probed: list[HardwareProfile] = [hardware] if hardware is not None else []
        prefs = plan_prefs(config, n_slots=config.slots)

        def machine() -> HardwareProfile:
            if not probed:
                # Free memory before any model loads; no bandwidth measurement (it would load
                # every core while the daemon starts).
                probed.append(probe(measure_bandwidth=False))
            return probed[0]

        def budget() -> MemoryBudget:
            ram, vram, unified = memory_budget(machine(), prefs)
            return MemoryBudget(ram, vram, unified)

        def estimate(model: ResolvedModel, num_ctx: int | None) -> Footprint:
            header = gguf.read_header(model.path)
            if num_ctx and header.context_length:
                num_ctx = min(num_ctx, header.context_length)
            settings = model_config(config, model)
            options = options_for(header, settings.replace(ctx=num_ctx), n_slots=config.slots,
                                  hardware=machine(), name=model.name, path=model.path)
            endpoints = parse_endpoints(config.workers)
            split = worker_split(header, endpoints, hardware=machine(), config=settings,
                                 n_ctx=options.n_ctx, n_slots=options.n_slots,
                                 name=model.name) if endpoints else None
            if split is not None and split.fits and split.uses_workers:
                # Only this machine's part counts against its memory (a loaded model with
                # workers runs in a child process, runtime/isolated.py).
                local = split.devices[0]
                return Footprint(ram_bytes=local.memory.total_bytes,
                                 n_gpu_layers=split.n_gpu_layers,
                                 n_layers_total=header.block_count + 1)
            placed = plan(machine(), [Candidate.from_header(header, name=model.name)],
                          replace(plan_prefs(settings, n_slots=config.slots),
                                  n_ctx=options.n_ctx, n_slots=options.n_slots,
                                  n_gpu_layers=options.n_gpu_layers)).evaluations[0]
            return Footprint(ram_bytes=placed.host.total_bytes,
                             vram_bytes=placed.gpu.total_bytes if placed.gpu else 0,
                             n_gpu_layers=placed.n_gpu_layers,
                             n_layers_total=placed.n_layers_total)

        def largest_context(model: ResolvedModel) -> int:
            header = gguf.read_header(model.path)
            settings = model_config(config, model)
            planned = plan(machine(), [Candidate.from_header(header, name=model.name)],
                           replace(plan_prefs(settings), n_ctx=None)).choice
            return planned.ctx_max if planned is not None else 0

        return cls(budget, estimate, largest_context)
