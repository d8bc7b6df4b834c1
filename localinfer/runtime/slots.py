"""The KV cache's slots: one sequence each, the request using it, the tokens its cache holds,
and the checkpoints of its sliding-window layers (see checkpoints.py); and the rules for which
prompts a step reads, how much of them, and when a step in flight stops for a new request."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .backend import Backend
from .generation import Request
from .prompt_cache import common_prefix
from .speculate import EXACT_ROWS, MAX_DRAFT, DraftPolicy
from .types import Priority


@dataclass(frozen=True)
class Checkpoint:
    """The state of a slot's sliding-window layers when it held exactly ``tokens``."""

    tokens: list[int]
    state: Any


RIDING = -1
"""The sequence id of a riding completion's place (``Slot.riding``), which is no sequence of
the KV cache: it holds no tokens, and no backend call takes it."""


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
        self.reply_start = 0
        """Where the last request's reply begins in this slot's cache (its prompt's length;
        0: none since the cache was emptied): a prompt that shares all before it is that
        conversation's next turn (``checkpoints.slot_score``)."""
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
    def riding(self) -> bool:
        """Another completion (``Request.follows``) whose tokens have all been its leader's so
        far: it reads no row of its own but samples from its leader's, and holds this place,
        not a slot, until it parts (``Engine._ride``): three completions of an editor's
        keystroke that write alike cost the steps and the slot of one."""
        return self.seq_id == RIDING

    @property
    def prefilling(self) -> bool:
        return self.req is not None and len(self.cached) < len(self.req.target)

    def chunk_limit(self, start: int, n: int) -> int:
        """How many of ``n`` prompt tokens from ``start`` one chunk reads: it ends at the next
        checkpoint or save to disk planned past ``start``."""
        stops = [at for at in (self.checkpoint_at, *self.save_at) if at is not None and at > start]
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


PREFILL_CHUNK_WHILE_DECODING = 64
"""While other sequences are decoding, a prompt is read in chunks this small so that their
streams keep flowing (a 512-token chunk takes about a second on a 2-core CPU), even beside
autocomplete replies alone, which editors show whole (whole batches measured no better)."""
YIELDING_PROMPT_ROWS = 64
"""A step reading this many prompt tokens or more, all of requests less urgent than one that
arrives, is interrupted (``step_yields``)."""


def finishes_in(request: Request, left: int, chunk: int) -> bool:
    """Whether a prompt with ``left`` tokens to read counts as one ``chunk`` finishes (a
    chat's new turn, its history cached): it does, unless it is background work."""
    return left <= chunk and request.priority < Priority.BACKGROUND


def reading_order(prefilling: list[Slot], chunk: int, decoding: Sequence[Slot] = ()
                  ) -> list[Slot]:
    """The slots whose prompts a step reads, in order: the most urgent alone, and among them
    autocomplete prompts shortest first (a keystroke's ~250 tokens past its checkpoint before
    another editor's cold file: the least time waited in all), others in order of arrival. A
    prompt that ``chunk`` tokens finish (a chat's new turn, its history cached) counts as
    interactive, unless it is background work, and as short as it is: its first token costs
    the others at most one chunk, where it would wait for every editor's cold file (8 s for a
    29-token chat prompt in the editor workload); such prompts go first, shortest first.
    While an autocomplete reply is ``decoding``, a prompt with more than LONG_PROMPT tokens
    left waits (``long_prompts_wait``)."""
    if long_prompts_wait(decoding):
        prefilling = [s for s in prefilling
                      if len(s.running.target) - len(s.cached) <= LONG_PROMPT]

    def key(slot: Slot) -> tuple[int, int, int, Request]:
        request = slot.running
        left = len(request.target) - len(slot.cached)
        if finishes_in(request, left, chunk):
            return int(Priority.INTERACTIVE), 0, left, request
        if request.params.supersede:
            return int(request.priority), 2, left, request
        return int(request.priority), 1, 0, request

    ranked = sorted(((key(s), s) for s in prefilling), key=lambda pair: pair[0])
    return [s for k, s in ranked if k[0] == ranked[0][0][0]]


LONG_PROMPT = 512
"""Prompt tokens left past which a prompt waits while an autocomplete reply decodes: an editor's
file read cold (~1,400 tokens; a keystroke's own prompt reads ~260)."""


def long_prompts_wait(decoding: Sequence[Slot]) -> bool:
    """Whether long prompts wait for the ``decoding`` slots: one of them decodes an autocomplete
    reply, which its editor shows whole, so every step adds its length to the user's wait. A
    chunk of a cold file beside it makes each of its steps 3-5 times longer (2-core x86: 150-290
    ms against ~50 ms), where the reply needs a few more steps; the cold file, seconds of
    reading, waits those steps (shortest remaining work first) and reads on in whole batches
    once the reply is done."""
    return any(s.running.params.supersede is not None for s in decoding)


AUTOCOMPLETE_STEP_ROWS = 256
"""On the CPU, the most prompt tokens a step reads while an editor's autocomplete prompt waits
to be read: another editor's keystroke, as urgent, does not stop the step (``step_yields``) and
waits for it, up to a whole 512-row batch of a cold file (0.8-0.9 s on a 2-core CPU; traced
keystrokes waited 0.4 and 0.7 s). Steps of 256 rows read a cold file at the rate of 512-row
ones there (1.49 against 1.53 ms a row, AVX-512; 2.31 against 2.28, AVX2 only)."""


