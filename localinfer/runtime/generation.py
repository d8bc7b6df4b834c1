"""A submitted request, as its caller holds it and as the engine tracks it.

``Generation`` is the caller's side: iterate it for events, cancel it from any thread.
``Request`` is the engine's: the prompt, the sampler, what was generated and when, from which
``live_stats`` (sent with each piece of text) and ``done_event`` (the last event) are made.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .backend import Backend
from .logprobs import Distribution
from .speculate import PromptLookup
from .text import TextAssembler
from .thinking import BudgetWatch
from .types import (
    Done,
    Event,
    FinishReason,
    LiveStats,
    Priority,
    SamplingParams,
    Timings,
    TokenLogprob,
    Usage,
)

log = logging.getLogger(__name__)

Sink = Callable[["Event | BaseException"], None]
"""Where a generation's events go instead of its own queue (the daemon's event loop)."""


class Generation:
    """One submitted request. Iterate it for ``Token`` events and a final ``Done``.

    ``cancel()`` may be called from any thread; the engine stops within one token and the
    generation ends with ``Done(finish_reason="cancelled")``. Leaving the iteration early
    cancels too. Errors raised by the engine for this request are raised by the iterator.
    """

    def __init__(self, on_cancel: Callable[[Generation], None], sink: Sink | None = None
                 ) -> None:
        self._on_cancel = on_cancel
        """The engine's: called once, on the thread that cancels."""
        self._queue: queue.SimpleQueue[Event | BaseException] = queue.SimpleQueue()
        self._sink = sink or self._queue.put
        self.cancelled = False
        self.done: Done | None = None
        self.request: Request | None = None

    def cancel(self) -> None:
        if not self.cancelled and self.done is None:
            self.cancelled = True
            self._on_cancel(self)

    def __iter__(self) -> Iterator[Event]:
        try:
            while True:
                item = self._queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Done):
                    return
        finally:
            if self.done is None:
                self.cancel()

    def result(self) -> Done:
        """Wait for the end and return the ``Done`` event (its text is the whole reply); again
        after the events were consumed."""
        if self.done is not None:
            return self.done
        for event in self:
            if isinstance(event, Done):
                return event
        raise RuntimeError("generation ended without a Done event")  # pragma: no cover

    def _emit(self, event: Event | BaseException) -> None:
        if isinstance(event, Done):
            self.done = event
        try:
            self._sink(event)
        except Exception:  # a consumer that went away must not take the engine down
            log.warning("dropping an event: its consumer failed", exc_info=True)
            self.cancelled = True


