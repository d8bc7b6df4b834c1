"""Decode rate with a JSON schema's grammar against without, greedy and sampled (issue 13:
goal >= 0.9x), on one loaded engine. Runs alternate plain and schema, round by round, and the
medians are printed with the load average; also how often the grammar walk settled without
asking about the whole vocabulary (see localinfer/runtime/shortlist.py), and the CPU time of
the backend's sample() per token, which a loaded machine disturbs far less than the rate.

    python bench/structured_decode.py [--model gemma3:270m] [--rounds 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace

from localinfer.bench.engine_bench import CITIES_SCHEMA
from localinfer.loading import load_engine
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.grammar import json_grammar
from localinfer.runtime.llama import sampling as llama_module
from localinfer.runtime.types import SamplingParams
from localinfer.store import ModelStore

PROMPT = "A list of large cities and their populations, as JSON:\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3:270m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    model = ModelStore().resolve(args.model)
    engine = load_engine(model.path, LoadOptions(n_ctx=2048, n_slots=1), name=args.model)
    settled: list[bool] = []
    walk = llama_module.best_allowed

    def counted(*walk_args, **walk_kwargs):
        ids = walk(*walk_args, **walk_kwargs)
        settled.append(ids is not None)
        return ids

    llama_module.best_allowed = counted  # type: ignore[assignment]
    backend = engine.backend
    sample = backend.sample
    sample_cpu_s: list[float] = []

    def timed(*sample_args, **sample_kwargs):
        t0 = time.thread_time()
        token = sample(*sample_args, **sample_kwargs)
        sample_cpu_s.append(time.thread_time() - t0)
        return token

    backend.sample = timed  # type: ignore[method-assign]
    cpu: dict[tuple[str, str], list[float]] = {}
    modes = {"greedy": SamplingParams(temperature=0.0), "sampled": SamplingParams()}
    rates: dict[tuple[str, str], list[float]] = {}
    loads = []
    try:
        for round_ in range(args.rounds):
            for mode, base in modes.items():
                for label, grammar in (("plain", None), ("schema", json_grammar(CITIES_SCHEMA))):
                    params = replace(base, max_tokens=args.tokens, speculative=False,
                                     grammar=grammar, seed=round_ + 1)
                    sample_cpu_s.clear()
                    done = engine.complete(PROMPT, params).result()
                    cpu.setdefault((mode, label), []).extend(sample_cpu_s)
                    rates.setdefault((mode, label), []).append(done.timings.decode_tps)
            loads.append(os.getloadavg()[0])
    finally:
        engine.close()
    print(f"{args.model}, {args.tokens} tokens, {args.rounds} rounds, load average "
          f"{min(loads):.1f}-{max(loads):.1f} (1 min), {os.cpu_count()} CPUs")
    for mode in modes:
        plain = statistics.median(rates[(mode, "plain")])
        schema = statistics.median(rates[(mode, "schema")])
        print(f"  {mode:8s} plain {plain:6.1f} tok/s  schema {schema:6.1f} tok/s  "
              f"ratio {schema / plain:.2f}  (schema runs: "
              + ", ".join(f"{r:.0f}" for r in rates[(mode, "schema")]) + "; plain: "
              + ", ".join(f"{r:.0f}" for r in rates[(mode, "plain")]) + ")")
        print(f"  {mode:8s} sample() CPU ms/token: plain "
              f"{1e3 * statistics.mean(cpu[(mode, 'plain')]):.2f} mean, schema "
              f"{1e3 * statistics.mean(cpu[(mode, 'schema')]):.2f} mean, "
              f"{1e3 * max(cpu[(mode, 'schema')]):.1f} max")
    print(f"  grammar walk settled {sum(settled)} of {len(settled)} constrained steps; the rest"
          " asked about the whole vocabulary")


if __name__ == "__main__":
    main()
