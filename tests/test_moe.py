"""Mixture-of-experts placement: the planner weighs a layer split against every layer on the GPU
with the experts of the first layers in RAM (llama.cpp's tensor buffer-type overrides), and the
runtime loads a generated MoE GGUF with those overrides and reports where llama.cpp put each
tensor. The Vulkan lane (tests/test_gpu.py) loads the same file on a GPU device."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import ggufgen
import published_moe
from localinfer import gguf
from localinfer.catalog import load_catalog
from localinfer.errors import InvalidRequest
from localinfer.hardware.profile import load_profile
from localinfer.loading import load_engine
from localinfer.planner import Candidate, PlanPrefs, plan
from localinfer.planner.machine import machine_view
from localinfer.planner.memory import device_memory
from localinfer.planner.speed import decode_reads
from localinfer.protocol import model_info_from, model_info_json
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.types import SamplingParams

PROFILES = Path(__file__).parent / "profiles"


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("moe") / "tiny-moe.gguf"
    path.write_bytes(ggufgen.moe_model())
    return path


def _catalog(name: str) -> Candidate:
    spec, variant = load_catalog().lookup(name)
    return Candidate.from_spec(spec, variant or spec.variant())


def test_the_header_gives_each_layers_experts(moe_path):
    c = Candidate.from_header(gguf.read_header(moe_path), name="tiny-moe")
    assert c.has_experts
    experts = 3 * 512 * 64 * 16 * 2  # gate, up, down x embd x n_ff x 16 experts x 2 bytes
    assert all(layer.expert_bytes == experts for layer in c.layers)
    assert all(layer.expert_read_bytes == experts // 16 for layer in c.layers)  # 1 of 16 used


def test_experts_in_ram_move_their_bytes_and_reads_to_the_host():
    c = _catalog("qwen3:30b-a3b")
    m = machine_view(load_profile(PROFILES / "desktop-rtx3060-32gb.json"), PlanPrefs())
    n = c.n_layers
    host0, gpu0 = device_memory(c, m, n + 1, 4096, 1)
    host, gpu = device_memory(c, m, n + 1, 4096, 1, n_cpu_moe=10)
    moved = sum(layer.expert_bytes for layer in c.layers[:10])
    assert gpu0 is not None and gpu is not None
    assert gpu0.weights_bytes - gpu.weights_bytes == moved
    assert host.weights_bytes - host0.weights_bytes == moved
    assert gpu.kv_bytes == gpu0.kv_bytes  # the KV cache stays with its layer on the GPU
    reads0, reads = decode_reads(c, n + 1, "f16"), decode_reads(c, n + 1, "f16", 10)
    read_moved = sum(layer.expert_read_bytes for layer in c.layers[:10])
    assert reads.cpu_weight_bytes - reads0.cpu_weight_bytes == pytest.approx(read_moved)
    # Layers already on the CPU have no experts to move.
    host_split, _ = device_memory(c, m, 20, 4096, 1, n_cpu_moe=10)
    assert host_split == device_memory(c, m, 20, 4096, 1)[0]


@pytest.mark.parametrize("name", ["qwen3:30b-a3b", "gpt-oss:20b"])
def test_a_moe_too_big_for_the_gpu_weighs_both_placements(name):
    hw = load_profile(PROFILES / "desktop-rtx3060-32gb.json")
    e = plan(hw, [_catalog(name)], PlanPrefs(n_ctx=8192, n_slots=1)).evaluations[0]
    split, experts = e.placements
    assert (split.n_cpu_moe, experts.n_gpu_layers) == (0, e.candidate.n_layers + 1)
    assert split.n_gpu_layers < e.candidate.n_layers + 1 and experts.n_cpu_moe > 0
    assert split.fits and experts.fits
    # Attention and the KV cache of every layer on the GPU read faster than whole layers on
    # the CPU: the experts in RAM decode faster (as llama-server's --n-cpu-moe users find).
    assert experts.decode_tps > split.decode_tps
    assert (e.n_gpu_layers, e.n_cpu_moe) == (experts.n_gpu_layers, experts.n_cpu_moe)
    assert e.gpu is not None and e.gpu.fits
    assert e.to_dict()["placements"][1]["label"] == f"experts of {e.n_cpu_moe} layers in RAM"


def test_a_moe_that_fits_or_a_dense_model_gets_one_placement():
    big = load_profile(PROFILES / "desktop-rtx4090-64gb.json")
    e = plan(big, [_catalog("qwen3:30b-a3b")], PlanPrefs(n_ctx=8192)).evaluations[0]
    assert (e.n_cpu_moe, e.placements) == (0, ())
    small = load_profile(PROFILES / "desktop-rtx3060-32gb.json")
    dense = plan(small, [_catalog("qwen3:32b")], PlanPrefs(n_ctx=8192)).evaluations[0]
    assert (dense.n_cpu_moe, dense.placements) == (0, ())
    unified = load_profile(PROFILES / "macbook-pro-m3max-64gb.json")  # one pool: no gain
    assert plan(unified, [_catalog("qwen3:30b-a3b")], PlanPrefs()).evaluations[0].n_cpu_moe == 0


def test_plan_shows_both_placements(home, capsys):
    from localinfer.cli import main

    assert main(["plan", "qwen3:30b-a3b-q4_k_m", "--hardware",
                 str(PROFILES / "desktop-rtx3060-32gb.json"), "--offline", "--ctx", "8192"]) == 0
    out = capsys.readouterr().out
    assert "Placements of qwen3:30b-a3b-q4_k_m weighed" in out
    assert "layer split" in out and "layers in RAM" in out and "chosen" in out
    assert "llama-server --n-cpu-moe" in out


def test_the_runtime_keeps_the_planned_experts_in_ram(moe_path):
    engine = load_engine(moe_path, LoadOptions(n_ctx=256, n_cpu_moe=3), name="tiny-moe")
    try:
        moved = {name for name, buft in engine.backend.overridden if buft.startswith("CPU")}
        assert moved == {f"blk.{i}.ffn_{part}_exps.weight" for i in range(3)
                         for part in ("gate", "up", "down")}
        info = engine.info
        assert info.n_cpu_moe == 3
        assert any(kind == "model" and size > 0 for _, kind, size in info.buffers)
        assert model_info_from(model_info_json(info)) == info  # crosses to the client whole
        tokens = engine.backend.tokenize("the a is", add_special=True)
        gen = engine.submit(tokens, SamplingParams(temperature=0, max_tokens=6))
        gen.result()
        assert gen.done is not None and gen.done.usage.completion_tokens == 6
    finally:
        engine.close()


def test_a_text_of_more_tokens_than_bytes_tokenizes(moe_path):
    """The tiny MoE's vocabulary spells most text in byte tokens ("▁" alone is three), so
    a prompt can have more tokens than bytes: the tokenizer asks llama.cpp again with room."""
    engine = load_engine(moe_path, LoadOptions(n_ctx=256), name="tiny-moe")
    try:
        text = "the a is of and to in it the a"
        tokens = engine.backend.tokenize(text, add_special=True)
        assert len(tokens) > len(text.encode()) + 8
        spelled = b"".join(engine.backend.token_bytes(t) for t in tokens[1:])
        assert spelled.decode().replace("▁", " ").strip() == text
    finally:
        engine.close()


def test_experts_in_ram_for_a_dense_model_are_refused_by_name(starter_path):
    with pytest.raises(InvalidRequest, match="n_cpu_moe 2: .* is not a mixture-of-experts"):
        load_engine(starter_path, LoadOptions(n_ctx=256, n_cpu_moe=2), name="gemma3:270m")


def test_options_for_carries_the_planned_placement(moe_path):
    from localinfer.config import Config
    from localinfer.loading import options_for

    header = gguf.read_header(moe_path)
    c = Candidate.from_header(header, name="tiny-moe")
    hw = _small_gpu_profile(c)
    options = options_for(header, Config(), hardware=hw, name="tiny-moe")
    chosen = plan(hw, [c], PlanPrefs(n_ctx=options.n_ctx, n_slots=1)).evaluations[0]
    assert options.n_cpu_moe == chosen.n_cpu_moe > 0
    assert options.n_gpu_layers == c.n_layers + 1


def _small_gpu_profile(c: Candidate, backend: str = "CUDA"):
    """A discrete GPU with room for all of ``c`` but the experts of its first two layers."""
    from localinfer.hardware.profile import GPUInfo

    base = load_profile(PROFILES / "desktop-rtx3060-32gb.json")
    m = machine_view(base, PlanPrefs())
    _, gpu = device_memory(c, m, c.n_layers + 1, 512, 1, n_cpu_moe=2)
    assert gpu is not None
    reserve = 512 * 2**20
    gib = (gpu.total_bytes + reserve + 1024) / 2**30
    small = GPUInfo(name="small GPU", vendor="nvidia", kind="discrete", vram_total_gib=gib,
                    vram_free_gib=gib, bandwidth_gbps=300.0, backends=(backend,))
    return dataclasses.replace(base, gpus=(small,), backends=("CPU", backend))


OUTCOMES = [published_moe.predict(row) for row in published_moe.load_rows()]


def test_the_published_rows_name_their_sources_and_build_their_models():
    rows = [o.row for o in OUTCOMES]
    assert len(rows) >= 8 and len({r.source for r in rows}) >= 4
    assert all(r.source.startswith("https://") and r.assumed and r.tool for r in rows)
    assert {r.model for r in rows} >= {"qwen3:30b-a3b", "gpt-oss:120b"}
    for r in rows:  # every placement is a real one: experts of at most every layer in RAM
        assert r.candidate.has_experts and 0 < r.n_cpu_moe <= r.candidate.n_layers


def test_the_prediction_against_published_n_cpu_moe_runs():
    """The planner's uncalibrated decode for each published placement (no constant was set on
    these rows): what it reaches today, as bench/moe_published.py prints it. The misses are
    known: the mcgyvr rigs give a STREAM triad figure for their RAM, which reads below what
    llama.cpp's expert reads reach (srv2 decodes 15 tok/s reading ~1.1 GB a token in RAM,
    17 GB/s, over a 13.3 GB/s triad), so every one of their rows is ~40% low; and one run
    decodes at 1.8 tok/s where its RAM reads ~30 (a 59 GiB file in 64 GB, through mmap)."""
    s = published_moe.summary(OUTCOMES)
    assert s["decode_median"] <= 0.45
    assert s["decode_within25"] >= 0.2
    first = OUTCOMES[0]  # the RTX 2080 run of llmfit#755: 36.7 measured, 39.7 predicted
    assert first.row.gpu.endswith("RTX 2080")
    assert first.decode_tps == pytest.approx(first.row.tg, rel=0.15)


def test_the_sweeps_follow_the_measured_slope():
    """Where the level misses (the host bandwidth given), the slope over N does not: on each
    machine with a sweep, measured/predicted stays within 25% from end to end."""
    by_machine: dict[tuple[str, str, float], list[float]] = {}
    for o in OUTCOMES:
        key = (o.row.gpu, o.row.cpu, o.row.machine.host_bandwidth_gbps)
        by_machine.setdefault(key, []).append(o.row.tg / o.decode_tps)
    sweeps = [ratios for ratios in by_machine.values() if len(ratios) >= 3]
    assert len(sweeps) >= 3
    assert all(max(r) / min(r) <= 1.25 for r in sweeps), sweeps


def test_the_plans_own_placement_fits_where_the_published_one_loaded():
    """The plan's own N (at 4096 tokens of context) against the fewest experts in RAM a
    publication loaded at that context: never fewer (a placement that would not load), at most
    five layers more (VRAM left unused)."""
    fewest = {"NVIDIA GeForce GTX 1660 SUPER": 37,  # mcgyvr srv1: 36 refuses at -c 4096
              "NVIDIA GeForce RTX 3060": 20}  # mcgyvr srv2: f16 KV; 16 and 14 refuse
    checked = 0
    for o in OUTCOMES:
        e = o.chosen
        assert e.n_gpu_layers == o.row.candidate.n_layers + 1 and e.n_cpu_moe > 0, o.row.what
        if o.row.gpu in fewest:
            assert fewest[o.row.gpu] <= e.n_cpu_moe <= fewest[o.row.gpu] + 5, o.row.what
            checked += 1
    assert checked >= 2


def test_prefill_with_experts_in_ram_is_a_known_miss():
    """Prefill with experts in RAM pays their copy to the GPU per 512-token batch at an assumed
    25 GB/s. Published: the Quadro RTX 5000 (PCIe 3.0, in a VM) reaches ~7.6 GB/s, so the plan
    is 3x high there; the RTX 4070 run of gpt-oss-120b prefills at 428 tok/s, which would need
    45 GB/s of copies, so llama.cpp did not copy those experts (the CPU computed them) and the
    plan is 2x low. A loose guard: within a factor of 3.5 both ways."""
    errors = [e for o in OUTCOMES if (e := o.prefill_error) is not None]
    assert len(errors) >= 5
    assert all(1 / 3.5 <= 1 + e <= 3.5 for e in errors), errors
