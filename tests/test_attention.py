"""planner/attention.py: the attention set-up of a CPU load, from this machine's measurements
of each (``bench --prefill``), and loading.options_for taking it."""

from __future__ import annotations

import json
from pathlib import Path

from localinfer import gguf
from localinfer.config import Config
from localinfer.hardware import load_profile
from localinfer.loading import options_for, with_batches
from localinfer.planner import attention
from localinfer.planner.attention import (
    MIN_REQUESTS,
    choose,
    file_key,
    forget,
    measured,
    record,
)
from localinfer.runtime.workload import Workload

PROFILES = Path(__file__).parent / "profiles"


def rows(rates: dict[tuple[bool, int], dict[int, float]]) -> list[dict]:
    return [{"flash_attn": fa, "n_ubatch": ub, "tokens": n, "prefill_tps": tps}
            for (fa, ub), by_length in rates.items() for n, tps in by_length.items()]


# Shaped like a 2-core CPU's: flash attention a little slower on short prompts, much faster
# on long ones.
RATES = {(False, 256): {1024: 700.0, 16384: 200.0},
         (False, 512): {1024: 690.0, 16384: 190.0},
         (True, 256): {1024: 650.0, 16384: 330.0},
         (True, 512): {1024: 680.0, 16384: 350.0}}


def entry(rates=RATES, busy_share=0.0) -> dict:
    return {"busy_share": busy_share, "rows": rows(rates)}


def test_the_set_up_that_reads_the_workload_fastest_wins():
    choice = choose(entry(), rule=(False, 256))
    assert choice is not None and (choice.flash_attn, choice.n_ubatch) == (True, 512)
    assert "flash attention on, 512-row batches: measured here" in choice.reason
    assert "prefill at 16,384 tokens 1.75x" in choice.reason
    assert "prefill at 1,024 tokens 0.97x" in choice.reason
    assert "weighing one prompt of each length: no workload seen here yet" in choice.reason


def test_the_workload_weighs_each_length_by_its_reading_time():
    # Only short prompts: the rule (flash attention 3% slower there).
    short = Workload(requests=50, prompts={256: 50 * 200})
    choice = choose(entry(), short, rule=(False, 256))
    assert choice is not None and (choice.flash_attn, choice.n_ubatch) == (False, 256)
    # One long prompt in twenty takes more time than the nineteen short ones: flash attention.
    mixed = Workload(requests=20, prompts={1024: 19 * 900, 32768: 20000})
    choice = choose(entry(), mixed, rule=(False, 256))
    assert choice is not None and choice.flash_attn
    assert "weighing the work of 20 requests here: reading prompts 100%" in choice.reason


# As this 2-core CPU measured the starter: flash attention reads a fresh prompt a little faster
# and generates faster, and reads a next turn after a history slower.
KINDS = [{"flash_attn": fa, "n_ubatch": 512, "kind": kind, "tokens": n, "tps": tps}
         for fa, kind, n, tps in [
             (False, "prompt", 1024, 640.0), (True, "prompt", 1024, 680.0),
             (False, "turn", 1200, 530.0), (True, "turn", 1200, 380.0),
             (False, "decode", 1, 65.0), (True, "decode", 1, 71.0),
             (False, "decode", 4, 101.0), (True, "decode", 4, 125.0)]]


def test_the_work_seen_here_decides_between_turns_and_streams():
    """A daemon that mostly answers next turns of long chats keeps flash attention off;
    one that mostly generates several streams at once takes it; too little seen weighs one
    prompt of each length."""
    measurement = {"busy_share": 0.0, "rows": KINDS}
    turns = Workload(requests=100, prompts={1024: 5000}, turns=100 * 60, decode={1: 1000})
    choice = choose(measurement, turns, rule=(False, 512))
    assert choice is not None and not choice.flash_attn
    # The share of the time each kind took (with the rule's rates): 7.8, 11.3 and 15.4 s.
    assert ("the work of 100 requests here: reading prompts 23%, next turns 33%, generating"
            " 45% of the time") in choice.reason
    streams = Workload(requests=100, prompts={1024: 5000}, turns=100 * 60,
                       decode={1: 2000, 3: 9000, 4: 20000})
    choice = choose(measurement, streams, rule=(False, 512))
    assert choice is not None and choice.flash_attn
    assert "a next turn after 1,200 0.72x" in choice.reason and "4 stream(s) 1.24x" in choice.reason
    little = Workload(requests=MIN_REQUESTS - 1, turns=10**6)
    choice = choose(measurement, little, rule=(False, 512))
    assert choice is not None and not choice.flash_attn  # the prompts alone: 1.06x, noise
    assert "no workload seen here yet" in choice.reason
    # Streams after a line, where flash attention generates faster: taken for a daemon
    # whose streams generate there, not for one whose streams generate after a history.
    short = KINDS + [{"flash_attn": fa, "n_ubatch": 512, "kind": "decode_short", "tokens": n,
                      "tps": tps} for fa, n, tps in [(False, 1, 66.0), (True, 1, 72.0),
                                                      (False, 4, 95.0), (True, 4, 118.0)]]
    long_rates = [row if row["kind"] != "decode" or not row["flash_attn"] else
                  {**row, "tps": {1: 60.0, 4: 100.0}[row["tokens"]]} for row in short]
    measurement = {"busy_share": 0.0, "rows": long_rates}
    after_a_line = Workload(requests=100, prompts={16: 1200}, decode_short={4: 20000})
    choice = choose(measurement, after_a_line, rule=(False, 512))
    assert choice is not None and choice.flash_attn
    assert "4 stream(s) after a line 1.24x" in choice.reason
    after_history = Workload(requests=100, prompts={16: 1200}, decode={4: 20000})
    choice = choose(measurement, after_history, rule=(False, 512))
    assert choice is not None and not choice.flash_attn
    # A measurement from before kinds were measured: its rows are prompts, its rate prefill.
    old = {"busy_share": 0.0, "rows": rows({(False, 512): {1024: 640.0},
                                            (True, 512): {1024: 500.0}})}
    choice = choose(old, streams, rule=(False, 512))
    assert choice is not None and not choice.flash_attn


