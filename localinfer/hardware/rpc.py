"""A pure-Python client of llama.cpp's RPC protocol (ggml-rpc), to probe a worker before
llama.cpp is ever handed its address: llama.cpp aborts the whole process when a connect or
handshake fails, so every endpoint passes here first.

Wire format (``ggml/src/ggml-rpc/ggml-rpc.cpp``, little-endian, packed structs)::

    request:  | command (1 byte) | payload size (u64) | payload |
    reply:    | reply size (u64) | reply |              (only for commands that answer)

The first command on a connection is HELLO (24 zero bytes of transport capabilities; the
reply is major, minor, patch, padding and 24 bytes of capabilities). A worker whose major
version differs from ours, or whose minor is newer, is refused, as llama.cpp itself would.
A worker serves one client at a time: while a model holds it, a probe waits in its queue and
times out ("busy").

``localinfer worker`` also answers one HTTP GET on the next port (``port + 1``) with a JSON
object that the RPC protocol cannot carry (``worker_info``)::

    {"localinfer": "0.1.0", "protocol": "7.0.0", "host": "desk", "rpc_port": 50052,
     "devices": [{"name": "CPU", "description": "...", "kind": "cpu",
                  "bandwidth_gbps": 38.5}]}

A stock ``rpc-server`` has no such port: its devices are named by index and their bandwidth
is unknown (0).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import socket
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, WorkerError
from .profile import RemoteDevice, WorkerProfile

PROTOCOL = (7, 0, 0)
"""RPC_PROTO_{MAJOR,MINOR,PATCH}_VERSION of the llama.cpp that llama-cpp-python 0.3.36 ships
(``ggml/include/ggml-rpc.h``)."""
DEFAULT_PORT = 50052
"""llama.cpp's ``rpc-server`` default port."""
INFO_PORT_OFFSET = 1
"""``localinfer worker`` publishes its JSON description on its RPC port plus this."""
MISMATCH = "worker protocol mismatch"
"""The title of the error for a worker of another protocol version: refused, never skipped."""
CONNECT_TIMEOUT_S = 3.0
REPLY_TIMEOUT_S = 5.0

# enum rpc_cmd
CMD_ALLOC_BUFFER = 0
CMD_GET_ALIGNMENT = 1
CMD_BUFFER_GET_BASE = 3
CMD_FREE_BUFFER = 4
CMD_SET_TENSOR = 6
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15

CONN_CAPS_SIZE = 24
HELLO_REPLY_SIZE = 4 + CONN_CAPS_SIZE
MAX_HELLO_REPLY = 4096
"""A HELLO reply longer than this is not from a llama.cpp RPC server."""
GGML_TYPE_F32 = 0
MAX_DEVICES = 16
RTT_SAMPLES = 9
THROUGHPUT_BYTES = 4 << 20
"""Sent THROUGHPUT_SENDS times to measure the link's throughput (into a buffer the worker
allocates and frees); the best counts (the first also pays for the worker's page faults)."""
THROUGHPUT_SENDS = 3

# struct rpc_tensor: id, type, buffer, ne[4] (u32), nb[4] (u32), op, op_params[16], flags,
# src[10], view_src, view_offs, data, name[64], use_count.
_RPC_TENSOR = struct.Struct("<QIQ4I4II16iI10QQQQ64si")
assert _RPC_TENSOR.size == 296


def version_text(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


def compatible(version: tuple[int, int, int]) -> bool:
    """llama.cpp's own rule: the same major version, and a minor no newer than ours."""
    return version[0] == PROTOCOL[0] and version[1] <= PROTOCOL[1]


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6addr]:PORT`` too) -> (host, port); ConfigError when malformed."""
    text = text.strip()
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not _HOST.fullmatch(host) or not port_text.isdigit() \
            or not 0 < int(port_text) < 65536:  # "http://h:1" passed as the host "http://h"
        raise ConfigError(f"worker {text!r} is not HOST:PORT (e.g. 192.168.1.20:{DEFAULT_PORT}).")
    return host, int(port_text)


_HOST = re.compile(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*")
"""A host name, an IPv4 address, or an IPv6 one (given in brackets)."""


def parse_endpoints(text: str | None) -> tuple[str, ...]:
    """A comma-separated ``HOST:PORT,...`` list (``--workers``, ``workers`` in the config),
    each checked, in order, without duplicates."""
    out: list[str] = []
    for item in (text or "").split(","):
        if item.strip():
            host, port = parse_endpoint(item)
            endpoint = f"{host}:{port}"
            if endpoint not in out:
                out.append(endpoint)
    return tuple(out)


def parse_hello_reply(reply: bytes) -> tuple[int, int, int]:
    """The worker's protocol version from its HELLO reply."""
    if len(reply) < 3:
        raise ValueError(f"a HELLO reply of {len(reply)} bytes")
    return reply[0], reply[1], reply[2]


