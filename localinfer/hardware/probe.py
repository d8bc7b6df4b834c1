"""Probes: each small function reads one thing about this machine and returns plain data.

``probe()`` puts them together into a ``HardwareProfile``. Every probe tolerates what is
missing (no NVML, no /sys, macOS, a container) and says so in the profile's notes instead of
failing: a machine we cannot see well still gets a plan, only a more cautious one.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..paths import get_paths
from . import bandwidth as bw
from .profile import CPUInfo, GPUInfo, HardwareProfile

log = logging.getLogger(__name__)

GIB = 2**30

# ISA flags llama.cpp cares about (x86 /proc/cpuinfo "flags", ARM "Features").
RELEVANT_FLAGS = (
    "sse3", "ssse3", "avx", "avx2", "f16c", "fma", "avx512f", "avx512bw", "avx512vl",
    "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "amx_bf16",
    "neon", "asimd", "asimddp", "dotprod", "i8mm", "sve", "sve2", "fphp", "asimdhp", "bf16",
)

# Apple Silicon: unified memory bandwidth (GB/s, Apple's figures) and GPU FP32 TFLOPS of the
# full-GPU configuration of each chip (binned parts with fewer GPU cores are a little slower).
APPLE_CHIPS: dict[str, tuple[float, float]] = {
    "M1": (68.25, 2.6), "M1 Pro": (200.0, 5.2), "M1 Max": (400.0, 10.4),
    "M1 Ultra": (800.0, 21.2),
    "M2": (100.0, 3.6), "M2 Pro": (200.0, 6.8), "M2 Max": (400.0, 13.6),
    "M2 Ultra": (800.0, 27.2),
    "M3": (100.0, 4.1), "M3 Pro": (150.0, 7.4), "M3 Max": (400.0, 16.4),
    "M3 Ultra": (819.0, 28.4),
    "M4": (120.0, 4.3), "M4 Pro": (273.0, 9.2), "M4 Max": (546.0, 18.4),
    "M5": (153.0, 5.7),
}


# --- memory ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int
    available_bytes: int
    swap_bytes: int
    limit_bytes: int | None
    """A cgroup memory limit below the physical RAM, if any."""


def probe_memory(cgroup_root: Path = Path("/sys/fs/cgroup")) -> MemoryInfo:
    import psutil

    vm = psutil.virtual_memory()
    total, available = int(vm.total), int(vm.available)
    limit = cgroup_limit(cgroup_root)
    if limit is not None and limit < total:
        used = cgroup_usage(cgroup_root) or 0
        available = max(0, min(available, limit - used))
    else:
        limit = None
    try:
        swap = int(psutil.swap_memory().total)
    except Exception:  # psutil raises on some containers without /proc/swaps
        swap = 0
    return MemoryInfo(total, available, swap, limit)


def cgroup_limit(root: Path) -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max`` or v1), None if none."""
    for name in ("memory.max", "memory/memory.limit_in_bytes"):
        text = _read(root / name)
        if text is None:
            continue
        text = text.strip()
        if text in ("", "max"):
            return None
        try:
            value = int(text)
        except ValueError:
            return None
        return value if value < 1 << 60 else None  # v1 writes ~2^63 for "no limit"
    return None


def cgroup_usage(root: Path) -> int | None:
    for name in ("memory.current", "memory/memory.usage_in_bytes"):
        text = _read(root / name)
        if text and text.strip().isdigit():
            return int(text.strip())
    return None


# --- CPU -------------------------------------------------------------------------------------
def parse_cpuinfo(text: str) -> tuple[str, float, tuple[str, ...]]:
    """(model name, MHz, relevant flags) from the text of /proc/cpuinfo (x86 or ARM)."""
    model, mhz, flags = "", 0.0, set()
    implementer = part = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value
        elif key == "cpu mhz" and not mhz:
            try:
                mhz = float(value)
            except ValueError:
                pass
        elif key in ("flags", "features"):
            flags.update(value.split())
        elif key == "cpu implementer":
            implementer = value
        elif key == "cpu part" and not part:
            part = value
    if not model and implementer == "0x41":
        model = _ARM_PARTS.get(part.lower(), f"ARM CPU (part {part})")
    if "asimd" in flags:
        flags.add("neon")
    relevant = tuple(f for f in RELEVANT_FLAGS if f in flags)
    return model, mhz, relevant


# The Arm cores in the boards people run llama.cpp on (/proc/cpuinfo has no model name there).
_ARM_PARTS = {"0xd03": "ARM Cortex-A53", "0xd08": "ARM Cortex-A72", "0xd0b": "ARM Cortex-A76",
              "0xd05": "ARM Cortex-A55", "0xd41": "ARM Cortex-A78", "0xd4f": "ARM Neoverse V2"}