def test_noise_does_not_flip_the_rule():
    close = {(False, 256): {1024: 700.0, 16384: 200.0},
             (True, 512): {1024: 700.0, 16384: 215.0}}  # 7% faster: within MIN_GAIN
    choice = choose(entry(close), rule=(False, 256))
    assert choice is not None and (choice.flash_attn, choice.n_ubatch) == (False, 256)


def test_a_measurement_under_load_or_with_holes_decides_nothing():
    assert choose(entry(busy_share=0.5), rule=(False, 256)) is None
    holes = {**RATES, (True, 512): {1024: 680.0}}
    assert choose(entry(holes), rule=(False, 256)) is None


def test_records_per_machine_and_file_survive_a_bad_entry(tmp_path):
    hw = load_profile(PROFILES / "laptop-8gb-cpu.json")
    other = load_profile(PROFILES / "raspberry-pi5-8gb.json")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    record(hw, model, "m:1b", rows(RATES), busy_share=0.1, cache_dir=tmp_path)
    got = measured(hw, tmp_path)
    assert list(got) == [file_key(model)] and got[file_key(model)]["model"] == "m:1b"
    assert measured(other, tmp_path) == {}  # another machine's figures are not this one's
    # A hand-edited or torn entry is skipped, the rest kept.
    path = tmp_path / "hardware" / attention.FILE
    data = json.loads(path.read_text())
    key = next(iter(data))
    data[key]["broken"] = {"rows": [{"flash_attn": True}], "busy_share": 0, "path": "x"}
    path.write_text(json.dumps(data))
    assert list(measured(hw, tmp_path)) == [file_key(model)]
    path.write_text("{not json")
    assert measured(hw, tmp_path) == {}
    record(hw, model, "m:1b", rows(RATES), busy_share=0.1, cache_dir=tmp_path)
    assert forget(hw, tmp_path) and measured(hw, tmp_path) == {}
    assert not forget(hw, tmp_path)


def test_a_cpu_load_takes_the_measured_set_up(home, starter_path):
    """options_for on the real starter's header: the rule without a measurement (flash
    attention off, the window model's 256-row batches and their checkpoints), the measured
    set-up with one, and the settings' own choice over both."""
    hw = load_profile(PROFILES / "laptop-8gb-cpu.json")
    header = gguf.read_header(starter_path)
    config = Config()

    def load(cfg: Config = config):
        return with_batches(options_for(header, cfg, hardware=hw, name="gemma3:270m",
                                        path=starter_path), header, "gemma3:270m")

    rule = load()
    assert rule.flash_attn is None and rule.n_ubatch == 512 and rule.cpu_window_ubatch == 256
    record(hw, starter_path, "gemma3:270m", rows(RATES), busy_share=0.0)
    chosen = load()
    assert (chosen.flash_attn, chosen.n_ubatch, chosen.cpu_window_ubatch) == (True, 512, 0)
    # The settings decide where they say: flash attention off, or a quantized cache.
    assert load(config.replace(flash_attn="off")).flash_attn is False
    assert load(config.replace(kv_type="q8_0")).measured_ubatch == 0
    # A measurement that picks the rule's own set-up leaves its batches and checkpoints.
    slow_fa = {(False, 256): {1024: 700.0, 16384: 300.0}, (True, 512): {1024: 500.0,
                                                                         16384: 280.0}}
    record(hw, starter_path, "gemma3:270m", rows(slow_fa), busy_share=0.0)
    assert load() == rule
