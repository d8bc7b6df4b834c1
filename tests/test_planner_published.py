"""The planner against published llama-bench results on hardware we do not have
(tests/data/published_llama_bench.csv, with each row's source). A loose guard only: the shares
within +-10% / +-25% per backend, on the rows fitted on and the rows held out, are what
bench/planner_published.py reports. Predictions are uncalibrated, at n_ctx 512, with every
layer where llama-bench put it.
"""

from __future__ import annotations

import pytest

import published_rows
from published_rows import Outcome, load_rows, predict

ROWS = load_rows()
OUTCOMES = [predict(row) for row in ROWS]


def test_the_table_has_rows_of_every_backend_and_a_source_for_each():
    assert {r.backend for r in ROWS} >= {"Metal", "CUDA", "ROCm", "Vulkan", "CPU"}
    assert all(r.source.startswith("https://") and r.role in ("fit", "held") for r in ROWS)
    assert sum(r.role == "held" for r in ROWS) > len(ROWS) / 2
    # A row read in a copy names the publication it copies.
    assert all(r.note.startswith("copy of ") for r in ROWS if r.verified == "retrieved-copy")


def test_an_unverified_row_is_refused(tmp_path, monkeypatch):
    text = published_rows.ROWS_CSV.read_text().replace(",retrieved,", ",from memory,", 1)
    (tmp_path / "rows.csv").write_text(text)
    monkeypatch.setattr(published_rows, "ROWS_CSV", tmp_path / "rows.csv")
    with pytest.raises(ValueError, match="not verified against a retrieved source"):
        published_rows.load_rows()


def within(outcome: Outcome, decode: float, prefill: tuple[float, float]) -> bool:
    pp = outcome.row.pp512
    return (1 / decode <= outcome.decode_tps / outcome.row.tg128 <= decode
            and (not pp or prefill[0] <= outcome.prefill_tps / pp <= prefill[1]))


def test_rows_are_within_a_factor_of_two():
    # A physics error (bandwidths summed over sockets, FP16 counted twice) shows up as 2x or more
    # on a whole class of rows. Past 2x today (20 of 318 rows off SBC hosts): a Radeon 780M at
    # 53 tok/s prefill where another publication of it has 254 (normiebench #6 and #10); a 3B
    # Strix Halo prefill on a ROCm+RPC build; two normiebench setups far below their GPUs (an
    # Arc A770 at 5.9 tok/s, an RTX 4080 SUPER at 30); a QCS6490 run on all eight of its big and
    # little cores; old builds held out (Dec 2023 Q4_0 prefill on a power-limited RTX 6000 Ada,
    # an early 2024 CPU prefill, the March 2024 Vulkan builds on an RX 6700 XT and an RX 5700 XT,
    # whose decode then ran at 0.6x of what a May 2025 build reaches on the same card, batch
    # 38g); Strix Halo's Vulkan prefill of a 70B model with -fa 1 in a mid-2025 build (26 tok/s
    # where another publication's no-FA run has 79); the 2x Instinct MI50's BF16 prefill (no BF16
    # units on GCN); and an ASUS GX10 (GB10) whose whole run decoded at a third of its LPDDR5X
    # bandwidth (batch 38f); a Radeon 890M's prefill on AMDVLK without matrix cores (70B) and on
    # ROCm 6.3 with gfx1151 kernels forced (four rows, 3.6-3.7x too fast; batch 38h); Strix
    # Halo's prefill on AMDVLK v2025.Q2.1, which reports half its shared memory (306 tok/s where
    # RADV reaches 1,074 on the same build), and an Arc A770 on Windows' Vulkan driver without
    # integer dot products or matrix cores (gemma2 2B, 3.2x too fast; batch 38i); and the
    # Ubuntu runs of ggml-org/llama.cpp#14001 on Mesa 24.2.8 (an Arc B580, an A770 and a Lunar
    # Lake iGPU decoding at a third of what the same PCs reach on Windows' driver, batch 38k);
    # an Arc Pro B70 on Vulkan whose decode is half its own SYCL run's in the same publication
    # and prefill twice it (four rows, batch 38l).
    # GPUs behind a Raspberry Pi's or a RISC-V board's PCIe lane are out of this guard (their
    # host's driver path: machine.ARM_HOST_*). 27 of 348 rows are past 2x today.
    outcomes = [o for o in OUTCOMES if not o.row.sbc_host]
    outside = [o.row.what for o in outcomes if not within(o, 2.0, (0.4, 2.5))]
    assert len(outside) <= 0.078 * len(outcomes), outside
    # Past 3x: only such rows (17 of 348).
    far = [o.row.what for o in outcomes if not within(o, 3.0, (0.33, 3.0))]
    assert len(far) <= 0.053 * len(outcomes), far


