"""``localinfer worker``: llama.cpp's RPC server for this machine's devices, so that a
localinfer daemon on another machine can put layers of a model here, plus the small JSON
description the RPC protocol cannot carry (device names, measured bandwidth, host name),
served on the next port (see hardware/rpc.py). A front end beside the daemon: it lends this
machine's devices (runtime/llama.py) with what the probes measured (hardware/).

The RPC protocol has no authentication: whoever reaches the port can run computations and
read or write the memory the worker allocates. It binds to loopback unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import __version__
from .errors import BackendUnavailable, DaemonError, InvalidRequest
from .hardware.profile import HardwareProfile
from .hardware.rpc import INFO_PORT_OFFSET, PROTOCOL, is_loopback, machine_tag, version_text
from .runtime import llama

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OfferedDevice:
    name: str
    description: str
    kind: str
    memory_free: int
    memory_total: int
    bandwidth_gbps: float


def choose_devices(names: Sequence[str]) -> list[llama.Device]:
    """The devices to serve: those named, else every GPU (else the CPU), as rpc-server does."""
    available = llama.devices()
    if names:
        by_name = {d.name.lower(): d for d in available}
        missing = [n for n in names if n.lower() not in by_name]
        if missing:
            raise InvalidRequest(f"no device {missing[0]!r} here (this build has:"
                                 f" {', '.join(d.name for d in available)}).")
        return [by_name[n.lower()] for n in names]
    gpus = [d for d in available if d.kind in ("gpu", "igpu")]
    return gpus or [d for d in available if d.kind == "cpu"][:1]


def offered(devices: Sequence[llama.Device], hw: HardwareProfile,
            n_threads: int | None = None) -> list[OfferedDevice]:
    """Each device with its bandwidth: for the CPU the measured host bandwidth that
    ``n_threads`` threads reach (at most n x the one-core figure: a worker started with
    ``--threads 1`` reads at one core's rate), the GPU's own (from the probe, by order) for a
    GPU."""
    gpus = iter(hw.gpus)
    out = []
    for d in devices:
        if d.kind == "cpu":
            bandwidth = hw.host_bandwidth_gbps
            if n_threads and hw.host_bandwidth_1core_gbps:
                bandwidth = min(bandwidth, n_threads * hw.host_bandwidth_1core_gbps)
        else:
            gpu = next(gpus, None)
            bandwidth = gpu.bandwidth_gbps if gpu else 0.0
        out.append(OfferedDevice(d.name, d.description, d.kind, d.memory_free, d.memory_total,
                                 bandwidth))
    return out


def info_document(devices: Sequence[OfferedDevice], rpc_port: int) -> dict[str, Any]:
    return {"localinfer": __version__, "protocol": version_text(PROTOCOL),
            "host": socket.gethostname(), "machine": machine_tag(), "rpc_port": rpc_port,
            "devices": [{"name": d.name, "description": d.description, "kind": d.kind,
                         "bandwidth_gbps": d.bandwidth_gbps} for d in devices]}


def ipv4_address(host: str) -> str:
    """The IPv4 address to listen on: llama.cpp's RPC server takes only a dotted IPv4
    address, so a name (localhost, the machine's LAN name) is resolved here."""
    try:
        return socket.gethostbyname(host)
    except (OSError, UnicodeError):
        raise InvalidRequest(f"--host {host!r} is not an IPv4 address or a name that resolves"
                             " to one (llama.cpp's RPC server listens on IPv4 only).") from None


def check_port_free(host: str, port: int) -> None:
    """DaemonError when ``host:port`` cannot be listened on (llama.cpp only prints that it
    failed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise DaemonError(f"cannot listen on {host}:{port}: {exc.strerror or exc}"
                              f"{' (another worker or program uses it?)' if port else ''};"
                              " choose another with --port.", title="port in use") from None


class InfoServer:
    """Answers every connection on its port with the worker's JSON description (an HTTP/1.0
    reply, so `curl http://HOST:PORT/` reads it too)."""

    def __init__(self, host: str, port: int, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        self._reply = (b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
                       b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(8)
        threading.Thread(target=self._serve, name="localinfer-worker-info", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(2.0)
                    conn.recv(4096)  # the request line: its content does not matter
                    conn.sendall(self._reply)
                except OSError:
                    pass


def serve(host: str, port: int, *, device_names: Sequence[str], cache_dir: Path | None,
          n_threads: int, hw: HardwareProfile, out: Any) -> None:
    """Print what this worker offers and serve until killed (or until llama.cpp's server
    fails to listen: DaemonError)."""
    if not llama.supports_rpc():
        raise BackendUnavailable(llama.RPC_MISSING, title="no RPC support in this build")
    host = ipv4_address(host)
    check_port_free(host, port)
    devices = offered(choose_devices(device_names), hw, n_threads)
    try:
        InfoServer(host, port + INFO_PORT_OFFSET, info_document(devices, port))
        info_note = f"its description on port {port + INFO_PORT_OFFSET}"
    except OSError as exc:
        info_note = (f"no description (port {port + INFO_PORT_OFFSET}: {exc.strerror}):"
                     " clients see its devices without names or bandwidth")
    gib = float(1 << 30)
    print(f"localinfer worker: llama.cpp RPC protocol {version_text(PROTOCOL)} on"
          f" {host}:{port}, {info_note}", file=out)
    for d in devices:
        bandwidth = f", {d.bandwidth_gbps:.1f} GB/s measured" if d.bandwidth_gbps else ""
        print(f"  {d.name:<8} {d.description}: {d.memory_free / gib:.1f} GiB free of"
              f" {d.memory_total / gib:.1f} GiB{bandwidth}", file=out)
    print(f"  tensor cache: {cache_dir or 'off'}; threads: {n_threads}", file=out)
    if not is_loopback(host):
        print(f"warning: {host}:{port} is reachable from the network and llama.cpp's RPC"
              " protocol has no authentication: anyone who can reach it can use this"
              " machine's memory and compute. Expose it only on a network you trust.",
              file=out)
    print(f"use it with: localinfer serve --workers {host}:{port}", file=out, flush=True)
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
    # Blocks in C (the GIL released) while it serves, one client at a time.
    llama.start_rpc_server(f"{host}:{port}", str(cache_dir) if cache_dir else None, n_threads,
                           [d.name for d in devices])
    raise DaemonError(f"llama.cpp's RPC server stopped: it could not listen on {host}:{port}"
                      " (see its message above).")
