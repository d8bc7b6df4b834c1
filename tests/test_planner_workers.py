"""The plan for RPC workers: recorded profiles of two machines (tests/profiles/pool-*.json), each
expected split and rate worked out by hand below; the split is the one llama.cpp makes from
n_gpu_layers and tensor_split (its assignment re-done here in float32); a worker with too
little memory, unknown figures, pooling slower than a smaller model alone, bad profiles.

Numbers used (see planner/): GiB = 2^30 bytes; RAM budget = available - max(1 GiB, 10% of
total); a worker's GPU: free - max(512 MiB, 10% of total); F16 KV; compute = 4 x 512 x 3 x
n_embd (activations) + 4 x 512 x n_vocab (logits, on the output's device); the host keeps
4 x n_vocab logits per slot; overhead 256 MiB host, 400 MiB CUDA, 128 MiB Metal. Decode at
position 64: a layer reads its weights + 2048 KV elements x 2 bytes x 64 = 262,144 bytes.
Network per token and worker device holding layers: one round trip + (activations
n_embd x 4 in, a 1,024-byte mask, and out the activations or, from the last device, the
logits n_vocab x 4) over the link.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localinfer.cli import main
from localinfer.errors import ConfigError, InvalidRequest
from localinfer.hardware import load_profile
from localinfer.hardware.profile import HardwareProfile, RemoteDevice, WorkerProfile
from localinfer.planner import Candidate, LayerShape, PlanPrefs, plan, plan_split, predict

PROFILES = Path(__file__).parent / "profiles"
GIB = 2**30
MIB = 2**20
LAYER_READ_AT_64 = 2048 * 2 * 64  # KV bytes one layer reads at position 64


def toy(name: str, n_layers: int, layer_bytes: int, *, benchmark: float = 70.0) -> Candidate:
    """A model with round numbers: n_layers x layer_bytes, 2048 KV elements per token per
    layer (8 KV heads x 128 x K and V), n_embd 5120, a 150,000-token vocabulary, a 400 MB
    embedding and a separate 500 MB output head."""
    layers = tuple(LayerShape(layer_bytes, layer_bytes, 2048) for _ in range(n_layers))
    return Candidate(
        name=name, model=name, quant="Q4_K_M", file_bytes=n_layers * layer_bytes + 900_000_000,
        layers=layers, output_bytes=500_000_000, embedding_bytes=400_000_000,
        tied_embeddings=False, other_bytes=0, n_embd=5120, n_ff=25600, n_vocab=150_000,
        context_length=32768, params=n_layers * layer_bytes * 2, active_params=0, quality=1.0,
        estimated=False, n_head=64, benchmark=benchmark, benchmark_source="a test figure")


BIG = toy("big:80l", 80, 300_000_000, benchmark=80.0)  # 24 GB of layers
SMALL = toy("small:32l", 32, 140_000_000, benchmark=60.0)  # 4.5 GB of layers
PER_LAYER = 300_000_000 + 8192 * 2048 * 2  # weights + KV at 8192 tokens: 333,554,432


def llama_cpp_layers(n_layer: int, n_gpu_layers: int, tensor_split: list[float],
                     n_devices: int) -> list[int]:
    """llama.cpp's load_tensors (src/llama-model.cpp): the device of each layer 0..n_layer
    (n_layer = the output), -1 = this machine's CPU, with its float32 arithmetic."""
    ts = np.zeros(n_devices, dtype=np.float32)
    ts[:len(tensor_split)] = tensor_split
    splits = np.cumsum(ts, dtype=np.float32)
    splits = (splits / splits[-1]).astype(np.float32)
    i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)
    act = min(n_gpu_layers, n_layer + 1)
    out = []
    for il in range(n_layer + 1):
        if il < i_gpu_start or il - i_gpu_start >= act:
            out.append(-1)
            continue
        frac = np.float32(il - i_gpu_start) / np.float32(act)
        out.append(int(np.searchsorted(splits, frac, side="right")))  # std::upper_bound
    return out


