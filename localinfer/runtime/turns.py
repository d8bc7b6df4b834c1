"""Turns on the CPU cores for the engines of one process (a daemon's chat, code and embedding
models): one decode at a time, and generation before indexing.

Each engine's llama.cpp decode takes as many threads as the machine has cores. Two engines
decoding at once on the CPU run twice that many threads on the same cores, and llama.cpp's
threads, which wait for each other at every layer, then lose much more than half their speed:
an editor's 257-token autocomplete prompt took 0.6-1.5 s to read beside an indexing client's
embeddings on 2 cores, against ~0.2 s alone. So the engines of a process take turns: a decode
waits for the one running to end. Embeddings and reranking (indexing: ``background``) also
wait while another engine has requests to generate for, for at most ``BACKGROUND_WAIT_S``, and
then take one turn, so that an index still grows while an editor types; the engine cuts them
into decodes of at most ``BACKGROUND_TURN_TOKENS`` tokens while others generate, so that a
turn is short; a turn taken while no other engine generated is interrupted by one that comes
to generate, and taken again. A chat's new turn, whose first token is one short step away,
stops even a turn that waited, or one about to go (``yield_for``), and the indexing goes on
after two steps, without waiting again. An engine whose model is wholly on a GPU takes no turns
(loading.py gives it none). Measured in docs/benchmarks.md (the editor workload, with turns
and without)."""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from ..errors import StepInterrupted

T = TypeVar("T")

BACKGROUND_WAIT_S = 1.0
"""The longest a background decode waits for other engines' generation to pause."""
BACKGROUND_TURN_TOKENS = 128
"""While another engine generates (or did lately), embedding inputs are decoded in groups of
at most this many tokens (an input longer than that alone), each a turn of its own: one
12-line chunk of code, ~0.3 s on a 2-core CPU for a 270M model. Alone, all the inputs of a
request take one turn (decoded several to a decode, as many as fit): 8 inputs one by one
embedded ~25% slower here."""
RECENT_S = 2.0
"""Another engine that generated this recently still counts as busy for the size of a
background turn: a pause between an editor's requests must not let in a turn of seconds."""
YIELD_TURNS = 2
"""Turns to generate that indexing stopped or held back by ``yield_for`` lets go
before it goes on: the chat's first step (an engine admits a request once it holds the cores)
and one more, where another engine was already waiting for them."""
POLL_S = 0.02
"""How often a waiting background decode looks again at whether the others still generate
(an engine does not announce a new request to the others) or hold it back no more."""