def prompt_rows(prefilling: list[Slot], decoding: bool, budget: int, on_cpu: bool) -> int:
    """How many prompt tokens a step reads: PREFILL_CHUNK_WHILE_DECODING beside decoding
    sequences, and beside a prompt that such a chunk finishes (a chat's new turn, its history
    cached; not background work), whose first token then comes from a step as short as a
    decoding one, not from a whole batch of other prompts (a 29-token chat turn waited 1.0 s
    for a batch of editors' cold files on a 2-core AVX2 CPU); else the whole ``budget``, at
    most AUTOCOMPLETE_STEP_ROWS on the CPU while an autocomplete prompt waits."""
    chunk = PREFILL_CHUNK_WHILE_DECODING
    if decoding or any(finishes_in(s.running, len(s.running.target) - len(s.cached), chunk)
                       for s in prefilling):
        return chunk
    if on_cpu and any(s.running.params.supersede is not None for s in prefilling):
        return min(budget, AUTOCOMPLETE_STEP_ROWS)
    return budget


def joins_step(finishes: bool, first_tokens: bool, on_cpu: bool) -> bool:
    """Whether a prompt's chunk joins a step in which another prompt's reading ends
    (``first_tokens``: a request not in the background gets its first token from the step).
    On the CPU, where a step takes time in proportion to its rows, only a chunk that
    ``finishes`` its own prompt does: part of another prompt would hold that first token back
    by its own reading (an editor's keystroke, 194 tokens left, read beside 318 tokens of
    another editor's cold file: a 1.0 s step instead of ~0.4 s), and the prompt it belongs to
    reads on in the next step. On a GPU a step's rows cost far less than in proportion, and
    it fills."""
    return finishes or not first_tokens or not on_cpu


def prompt_chunks(prefilling: list[Slot], budget: int, decoding: Sequence[Slot], *,
                  on_cpu: bool) -> list[tuple[Slot, int]]:
    """The prompt tokens a step reads beside ``decoding`` within ``budget`` rows: (slot,
    tokens from its cache's end) in ``reading_order``, at most ``prompt_rows`` in all, each
    chunk ending at a checkpoint or save planned in it, and only those ``joins_step`` lets
    in."""
    cap = prompt_rows(prefilling, bool(decoding), budget, on_cpu)
    chunks: list[tuple[Slot, int]] = []
    first_tokens = False  # a prompt read to its end in this step, not in the background
    for slot in reading_order(prefilling, cap, decoding):
        start = len(slot.cached)
        left = len(slot.running.target) - start
        n = min(left, budget, cap)
        if n <= 0:
            break
        n = slot.chunk_limit(start, n)
        if not joins_step(n == left, first_tokens, on_cpu):
            continue
        first_tokens |= n == left and slot.running.priority < Priority.BACKGROUND
        chunks.append((slot, n))
        budget -= n
        cap -= n
    return chunks


def read_for_next(request: Request, start: int) -> bool:
    """Whether ``request``'s prompt chunk from ``start`` is worth reading on once its client
    has left: an autocomplete prompt's text before where the text typed at the cursor begins,
    which the next keystroke's prompt shares (an editor's file read cold); not what follows
    it, the typed text and the suffix, which the next keystroke changes (its read of ~258
    tokens, read on, held the next keystroke's request back ~0.3 s on a 2-core CPU)."""
    return request.params.supersede is not None and not request.generated and (
        request.cursor is None or start < request.cursor)


def step_yields(in_step: list[Request], prompt_rows: int, request: Request,
                quick: Callable[[], bool]) -> bool:
    """Whether the step in flight, which reads ``prompt_rows`` prompt tokens for the requests
    ``in_step``, stops (``Backend.interrupt``) for ``request``, which has just come, so that
    it starts now, not after a chunk of a second or more (the cache keeps the micro-batches
    the step finished): when the step reads YIELDING_PROMPT_ROWS or more for requests all less
    urgent, or a whole batch (more than a decoding step's chunk) while the request reads
    ``quick``-ly (``reads_quickly``)."""
    if prompt_rows >= YIELDING_PROMPT_ROWS and all(r.priority > request.priority
                                                   for r in in_step):
        return True
    return prompt_rows > PREFILL_CHUNK_WHILE_DECODING and quick()


def reads_quickly(request: Request, slots: list[Slot]) -> bool:
    """Whether ``request``, not background work, finds all but PREFILL_CHUNK_WHILE_DECODING
    tokens of its prompt in a free slot's cache (a chat's new turn): its first token is then
    one short step away."""
    if request.priority >= Priority.BACKGROUND:
        return False  # before the prefix walk, which background work need not pay
    cached = max((common_prefix(s.cached, request.prompt) for s in slots if s.req is None),
                 default=0)
    return finishes_in(request, len(request.prompt) - cached, PREFILL_CHUNK_WHILE_DECODING)


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


def choose_drafts(policy: DraftPolicy, decoding: list[Slot], reading: bool, n_batch: int,
                  n_ctx: int) -> None:
    """Set each decoding slot's draft for this step: what its prompt lookup proposes, where
    the step's expected tokens per second gain by it (see speculate.DraftPolicy); a draft
    not verified is checked as a shadow draft. Drafts only while the batch stays small
    enough for the single-row kernels (see speculate.py): not while a prompt is being read
    (``reading``)."""
    for slot in decoding:
        slot.draft = []
    if reading:
        return
    budget = min(EXACT_ROWS, n_batch) - len(decoding)
    if budget <= 0:
        return
    rooms = [min(budget, MAX_DRAFT, n_ctx - 1 - len(s.cached)) for s in decoding]
    drafts = policy.drafts([s.seq_id for s in decoding], [s.running.lookup for s in decoding],
                           rooms, [s.running.params.speculative is True for s in decoding],
                           budget)
    for slot, draft in zip(decoding, drafts, strict=True):
        slot.draft = draft