def parse_worker_info(data: Any) -> dict[str, Any]:
    """The JSON a ``localinfer worker`` publishes, checked; ValueError when malformed."""
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        raise ValueError("not an object with a list of devices")
    for device in data["devices"]:
        if not isinstance(device, dict) or not isinstance(device.get("name"), str):
            raise ValueError("a device without a name")
        bandwidth = device.get("bandwidth_gbps", 0)
        if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) \
                or not 0 <= bandwidth <= 1e6:  # GB/s; 1e308 came over the network
            raise ValueError(f"device {device['name']}: bandwidth_gbps {bandwidth!r}")
    if not isinstance(data.get("host", ""), str):
        raise ValueError("host is not a string")
    return data


def rpc_tensor_bytes(*, buffer: int, data: int, n_bytes: int) -> bytes:
    """A one-dimensional f32 tensor of ``n_bytes`` at ``data`` in remote ``buffer``."""
    n = n_bytes // 4
    return _RPC_TENSOR.pack(1, GGML_TYPE_F32, buffer, n, 1, 1, 1, 4, n_bytes, n_bytes,
                            n_bytes, 0, *([0] * 16), 0, *([0] * 10), 0, 0, data,
                            b"localinfer-probe", 0)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listens(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether something takes a TCP connection on ``host:port`` at once."""
    if port > 65535:
        return False
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


class RPCConnection:
    """One connection to a worker, after a successful HELLO. Every call has a timeout."""

    def __init__(self, endpoint: str, *, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 reply_timeout_s: float = REPLY_TIMEOUT_S) -> None:
        self.endpoint = endpoint
        host, port = parse_endpoint(endpoint)
        try:
            self._sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        except OSError as exc:
            info_port = port + INFO_PORT_OFFSET
            if _listens(host, info_port):  # its description answers: it runs, held by another
                raise WorkerError(
                    f"worker {endpoint} runs (its description answers on port {info_port}) but"
                    f" takes no connection now ({_reason(exc)}): another daemon holds it. Stop"
                    " that daemon's model, or leave this worker out of --workers.",
                    title="worker busy") from None
            start = f"--port {port}" if is_loopback(host) else f"--host 0.0.0.0 --port {port}"
            raise WorkerError(f"cannot reach worker {endpoint}: {_reason(exc)}. Start one"
                              f" there with `localinfer worker {start}` (or llama.cpp's"
                              " rpc-server), or leave it out of --workers.",
                              title="worker unreachable") from None
        self._sock.settimeout(reply_timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.version = self._hello()
        except BaseException:
            self.close()
            raise

    def _hello(self) -> tuple[int, int, int]:
        self.send(CMD_HELLO, bytes(CONN_CAPS_SIZE))
        try:
            size = struct.unpack("<Q", self._recv_exact(8))[0]
            if not 3 <= size <= MAX_HELLO_REPLY:
                raise WorkerError(f"{self.endpoint} answered the RPC handshake with"
                                  f" {size} bytes: it is not a llama.cpp RPC worker.")
            version = parse_hello_reply(self._recv_exact(size))
        except TimeoutError:
            raise WorkerError(
                f"worker {self.endpoint} accepted the connection but did not answer the"
                " handshake: it is busy serving another client (a model loaded by another"
                " localinfer or llama.cpp: a worker serves one at a time), or it is not a"
                " llama.cpp RPC worker.", title="worker busy") from None
        except (OSError, _Closed):
            raise WorkerError(
                f"{self.endpoint} closed the connection during the RPC handshake: not a"
                " llama.cpp RPC worker, or one of an older protocol than"
                f" {version_text(PROTOCOL)} (it logs \"client needs upgrade\").") from None
        if not compatible(version):
            why = ("its major version differs" if version[0] != PROTOCOL[0]
                   else "its minor version is newer")
            raise WorkerError(
                f"worker {self.endpoint} speaks RPC protocol {version_text(version)}; this"
                f" localinfer's llama.cpp speaks {version_text(PROTOCOL)} ({why}). Run a"
                " worker built from the same llama.cpp version (`localinfer worker` from"
                " this localinfer's install).", title=MISMATCH)
        return version

    # --- framing ----------------------------------------------------------------------------
    def send(self, cmd: int, payload: bytes = b"") -> None:
        try:
            self._sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
        except OSError as exc:
            raise self._lost(exc) from None

    def call(self, cmd: int, payload: bytes, reply_size: int) -> bytes:
        """Send a command and read its reply of exactly ``reply_size`` bytes."""
        self.send(cmd, payload)
        try:
            size = struct.unpack("<Q", self._recv_exact(8))[0]
            if size != reply_size:
                raise WorkerError(f"worker {self.endpoint} sent a reply of {size} bytes to"
                                  f" command {cmd}, not {reply_size}.")
            return self._recv_exact(size)
        except (OSError, _Closed) as exc:
            raise self._lost(exc) from None

    def _recv_exact(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self._sock.recv(n - len(chunks))
            if not chunk:
                raise _Closed
            chunks += chunk
        return bytes(chunks)

    def _lost(self, exc: BaseException) -> WorkerError:
        what = "stopped answering" if isinstance(exc, TimeoutError) else "closed the connection"
        return WorkerError(f"worker {self.endpoint} {what} ({_reason(exc)}).")

    # --- commands ---------------------------------------------------------------------------
    def device_count(self) -> int:
        count = struct.unpack("<I", self.call(CMD_DEVICE_COUNT, b"", 4))[0]
        if not 0 < count <= MAX_DEVICES:
            raise WorkerError(f"worker {self.endpoint} reports {count} devices.")
        return int(count)

    def device_memory(self, device: int) -> tuple[int, int]:
        """(free, total) bytes of one device."""
        free, total = struct.unpack("<QQ", self.call(CMD_GET_DEVICE_MEMORY,
                                                     struct.pack("<I", device), 16))
        return int(free), int(total)

    def alignment(self, device: int) -> int:
        return int(struct.unpack("<Q", self.call(CMD_GET_ALIGNMENT,
                                                 struct.pack("<I", device), 8))[0])

    def round_trip_ms(self, samples: int = RTT_SAMPLES) -> float:
        """The median time of a command that does no work on the worker."""
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            self.call(CMD_GET_ALIGNMENT, struct.pack("<I", 0), 8)
            times.append((time.perf_counter() - t0) * 1000.0)
        return statistics.median(times)

    def throughput_gbps(self, n_bytes: int = THROUGHPUT_BYTES) -> float:
        """GB/s of tensor data sent to device 0 (into a buffer allocated for it and freed
        after), the best of THROUGHPUT_SENDS sends, each timed to the reply of the command
        after it."""
        reply = self.call(CMD_ALLOC_BUFFER, struct.pack("<IQ", 0, n_bytes), 16)
        buffer, size = struct.unpack("<QQ", reply)
        if not buffer or size < n_bytes:
            return 0.0  # the worker has no room for it: unknown rather than a failure
        try:
            base = struct.unpack("<Q", self.call(CMD_BUFFER_GET_BASE,
                                                 struct.pack("<Q", buffer), 8))[0]
            header = rpc_tensor_bytes(buffer=buffer, data=base, n_bytes=n_bytes)
            payload = header + b"\0" + struct.pack("<Q", 0) + bytes(n_bytes)
            best = 0.0
            for _ in range(THROUGHPUT_SENDS):
                t0 = time.perf_counter()
                self.send(CMD_SET_TENSOR, payload)
                self.alignment(0)  # set_tensor has no reply: this one comes after it
                best = max(best, n_bytes / (time.perf_counter() - t0) / 1e9)
            return best
        finally:
            self.send(CMD_FREE_BUFFER, struct.pack("<Q", buffer))
            self.alignment(0)

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> RPCConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Closed(Exception):
    """The worker closed the connection."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, _Closed):
        return "connection closed"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def worker_answers(endpoint: str) -> bool:
    """Whether a worker is still there: it completes the RPC handshake, or accepts the
    connection but is still busy (freeing what the dead child held) when asked."""
    try:
        RPCConnection(endpoint, connect_timeout_s=1.0, reply_timeout_s=2.0).close()
        return True
    except WorkerError as exc:
        return exc.title == "worker busy"


def worker_info(endpoint: str, *, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """What a ``localinfer worker`` publishes on its RPC port + 1, or None (a stock
    ``rpc-server``, or nothing valid answers there)."""
    host, port = parse_endpoint(endpoint)
    try:
        with socket.create_connection((host, port + INFO_PORT_OFFSET), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            s.sendall(f"GET / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            data = bytearray()
            deadline = time.monotonic() + timeout_s
            while len(data) < 1 << 20 and time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        _, _, body = bytes(data).partition(b"\r\n\r\n")
        return parse_worker_info(json.loads(body))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class _Named:
    name: str
    description: str
    kind: str
    bandwidth_gbps: float


def machine_tag() -> str:
    """A short hash of this machine's /etc/machine-id ("" where there is none): a worker that
    publishes the same one runs on this machine (in a network namespace or a container sharing
    the file, or reached at this machine's LAN address), whatever its host name says. Host names
    repeat (every Raspberry Pi is "raspberrypi"); machine ids do not."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path, "rb") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text:
            return hashlib.sha256(b"localinfer:" + text).hexdigest()[:16]
    return ""


def probe_worker(endpoint: str, *, measure_link: bool = True,
                 info: Callable[[str], dict[str, Any] | None] = worker_info) -> WorkerProfile:
    """Connect, check the protocol version, list the devices with their memory, and (with
    ``measure_link``) measure the link's round trip and throughput. WorkerError when the
    worker cannot be used; the connection is closed before this returns, so that llama.cpp
    can connect next (a worker serves one client at a time)."""
    described = info(endpoint) or {}
    named = [_Named(str(d.get("name")), str(d.get("description", "")),
                    "gpu" if d.get("kind") in ("gpu", "igpu") else "cpu",
                    float(d.get("bandwidth_gbps", 0.0)))
             for d in described.get("devices", [])]
    gib = float(1 << 30)
    with RPCConnection(endpoint) as conn:
        devices = []
        for i in range(conn.device_count()):
            free, total = conn.device_memory(i)
            label = named[i] if i < len(named) else _Named(f"device {i}", "", "cpu", 0.0)
            devices.append(RemoteDevice(name=label.name, memory_total_gib=total / gib,
                                        memory_free_gib=min(free, total) / gib,
                                        bandwidth_gbps=label.bandwidth_gbps,
                                        description=label.description, kind=label.kind))
        rtt_ms = conn.round_trip_ms() if measure_link else 0.0
        link_gbps = conn.throughput_gbps() if measure_link else 0.0
        version = conn.version
    return WorkerProfile(endpoint=endpoint, devices=tuple(devices), rtt_ms=round(rtt_ms, 3),
                         link_gbps=round(link_gbps, 3), protocol=version_text(version),
                         name=str(described.get("host", "")),
                         same_machine=bool(machine_tag())
                         and described.get("machine") == machine_tag())


def _refuse_one_worker_twice(described: dict[str, dict[str, Any] | None]) -> None:
    """ConfigError where two endpoints reach one worker (the same machine's tag and RPC port:
    localhost:N and 127.0.0.1:N): llama.cpp connected to it twice, and the load hung, the
    worker serving one client at a time."""
    seen: dict[tuple[str, Any], str] = {}
    for endpoint, info in described.items():
        if not info or not info.get("machine") or info.get("rpc_port") is None:
            continue
        key = (str(info["machine"]), info["rpc_port"])
        if key in seen:
            raise ConfigError(f"workers {seen[key]} and {endpoint} are the same worker (one"
                              " machine, one RPC port): name it once.")
        seen[key] = endpoint


def probe_workers(endpoints: tuple[str, ...], *, measure_link: bool = True,
                  skip_unreachable: bool = False) -> tuple[list[WorkerProfile], list[str]]:
    """Each worker's profile, in order. A refused worker (another protocol version, busy)
    always raises; an unreachable or failing one raises too, unless ``skip_unreachable``,
    where it is left out and its reason returned in the second list."""
    profiles, skipped = [], []
    described = {endpoint: worker_info(endpoint) for endpoint in endpoints}
    _refuse_one_worker_twice(described)
    for endpoint in endpoints:
        try:
            profiles.append(probe_worker(endpoint, measure_link=measure_link,
                                         info=lambda e: described[e]))
        except WorkerError as exc:
            if not skip_unreachable or exc.title == MISMATCH:
                raise
            skipped.append(exc.message)
    return profiles, skipped
