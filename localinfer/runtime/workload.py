"""What a model has been asked to do on this machine, counted by its engine and kept in a
small JSON file per model file across processes and restarts.

Three kinds of work, because the attention set-ups trade them against each other on a CPU
(planner/attention.py weighs its measurements by these counts):

- ``prompts``: prompt tokens read, by the length of the prompt they end (a power of two:
  ``"1024"`` holds prompts of 513-1,024 tokens);
- ``turns``: tokens read in reads of at most ``TURN_ROWS`` new tokens after at least
  ``TURN_HISTORY`` cached ones (a chat's next message, an agent's tool result, an editor's
  keystroke after its file): attention over the history weighs on them;
- ``decode``: tokens generated, by how many sequences decoded in the same step (``"1"``,
  ``"2"``, ... up to ``MAX_WIDTH``); a step that verifies a speculative draft counts one token
  a sequence, as its cost is near a plain step's. ``decode_short`` holds those of sequences
  under ``SHORT_POSITION`` tokens long: attention over a short cache costs another share of a
  step.

The engine counts in memory and adds its counts to the file every ``SAVE_EVERY`` requests
(after a step, outside its lock) and when it closes, under the file's lock (two daemons or
``localinfer run`` processes of one model add up), written atomically. Once the file holds
``DECAY_AT`` requests every count is halved, so the recent workload weighs most. A file that
cannot be read is started again, with a warning.
"""

from __future__ import annotations

import fcntl
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..paths import atomic_write_text, parse_json

log = logging.getLogger(__name__)

TURN_ROWS = 512
"""A read of at most this many new tokens (a physical batch) ..."""
TURN_HISTORY = 512
"""... after at least this many cached ones is a turn."""
SHORT_POSITION = 512
"""A sequence shorter than this generates at a short position."""
MAX_WIDTH = 8
"""Steps of more sequences count as this many."""
SAVE_EVERY = 32
"""Requests between two additions to the file."""
DECAY_AT = 20_000
"""Requests the file holds before its counts are halved."""


@dataclass
class Workload:
    """Counts of the three kinds of work (see the module's docstring)."""

    requests: int = 0
    prompts: dict[int, int] = field(default_factory=dict)
    """Prompt length (a power of two) -> tokens read."""
    turns: int = 0
    """Tokens read in next turns."""
    decode: dict[int, int] = field(default_factory=dict)
    """Sequences in the step -> tokens generated at ``SHORT_POSITION`` or more."""
    decode_short: dict[int, int] = field(default_factory=dict)
    """Sequences in the step -> tokens generated before ``SHORT_POSITION``."""

    def _tables(self) -> dict[str, dict[int, int]]:
        """The counts by size, by their field's name."""
        return {"prompts": self.prompts, "decode": self.decode,
                "decode_short": self.decode_short}

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "turns": self.turns,
                **{name: {str(k): v for k, v in sorted(table.items())}
                   for name, table in self._tables().items()}}

    @classmethod
    def from_json(cls, data: Any) -> Workload:
        """The counts in ``data``; ValueError where it is not what ``to_json`` writes (files
        of before positions were counted have no ``decode_short``)."""
        try:
            out = cls(int(data["requests"]), _counts(data["prompts"]), int(data["turns"]),
                      _counts(data["decode"]), _counts(data.get("decode_short", {})))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ValueError(f"not a workload ({exc!r})") from None
        if min([out.requests, out.turns,
                *(v for table in out._tables().values() for v in table.values())]) < 0:
            raise ValueError("a negative count")
        return out

    def add(self, other: Workload) -> None:
        self.requests += other.requests
        self.turns += other.turns
        theirs = other._tables()
        for name, mine in self._tables().items():
            for key, count in theirs[name].items():
                mine[key] = mine.get(key, 0) + count

    def halved(self) -> Workload:
        return Workload(self.requests // 2, turns=self.turns // 2, **{
            name: {k: v // 2 for k, v in table.items()}
            for name, table in self._tables().items()})


def _counts(data: Any) -> dict[int, int]:
    out = {int(k): int(v) for k, v in data.items()}
    if any(k < 1 for k in out):
        raise ValueError("a count of nothing")
    return out


def load(path: Path) -> Workload | None:
    """The counts kept in ``path``; None where there are none (or the file is unreadable)."""
    try:
        return Workload.from_json(parse_json(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring the workload counts in %s: %s", path, exc)
        return None


class WorkloadCounter:
    """The engine's counts since it last added them to its file (``path``; None: kept in
    memory only, as for a measurement's own engine)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.unsaved = Workload()

    def read(self, prompt: int, cached: int) -> None:
        """A request admitted with ``prompt`` tokens, ``cached`` of them in the cache."""
        new = prompt - cached
        self.unsaved.requests += 1
        if new <= TURN_ROWS and cached >= TURN_HISTORY:
            self.unsaved.turns += new
        elif new > 0:
            length = 1 << max(0, prompt - 1).bit_length()
            self.unsaved.prompts[length] = self.unsaved.prompts.get(length, 0) + new

    def stepped(self, positions: list[int]) -> None:
        """A step that generated a token for each sequence, at these ``positions`` (tokens
        in its cache). Called outside the engine's lock, it adds the counts to the file once
        ``SAVE_EVERY`` requests wait (without waiting for another process that is adding its
        own)."""
        if positions:
            width = min(len(positions), MAX_WIDTH)
            short = sum(1 for p in positions if p < SHORT_POSITION)
            for counts, n in ((self.unsaved.decode_short, short),
                              (self.unsaved.decode, len(positions) - short)):
                if n:
                    counts[width] = counts.get(width, 0) + n
        if self.unsaved.requests >= SAVE_EVERY:
            self.save(wait=False)

    def save(self, *, wait: bool = True) -> None:
        """Add the unsaved counts to the file, under its lock (``wait=False``: where another
        process holds it, keep them for the next time). Where the file cannot be written they
        are dropped with a warning, never raised into a request."""
        unsaved, self.unsaved = self.unsaved, Workload()
        if self.path is None or unsaved == Workload():
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_name(self.path.name + ".lock"), "a+b") as lock:
                try:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                except BlockingIOError:
                    unsaved.add(self.unsaved)
                    self.unsaved = unsaved
                    return
                total = load(self.path) or Workload()
                total.add(unsaved)
                if total.requests >= DECAY_AT:
                    total = total.halved()
                atomic_write_text(self.path, json.dumps(total.to_json(), indent=1) + "\n",
                                  sync=False)  # on the engine's thread: no fsync's wait
        except Exception as exc:  # counts are never worth a request
            log.warning("cannot keep the workload counts in %s: %s", self.path, exc)

