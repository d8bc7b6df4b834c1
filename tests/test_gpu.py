"""The GPU path on a real GPU backend. The Vulkan lane (.ci/gpu-lane) runs these on a Vulkan
build of llama-cpp-python and Mesa's llvmpipe, a conformant Vulkan driver on the CPU
(GGML_VK_VISIBLE_DEVICES=0 shows it to llama.cpp): slow, and every offload path real. Where the
build has no GPU device they are skipped (tests/conftest.py), and fail instead under
LOCALINFER_GPU_LANE=1. What only a real GPU shows (speeds, VRAM pressure from other processes,
the driver's own reserve) is not asserted here: docs/hardware.md lists it."""

from __future__ import annotations

import dataclasses
import os
import tempfile

import ollama
import pytest

import ggufgen
from daemon_util import serve
from localinfer import gguf
from localinfer.bench.engine_bench import first_divergence
from localinfer.config import Config
from localinfer.hardware.profile import GPUInfo
from localinfer.loading import engine_factory, load_engine, options_for
from localinfer.planner import Candidate, PlanPrefs, plan
from localinfer.planner.machine import machine_view
from localinfer.planner.memory import device_memory
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.llama.tensor_placement import on_host
from localinfer.runtime.types import SamplingParams
from localinfer.store import ModelStore
from memlimit import address_space_limit

pytestmark = [pytest.mark.gpu, pytest.mark.model]

GIB = 2**30
PROMPT = "The capital of France is Paris. The capital of Germany is"
N_CTX = 512


@pytest.fixture(scope="module")
def gpu():
    from localinfer.runtime.llama import devices

    return next(d for d in devices() if d.kind in ("gpu", "igpu"))


@pytest.fixture(scope="module")
def cpu_engine(starter_path):
    engine = load_engine(starter_path, LoadOptions(n_ctx=N_CTX, n_slots=2, n_gpu_layers=0),
                         name="gemma3:270m", family="gemma3")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def gpu_engine(starter_path):
    """The starter with every layer (and the output layer) on the GPU, two slots."""
    engine = load_engine(starter_path, LoadOptions(n_ctx=N_CTX, n_slots=2, n_gpu_layers=-1),
                         name="gemma3:270m", family="gemma3")
    yield engine
    engine.close()


def _greedy(engine, prompt: str = PROMPT, max_tokens: int = 12, **params):
    tokens = engine.backend.tokenize(prompt, add_special=True)
    engine.clear_cache()
    run = engine.submit(tokens, SamplingParams(temperature=0, max_tokens=max_tokens,
                                               speculative=False, **params))
    run.result()
    return run


def _buffers(info, kind: str, *, gpu: bool) -> int:
    return sum(size for device, k, size in info.buffers if k == kind
               and gpu != (device.startswith("CPU") or device.endswith("_Host")))


# --- the device, as llama.cpp lists it ------------------------------------------------------
def test_the_device_and_its_memory_come_from_llama_cpp(gpu, home):
    from localinfer.cli.plan import hardware_lines
    from localinfer.hardware import probe

    hw = probe(measure_bandwidth=False)
    assert "Vulkan" in hw.backends and "Vulkan" in hw.build_backends and hw.can_offload
    [(found, backend)] = [(g, b) for g, b in hw.usable_gpus() if g.name == gpu.description]
    assert backend == "Vulkan"
    assert found.vram_total_gib == round(gpu.memory_total / GIB, 2) > 0
    if "llvmpipe" in gpu.description:  # Mesa's CPU driver: the host's memory and bandwidth
        assert found.unified_memory and found.kind == "integrated"
    lines = hardware_lines(hw)
    assert any(label == "GPU" and gpu.description in text and "usable via Vulkan" in text
               for label, text in lines)
    assert not any("CPU-only" in note for note in hw.notes)


def test_plan_puts_the_starter_on_the_gpu(gpu, home, capsys):
    from localinfer.cli import main

    assert main(["plan", "gemma3:270m", "--offline", "--ctx", str(N_CTX)]) == 0
    out = capsys.readouterr().out
    assert f"{gpu.description}" in out and "via Vulkan" in out
    assert "19/19" in out  # every layer and the output layer