def assert_llama_cpp_agrees(split, n_offload_devices: int) -> None:
    n = sum(d.n_layers for d in split.devices)
    got = llama_cpp_layers(n, split.n_gpu_layers, list(split.tensor_split()),
                           n_offload_devices)
    want = []
    for index, d in enumerate(split.devices):
        want += [index - 1] * d.n_layers
    holder = next(i for i, d in enumerate(split.devices) if d.holds_output)
    assert got == want + [holder - 1]


# --- (a) a 16 GB laptop + a 24 GB GPU desktop on gigabit Ethernet -----------------------------
def test_laptop_and_rtx4090_desktop_on_1gbe():
    hw = load_profile(PROFILES / "pool-laptop16-rtx4090-1gbe.json")
    split = plan_split(BIG, hw, PlanPrefs())
    assert split.fits and split.n_ctx == 8192
    # The RTX 4090 (23.2 GiB free; reserve max(512 MiB, 2.4 GiB)): 24,910,810,316 -
    # 2,576,980,377 = 22,333,829,939 B usable. It holds the output (the last offload device):
    # head 500,000,000 + activations 31,457,280 + logits 307,200,000 + CUDA 419,430,400
    # = 1,258,087,680; the rest takes (22,333,829,939 - 1,258,087,680) // 333,554,432 = 63
    # layers. The laptop's CPU takes the other 17 (17 x 333.6 MB + 0.7 GB < 10.4 GiB).
    cpu, gpu = split.devices
    assert (cpu.n_layers, gpu.n_layers, gpu.holds_output) == (17, 63, True)
    assert (cpu.first_layer, gpu.first_layer) == (0, 17)
    assert gpu.memory.total_bytes <= gpu.memory.budget_bytes == 22_333_829_939
    assert split.n_gpu_layers == split.n_remote_layers == 64 and split.tensor_split() == (64.0,)
    assert split.remote_layers == (63,) and split.local_cpu_layers == 17
    assert_llama_cpp_agrees(split, 1)
    # Decode, ms per token: CPU min(min(30, 4 x 12) x 0.8, 4 x 3.4 GHz x 3.0) = 24 GB/s:
    # 17 x (300,262,144 / 24e9 + 0.3) = 217.79. RTX 4090 at 0.77 x 1008 = 776.16 GB/s:
    # 63 x (300,262,144 / 776.16e9 + 0.014) + 500e6 / 776.16e9 = 25.90. Network: one round
    # trip 0.4 + the hop's 2.0 (RPC_HOP_MS) + (20,480 + 1,024 in, 600,000 logits out) /
    # 0.112e9 = 7.95. Launch and sampling 0.3 + 150,000 x 2 ns = 0.6. Total 252.24 ms: 3.96.
    cpu_ms = 17 * ((300_000_000 + LAYER_READ_AT_64) / 24e9 * 1e3 + 0.3)
    gpu_ms = 63 * ((300_000_000 + LAYER_READ_AT_64) / 776.16e9 * 1e3 + 0.014) \
        + 500e6 / 776.16e9 * 1e3
    network_ms = 0.4 + 2.0 + (20_480 + 1_024 + 600_000) / 0.112e9 * 1e3
    assert split.decode_ms["local"] == pytest.approx(cpu_ms)
    assert split.decode_ms["remote"] == pytest.approx(gpu_ms)
    assert split.decode_ms["network"] == pytest.approx(network_ms)
    assert split.network_bytes == 621_504 and split.round_trips == 1
    assert split.decode_tps == pytest.approx(1000 / (cpu_ms + gpu_ms + network_ms + 0.6))
    assert 3.95 < split.decode_tps < 4.05
    # The laptop alone cannot hold 24 GB: plan() pools, and says nothing fits alone.
    result = plan(hw, [BIG], PlanPrefs(min_tps=2))
    assert result.choice is not None and result.choice.split == split
    assert "63 + output on 192.168.1.20:50052 CUDA0" in result.summary
    assert "nothing fits this machine alone" in result.summary