def share_within(outcomes: list[Outcome], what: str) -> float:
    errors = [o.decode_error if what == "decode" else o.prefill_error for o in outcomes]
    kept = [e for e in errors if e is not None]
    return sum(abs(e) <= 0.25 for e in kept) / len(kept)


def test_most_held_out_rows_are_within_25_percent():
    held = [o for o in OUTCOMES if o.row.role == "held"]
    report = ", ".join(f"{o.row.what}: {o.decode_error:+.0%}" for o in held)
    # Issue 38's goals on held-out rows: decode >= 90% of all rows, >= 75% off Apple, >= 65% of
    # discrete GPUs; prefill >= 75% of all rows, >= 55% off Apple. The held rows today (231): the
    # Metal rows, the rows of pre-2025 builds (the planner follows recent builds and predicts
    # those too fast, on purpose), batches 38c, 38e, 38f, 38g, 38h, 38i, 38j, 38k and 38l (253).
    # Met: decode 82% of all (goal 90%: NOT met; 83% before batch 38l's 22 rows came in, 85%
    # before 38j's 13), 76% off Apple (goal 75%: met; 77% before 38l), 73% of discrete GPUs
    # (goal 65%: met); prefill 57% of all (goal 75%: NOT met; 60% before 38l, 62% before 38j),
    # 43% off Apple (goal 55%: NOT met; 45% before 38l, 46% before 38j and 38k, 41% with batch
    # 38i before the 38i pass, 39% before that batch). Batch 38l alone, predicted with the 38k
    # constants: decode 16 of 22 (SYCL's B70 rows 15-26% faster than predicted, its Vulkan rows
    # half as fast), prefill 6 of 22 (the B70's K-quant and Q8_0 prompts on SYCL at 0.55-0.7 of
    # the rate predicted where its Q4_0 ran 1.24 of it, and an Arc B580 fit row 2.2x).
    # These assert what is met, so that a regression fails;
    # bench/planner_published.py prints the tables.
    off_apple = [o for o in held if not o.row.apple]
    discrete = [o for o in held if o.row.kind == "discrete"]
    assert share_within(held, "decode") >= 0.81, report
    assert share_within(off_apple, "decode") >= 0.76, report
    assert share_within(discrete, "decode") >= 0.72, report
    assert share_within(held, "prefill") >= 0.57
    assert share_within(off_apple, "prefill") >= 0.43
    # The 124 held rows before batch 38f: decode 90%, prefill 73% of all and 48% off Apple.
    before = [o for o in held
              if o.row.batch not in ("38f", "38g", "38h", "38i", "38j", "38k", "38l")]
    assert share_within(before, "decode") >= 0.90
    assert share_within(before, "prefill") >= 0.72
    assert share_within([o for o in before if not o.row.apple], "prefill") >= 0.48


def test_the_plans_intervals_hold_most_held_out_rows():
    # Issue 38 asks for ~80%. The intervals (machine.DECODE_INTERVAL, PREFILL_INTERVAL) were
    # widened until 80% of batches 16/38's held rows fell inside (issue 38b); the 38g pass re-set
    # ROCm's decode interval by the same recipe, the 38h pass the CUDA, ROCm and Vulkan prefill
    # intervals on the rows of 2025-2026 builds (batch 38h left out), the 38i pass ROCm's again
    # by that recipe once its AMD iGPU share moved. On every held row today 83% of decode and
    # 83% of prefill figures fall inside (79% of prefill off Apple; 85%, 84% and 81% before
    # batch 38l; 73% and 64% before the 38h pass: 43% of the held Vulkan rows fell in
    # 0.69-1.23; 86% and 86% before batch 38k); on batch 38h 12 of 19 prefill figures (8
    # before); on batch 38i 25 of 25 decode and 10 of 12 prefill figures (9 before the pass); on
    # batch 38k 5 of 8 decode and 4 of 8 prefill; on batch 38l 14 and 15 of 22.
    held = [o for o in OUTCOMES if o.row.role == "held"]
    pre = [o for o in held if o.prefill_inside is not None]
    assert sum(o.decode_inside for o in held) >= 0.83 * len(held)
    assert sum(bool(o.prefill_inside) for o in pre) >= 0.82 * len(pre)
    off_apple = [o for o in pre if not o.row.apple]
    assert sum(bool(o.prefill_inside) for o in off_apple) >= 0.79 * len(off_apple)


