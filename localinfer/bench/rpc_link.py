"""What one RPC worker costs per decoded token over a network link, measured on this machine:
the worker in a network namespace of its own, the client (this module run with ``--client``) in
another, the two joined by a veth pair shaped with ``tc`` (netem: delay and jitter each way;
tbf: the rate) to the profiles people pool machines over. Loopback is measured without
namespaces. Each profile reports the split's measured decode rate (the median bare decode
step, in turns with the model loaded on this machine alone, so that a neighbour's load falls
on both), the planner's prediction for the same split with the link it probed and this
machine's calibration (measured/predicted alone, as `localinfer run` records it), the bytes a
token moved over the link (the veth's counters), and whether the planner, free to choose,
pools: the decision is checked against the two measured rates.

Needs root (``ip netns``, ``tc``); every address used is loopback or a veth address inside the
namespaces made here, which are removed on the way out. ``bench/rpc_link.py`` prints the table,
tests/test_rpc_link.py checks the planner against it.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .. import gguf
from ..config import Config
from ..errors import LocalInferError, WorkerError
from ..hardware.probe import probe
from ..hardware.rpc import RPCConnection, probe_workers
from ..loading import load_engine, parse_layer_split, split_options, worker_split
from ..planner import plan, plan_split
from ..planner.candidate import Candidate
from ..runtime.backend import LoadOptions
from ..selection import plan_prefs
from .editor_workload import start_worker

WORKER_PORT = 50052
TIE = 0.05
"""Pooled and alone within 5% of each other: a tie on a shared machine, either call right."""
SUBNET = "10.231.{}"
"""A /30 per profile inside the namespaces made here: .1 the client's end, .2 the worker's."""


@dataclass(frozen=True)
class LinkProfile:
    name: str
    delay_ms: float
    """One way, on each end (the round trip adds twice as much)."""
    jitter_ms: float
    rate_mbit: float
    """0: unshaped."""
    what: str


PROFILES: tuple[LinkProfile, ...] = (
    LinkProfile("loopback", 0.0, 0.0, 0, "this machine's loopback, no namespace"),
    LinkProfile("10gbe", 0.0, 0.0, 10_000, "10 GbE: the veth's own ~0.05-0.1 ms round trip"),
    LinkProfile("1gbe", 0.15, 0.0, 1_000, "gigabit Ethernet: ~0.3 ms round trip"),
    LinkProfile("wifi", 1.5, 0.5, 200, "Wi-Fi: ~3 ms round trip with jitter, 200 Mbit/s"),
)


@dataclass(frozen=True)
class LinkResult:
    profile: str
    measured_tps: float
    predicted_tps: float
    network_ms: float
    """The planner's network share of a token (round trips, graph, activations, logits)."""
    rtt_ms: float
    link_gbps: float
    bytes_per_token: float
    """Both directions over the veth per decode step (0 on loopback: not counted)."""
    network_bytes: float
    """What the planner counts a token moves over the link (activations, masks, logits)."""
    alone_measured_tps: float
    alone_predicted_tps: float
    runs: tuple[float, ...]
    pools: bool = False
    """Whether the planner, free to choose, puts layers on the worker (`plan --workers`)."""

    @property
    def error(self) -> float:
        return self.predicted_tps / self.measured_tps - 1

    @property
    def decision_right(self) -> bool:
        """Whether the planner's call (pool or not) is the one the measurement supports; either
        is right where the two measured rates are within TIE of each other."""
        if abs(self.measured_tps / self.alone_measured_tps - 1) < TIE:
            return True
        return self.pools == (self.measured_tps > self.alone_measured_tps)


class NamespacesUnavailable(LocalInferError):
    """Network namespaces or tc cannot be used here (not root, no iproute2, a container)."""


def _run(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise NamespacesUnavailable(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}",
                                    title="namespaces")


