"""The KV cache's slots: one sequence each, the request using it, the tokens its cache holds,
and the checkpoints of its sliding-window layers (see checkpoints.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .backend import Backend
from .generation import Request
from .types import Priority


@dataclass(frozen=True)
class Checkpoint:
    """The state of a slot's sliding-window layers when it held exactly ``tokens``."""

    tokens: list[int]
    state: Any


class Slot:
    """One sequence of the KV cache: the request using it, and the tokens it holds."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        self.cached: list[int] = []  # tokens whose KV is in the cache, position = index
        self.last_used = 0.0
        self.req: Request | None = None  # None while the slot is free
        self.next_token: int | None = None  # sampled, not yet decoded
        self.draft: list[int] = []  # drafted tokens in the current batch, after next_token
        self.batch_index = -1
        self.stepped_at = 0
        """The engine's step count when this slot's request was last in a step."""
        self.checkpoints: list[Checkpoint] = []  # the newest last
        self.spare: Any = None
        """The state of a checkpoint dropped since the last one was taken: the next one
        is saved into its memory (``Backend.seq_checkpoint``)."""
        self.checkpoint_at: int | None = None
        """Where to take the next checkpoint, once the cache holds this many tokens."""
        self.save_at: list[int] = []
        """Where to save the cache to the prefix cache on disk, ascending, once it holds
        that many tokens of the running request (see disk_cache.py)."""
        self.save_prompt = 0
        """Save the running request's prompt's first this many tokens to disk after its first
        token (0: none; they were here already: saving them first would delay that token by
        the copy, ~140 ms for a 20k-token prefix here)."""
        self.turn_start = 0
        """Where the last request in this slot began reading (its cached tokens)."""
        self.supersede: str | None = None
        """The supersede key of the last request in this slot: the next keystroke's request
        from the same editor comes back to this slot's cache."""
        self.ahead: list[int] = []
        """Tokens to read into this free slot's cache when the engine is idle: the opening
        of the next turn after a chat reply (see checkpoints.READ_AHEAD_IDLE_S)."""

    @property
    def running(self) -> Request:
        """The request in this slot, which must be active (one of ``Engine._active()``):
        asking a free slot is a bug in the engine."""
        assert self.req is not None, f"slot {self.seq_id} is free"
        return self.req

    @property
    def prefilling(self) -> bool:
        return self.req is not None and len(self.cached) < len(self.req.target)

    def chunk_limit(self, start: int, n: int) -> int:
        """How many of ``n`` prompt tokens from ``start`` one chunk reads: it ends at the next
        checkpoint, save to disk or copy (``Request.copy_at``) planned past ``start``."""
        copy_at = self.req.copy_at if self.req is not None else None
        stops = [at for at in (self.checkpoint_at, *self.save_at, copy_at)
                 if at is not None and at > start]
        return min(n, min(stops) - start) if stops else n

    def exchange(self, other: Slot) -> None:
        """Trade everything but the sequence id with ``other``, whose cache has traded places
        with this one's (``Backend.seq_swap``)."""
        mine, theirs = vars(self), vars(other)
        for name in mine:
            if name != "seq_id":
                mine[name], theirs[name] = theirs[name], mine[name]


def preemption_victim(active: list[Slot], waiting: Request) -> Slot | None:
    """The slot an interactive request that finds every slot busy takes: the lowest-priority
    request's, among equals the one that started last (it loses least); None when the waiting
    request is not interactive or every running one is as urgent."""
    if waiting.priority != Priority.INTERACTIVE:
        return None
    victims = [s for s in active if s.running.priority > waiting.priority]
    if not victims:
        return None
    return max(victims, key=lambda s: (int(s.running.priority), s.running.t_start))


def reading_order(prefilling: list[Slot], chunk: int) -> list[Slot]:
    """The slots whose prompts a step reads, in order: the most urgent alone, and among them
    autocomplete prompts shortest first (a keystroke's ~250 tokens past its checkpoint before
    another editor's cold file: the least time waited in all), others in order of arrival. A
    prompt that ``chunk`` tokens finish (a chat's new turn, its history cached) counts as
    interactive, unless it is background work, and as short as it is: its first token costs
    the others at most one chunk, where it would wait for every editor's cold file (8 s for a
    29-token chat prompt in the editor workload); such prompts go first, shortest first."""
    def key(slot: Slot) -> tuple[int, int, int, Request]:
        request = slot.running
        left = len(request.target) - len(slot.cached)
        if left <= chunk and request.priority < Priority.BACKGROUND:
            return int(Priority.INTERACTIVE), 0, left, request
        if request.params.supersede:
            return int(request.priority), 2, left, request
        return int(request.priority), 1, 0, request

    ranked = sorted(((key(s), s) for s in prefilling), key=lambda pair: pair[0])
    return [s for k, s in ranked if k[0] == ranked[0][0][0]]


def bare_decode_rate(backend: Backend, slot: Slot, n_steps: int) -> float:
    """``Engine.measure_decode_step``, on the worker: one token a step into ``slot`` (emptied
    before and after), the median step's rate."""
    backend.seq_trim(slot.seq_id, 0)
    slot.cached.clear()
    slot.ahead = []
    token = backend.tokenize("Hello", add_special=True)[-1]
    times = []
    try:
        for pos in range(n_steps + 1):
            started = time.perf_counter()
            backend.decode([token], [pos], [slot.seq_id], [True])
            times.append(time.perf_counter() - started)
    finally:
        backend.seq_trim(slot.seq_id, 0)
    times = sorted(times[1:])
    return 1.0 / times[len(times) // 2]