# --- (b) two 64 GB Macs on 10 GbE --------------------------------------------------------------
def test_two_64gb_macs_on_10gbe():
    hw = load_profile(PROFILES / "pool-2x-mac64-10gbe.json")
    q6 = toy("big:80l-q6_k", 80, 700_000_000)  # 56 GB of layers: more than one Mac holds
    split = plan_split(q6, hw, PlanPrefs())
    assert split.fits and split.n_ctx == 8192
    # One pool of RAM on this Mac: 52 GiB - 6.4 = 48,962,627,175 B. CPU part: embedding
    # 400,000,000 + activations 31,457,280 + host logits 600,000 + 256 MiB = 700,492,736;
    # the M3 Max's (the output's device): head 500,000,000 + 31,457,280 + logits 307,200,000
    # + Metal 134,217,728 = 972,875,008. Layers of 700,000,000 + 33,554,432 (KV) =
    # 733,554,432 B: (48,962,627,175 - 700,492,736 - 972,875,008) // 733,554,432 = 64 layers
    # on this Mac's GPU. The other 16 go to the worker's M2 Max (equally fast: the local
    # GPU is filled first; 46 - 4.8 GiB usable). The CPU (96 GB/s: 12 cores x 4 GHz x 2.0 <
    # 400 x 0.64) would be slowest: nothing.
    cpu, remote, local = split.devices
    assert (cpu.n_layers, remote.n_layers, local.n_layers) == (0, 16, 64)
    assert local.holds_output and remote.first_layer == 0 and local.first_layer == 16
    assert split.n_gpu_layers == 81 and split.n_remote_layers == 16
    assert split.tensor_split() == (16.0, 65.0)
    assert_llama_cpp_agrees(split, 2)
    # Decode: both GPUs at 0.88 x 400 = 352 GB/s, 0.14 ms per layer: 64 x (700,262,144 /
    # 352e9 + 0.14) + 500e6 / 352e9 = 137.70 ms here, 16 x 2.1294 = 34.07 ms there. The
    # worker's device is followed by this machine's: activations both ways, one round trip and
    # the hop (RPC_HOP_MS): 0.15 + 2.0 + (20,480 + 1,024 + 20,480) / 1.1e9 = 2.188 ms. + 0.6:
    # 174.56 ms, 5.73 tok/s.
    layer = (700_000_000 + LAYER_READ_AT_64) / 352e9 * 1e3 + 0.14
    network_ms = 0.15 + 2.0 + 41_984 / 1.1e9 * 1e3
    assert split.decode_ms["remote"] == pytest.approx(16 * layer)
    assert split.decode_ms["local"] == pytest.approx(64 * layer + 500e6 / 352e9 * 1e3)
    assert split.decode_ms["network"] == pytest.approx(network_ms)
    assert split.decode_tps == pytest.approx(1000 / (80 * layer + 500e6 / 352e9 * 1e3
                                                     + network_ms + 0.6))
    assert 5.7 < split.decode_tps < 5.8
    # A model one Mac holds is not split: the network would only add to it.
    alone = plan_split(BIG, hw, PlanPrefs())
    assert alone.fits and not alone.uses_workers and alone.remote_layers == (0,)
    assert alone.tensor_split() == (0.0, 81.0)
    assert_llama_cpp_agrees(alone, 2)
    assert any("faster without it" in note for note in alone.notes)


