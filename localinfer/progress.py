"""A one-line progress display for the terminal (model load, starter assembly, downloads).

On a terminal it redraws one line in place: label, bar, percent, bytes, rate and ETA. When
stderr is not a terminal (CI logs, pipes) it prints only the start and the end.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


class TerminalProgress:
    def __init__(self, label: str, *, total: float | None = None, unit: str = "bytes",
                 stream: TextIO | None = None, min_interval_s: float = 0.1,
                 initial: float = 0.0) -> None:
        self.label = label
        self.total = total
        self.initial = initial
        """Progress already made before this display started (a resumed download): the rate
        and ETA count only what comes after it."""
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval_s = min_interval_s
        self.start = time.monotonic()
        self._last_draw = 0.0
        self._done = initial
        self._finished = False
        self._started = False

    def _begin(self) -> None:
        # Nothing is printed until there is progress, so an early error stands alone.
        self._started = True
        if not self.tty:
            self.stream.write(f"{self.label}...\n")
            self.stream.flush()

    def update(self, done: float, total: float | None = None) -> None:
        if not self._started:
            self._begin()
        if total is not None:
            self.total = total
        self._done = done
        now = time.monotonic()
        if self.tty and now - self._last_draw >= self.min_interval_s:
            self._last_draw = now
            self._draw(now)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.start

    def fraction(self, value: float) -> None:
        """Progress as a fraction 0..1 (model loading)."""
        self.update(value, 1.0)

    def _draw(self, now: float) -> None:
        self.stream.write("\r" + self.line(now, shutil.get_terminal_size().columns - 1)
                          + "\x1b[K")
        self.stream.flush()

    def line(self, now: float, columns: int) -> str:
        """The progress line in at most ``columns`` characters: a line wider than the
        terminal wraps, and each redraw then leaves a line behind. A narrower bar, then the
        ETA, the rate and the bytes go first, then the label's end."""
        elapsed = max(now - self.start, 1e-6)
        frac = min(max(self._done / self.total, 0.0), 1.0) if self.total else None
        extra: list[str] = []  # what may be left out, last first
        if self.total and self.unit == "bytes" and frac is not None:
            rate = max(self._done - self.initial, 0.0) / elapsed
            extra = [f"{human_bytes(self._done)}/{human_bytes(self.total)}",
                     f"{human_bytes(rate)}/s"]
            if 0 < frac < 1 and rate > 0:
                extra.append(f"ETA {(self.total - self._done) / rate:.0f}s")
        for keep in range(len(extra), -1, -1):
            for width in (24, 16, 10):
                parts = [self.label]
                if frac is not None:
                    filled = int(frac * width)
                    parts.append("[" + "#" * filled + "-" * (width - filled)
                                 + f"] {frac * 100:5.1f}%")
                line = "  ".join(parts + extra[:keep])
                if len(line) <= columns:
                    return line
        return line if len(line) <= columns else line[:max(columns - 1, 0)] + "…"

    def finish(self, message: str | None = None) -> None:
        if self._finished:
            return
        self._finished = True
        if not self._started and message is None:
            return
        elapsed = time.monotonic() - self.start
        text = message or f"{self.label}: done in {elapsed:.1f}s"
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