# --- the same text with 0, half and all layers offloaded ----------------------------------------
def test_greedy_text_is_the_same_with_none_half_and_all_layers_offloaded(
        starter_path, cpu_engine, gpu_engine):
    from localinfer.tui.figures import placement

    n_layers = cpu_engine.info.n_layers
    reference = _greedy(cpu_engine)
    assert cpu_engine.info.n_gpu_layers == 0
    assert _buffers(cpu_engine.info, "model", gpu=True) == 0
    assert _buffers(cpu_engine.info, "KV", gpu=True) == 0
    half = load_engine(starter_path, LoadOptions(n_ctx=N_CTX, n_gpu_layers=n_layers // 2),
                       name="gemma3:270m", family="gemma3")
    try:
        assert half.info.n_gpu_layers == n_layers // 2  # as llama.cpp reported it
        assert half.info.gpu_backend == "Vulkan"
        assert 0 < _buffers(half.info, "model", gpu=True) < _buffers(gpu_engine.info, "model",
                                                                      gpu=True)
        for engine in (half, gpu_engine):
            run = _greedy(engine)
            assert run.request.prompt == reference.request.prompt
            divergence = first_divergence(cpu_engine, reference, run)
            assert divergence is None or divergence.near_tie, (engine.info.n_gpu_layers,
                                                               divergence)
    finally:
        half.close()
    assert gpu_engine.info.n_gpu_layers == n_layers + 1
    # The chat's status line says where the layers are.
    assert placement(gpu_engine.info) == f"GPU {n_layers + 1}/{n_layers + 1} layers (Vulkan)"


# --- the planner's split and memory against what llama.cpp loads ---------------------------------
def _gpu_profile(gpu, vram_bytes: int):
    """This machine with its GPU as a discrete card of ``vram_bytes`` free (after the
    planner's reserve): a hardware profile with a VRAM budget."""
    from localinfer.hardware import probe

    hw = probe(measure_bandwidth=False)
    gib = vram_bytes / GIB
    card = GPUInfo(name=gpu.description, vendor="other", kind="discrete", vram_total_gib=gib,
                   vram_free_gib=gib, bandwidth_gbps=100.0, backends=("Vulkan",))
    return dataclasses.replace(hw, gpus=(card,))


def _with_reserve(budget: int, prefs: PlanPrefs) -> int:
    """The free VRAM that leaves ``budget`` (and a little) after the planner's reserve."""
    return max(budget + prefs.vram_reserve_min_bytes,
               int(budget / (1 - prefs.vram_reserve_fraction))) + 2**16


def test_the_planners_split_for_a_vram_budget_is_what_llama_cpp_loads(gpu, starter_path, home):
    header = gguf.read_header(starter_path)
    c = Candidate.from_header(header, name="gemma3:270m")
    config = Config(ctx=N_CTX, slots=1)
    prefs = PlanPrefs(n_ctx=N_CTX, n_slots=1)
    # A budget for about half the layers: what 10 layers take on the GPU, plus the reserve.
    _, want = device_memory(c, machine_view(_gpu_profile(gpu, 64 * GIB), prefs), 10, N_CTX, 1)
    assert want is not None
    hw = _gpu_profile(gpu, _with_reserve(want.total_bytes, prefs))
    chosen = plan(hw, [c], prefs).evaluations[0]
    assert 0 < chosen.n_gpu_layers < c.n_layers + 1
    options = options_for(header, config, hardware=hw, name="gemma3:270m")
    assert options.n_gpu_layers == chosen.n_gpu_layers
    engine = load_engine(starter_path, options, name="gemma3:270m", family="gemma3")
    try:
        info = engine.info
        assert info.n_gpu_layers == chosen.n_gpu_layers  # llama.cpp's own count
        assert chosen.gpu is not None
        weights = _buffers(info, "model", gpu=True)
        kv = _buffers(info, "KV", gpu=True)
        allocated = info.gpu_bytes
        estimate = chosen.gpu.total_bytes - chosen.gpu.overhead_bytes
        assert weights == pytest.approx(chosen.gpu.weights_bytes, rel=0.10), info.buffers
        assert kv == pytest.approx(chosen.gpu.kv_bytes, rel=0.10), info.buffers
        assert allocated == pytest.approx(estimate, rel=0.10), (info.buffers, chosen.gpu)
    finally:
        engine.close()


# --- flash attention, a quantized KV cache, speculation and batching on the GPU ------------
def test_flash_attention_and_a_q8_0_cache_on_the_gpu(gpu, starter_path, cpu_engine, gpu_engine):
    engine = load_engine(starter_path, LoadOptions(n_ctx=N_CTX, n_gpu_layers=-1, kv_type="q8_0",
                                                   flash_attn=True),
                         name="gemma3:270m", family="gemma3")
    try:
        assert engine.info.flash_attn is True and engine.info.kv_type == "q8_0"
        f16 = _buffers(gpu_engine.info, "KV", gpu=True) / gpu_engine.info.n_slots
        q8 = _buffers(engine.info, "KV", gpu=True)
        assert q8 == pytest.approx(f16 * 34 / 64, rel=0.05)  # 34 bytes per 32 against 64
        run = _greedy(engine, max_tokens=4)
        assert run.done is not None and run.done.usage.completion_tokens == 4
    finally:
        engine.close()


def test_speculation_and_batching_with_offloaded_layers(gpu_engine):
    listing = "apples, pears, plums, apples, pears, plums, apples, pears, plums, apples,"
    plain = _greedy(gpu_engine, listing, max_tokens=16)
    gpu_engine.clear_cache()
    tokens = gpu_engine.backend.tokenize(listing, add_special=True)
    drafted = gpu_engine.submit(tokens, SamplingParams(temperature=0, max_tokens=16,
                                                       speculative=True))
    done = drafted.result()
    divergence = first_divergence(gpu_engine, plain, drafted)
    assert divergence is None or divergence.near_tie, divergence
    assert done.timings.accepted_tokens > 0
    # Two sequences in one batch decode as each does alone.
    prompts = [PROMPT, "Once upon a time, a fox"]
    solo = [_greedy(gpu_engine, p, max_tokens=6) for p in prompts]
    gpu_engine.clear_cache()
    together = [gpu_engine.submit(gpu_engine.backend.tokenize(p, add_special=True),
                                  SamplingParams(temperature=0, max_tokens=6,
                                                 speculative=False)) for p in prompts]
    for run in together:
        run.result()
    for alone, batched in zip(solo, together, strict=True):
        divergence = first_divergence(gpu_engine, alone, batched)
        assert divergence is None or divergence.near_tie, divergence


# --- an RPC worker beside this machine's GPU ------------------------------------------------
def test_an_rpc_worker_beside_the_local_gpu_writes_the_local_text(gpu, starter_path,
                                                                  cpu_engine, monkeypatch):
    from localinfer.bench.editor_workload import start_worker
    from localinfer.hardware import probe
    from localinfer.loading import with_workers

    # The worker lends its CPU (llvmpipe hidden from it); both sides keep plain CPU buffers.
    monkeypatch.setenv("LOCALINFER_LLAMA_EXTRA_BUFTS", "0")
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    env["LOCALINFER_HOME"] = tempfile.mkdtemp(prefix="li-worker-")
    proc, endpoint = start_worker(1, env)
    try:
        options = with_workers(LoadOptions(n_ctx=N_CTX), gguf.read_header(starter_path),
                               (endpoint,), hardware=probe(measure_bandwidth=False),
                               config=Config(layer_split="6,6,6"))
        assert options.local_gpu and options.tensor_split == (6.0, 7.0)
        engine = load_engine(starter_path, options, name="gemma3:270m",
                             family="gemma3").wait_ready()
        try:
            layers = dict(engine.info.split)
            assert list(layers.values()) == [6, 6, 7]  # the output head on the GPU
            assert list(layers)[1] == f"{endpoint} #0" and list(layers)[2] == gpu.name
            reference = _greedy(cpu_engine)
            run = _greedy(engine)
            divergence = first_divergence(cpu_engine, reference, run)
            assert divergence is None or divergence.near_tie, divergence
        finally:
            engine.close()
    finally:
        proc.kill()
        proc.wait(10)


# --- the daemon: /api/ps and ps show the GPU; running out of GPU memory ------------------------
def test_the_daemon_shows_the_gpu_and_its_allocations(gpu, starter_path):
    from localinfer.session import processor_text

    with serve(engine_factory(Config(ctx=N_CTX, gpu_layers=-1), n_slots=1)) as d:
        client = ollama.Client(host=d.url)
        out = client.generate(model="gemma3:270m", prompt=PROMPT, raw=True,
                              options={"num_predict": 4, "temperature": 0})
        assert out.eval_count == 4
        [running] = client.ps().models
        [entry] = d.manager.loaded.values()
        info = entry.engine.info
        assert info.gpu_bytes > 0 and running.size_vram > 0
        if entry.footprint is None:  # no memory plan: llama.cpp's own figures
            assert running.size_vram == info.gpu_bytes
        with d.uds() as c:
            status = c.get("/localinfer/status").json()
        [loaded] = status["loaded"]
        assert loaded["info"]["gpu_backend"] == "Vulkan"
        assert processor_text(loaded["info"], loaded.get("memory")).endswith("(Vulkan)")


def test_out_of_gpu_memory_at_load_is_a_clear_error_and_the_daemon_keeps_serving(
        gpu, starter_path, home, tmp_path):
    big = tmp_path / "zero.gguf"
    size = ggufgen.write_zero_model(big)  # ~930 MiB of F16 zeros in a sparse file
    ModelStore().add(big, name="zero:1b", link=True)
    factory = engine_factory(Config(ctx=N_CTX, gpu_layers=-1), n_slots=1)
    with serve(factory, max_loaded=2) as d:
        client = ollama.Client(host=d.url)

        def generate(model: str) -> str:
            return client.generate(model=model, prompt=PROMPT, raw=True,
                                   options={"num_predict": 6, "temperature": 0}).response

        before = generate("gemma3:270m")
        [held] = d.manager.loaded.values()
        # Room for llama.cpp to map the big file and 256 MiB more, less than its weights on
        # the GPU: the weights' device buffer cannot be allocated (llvmpipe mallocs it).
        with address_space_limit(size + 256 * 2**20), pytest.raises(ollama.ResponseError) as e:
            generate("zero:1b")
        error = e.value
        assert error.status_code == 500
        assert "out of GPU memory loading zero.gguf" in error.error, error.error
        assert f"MiB on {gpu.name} ({gpu.description}" in error.error  # what, where, how much
        asked = float(error.error.split("allocate ")[1].split(" MiB")[0])
        assert 0.9 * size / 2**20 < asked < size / 2**20
        assert "for its weights, with 9/9 layers on the GPU" in error.error
        assert "Put fewer layers on the GPU (e.g. --gpu-layers 4" in error.error
        # Still serving the model it had, the same engine, the same text.
        assert [m.model for m in client.ps().models] == [held.name]
        assert generate("gemma3:270m") == before
        assert list(d.manager.loaded.values()) == [held]


# --- a mixture of experts with its experts in RAM -------------------------------------------
MOE_PROMPT = "the a is of and to in it the a"


def test_a_generated_moe_loads_with_the_planned_experts_in_ram_and_decodes(gpu, tmp_path, home):
    path = tmp_path / "tiny-moe.gguf"
    path.write_bytes(ggufgen.moe_model())
    header = gguf.read_header(path)
    c = Candidate.from_header(header, name="tiny-moe")
    prefs = PlanPrefs(n_ctx=256, n_slots=1)
    # A GPU with room for everything but the experts of the first two layers.
    m = machine_view(_gpu_profile(gpu, 64 * GIB), prefs)
    _, want = device_memory(c, m, c.n_layers + 1, 256, 1, n_cpu_moe=2)
    assert want is not None
    hw = _gpu_profile(gpu, _with_reserve(want.total_bytes, prefs))
    chosen = plan(hw, [c], prefs).evaluations[0]
    assert (chosen.n_gpu_layers, chosen.n_cpu_moe) == (c.n_layers + 1, 2), chosen.placements
    options = options_for(header, Config(ctx=256, slots=1), hardware=hw, name="tiny-moe")
    assert (options.n_gpu_layers, options.n_cpu_moe) == (c.n_layers + 1, 2)
    # Flash attention off: with it, ggml-vulkan on llvmpipe segfaults in the driver's queue
    # thread when a decode of several rows follows a one-row decode (the engine's warm-up)
    # and has to grow flash attention's split-k scratch buffer in mid-graph; this llama-shaped
    # model (head size 128) hits it, dense or MoE, the starter does not (docs/hardware.md).
    options = dataclasses.replace(options, flash_attn=False)
    engine = load_engine(path, options, name="tiny-moe")
    cpu = load_engine(path, LoadOptions(n_ctx=256, n_gpu_layers=0, flash_attn=False),
                      name="tiny-moe")
    try:
        moved = {name for name, buft in engine.backend.overridden}
        assert moved == {f"blk.{i}.ffn_{p}_exps.weight" for i in range(2)
                         for p in ("gate", "up", "down")}
        # In RAM: llama.cpp picks the GPU backend's pinned host buffers ("Vulkan_Host").
        assert all(on_host(buft) for _, buft in engine.backend.overridden)
        info = engine.info
        assert info.n_gpu_layers == c.n_layers + 1 and info.n_cpu_moe == 2
        on_gpu = _buffers(info, "model", gpu=True)
        experts_in_ram = sum(layer.expert_bytes for layer in c.layers[:2])
        assert chosen.gpu is not None
        assert on_gpu == pytest.approx(chosen.gpu.weights_bytes, rel=0.10), info.buffers
        assert _buffers(info, "model", gpu=False) >= experts_in_ram
        assert _buffers(cpu.info, "model", gpu=True) == 0
        # The same greedy text as the CPU's decode of the file (up to a near-tie).
        reference = _greedy(cpu, MOE_PROMPT, max_tokens=16)
        run = _greedy(engine, MOE_PROMPT, max_tokens=16)
        assert run.done is not None and run.done.usage.completion_tokens == 16
        assert run.request.prompt == reference.request.prompt
        divergence = first_divergence(cpu, reference, run)
        assert divergence is None or divergence.near_tie, divergence
    finally:
        engine.close()
        cpu.close()