def test_pooling_slower_than_a_smaller_model_alone_is_said():
    # The laptop with a mini PC (CPU only, 32 GB, 25 GB/s) on gigabit: BIG needs the mini PC
    # and decodes at under 1 tok/s (80 layers at 12.5 ms or more each on one CPU or the
    # other, and the logits over the link); SMALL fits the laptop alone: 32 x (140,262,144 /
    # 24e9 + 0.3 ms) + the 500 MB head / 24e9 + 0.3 + 150,000 x 5 ns = 218.5 ms, 4.58 tok/s.
    # Neither reaches 10 tok/s: the fastest that fits is SMALL, and the plan says what
    # pooling would have given.
    laptop = load_profile(PROFILES / "pool-laptop16-rtx4090-1gbe.json")
    mini = WorkerProfile("192.168.1.40:50052", (RemoteDevice("CPU", 32, 30, 25.0),),
                         rtt_ms=0.5, link_gbps=0.112)
    hw = replace(laptop, workers=(mini,))
    result = plan(hw, [BIG, SMALL], PlanPrefs())
    assert result.choice is not None and result.choice.candidate is SMALL
    assert result.choice.split is None
    big = next(e for e in result.evaluations if e.candidate is BIG)
    assert big.fits and big.split is not None and big.split.uses_workers
    assert result.choice.decode_tps == pytest.approx(
        1000 / (32 * (140_262_144 / 24e9 * 1e3 + 0.3) + 500e6 / 24e9 * 1e3 + 0.3 + 0.75))
    assert big.decode_tps < 1.0
    assert (f"Pooling with 192.168.1.40:50052 would run big:80l at ~{big.decode_tps:.1f}"
            f" tok/s: slower than small:32l alone on this machine (4.6 tok/s)"
            in result.summary)
    # Chosen anyway (a lower target): the summary names the faster model alone.
    result = plan(hw, [BIG, SMALL], PlanPrefs(min_tps=0.5))
    assert result.choice is not None and result.choice.candidate is BIG
    assert "small:32l alone on this machine at 4.6 tok/s" in result.summary


def test_a_worker_with_too_little_memory_gets_no_layers():
    laptop = load_profile(PROFILES / "pool-laptop16-rtx4090-1gbe.json")
    # 1 GiB free of 4: 1 GiB - 512 MiB = 512 MiB usable, less than CUDA's 400 MiB + the
    # activations + one 333.6 MB layer.
    small_gpu = WorkerProfile("192.168.1.50:50052", (
        RemoteDevice("CUDA0", 4, 1, 224.0, "NVIDIA GeForce GTX 1650", "gpu"),),
        rtt_ms=0.4, link_gbps=0.112)
    hw = replace(laptop, workers=(*laptop.workers, small_gpu))
    split = plan_split(BIG, hw, PlanPrefs())
    assert split.fits and split.remote_layers == (63, 0)
    assert split.tensor_split() == (64.0,)  # the trailing 0 is llama.cpp's default
    assert_llama_cpp_agrees(split, 2)
    assert any(note.startswith("192.168.1.50:50052 CUDA0: no layers: 0.5 GiB usable")
               for note in split.notes)
    # Alone with the laptop, it cannot make BIG fit: what is missing is said in GiB.
    alone = plan_split(BIG, replace(laptop, workers=(small_gpu,)), PlanPrefs(n_ctx=8192),
                       require_workers=True)
    assert not alone.fits and "GiB usable" in alone.reason
    result = plan(replace(laptop, workers=(small_gpu,)), [BIG], PlanPrefs())
    assert result.choice is None and "with the workers too" in result.evaluations[0].reason


