"""Hardware probes on recorded inputs (cpuinfo text, a fake sysfs), the real probe and
bandwidth measurement on this machine, calibration records, and the hw/plan commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localinfer.hardware import HardwareProfile, calibration, probe
from localinfer.hardware import bandwidth as bw
from localinfer.hardware.probe import (
    apple_chip,
    apple_gpu,
    cgroup_limit,
    nvidia_bandwidth_gbps,
    parse_cpuinfo,
    probe_drm,
)

PROFILES = Path(__file__).parent / "profiles"

X86 = """processor	: 0
model name	: AMD Ryzen 5 5600X 6-Core Processor
cpu MHz		: 3700.000
flags		: fpu sse3 ssse3 fma f16c avx avx2 sha_ni
"""
PI5 = """processor	: 0
BogoMIPS	: 108.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid \
asimdrdm lrcpc dcpop asimddp
CPU implementer	: 0x41
CPU part	: 0xd0b
"""


def test_parse_cpuinfo_x86_and_arm():
    model, mhz, flags = parse_cpuinfo(X86)
    assert model == "AMD Ryzen 5 5600X 6-Core Processor" and mhz == 3700.0
    assert {"avx2", "fma", "f16c"} <= set(flags) and "avx512f" not in flags
    model, _, flags = parse_cpuinfo(PI5)
    assert model == "ARM Cortex-A76" and {"neon", "asimddp", "fphp"} <= set(flags)


def test_cgroup_limit_v2_and_unlimited(tmp_path):
    (tmp_path / "memory.max").write_text("4294967296\n")
    assert cgroup_limit(tmp_path) == 4 << 30
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_limit(tmp_path) is None
    assert cgroup_limit(tmp_path / "missing") is None


def test_nvidia_bandwidth_from_bus_width_and_memory_clock():
    assert nvidia_bandwidth_gbps(384, 10501) == pytest.approx(1008.1, abs=0.1)  # RTX 4090
    assert nvidia_bandwidth_gbps(192, 7501) == pytest.approx(360.0, abs=0.1)  # RTX 3060


def test_amd_gpu_from_sysfs(tmp_path):
    dev = tmp_path / "card0" / "device"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1002\n")
    (dev / "device").write_text("0x744c\n")
    (dev / "mem_info_vram_total").write_text(str(24 << 30))
    (dev / "mem_info_vram_used").write_text(str(1 << 30))
    (dev / "pp_dpm_mclk").write_text("0: 96Mhz\n1: 456Mhz\n2: 1249Mhz *\n")
    (tmp_path / "card0-DP-1").mkdir()
    gpus, notes = probe_drm(tmp_path)
    [gpu] = gpus
    assert gpu.vendor == "amd" and gpu.vram_total_gib == 24 and gpu.vram_free_gib == 23
    # 1249 MHz x 16 x 384 bit / 8 = 959 GB/s (an RX 7900 XTX is 960).
    assert gpu.bandwidth_gbps == pytest.approx(959.2, abs=0.5) and notes


def test_apple_chip_table():
    assert apple_chip("Apple M3 Max") == "M3 Max" and apple_chip("Apple M2") == "M2"
    assert apple_chip("Intel(R) Core(TM) i7") is None
    gpu = apple_gpu("M2", 8)
    assert gpu.unified_memory and gpu.bandwidth_gbps == 100 and gpu.vram_total_gib == 5.36


def test_probe_this_machine_is_a_valid_profile():
    hw = probe(measure_bandwidth=False)
    assert hw.ram_total_gib > 0 and 0 <= hw.ram_available_gib <= hw.ram_total_gib
    assert hw.cpu.physical_cores >= 1 and "CPU" in hw.backends
    assert HardwareProfile.from_json(hw.to_json()) == hw


def test_bandwidth_measurement_is_plausible_and_cached(tmp_path):
    size = 64 << 20
    first = bw.cached_or_measured(tmp_path, "k", threads=os.cpu_count() or 1, size_bytes=size)
    # Any machine that runs LLMs reads memory at more than 1 GB/s and less than 2 TB/s. (How
    # all cores compare with one depends on what else the machine is doing: not asserted.)
    assert 1.0 < first.bandwidth_gbps < 2000 and 1.0 < first.bandwidth_1core_gbps < 2000
    again = bw.cached_or_measured(tmp_path, "k", threads=1, size_bytes=size)
    assert again == first  # from the cache, not measured again
    fresh = bw.cached_or_measured(tmp_path, "k", threads=1, size_bytes=size, remeasure=True)
    assert fresh.measured_at > first.measured_at


def test_buffer_size_bounds():
    assert bw.buffer_size(32 << 20, 64 << 30) == 256 << 20
    assert bw.buffer_size(480 << 20, 64 << 30) == 512 << 20
    assert bw.buffer_size(8 << 20, 1 << 30) == 128 << 20  # an eighth of 1 GiB free


def test_calibration_records_and_averages(tmp_path):
    hw = HardwareProfile.from_json((PROFILES / "laptop-8gb-cpu.json").read_text())
    assert calibration.load_ratios(hw, tmp_path) == {}
    for ratio in (0.8, 0.9):
        calibration.record(hw, "CPU", calibration.Measurement(
            ratio=ratio, predicted_tps=10, measured_tps=10 * ratio, model="m", n_gpu_layers=0,
            tokens=100, at=0.0), tmp_path)
    assert calibration.load_ratios(hw, tmp_path)["CPU"] == pytest.approx((0.8 * 0.9) ** 0.5)
    other = HardwareProfile.from_json((PROFILES / "raspberry-pi5-8gb.json").read_text())
    assert calibration.load_ratios(other, tmp_path) == {}


def test_too_short_a_run_is_not_recorded(tmp_path):
    assert calibration.record_run(model_path="x", model_name="m", n_gpu_layers=0,
                                  n_threads=None, prompt_tokens=5, decode_tokens=3,
                                  decode_tps=40.0, cache_dir=tmp_path) is None


@pytest.mark.model
def test_a_real_run_records_measured_over_predicted(starter_path, tmp_path):
    hw = probe(measure_bandwidth=False)
    hw = HardwareProfile.from_dict({**hw.to_dict(), "host_bandwidth_gbps": 30.0,
                                    "bandwidth_source": "measured"})
    m = calibration.record_run(model_path=starter_path, model_name="gemma3:270m-q4_k_m",
                               n_gpu_layers=0, n_threads=None, prompt_tokens=10,
                               decode_tokens=64, decode_tps=40.0, hw=hw, cache_dir=tmp_path)
    assert m.ratio == pytest.approx(40.0 / m.predicted_tps, rel=1e-3)
    assert calibration.load_ratios(hw, tmp_path)["CPU"] == pytest.approx(m.ratio)


# --- the commands ------------------------------------------------------------------------------
def cli(*args: str):
    return subprocess.run([sys.executable, "-m", "localinfer", *args], capture_output=True,
                          text=True, timeout=300)


def test_hw_json_is_a_profile_plan_can_read(tmp_path):
    out = cli("hw", "--json")
    assert out.returncode == 0, out.stderr
    path = tmp_path / "me.json"
    path.write_text(out.stdout)
    profile = HardwareProfile.from_json(out.stdout)
    assert profile.bandwidth_source == "measured" and profile.host_bandwidth_gbps > 1
    plan = cli("plan", "qwen3:0.6b", "--hardware", str(path), "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["choice"]["model"] == "qwen3:0.6b"


def test_plan_for_a_recorded_laptop():
    out = cli("plan", "qwen3", "--hardware", str(PROFILES / "laptop-8gb-cpu.json"))
    assert out.returncode == 0, out.stderr
    assert "Planning for the profile" in out.stdout and "Choice: qwen3:" in out.stdout
    assert "qwen3:32b-q8_0" in out.stdout and "too big" in out.stdout


@pytest.mark.parametrize("args, code, words", [
    (["plan", "nosuchfamily"], 3, "unknown model or family 'nosuchfamily'"),
    (["plan", "gemma3:270m", "--ctx", "0"], 2, "--ctx must be at least 1 token"),
    (["plan", "gemma3:270m", "--ctx", "100000"], 2, "beyond what gemma3:270m was trained for"),
    (["plan", "qwen3", "--hardware", "/nonexistent/hw.json"], 2, "does not exist"),
    (["plan", "qwen3", "--hardware", str(PROFILES.parent / "test_planner.py")], 2,
     "not valid JSON"),
])
def test_plan_bad_input_is_one_line(args, code, words):
    out = cli(*args)
    assert out.returncode == code, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localinfer: ") and words in lines[0]


@pytest.mark.model
def test_a_speculative_run_is_not_a_calibration_sample(home, starter_path):
    from localinfer.config import Config
    from localinfer.hardware.calibration import record_calibration
    from localinfer.paths import get_paths
    from localinfer.protocol import ModelInfo
    from localinfer.runtime.types import Done, Timings, Usage

    info = ModelInfo(name="gemma3:270m-q4_k_m", path=str(starter_path), architecture="gemma3",
                     quant="Q4_K_M", size_bytes=1, n_params=1, n_layers=18, n_gpu_layers=0,
                     n_ctx_train=32768, n_ctx=2048, n_slots=1, n_vocab=262144)
    calibration_file = get_paths().cache_dir / "hardware" / "calibration.json"

    def run(drafted: int) -> Done:
        return Done("x", "length", Usage(10, 101), Timings(
            prompt_tokens=10, completion_tokens=101, decode_tokens=100, decode_ms=1000.0,
            drafted_tokens=drafted, accepted_tokens=drafted // 2))

    # Several tokens per step: 100 tokens in 1 s is not what one decode step costs.
    record_calibration(info, run(drafted=90), Config())
    assert not calibration_file.exists()
    record_calibration(info, run(drafted=0), Config())  # a plain run is recorded
    assert calibration_file.exists()
