"""Host memory read bandwidth, measured: numpy sums of a buffer larger than the caches.

numpy releases the GIL inside a reduction, so one thread per core summing its own slice reads
memory with every core at once, the way llama.cpp's decode threads stream weights. A 64-bit
integer sum does almost no arithmetic per byte (~16 GB/s per core on a current x86 core, which
is that core's load bandwidth), so the figure is the memory system's, not numpy's. The buffer
is at least 256 MiB and twice the last-level cache; the best of several short passes counts
(one pass a descheduled thread did not slow down is enough). The machine's load over the
measurement is recorded with it: a figure taken under heavy load is cached apart and never
replaces a quiet one. A figure a run showed to be too low is marked to be measured again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..paths import atomic_write_text, read_json_object
from .load import LoadWindow, MachineLoad
from .profile import HardwareProfile

log = logging.getLogger(__name__)

MIN_BUFFER = 256 << 20
MAX_BUFFER = 512 << 20
MIN_TRIALS = 3
MAX_TRIALS = 20
TRIALS_BUDGET_S = 0.25
"""Passes go on (up to MAX_TRIALS) while they have taken less than this: a quiet machine gets
many ~5 ms passes, a busy one at least MIN_TRIALS slow ones."""
CACHE_FILE = "bandwidth.json"
CACHE_VERSION = 2
METHOD = "numpy int64 sum, one slice per thread, best of 3-20 passes"


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
    trials: int = 0
    """Passes of the all-core sum the best was taken from (0: not recorded)."""
    load: MachineLoad | None = None
    """The machine's load over the measurement (None: measured by an older version)."""

    @property
    def under_load(self) -> bool:
        """Not known to be quiet: taken under heavy load, or with the load not recorded."""
        return self.load is None or self.load.heavy

    def describe(self) -> str:
        """"6.4 GB/s on 2026-11-30 14:02, under load (load 5.2, others kept 1.3 of 2 cores
        busy)"."""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.measured_at))
        if self.load is None:
            how = "load not recorded"
        else:
            how = f"{'under load' if self.load.heavy else 'quiet'} ({self.load.describe()})"
        return f"{self.bandwidth_gbps:.1f} GB/s on {when}, {how}"

    @classmethod
    def from_dict(cls, data: Any) -> BandwidthMeasurement:
        """From the cache; raises TypeError or ValueError on a malformed entry."""
        if not isinstance(data, dict):
            raise TypeError("not an object")
        if not all(isinstance(data.get(f), (int, float))
                   for f in ("bandwidth_gbps", "bandwidth_1core_gbps", "measured_at")):
            raise ValueError("a figure is not a number")
        load = data.get("load")
        return cls(**{**data, "load": MachineLoad(**load) if load is not None else None})


@dataclass(frozen=True)
class CachedBandwidth:
    """What the cache holds for one machine."""

    quiet: BandwidthMeasurement | None = None
    """The latest figure measured on a quiet machine: the one used when there is one."""
    under_load: BandwidthMeasurement | None = None
    """The best figure measured under load (or by a version that did not record the load):
    used only until a quiet one exists."""
    suspect: str | None = None
    """Why the figure in use looks wrong (a run decoded faster than it allows): the next
    probe that may measure measures again."""

    @property
    def current(self) -> BandwidthMeasurement | None:
        return self.quiet or self.under_load

    def with_measurement(self, m: BandwidthMeasurement) -> CachedBandwidth:
        """``m`` added: a quiet figure replaces the quiet one; one under load replaces only a
        lower one under load (it is low by how busy the machine was). A suspect quiet figure
        that ``m`` exceeds is dropped, even if ``m`` was taken under load: a run and a new
        measurement both said it was too low. The mark is cleared either way (measured once
        again; a run marks it again if it still looks wrong)."""
        quiet = self.quiet
        if self.suspect and quiet is not None and m.bandwidth_gbps > quiet.bandwidth_gbps:
            quiet = None
        if not m.under_load:
            return CachedBandwidth(quiet=m, under_load=self.under_load)
        if self.under_load is None or m.bandwidth_gbps >= self.under_load.bandwidth_gbps:
            return CachedBandwidth(quiet=quiet, under_load=m)
        return CachedBandwidth(quiet=quiet, under_load=self.under_load)


