"""A short `localinfer run` at the default thread count against the best fixed count, on the
machine as it is and with one core kept busy by another process (issue 35, item 5).

Each run is a new process, as a user starts it (`localinfer run --no-daemon --json`, greedy,
96 tokens): the default count has no steps to learn from but the run queue at admission and
the counts earlier runs learned for this model (kept under the home's cache; this script gives
the runs a fresh home, so its first default run starts with none). The settings take turns in
each round, the order rotating; the figures are medians over the rounds of the decode rate the
run reports. The ratio that matters: default / the best fixed count, per load.

    python bench/run_threads.py [--model PATH] [--tokens 96] [--rounds 3] [--python PY]

--python runs another interpreter's build (a venv with an AVX2-only llama-cpp-python): which
count is best depends on the CPU, so measure each build you care about.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def starter_path() -> str:
    from localinfer.store import ModelStore

    return str(ModelStore().resolve("gemma3:270m").path.resolve())


def one_run(python: str, model: str, tokens: int, threads: int | None, home: str) -> dict:
    cmd = [python, "-m", "localinfer", "run", "--no-daemon", "--json", "-n", str(tokens),
           "-t", "0", model, PROMPT]
    if threads is not None:
        cmd[5:5] = ["--threads", str(threads)]
    env = {**os.environ, "LOCALINFER_HOME": home}
    started = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    timings = json.loads(out.stdout)["timings"]
    return {"decode_tps": timings["decode_tps"], "prefill_tps": timings["prefill_tps"],
            "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a .gguf (default: the starter)")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = ap.parse_args()
    model = args.model or starter_path()
    cores = os.cpu_count() or 1
    settings: list[int | None] = [None, *range(1, cores + 1)]
    name = {None: "default"} | {n: f"--threads {n}" for n in range(1, cores + 1)}
    home = tempfile.mkdtemp(prefix="localinfer-run-threads-")
    info = subprocess.run([args.python, "-c", "import llama_cpp as L; print("
                           "L.llama_print_system_info().decode())"],
                          capture_output=True, text=True).stdout.strip()
    print(f"build: {info}\n{cores} cores; {args.tokens} tokens a run; {args.rounds} rounds;"
          f" the learned thread counts in {home} start empty", file=sys.stderr)
    results: dict[str, dict[str, list[dict]]] = {}
    for load in ("idle", "one core busy"):
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) \
            if load != "idle" else None
        try:
            runs: dict[str, list[dict]] = {name[s]: [] for s in settings}
            for r in range(args.rounds):
                order = settings[r % len(settings):] + settings[:r % len(settings)]
                for s in order:
                    fig = one_run(args.python, model, args.tokens, s, home)
                    runs[name[s]].append(fig)
                    print(f"  {load}, round {r + 1}, {name[s]}: {fig['decode_tps']:.1f} tok/s"
                          f" decode, {fig['prefill_tps']:.0f} tok/s prefill", file=sys.stderr)
            results[load] = runs
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    print(f"\n| load | {' | '.join(name[s] for s in settings)} | default / best fixed |")
    print("|---" * (len(settings) + 2) + "|")
    for load, runs in results.items():
        med = {k: statistics.median(f["decode_tps"] for f in v) for k, v in runs.items()}
        best = max(v for k, v in med.items() if k != "default")
        cells = " | ".join(f"{med[name[s]]:.1f}" for s in settings)
        print(f"| {load} | {cells} | {med['default'] / best:.2f}x |")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
