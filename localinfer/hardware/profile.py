"""The hardware profile: what this machine (or a machine described in a JSON file) offers.

A ``HardwareProfile`` is plain, frozen data: memory, CPU, GPUs, the llama.cpp backends the
build can use, and the host memory bandwidth. ``localinfer hw --json`` writes one, and
``localinfer plan --hardware FILE`` reads one back, so the planner can answer for a machine we
do not have. Sizes are in GiB (``*_gib``), bandwidths in GB/s (``*_gbps``, 10^9 bytes/s).

The JSON format (``schema`` 1); fields marked ? are optional::

    {
      "schema": 1,
      "name": "desktop, RTX 3060 12 GB, 32 GB RAM",      ? a label
      "os": "linux", "arch": "x86_64",                     ?
      "ram_total_gib": 32, "ram_available_gib": 27,        available ? (default: 80% of total)
      "swap_total_gib": 2,                                 ?
      "cpu": {"model": "AMD Ryzen 7 5800X", "physical_cores": 8, "logical_cores": 16,
              "ghz": 4.2, "flags": ["avx2", "fma", "f16c"], "threads": 8,
              "sockets": 1},                       ghz/flags/threads/sockets ?
      "host_bandwidth_gbps": 40,        ? measured read bandwidth, all cores (for a hand-written
                                          profile: about 80% of the RAM's theoretical peak; with
                                          several sockets, all of them together)
      "host_bandwidth_1core_gbps": 15,  ? the same with one core
      "bandwidth_source": "measured",   ? "measured", "spec" or "estimated"
      "gpus": [{"name": "NVIDIA GeForce RTX 3060", "vendor": "nvidia", "kind": "discrete",
                "vram_total_gib": 12, "vram_free_gib": 11.5, "bandwidth_gbps": 360,
                "fp16_tflops": 51, "unified_memory": false, "backends": ["CUDA", "Vulkan"]}],
      "backends": ["CPU", "CUDA"],      the llama.cpp build's backends (["CPU"] = no offload)
      "workers": [{"endpoint": "192.168.1.20:50052",    ? RPC workers (``localinfer worker``)
                   "name": "desktop", "protocol": "3.0.0",   name/protocol ?
                   "rtt_ms": 0.3, "link_gbps": 0.117,   ? measured round trip of a small RPC
                                                           command, and throughput in GB/s
                                                           (0 or absent = unknown: the plan
                                                           assumes LAN figures and says so)
                   "devices": [{"name": "CUDA0", "kind": "gpu",      kind ? (default "cpu")
                                "memory_total_gib": 24, "memory_free_gib": 23.2,   free ?
                                "bandwidth_gbps": 1008,   ? 0 = unknown (a stock rpc-server)
                                "description": "NVIDIA GeForce RTX 4090"}]}]   ?
    }

A worker's devices are listed in the order its server reports them; the workers in the order
they are registered (``--workers``), which is the order llama.cpp gives them layers in.
"""

from __future__ import annotations

import ipaddress
import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..paths import parse_json

SCHEMA = 1

GPU_VENDORS = ("nvidia", "amd", "intel", "apple", "other")
GPU_KINDS = ("discrete", "integrated")
REMOTE_DEVICE_KINDS = ("cpu", "gpu")
KNOWN_BACKENDS = ("CPU", "CUDA", "ROCm", "Metal", "Vulkan", "SYCL", "OpenCL", "CANN", "MUSA")
# Which ggml backends can drive a GPU of each vendor.
VENDOR_BACKENDS: dict[str, tuple[str, ...]] = {
    "nvidia": ("CUDA", "Vulkan"),
    "amd": ("ROCm", "Vulkan"),
    "intel": ("SYCL", "Vulkan"),
    "apple": ("Metal",),
    "other": ("Vulkan", "OpenCL"),
}


