"""Mixture-of-experts placement: the planner weighs a layer split against every layer on the GPU
with the experts of the first layers in RAM (llama.cpp's tensor buffer-type overrides), and the
runtime loads a generated MoE GGUF with those overrides and reports where llama.cpp put each
tensor. The Vulkan lane (tests/test_gpu.py) loads the same file on a GPU device."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import ggufgen
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


def test_the_prediction_against_a_published_n_cpu_moe_run():
    """RTX 2080 8 GB + i9-10900X (quad-channel DDR4, ~102 GB/s measured), Qwen3-30B-A3B
    Q4_K_M, llama-server -ngl 99 --n-cpu-moe 36: 36.7 tok/s generation as the server measured
    it (https://github.com/AlexsJones/llmfit/pull/755). Predicted: 40.1 (+9%)."""
    from localinfer.hardware.profile import CPUInfo, GPUInfo, HardwareProfile
    from localinfer.planner.speed import predict_on

    c = _catalog("qwen3:30b-a3b-q4_k_m")
    hw = HardwareProfile(
        ram_total_gib=64, ram_available_gib=56, host_bandwidth_gbps=102,
        bandwidth_source="measured", backends=("CPU", "CUDA"),
        cpu=CPUInfo("Intel Core i9-10900X", physical_cores=10, logical_cores=20, ghz=3.7,
                    flags=("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl")),
        gpus=(GPUInfo(name="NVIDIA GeForce RTX 2080", vendor="nvidia", kind="discrete",
                      vram_total_gib=8, vram_free_gib=7.6, bandwidth_gbps=448),))
    predicted = predict_on(c, machine_view(hw, PlanPrefs()), c.n_layers + 1, 64, n_cpu_moe=36)
    assert predicted.decode_tps == pytest.approx(36.7, rel=0.15)
    chosen = plan(hw, [c], PlanPrefs(n_ctx=4096, n_slots=1)).evaluations[0]
    assert chosen.n_gpu_layers == c.n_layers + 1 and 30 <= chosen.n_cpu_moe <= 40