def namespaces_unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can (checked by making one)."""
    if os.geteuid() != 0:
        return "not root: ip netns and tc need CAP_NET_ADMIN"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "iproute2 (ip, tc) is not installed"
    name = f"liprobe{os.getpid()}"
    try:
        _run(["ip", "netns", "add", name])
    except NamespacesUnavailable as exc:
        return exc.message
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    return None


@dataclass(frozen=True)
class LinkNamespaces:
    """Two namespaces joined by a shaped veth pair: ``client`` (address ``client_ip``) and
    ``worker`` (``worker_ip``)."""

    client: str
    worker: str
    client_dev: str
    client_ip: str
    worker_ip: str
    netem: bool = True
    """False: the kernel has no netem; the delay is the relay's (``delay_relay``)."""

    def exec(self, ns: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]


def _shape(ns: str, dev: str, p: LinkProfile) -> bool:
    """Shape ``dev``: netem's delay and jitter with tbf's rate under it; where the kernel has
    no netem (sch_netem not built, as in some VMs), tbf alone, and False: the delay is then
    added by the relay (``delay_relay``) in the worker's namespace."""
    # tbf's burst: ~2 ms of the rate, at least 64 KB (a GSO packet).
    burst = max(64 * 1024, int(p.rate_mbit * 1e6 / 8 * 0.002))
    tbf = ["tbf", "rate", f"{p.rate_mbit:g}mbit", "burst", str(burst), "latency", "100ms"]
    netem = ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem",
             "delay", f"{p.delay_ms}ms"]
    if p.jitter_ms:
        netem += [f"{p.jitter_ms}ms", "distribution", "normal"]
    has_netem = subprocess.run(netem, capture_output=True, timeout=30).returncode == 0
    if p.rate_mbit:
        where = ["parent", "1:", "handle", "2:"] if has_netem else ["root", "handle", "1:"]
        _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, *where, *tbf])
    return has_netem


@contextmanager
def link_namespaces(profile: LinkProfile, index: int) -> Iterator[LinkNamespaces]:
    """Make the two namespaces of ``profile`` (the ``index``-th /30 of SUBNET), shaped each way;
    removed on the way out, whatever happens."""
    tag = f"{os.getpid() % 100000}x{index}"
    ns = LinkNamespaces(client=f"lic{tag}", worker=f"liw{tag}", client_dev=f"vc{tag}",
                        client_ip=SUBNET.format(f"{index}.1"),
                        worker_ip=SUBNET.format(f"{index}.2"))
    worker_dev = f"vw{tag}"
    made: list[str] = []
    netem = True
    try:
        for name in (ns.client, ns.worker):
            _run(["ip", "netns", "add", name])
            made.append(name)
        _run(["ip", "link", "add", ns.client_dev, "netns", ns.client, "type", "veth", "peer",
              "name", worker_dev, "netns", ns.worker])
        for name, dev, ip in ((ns.client, ns.client_dev, ns.client_ip),
                              (ns.worker, worker_dev, ns.worker_ip)):
            _run(["ip", "-n", name, "addr", "add", f"{ip}/30", "dev", dev])
            _run(["ip", "-n", name, "link", "set", "lo", "up"])
            _run(["ip", "-n", name, "link", "set", dev, "up"])
            netem = _shape(name, dev, profile) and netem
        yield replace(ns, netem=netem)
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def _pump(src: socket.socket, dst: socket.socket, delay_s: float, jitter_s: float) -> None:
    """Copy ``src`` to ``dst``, each chunk released ``delay_s`` (+- normal jitter) after it
    arrived, in order (a later chunk never overtakes an earlier one, as on one TCP stream)."""
    chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def send() -> None:
        while True:
            release, data = chunks.get()
            wait = release - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            if not data:
                dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(data)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    last = 0.0
    while True:
        try:
            data = src.recv(1 << 20)
        except OSError:
            data = b""
        delay = max(0.0, random.gauss(delay_s, jitter_s)) if jitter_s else delay_s
        last = max(last, time.perf_counter() + delay)
        chunks.put((last, data))
        if not data:
            return