@dataclass(frozen=True)
class CPUInfo:
    model: str
    """Marketing name, e.g. "AMD Ryzen 7 5800X 8-Core Processor"."""
    physical_cores: int
    logical_cores: int
    ghz: float = 0.0
    """Sustained clock in GHz (0 = unknown; the planner then assumes 2.5)."""
    flags: tuple[str, ...] = ()
    """ISA features llama.cpp uses: avx, avx2, avx512f, avx512_vnni, f16c, fma, neon, sve..."""
    threads: int = 0
    """Threads the runtime should use (0 = physical cores)."""
    sockets: int = 1
    """CPU packages (NUMA nodes with their own memory). One process gets one socket's
    bandwidth: the planner divides the host bandwidth by this."""

    @property
    def runtime_threads(self) -> int:
        return self.threads or self.physical_cores or self.logical_cores or 1

    @property
    def simd(self) -> str:
        """The widest SIMD family: "avx512", "avx2", "avx", "neon-i8mm", "neon-dotprod",
        "neon" or "scalar"."""
        flags = set(self.flags)
        if "avx512f" in flags:
            return "avx512"
        if "avx2" in flags:
            return "avx2"
        if "avx" in flags:
            return "avx"
        if "i8mm" in flags or "sve" in flags:
            return "neon-i8mm"
        if "asimddp" in flags or "dotprod" in flags:
            return "neon-dotprod"
        if "neon" in flags or "asimd" in flags:
            return "neon"
        return "scalar"


@dataclass(frozen=True)
class GPUInfo:
    name: str
    vendor: str
    """"nvidia", "amd", "intel", "apple" or "other"."""
    kind: str
    """"discrete" (own VRAM) or "integrated" (shares system RAM)."""
    vram_total_gib: float
    """For integrated GPUs and Apple Silicon: how much of the shared RAM the GPU may use."""
    vram_free_gib: float
    bandwidth_gbps: float
    """Theoretical memory bandwidth (bus width x data rate), GB/s."""
    unified_memory: bool = False
    """True when the GPU's memory is the system RAM (Apple Silicon, iGPUs): what it holds
    is taken from RAM too."""
    fp16_tflops: float = 0.0
    """Dense FP16 throughput for prefill estimates (0 = unknown: estimated from bandwidth)."""
    backends: tuple[str, ...] = ()
    """ggml backends that can drive this GPU (default: by vendor)."""

    @property
    def drivers(self) -> tuple[str, ...]:
        return self.backends or VENDOR_BACKENDS.get(self.vendor, ())


@dataclass(frozen=True)
class RemoteDevice:
    """One device that an RPC worker offers (llama.cpp's ``rpc-server`` exposes its
    backends' devices; each takes layers like a local GPU)."""

    name: str
    """The device as the worker's ggml names it: "CPU", "CUDA0", "Metal"..."""
    memory_total_gib: float
    memory_free_gib: float
    """What the worker reports free now (the plan keeps a reserve below it)."""
    bandwidth_gbps: float = 0.0
    """The device's memory read bandwidth, as ``localinfer worker`` measured it (0 = unknown:
    a stock ``rpc-server`` does not say)."""
    description: str = ""
    kind: str = "cpu"
    """"cpu" or "gpu"."""


@dataclass(frozen=True)
class WorkerProfile:
    """A machine reached through llama.cpp's RPC backend, and the link to it."""

    endpoint: str
    """"host:port" of its RPC server."""
    devices: tuple[RemoteDevice, ...]
    rtt_ms: float = 0.0
    """Measured round trip of a small RPC command (0 = unknown)."""
    link_gbps: float = 0.0
    """Measured throughput to the worker, GB/s (10^9 bytes/s; 0 = unknown)."""
    protocol: str = ""
    """The RPC protocol version the worker speaks, "major.minor.patch"."""
    name: str = ""
    """A label: the worker's host name, when it says."""
    same_machine: bool = False
    """The worker publishes this machine's tag (``rpc.machine_tag``: a hash of its machine id)
    although reached at another address (a network namespace, a container sharing the id, this
    machine's LAN address): its CPU and RAM are this machine's, as a loopback worker's are."""

    @property
    def host(self) -> str:
        """The host part of ``endpoint`` (an IPv6 address without its brackets)."""
        return self.endpoint.rsplit(":", 1)[0].strip("[]")

    @property
    def is_loopback(self) -> bool:
        """True when the worker runs on this machine (127.0.0.0/8, ::1, localhost): its CPU
        and RAM are this machine's."""
        if self.host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


