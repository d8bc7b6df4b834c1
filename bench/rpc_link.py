"""What one RPC worker costs per decoded token over shaped links, on this machine: loopback,
then a worker in a network namespace of its own behind a veth pair shaped by tc (10 GbE, 1 GbE,
Wi-Fi; see localinfer/bench/rpc_link.py), against the planner's prediction for the same split
(`plan --workers`, with this machine's calibration) and its choice to pool or not. Needs root.
The box's cores are shared: say so with the figures.

    python bench/rpc_link.py [--runs 5] [--tokens 24] [--threads 1] [--model PATH]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from localinfer.bench.rpc_link import (
    PROFILES,
    TIE,
    LinkResult,
    measure_profiles,
    namespaces_unavailable,
)
from localinfer.store import ModelStore


def _right(r: LinkResult) -> str:
    if abs(r.measured_tps / r.alone_measured_tps - 1) < TIE:
        return "tie"
    return "yes" if r.decision_right else "NO"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    if (why := namespaces_unavailable()) is not None:
        raise SystemExit(f"cannot make network namespaces here: {why}")
    model = args.model or ModelStore().resolve("gemma3:270m").path
    print(f"{model.name}, {args.threads} thread(s) per process, load average"
          f" {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    print(f"{'link':9} {'rtt ms':>7} {'GB/s':>6} {'measured':>9} {'predicted':>9} {'error':>6}"
          f" {'alone':>6} {'pools':>5} {'right':>5} {'B/token':>9} {'planned B':>9}")
    for r in measure_profiles(model, PROFILES, runs=args.runs, tokens=args.tokens,
                              threads=args.threads):
        print(f"{r.profile:9} {r.rtt_ms:7.3f} {r.link_gbps:6.3f} {r.measured_tps:9.1f}"
              f" {r.predicted_tps:9.1f} {r.error:+6.0%} {r.alone_measured_tps:6.1f}"
              f" {'yes' if r.pools else 'no':>5} {_right(r):>5}"
              f" {r.bytes_per_token:9.0f} {r.network_bytes:9.0f}", flush=True)


if __name__ == "__main__":
    main()
