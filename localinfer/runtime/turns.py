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
into decodes of at most ``BACKGROUND_TURN_TOKENS`` tokens, so that a turn is short. An engine
whose model is wholly on a GPU takes no turns (loading.py gives it none).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

BACKGROUND_WAIT_S = 1.0
"""The longest a background decode waits for other engines' generation to pause."""
BACKGROUND_TURN_TOKENS = 512
"""Embedding inputs are decoded in groups of at most this many tokens (an input longer than
that alone), each a turn of its own: ~0.4 s on a 2-core CPU for a 270M model. Larger groups
read no faster on a CPU (the matrix kernels are already full at a few dozen rows)."""
POLL_S = 0.02
"""How often a waiting background decode looks again at whether the others still generate
(an engine does not announce a new request to the others)."""


class Turns:
    """The CPU's cores, taken in turns by the engines that joined (thread-safe)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._held = False
        self._due = 0
        """Background decodes that have waited long enough: they go before any other."""
        self._generating: dict[object, Callable[[], bool]] = {}

    def join(self, engine: object, generating: Callable[[], bool]) -> None:
        """Take part; ``generating()`` says whether ``engine`` has requests to generate for
        (asked by other engines' background decodes, from their threads)."""
        with self._cv:
            self._generating[engine] = generating

    def leave(self, engine: object) -> None:
        with self._cv:
            self._generating.pop(engine, None)
            self._cv.notify_all()

    @contextlib.contextmanager
    def turn(self, engine: object, *, background: bool = False) -> Iterator[None]:
        """Hold the cores for one decode of ``engine``'s (``background``: indexing)."""
        with self._cv:
            deadline = time.monotonic() + BACKGROUND_WAIT_S
            due = False  # a background decode that has waited long enough goes next
            while True:
                if background and not due and (time.monotonic() >= deadline
                                                or not self._others_generating(engine)):
                    due = True
                    self._due += 1
                if not self._held and (due or not background and not self._due):
                    break
                self._cv.wait(POLL_S if background and not due else None)
            if due:
                self._due -= 1
            self._held = True
        try:
            yield
        finally:
            with self._cv:
                self._held = False
                self._cv.notify_all()

    def _others_generating(self, engine: object) -> bool:
        return any(generating() for other, generating in self._generating.items()
                   if other is not engine)


def turn(turns: Turns | None, engine: object, *, background: bool = False
         ) -> contextlib.AbstractContextManager[None]:
    """``engine``'s turn on the cores where it shares them (``turns``), else nothing."""
    if turns is None:
        return contextlib.nullcontext()
    return turns.turn(engine, background=background)


def turn_groups(inputs: Sequence[Sequence[int]]) -> Iterator[list[Sequence[int]]]:
    """``inputs`` in order, in groups of at most BACKGROUND_TURN_TOKENS tokens (a longer
    input alone): one background turn each."""
    group: list[Sequence[int]] = []
    for tokens in inputs:
        if group and sum(map(len, group)) + len(tokens) > BACKGROUND_TURN_TOKENS:
            yield group
            group = []
        group.append(tokens)
    if group:
        yield group


TURNS = Turns()
"""The process's turns: the engines loading.py builds for models with layers on the CPU."""
