"""The planner against published llama-bench results on hardware we do not have
(tests/data/published_llama_bench.csv, with each row's source). A loose guard only: the shares
within +-10% / +-25% per backend, on the rows fitted on and the rows held out, are what
bench/planner_published.py reports. Predictions are uncalibrated, at n_ctx 512, with every
layer where llama-bench put it.
"""

from __future__ import annotations

import pytest

from published_rows import load_rows, predict

ROWS = load_rows()
OUTCOMES = [predict(row) for row in ROWS]


def test_the_table_has_rows_of_every_backend_and_a_source_for_each():
    assert {r.backend for r in ROWS} >= {"Metal", "CUDA", "ROCm", "Vulkan", "CPU"}
    assert all(r.source.startswith("https://") and r.role in ("fit", "held") for r in ROWS)
    assert sum(r.role == "held" for r in ROWS) > len(ROWS) / 2


@pytest.mark.parametrize("outcome", OUTCOMES, ids=[o.row.what for o in OUTCOMES])
def test_each_row_is_within_a_factor_of_two(outcome):
    # A physics error (bandwidths summed over sockets, FP16 counted twice) shows up as 2x or more.
    assert 0.5 <= outcome.decode_tps / outcome.row.tg128 <= 2.0
    if outcome.row.pp512:
        assert 0.4 <= outcome.prefill_tps / outcome.row.pp512 <= 2.5


def test_most_held_out_rows_are_within_25_percent():
    held = [o for o in OUTCOMES if o.row.role == "held"]
    decode = [abs(o.decode_error) <= 0.25 for o in held]
    prefill = [abs(o.prefill_error) <= 0.25 for o in held if o.prefill_error is not None]
    report = ", ".join(f"{o.row.what}: {o.decode_error:+.0%}" for o in held)
    assert sum(decode) >= 0.8 * len(decode), report
    assert sum(prefill) >= 0.5 * len(prefill)


def test_an_immature_backend_says_so_in_the_plan():
    mi300x = next(o for o in OUTCOMES if "MI300X" in o.row.device)
    assert "immature backend" in mi300x.reason
    rtx = next(o for o in OUTCOMES if "RTX 4090" in o.row.device and o.row.backend == "CUDA")
    assert "immature" not in rtx.reason


def test_full_offload_is_what_the_published_gpu_rows_ran():
    for outcome in OUTCOMES:
        if outcome.row.machine.gpus:
            assert str(outcome.row.candidate.n_layers + 1) + "/" in outcome.reason, \
                outcome.row.what