def probe_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> CPUInfo:
    import psutil

    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    model, mhz, flags = parse_cpuinfo(_read(cpuinfo) or "")
    if platform.system() == "Darwin":
        model = model or _sysctl("machdep.cpu.brand_string") or "Apple CPU"
        if platform.machine() == "arm64":
            flags = ("neon", "dotprod", "fphp") + (("i8mm",) if _is_m2_or_later(model) else ())
            # llama.cpp uses the performance cores on Apple Silicon.
            physical = int(_sysctl("hw.perflevel0.physicalcpu") or physical)
    if not mhz:
        try:
            freq = psutil.cpu_freq()
            mhz = float(freq.max or freq.current) if freq else 0.0
        except Exception:
            mhz = 0.0
    if not model:
        model = platform.processor() or platform.machine() or "unknown CPU"
    return CPUInfo(model=" ".join(model.split()), physical_cores=physical,
                   logical_cores=logical, ghz=round(mhz / 1000.0, 2), flags=flags,
                   threads=physical)


def _is_m2_or_later(model: str) -> bool:
    m = re.search(r"Apple M(\d+)", model)
    return bool(m and int(m.group(1)) >= 2)


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    best = 0
    if root.is_dir():
        for index in root.glob("index*"):
            size = (_read(index / "size") or "").strip()
            m = re.fullmatch(r"(\d+)([KMG]?)", size)
            if m:
                best = max(best, int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20,
                                                     "G": 1 << 30}[m.group(2)])
    return best


