"""``localinfer worker``: lend this machine's devices to a localinfer daemon elsewhere,
through llama.cpp's RPC server (see rpc_worker.py)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
from pathlib import Path

from ..config import Config
from ..errors import InvalidRequest, WorkerError
from ..hardware import probe
from ..hardware.profile import HardwareProfile
from ..hardware.rpc import DEFAULT_PORT, PROTOCOL, parse_endpoints, probe_worker, version_text
from ..paths import get_paths
from .common import logical_cores, positive_int, worker_port_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker", help="lend this machine's devices to a daemon elsewhere (llama.cpp RPC)",
        description="Run llama.cpp's RPC server for this machine's devices, so that"
                    " `localinfer serve --workers HOST:PORT` on another machine puts layers of"
                    " a model here. The protocol has no authentication: it listens on"
                    " loopback unless --host says otherwise.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 exposes it to the"
                        " network, unauthenticated)")
    p.add_argument("--port", type=worker_port_arg, default=DEFAULT_PORT,
                   help=f"RPC port (default {DEFAULT_PORT}); its description is served on the"
                        " next port")
    p.add_argument("--device", action="append", default=[], metavar="NAME",
                   help="a device to offer (repeatable: CPU, CUDA0...; default every GPU, else"
                        " the CPU)")
    p.add_argument("--cache", default=None, metavar="DIR",
                   help="tensor cache directory (default <cache>/rpc; 'off' for none)")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="CPU threads (default: physical cores)")
    p.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace, config: Config) -> int:
    from .. import rpc_worker

    if args.cache == "off":
        cache = None
    else:
        cache = Path(args.cache).expanduser() if args.cache else get_paths().cache_dir / "rpc"
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidRequest(f"--cache {cache}: cannot make that folder"
                                 f" ({exc.strerror or exc}); give another, or 'off'.") from None
    hw = probe()
    threads = min(args.threads or hw.cpu.runtime_threads, logical_cores())
    failure: list[BaseException] = []

    def run() -> None:
        try:
            rpc_worker.serve(args.host, args.port, device_names=args.device, cache_dir=cache,
                             n_threads=threads, hw=hw, out=sys.stdout)
        except BaseException as exc:  # handed to the main thread, which reports it
            failure.append(exc)

    # llama.cpp serves from C on its own thread; the main thread waits, so Ctrl+C works.
    server = threading.Thread(target=run, name="localinfer-rpc-server", daemon=True)
    server.start()
    server.join()
    if failure:
        raise failure[0]
    return 0


def probe_for_hw(hw: HardwareProfile, workers: str | None
                 ) -> tuple[HardwareProfile, list[tuple[str, str]]]:
    """For ``localinfer hw``: whether this build can use RPC workers, and each worker's
    devices and link, measured now (the profile with them, and the lines to print)."""
    from ..runtime.llama import RPC_MISSING, supports_rpc  # llama.cpp: only for `hw`

    if not supports_rpc():
        return hw, [("RPC", f"no: {RPC_MISSING}")]
    rows = [("RPC", f"yes (llama.cpp RPC protocol {version_text(PROTOCOL)}): `localinfer"
                    " worker` lends this machine, `serve --workers` uses others")]
    profiles = []
    for endpoint in parse_endpoints(workers):
        try:
            profile = probe_worker(endpoint)
        except WorkerError as exc:
            rows.append(("worker", f"{endpoint}: {exc.one_line()}"))
            continue
        profiles.append(profile)
        link = (f"round trip {profile.rtt_ms:.2f} ms, {profile.link_gbps:.2f} GB/s measured"
                if profile.rtt_ms else "link not measured")
        rows.append(("worker", f"{endpoint}{f' ({profile.name})' if profile.name else ''}:"
                               f" protocol {profile.protocol}, {link}"))
        for d in profile.devices:
            bandwidth = (f", {d.bandwidth_gbps:.1f} GB/s" if d.bandwidth_gbps
                         else ", bandwidth unknown (not a localinfer worker)")
            rows.append(("", f"  {d.name} {d.description}: {d.memory_free_gib:.1f} GiB free"
                             f" of {d.memory_total_gib:.1f} GiB{bandwidth}"))
    return dataclasses.replace(hw, workers=tuple(profiles)), rows