@dataclass(frozen=True)
class HardwareProfile:
    """What a machine offers to llama.cpp. Frozen and JSON-serialisable."""

    ram_total_gib: float
    ram_available_gib: float
    """RAM that can be used without swapping: available memory, capped by a cgroup limit."""
    cpu: CPUInfo
    gpus: tuple[GPUInfo, ...] = ()
    backends: tuple[str, ...] = ("CPU",)
    """The llama.cpp build's backends. Only "CPU" means it cannot offload to any GPU."""
    build_backends: tuple[str, ...] = ()
    """The ggml backends compiled into the build, with a device or not ("RPC", "Vulkan"...;
    empty when not probed)."""
    host_bandwidth_gbps: float = 0.0
    """Host memory read bandwidth with all cores, GB/s (0 = unknown)."""
    host_bandwidth_1core_gbps: float = 0.0
    """The same with one core (0 = unknown)."""
    bandwidth_source: str = "estimated"
    """"measured" (by ``localinfer hw``), "spec" (a data sheet) or "estimated"."""
    swap_total_gib: float = 0.0
    memory_limit_gib: float | None = None
    """A cgroup memory limit, when one applies (already included in ram_available_gib)."""
    name: str = ""
    os: str = ""
    arch: str = ""
    notes: tuple[str, ...] = ()
    """What the probes could not see or the build cannot use, in words."""
    workers: tuple[WorkerProfile, ...] = ()
    """RPC workers on other machines whose devices can hold layers (``--workers``)."""
    schema: int = SCHEMA

    # --- derived facts ----------------------------------------------------------------
    @property
    def can_offload(self) -> bool:
        return any(b != "CPU" for b in self.backends)

    def usable_gpus(self) -> list[tuple[GPUInfo, str]]:
        """GPUs this llama.cpp build can drive, each with the backend that would drive it."""
        out = []
        for gpu in self.gpus:
            backend = next((b for b in gpu.drivers if b in self.backends), None)
            if backend is not None:
                out.append((gpu, backend))
        return out

    # --- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (lists, not tuples), in the format ``from_dict`` reads."""
        return json.loads(json.dumps(asdict(self)))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: Any, source: str = "profile") -> HardwareProfile:
        return _Parser(source).profile(data)

    @classmethod
    def from_json(cls, text: str, source: str = "profile") -> HardwareProfile:
        try:
            data = parse_json(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{source} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
            ) from None
        except ValueError as exc:  # nested too deeply
            raise ConfigError(f"{source} cannot be a profile: {exc}.") from None
        return cls.from_dict(data, source)


MAX_FIGURE = 1e9
"""The largest number a profile's field may hold (GiB, GB/s, TFLOPS, ms, Gbit/s: none comes
near it)."""