# --- GPUs ------------------------------------------------------------------------------------
def probe_nvidia() -> tuple[list[GPUInfo], list[str]]:
    """NVIDIA GPUs through NVML (the optional ``nvidia-ml-py`` package)."""
    try:
        import pynvml
    except ImportError:
        return [], ["nvidia-ml-py is not installed: NVIDIA GPUs were not probed"
                    " (`pip install 'localinfer[nvidia]'`)."] if _has_nvidia_device() else []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, or no NVIDIA GPU: not an error
        return [], []
    gpus = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gpus.append(GPUInfo(
                name=name, vendor="nvidia", kind="discrete",
                vram_total_gib=round(mem.total / GIB, 2),
                vram_free_gib=round(mem.free / GIB, 2),
                bandwidth_gbps=nvidia_bandwidth_gbps(
                    pynvml.nvmlDeviceGetMemoryBusWidth(h),
                    pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
            ))
    except Exception as exc:
        log.debug("NVML query failed", exc_info=True)
        return gpus, [f"NVML failed while listing GPUs ({exc})."]
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return gpus, []


def nvidia_bandwidth_gbps(bus_width_bits: int, mem_clock_mhz: int) -> float:
    """Theoretical bandwidth: NVML's memory clock is half the data rate (GDDR and HBM are
    double data rate), so bytes/s = clock x 2 x bus width / 8. An RTX 4090: 10501 MHz x 2 x
    384 bit / 8 = 1008 GB/s."""
    return round(mem_clock_mhz * 1e6 * 2 * bus_width_bits / 8 / 1e9, 1)


def _has_nvidia_device() -> bool:
    return Path("/proc/driver/nvidia/gpus").is_dir()


def probe_drm(drm: Path = Path("/sys/class/drm"), ram_total_bytes: int = 0,
              host_bandwidth_gbps: float = 0.0) -> tuple[list[GPUInfo], list[str]]:
    """AMD GPUs (amdgpu's ``mem_info_vram_*``) and Intel integrated GPUs from sysfs."""
    gpus: list[GPUInfo] = []
    notes: list[str] = []
    if not drm.is_dir():
        return gpus, notes
    for card in sorted(drm.glob("card[0-9]*")):
        if "-" in card.name:  # connectors (card0-HDMI-A-1)
            continue
        dev = card / "device"
        vendor = (_read(dev / "vendor") or "").strip()
        device_id = (_read(dev / "device") or "").strip()
        if vendor == "0x1002":
            total = _int(_read(dev / "mem_info_vram_total"))
            used = _int(_read(dev / "mem_info_vram_used"))
            name = (_read(dev / "product_name") or "").strip() or f"AMD GPU {device_id}"
            if total and total > 2 * GIB:
                bus_bits = _amd_bus_bits(total)
                mclk = _max_mhz(_read(dev / "pp_dpm_mclk") or "")
                # amdgpu reports the memory clock; GDDR6 moves 16 bits per pin per clock
                # (8x, double-pumped quad data), so bytes/s = MHz x 16 x bus / 8.
                bandwidth = round(mclk * 1e6 * 16 * bus_bits / 8 / 1e9, 1) if mclk else 0.0
                if not bandwidth:
                    bandwidth = {128: 256.0, 192: 384.0, 256: 512.0, 320: 640.0,
                                 384: 960.0}.get(bus_bits, 256.0)
                notes.append(f"{name}: bandwidth {bandwidth:.0f} GB/s estimated from its VRAM"
                             f" size ({bus_bits}-bit bus assumed).")
                gpus.append(GPUInfo(name=name, vendor="amd", kind="discrete",
                                    vram_total_gib=round(total / GIB, 2),
                                    vram_free_gib=round((total - (used or 0)) / GIB, 2),
                                    bandwidth_gbps=bandwidth))
            elif total is not None:  # an APU: a small carve-out, the rest shared with the CPU
                gpus.append(_integrated(name, "amd", ram_total_bytes, host_bandwidth_gbps))
        elif vendor == "0x8086" and ram_total_bytes:
            gpus.append(_integrated(f"Intel integrated GPU {device_id}", "intel",
                                    ram_total_bytes, host_bandwidth_gbps))
    return gpus, notes


def _integrated(name: str, vendor: str, ram_total_bytes: int, bandwidth: float) -> GPUInfo:
    # Drivers let an iGPU map about half of system RAM (the Vulkan heap they report).
    share = round(ram_total_bytes / 2 / GIB, 2)
    return GPUInfo(name=name, vendor=vendor, kind="integrated", vram_total_gib=share,
                   vram_free_gib=share, bandwidth_gbps=round(bandwidth or 50.0, 1),
                   unified_memory=True)


def _amd_bus_bits(vram_bytes: int) -> int:
    gib = vram_bytes / GIB
    for limit, bits in ((4.5, 128), (8.5, 128), (12.5, 192), (16.5, 256), (20.5, 320)):
        if gib <= limit:
            return bits
    return 384


def _max_mhz(text: str) -> float:
    values = [float(m) for m in re.findall(r"(\d+)\s*Mhz", text, re.I)]
    return max(values) if values else 0.0


def probe_apple(ram_total_bytes: int) -> tuple[list[GPUInfo], list[str]]:
    """Apple Silicon: the GPU shares unified memory; bandwidth from the chip table."""
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return [], []
    brand = _sysctl("machdep.cpu.brand_string") or ""
    chip = apple_chip(brand)
    if chip is None:
        return [GPUInfo(name=brand or "Apple GPU", vendor="apple", kind="integrated",
                        vram_total_gib=round(ram_total_bytes * 0.67 / GIB, 2),
                        vram_free_gib=round(ram_total_bytes * 0.67 / GIB, 2),
                        bandwidth_gbps=100.0, unified_memory=True)], [
            f"{brand!r} is not in the Apple chip table: bandwidth assumed 100 GB/s."]
    return [apple_gpu(chip, ram_total_bytes / GIB)], []


def apple_chip(brand: str) -> str | None:
    m = re.search(r"\bM(\d)\s*(Pro|Max|Ultra)?\b", brand)
    if not m:
        return None
    chip = f"M{m.group(1)}" + (f" {m.group(2)}" if m.group(2) else "")
    return chip if chip in APPLE_CHIPS else None


def apple_gpu(chip: str, ram_gib: float) -> GPUInfo:
    """The GPU of an Apple chip with ``ram_gib`` of unified memory. macOS lets the GPU wire
    about 2/3 of RAM on small machines and 3/4 from 36 GB up (recommendedMaxWorkingSetSize).
    Apple GPUs run FP16 at the FP32 rate (philipturner/metal-benchmarks), so the FP32 TFLOPS of
    APPLE_CHIPS is the matrix rate."""
    bandwidth, tflops = APPLE_CHIPS[chip]
    share = round(ram_gib * (0.75 if ram_gib >= 36 else 0.67), 2)
    return GPUInfo(name=f"Apple {chip}", vendor="apple", kind="integrated",
                   vram_total_gib=share, vram_free_gib=share, bandwidth_gbps=bandwidth,
                   unified_memory=True, fp16_tflops=tflops, backends=("Metal",))


# --- the llama.cpp build -----------------------------------------------------------------------
@dataclass(frozen=True)
class BuildInfo:
    backends: tuple[str, ...]
    """"CPU" and each GPU backend with a device llama.cpp can offload to."""
    gpu_devices: tuple[tuple[str, str, int, int, str], ...]
    """(name, backend, free bytes, total bytes, "gpu" or "igpu") of each GPU device."""
    import_ms: float
    notes: tuple[str, ...] = ()
    compiled: tuple[str, ...] = ()
    """The ggml backends compiled in ("CPU", "RPC", "Vulkan"...), with a device or not."""


def probe_build() -> BuildInfo:
    """Which backends this llama-cpp-python build has (loads llama.cpp: ~0.1-0.5 s), asked
    through runtime/llama/ggml_devices.py alone (not the engine's adapter)."""
    t0 = time.perf_counter()
    try:
        from ..runtime.llama import ggml_devices as llama
    except Exception as exc:  # ImportError, or OSError from a broken shared library
        return BuildInfo(("CPU",), (), 0.0, (f"llama-cpp-python cannot be loaded ({exc}):"
                                             " assuming a CPU-only build.",))
    try:
        devices = llama.devices()
        offload = llama.supports_gpu_offload()
        compiled = tuple(_normalise_backend(r) for r in llama.registries())
    except Exception as exc:
        return BuildInfo(("CPU",), (), 0.0, (f"llama.cpp did not list its devices ({exc}).",))
    import_ms = (time.perf_counter() - t0) * 1000
    backends = ["CPU"]
    gpus = []
    for d in devices:
        if d.kind in ("gpu", "igpu"):
            backend = _normalise_backend(d.backend)
            if offload and backend not in backends:
                backends.append(backend)
            gpus.append((d.description or d.name, backend, d.memory_free, d.memory_total,
                         d.kind))
    notes = []
    for backend in compiled:
        if backend not in ("CPU", "RPC", "BLAS") and backend not in backends:
            hidden = (" (it hides CPU-type devices such as Mesa's llvmpipe unless"
                      " GGML_VK_VISIBLE_DEVICES names them, e.g. GGML_VK_VISIBLE_DEVICES=0)"
                      if backend == "Vulkan" else "")
            notes.append(f"this llama.cpp build has the {backend} backend, but {backend} lists"
                         f" no device here{hidden}.")
    return BuildInfo(tuple(backends), tuple(gpus), import_ms, tuple(notes), compiled)


# Each GPU backend: install.sh's --gpu name and its CMake switch.
_BUILD_SWITCHES = {"CUDA": ("cuda", "-DGGML_CUDA=on"), "ROCm": ("rocm", "-DGGML_HIP=on"),
                   "Vulkan": ("vulkan", "-DGGML_VULKAN=on"), "Metal": ("metal", "-DGGML_METAL=on"),
                   "SYCL": ("sycl", "-DGGML_SYCL=on")}
# The backend to build for each vendor's GPU (Intel: Vulkan, which needs no oneAPI).
_VENDOR_BUILD = {"nvidia": "CUDA", "amd": "ROCm", "intel": "Vulkan", "apple": "Metal",
                 "other": "Vulkan"}


def rebuild_command(gpu: GPUInfo, python: str | None = None) -> str:
    """The command that rebuilds this environment's llama-cpp-python for ``gpu`` (with RPC),
    and install.sh's, which checks the toolkit first."""
    backend = _VENDOR_BUILD.get(gpu.vendor, "Vulkan")
    flag, switch = _BUILD_SWITCHES[backend]
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        version = "0.3.36"
    venv = Path(python or sys.executable).parent.parent
    return (f"CMAKE_ARGS=\"-DGGML_RPC=on {switch}\" {python or sys.executable} -m pip install"
            f" --force-reinstall --no-cache-dir --no-deps --no-binary llama-cpp-python"
            f" llama-cpp-python=={version} (from a checkout: packaging/install.sh {venv}"
            f" --gpu {flag}, which checks the {backend} toolkit first)")


def _normalise_backend(name: str) -> str:
    upper = name.upper()
    for known in ("CUDA", "Metal", "Vulkan", "SYCL", "OpenCL", "CANN", "MUSA"):
        if upper.startswith(known.upper()):
            return known
    if upper.startswith(("ROCM", "HIP")):
        return "ROCm"
    return name


# --- all together -------------------------------------------------------------------------------
def probe(*, measure_bandwidth: bool = True, remeasure: bool = False,
          remeasure_under_load: bool = False, with_build: bool = True) -> HardwareProfile:
    """Probe this machine. ``measure_bandwidth``: measure host bandwidth when the cache has
    no figure for this machine, or one marked suspect (else leave it as it is);
    ``remeasure``: measure again anyway; ``remeasure_under_load``: measure again when the
    figure was not taken on a quiet machine (``localinfer hw``)."""
    paths = get_paths()
    mem = probe_memory()
    cpu = probe_cpu()
    notes: list[str] = []
    key = bw.machine_key(cpu.model, mem.total_bytes, cpu.logical_cores)
    entry = bw.cached(paths.cache_dir / "hardware", key) or bw.CachedBandwidth()
    measurement = entry.current
    if remeasure or (measure_bandwidth and (measurement is None or entry.suspect)) or (
            remeasure_under_load and measurement is not None and measurement.under_load):
        size = bw.buffer_size(last_level_cache_bytes(), mem.available_bytes)
        result = bw.measure_and_store(paths.cache_dir / "hardware", key,
                                      threads=cpu.logical_cores, size_bytes=size)
        measurement = result.kept
        if result.suspect:
            notes.append(f"host bandwidth measured again ({result.suspect}): "
                         + result.summary() + ".")
        elif result.previous is not None:
            notes.append("host bandwidth measured again: " + result.summary() + ".")
    host_bw = measurement.bandwidth_gbps if measurement else 0.0
    host_bw1 = measurement.bandwidth_1core_gbps if measurement else 0.0
    if measurement is None:
        notes.append("host bandwidth not measured yet (`localinfer hw` measures it).")
    elif measurement.under_load:
        notes.append("the host bandwidth in use was not measured on a quiet machine, so"
                     " predictions may be low: `localinfer hw` on a quiet machine replaces it.")

    gpus: list[GPUInfo] = []
    for found, more in (probe_nvidia(), probe_drm(ram_total_bytes=mem.total_bytes,
                                                  host_bandwidth_gbps=host_bw),
                        probe_apple(mem.total_bytes)):
        gpus.extend(found)
        notes.extend(more)

    backends: tuple[str, ...] = ("CPU",)
    compiled: tuple[str, ...] = ()
    if with_build:
        build = probe_build()
        backends, compiled = build.backends, build.compiled
        notes.extend(build.notes)
        gpus = _merge_build_devices(gpus, build, host_bw)
        if gpus and not any(b != "CPU" for b in backends):
            names = ", ".join(g.name for g in gpus)
            notes.append(f"this llama.cpp build is CPU-only: it cannot offload to {names};"
                         f" to use it, rebuild: {rebuild_command(gpus[0])}.")
    return HardwareProfile(
        name="this machine",
        os=platform.system().lower(),
        arch=platform.machine(),
        ram_total_gib=round(mem.total_bytes / GIB, 2),
        ram_available_gib=round(mem.available_bytes / GIB, 2),
        swap_total_gib=round(mem.swap_bytes / GIB, 2),
        memory_limit_gib=round(mem.limit_bytes / GIB, 2) if mem.limit_bytes else None,
        cpu=cpu,
        gpus=tuple(gpus),
        backends=backends,
        build_backends=compiled,
        host_bandwidth_gbps=host_bw,
        host_bandwidth_1core_gbps=host_bw1,
        bandwidth_source="measured" if measurement else "estimated",
        notes=tuple(notes),
    )


def _merge_build_devices(gpus: list[GPUInfo], build: BuildInfo, host_bandwidth_gbps: float
                         ) -> list[GPUInfo]:
    """Add GPUs that llama.cpp sees but no probe found (e.g. NVML missing), with llama.cpp's
    memory figures; bandwidth is then unknown and estimated conservatively. A device llama.cpp
    calls integrated, and Mesa's llvmpipe (a Vulkan driver on the CPU, which llama.cpp lists
    as a GPU), share the host's memory and its bandwidth."""
    out = list(gpus)
    for name, backend, free, total, kind in build.gpu_devices:
        if total and not any(_same_gpu(g.name, name) for g in out):
            shared = kind == "igpu" or "llvmpipe" in name.lower()
            out.append(GPUInfo(name=name, vendor=_vendor_of(name),
                               kind="integrated" if shared else "discrete",
                               vram_total_gib=round(total / GIB, 2),
                               vram_free_gib=round(free / GIB, 2),
                               bandwidth_gbps=round(host_bandwidth_gbps or 50.0, 1) if shared
                               else 256.0, unified_memory=shared, backends=(backend,)))
    return out


def _same_gpu(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a in b or b in a


def _vendor_of(name: str) -> str:
    lower = name.lower()
    for vendor, words in (("nvidia", ("nvidia", "geforce", "rtx", "quadro", "tesla")),
                          ("amd", ("amd", "radeon")), ("intel", ("intel", "arc")),
                          ("apple", ("apple",))):
        if any(w in lower for w in words):
            return vendor
    return "other"


# --- helpers -----------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text else None
    except ValueError:
        return None


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True,
                             timeout=2, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
