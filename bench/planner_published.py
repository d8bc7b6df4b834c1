"""The planner's predictions against published llama-bench rows (tests/data/
published_llama_bench.csv): per backend, the share of rows within +-10% and +-25% for decode
(tg128) and prefill (pp512), on the rows its constants were fitted on and on the rows held out.
Targets (issue 16), on held-out rows: decode >= 85% within +-25% overall and >= 70% on
non-Apple rows; prefill >= 50% within +-25%.

    python bench/planner_published.py [--rows]    (--rows: every row with its error)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from published_rows import Outcome, load_rows, predict  # noqa: E402


def shares(errors: Sequence[float]) -> str:
    if not errors:
        return f"{'-':>18}"
    n = len(errors)
    within10 = sum(abs(e) <= 0.10 for e in errors) / n
    within25 = sum(abs(e) <= 0.25 for e in errors) / n
    return f"{within10:4.0%} {within25:5.0%} of {n:3d}"


def table(outcomes: Sequence[Outcome]) -> None:
    print(f"{'backend':10} {'role':5} {'decode ±10% ±25%':>18}   {'prefill ±10% ±25%':>18}")
    groups = sorted({(o.row.backend, o.row.role) for o in outcomes})
    for backend, role in groups + [("non-Apple", "fit"), ("non-Apple", "held"),
                                   ("all", "fit"), ("all", "held")]:
        rows = [o for o in outcomes if o.row.role == role and (
            backend == "all" or o.row.backend == backend
            or (backend == "non-Apple" and not o.row.apple))]
        decode = [o.decode_error for o in rows]
        prefill = [e for o in rows if (e := o.prefill_error) is not None]
        print(f"{backend:10} {role:5} {shares(decode)}   {shares(prefill)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", action="store_true", help="print every row with its error")
    args = parser.parse_args()
    rows = load_rows()
    outcomes = [predict(row) for row in rows]
    if args.rows:
        for o in outcomes:
            r = o.row
            line = (f"{r.role:4} {r.what[:62]:62} tg {r.tg128:7.1f} predicted {o.decode_tps:7.1f}"
                    f" {o.decode_error:+5.0%}")
            if (e := o.prefill_error) is not None:
                line += f"   pp {r.pp512:7.0f} predicted {o.prefill_tps:7.0f} {e:+5.0%}"
            print(line)
        print()
    table(outcomes)
    copied = sum(r.verified == "retrieved-copy" for r in rows)
    print(f"\n{len(rows)} rows from {len({r.source for r in rows})} retrieved sources:"
          f" {len(rows) - copied} read in the publication, {copied} in a public copy of it")


if __name__ == "__main__":
    main()