def load_profile(path: str | Path) -> HardwareProfile:
    """Read a hardware profile JSON file (``localinfer plan --hardware FILE``)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"hardware profile {path} does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"hardware profile {path} cannot be read: {exc}.") from None
    return HardwareProfile.from_json(text, source=str(path))


class _Parser:
    """Validates a profile dict, naming the field at fault."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, where: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}: field {where} {problem} (see `localinfer plan"
                           " --help` for the profile format).")

    def table(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(where, f"must be an object, got {type(value).__name__}")
        return value

    def known(self, data: dict[str, Any], cls: type, where: str) -> None:
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - allowed)
        if unknown:
            prefix = f"{where}." if where else ""
            raise self.error(f"{prefix}{unknown[0]}", "is not a known field")

    def number(self, data: dict[str, Any], key: str, where: str, *, default: Any = ...,
               positive: bool = False) -> Any:
        path = f"{where}.{key}" if where else key
        if key not in data:
            if default is ...:
                raise self.error(path, "is missing")
            return default
        value = data[key]
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value):
            raise self.error(path, f"must be a number, got {value!r}")
        if value < 0 or (positive and value == 0):
            raise self.error(path, f"must be {'above' if positive else 'at least'} 0, got {value}")
        if value > MAX_FIGURE:  # 1e300 GiB overflowed the planner's byte counts (exit 70)
            raise self.error(path, f"must be at most {MAX_FIGURE:g}, got {value:g}")
        return value

    def string(self, data: dict[str, Any], key: str, where: str, default: Any = ...,
               choices: tuple[str, ...] | None = None) -> str:
        path = f"{where}.{key}" if where else key
        if key not in data:
            if default is ...:
                raise self.error(path, "is missing")
            return default
        value = data[key]
        if not isinstance(value, str):
            raise self.error(path, f"must be a string, got {value!r}")
        if choices and value not in choices:
            raise self.error(path, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def strings(self, data: dict[str, Any], key: str, where: str, default: tuple[str, ...],
                choices: tuple[str, ...] | None = None) -> tuple[str, ...]:
        path = f"{where}.{key}" if where else key
        value = data.get(key, list(default))
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(path, f"must be a list of strings, got {value!r}")
        if choices:
            bad = [v for v in value if v not in choices]
            if bad:
                raise self.error(path, f"has unknown backend {bad[0]!r} (known:"
                                       f" {', '.join(choices)})")
        return tuple(value)

    def cpu(self, value: Any) -> CPUInfo:
        data = self.table(value, "cpu")
        self.known(data, CPUInfo, "cpu")
        physical = int(self.number(data, "physical_cores", "cpu", positive=True))
        logical = int(self.number(data, "logical_cores", "cpu", default=physical, positive=True))
        return CPUInfo(
            model=self.string(data, "model", "cpu", default="unknown CPU"),
            physical_cores=physical,
            logical_cores=max(logical, physical),
            ghz=float(self.number(data, "ghz", "cpu", default=0.0)),
            flags=tuple(f.lower() for f in self.strings(data, "flags", "cpu", ())),
            threads=int(self.number(data, "threads", "cpu", default=0)),
            sockets=int(self.number(data, "sockets", "cpu", default=1, positive=True)),
        )

    def gpu(self, value: Any, index: int) -> GPUInfo:
        where = f"gpus[{index}]"
        data = self.table(value, where)
        self.known(data, GPUInfo, where)
        total = float(self.number(data, "vram_total_gib", where, positive=True))
        free = float(self.number(data, "vram_free_gib", where, default=total))
        if free > total:
            raise self.error(f"{where}.vram_free_gib", f"({free}) is more than vram_total_gib"
                                                        f" ({total})")
        vendor = self.string(data, "vendor", where, choices=GPU_VENDORS)
        return GPUInfo(
            name=self.string(data, "name", where),
            vendor=vendor,
            kind=self.string(data, "kind", where,
                             default="integrated" if vendor == "apple" else "discrete",
                             choices=GPU_KINDS),
            vram_total_gib=total,
            vram_free_gib=free,
            bandwidth_gbps=float(self.number(data, "bandwidth_gbps", where, positive=True)),
            unified_memory=bool(data.get("unified_memory", vendor == "apple")),
            fp16_tflops=float(self.number(data, "fp16_tflops", where, default=0.0)),
            backends=self.strings(data, "backends", where, (), KNOWN_BACKENDS),
        )

    def remote_device(self, value: Any, where: str) -> RemoteDevice:
        data = self.table(value, where)
        self.known(data, RemoteDevice, where)
        total = float(self.number(data, "memory_total_gib", where, positive=True))
        free = float(self.number(data, "memory_free_gib", where, default=total))
        if free > total:
            raise self.error(f"{where}.memory_free_gib", f"({free}) is more than"
                                                          f" memory_total_gib ({total})")
        return RemoteDevice(
            name=self.string(data, "name", where),
            memory_total_gib=total,
            memory_free_gib=free,
            bandwidth_gbps=float(self.number(data, "bandwidth_gbps", where, default=0.0)),
            description=self.string(data, "description", where, default=""),
            kind=self.string(data, "kind", where, default="cpu", choices=REMOTE_DEVICE_KINDS),
        )

    def worker(self, value: Any, index: int) -> WorkerProfile:
        where = f"workers[{index}]"
        data = self.table(value, where)
        self.known(data, WorkerProfile, where)
        endpoint = self.string(data, "endpoint", where)
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise self.error(f"{where}.endpoint", f"must be HOST:PORT (a port 1-65535), got"
                                                  f" {endpoint!r}")
        devices = data.get("devices")
        if not isinstance(devices, list) or not devices:
            raise self.error(f"{where}.devices", "must be a non-empty list of the worker's"
                                                 " devices" if devices is not None
                             else "is missing")
        return WorkerProfile(
            endpoint=endpoint,
            devices=tuple(self.remote_device(d, f"{where}.devices[{i}]")
                          for i, d in enumerate(devices)),
            rtt_ms=float(self.number(data, "rtt_ms", where, default=0.0)),
            link_gbps=float(self.number(data, "link_gbps", where, default=0.0)),
            protocol=self.string(data, "protocol", where, default=""),
            name=self.string(data, "name", where, default=""),
        )

    def workers(self, value: Any) -> tuple[WorkerProfile, ...]:
        if not isinstance(value, list):
            raise self.error("workers", "must be a list")
        workers = tuple(self.worker(w, i) for i, w in enumerate(value))
        seen: set[str] = set()
        for i, w in enumerate(workers):
            if w.endpoint in seen:
                raise self.error(f"workers[{i}].endpoint", f"{w.endpoint!r} is listed twice")
            seen.add(w.endpoint)
        return workers

    def profile(self, value: Any) -> HardwareProfile:
        data = self.table(value, "(top level)")
        self.known(data, HardwareProfile, "")
        schema = data.get("schema", SCHEMA)
        if schema != SCHEMA:
            raise self.error("schema", f"is {schema!r}; this localinfer reads schema {SCHEMA}")
        total = float(self.number(data, "ram_total_gib", "", positive=True))
        available = float(self.number(data, "ram_available_gib", "", default=total * 0.8))
        if available > total:
            raise self.error("ram_available_gib", f"({available}) is more than ram_total_gib"
                                                  f" ({total})")
        if "cpu" not in data:
            raise self.error("cpu", "is missing")
        gpus = data.get("gpus", [])
        if not isinstance(gpus, list):
            raise self.error("gpus", "must be a list")
        backends = self.strings(data, "backends", "", ("CPU",), KNOWN_BACKENDS)
        limit = data.get("memory_limit_gib")
        return HardwareProfile(
            schema=SCHEMA,
            name=self.string(data, "name", "", default=""),
            os=self.string(data, "os", "", default=""),
            arch=self.string(data, "arch", "", default=""),
            ram_total_gib=total,
            ram_available_gib=available,
            swap_total_gib=float(self.number(data, "swap_total_gib", "", default=0.0)),
            memory_limit_gib=(None if limit is None else
                              float(self.number(data, "memory_limit_gib", "", positive=True))),
            cpu=self.cpu(data["cpu"]),
            gpus=tuple(self.gpu(g, i) for i, g in enumerate(gpus)),
            backends=backends if "CPU" in backends else ("CPU", *backends),
            build_backends=self.strings(data, "build_backends", "", (),
                                        (*KNOWN_BACKENDS, "RPC", "BLAS")),
            host_bandwidth_gbps=float(self.number(data, "host_bandwidth_gbps", "", default=0.0)),
            host_bandwidth_1core_gbps=float(
                self.number(data, "host_bandwidth_1core_gbps", "", default=0.0)),
            bandwidth_source=self.string(data, "bandwidth_source", "", default="spec",
                                         choices=("measured", "spec", "estimated")),
            notes=self.strings(data, "notes", "", ()),
            workers=self.workers(data.get("workers", [])),
        )