def test_an_immature_backend_says_so_in_the_plan():
    arc = next(o for o in OUTCOMES if "Arc A770" in o.row.device)
    assert "immature backend" in arc.reason
    rtx = next(o for o in OUTCOMES if "RTX 4090" in o.row.device and o.row.backend == "CUDA")
    assert "immature" not in rtx.reason


def test_full_offload_is_what_the_published_gpu_rows_ran():
    for outcome in OUTCOMES:
        if outcome.row.machine.gpus:
            assert str(outcome.row.candidate.n_layers + 1) + "/" in outcome.reason, \
                outcome.row.what


# Each batch below was collected and predicted before the pass named after it changed any
# constant, and stays held out: (batch, rows at least, share of decode and of prefill
# figures within +-25% at least).
HOLD_OUTS = [
    # Batch 38c: 27 rows of 2025-2026 builds (Strix Halo on HIP and Vulkan, RX 7900 XTX, a 2x
    # Instinct MI50, RTX 3060, Radeon 890M, three CPUs), collected and predicted before the 38c
    # refit and never fitted on. Decode: 93% within +-25% (78% before the 38g decode pass, whose
    # GCN rule brought the MI50 rows in; goal 75% off Apple: met); prefill: 54% (goal 55% off
    # Apple: NOT met; 31% before the 38c refit, 42% after it).
    ("38c", 27, 0.92, 0.50),
    # Batch 38e: six rows of an RTX 5090 on an April 2026 CUDA build (Qwen2.5 3B to 32B, Q4_K_M
    # and Q8_0), collected after the 38c refit: a check of its constants on rows nobody had
    # seen. Decode: 6 of 6 within +-25%; prefill: 6 of 6 since the per-layer cost of a prompt
    # batch (machine.PREFILL_LAYER_MS; before it the 3B was at +53%).
    ("38e", 6, 0.99, 0.99),
    # Batch 38f: 25 rows of 2025-2026 builds collected before the 38f prefill pass changed any
    # constant (Strix Halo on RADV, AMDVLK and ROCm with 12B-72B Q8_0 models, an RX 480 and an
    # RTX 2070 on Vulkan without matrix cores, an RTX 4090 on a 3B, a 2x MI50's K-quants, an
    # ASUS GX10, an RX 7900 XTX without coopmat). Before the pass: decode 40%, prefill 24%
    # within +-25%; after: 48% and 32%; after the 38g decode pass 52% and 32% (goals 75% and 55%
    # off Apple: NOT met). Seven of the 25 are one GX10 run at a third of its bandwidth, four
    # more the RTX 2070, whose Vulkan driver offered neither integer dot products nor matrix
    # cores, and the MI50's K-quants (+31%, +33% since the 38g GCN rule). Prefill 48% since the
    # 38i pass (the Strix Halo ROCm 7 rows at the derived iGPU share, the MI50's K-quants on dp4a).
    ("38f", 25, 0.52, 0.48),
    # Batch 38g: 17 rows of 2025-2026 builds collected before the 38g decode pass changed any
    # constant (RTX 3080/4080 on CUDA, RTX 3090, RX 9070 XT and RX 5700 XT on Vulkan, an RX
    # 7900 XTX on ROCm (two models), Strix Halo's Q2_K-Q4_K_S decode on Vulkan and ROCm).
    # Before the pass: decode 15 of 17 within +-25%, prefill 5 of 11; after it decode 16 of 17
    # (the RX 5700 XT, -39% -> +18%: its data-sheet FP16 counts double for the dequantizing
    # cap); prefill unchanged.
    ("38g", 17, 0.94, 0.45),
    # Batch 38h: 19 rows of 2025-2026 builds off Apple collected before the second prefill pass
    # changed any constant (an RTX 3090 on Vulkan with coopmat2 and with coopmat1 only, an RX
    # 7800 XT and an RX 9070 XT on Vulkan with and without coopmat flash attention, a Radeon Pro
    # VII (GCN5) on Vulkan, Strix Halo on Vulkan with coopmat, a Radeon 890M on AMDVLK without
    # matrix cores and on ROCm, 7B to 70B). Before the pass: decode 12 of 19 within +-25%,
    # prefill 2 of 19 (the 890M's prefill predicted 2.4x too fast on Vulkan, 3.7x on ROCm).
    ("38h", 19, 0.63, 0.10),
    # Batch 38i: 25 rows of 2025-2026 builds off Apple collected before the third prefill pass
    # changed any constant: Strix Halo (GMKtec EVO-X2, Feb 2026 build) on RADV with coopmat
    # (1.1B to 70B), on ROCm 7.2 and on AMDVLK; a Strix Halo Vulkan run of Aug 2025; an Arc
    # A770 on Windows' Vulkan driver; and decode-only rows of seven discrete GPUs on Vulkan in
    # one Intel PC (RTX 4090, 3080 Ti, 4070 Ti, 2080 Ti, 3060, RTX A4000, Radeon AI PRO R9700;
    # Llama 3.2 3B and a Qwen2.5 14B). Before the pass: decode 25 of 25 within +-25%, prefill
    # 8 of 12; after it prefill 10 of 12 (the two ROCm 7.2 rows, at the derived AMD iGPU share
    # on HIP, machine.ROCM_IGPU_MATRIX_ETA). Out: Strix Halo on AMDVLK and the Arc A770.
    ("38i", 25, 0.99, 0.83),
    # Batch 38j: 13 rows of discrete GPUs on 2025-2026 builds collected before the fourth
    # prefill pass changed any constant: an AI PRO R9700 (RDNA4) on ROCm 6.4.4, 7.1.1, 7.9 and a
    # ROCm 7 nightly, one GPU of two (kyuz0/amd-r9700-ai-toolboxes, Dec 2025 build 7423, fa 1;
    # Llama 2 7B Q4_0, Gemma 3 12B Q8_0, Gemma 3 4B Q3_K_S) and an RX 7900 XTX on AMDVLK
    # (ROCm/legacy-rocm-build#4868). Twelve of the 13 are one machine: they test the RDNA4 HIP
    # class, not the spread of publications. Before the pass: decode 8 of 13 within +-25%
    # (out: Gemma 3 4B +27..+29%, the 7900 XTX on AMDVLK +59%), prefill 6 of 13 (out: the
    # nightly toolbox's Q4_0/Q8_0 at half the other toolboxes' rate on the same build,
    # +122..+125%; Gemma 3 4B Q3_K_S +56..+59%; AMDVLK +43%). No constant changed in the pass
    # (docs/benchmarks.md).
    ("38j", 13, 0.61, 0.46),
    # Batch 38k: eight rows of 2025-2026 builds off Apple collected before the 38k pass changed
    # any constant: an Arc Pro B70 (Battlemage, 32 Xe2 cores) on SYCL and on Vulkan (build 9039,
    # May 2026, kyuz0/intel-b70-ai-toolboxes), the table of ggml-org/llama.cpp#14001 (June 2025:
    # a Lunar Lake Core Ultra 7 268V, an Arc B580 and an A770 on Windows' driver and on Mesa
    # 24.2.8, gemma-2-2b Q4_K_M) and an R9700 on ROCm 7.2.2 (build 8990, the 38j host). Before
    # (and after: no constant changed, docs/benchmarks.md) decode 5 of 8 within +-25% (out: the
    # three Mesa 24.2.8 rows, +118..+203%), prefill 3 of 8 (out: the B70 on Vulkan -60%, Lunar
    # Lake +80% on Windows and +347% on Mesa, the Mesa B580 and A770).
    ("38k", 8, 0.62, 0.37),
]


@pytest.mark.parametrize("batch, n_rows, decode, prefill", HOLD_OUTS)
def test_each_hold_out_batch_stays_held(batch, n_rows, decode, prefill):
    rows = [o for o in OUTCOMES if o.row.batch == batch]
    assert len(rows) >= n_rows and all(o.row.role == "held" and o.row.recent for o in rows)
    assert share_within(rows, "decode") >= decode
    assert share_within(rows, "prefill") >= prefill