@dataclass(frozen=True)
class Remeasured:
    """A new measurement, and what it did to the cached figure."""

    new: BandwidthMeasurement
    previous: BandwidthMeasurement | None
    """The figure in use before."""
    kept: BandwidthMeasurement
    """The figure in use now."""
    suspect: str | None = None
    """Why the previous figure had been marked to be measured again."""

    def summary(self) -> str:
        """"14.5 GB/s quiet (load 0.4, ...), was 6.4 GB/s on 2026-11-30 14:02, under load
        (load 5.2, ...) (2.27x): kept the new one"."""
        new = self.new
        if new.load is None:
            text = f"{new.bandwidth_gbps:.1f} GB/s"
        else:
            how = "under load" if new.load.heavy else "quiet"
            text = f"{new.bandwidth_gbps:.1f} GB/s {how} ({new.load.describe()})"
        if self.previous is None:
            return text + ": cached"
        ratio = new.bandwidth_gbps / self.previous.bandwidth_gbps
        if self.kept is new:
            verdict = "kept the new one"
        elif self.kept.under_load:
            verdict = "kept the cached one (higher; both under load)"
        else:
            verdict = "kept the cached one (measured on a quiet machine)"
        return f"{text}, was {self.previous.describe()} ({ratio:.2f}x): {verdict}"


