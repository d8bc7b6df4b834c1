"""The planner against published runs of mixture-of-experts models with their experts in RAM
(tests/data/published_moe.csv: llama.cpp's --n-cpu-moe N, or -ot "exps=CPU" for as many layers):
for each row, the measured decode (and prefill where published) beside the planner's
uncalibrated prediction for THAT placement (every layer on the GPU, the experts of N layers in
RAM), and the plan's own choice for the machine: its N, decode and prefill at 4096 tokens of
context, the VRAM it plans (GiB), and the decode of the layer split it weighed against. Then
the summary: median |error| and the share within +-25%, overall and per publication. No
planner constant was set on these rows: all are held out.

    python bench/moe_published.py [--sources]
        --sources: every row's address, what it had to assume, and its note
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from published_moe import Outcome, load_rows, predict, summary  # noqa: E402


def _short(gpu: str) -> str:
    return gpu.replace("NVIDIA GeForce ", "").replace("NVIDIA ", "")


def _pct(error: float | None) -> str:
    return f"{error:+5.0%}" if error is not None else "     "


def table(outcomes: list[Outcome]) -> None:
    print(f"{'GPU':16} {'host GB/s':>10} {'model':14} {'N':>3} {'tg':>6} {'pred':>6} {'err':>5}"
          f" {'pp':>6} {'pred':>6} {'err':>5} | {'plan: N':>7} {'decode':>6} {'prefill':>7}"
          f" {'VRAM':>5} {'split':>6}")
    for o in outcomes:
        r, e = o.row, o.chosen
        split = next((p.decode_tps for p in e.placements if p.n_cpu_moe == 0), None)
        vram = e.gpu.total_bytes / 2**30 if e.gpu else 0.0
        pp = f"{r.pp:6.0f}" if r.pp else f"{'':6}"
        pred_pp = f"{o.prefill_tps:6.0f}" if r.pp else f"{'':6}"
        how = "m" if r.machine.bandwidth_source == "measured" else "s"
        bw = f"{r.machine.host_bandwidth_gbps:g}{how}"
        print(f"{_short(r.gpu)[:16]:16} {bw:>10} {r.model:14} {r.n_cpu_moe:3d} {r.tg:6.1f}"
              f" {o.decode_tps:6.1f} {_pct(o.decode_error)} {pp} {pred_pp}"
              f" {_pct(o.prefill_error)} | {e.n_cpu_moe:7d} {e.decode_tps:6.1f}"
              f" {e.prefill_tps:7.0f} {vram:5.1f} {split if split is None else f'{split:6.1f}'}")
    s = summary(outcomes)
    print(f"\n{s['rows']} rows (host GB/s: m = the publication's measurement, s = data sheet)")
    print(f"decode:  median |error| {s['decode_median']:.0%}, within +-25%:"
          f" {s['decode_within25']:.0%} of {s['rows']}")
    print(f"prefill: median |error| {s['prefill_median']:.0%}, within +-25%:"
          f" {s['prefill_within25']:.0%} of {s['prefill_rows']}")
    print("\nby publication:")
    for source in dict.fromkeys(o.row.source for o in outcomes):
        mine = [o for o in outcomes if o.row.source == source]
        t = summary(mine)
        print(f"  {t['rows']:2d} rows, decode median |error| {t['decode_median']:4.0%},"
              f" within +-25% {t['decode_within25']:4.0%}  {source}")
    spec = [o for o in outcomes if o.row.machine.bandwidth_source == "spec"]
    if spec:
        t = summary(spec)
        print(f"decode, data-sheet host bandwidth only: median |error| {t['decode_median']:.0%},"
              f" within +-25%: {t['decode_within25']:.0%} of {t['rows']}")


def sources(outcomes: list[Outcome]) -> None:
    for o in outcomes:
        r = o.row
        print(f"\n{r.what} ({r.tool}, {r.build})\n  {r.source}\n  assumed: {r.assumed}"
              f"\n  note: {r.note}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", action="store_true", help="every row's address and notes")
    args = ap.parse_args(argv)
    outcomes = [predict(row) for row in load_rows()]
    table(outcomes)
    if args.sources:
        sources(outcomes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