def delay_relay(listen_ip: str, ports: Sequence[int], target_ip: str, delay_ms: float,
                jitter_ms: float) -> None:
    """Forward ``listen_ip``:port to ``target_ip``:port for each port, delaying each direction
    by ``delay_ms`` (+- ``jitter_ms``): the link's latency where the kernel has no netem. Runs
    until killed."""

    def serve(port: int) -> None:
        listener = socket.create_server((listen_ip, port))
        while True:
            client, _ = listener.accept()
            upstream = socket.create_connection((target_ip, port))
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b, delay_ms / 1e3, jitter_ms / 1e3),
                                 daemon=True).start()

    for port in ports[1:]:
        threading.Thread(target=serve, args=(port,), daemon=True).start()
    serve(ports[0])


def _wait_for(endpoint: str, deadline_s: float = 90.0) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            RPCConnection(endpoint, connect_timeout_s=1).close()
            return
        except WorkerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _veth_bytes(dev: str | None) -> int:
    if dev is None:
        return 0
    stats = Path("/sys/class/net") / dev / "statistics"
    return sum(int((stats / f).read_text()) for f in ("tx_bytes", "rx_bytes"))


def measure_client(model: Path, endpoint: str, *, layers: str, runs: int, tokens: int,
                   threads: int, dev: str | None) -> dict[str, object]:
    """In the client's namespace (or on loopback): the split's decode rate against the
    planner's prediction for it, and this machine alone, as one JSON-able dict."""
    _wait_for(endpoint)
    header = gguf.read_header(model)
    hardware = probe()
    config = Config(threads=threads, layer_split=layers)
    local = LoadOptions(n_ctx=512, n_threads=threads)
    split = worker_split(header, (endpoint,), hardware=hardware, config=config,
                         n_ctx=local.n_ctx, n_slots=1, name=model.stem)
    if split is None:
        raise WorkerError(f"the worker at {endpoint} did not answer", title="worker")
    rates: list[float] = []
    alone_rates: list[float] = []
    moved = decoded = 0
    # Both loaded at once and measured in turns (the median bare decode step of each, the
    # engine's yardstick), so that a neighbour's load on this shared machine falls on both.
    with load_engine(model, local, name=model.stem).wait_ready() as alone_engine, \
            load_engine(model, split_options(local, split, model.stem),
                        name=model.stem).wait_ready() as engine:
        for _ in range(runs):
            alone_rates.append(alone_engine.measure_decode_step(tokens))
            before = _veth_bytes(dev)
            rates.append(engine.measure_decode_step(tokens))
            moved += _veth_bytes(dev) - before
            decoded += tokens + 1
    # This machine's calibration, as `localinfer run` records it: measured/predicted alone.
    candidate = Candidate.from_header(header, name=model.stem)
    prefs = replace(plan_prefs(config), n_ctx=512, min_tps=0, n_gpu_layers=0)
    alone_measured = statistics.median(alone_rates)
    alone = plan(hardware, [candidate], prefs).choice
    ratio = alone_measured / alone.decode_tps if alone else 1.0
    workers, _ = probe_workers((endpoint,))
    pooled = replace(hardware, workers=tuple(workers))
    split_prefs = replace(prefs, n_gpu_layers=None, calibration={"CPU": ratio})
    calibrated = plan_split(candidate, pooled, split_prefs, n_ctx=local.n_ctx,
                            layers=parse_layer_split(layers))
    # What `plan --workers` would do: the fastest split, with the worker or without it.
    chosen = plan_split(candidate, pooled, split_prefs, n_ctx=local.n_ctx)
    link = workers[0]
    return {"measured_tps": statistics.median(rates),
            "predicted_tps": calibrated.decode_tps, "pools": chosen.uses_workers,
            "network_ms": calibrated.network_ms, "network_bytes": calibrated.network_bytes,
            "rtt_ms": link.rtt_ms, "link_gbps": link.link_gbps,
            "bytes_per_token": moved / decoded if decoded else 0.0,
            "alone_predicted_tps": alone.decode_tps * ratio if alone else 0.0,
            "alone_measured_tps": alone_measured, "runs": rates, "alone_runs": alone_rates}


def _client_argv(model: Path, endpoint: str, args: argparse.Namespace,
                 dev: str | None) -> list[str]:
    argv = [sys.executable, "-m", "localinfer.bench.rpc_link", "--client", "--model", str(model),
            "--endpoint", endpoint, "--layers", args.layers, "--runs", str(args.runs),
            "--tokens", str(args.tokens), "--threads", str(args.threads)]
    return argv + (["--dev", dev] if dev else [])


