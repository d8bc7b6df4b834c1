"""RPC workers on one machine: decode speed of the starter split across the local CPU and two
`localinfer worker` processes on loopback, against the same model on this machine alone, and
the cost of running the model in a child process (the isolated backend every model with
workers uses) against running it in this one.

Each configuration loads once and streams a greedy completion ``--runs`` times; it prints
each run's decode rate and the median, and for the in-process and isolated backends the
median time of a bare decode step (``Engine.measure_decode_step``), and the round trip of
one call to the child process. Both workers and this process
share the machine's cores: on loopback the split can only lose (every token crosses two
extra processes); the figure is the per-token cost of the hops.

    python bench/rpc_split.py [--runs 3] [--tokens 48] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from localinfer import gguf
from localinfer.bench.editor_workload import start_worker
from localinfer.config import Config
from localinfer.hardware import rpc
from localinfer.hardware.probe import probe
from localinfer.loading import load_engine, split_options, worker_split
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.engine import Engine
from localinfer.runtime.isolated import IsolatedBackend
from localinfer.runtime.types import SamplingParams
from localinfer.store import ModelStore

PROMPT = "The history of the printing press begins"


def decode_rates(engine: Engine, runs: int, tokens: int) -> list[float]:
    greedy = SamplingParams(temperature=0.0, max_tokens=tokens)
    return [engine.complete(PROMPT, greedy).result().timings.decode_tps for _ in range(runs)]


def call_us(backend: IsolatedBackend, n: int = 300) -> float:
    """The median round trip of a call that does almost nothing in the child."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        backend.tokenize("a", add_special=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def report(label: str, rates: list[float], step_s: float | None = None) -> None:
    line = (f"{label:<34} decode {statistics.median(rates):6.2f} tok/s median"
            f" (runs: {', '.join(f'{r:.2f}' for r in rates)})")
    if step_s is not None:
        line += f"; bare decode step {step_s * 1000:.2f} ms"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of this process and of each worker")
    args = parser.parse_args()
    os.environ["LOCALINFER_LLAMA_EXTRA_BUFTS"] = "0"  # the workers' kernels, on both sides
    model = ModelStore().resolve("gemma3:270m")
    header = gguf.read_header(model.path)
    local = LoadOptions(n_ctx=512, n_threads=args.threads)
    print(f"{model.name}, {args.threads} thread(s) per process, load average"
          f" {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)

    with load_engine(model.path, local, name=model.name).wait_ready() as engine:
        step = 1.0 / engine.measure_decode_step()
        report("this process", decode_rates(engine, args.runs, args.tokens), step)
    isolated = IsolatedBackend(model.path, local, name=model.name)
    with Engine(isolated, load_ms=isolated.load_ms).wait_ready() as engine:
        step = 1.0 / engine.measure_decode_step()
        report("a child process (isolated)", decode_rates(engine, args.runs, args.tokens), step)
        print(f"{'':<34} one call to the child: {call_us(isolated):.0f} us median (a step"
              " makes two: decode, sample)", flush=True)

    workers = [start_worker(args.threads) for _ in range(2)]
    hardware = probe(measure_bandwidth=False)
    try:
        # The layers in equal shares (the planner alone keeps a model this small on one
        # machine): what the split costs, against what the planner predicts for it.
        for endpoints, layers in (([workers[0][1]], "9,9"), ([w[1] for w in workers], "6,6,6")):
            split = worker_split(header, tuple(endpoints), hardware=hardware,
                                 config=Config(threads=args.threads, layer_split=layers),
                                 n_ctx=local.n_ctx, n_slots=1, name=model.name)
            assert split is not None, "the workers did not answer"
            options = split_options(local, split, model.name)
            with load_engine(model.path, options, name=model.name).wait_ready() as engine:
                where = ", ".join(f"{d} {n}" for d, n in engine.info.split)
                step = 1.0 / engine.measure_decode_step()
                report(f"split over {len(endpoints)} worker(s)",
                       decode_rates(engine, args.runs, args.tokens), step)
                print(f"{'':<34} layers: {where}; predicted {split.decode_tps:.1f} tok/s"
                      f" (network {split.network_ms:.2f} ms a token)", flush=True)
            links = [rpc.probe_worker(e) for e in endpoints]
            print(f"{'':<34} link: " + "; ".join(
                f"{w.endpoint} round trip {w.rtt_ms:.3f} ms, {w.link_gbps:.2f} GB/s"
                for w in links), flush=True)
    finally:
        for proc, _ in workers:
            proc.kill()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
