"""`localinfer bench --quick` end to end on the real model (figures are printed, not asserted:
only that every measurement ran and hangs together)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_bench_quick_json(starter_path):
    out = subprocess.run([sys.executable, "-m", "localinfer", "bench", "gemma3:270m", "--quick",
                          "--json"], capture_output=True, text=True, timeout=600,
                         env={**os.environ})
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["model"] == "gemma3:270m-q4_k_m" and r["quick"] is True
    assert [p["tokens"] for p in r["prefill"]] == [128, 512]
    assert all(p["prefill_tps"] > 0 and p["ttft_ms"] > 0 for p in r["prefill"])
    d = r["decode"]
    assert d["decode_tps"] > 0 and d["bare_step_tps"] > 0 and d["bytes_per_token"] > 2e8
    assert d["share_of_roofline"] == pytest.approx(d["decode_tps"] / d["roofline_tps"])
    assert [c["streams"] for c in r["concurrency"]] == [1, 4]
    assert all(c["complete"] for c in r["concurrency"])
    one, four = r["concurrency"]
    assert one["equal_to_solo"] == 1  # the same computation as the solo run
    # A stream in a batch of 4 may part from its solo run only where the solo run's best two
    # tokens nearly tied (llama.cpp rounds a batch differently from one row on some CPUs).
    assert four["equal_to_solo"] + four["diverged_at_near_tie"] == 4, four
    assert [row["streams"] for row in r["speculation_streams"]] == [1, 4]
    assert all(row[f"{mode}_tps"] > 0 for row in r["speculation_streams"]
               for mode in ("off", "on", "adaptive"))
    cr = r["chat_reuse"]
    assert cr["cached_tokens"] > 1000 and cr["history_tokens"] > 1400
    assert cr["ttft_without_reuse_ms"] > cr["ttft_with_reuse_ms"]
    s = r["speculation"]
    assert s["identical"] or s["diverged_at_near_tie"], s  # the same rule as for batches
    assert s["accepted"] > 0 and s["adaptive_tps"] > 0
    st = r["structured"]
    assert st["schema_tps"] > 0 and st["plain_tps"] > 0 and st["tool_call_parsed"], st
    assert st["sampled_schema_tps"] > 0 and st["sampled_plain_tps"] > 0, st
    assert r["calibration"]["ratio"] > 0
    b = r["busy_machine"]
    assert [row["load"] for row in b["rows"]] == ["idle", "one_core_busy"], b
    assert all(row[k] > 0 for row in b["rows"] for k in ("1_thread", "all_threads", "adaptive"))
    assert "bench [10/10] busy machine" in out.stderr  # progress was shown
    # The self-check: the plan's decode and 512-token prefill against the measured ones, kept
    # for `hw --report`'s JSON line.
    assert [line.split(":")[0] for line in r["self_check"][:2]] == [
        "decode", "prefill (512 tokens)"], r["self_check"]
    report = subprocess.run([sys.executable, "-m", "localinfer", "hw", "--report"],
                            capture_output=True, text=True, timeout=120, env={**os.environ})
    assert report.returncode == 0, report.stderr
    line = json.loads(report.stdout.strip().splitlines()[-1])
    assert line["model"] == "gemma3:270m-q4_k_m" and line["backend"] == "CPU"
    assert line["decode"]["measured"] == pytest.approx(d["decode_tps"], abs=0.01)
    assert line["decode"]["predicted"] == pytest.approx(d["predicted_tps"], abs=0.01)
    pp512 = next(p for p in r["prefill"] if p["tokens"] == 512)
    assert line["prefill"]["measured"] == pytest.approx(pp512["prefill_tps"], abs=0.01)


@pytest.mark.timeout(600)
def test_bench_prefill_reads_each_length_fresh_with_each_setup(home, starter_path):
    """One real sweep (in a home of its own): each set-up's fresh prompts, next turn and
    streams; the measurement recorded for loads; the sweep's own loads not counted as the
    model's work."""
    from localinfer.bench.prefill_bench import report
    from localinfer.hardware import probe
    from localinfer.planner import attention

    out = subprocess.run([sys.executable, "-m", "localinfer", "bench", "gemma3:270m",
                          "--prefill", "--lengths", "64,300", "--setups", "on-512",
                          "--json"],
                         capture_output=True, text=True, timeout=600, env={**os.environ})
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["model"] == "gemma3:270m-q4_k_m" and r["trained_ctx"] == 32768
    setups = {(row["flash_attn"], row["n_ubatch"]) for row in r["rows"]}
    assert setups == {(True, 512)}  # one, to keep the suite short: flash attention's load
    prompts = [row for row in r["rows"] if row["kind"] == "prompt"]
    assert sorted(row["tokens"] for row in prompts) == [64, 300]
    # Fresh: nothing of any prompt was in the cache before it.
    assert all(row["cached_tokens"] == 0 and row["prefill_tps"] > 0 and row["ttft_ms"] > 0
               for row in prompts)
    # And for each set-up a next turn after a history, and one stream and four generating.
    assert sorted((row["kind"], row["tokens"]) for row in r["rows"] if row not in prompts) == \
        [("decode", 1), ("decode", 4), ("decode_short", 1), ("decode_short", 4), ("turn", 1200)]
    assert all(attention.row_tps(row) > 0 for row in r["rows"])
    entry = attention.measured(probe(measure_bandwidth=False)).get(
        attention.file_key(starter_path))
    assert entry is not None and len(entry["rows"]) == 7
    assert r["verdict"]  # which set-up loads take now, or why none
    assert not (home / "cache" / "workload").exists()
    table = report(r)
    assert "turn@1,200" in table and "4 stream(s)" in table and "4 after a line" in table
    assert r["verdict"] in table


def test_setups_are_read_as_written_once_each():
    from localinfer.bench.prefill_bench import Setup, parse_setups

    assert parse_setups("off-256, on-512,off-256") == (Setup(False, 256), Setup(True, 512))
    for bad in ("on", "on-16", "maybe-256", "off-256x", ""):
        with pytest.raises(ValueError, match="is not a set-up"):
            parse_setups(bad)


def test_bench_prefill_refuses_bad_lengths_and_setups():
    out = subprocess.run([sys.executable, "-m", "localinfer", "bench", "--prefill",
                          "--lengths", "4k"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--lengths must be token counts" in out.stderr
    out = subprocess.run([sys.executable, "-m", "localinfer", "bench", "--prefill",
                          "--setups", "off-256,fast"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--setups: 'fast' is not a set-up" in out.stderr
