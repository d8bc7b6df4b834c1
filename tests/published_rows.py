"""Published llama-bench rows (tests/data/published_llama_bench.csv) as planner inputs: each row's
machine as a ``HardwareProfile`` from its data sheet, its model file as a ``Candidate`` with the
size llama-bench printed, and the planner's uncalibrated decode and prefill predictions for it.

Shared by tests/test_planner_published.py (a loose guard) and bench/planner_published.py (the
report of the shares within +-10% / +-25%).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

from localinfer.catalog import parse_catalog
from localinfer.hardware.profile import CPUInfo, GPUInfo, HardwareProfile
from localinfer.planner import Candidate, PlanPrefs, plan

DATA = Path(__file__).parent / "data"
ROWS_CSV = DATA / "published_llama_bench.csv"
MODELS_TOML = DATA / "published_models.toml"
GIB = 2**30
VERIFIED = ("retrieved", "retrieved-copy")
OLD_BUILD_SOURCES = (
    "https://github.com/XiongjieDai/", "https://github.com/dmatora/",
    *(f"https://github.com/ggml-org/llama.cpp/{page}" for page in (
        "pull/5835", "pull/4766", "pull/5301", "pull/2917", "pull/2059", "pull/1556",
        "issues/4763", "issues/34")))
"""Publications of llama.cpp builds from before 2025 (2023-2024 tables, PRs and issues): their rows
are "old builds"; every other source ran a 2025-2026 build. The planner predicts for the build a
user runs today, so its constants are set on the fit rows of recent builds (Row.recent)."""
ISA_FLAGS = {"avx512": ("avx", "avx2", "fma", "avx512f"), "avx2": ("avx", "avx2", "fma"),
             "neon-i8mm": ("neon", "asimddp", "i8mm"), "neon-dotprod": ("neon", "asimddp")}


@dataclass(frozen=True)
class Row:
    device: str
    backend: str
    model: str
    quant: str
    tg128: float
    pp512: float | None
    role: str
    """"fit" (the planner's constants were fitted on it) or "held" (held out)."""
    verified: str
    """How the figures were checked: "retrieved" (read at ``source``, the publication itself) or
    "retrieved-copy" (read in a public copy at ``source`` of the publication ``note`` names)."""
    source: str
    note: str
    batch: str
    """The issue whose work collected it ("16", "38", "38b", "38c": the hold-out of recent
    builds, "38d": fit rows found with it, "38e": held rows collected after the 38c refit,
    "38f": held rows collected before the 38f prefill pass, "38g", "38h", "38i", "38j", "38k": held
    rows collected before the later decode and prefill passes, "38l": held rows collected after
    the 38k pass)."""
    machine: HardwareProfile
    candidate: Candidate

    @property
    def what(self) -> str:
        return f"{self.device} {self.backend}, {self.model} {self.quant}"

    @property
    def recent(self) -> bool:
        """A 2025-2026 llama.cpp build (not one of OLD_BUILD_SOURCES)."""
        return not any(self.source == old or (old.endswith("/") and self.source.startswith(old))
                       for old in OLD_BUILD_SOURCES)

    @property
    def fits(self) -> bool:
        """Sets constants: a fit row of a recent build, run with llama-bench (not another harness
        or Ollama's eval rate) on a PC host (not a GPU behind an SBC's PCIe lane), with the
        backend alone (not a build that runs it through llama.cpp's RPC layer)."""
        return (self.role == "fit" and self.recent and not self.sbc_host
                and "not llama-bench" not in self.note and "Ollama" not in self.note
                and "RPC" not in self.note)

    @property
    def apple(self) -> bool:
        return self.backend == "Metal"

    @property
    def sbc_host(self) -> bool:
        """A discrete GPU behind a single-board computer's PCIe lane (a Raspberry Pi, a RISC-V
        board): the host's driver path, which the profile does not describe, bounds it."""
        return self.note.startswith("host:") and any(
            board in self.note for board in ("Raspberry Pi", "SiFive"))

    @property
    def kind(self) -> str:
        """"cpu", "discrete" or "integrated" (every Apple GPU is integrated)."""
        if not self.machine.gpus:
            return "cpu"
        return self.machine.gpus[0].kind


@dataclass(frozen=True)
class Outcome:
    row: Row
    decode_tps: float
    prefill_tps: float
    reason: str
    """The plan's words about the backend (an immature backend says so)."""
    decode_range: tuple[float, float] = (0.0, 0.0)
    prefill_range: tuple[float, float] = (0.0, 0.0)
    """The plan's intervals around its figures."""

    @property
    def decode_inside(self) -> bool:
        return self.decode_range[0] <= self.row.tg128 <= self.decode_range[1]

    @property
    def prefill_inside(self) -> bool | None:
        pp = self.row.pp512
        return None if not pp else self.prefill_range[0] <= pp <= self.prefill_range[1]

    @property
    def decode_error(self) -> float:
        return self.decode_tps / self.row.tg128 - 1

    @property
    def prefill_error(self) -> float | None:
        return self.prefill_tps / self.row.pp512 - 1 if self.row.pp512 else None


def _machine(r: dict[str, str]) -> HardwareProfile:
    bandwidth = float(r["bandwidth_gbps"])
    if r["backend"] == "CPU":
        threads = int(r["cpu_threads"])
        cpu = CPUInfo(r["device"], threads, threads, float(r["cpu_ghz"]),
                      ISA_FLAGS.get(r["cpu_isa"], ()), threads, sockets=int(r["sockets"] or 1))
        return HardwareProfile(ram_total_gib=512, ram_available_gib=480, cpu=cpu,
                               host_bandwidth_gbps=bandwidth, bandwidth_source="spec")
    unified = r["kind"] == "integrated"
    vram = 96.0
    gpu = GPUInfo(r["device"], r["vendor"], r["kind"], vram, vram, bandwidth,
                  unified_memory=unified, fp16_tflops=float(r["matrix_tflops"] or 0),
                  backends=(r["backend"],))
    host, host_bw = CPUInfo("host", 8, 16, 4.0, ("avx", "avx2", "fma"), 8), 60.0
    if r["note"].startswith("host: Raspberry Pi"):
        # The board that drives the GPU (the planner reads its ISA: an ARM host's driver path).
        host, host_bw = CPUInfo("Raspberry Pi 5 (Cortex-A76 x4)", 4, 4, 2.4,
                                ("neon", "asimddp"), 4), 17.1
    elif r["note"].startswith("host: SiFive"):
        host, host_bw = CPUInfo("SiFive P550 (RISC-V x4)", 4, 4, 1.4, (), 4), 19.2
    return HardwareProfile(
        ram_total_gib=192, ram_available_gib=180, cpu=host,
        gpus=(gpu,), backends=("CPU", r["backend"]), host_bandwidth_gbps=host_bw,
        bandwidth_source="spec")


def load_rows() -> list[Row]:
    specs = parse_catalog(MODELS_TOML.read_text(), source=str(MODELS_TOML)).models
    lines = [line for line in ROWS_CSV.read_text().splitlines() if not line.startswith("#")]
    rows = []
    for r in csv.DictReader(lines):
        if r["verified"] not in VERIFIED:
            raise ValueError(f"{ROWS_CSV.name}: {r['device']} {r['model']} {r['quant']} is not"
                             f" verified against a retrieved source ({r['verified']!r})")
        spec = specs[r["model"]]
        variant = replace(spec.variant(r["quant"]), size_bytes=int(float(r["size_gib"]) * GIB),
                          estimated=False)
        rows.append(Row(
            device=r["device"], backend=r["backend"], model=r["model"], quant=r["quant"],
            tg128=float(r["tg128"]), pp512=float(r["pp512"]) if r["pp512"] else None,
            role=r["role"], verified=r["verified"], source=r["source"], note=r["note"],
            batch=r["batch"],
            machine=_machine(r),
            candidate=Candidate.from_spec(spec, variant)))
    return rows


def predict(row: Row) -> Outcome:
    """The plan's uncalibrated figures, with the placement the planner chooses (on the GPU rows
    it must be llama-bench's -ngl 99: test_planner_published checks it)."""
    result = plan(row.machine, [row.candidate], PlanPrefs(n_ctx=512, min_tps=0))
    choice = result.choice
    assert choice is not None, result.summary
    return Outcome(row, choice.decode_tps, choice.prefill_tps, result.summary,
                   choice.decode_range, choice.prefill_range)