def test_unknown_bandwidth_round_trip_and_link_are_assumed_and_said():
    laptop = load_profile(PROFILES / "pool-laptop16-rtx4090-1gbe.json")
    unknown = WorkerProfile("192.168.1.60:50052", (RemoteDevice("CPU", 64, 60),))
    hw = replace(laptop, workers=(unknown,))
    split = plan_split(BIG, hw, PlanPrefs(), require_workers=True)
    # A CPU of unknown bandwidth is taken at this machine's one-core figure (12 GB/s x 0.8
    # = 9.6 GB/s, slower than the laptop's 24): the laptop fills first. No GPU anywhere:
    # flash attention is off, and each CPU keeps the attention scores of one ubatch,
    # 4 x 512 x 8192 x 64 heads = 1 GiB. The laptop's 11,166,914,970 B less the embedding
    # 400,000,000, activations 31,457,280, scores 1,073,741,824, logits 600,000 and 256 MiB
    # = 9,392,680,410 // 333,554,432 = 28 layers; the worker takes 52, at 300,262,144 /
    # 9.6e9 + 0.3 = 31.58 ms each.
    remote = split.devices[1]
    assert remote.bandwidth_gbps == 12.0 and remote.n_layers == 52 and remote.holds_output
    assert split.devices[0].n_layers == 28
    assert split.decode_ms["remote"] == pytest.approx(
        52 * ((300_000_000 + LAYER_READ_AT_64) / 9.6e9 * 1e3 + 0.3) + 500e6 / 9.6e9 * 1e3)
    # Round trip and link unmeasured: 0.5 ms and 0.117 GB/s (gigabit) assumed; the hop 2.0.
    assert split.decode_ms["network"] == pytest.approx(
        0.5 + 2.0 + (20_480 + 1_024 + 600_000) / 0.117e9 * 1e3)
    said = " ".join(split.notes)
    assert "round trip not measured, 0.5 ms assumed" in said
    assert "link throughput not measured, 0.117 GB/s assumed" in said
    assert "one-core figure, 12.0 GB/s, assumed" in remote.note
    # A GPU of unknown bandwidth: 100 GB/s assumed, and said; at Vulkan's 0.80 of it, still
    # faster than the laptop's CPU: SMALL goes there whole (32 x 140 MB fit its 13.4 GiB).
    gpu = WorkerProfile("192.168.1.61:50052", (RemoteDevice("Vulkan0", 16, 15, kind="gpu"),),
                        rtt_ms=0.3, link_gbps=1.1)
    split = plan_split(SMALL, replace(laptop, workers=(gpu,)), PlanPrefs())
    assert split.fits and split.devices[1].bandwidth_gbps == 100.0
    assert split.remote_layers == (32,) and split.devices[1].holds_output
    assert split.decode_ms["remote"] == pytest.approx(
        32 * ((140_000_000 + LAYER_READ_AT_64) / 80e9 * 1e3 + 0.03) + 500e6 / 80e9 * 1e3)
    assert "100 GB/s assumed" in split.devices[1].note


def test_two_devices_of_one_worker_copy_on_the_server():
    # Two GPUs behind one rpc-server: the first's output goes to the second by COPY_TENSOR on
    # the server (a round trip, no activations over the link); the host sends each its masks.
    laptop = load_profile(PROFILES / "pool-laptop16-rtx4090-1gbe.json")
    two = WorkerProfile("192.168.1.70:50052", (
        RemoteDevice("CUDA0", 12, 11.5, 360.0, "NVIDIA GeForce RTX 3060", "gpu"),
        RemoteDevice("CUDA1", 12, 11.5, 360.0, "NVIDIA GeForce RTX 3060", "gpu")),
        rtt_ms=0.4, link_gbps=0.112)
    split = plan_split(BIG, replace(laptop, workers=(two,)), PlanPrefs())
    assert split.fits and split.round_trips == 2 and all(split.remote_layers)
    # In: activations + mask to CUDA0, mask to CUDA1; out: the logits from CUDA1.
    assert split.network_bytes == 20_480 + 1_024 + 1_024 + 600_000
    assert_llama_cpp_agrees(split, 2)


@pytest.mark.parametrize("n_remote", [1, 2, 3])
def test_every_split_is_the_one_llama_cpp_makes(n_remote):
    laptop = load_profile(PROFILES / "pool-laptop16-rtx4090-1gbe.json")
    workers = tuple(WorkerProfile(f"10.0.0.{i}:50052", (
        RemoteDevice("CUDA0", 24 + 8 * i, 23 + 8 * i, 300.0 + 100 * i, "", "gpu"),),
        rtt_ms=0.2, link_gbps=1.1) for i in range(n_remote))
    for model in (BIG, SMALL, toy("odd:61l", 61, 123_456_789)):
        for ctx in (2048, 8192):
            split = plan_split(model, replace(laptop, workers=workers), PlanPrefs(n_ctx=ctx))
            assert split.fits
            assert_llama_cpp_agrees(split, n_remote)
            for d in split.devices:
                assert d.memory.total_bytes <= d.memory.budget_bytes


