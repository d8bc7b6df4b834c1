"""The self-check `localinfer bench` keeps (planner/selfcheck.py) and `hw --report`'s JSON
line: the plan's figures against the measured ones, inside its interval or not, anonymous."""

from __future__ import annotations

import json
import socket

from localinfer.cli import main
from localinfer.hardware import load_profile
from localinfer.hardware.probe import probe
from localinfer.planner import selfcheck
from localinfer.planner.machine import DECODE_INTERVAL, PREFILL_INTERVAL
from test_planner import PROFILES


def check(hw, *, backend="CUDA", n_gpu_layers=33, measured_decode=80.0, quiet=True):
    return selfcheck.build(
        hw, backend=backend, model="llama3.1:8b-q4_k_m", quant="Q4_K_M",
        size_bytes=4_920_000_000, n_gpu_layers=n_gpu_layers, n_layers=32, threads=8,
        predicted_decode=100.0, measured_decode=measured_decode, predicted_prefill=5000.0,
        measured_prefill=5200.0, prefill_tokens=512, quiet=quiet)


def test_a_check_says_how_far_off_the_plan_was_and_if_inside_its_interval():
    hw = load_profile(PROFILES / "desktop-rtx4090-64gb.json")
    c = check(hw)
    assert c.device == "NVIDIA GeForce RTX 4090" and c.kind == "discrete"
    assert c.decode.error == 0.25 and c.prefill is not None
    low, high = DECODE_INTERVAL["CUDA"]
    assert (c.decode.low, c.decode.high) == (100 * low, 100 * high)
    assert c.decode.inside == (100 * low <= 80 <= 100 * high)
    assert c.prefill.inside and PREFILL_INTERVAL["CUDA"][0] * 5000 <= 5200
    text = "\n".join(c.lines())
    assert "decode: measured 80.0 tok/s, the plan predicted 100.0" in text
    assert "25% over the measurement" in text
    assert "prefill (512 tokens): measured 5200" in text
    # On the CPU the device is the CPU's model and its host bandwidth.
    cpu = check(hw, backend="CPU", n_gpu_layers=0)
    assert (cpu.device, cpu.kind) == (hw.cpu.model, "cpu")
    assert "busy" in "\n".join(check(hw, quiet=False).lines())


def test_the_report_line_is_anonymous_json(tmp_path):
    hw = load_profile(PROFILES / "desktop-rtx4090-64gb.json")
    line = check(hw).report()
    assert "\n" not in line
    data = json.loads(line)
    assert data["device"] == "NVIDIA GeForce RTX 4090" and data["backend"] == "CUDA"
    assert data["decode"] == {"predicted": 100.0, "measured": 80.0,
                              "interval": [round(100 * v, 2) for v in DECODE_INTERVAL["CUDA"]]}
    assert data["model"] == "llama3.1:8b-q4_k_m" and data["quant"] == "Q4_K_M"
    assert socket.gethostname() not in line and str(tmp_path) not in line


def test_checks_are_kept_per_machine_newest_last(tmp_path):
    hw = load_profile(PROFILES / "desktop-rtx4090-64gb.json")
    other = load_profile(PROFILES / "laptop-8gb-cpu.json")
    for k in range(selfcheck.KEEP + 2):
        selfcheck.record(hw, check(hw, measured_decode=50.0 + k), tmp_path)
    kept = selfcheck.checks(hw, tmp_path)
    assert len(kept) == selfcheck.KEEP and kept[-1].decode.measured == 50.0 + selfcheck.KEEP + 1
    assert selfcheck.checks(other, tmp_path) == []
    (tmp_path / "hardware" / selfcheck.FILE).write_text('{"x": [1]}')
    assert selfcheck.checks(hw, tmp_path) == []


def test_hw_report_prints_this_machines_checks(home, capsys):
    assert main(["hw", "--report"]) == 1
    assert "run `localinfer bench`" in capsys.readouterr().err
    hw = probe(measure_bandwidth=False)
    selfcheck.record(hw, check(hw, backend="CPU", n_gpu_layers=0))
    assert main(["hw", "--report"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["decode"]["measured"] == 80.0