def _client(argv: list[str], timeout_s: float) -> dict[str, object]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise LocalInferError(f"the client failed: {done.stderr.strip()[-2000:]}",
                              title="rpc link")
    result: dict[str, object] = json.loads(lines[-1])
    return result


def measure_profiles(model: Path, profiles: Sequence[LinkProfile], *, runs: int = 3,
                     tokens: int = 32, threads: int = 1, layers: str = "9,9",
                     timeout_s: float = 300.0) -> list[LinkResult]:
    """Each profile's measurement (loopback without namespaces; the others in namespaces made
    and removed here). Raises NamespacesUnavailable when a shaped profile cannot be made."""
    args = argparse.Namespace(layers=layers, runs=runs, tokens=tokens, threads=threads)
    out = []
    for index, p in enumerate(profiles, start=1):
        if p.name == "loopback":
            proc, endpoint = start_worker(threads)
            try:
                data = _client(_client_argv(model, endpoint, args, None), timeout_s)
            finally:
                proc.kill()
                proc.wait()
        else:
            with link_namespaces(p, index) as ns:
                endpoint = f"{ns.worker_ip}:{WORKER_PORT}"
                relay = not ns.netem and p.delay_ms > 0
                procs = [subprocess.Popen(
                    ns.exec(ns.worker, [sys.executable, "-m", "localinfer", "worker", "--host",
                                        "127.0.0.1" if relay else ns.worker_ip, "--port",
                                        str(WORKER_PORT), "--cache", "off", "--threads",
                                        str(threads)]),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
                if relay:
                    procs.append(subprocess.Popen(ns.exec(ns.worker, [
                        sys.executable, "-m", "localinfer.bench.rpc_link", "--relay",
                        "--endpoint", ns.worker_ip, "--delay-ms", str(p.delay_ms),
                        "--jitter-ms", str(p.jitter_ms)])))
                try:
                    data = _client(ns.exec(ns.client, _client_argv(model, endpoint, args,
                                                                    ns.client_dev)), timeout_s)
                finally:
                    for proc in procs:
                        proc.kill()
                        proc.wait()
        out.append(LinkResult(
            profile=p.name, measured_tps=float(data["measured_tps"]),  # type: ignore[arg-type]
            predicted_tps=float(data["predicted_tps"]),  # type: ignore[arg-type]
            network_ms=float(data["network_ms"]),  # type: ignore[arg-type]
            rtt_ms=float(data["rtt_ms"]), link_gbps=float(data["link_gbps"]),  # type: ignore[arg-type]
            bytes_per_token=float(data["bytes_per_token"]),  # type: ignore[arg-type]
            network_bytes=float(data["network_bytes"]),  # type: ignore[arg-type]
            alone_measured_tps=float(data["alone_measured_tps"]),  # type: ignore[arg-type]
            alone_predicted_tps=float(data["alone_predicted_tps"]),  # type: ignore[arg-type]
            runs=tuple(data["runs"]), pools=bool(data["pools"])))  # type: ignore[arg-type]
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--relay", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--delay-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--jitter-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--endpoint", default="")
    parser.add_argument("--dev", default=None)
    parser.add_argument("--layers", default="9,9")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.relay:
        delay_relay(args.endpoint, (WORKER_PORT, WORKER_PORT + 1), "127.0.0.1", args.delay_ms,
                    args.jitter_ms)
        return
    if args.model is None:
        parser.error("--model is required")
    if args.client:
        print(json.dumps(measure_client(args.model, args.endpoint, layers=args.layers,
                                        runs=args.runs, tokens=args.tokens,
                                        threads=args.threads, dev=args.dev)), flush=True)
        return
    for r in measure_profiles(args.model, PROFILES, runs=args.runs, tokens=args.tokens,
                              threads=args.threads, layers=args.layers):
        print(json.dumps({**asdict(r), "error": round(r.error, 3)}), flush=True)


if __name__ == "__main__":
    main()
