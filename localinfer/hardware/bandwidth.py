"""Host memory read bandwidth, measured: numpy sums of a buffer larger than the caches.

numpy releases the GIL inside a reduction, so one thread per core summing its own slice reads
memory with every core at once, the way llama.cpp's decode threads stream weights. A 64-bit
integer sum does almost no arithmetic per byte (~16 GB/s per core on a current x86 core, which
is that core's load bandwidth), so the figure is the memory system's, not numpy's. The buffer
is at least 256 MiB and twice the last-level cache; the best of a few passes counts. The whole
measurement takes a fraction of a second and is cached per machine (CPU model and RAM size).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from ..paths import atomic_write_text, read_json_object

log = logging.getLogger(__name__)

MIN_BUFFER = 256 << 20
MAX_BUFFER = 512 << 20
PASSES = 3
CACHE_FILE = "bandwidth.json"
METHOD = "numpy int64 sum, one slice per thread, best of 3 passes"


@dataclass(frozen=True)
class BandwidthMeasurement:
    bandwidth_gbps: float
    """Read bandwidth with one thread per logical core, GB/s."""
    bandwidth_1core_gbps: float
    """Read bandwidth of a single thread, GB/s."""
    buffer_bytes: int
    threads: int
    seconds: float
    """How long the measurement took."""
    measured_at: float
    method: str = METHOD


def buffer_size(llc_bytes: int, available_bytes: int) -> int:
    """Big enough that the caches do not answer, small enough to stay well under a second."""
    size = min(max(MIN_BUFFER, 2 * llc_bytes), MAX_BUFFER)
    # Never take more than an eighth of what is free (a Raspberry Pi with 1 GB free).
    return max(32 << 20, min(size, available_bytes // 8))


def measure(threads: int, size_bytes: int) -> BandwidthMeasurement:
    """Measure read bandwidth with ``threads`` threads over a ``size_bytes`` buffer."""
    import numpy as np

    t_start = time.perf_counter()
    threads = max(1, threads)
    buf = np.empty(size_bytes // 8, dtype=np.int64)
    slices = np.array_split(buf, threads)
    with ThreadPoolExecutor(threads) as pool:
        # Touch every page first (in parallel): first-touch page faults are not bandwidth.
        list(pool.map(lambda s: s.fill(1), slices))
        best_all = 0.0
        for _ in range(PASSES):
            t0 = time.perf_counter()
            totals = list(pool.map(np.sum, slices))
            dt = time.perf_counter() - t0
            best_all = max(best_all, buf.nbytes / dt / 1e9)
        if sum(int(t) for t in totals) != buf.size:  # the sums really read the buffer
            raise RuntimeError("bandwidth measurement read wrong data")
    best_one = 0.0
    for _ in range(2):
        t0 = time.perf_counter()
        np.sum(buf)
        best_one = max(best_one, buf.nbytes / (time.perf_counter() - t0) / 1e9)
    del buf, slices
    return BandwidthMeasurement(
        bandwidth_gbps=round(best_all, 2),
        bandwidth_1core_gbps=round(best_one, 2),
        buffer_bytes=size_bytes,
        threads=threads,
        seconds=round(time.perf_counter() - t_start, 3),
        measured_at=time.time(),
    )


def machine_key(cpu_model: str, ram_total_bytes: int, logical_cores: int) -> str:
    """Cache key: the same CPU with the same RAM size and core count is the same machine."""
    ram_gib = round(ram_total_bytes / 2**30)
    text = f"{cpu_model}|{ram_gib}GiB|{logical_cores}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_or_measured(cache_dir: Path, key: str, *, threads: int, size_bytes: int,
                       remeasure: bool = False) -> BandwidthMeasurement:
    """The cached measurement for ``key``, or a new one (stored in the cache)."""
    path = cache_dir / CACHE_FILE
    entries = read_json_object(path)
    if not remeasure and key in entries:
        try:
            return BandwidthMeasurement(**entries[key])
        except TypeError:
            log.warning("ignoring a malformed bandwidth cache entry in %s", path)
    result = measure(threads, size_bytes)
    entries[key] = asdict(result)
    try:
        atomic_write_text(path, json.dumps(entries, indent=2) + "\n")
    except OSError as exc:  # a read-only cache is not worth failing `hw` for
        log.warning("cannot write %s: %s", path, exc)
    return result


def cached(cache_dir: Path, key: str) -> BandwidthMeasurement | None:
    entry = read_json_object(cache_dir / CACHE_FILE).get(key)
    try:
        return BandwidthMeasurement(**entry) if entry else None
    except TypeError:
        return None