class Turns:
    """The CPU's cores, taken in turns by the engines that joined (thread-safe)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._held = False
        self._due = 0
        """Background decodes that may go: they go before any other."""
        self._due_waited = 0
        """Those of them that waited BACKGROUND_WAIT_S (the others found no engine
        generating)."""
        self._generating: dict[object, Callable[[], bool]] = {}
        self._last_turn: dict[object, float] = {}
        """When each engine last took a turn to generate (``time.monotonic()``)."""
        self._interruptible: Callable[[], None] | None = None
        """How to stop the background decode holding the cores."""
        self._protected = False
        """The background decode holding the cores waited BACKGROUND_WAIT_S (or was owed its
        turn): only ``yield_for`` stops it."""
        self._turns_taken = 0
        """Turns taken to generate, all engines together."""
        self._yielded_at: float | None = None
        """When ``yield_for`` last stopped or held back indexing, until the turn it
        owes has run (RECENT_S at most): no other yield, and the next background decode goes
        once ``_turns_taken`` reaches ``_held_back_until``, without waiting."""
        self._held_back_until = 0
        self._queue: collections.deque[object] = collections.deque()
        """The turns to generate waiting, in the order they asked: an engine whose turn ends
        asks again at once, and would otherwise take the cores back before the waiting
        engine's thread wakes (another model's request then waited for the first model's
        whole reply)."""

    def join(self, engine: object, generating: Callable[[], bool]) -> None:
        """Take part; ``generating()`` says whether ``engine`` has requests to generate for
        (asked by other engines' background decodes, from their threads)."""
        with self._cv:
            self._generating[engine] = generating

    def leave(self, engine: object) -> None:
        with self._cv:
            self._generating.pop(engine, None)
            self._last_turn.pop(engine, None)
            self._cv.notify_all()

    @contextlib.contextmanager
    def turn(self, engine: object, *, background: bool = False,
             interrupt: Callable[[], None] | None = None,
             before_wait: Callable[[], None] | None = None) -> Iterator[None]:
        """Hold the cores for one decode of ``engine``'s (``background``: indexing). A
        background turn taken while no other engine generated is cut short by one that comes
        to generate: ``interrupt`` stops its decode (``Backend.interrupt``), which is then
        asked again (``in_turns``); one that waited ``BACKGROUND_WAIT_S`` only by
        ``yield_for``. ``before_wait`` runs (without the lock) once the turn is found
        taken, before waiting for it: the engine hands over the tokens its last step made,
        which would otherwise wait for another engine's decode too."""
        with self._cv:
            ticket = object()
            if not background:
                self._last_turn[engine] = time.monotonic()
                self._queue.append(ticket)
            try:
                self._wait_for_turn(engine, background, interrupt, before_wait, ticket)
            finally:
                if not background and self._queue and ticket in self._queue:
                    self._queue.remove(ticket)
                    self._cv.notify_all()
            owed = background and self._yielded()  # the turn a yield owed indexing
        try:
            yield
        finally:
            with self._cv:
                self._held = False
                self._interruptible = None
                self._protected = False
                if owed:
                    self._yielded_at = None
                self._cv.notify_all()

    def _wait_for_turn(self, engine: object, background: bool,
                       interrupt: Callable[[], None] | None,
                       before_wait: Callable[[], None] | None, ticket: object) -> None:
        """``turn``'s wait, holding the lock, until the cores are this decode's (then marked
        held); a turn to generate goes when it is the first of those waiting."""
        deadline = time.monotonic() + BACKGROUND_WAIT_S
        due = waited_out = False  # a background decode that may go next, and why
        while True:
            held_back = self._yielded() and self._turns_taken < self._held_back_until
            if background and not due:
                waited_out = self._yielded() and not held_back or \
                    time.monotonic() >= deadline
                if waited_out or not self._generating_now(engine):
                    due = True
                    self._due += 1
                    self._due_waited += waited_out
            if not self._held and (due and not held_back or not background and (
                    not self._due or held_back) and self._queue[0] is ticket):
                break
            if not background and self._interruptible is not None and \
                    not self._protected:
                self._interruptible()  # the indexing in flight stops for this one
                self._interruptible = None
            if before_wait is not None:
                run, before_wait = before_wait, None
                self._cv.release()
                try:
                    run()
                finally:
                    self._cv.acquire()
                continue
            self._cv.wait(POLL_S if background else None)
        if due:
            self._due -= 1
            self._due_waited -= waited_out
        self._turns_taken += not background
        self._held = True
        self._interruptible = interrupt if background else None
        self._protected = waited_out or due and self._yielded()

    def yield_for(self, quick: Callable[[], bool]) -> None:
        """A request to generate has come: where indexing that waited its BACKGROUND_WAIT_S
        holds the cores or goes next and ``quick()`` (a chat's new turn, its first token one
        short step away: 0.35 s of indexing would come first on a 2-core AVX2 CPU), stop it or
        hold it back for YIELD_TURNS turns to generate; then it goes without waiting and cannot
        be stopped so again until that turn has run. (Indexing that took idle cores stops for
        any turn to generate, and waits again.)"""
        if not (self._protected or self._due_waited) or not quick():
            return  # read without the lock first: most requests find no indexing
        with self._cv:
            if self._yielded():
                return
            if self._interruptible is not None and self._protected:
                self._interruptible()
                self._interruptible = None
            elif not self._due_waited or self._held and self._interruptible is not None:
                return  # indexing taken on idle cores: the turn to generate stops it
            self._yielded_at = time.monotonic()
            self._held_back_until = self._turns_taken + YIELD_TURNS
            self._cv.notify_all()

    def _yielded(self) -> bool:
        return self._yielded_at is not None and time.monotonic() - self._yielded_at < RECENT_S

    def others_active(self, engine: object) -> bool:
        """Whether an engine but ``engine`` has requests to generate for, or had within the
        last RECENT_S (an editor between two keystrokes' requests, a chat between turns)."""
        with self._cv:
            recent = time.monotonic() - RECENT_S
            return self._generating_now(engine) or any(
                at > recent for other, at in self._last_turn.items() if other is not engine)

    def _generating_now(self, engine: object) -> bool:
        return any(generating() for other, generating in self._generating.items()
                   if other is not engine)


def turn(turns: Turns | None, engine: object, *, background: bool = False,
         interrupt: Callable[[], None] | None = None,
         before_wait: Callable[[], None] | None = None
         ) -> contextlib.AbstractContextManager[None]:
    """``engine``'s turn on the cores where it shares them (``turns``), else nothing."""
    if turns is None:
        return contextlib.nullcontext()
    return turns.turn(engine, background=background, interrupt=interrupt,
                      before_wait=before_wait)


def in_turns(turns: Turns | None, engine: object, inputs: Sequence[Sequence[int]],
             fn: Callable[[Sequence[Sequence[int]]], list[T]],
             run: Callable[[Callable[[], tuple[int, list[T]]]], tuple[int, list[T]]]
             ) -> list[T]:
    """``fn`` (embeddings, scores) of ``inputs``, in order, as background turns that
    ``run`` (the engine's worker, between two steps) takes: all that remain in one turn
    where no other engine generates or did lately (``Turns.others_active``), else at most
    BACKGROUND_TURN_TOKENS tokens (an input longer than that alone), decided once the turn
    is held."""
    out: list[T] = []
    rest = list(inputs)

    def one_turn() -> tuple[int, list[T]]:
        n = len(rest)
        if turns is not None and turns.others_active(engine):
            n, total = 1, len(rest[0])
            while n < len(rest) and total + len(rest[n]) <= BACKGROUND_TURN_TOKENS:
                total += len(rest[n])
                n += 1
        return n, fn(rest[:n])

    while rest:
        try:
            n, part = run(one_turn)
        except StepInterrupted:  # a request to generate took the cores: these inputs again
            continue
        out += part
        del rest[:n]
    return out


TURNS = Turns()
"""The process's turns: the engines loading.py builds for models with layers on the CPU."""
