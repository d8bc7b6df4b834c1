"""How busy the machine was while something was measured: the CPU time other processes took
over the measurement's own window, and the load average, so that a figure taken on a busy
machine is known as such (a laptop is never idle; a figure measured under load is low)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

HEAVY_SHARE = 0.25
"""Other processes keeping this share of the cores busy make a measurement "under load": on a
2-core machine one busy process is 0.5, on a 16-core laptop a browser tab is ~0.06."""


@dataclass(frozen=True)
class MachineLoad:
    """The machine's load over a measurement."""

    other_busy_cores: float
    """Cores kept busy by other processes (system CPU time minus this process's, over the
    window's wall time)."""
    cores: int
    """Logical cores the system's CPU time is counted over."""
    load_avg_1m: float
    """The 1-minute load average at the end (runnable tasks, ours included)."""

    @property
    def busy_share(self) -> float:
        """The share of the cores other processes kept busy, 0 to 1."""
        return min(1.0, self.other_busy_cores / max(1, self.cores))

    @property
    def heavy(self) -> bool:
        return self.busy_share >= HEAVY_SHARE

    def describe(self) -> str:
        """"load 5.2, others kept 1.3 of 2 cores busy"."""
        return (f"load {self.load_avg_1m:.1f}, others kept {self.other_busy_cores:.1f} of"
                f" {self.cores} cores busy")


def _busy_seconds() -> tuple[float, int]:
    """CPU seconds the whole system has been busy, and how many CPUs that counts."""
    import psutil
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    total = sum(times)
    # guest time is also counted in user on Linux: do not count it twice
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    return total - idle, psutil.cpu_count() or os.cpu_count() or 1


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class LoadWindow:
    """Start it before a measurement and ``finish()`` it after: the machine's load in
    between, others' CPU time separated from this process's own."""

    def __init__(self) -> None:
        self.busy0, self.cores = _busy_seconds()
        self.own0 = _own_seconds()
        self.wall0 = time.monotonic()

    def finish(self) -> MachineLoad:
        import psutil

        busy1, _ = _busy_seconds()
        wall = max(time.monotonic() - self.wall0, 1e-3)
        others = (busy1 - self.busy0) - (_own_seconds() - self.own0)
        return MachineLoad(other_busy_cores=round(max(0.0, others / wall), 2), cores=self.cores,
                           load_avg_1m=round(psutil.getloadavg()[0], 2))
