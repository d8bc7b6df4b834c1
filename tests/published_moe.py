"""Published runs of mixture-of-experts models with their experts in RAM
(tests/data/published_moe.csv) as planner inputs: each row's machine as a ``HardwareProfile``,
its model as a ``Candidate`` with the catalog's shapes (tests/data/published_moe_models.toml for
a model the catalog lacks) and the file size as published, and the planner's uncalibrated decode
and prefill for the published placement (every layer on the GPU, the experts of ``n_cpu_moe``
layers in RAM), with the plan's own choice beside it.

Shared by tests/test_moe.py (the guard) and bench/moe_published.py (the table).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from localinfer.catalog import load_catalog, parse_catalog
from localinfer.hardware.profile import CPUInfo, GPUInfo, HardwareProfile
from localinfer.planner import Candidate, Evaluation, PlanPrefs, plan
from localinfer.planner.machine import machine_view
from localinfer.planner.speed import predict_on

DATA = Path(__file__).parent / "data"
ROWS_CSV = DATA / "published_moe.csv"
MODELS_TOML = DATA / "published_moe_models.toml"
GIB = 2**30
ISA_FLAGS = {"avx512": ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"),
             "avx2": ("avx", "avx2", "fma", "f16c")}
PLAN_CTX = 4096
"""The context the plan's own choice is made for (the published runs used 4096 and up)."""


@dataclass(frozen=True)
class Row:
    gpu: str
    cpu: str
    model: str
    quant: str
    n_cpu_moe: int
    tg: float
    pp: float | None
    position: int
    tool: str
    build: str
    source: str
    assumed: str
    note: str
    machine: HardwareProfile
    candidate: Candidate

    @property
    def what(self) -> str:
        return f"{self.gpu} + {self.cpu}, {self.model} {self.quant}, --n-cpu-moe {self.n_cpu_moe}"


@dataclass(frozen=True)
class Outcome:
    row: Row
    decode_tps: float
    prefill_tps: float
    chosen: Evaluation
    """The plan for this machine and model at PLAN_CTX: its own placement."""

    @property
    def decode_error(self) -> float:
        return self.decode_tps / self.row.tg - 1

    @property
    def prefill_error(self) -> float | None:
        return self.prefill_tps / self.row.pp - 1 if self.row.pp else None


def _machine(r: dict[str, str]) -> HardwareProfile:
    cores, threads = int(r["cpu_cores"]), int(r["cpu_threads"])
    cpu = CPUInfo(r["cpu"], cores, max(cores, threads), float(r["cpu_ghz"]),
                  ISA_FLAGS[r["cpu_isa"]], threads)
    vram = float(r["vram_gib"])
    gpu = GPUInfo(r["gpu"], r["vendor"], "discrete", vram, vram * 0.95,
                  float(r["gpu_bandwidth_gbps"]), fp16_tflops=float(r["matrix_tflops"]),
                  backends=(r["backend"],))
    ram = float(r["ram_gib"])
    return HardwareProfile(
        ram_total_gib=ram, ram_available_gib=ram * 0.9, cpu=cpu, gpus=(gpu,),
        backends=("CPU", r["backend"]), host_bandwidth_gbps=float(r["host_bandwidth_gbps"]),
        bandwidth_source=r["bandwidth_source"])


def load_rows() -> list[Row]:
    catalog = parse_catalog(MODELS_TOML.read_text(), source=str(MODELS_TOML),
                            base=load_catalog())
    lines = [line for line in ROWS_CSV.read_text().splitlines() if not line.startswith("#")]
    rows = []
    for r in csv.DictReader(lines):
        spec, _ = catalog.lookup(r["model"])
        variant = replace(spec.variant(r["quant"]),
                          size_bytes=int(float(r["size_gib"]) * GIB), estimated=False)
        rows.append(Row(
            gpu=r["gpu"], cpu=r["cpu"], model=r["model"], quant=r["quant"],
            n_cpu_moe=int(r["n_cpu_moe"]), tg=float(r["tg"]),
            pp=float(r["pp"]) if r["pp"] else None, position=int(r["position"]),
            tool=r["tool"], build=r["build"], source=r["source"], assumed=r["assumed"],
            note=r["note"], machine=_machine(r), candidate=Candidate.from_spec(spec, variant)))
    return rows


def predict(row: Row) -> Outcome:
    """The uncalibrated figures for the published placement, and the plan's own choice."""
    c = row.candidate
    m = machine_view(row.machine, PlanPrefs())
    p = predict_on(c, m, c.n_layers + 1, row.position, n_cpu_moe=row.n_cpu_moe)
    result = plan(row.machine, [c], PlanPrefs(n_ctx=PLAN_CTX, n_slots=1, min_tps=0))
    return Outcome(row, p.decode_tps, p.prefill_tps, result.evaluations[0])


def summary(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """Median |error| and the share within +-25% for decode (and prefill where published)."""
    decode = [abs(o.decode_error) for o in outcomes]
    prefill = [abs(e) for o in outcomes if (e := o.prefill_error) is not None]
    return {
        "rows": len(decode),
        "decode_median": statistics.median(decode),
        "decode_within25": sum(e <= 0.25 for e in decode) / len(decode),
        "prefill_rows": len(prefill),
        "prefill_median": statistics.median(prefill) if prefill else 0.0,
        "prefill_within25": sum(e <= 0.25 for e in prefill) / len(prefill) if prefill else 0.0,
    }
