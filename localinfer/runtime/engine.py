"""The runtime core: the one engine that both front ends (the daemon and the chat UI) go through.

An ``Engine`` owns one loaded model (a ``Backend``) and one worker thread that drives it. Callers
on any thread submit requests (``chat``, ``complete``) and iterate the returned ``Generation``
for events. The worker runs a continuous-batching loop: every step it puts the next token of
each running sequence, plus a chunk of any prompt being read, into one batch, decodes it, and
samples each sequence with its own native sampler. Finished sequences leave their KV cache in
their slot, so a later request that starts with the same tokens (the previous chat turn, an
editor resending a file) only evaluates what is new. Embeddings (``embed``) run on the same
worker between two steps, many inputs per decode.

The ``Engine`` is that loop and its admission; it holds the collaborators that decide the rest:
a ``PromptBuilder`` (prompts.py) turns chats, completions and infills into tokens, a
``CacheKeeper`` (checkpoints.py) keeps what each slot's cache holds between requests, a
``DraftPolicy`` (speculate.py) picks what each step verifies and a ``ThreadTuner`` (threads.py)
how many threads it takes; a ``WorkloadCounter`` (workload.py) counts its work for the next load.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from ..errors import (
    Busy,
    InvalidRequest,
    LocalInferError,
    ModelLoadError,
    StepInterrupted,
    WorkerLost,
)
from .backend import Backend
from .chat_template import ChatTemplate
from .checkpoints import CHECKPOINT_MIN_TOKENS as CHECKPOINT_MIN_TOKENS
from .checkpoints import DEFAULT_CHAT_CHECKPOINTS, READ_AHEAD_IDLE_S, CacheKeeper, slot_score, waits
from .checkpoints import REREAD_TAIL as REREAD_TAIL
from .disk_cache import PrefixCache
from .fim import FimTokens
from .generation import Generation, Request, Sink, done_event, live_stats
from .prompts import PromptBuilder, Prompting
from .slots import (
    RIDING,
    Slot,
    bare_decode_rate,
    choose_drafts,
    preemption_victim,
    prompt_chunks,
    read_for_next,
    reads_quickly,
    step_yields,
)
from .speculate import DraftPolicy, PromptLookup, graph_rows
from .text import TextAssembler
from .threads import ThreadMemory, ThreadTuner
from .turns import Turns, in_turns, turn
from .types import (
    DEFAULT_SAMPLING,
    Embeddings,
    EngineStats,
    Event,
    FinishReason,
    Message,
    ModelInfo,
    Priority,
    Ranking,
    SamplingParams,
    Token,
)
from .workload import WorkloadCounter

log = logging.getLogger(__name__)

T = TypeVar("T")


class Engine(Prompting):
    """Owns one loaded model and the worker thread that runs every request on it."""

    def __init__(
        self,
        backend: Backend,
        *,
        chat_template: ChatTemplate | None = None,
        max_queue: int = 64,
        load_ms: float = 0.0,
        chat_checkpoints: int = DEFAULT_CHAT_CHECKPOINTS,
        prefix_cache: PrefixCache | None = None,
        thread_memory: Path | None = None,
        turns: Turns | None = None,
        workload: Path | None = None,
    ) -> None:
        self.backend = backend
        self.info: ModelInfo = backend.info
        self.max_queue = max_queue
        self.load_ms = load_ms
        self._unreported_load_ms = load_ms
        self.prompt_builder = PromptBuilder(backend, chat_template)
        """Chats, completions, infills and embedding inputs to tokens (prompts.py)."""
        self._prompts = self.prompt_builder.tokenizer  # its reuse counters, for tests
        self._slots = [Slot(i) for i in range(self.info.n_slots)]
        self._riders: list[Slot] = []
        """The places of completions riding on another's rows (``Slot.riding``): no sequence
        of the KV cache, outside ``_slots``."""
        self._kept = CacheKeeper(backend, n_ctx=self.info.n_ctx,
                                 chat_checkpoints=chat_checkpoints,
                                 turn_marks=self.prompt_builder.chat_turn_marks,
                                 disk=prefix_cache)
        """What each slot's cache keeps between requests (checkpoints.py)."""
        self._steps = 0
        self._read_ahead_total = 0
        self._pending: list[Request] = []
        self._outbox: list[tuple[Generation, Event | BaseException]] = []
        self._cv = threading.Condition()
        self._closing = False
        self._ids = itertools.count(1)
        self._requests_total = 0
        self._prompt_tokens_total = 0
        self._cached_tokens_total = 0
        self._generated_tokens_total = 0
        self._drafted_total = 0
        self._accepted_total = 0
        self._preemptions_total = 0
        self._interrupted_total = 0
        self._in_step: list[Request] = []  # the decode in flight's requests (under _cv)
        self._in_step_prompt_rows = 0  # and its prompt rows: what an arrival may interrupt
        self._in_step_kept = False  # whether it reads what a leaving client's successor shares
        self._last_decode_tps = 0.0
        self.thread_tuner = ThreadTuner(
            backend.adaptive_threads, backend.set_threads,
            memory=ThreadMemory(thread_memory, backend.adaptive_threads))
        """Each step's thread count, following the machine's load and learned in the file
        ``thread_memory`` across processes (see threads.py)."""
        self.drafts = DraftPolicy()
        """Which drafts each step verifies, from the step costs it measures here."""
        self.workload = WorkloadCounter(workload)  # what it reads and decodes (workload.py)
        self._jobs: list[tuple[Callable[[], object], Future[Any]]] = []
        self._step_jobs: list[tuple[Callable[[], object], Future[Any]]] = []
        """Work for the worker between two steps, even while requests run (embeddings)."""
        self.ready = threading.Event()
        """Set once the worker has warmed the model up (load_ms then includes it), or has
        failed to: ``check()`` says which."""
        self.failed: BaseException | None = None
        self._closed = False
        self._turns = turns
        """Turns on the CPU cores with the process's other engines (turns.py), or None."""
        if turns is not None:
            turns.join(self, lambda: bool(self._pending or self._active()))
        self._thread = threading.Thread(target=self._run, name="localinfer-engine", daemon=True)
        self._thread.start()

    # --- submitting (any thread) --------------------------------------------------------
    def chat(self, messages: Sequence[Message], params: SamplingParams = DEFAULT_SAMPLING, *,
             priority: Priority = Priority.NORMAL, sink: Sink | None = None) -> Generation:
        """Generate the assistant's reply to ``messages`` with the model's chat template."""
        return self.submit(self.chat_tokens(messages), params, priority=priority, sink=sink)

    def complete(self, prompt: str, params: SamplingParams = DEFAULT_SAMPLING, *,
                 priority: Priority = Priority.NORMAL, sink: Sink | None = None) -> Generation:
        """Continue ``prompt`` as raw text (no chat template)."""
        return self.submit(self.completion_tokens(prompt), params, priority=priority,
                           sink=sink)

    def infill(
        self,
        prefix: str,
        suffix: str,
        params: SamplingParams = DEFAULT_SAMPLING,
        *,
        priority: Priority = Priority.INTERACTIVE,
        sink: Sink | None = None,
    ) -> Generation:
        """Fill in the middle between ``prefix`` and ``suffix`` (code completion), with the
        model's FIM tokens (see ``infill_tokens``). Interactive by default: a person is
        typing and waiting for it."""
        return self.submit(self.infill_tokens(prefix, suffix), params, priority=priority,
                           sink=sink)

    def embed(self, inputs: Sequence[list[int]]) -> Embeddings:
        """The model's pooled vector for each input (token lists from ``embedding_tokens``),
        as they come (not normalised). Many inputs share each decode; an embedding model pools
        as it was trained to, a generative one by the mean of its last hidden states. Runs on
        the worker between two generation steps, so streams keep flowing."""
        if not inputs:
            raise InvalidRequest("there is nothing to embed: send at least one input.")
        started = time.perf_counter()
        vectors = in_turns(self._turns, self, inputs, self._embed_step, self._between_steps)
        return Embeddings(vectors=vectors, prompt_tokens=sum(len(t) for t in inputs),
                          total_ms=(time.perf_counter() - started) * 1000.0)

    def rank(self, query: str, documents: Sequence[str]) -> Ranking:
        """A reranker's score of each document for ``query`` (higher: more relevant), read
        as (query, document) pairs several to a decode, between two generation steps."""
        inputs = self.prompt_builder.rank_inputs(query, documents)
        started = time.perf_counter()
        scores = [v[0] for v in in_turns(self._turns, self, inputs, self._embed_step,
                                         self._between_steps)]
        return Ranking(scores=scores, prompt_tokens=sum(len(t) for t in inputs),
                       total_ms=(time.perf_counter() - started) * 1000.0)

    def _embed_step(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One decode of ``inputs`` to embed or rank, on the worker, at the thread count the
        tuner keeps for it (``ThreadTuner.embedding``)."""
        with self.thread_tuner.embedding(sum(len(t) for t in inputs), idle=not self._active()):
            return self.backend.embed(inputs)

    def _between_steps(self, fn: Callable[[], T]) -> T:
        future: Future[T] = Future()
        with self._cv:
            self._check_open()
            self._step_jobs.append((fn, future))
            self._cv.notify()
        return future.result()

    def submit(
        self,
        prompt: list[int],
        params: SamplingParams = DEFAULT_SAMPLING,
        *,
        priority: Priority = Priority.NORMAL,
        sink: Sink | None = None,
        received_at: float = 0.0,
        follows: Generation | None = None,
    ) -> Generation:
        """Queue ``prompt`` for generation. ``received_at`` (a ``time.perf_counter()``) is
        when the caller got the request (the timings' ``prepare_ms``); ``Request.follows``."""
        params = params.validate().bounded(self.info.n_ctx, self.info.n_vocab)
        if params.grammar is not None:
            self.backend.check_grammar(params.grammar)
        self.prompt_builder.check_prompt(prompt)
        generation = Generation(self._on_cancel, sink)
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        request = Request(
            id=next(self._ids),
            prompt=list(prompt),
            params=params,
            priority=priority,
            generation=generation,
            seed=seed,
            t_submit=time.perf_counter(),
            t_received=received_at,
            assembler=TextAssembler(params.stop, min_indent=params.n_indent),
            target=list(prompt),
            cursor=prompt.cursor if isinstance(prompt, FimTokens) else None,
            closing=self.tokenize(params.reasoning_budget.close) if params.reasoning_budget else [],
            follows=follows.request if follows is not None else None,
        )
        generation.request = request
        if params.supersede is not None and follows is None:
            self._supersede(params.supersede)
        with self._cv:
            self._check_open()
            # Requests waiting for a slot: not those about to take a free one (a burst of
            # as many as there are slots found them all "waiting" before the worker ran).
            waiting = len(self._pending) - sum(s.req is None for s in self._slots)
            if waiting >= self.max_queue:
                raise Busy(f"{waiting} requests are already waiting; try again shortly.")
            heapq.heappush(self._pending, request)
            self._requests_total += 1
            quick = functools.cache(lambda: reads_quickly(request, self._slots))
            if step_yields(self._in_step, self._in_step_prompt_rows, request, quick):
                self.backend.interrupt()  # a long prompt chunk yields to the new one
            self._cv.notify()
        if self._turns is not None and params.supersede is None:
            self._turns.yield_for(quick)  # a chat's new turn goes before indexing
        return generation

    def _supersede(self, key: str) -> None:
        """Cancel the requests a new one with this key replaces (each ends within a token,
        its slot free for the new one; its KV cache stays for the new one's shared prefix)."""
        with self._cv:
            older = [r for r in self._pending if r.params.supersede == key] + [
                r for r in self._running() if r.params.supersede == key]
        for request in older:
            request.generation.cancel()

    def stats(self) -> EngineStats:
        with self._cv:
            return EngineStats(
                requests_total=self._requests_total,
                prompt_tokens_total=self._prompt_tokens_total,
                cached_tokens_total=self._cached_tokens_total,
                generated_tokens_total=self._generated_tokens_total,
                queue_depth=len(self._pending),
                active=len(self._running()),
                n_slots=len(self._slots),
                last_decode_tps=self._last_decode_tps,
                drafted_tokens_total=self._drafted_total,
                accepted_tokens_total=self._accepted_total,
                preemptions_total=self._preemptions_total,
                read_ahead_tokens_total=self._read_ahead_total,
                interrupted_steps_total=self._interrupted_total,
            )

    def run_on_worker(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run ``fn()`` on the worker thread once no request is running, and return its result.
        For measurements that must drive llama.cpp from the engine's own thread."""
        future: Future[T] = Future()
        with self._cv:
            self._check_open()
            self._jobs.append((fn, future))
            self._cv.notify()
        return future.result(timeout)

    def clear_cache(self) -> None:
        """Forget every idle slot's KV cache (the next requests start cold)."""

        def clear() -> None:
            for slot in self._slots:
                if slot.req is None:
                    self._kept.forget(slot)

        self.run_on_worker(clear)

    def measure_decode_step(self, n_steps: int = 32) -> float:
        """The bare llama_decode rate for one sequence, in steps per second: a single token
        per step with its logits, no sampling, no Python bookkeeping around it. The yardstick
        for the engine's own decode rate."""
        return self.run_on_worker(lambda: bare_decode_rate(self.backend, self._slots[0],
                                                           n_steps))

    def cancel_all(self) -> None:
        """Cancel every waiting and running request; each ends within one token."""
        with self._cv:
            requests = list(self._pending) + self._running()
        for request in requests:
            request.generation.cancel()

    def close(self) -> None:
        """End every request (``cancelled``), stop the worker and free the model. Safe to
        call again, and after the worker died."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join()
        with self._cv:
            if self._closed:
                return
            self._closed = True
        self.workload.save()
        if self._turns is not None:
            self._turns.leave(self)
        self.backend.close()

    def _check_open(self) -> None:
        """Refuse new work once the engine is closing (called holding the lock)."""
        if self._closing:
            self.check()  # it stopped because it failed: say why
            raise Busy("the engine is shutting down.")

    def check(self) -> None:
        """Raise the error that stopped the worker (e.g. a failed warm-up), if one did."""
        if self.failed is not None:
            raise ModelLoadError(f"{self.info.name} stopped working: {self.failed}") \
                from self.failed

    def wait_ready(self) -> Engine:
        """Wait for the warm-up; if it failed, free the model and raise why."""
        self.ready.wait()
        try:
            self.check()
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_cancel(self, generation: Generation) -> None:
        with self._cv:
            request = generation.request
            # A request that never started has sent nothing: answer it here. One that was
            # preempted may still have tokens in the worker's outbox: the worker ends it.
            if request is not None and request in self._pending and request.sampler is None:
                self._pending.remove(request)
                heapq.heapify(self._pending)
                generation._emit(done_event(request, "cancelled", time.perf_counter()))
            # Nobody waits for the step in flight: stop it, unless it reads the part of an
            # autocomplete prompt that the next keystroke's request reads first.
            if self._step_serves_nobody():
                self.backend.interrupt()
            self._cv.notify()

    def _step_serves_nobody(self) -> bool:
        """Under ``_cv``: whether every client of the step in flight has left and it reads
        nothing a leaving autocomplete client's next keystroke shares (``read_for_next``)."""
        return bool(self._in_step) and not self._in_step_kept and all(
            r.generation.cancelled for r in self._in_step)

    # --- the worker thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            started = time.perf_counter()
            self.backend.warm_up()  # on this thread: every llama.cpp compute call must be
            warm_ms = (time.perf_counter() - started) * 1000.0
            with self._cv:
                self.load_ms += warm_ms
                self._unreported_load_ms += warm_ms
            self.ready.set()
            while True:
                if not self._active():
                    self._flush()  # nothing is decoding: deliver what the last step made
                    self._run_jobs()
                self._run_step_jobs()
                with self._cv:
                    idle_since = time.perf_counter()
                    while not (self._closing or self._has_work()):
                        wait = None
                        if any(s.ahead for s in self._slots):
                            wait = idle_since + READ_AHEAD_IDLE_S - time.perf_counter()
                            if wait <= 0:
                                break
                        self._cv.wait(wait)
                    if self._closing:
                        break
                    idle = not self._has_work()
                if idle:
                    with turn(self._turns, self):
                        self._read_ahead_total += self._kept.read_ahead(self._slots)
                    continue
                # Cancelled requests leave first: a superseding keystroke's request then finds
                # the slot (and cache) of the one it cancelled free.
                for slot in self._active():
                    if slot.running.generation.cancelled:
                        self._finish(slot, "cancelled", time.perf_counter())
                if not (self._pending or self._active()):
                    continue  # jobs alone: run at the loop's top
                # Admitted with the cores held: a chat's turn that came meanwhile is read now.
                with turn(self._turns, self, before_wait=self._flush):
                    with self._cv:
                        from_idle = self._admit()
                    if from_idle:  # the cores other processes hold now (out of the lock: it
                        self.thread_tuner.admit()  # may read the run queue again, ms later)
                    self._kept.compact(self._slots)
                    if self._active():
                        self._step()
        except BaseException as exc:  # a bug in the loop must not leave callers hanging
            if not isinstance(exc, WorkerLost):  # logged where it was found out, no bug
                log.exception("engine worker crashed")
            self.failed = exc
            self._fail_all(exc)
        finally:
            self.ready.set()  # never leave a waiter hanging, even if the warm-up failed
            self._shutdown()
            self._flush()

    def _has_work(self) -> bool:
        """Requests waiting or running, or jobs for the worker (under ``_cv``)."""
        return bool(self._pending or self._active() or self._jobs or self._step_jobs)

    def _run_step_jobs(self) -> None:
        with self._cv:
            jobs, self._step_jobs = self._step_jobs, []
        for fn, future in jobs:
            try:
                self.backend.clear_interrupt()  # not once the turn is held: a stop comes then
                with turn(self._turns, self, background=True, interrupt=self.backend.interrupt):
                    future.set_result(fn())
            except BaseException as exc:  # delivered to the caller
                future.set_exception(exc)

    def _run_jobs(self) -> None:
        with self._cv:
            jobs, self._jobs = self._jobs, []
        for fn, future in jobs:
            try:
                future.set_result(fn())
            except BaseException as exc:  # delivered to the caller of run_on_worker
                future.set_exception(exc)

    def _post(self, request: Request, event: Event | BaseException) -> None:
        self._outbox.append((request.generation, event))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        for generation, event in outbox:
            generation._emit(event)

    def _active(self) -> list[Slot]:
        """The slots with a request, and the riding completions' places (``_riders``)."""
        return [s for s in self._slots + self._riders if s.req is not None]

    def _running(self) -> list[Request]:
        """Their requests, each read once (other threads ask while the worker changes them)."""
        return [r for s in self._slots + self._riders if (r := s.req) is not None]

    def _admit(self) -> bool:
        """Move waiting requests into free slots, reusing the best-matching cached prefix.
        An interactive request that finds every slot busy takes one from a lower-priority
        request, which goes back to the queue and resumes later where it stopped. Whether
        requests came to an idle engine."""
        cancelled = [r for r in self._pending if r.generation.cancelled]
        if cancelled:  # preempted, then cancelled while waiting: end them now
            self._pending = [r for r in self._pending if not r.generation.cancelled]
            heapq.heapify(self._pending)
            for request in cancelled:
                self._free_sampler(request)
                self._post(request, done_event(request, "cancelled", time.perf_counter()))
        ready = [r for r in self._pending if not waits(r, self._slots)]
        if ready and not any(s.req is None for s in self._slots):
            self._preempt_for(min(ready))
        free = [s for s in self._slots if s.req is None]
        from_idle = bool(ready) and len(free) == len(self._slots)
        waiting = []
        while self._pending and free:
            request = heapq.heappop(self._pending)
            if waits(request, self._slots):
                waiting.append(request)
                continue
            slot = max(free, key=lambda s: slot_score(s, request, self.backend))
            free.remove(slot)
            self._seat(slot, request)  # first: should anything below fail, _fail_all finds it
            # Its cache's shared prefix less REREAD_TAIL tokens, its checkpoints planned.
            n_keep = self._kept.reuse(slot, request, self._slots)
            if request.sampler is None:  # first admission (not a resumption)
                self._start(request, n_keep)
        for request in waiting:
            heapq.heappush(self._pending, request)
        return from_idle

    @staticmethod
    def _seat(slot: Slot, request: Request) -> None:
        """Put ``request`` in ``slot``, whose cache its own prompt now decides."""
        slot.supersede = None if request.follows else request.params.supersede
        slot.ahead = []
        slot.req, slot.next_token = request, None

    def _start(self, request: Request, n_keep: int) -> None:
        """A request's first admission, with ``n_keep`` prompt tokens cached: its sampler."""
        request.n_cached = n_keep  # before t_start: a reader seeing it set sees this
        request.t_start = time.perf_counter()
        request.load_ms, self._unreported_load_ms = self._unreported_load_ms, 0.0
        params = request.params
        request.sampler = self.backend.new_sampler(params, request.seed)
        if params.penalized:
            self.backend.accept(request.sampler, request.prompt[-params.repeat_last_n:])
        if params.speculative is not False:
            request.lookup = PromptLookup(request.prompt, self.drafts.acceptance)
        self._prompt_tokens_total += len(request.prompt)
        self._cached_tokens_total += n_keep
        self.workload.read(len(request.prompt), n_keep)

    def _admit_followers(self, leader: Slot, first: Request, now: float) -> None:
        """The other completions of the prompt ``first`` has just read in ``leader``'s slot
        (``Request.follows``) sample their first tokens from the same logits, as
        llama-server's child tasks do, reading no row, and ride on the leader's rows while
        they write what it writes (``_ride``), in no slot: each takes one when it parts."""
        if len(leader.cached) != len(first.prompt):  # a resumption read its reply back too
            return
        with self._cv:
            followers = [r for r in self._pending if r.follows is first and r.sampler is None
                         and not r.generation.cancelled]
        for request in followers:
            with self._cv:
                self._pending.remove(request)
                heapq.heapify(self._pending)
            slot = Slot(RIDING)
            slot.req = request
            self._riders.append(slot)
            self._start(request, len(request.prompt))
            request.t_start = request.t_read = now  # it reads nothing: its first token is now
            self._ride(slot, first, leader.batch_index, now)

    def _ride(self, slot: Slot, first: Request, index: int, now: float) -> None:
        """A riding completion samples its next token from batch entry ``index``, its leader
        ``first``'s row, and rides on while that token is the leader's and the leader decodes
        on; else it parts (``_part``)."""
        token = self._sample_or_abort(slot, index)
        if token is None or not self._on_token(slot, token, now):
            return  # it ended where the leader did, or alone
        if first.generated[-1:] != [token] or not self._leads(first):
            self._part(slot)

    def _leads(self, first: Request | None) -> bool:
        """Whether ``first`` decodes in a slot, so that its riders can sample its rows."""
        return any(s.req is first and not s.prefilling for s in self._slots)

    def _part(self, rider: Slot) -> None:
        """A riding completion goes on alone in a free slot, with a copy of the cache it
        shared (the prompt and every token but the one just sampled, in its leader's slot or
        where that has gone); where no slot is free or none holds that cache any more, it
        waits and reads it back as a preempted request does."""
        request = rider.running
        shared = request.prompt + request.generated[:-1]
        source = next((s for s in self._slots if s.cached == shared), None)
        free = [s for s in self._slots if s.req is None and s is not source]
        if source is not None and free:
            slot = max(free, key=lambda s: slot_score(s, request, self.backend))
            if self._kept.copy(slot, source):
                self._seat(slot, request)
                slot.next_token, rider.req = rider.next_token, None
                return
        self._requeue(rider)

    def _preempt_for(self, waiting: Request) -> None:
        slot = preemption_victim([s for s in self._slots if s.req is not None], waiting)
        if slot is None:
            return
        self._preemptions_total += 1
        self._requeue(slot)

    def _requeue(self, slot: Slot) -> None:
        """Send the slot's request back to the queue. Everything generated so far is already
        streamed; it resumes by reading it back (mostly from this slot's cache, if nobody
        overwrote it) and sampling on."""
        request = slot.running
        request.target = request.prompt + request.generated
        slot.req = None
        slot.next_token = None
        slot.last_used = time.perf_counter()
        with self._cv:
            heapq.heappush(self._pending, request)

    def _step(self) -> None:
        """Build one batch from the active slots (the decoding ones that ``_stepping`` picks),
        decode it, and sample."""
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        outputs: list[bool] = []
        budget = self.backend.n_batch
        for slot in self._riders:
            if slot.req is not None and not self._leads(slot.running.follows):  # preempted,
                self._part(slot)  # cancelled
        self._riders = [s for s in self._riders if s.req is not None]
        active = [s for s in self._slots if s.req is not None]
        if not active:
            return  # riders that went back to the queue, to read what they shared back
        riders = [(s, s.running) for s in self._riders]
        decoding = [s for s in active if not s.prefilling]
        # While a prompt is being read, every decoding slot steps and none drafts: the step
        # costs what the prompt's rows cost.
        reading = len(decoding) < len(active)
        if not reading:
            decoding = self._stepping(decoding)
        choose_drafts(self.drafts, decoding, reading, self.backend.n_batch, self.info.n_ctx)
        for slot in decoding:  # a leader's riders sample its one row
            if any(r.follows is slot.running for _, r in riders):
                slot.draft = []
        for slot in decoding:
            pos = len(slot.cached)
            slot.batch_index = len(tokens)
            n = 1 + len(slot.draft)
            next_token = slot.next_token
            assert next_token is not None  # a decoding slot has sampled the token it feeds next
            tokens.append(next_token)
            tokens.extend(slot.draft)
            positions.extend(range(pos, pos + n))
            seq_ids.extend([slot.seq_id] * n)
            outputs.extend([True] * n)
            budget -= n

        chunks = prompt_chunks([s for s in active if s.prefilling], budget, decoding,
                               on_cpu=self.info.computes_on_cpu)
        for slot, n in chunks:
            start = len(slot.cached)
            target = slot.running.target
            tokens.extend(target[start : start + n])
            positions.extend(range(start, start + n))
            seq_ids.extend([slot.seq_id] * n)
            outputs.extend([False] * (n - 1) + [start + n == len(target)])
            slot.batch_index = len(tokens) - 1

        # Hand over the previous step's events now: the consumers' threads then run while
        # llama_decode computes (it releases the GIL), not while this thread needs it.
        self._flush()
        started = time.perf_counter()
        for slot, _ in chunks:
            if not slot.running.t_read:
                slot.running.t_read = started
        with self._cv:
            self.backend.clear_interrupt()
            self._in_step = [s.running for s in decoding] + [r for _, r in riders] + [
                s.running for s, _ in chunks]
            self._in_step_prompt_rows = sum(n for _, n in chunks)
            self._in_step_kept = any(read_for_next(s.running, len(s.cached)) for s, _ in chunks)
            if self._step_serves_nobody():
                self.backend.interrupt()  # cancelled since the batch was built
        try:
            with self.thread_tuner.step(len(tokens)):
                self.backend.decode(tokens, positions, seq_ids, outputs)
        except StepInterrupted:
            self._interrupted_total += 1
            self._kept.after_interrupt(decoding, chunks)
            return
        except LocalInferError as exc:
            log.error("decode failed: %s", exc)
            for slot in decoding + [s for s, _ in chunks]:
                self._abort(slot, exc)
            if isinstance(exc, WorkerLost):
                raise  # the model's process is gone: stop (``failed``), the owner reloads it
            return
        finally:
            with self._cv:
                self._in_step, self._in_step_prompt_rows, self._in_step_kept = [], 0, False
        now = time.perf_counter()
        self._steps += 1
        self.workload.stepped([len(s.cached) for s in decoding])
        for slot in decoding + [s for s, _ in chunks]:
            slot.stepped_at = self._steps
        if not chunks:  # a step of decode rows alone: what drafting is weighed against
            self.drafts.costs.record(
                graph_rows([(s.seq_id, 1 + len(s.draft)) for s in decoding]), now - started)
        for slot in decoding:
            first = slot.running
            self._verify(slot, now)
            for rider, request in riders:
                if request.follows is first and rider.req is request:
                    self._ride(rider, first, slot.batch_index, now)
        for slot, n in chunks:
            start = len(slot.cached)
            slot.cached.extend(slot.running.target[start : start + n])
            self._kept.take_due(slot)
            if not slot.prefilling:
                first = slot.running
                token = self._sample_or_abort(slot, slot.batch_index)
                if token is not None:
                    self._on_token(slot, token, now)
                    self._admit_followers(slot, first, now)

    def _stepping(self, decoding: list[Slot]) -> list[Slot]:
        """The decoding slots that take this step: all, or those that waited longest where
        fewer rows give more tokens per second (see speculate.DraftPolicy.stepping)."""
        if len(decoding) < 2:
            return decoding
        chosen = self.drafts.stepping([s.seq_id for s in decoding],
                                      [self._steps - s.stepped_at for s in decoding])
        return [decoding[i] for i in chosen]

    def _verify(self, slot: Slot, now: float) -> None:
        """Sample a decoding slot's outputs: its next token, then each draft token for as
        long as the model agrees with the draft."""
        request, draft, next_token = slot.running, slot.draft, slot.next_token
        assert next_token is not None  # a decoding slot has sampled the token it fed
        slot.cached.append(next_token)
        accepted = 0
        for j in range(len(draft) + 1):
            if j and request.generation.cancelled:
                break  # cancelled mid-step: stop at one token, even with a draft accepted
            token = self._sample_or_abort(slot, slot.batch_index + j)
            if token is None or not self._on_token(slot, token, now):
                break  # finished (end of generation, a stop string, max_tokens)
            if j < len(draft) and token == draft[j]:
                slot.cached.append(token)  # already decoded at this position: keep it
                accepted += 1
            else:
                break
        if draft:
            request.n_drafted += len(draft)
            request.n_accepted += accepted
            self._drafted_total += len(draft)
            self._accepted_total += accepted
            lookup = request.lookup
            assert lookup is not None  # only a request with a lookup drafts
            lookup.feedback(len(draft), accepted)
            if slot.req is request and accepted < len(draft):
                # Drop the rejected draft tokens from this sequence's cache.
                kept = self.backend.seq_trim(slot.seq_id, len(slot.cached))
                if kept != len(slot.cached):  # could not cut there: read it all back
                    del slot.cached[kept:]
                    request.target = request.prompt + request.generated
                    slot.next_token = None
        slot.draft = []

    def _sample_or_abort(self, slot: Slot, index: int) -> int | None:
        """The running request's next token, or None when its sampler cannot go on (a
        grammar that allows no token here): that request ends with the error, the rest of
        the batch goes on."""
        try:
            return slot.running.sample(self.backend, index)
        except LocalInferError as exc:
            log.info("a request's sampling failed: %s", exc)
            self._abort(slot, exc)
            return None

    def _on_token(self, slot: Slot, token: int, now: float) -> bool:
        """Record a sampled token; False when the generation has ended."""
        request = slot.running
        request.generated.append(token)
        if request.lookup is not None:
            request.lookup.extend([token])
        if request.n_generated == 1:
            request.t_first = now
        request.t_last = now
        if self.backend.is_eog(token) and not request.was_forced:
            self._finish(slot, "stop", now)
            return False
        piece = self.backend.token_bytes(token)
        request.count_reasoning(piece)  # a spent budget: its close is forced next
        text = request.assembler.push(piece)
        if text:
            self._post(request, Token(text, live_stats(request, now), request.unsent_logprobs()))
        if not slot.riding:
            self._kept.first_token(slot, self._flush)  # a prompt's save put off until now
        limit_ms = request.params.t_max_predict_ms  # autocomplete's: a line's end after it
        if limit_ms and "\n" in text and (now - request.t_first) * 1000.0 > limit_ms:
            self._finish(slot, "length", now)
        elif request.assembler.stopped:
            self._finish(slot, "length" if request.assembler.indent_stopped else "stop", now)
        elif request.params.max_tokens is not None and \
                request.n_generated >= request.params.max_tokens:
            self._finish(slot, "length", now)
        elif (len(request.prompt) + request.n_generated - 1 if slot.riding
              else len(slot.cached)) >= self.info.n_ctx:
            self._finish(slot, "length", now)  # no room left to decode this token
        else:
            slot.next_token = token
            return True
        return False

    def _finish(self, slot: Slot, reason: FinishReason, now: float) -> None:
        request = slot.running
        rest = request.assembler.flush()
        if rest:
            self._post(request, Token(rest, live_stats(request, now), request.unsent_logprobs()))
        done = done_event(request, reason, now)
        self._generated_tokens_total += request.n_generated
        if done.timings.decode_tokens:
            self._last_decode_tps = done.timings.decode_tps
        self._release(slot, now)
        if not slot.riding:  # a rider's place holds no cache
            slot.ahead = self._kept.next_turn_opening(slot, request, reason)
        self._post(request, done)

    def _abort(self, slot: Slot, exc: BaseException) -> None:
        """A decode failed: the slot's cache state is unknown, so drop it and fail the request."""
        request = slot.running
        if not slot.riding:  # a rider's place holds no cache
            self.backend.seq_trim(slot.seq_id, 0)
            slot.cached.clear()
        self._release(slot, time.perf_counter())
        self._post(request, exc)

    def _release(self, slot: Slot, now: float) -> None:
        if slot.req is not None:
            slot.req.ended = True
            self._free_sampler(slot.req)
            if slot.req.follows is not None and not slot.riding:  # it copied its leader's
                now = 0.0
                self._kept.forget(slot)
        slot.req, slot.next_token, slot.draft = None, None, []
        slot.last_used = now

    def _drain(self) -> tuple[list[Request], list[tuple[Callable[[], object], Future[Any]]]]:
        """Take the waiting requests and every job (under ``_cv``)."""
        pending, self._pending = self._pending, []
        jobs, self._jobs, self._step_jobs = self._jobs + self._step_jobs, [], []
        return pending, jobs

    def _fail_all(self, exc: BaseException) -> None:
        self._flush()
        error = LocalInferError(f"the engine stopped unexpectedly: {exc}")
        with self._cv:
            pending, jobs = self._drain()
            self._closing = True
        for request in pending:
            self._free_sampler(request)
            request.generation._emit(error)
        for slot in self._active():
            request = slot.running
            self._free_sampler(request)
            slot.req = None
            request.generation._emit(error)
        for _, future in jobs:
            future.set_exception(error)

    def _free_sampler(self, request: Request) -> None:
        if request.sampler is not None:
            try:
                self.backend.free_sampler(request.sampler)
            finally:
                request.sampler = None

    def _shutdown(self) -> None:
        now = time.perf_counter()
        with self._cv:
            pending, jobs = self._drain()
        for request in pending:
            self._free_sampler(request)  # a preempted request still holds its sampler
            self._post(request, done_event(request, "cancelled", now))  # after its last tokens
        for slot in self._active():
            self._finish(slot, "cancelled", now)
        for _, future in jobs:
            future.set_exception(Busy("the engine is shutting down."))
