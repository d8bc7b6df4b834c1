"""Engine overhead: raw llama-cpp-python against localinfer's Engine, same model, same prompts.

Both stream a greedy completion of the same prompts. For each run it measures, as the
consumer sees them, the time to the first token (TTFT) and the decode rate between the first
and the last token; it prints the medians and the ratios. Targets (issue 2): engine decode
>= 0.97 x raw, engine TTFT within +5 ms.

Each side runs in its own child process, alternating run by run: llama.cpp's OpenMP threads
slow down by a third when two threads of one process drive llama.cpp (libgomp stops spinning
once it manages more threads than there are CPUs), which would penalise whichever side ran
second.

    python bench/engine_overhead.py [--model gemma3:270m] [--runs 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from streaming import figures, stream_engine

PROMPTS = [
    "The history of the printing press begins",
    "Here is a recipe for a simple tomato soup:",
    "The three laws of thermodynamics are",
]


def raw_llama(path: str, n_ctx: int, threads: int):
    import llama_cpp
    import llama_cpp.llama_cpp as low

    # The same AMX guard as localinfer (llama.cpp issue #20824): without it a default source
    # build segfaults on Sapphire Rapids CPUs. It measured no slower without repacking.
    if "AMX_INT8 = 1" in low.llama_print_system_info().decode():
        original = low.llama_model_default_params

        def params():
            p = original()
            p.use_extra_bufts = False
            return p

        low.llama_model_default_params = params
    return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads,
                           n_threads_batch=threads, n_batch=512, verbose=False)


def stream_raw(llm, prompt: str, n: int) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    times = []
    for _ in llm.create_completion(prompt, max_tokens=n, temperature=0.0, stream=True):
        times.append(time.perf_counter())
    return figures(t0, times)


def measure(side: str, path: str, name: str, family: str | None, run: int, n: int,
            n_ctx: int, threads: int) -> list[tuple[float, float, int]]:
    """One run of every prompt on one side, in this process."""
    fn: Callable[[Any, str, int], tuple[float, float, int]]
    if side == "raw":
        target, fn = raw_llama(path, n_ctx, threads), stream_raw
    else:
        from localinfer.loading import load_engine
        from localinfer.runtime.backend import LoadOptions

        target = load_engine(path, LoadOptions(n_ctx=n_ctx, n_slots=1, n_threads=threads),
                             name=name, family=family)
        fn = stream_engine
    fn(target, "Warm up", 8)  # first-touch page faults of the mmapped weights
    # A unique first word per run: no side can reuse a previous run's KV cache.
    results = [fn(target, f"Run {run}-{i}. {base}", n) for i, base in enumerate(PROMPTS)]
    if side == "engine":
        target.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3:270m")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--child", choices=["raw", "engine"], help=argparse.SUPPRESS)
    parser.add_argument("--run", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()

    from localinfer.runtime.llama import _physical_cores
    from localinfer.store import ModelStore

    threads = args.threads or _physical_cores()
    model = ModelStore().resolve(args.model)
    if args.child:
        print(json.dumps(measure(args.child, str(model.path), model.name, model.family,
                                 args.run, args.tokens, args.ctx, threads)))
        return 0

    print(f"model {model.name} ({model.path}), {threads} threads, {args.tokens} tokens,"
          f" {args.runs} runs x {len(PROMPTS)} prompts, one child process per side and run",
          flush=True)
    results: dict[str, list[tuple[float, float]]] = {"raw": [], "engine": []}  # (ttft, tps)
    for run in range(args.runs):
        order = ["raw", "engine"] if run % 2 == 0 else ["engine", "raw"]
        for side in order:
            out = subprocess.run(
                [sys.executable, __file__, "--child", side, "--run", str(run), "--model",
                 args.model, "--tokens", str(args.tokens), "--ctx", str(args.ctx),
                 "--threads", str(threads)],
                capture_output=True, text=True, check=True)
            for ttft, tps, n in json.loads(out.stdout.strip().splitlines()[-1]):
                results[side].append((ttft, tps))
                if n < args.tokens * 0.9:
                    print(f"  note: {side} stopped after {n} tokens", file=sys.stderr)
        print(f"run {run + 1}/{args.runs}: raw decode"
              f" {statistics.median(t for _, t in results['raw']):.1f} tok/s, engine"
              f" {statistics.median(t for _, t in results['engine']):.1f} tok/s", flush=True)
    raw, ours = results["raw"], results["engine"]
    raw_ttft = statistics.median(t for t, _ in raw)
    raw_tps = statistics.median(t for _, t in raw)
    eng_ttft = statistics.median(t for t, _ in ours)
    eng_tps = statistics.median(t for _, t in ours)
    print()
    print(f"{'':24}{'raw llama-cpp-python':>22}{'localinfer Engine':>20}{'ratio':>10}")
    print(f"{'decode tok/s (median)':24}{raw_tps:>22.1f}{eng_tps:>20.1f}"
          f"{eng_tps / raw_tps:>9.3f}x")
    print(f"{'TTFT ms (median)':24}{raw_ttft:>22.1f}{eng_ttft:>20.1f}"
          f"{eng_ttft - raw_ttft:>+9.1f}ms")
    ok_decode = eng_tps >= 0.97 * raw_tps
    ok_ttft = eng_ttft <= raw_ttft + 5
    print(f"targets: decode >= 0.97x raw: {'met' if ok_decode else 'MISSED'};"
          f" TTFT within +5 ms: {'met' if ok_ttft else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