# --- two workers on loopback (the test on one machine) ---------------------------------
def test_a_given_split_over_loopback_workers_adds_only_the_network():
    hw = load_profile(PROFILES / "pool-loopback-2core.json")
    model = toy("toy:18l", 18, 10_000_000)
    split = plan_split(model, hw, PlanPrefs(), layers=[6, 6, 6])
    # llama.cpp: n_gpu_layers 13 (12 layers and the output), tensor_split 6, 7.
    assert split.fits and split.n_gpu_layers == 13 and split.tensor_split() == (6.0, 7.0)
    assert_llama_cpp_agrees(split, 2)
    assert any("127.0.0.1:50052 CPU is on this machine" in note for note in split.notes)
    # Loopback workers are this machine's cores: the layers cost what they cost here alone;
    # only the links add. Two round trips (0.016 ms each) and hops (2.0 each); in: 20,480 +
    # 1,024 each, out: the activations from the first, the logits (600,000) from the second,
    # at 3 GB/s.
    alone = predict(model, replace(hw, workers=()), 0, position=64)
    network_ms = 2 * (0.016 + 2.0) + (2 * 21_504 + 20_480 + 600_000) / 3e9 * 1e3
    assert split.decode_ms["network"] == pytest.approx(network_ms)
    assert 1000 / split.decode_tps == pytest.approx(1000 / alone.decode_tps + network_ms)
    # This machine's calibration (measured/predicted 0.5) doubles its devices' time, the
    # loopback workers' too (the same cores); not the links'.
    calibrated = plan_split(model, hw, PlanPrefs(calibration={"CPU": 0.5}), layers=[6, 6, 6])
    assert calibrated.decode_ms["local"] == pytest.approx(2 * split.decode_ms["local"])
    assert calibrated.decode_ms["remote"] == pytest.approx(2 * split.decode_ms["remote"])
    assert calibrated.decode_ms["network"] == split.decode_ms["network"]
    # Left to itself the planner keeps it here: the links only add; plan() says so.
    assert not plan_split(model, hw, PlanPrefs()).uses_workers
    result = plan(hw, [model], PlanPrefs())
    assert result.choice is not None and result.choice.split is None
    assert re.search(r"The workers are left out: pooled with 127\.0\.0\.1:50052(, 127\.0\.0\.1:"
                     r"50053)? it would decode at ~[\d.]+ tok/s", result.summary)
    # Their memory is this machine's: one pool. 18 x 1.3 GB = 23.4 GB, each third 7.8 GB
    # (each fits its 20.6 GiB alone), all of it more than the 20.6 GiB (22.1 GB) pool.
    over = plan_split(toy("toy:18l-big", 18, 1_300_000_000), hw, PlanPrefs(n_ctx=2048),
                      layers=[6, 6, 6])
    assert not over.fits and "this machine's memory needs" in over.reason
    with pytest.raises(InvalidRequest, match="adding up to 18; got"):
        plan_split(model, hw, PlanPrefs(), layers=[6, 6])


