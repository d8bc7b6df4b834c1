"""Hardware probes on recorded inputs (cpuinfo text, a fake sysfs), the real probe and
bandwidth measurement on this machine, calibration records, and the hw/plan commands."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ggufgen
from localinfer import gguf
from localinfer.hardware import HardwareProfile, probe
from localinfer.hardware import bandwidth as bw
from localinfer.hardware.load import MachineLoad
from localinfer.hardware.probe import (
    apple_chip,
    apple_gpu,
    cgroup_limit,
    nvidia_bandwidth_gbps,
    parse_cpuinfo,
    probe_drm,
)
from localinfer.planner import Candidate, calibration, decode_bytes_per_token

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
    first = bw.measure_and_store(tmp_path, "k", threads=os.cpu_count() or 1, size_bytes=size)
    m = first.new
    # Any machine that runs LLMs reads memory at more than 1 GB/s and less than 2 TB/s. (How
    # all cores compare with one depends on what else the machine is doing: not asserted.)
    assert 1.0 < m.bandwidth_gbps < 2000 and 1.0 < m.bandwidth_1core_gbps < 2000
    assert bw.MIN_TRIALS <= m.trials <= bw.MAX_TRIALS
    assert m.load is not None and m.load.cores >= 1 and m.load.other_busy_cores >= 0
    assert first.previous is None and first.kept == m
    assert bw.cached(tmp_path, "k").current == m  # read back from the file, load and all


def test_trials_keep_the_best_pass():
    durations = iter([0.2, 0.05, 0.1, 0.3])
    # A busy machine: three slow passes spend the budget; the shortest counts.
    assert bw.best_of_trials(lambda: next(durations)) == (0.05, 3)
    # A quiet machine: passes go on until MAX_TRIALS, well within the budget.
    fast = iter([0.004 + i / 1e4 for i in range(100)])
    assert bw.best_of_trials(lambda: next(fast)) == (0.004, bw.MAX_TRIALS)


def test_a_busy_machine_is_seen_as_load(tmp_path):
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]
    try:
        m = bw.measure(os.cpu_count() or 1, 32 << 20)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    # As many spinning processes as cores: they keep at least a quarter of the cores busy
    # even while the measurement's own threads compete with them.
    assert m.load is not None and m.load.heavy and m.under_load


QUIET = MachineLoad(other_busy_cores=0.1, cores=8, load_avg_1m=0.6)
BUSY = MachineLoad(other_busy_cores=5.2, cores=8, load_avg_1m=7.9)


def figure(gbps: float, load: MachineLoad | None, at: float = 1.7e9) -> bw.BandwidthMeasurement:
    return bw.BandwidthMeasurement(bandwidth_gbps=gbps, bandwidth_1core_gbps=gbps / 4,
                                   buffer_bytes=256 << 20, threads=8, seconds=0.4,
                                   measured_at=at, trials=5, load=load)


def test_a_figure_under_load_never_replaces_a_quiet_one(tmp_path):
    quiet = figure(14.5, QUIET)
    assert bw.store(tmp_path, "k", quiet).kept == quiet
    result = bw.store(tmp_path, "k", figure(6.4, BUSY))
    assert result.kept == quiet and result.previous == quiet
    assert "kept the cached one (measured on a quiet machine)" in result.summary()
    entry = bw.cached(tmp_path, "k")
    assert entry.current == quiet and entry.under_load.bandwidth_gbps == 6.4
    # Under load, the higher figure is the truer one: a lower one does not replace it.
    bw.store(tmp_path, "k", figure(4.2, BUSY))
    assert bw.cached(tmp_path, "k").under_load.bandwidth_gbps == 6.4
    # A new quiet figure replaces the quiet one, whatever it says.
    assert bw.store(tmp_path, "k", figure(13.9, QUIET)).kept.bandwidth_gbps == 13.9


def test_a_figure_under_load_is_used_until_a_quiet_one_comes(tmp_path):
    busy = figure(6.4, BUSY)
    assert bw.store(tmp_path, "k", busy).kept == busy
    lower = bw.store(tmp_path, "k", figure(4.2, BUSY))
    assert lower.kept == busy and "(0.66x): kept the cached one (higher; both under load)" in \
        lower.summary()
    result = bw.store(tmp_path, "k", figure(14.5, QUIET))
    assert result.kept.bandwidth_gbps == 14.5
    text = result.summary()
    assert text.startswith("14.5 GB/s quiet (load 0.6, others kept 0.1 of 8 cores busy), was"
                           " 6.4 GB/s on ") and "under load (load 7.9," \
        " others kept 5.2 of 8 cores busy) (2.27x): kept the new one" in text


def test_remeasure_summary_of_a_first_figure():
    result = bw.Remeasured(new=figure(6.4, BUSY), previous=None, kept=figure(6.4, BUSY))
    assert result.summary() == ("6.4 GB/s under load (load 7.9, others kept 5.2 of 8 cores"
                                " busy): cached")


def test_the_first_cache_format_is_read_and_replaced(tmp_path):
    # What earlier versions wrote: one measurement per machine, no load.
    (tmp_path / bw.CACHE_FILE).write_text(json.dumps({
        "57c27fc31f26819f": {"bandwidth_gbps": 4.2, "bandwidth_1core_gbps": 3.1,
                             "buffer_bytes": 268435456, "threads": 2, "seconds": 0.728,
                             "measured_at": 1796108571.37,
                             "method": "numpy int64 sum, one slice per thread, best of 3"
                                       " passes"},
        "bad": {"bandwidth_gbps": "x", "bandwidth_1core_gbps": 3.1, "buffer_bytes": 1,
                "threads": 2, "seconds": 0.7, "measured_at": 1.0}}))
    entry = bw.cached(tmp_path, "57c27fc31f26819f")
    assert entry.current.bandwidth_gbps == 4.2 and entry.current.load is None
    assert entry.current.under_load and "load not recorded" in entry.current.describe()
    assert bw.cached(tmp_path, "bad") is None
    # Load unknown counts as load: the first quiet figure replaces it, in the new format.
    bw.store(tmp_path, "57c27fc31f26819f", figure(14.5, QUIET))
    data = json.loads((tmp_path / bw.CACHE_FILE).read_text())
    assert data["version"] == bw.CACHE_VERSION
    assert bw.cached(tmp_path, "57c27fc31f26819f").current.bandwidth_gbps == 14.5


def test_the_cache_file_is_replaced_atomically(tmp_path, monkeypatch):
    bw.store(tmp_path, "k", figure(14.5, QUIET))
    before = (tmp_path / bw.CACHE_FILE).read_bytes()

    def crash(src, dst):  # the process dies between writing the new file and renaming it
        raise OSError("disk full")

    monkeypatch.setattr("localinfer.paths.os.replace", crash)
    bw.store(tmp_path, "k", figure(20.0, QUIET))  # logged, not raised: `hw` still prints
    assert (tmp_path / bw.CACHE_FILE).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [bw.CACHE_FILE]  # no temporary file left


def test_a_suspect_figure_is_measured_again_by_the_next_probe(home):
    hw = probe(measure_bandwidth=False, with_build=False)
    cache = home / "cache" / "hardware"
    key = bw.profile_key(hw)
    old = figure(1.0, QUIET, at=1.0)
    bw.store(cache, key, old)
    assert bw.mark_suspect(cache, key, "a reply decoded at 158% of the roofline")
    # A probe that may not measure leaves it (marked) alone; one that may, measures.
    assert probe(measure_bandwidth=False, with_build=False).host_bandwidth_gbps == 1.0
    again = probe(with_build=False)
    entry = bw.cached(cache, key)
    assert entry.suspect is None and entry.current.measured_at > old.measured_at
    assert any("measured again (a reply decoded at 158% of the roofline)" in note
               for note in again.notes)


def test_a_run_faster_than_the_roofline_marks_the_bandwidth(home, tmp_path):
    model = tmp_path / "tiny.gguf"
    model.write_bytes(ggufgen.tiny_model())
    hw = probe(measure_bandwidth=False, with_build=False)
    hw = HardwareProfile.from_dict({**hw.to_dict(), "host_bandwidth_gbps": 0.001,
                                    "bandwidth_source": "measured"})
    cache = home / "cache"
    bw.store(cache / "hardware", bw.profile_key(hw), figure(0.001, QUIET))
    header = gguf.read_header(model)
    ceiling = 0.001e9 / decode_bytes_per_token(Candidate.from_header(header, name="t"), 20)

    def run(tps: float) -> calibration.Measurement | None:
        return calibration.record_run(model_path=model, model_name="tiny", n_gpu_layers=0,
                                      n_threads=None, prompt_tokens=4, decode_tokens=32,
                                      decode_tps=tps, hw=hw, cache_dir=cache, load=QUIET)

    slower = run(0.9 * ceiling)  # below the roofline: nothing to doubt
    assert slower.drift is None
    assert bw.cached(cache / "hardware", bw.profile_key(hw)).suspect is None
    faster = run(1.58 * ceiling)
    assert faster.roofline_share == pytest.approx(1.58, abs=0.01)
    assert "158% of the roofline of 0.0 GB/s" in faster.drift
    assert bw.cached(cache / "hardware", bw.profile_key(hw)).suspect == faster.drift
    assert "measured again" in calibration.drift_note(faster.drift)


def test_buffer_size_bounds():
    assert bw.buffer_size(32 << 20, 64 << 30) == 256 << 20
    assert bw.buffer_size(480 << 20, 64 << 30) == 512 << 20
    assert bw.buffer_size(8 << 20, 1 << 30) == 128 << 20  # an eighth of 1 GiB free


def run_record(ratio: float, load: MachineLoad | None, *, at: float = 0.0,
               bandwidth: float = 20.0) -> calibration.Measurement:
    return calibration.Measurement(ratio=ratio, predicted_tps=10, measured_tps=10 * ratio,
                                   model="m", n_gpu_layers=0, tokens=100, at=at, load=load,
                                   host_bandwidth_gbps=bandwidth)


def laptop(bandwidth: float = 20.0) -> HardwareProfile:
    hw = HardwareProfile.from_json((PROFILES / "laptop-8gb-cpu.json").read_text())
    return HardwareProfile.from_dict({**hw.to_dict(), "host_bandwidth_gbps": bandwidth})


def test_calibration_records_and_averages(tmp_path):
    hw = laptop()
    assert calibration.load_ratios(hw, tmp_path) == {}
    for ratio in (0.8, 0.9):
        calibration.record(hw, "CPU", run_record(ratio, QUIET), tmp_path)
    assert calibration.load_ratios(hw, tmp_path)["CPU"] == pytest.approx((0.8 * 0.9) ** 0.5)
    other = HardwareProfile.from_json((PROFILES / "raspberry-pi5-8gb.json").read_text())
    assert calibration.load_ratios(other, tmp_path) == {}
    # Ratios that corrected another bandwidth figure do not calibrate today's.
    assert calibration.load_ratios(laptop(40.0), tmp_path) == {}


def test_a_calibration_under_load_never_overwrites_a_quiet_one(tmp_path):
    hw = laptop()
    calibration.record(hw, "CPU", run_record(0.9, QUIET, at=1.0), tmp_path)
    for k in range(2 * calibration.KEEP):  # a bench on a busy machine, again and again
        calibration.record(hw, "CPU", run_record(0.25, BUSY, at=2.0 + k), tmp_path)
    assert calibration.load_ratios(hw, tmp_path) == {"CPU": pytest.approx(0.9)}
    records = calibration.history(hw, tmp_path)["CPU"]
    assert [r.ratio for r in records if r.quiet] == [0.9]  # not pushed out
    assert len(records) == 1 + calibration.KEEP and records[-1].load == BUSY
    # Only runs under load: the planner stays uncalibrated rather than learn x0.25.
    calibration.forget(hw, tmp_path)
    calibration.record(hw, "CPU", run_record(0.25, BUSY), tmp_path)
    assert calibration.load_ratios(hw, tmp_path) == {}


def test_old_calibration_records_are_read_and_not_used(tmp_path):
    hw = laptop()
    path = tmp_path / "hardware" / calibration.FILE
    path.parent.mkdir()
    path.write_text(json.dumps({calibration.profile_key(hw): {"CPU": [
        {"ratio": 0.25, "predicted_tps": 10, "measured_tps": 2.5, "model": "m",
         "n_gpu_layers": 0, "tokens": 100, "at": 0.0}, {"ratio": "bad"},
        {"ratio": "x", "predicted_tps": 10, "measured_tps": 2.5, "model": "m",
         "n_gpu_layers": 0, "tokens": 100, "at": 0.0}]}}))
    [old] = calibration.history(hw, tmp_path)["CPU"]
    assert old.load is None and not old.quiet  # its load is unknown: it may be the busy one
    assert calibration.load_ratios(hw, tmp_path) == {}


def test_a_run_above_the_roofline_gets_a_note_and_a_remeasure(home, tmp_path):
    from localinfer.config import Config
    from localinfer.protocol import ModelInfo
    from localinfer.runtime.types import Done, Timings, Usage

    model = tmp_path / "tiny.gguf"
    model.write_bytes(ggufgen.tiny_model())
    hw = probe(measure_bandwidth=False, with_build=False)
    cache = home / "cache" / "hardware"
    bw.store(cache, bw.profile_key(hw), figure(0.001, QUIET))  # a figure far too low
    info = ModelInfo(name="tiny", path=str(model), architecture="llama", quant="F32",
                     size_bytes=1, n_params=1, n_layers=2, n_gpu_layers=0, n_ctx_train=256,
                     n_ctx=256, n_slots=1, n_vocab=32)
    done = Done("x", "length", Usage(10, 101), Timings(
        prompt_tokens=10, completion_tokens=101, decode_tokens=100, decode_ms=1000.0))
    note = calibration.record_calibration(info, done, Config(), BUSY)
    assert note is not None and note.startswith("note: tiny decoded 100.0 tok/s, ")
    assert "of the roofline of 0.0 GB/s: the cached host bandwidth figure looks wrong" in note
    assert bw.cached(cache, bw.profile_key(hw)).suspect
    [recorded] = calibration.history(probe(measure_bandwidth=False))["CPU"]
    assert recorded.load == BUSY and recorded.drift and not recorded.quiet

    # With speculation a step makes several tokens: it is the steps that the roofline bounds.
    bw.store(cache, bw.profile_key(hw), figure(0.001, QUIET))  # measured again: not suspect
    speculative = Done("x", "length", Usage(10, 101), Timings(
        prompt_tokens=10, completion_tokens=101, decode_tokens=100, decode_ms=1000.0,
        drafted_tokens=80, accepted_tokens=60))
    note = calibration.record_calibration(info, speculative, Config(), QUIET)
    assert note is not None and note.startswith("note: tiny ran 40.0 decode steps/s, ")
    assert bw.cached(cache, bw.profile_key(hw)).suspect
    assert len(calibration.history(probe(measure_bandwidth=False))["CPU"]) == 1  # not a sample


def test_a_quiet_run_far_from_the_calibration_is_drift():
    m = run_record(2.5, QUIET)
    assert "x2.50 of the prediction where this machine's runs were x0.90" in \
        calibration.drift_reason(m, 0.9)
    assert calibration.drift_reason(m, 1.5) is None  # within DRIFT
    assert calibration.drift_reason(run_record(2.5, BUSY), 0.9) is None  # load explains it
    assert calibration.drift_reason(m, None) is None


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
                               decode_tokens=64, decode_tps=40.0, hw=hw, cache_dir=tmp_path,
                               load=QUIET)
    assert m.ratio == pytest.approx(40.0 / m.predicted_tps, rel=1e-3)
    # 30 GB/s over the starter's ~250 MB a token: a ceiling near 120 tok/s, nothing to doubt.
    assert 0.2 < m.roofline_share < 0.5 and m.drift is None and m.host_bandwidth_gbps == 30.0
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
    data = json.loads(plan.stdout)
    # Planned for the profile's own figures. Whether a quant reaches `plan`'s 10 tok/s depends
    # on the bandwidth measured just now: under load (a full test run beside it) none did,
    # and "choice" was null.
    assert data["hardware"]["host_bandwidth_gbps"] == profile.host_bandwidth_gbps
    assert data["candidates"] and {c["model"] for c in data["candidates"]} == {"qwen3:0.6b"}
    assert data["choice"] is None or data["choice"]["model"] == "qwen3:0.6b"


def test_plan_for_a_recorded_laptop():
    out = cli("plan", "qwen3", "--hardware", str(PROFILES / "laptop-8gb-cpu.json"))
    assert out.returncode == 0, out.stderr
    assert "Planning for the profile" in out.stdout and "Choice: qwen3:" in out.stdout
    assert "qwen3:32b-q8_0" in out.stdout and "too big" in out.stdout


def test_hw_shows_each_figure_with_its_load_and_reset_forgets_them(home):
    hw = probe(measure_bandwidth=False)  # with the build's backends: the calibration's key
    cache = home / "cache" / "hardware"
    bw.store(cache, bw.profile_key(hw), figure(900.0, QUIET, at=1.0))
    bw.store(cache, bw.profile_key(hw), figure(450.0, BUSY, at=2.0))
    hw = HardwareProfile.from_dict({**hw.to_dict(), "host_bandwidth_gbps": 900.0})
    calibration.record(hw, "CPU", run_record(0.9, QUIET, bandwidth=900.0), home / "cache")
    calibration.record(hw, "CPU", run_record(0.25, BUSY, bandwidth=900.0), home / "cache")

    out = cli("hw")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "BANDWIDTH  900.0 GB/s host read, measured" in out.stdout
    assert any(line.startswith("MEASURED   900.0 GB/s on ") and "quiet (load 0.6, others kept"
               " 0.1 of 8 cores busy)" in line and line.endswith("in use") for line in lines)
    assert any(line.startswith("MEASURED   450.0 GB/s on ") and "under load (load 7.9" in line
               and line.endswith("not used (a quiet figure exists)") for line in lines)
    assert any(line.startswith("CALIBRATE  CPU x0.90") and line.endswith("; used")
               for line in lines)
    assert any(line.startswith("CALIBRATE  CPU x0.25") and "under load (load 7.9" in line
               and line.endswith("not used (not a quiet run)") for line in lines)

    out = cli("hw", "--reset")
    assert out.returncode == 0, out.stderr
    assert "Forgot this machine's bandwidth figures and decode calibration." in out.stderr
    entry = bw.cached(cache, bw.profile_key(hw))
    assert entry.current.measured_at > 2.0 and entry.current.load is not None  # measured anew
    assert calibration.history(hw, home / "cache") == {}
    assert "CALIBRATE  none yet" in out.stdout


@pytest.mark.parametrize("args", [["hw", "--remeasure"], ["hw"]])
def test_hw_remeasure_compares_with_the_cached_figure(home, args):
    hw = probe(measure_bandwidth=False, with_build=False)
    bw.store(home / "cache" / "hardware", bw.profile_key(hw), figure(0.5, BUSY, at=1e9))
    # `hw` measures again a figure taken under load; --remeasure measures again any figure.
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    # Any machine reads faster than 0.5 GB/s: the new figure replaces one under load.
    assert "NOTE       host bandwidth measured again: " in out.stdout
    assert ", was 0.5 GB/s on 2001-09-0" in out.stdout and "kept the new one" in out.stdout


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
    from localinfer.paths import get_paths
    from localinfer.planner.calibration import record_calibration
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


# --- the llama.cpp build: its backends, and the rebuild for a GPU it cannot use --------------
def test_the_build_names_the_backends_compiled_in():
    from localinfer.hardware.probe import probe_build

    build = probe_build()
    assert build.compiled[:1] == ("CPU",) or "CPU" in build.compiled
    assert "RPC" in build.compiled  # packaging/install.sh always builds it
    assert set(build.backends) - {"CPU"} <= set(build.compiled)


def test_a_gpu_the_build_cannot_use_gets_the_exact_rebuild_command(home, monkeypatch):
    probes = importlib.import_module("localinfer.hardware.probe")  # the package's probe()
    from localinfer.cli.plan import hardware_lines
    from localinfer.hardware.profile import GPUInfo

    rtx = GPUInfo(name="NVIDIA GeForce RTX 4070", vendor="nvidia", kind="discrete",
                  vram_total_gib=12.0, vram_free_gib=11.5, bandwidth_gbps=504.0)
    monkeypatch.setattr(probes, "probe_nvidia", lambda: ([rtx], []))
    monkeypatch.setattr(probes, "probe_build", lambda: probes.BuildInfo(
        ("CPU",), (), 1.0, (), ("CPU", "RPC")))
    hw = probes.probe(measure_bandwidth=False)
    lines = dict(hardware_lines(hw))
    assert "NOT usable by this llama.cpp build" in lines["GPU"]
    assert lines["LLAMA.CPP"].endswith("built with CPU, RPC")
    [note] = [n for n in hw.notes if "CPU-only" in n]
    assert (f'CMAKE_ARGS="-DGGML_RPC=on -DGGML_CUDA=on" {sys.executable} -m pip install'
            " --force-reinstall --no-cache-dir --no-deps --no-binary llama-cpp-python"
            " llama-cpp-python==") in note
    assert "packaging/install.sh" in note and "--gpu cuda" in note


@pytest.mark.parametrize(("vendor", "flag"), [
    ("amd", "-DGGML_HIP=on"), ("apple", "-DGGML_METAL=on"), ("intel", "-DGGML_VULKAN=on")])
def test_the_rebuild_command_follows_the_vendor(vendor, flag):
    from localinfer.hardware.probe import rebuild_command
    from localinfer.hardware.profile import GPUInfo

    gpu = GPUInfo(name="x", vendor=vendor, kind="discrete", vram_total_gib=8.0,
                  vram_free_gib=8.0, bandwidth_gbps=200.0)
    assert f'CMAKE_ARGS="-DGGML_RPC=on {flag}" /venv/bin/python -m pip' in rebuild_command(
        gpu, "/venv/bin/python")


def test_a_device_only_llama_cpp_sees_takes_its_kind_from_llama_cpp():
    from localinfer.hardware.probe import BuildInfo, _merge_build_devices

    build = BuildInfo(("CPU", "Vulkan"), (
        ("llvmpipe (LLVM 15.0.6, 256 bits)", "Vulkan", 8 << 30, 16 << 30, "igpu"),
        ("AMD Radeon RX 7600 (RADV NAVI33)", "Vulkan", 7 << 30, 8 << 30, "gpu")), 1.0)
    shared, discrete = _merge_build_devices([], build, 12.5)
    assert (shared.kind, shared.unified_memory, shared.bandwidth_gbps) == ("integrated", True,
                                                                          12.5)
    assert (discrete.kind, discrete.vendor, discrete.vram_total_gib) == ("discrete", "amd", 8.0)
    assert shared.backends == discrete.backends == ("Vulkan",)