def buffer_size(llc_bytes: int, available_bytes: int) -> int:
    """Big enough that the caches do not answer, small enough to stay well under a second."""
    size = min(max(MIN_BUFFER, 2 * llc_bytes), MAX_BUFFER)
    # Never take more than an eighth of what is free (a Raspberry Pi with 1 GB free).
    return max(32 << 20, min(size, available_bytes // 8))


def best_of_trials(one_pass: Callable[[], float], *, min_trials: int = MIN_TRIALS,
                   max_trials: int = MAX_TRIALS,
                   budget_s: float = TRIALS_BUDGET_S) -> tuple[float, int]:
    """(the shortest pass in seconds, passes run): at least ``min_trials`` passes, more while
    they have taken less than ``budget_s`` in all. The shortest is the one that other processes
    disturbed least."""
    durations: list[float] = []
    while len(durations) < max_trials and (len(durations) < min_trials
                                           or sum(durations) < budget_s):
        durations.append(one_pass())
    return min(durations), len(durations)


def measure(threads: int, size_bytes: int) -> BandwidthMeasurement:
    """Measure read bandwidth with ``threads`` threads over a ``size_bytes`` buffer."""
    import numpy as np

    window = LoadWindow()
    t_start = time.perf_counter()
    threads = max(1, threads)
    buf = np.empty(size_bytes // 8, dtype=np.int64)
    slices = np.array_split(buf, threads)
    totals: Sequence[int] = ()

    with ThreadPoolExecutor(threads) as pool:
        # Touch every page first (in parallel): first-touch page faults are not bandwidth.
        list(pool.map(lambda s: s.fill(1), slices))

        def all_cores() -> float:
            nonlocal totals
            t0 = time.perf_counter()
            totals = list(pool.map(np.sum, slices))
            return time.perf_counter() - t0

        best_all_s, trials = best_of_trials(all_cores)
        if sum(int(t) for t in totals) != buf.size:  # the sums really read the buffer
            raise RuntimeError("bandwidth measurement read wrong data")

    def one_core() -> float:
        t0 = time.perf_counter()
        np.sum(buf)
        return time.perf_counter() - t0

    best_one_s, _ = best_of_trials(one_core, min_trials=2, max_trials=5, budget_s=0.1)
    nbytes = buf.nbytes
    return BandwidthMeasurement(
        bandwidth_gbps=round(nbytes / best_all_s / 1e9, 2),
        bandwidth_1core_gbps=round(nbytes / best_one_s / 1e9, 2),
        buffer_bytes=size_bytes,
        threads=threads,
        seconds=round(time.perf_counter() - t_start, 3),
        measured_at=time.time(),
        trials=trials,
        load=window.finish(),
    )


def machine_key(cpu_model: str, ram_total_bytes: int, logical_cores: int) -> str:
    """Cache key: the same CPU with the same RAM size and core count is the same machine."""
    ram_gib = round(ram_total_bytes / 2**30)
    text = f"{cpu_model}|{ram_gib}GiB|{logical_cores}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- the cache ---------------------------------------------------------------------------------
def read_cache(path: Path) -> dict[str, CachedBandwidth]:
    """{machine key: figures} from ``path``. A file written before the load was recorded
    (one measurement per key) is read too: its figures count as taken under load, so the
    first quiet measurement replaces them. Malformed entries are dropped."""
    data = read_json_object(path)
    if data.get("version") == CACHE_VERSION:
        machines = data.get("machines")
        entries: dict[str, CachedBandwidth] = {}
        for key, value in (machines.items() if isinstance(machines, dict) else ()):
            try:
                entries[key] = CachedBandwidth(
                    quiet=_optional(value.get("quiet")),
                    under_load=_optional(value.get("under_load")),
                    suspect=value.get("suspect") if isinstance(value.get("suspect"), str)
                    else None)
            except (AttributeError, TypeError, ValueError):
                log.warning("ignoring a malformed bandwidth cache entry in %s", path)
        return entries
    old: dict[str, CachedBandwidth] = {}
    for key, value in data.items():  # the first format: {key: measurement}
        try:
            old[key] = CachedBandwidth(under_load=replace(BandwidthMeasurement.from_dict(value),
                                                          load=None))
        except (TypeError, ValueError):
            log.warning("ignoring a malformed bandwidth cache entry in %s", path)
    return old


def _optional(data: Any) -> BandwidthMeasurement | None:
    return None if data is None else BandwidthMeasurement.from_dict(data)


def write_cache(path: Path, entries: dict[str, CachedBandwidth]) -> None:
    """Replace ``path`` atomically (readers see the old or the new file, never a mix)."""
    machines = {key: asdict(entry) for key, entry in entries.items()}
    atomic_write_text(path, json.dumps({"version": CACHE_VERSION, "machines": machines},
                                       indent=2) + "\n")


def cached(cache_dir: Path, key: str) -> CachedBandwidth | None:
    return read_cache(cache_dir / CACHE_FILE).get(key)


def measure_and_store(cache_dir: Path, key: str, *, threads: int,
                      size_bytes: int) -> Remeasured:
    """Measure, and cache the figure."""
    return store(cache_dir, key, measure(threads, size_bytes))


def store(cache_dir: Path, key: str, new: BandwidthMeasurement) -> Remeasured:
    """Cache ``new`` by the rules of ``CachedBandwidth.with_measurement``."""
    path = cache_dir / CACHE_FILE
    entries = read_cache(path)
    before = entries.get(key, CachedBandwidth())
    after = before.with_measurement(new)
    entries[key] = after
    try:
        write_cache(path, entries)
    except OSError as exc:  # a read-only cache is not worth failing `hw` for
        log.warning("cannot write %s: %s", path, exc)
    assert after.current is not None  # it holds ``new`` at least
    return Remeasured(new=new, previous=before.current, kept=after.current,
                      suspect=before.suspect)


def mark_suspect(cache_dir: Path, key: str, reason: str) -> bool:
    """Mark the figure in use as wrong, so that the next probe measures again. False when
    there is no figure to mark (nothing to do)."""
    path = cache_dir / CACHE_FILE
    entries = read_cache(path)
    entry = entries.get(key)
    if entry is None or entry.current is None:
        return False
    entries[key] = replace(entry, suspect=reason)
    write_cache(path, entries)
    return True


def forget(cache_dir: Path, key: str) -> bool:
    """Drop this machine's figures (``hw --reset``). True when there were some."""
    path = cache_dir / CACHE_FILE
    entries = read_cache(path)
    if entries.pop(key, None) is None:
        return False
    write_cache(path, entries)
    return True


def profile_key(hw: HardwareProfile) -> str:
    """``machine_key`` of a probed profile (its RAM size is rounded to GiB either way)."""
    return machine_key(hw.cpu.model, round(hw.ram_total_gib * 2**30), hw.cpu.logical_cores)