# --- `localinfer plan --hardware FILE` with workers ---------------------------------------------
def test_plan_cli_shows_the_split_across_machines(capsys):
    profile = PROFILES / "pool-laptop16-rtx4090-1gbe.json"
    assert main(["plan", "qwen3:32b-q4_k_m", "--hardware", str(profile), "--offline"]) == 0
    out = capsys.readouterr().out
    assert "RPC worker 192.168.1.20:50052 (desktop): CUDA0 (NVIDIA GeForce RTX 4090" in out
    assert re.search(r"qwen3:32b-q4_k_m .* yes +\d+/65 pooled", out)
    split = re.search(r"Split of qwen3:32b-q4_k_m across machines \(context 8192\): llama.cpp"
                      r" n_gpu_layers (\d+), tensor_split (\d+)", out)
    assert split and split.group(1) == split.group(2)
    assert re.search(r"this machine's CPU +0-\d+ ", out)
    assert re.search(r"192\.168\.1\.20:50052 CUDA0 +\d+-63 \+ output +[\d.]+G/20\.8G +1008 GB/s",
                     out)
    assert re.search(r"network \(1 round trip\(s\), [\d.]+ KB/token\)", out)
    assert re.search(r"decode ~[\d.]+ tok/s predicted: [\d.]+ ms per token, of which the"
                     r" network [\d.]+ ms", out)
    assert main(["plan", "qwen3:32b-q4_k_m", "--hardware", str(profile), "--offline",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["choice"]["split"]["n_remote_layers"] == data["choice"]["n_gpu_layers"]
    assert data["hardware"]["workers"][0]["endpoint"] == "192.168.1.20:50052"


# --- the profile's workers ---------------------------------------------------------------------
def test_workers_round_trip_through_json():
    hw = load_profile(PROFILES / "pool-2x-mac64-10gbe.json")
    assert hw.workers[0].devices[0].name == "MTL0" and hw.workers[0].rtt_ms == 0.15
    assert HardwareProfile.from_json(hw.to_json()) == hw
    assert not hw.workers[0].is_loopback
    assert WorkerProfile("127.0.0.1:50052", ()).is_loopback
    assert WorkerProfile("[::1]:50052", ()).is_loopback


@pytest.mark.parametrize(("worker", "field"), [
    ({"devices": [{"name": "CPU", "memory_total_gib": 8}]}, "workers[0].endpoint is missing"),
    ({"endpoint": "host", "devices": []}, "workers[0].endpoint must be HOST:PORT"),
    ({"endpoint": "h:70000", "devices": []}, "workers[0].endpoint must be HOST:PORT"),
    ({"endpoint": "h:1"}, "workers[0].devices is missing"),
    ({"endpoint": "h:1", "devices": []}, "workers[0].devices must be a non-empty list"),
    ({"endpoint": "h:1", "devices": [{"name": "CPU"}]},
     "workers[0].devices[0].memory_total_gib is missing"),
    ({"endpoint": "h:1", "devices": [{"name": "CPU", "memory_total_gib": 8,
                                      "memory_free_gib": 9}]},
     "workers[0].devices[0].memory_free_gib (9.0) is more than memory_total_gib"),
    ({"endpoint": "h:1", "devices": [{"name": "CPU", "memory_total_gib": 8, "kind": "npu"}]},
     "workers[0].devices[0].kind must be one of cpu, gpu"),
    ({"endpoint": "h:1", "devices": [{"name": "CPU", "memory_total_gib": 8}], "rtt_ms": -1},
     "workers[0].rtt_ms must be at least 0"),
    ({"endpoint": "h:1", "devices": [{"name": "CPU", "memory_total_gib": 8}],
      "link_gbps": "fast"}, "workers[0].link_gbps must be a number"),
    ({"endpoint": "h:1", "devices": [{"name": "CPU", "memory_total_gib": 8, "vram": 1}]},
     "workers[0].devices[0].vram is not a known field"),
    # 1e300 GiB overflowed the planner's byte counts (an internal error).
    ({"endpoint": "h:1", "devices": [{"name": "CPU", "memory_total_gib": 1e300}]},
     "workers[0].devices[0].memory_total_gib must be at most 1e"),
    ({"endpoint": "h:1", "devices": [{"name": "CPU", "memory_total_gib": 8}],
      "rtt_ms": 1e300}, "workers[0].rtt_ms must be at most 1e"),
])
def test_bad_workers_name_the_field(worker, field):
    data = json.loads((PROFILES / "laptop-8gb-cpu.json").read_text())
    data["workers"] = [worker]
    with pytest.raises(ConfigError, match=r"field " + field.replace("(", r"\(").replace(
            ")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        HardwareProfile.from_dict(data)


def test_a_worker_listed_twice_is_refused():
    data = json.loads((PROFILES / "laptop-8gb-cpu.json").read_text())
    worker = {"endpoint": "h:1", "devices": [{"name": "CPU", "memory_total_gib": 8}]}
    data["workers"] = [worker, worker]
    with pytest.raises(ConfigError, match=r"field workers\[1\]\.endpoint 'h:1' is listed"):
        HardwareProfile.from_dict(data)
    data["workers"] = {"endpoint": "h:1"}
    with pytest.raises(ConfigError, match="field workers must be a list"):
        HardwareProfile.from_dict(data)