@dataclass(eq=False)
class Request:
    """A request as the engine tracks it, from its submission to its ``Done``."""

    id: int
    prompt: list[int]
    params: SamplingParams
    priority: Priority
    generation: Generation
    seed: int
    t_submit: float
    t_received: float = 0.0
    """When the caller received the request (0: at ``t_submit``): the time before submission
    went to parsing it, the chat template and tokenizing."""
    t_start: float = 0.0
    t_read: float = 0.0
    """When the first decode holding its prompt's tokens began (0: not yet)."""
    t_first: float = 0.0
    t_last: float = 0.0
    load_ms: float = 0.0
    n_cached: int = 0
    """Prompt tokens found in the KV cache at first admission."""
    n_restored: int = 0
    """Of those, the ones read back from the prefix cache on disk."""
    n_drafted: int = 0
    n_accepted: int = 0
    generated: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)
    """What must be in the KV cache before the next sample: the prompt, or after a
    preemption the prompt and everything generated so far."""
    cursor: int | None = None
    """Where a FIM prompt's text typed at the cursor begins (``FimTokens.cursor``)."""
    follows: Request | None = None
    """The request this one is another completion of (llama-server's ``n_cmpl``): it waits
    until that one has read their prompt, then samples its first token from the same logits
    and rides on its rows (``Slot.riding``; ``Engine._admit_followers``)."""
    ended: bool = False
    """It has left its slot for good (finished, cancelled or failed)."""
    sampler: object = None
    lookup: PromptLookup | None = None
    assembler: TextAssembler = field(default_factory=TextAssembler)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """Each generated token's log-probability, when the request asks for them."""
    n_logprobs_sent: int = 0
    """How many of them have gone out with a Token event."""
    budget: BudgetWatch | None = None
    """The reasoning budget's count, when the request has one (``params.reasoning_budget``)."""
    closing: list[int] = field(default_factory=list)
    """The tokens of the budget's ``close`` (tokenized at submission)."""
    forced: list[int] = field(default_factory=list)
    """Tokens still to be written in the model's place, one a step (a spent budget's
    close)."""
    was_forced: bool = False
    """The token last taken was forced, not sampled."""

    def __post_init__(self) -> None:
        if self.params.reasoning_budget is not None:
            self.budget = BudgetWatch(self.params.reasoning_budget)

    def count_reasoning(self, piece: bytes) -> None:
        """Count a sampled token (its bytes) against the reasoning budget; when that spends
        it, the budget's close is forced next, token by token."""
        if self.budget is not None and not self.was_forced and self.budget.push(piece):
            self.forced = list(self.closing)

    def sample(self, backend: Backend, index: int) -> int:
        """Sample batch entry ``index`` with this request's sampler (or force a spent reasoning
        budget's close); with its log-probability when asked for (taken from the logits before
        sampling: the argmax shortcut and the native chain both leave the model's
        distribution behind them)."""
        n_top, self.was_forced = self.params.logprobs, bool(self.forced)
        if n_top is None and not self.forced:
            return backend.sample(self.sampler, index)
        row = backend.raw_logits(index) if n_top is not None else None
        distribution = None if row is None or n_top is None else Distribution(row, n_top)
        if self.forced:  # written in the model's place: the sampler takes it as sampled
            backend.force(self.sampler, token := self.forced.pop(0))
        else:
            token = backend.sample(self.sampler, index)
        if row is not None and distribution is not None and not backend.is_eog(token):
            # The end of a turn is no part of the reply. The sampled token's own logit is as
            # it was: the argmax shortcut overwrites only the never-sampled tokens' logits.
            self.logprobs.append(distribution.entry(token, float(row[token]),
                                                    backend.token_bytes))
        return token

    def unsent_logprobs(self) -> tuple[TokenLogprob, ...]:
        unsent = tuple(self.logprobs[self.n_logprobs_sent:])
        self.n_logprobs_sent = len(self.logprobs)
        return unsent

    @property
    def n_generated(self) -> int:
        return len(self.generated)

    def sort_key(self) -> tuple[int, float, int]:
        return (int(self.priority), self.t_submit, self.id)

    def __lt__(self, other: Request) -> bool:
        return self.sort_key() < other.sort_key()


def live_stats(request: Request, now: float) -> LiveStats:
    """The speed so far, sent with each piece of text."""
    prefill_ms = (request.t_first - request.t_start) * 1000.0
    decode_s = now - request.t_first
    return LiveStats(
        n_tokens=request.n_generated,
        prompt_tokens=len(request.prompt),
        ttft_ms=(request.t_first - request.t_submit) * 1000.0,
        prefill_tps=(len(request.prompt) - request.n_cached) * 1000.0 / prefill_ms
        if prefill_ms > 0 else 0.0,
        decode_tps=(request.n_generated - 1) / decode_s if decode_s > 0 else 0.0,
    )


def done_event(request: Request, reason: FinishReason, now: float) -> Done:
    """The last event of a request: its whole text, why it ended, its usage and timings."""
    started = request.t_start > 0
    first = request.n_generated > 0
    timings = Timings(
        load_ms=request.load_ms,
        prepare_ms=(request.t_submit - request.t_received) * 1000.0
        if request.t_received else 0.0,
        queue_ms=((request.t_start if started else now) - request.t_submit) * 1000.0,
        prompt_tokens=len(request.prompt),
        cached_tokens=request.n_cached,
        restored_tokens=request.n_restored,
        prefill_tokens=len(request.prompt) - request.n_cached if first else 0,
        setup_ms=(request.t_read - request.t_start) * 1000.0 if request.t_read else 0.0,
        prefill_ms=(request.t_first - request.t_start) * 1000.0 if first else 0.0,
        ttft_ms=(request.t_first - request.t_submit) * 1000.0 if first else 0.0,
        completion_tokens=request.n_generated,
        decode_tokens=max(0, request.n_generated - 1),
        decode_ms=(request.t_last - request.t_first) * 1000.0 if first else 0.0,
        total_ms=(now - request.t_submit) * 1000.0,
        drafted_tokens=request.n_drafted,
        accepted_tokens=request.n_accepted,
    )
    usage = Usage(
        prompt_tokens=len(request.prompt),
        completion_tokens=request.n_generated,
        cached_tokens=request.n_cached,
    )
    return Done(request.assembler.text, reason, usage, timings, tuple(request.logprobs),
                stop_sequence=request.assembler.stop_string)
