"""The runtime core: the one engine that both front ends (the daemon and the chat UI) go through.

An ``Engine`` owns one loaded model (a ``Backend``) and one worker thread that drives it. Callers
on any thread submit requests (``chat``, ``complete``) and iterate the returned ``Generation``
for events. The worker runs a continuous-batching loop: every step it puts the next token of
each running sequence, plus a chunk of any prompt being read, into one batch, decodes it, and
samples each sequence with its own native sampler. Finished sequences leave their KV cache in
their slot, so a later request that starts with the same tokens (the previous chat turn, an
editor resending a file) only evaluates what is new. Embeddings (``embed``) run on the same
worker between two steps, many inputs per decode.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import (
    Busy,
    ContextOverflow,
    InvalidRequest,
    LocalInferError,
    ModelLoadError,
    WorkerLost,
)
from .backend import Backend
from .chat_template import ChatTemplate
from .fim import FimFile, fim_prompt
from .logprobs import Distribution
from .prompt_cache import PromptTokenizer, common_prefix
from .speculate import EXACT_ROWS, MAX_DRAFT, Draft, DraftPolicy, PromptLookup, graph_rows
from .text import TextAssembler
from .threads import ThreadTuner
from .tools import ToolFormat, detect_format
from .types import (
    DEFAULT_SAMPLING,
    Done,
    Embeddings,
    Event,
    FinishReason,
    LiveStats,
    Message,
    ModelInfo,
    Priority,
    SamplingParams,
    Timings,
    Token,
    TokenLogprob,
    Usage,
)

log = logging.getLogger(__name__)

# While other sequences are decoding, a prompt is read in chunks this small so that their
# streams keep flowing (a 512-token chunk takes about a second on a 2-core CPU).
PREFILL_CHUNK_WHILE_DECODING = 64
CHECKPOINT_MIN_TOKENS = 64
"""An autocomplete prompt that shares fewer tokens than this with the slot's cache takes no
checkpoint (a few MB of sliding-window state for little saved)."""
REREAD_TAIL = EXACT_ROWS + 1
"""Prompt tokens read again even when cached. llama.cpp's CPU matrix kernels compute batches of
1-7 rows one way and of 8 or more another, which rounds differently: re-reading only the last
token gave a different greedy reply than a cold read to the same prompt in 5 of 24 tries
(starter model), re-reading 8 in none. 8 rows cost ~15 ms more than one on a fully cached
prompt, nothing on a new chat turn. Not exact either way: once a slot has passed the sliding
window cache's size (Gemma 3: 1,024 cells), its cells hold positions out of order, attention
sums them in another order, and a cached prompt can part from a cold read at a near-tie. Nor
for every prompt: the last token's logits after 8 rows re-read differed from a cold read's for
10 of the 40 lengths from 9 to 48 tokens of one text, none of 61, 97, 130, 200 and 333 (2-core
AVX2, at 1 and 2 threads alike)."""

DEFAULT_CHAT_CHECKPOINTS = 2
"""Checkpoints a chat's slot keeps on a window cache (see ``_chat_checkpoints``) where the
engine is not told how many: loading.py passes the planner's CHAT_CHECKPOINTS, whose memory
the plan counts; an engine built without a plan (tests, benchmarks) keeps as many."""

READ_AHEAD_IDLE_S = 0.3
"""After a chat reply, once the engine has been idle this long, the chat template's opening of
the next user turn (Gemma: ``<end_of_turn>\n<start_of_turn>user\n``, 5 tokens) is read into
that slot's cache, so the next turn reads only its own message: 5 of the ~20 tokens a short
question takes (starter, ~4 ms each on a 2-core CPU). A person reads the reply and types
for longer than this; a script that sends its next request at once finds the engine as it
was, and reads those tokens with its prompt."""

Sink = Callable[["Event | BaseException"], None]
T = TypeVar("T")


class Generation:
    """One submitted request. Iterate it for ``Token`` events and a final ``Done``.

    ``cancel()`` may be called from any thread; the engine stops within one token and the
    generation ends with ``Done(finish_reason="cancelled")``. Leaving the iteration early
    cancels too. Errors raised by the engine for this request are raised by the iterator.
    """

    def __init__(self, engine: Engine, sink: Sink | None = None) -> None:
        self._engine = engine
        self._queue: queue.SimpleQueue[Event | BaseException] = queue.SimpleQueue()
        self._sink = sink or self._queue.put
        self.cancelled = False
        self.done: Done | None = None
        self.request: _Request | None = None

    def cancel(self) -> None:
        if not self.cancelled and self.done is None:
            self.cancelled = True
            self._engine._on_cancel(self)

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
class _Request:
    id: int
    prompt: list[int]
    params: SamplingParams
    priority: Priority
    generation: Generation
    seed: int
    t_submit: float
    t_start: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    load_ms: float = 0.0
    n_cached: int = 0
    """Prompt tokens found in the KV cache at first admission."""
    n_drafted: int = 0
    n_accepted: int = 0
    generated: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)
    """What must be in the KV cache before the next sample: the prompt, or after a
    preemption the prompt and everything generated so far."""
    sampler: object = None
    lookup: PromptLookup | None = None
    assembler: TextAssembler = field(default_factory=TextAssembler)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """Each generated token's log-probability, when the request asks for them."""
    n_logprobs_sent: int = 0
    """How many of them have gone out with a Token event."""

    def unsent_logprobs(self) -> tuple[TokenLogprob, ...]:
        unsent = tuple(self.logprobs[self.n_logprobs_sent:])
        self.n_logprobs_sent = len(self.logprobs)
        return unsent

    @property
    def n_generated(self) -> int:
        return len(self.generated)

    def sort_key(self) -> tuple[int, float, int]:
        return (int(self.priority), self.t_submit, self.id)

    def __lt__(self, other: _Request) -> bool:
        return self.sort_key() < other.sort_key()


@dataclass(frozen=True)
class _Checkpoint:
    """The state of a slot's sliding-window layers when it held exactly ``tokens``."""

    tokens: list[int]
    state: Any


class _Slot:
    """One sequence of the KV cache: the request using it, and the tokens it holds."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        self.cached: list[int] = []  # tokens whose KV is in the cache, position = index
        self.last_used = 0.0
        self.req: _Request | None = None  # None while the slot is free
        self.next_token: int | None = None  # sampled, not yet decoded
        self.draft: list[int] = []  # drafted tokens in the current batch, after next_token
        self.batch_index = -1
        self.stepped_at = 0
        """The engine's step count when this slot's request was last in a step."""
        self.checkpoints: list[_Checkpoint] = []  # the newest last
        self.spare: Any = None
        """The state of a checkpoint dropped since the last one was taken: the next one
        is saved into its memory (``Backend.seq_checkpoint``)."""
        self.checkpoint_at: int | None = None
        """Where to take the next checkpoint, once the cache holds this many tokens."""
        self.turn_start = 0
        """Where the last request in this slot began reading (its cached tokens)."""
        self.supersede: str | None = None
        """The supersede key of the last request in this slot: the next keystroke's request
        from the same editor comes back to this slot's cache."""
        self.ahead: list[int] = []
        """Tokens to read into this free slot's cache when the engine is idle: the opening
        of the next turn after a chat reply (see READ_AHEAD_IDLE_S)."""

    @property
    def running(self) -> _Request:
        """The request in this slot, which must be active (one of ``Engine._active()``):
        asking a free slot is a bug in the engine."""
        assert self.req is not None, f"slot {self.seq_id} is free"
        return self.req

    @property
    def prefilling(self) -> bool:
        return self.req is not None and len(self.cached) < len(self.req.target)

    def exchange(self, other: _Slot) -> None:
        """Trade everything but the sequence id with ``other``, whose cache has traded places
        with this one's (``Backend.seq_swap``)."""
        mine, theirs = vars(self), vars(other)
        for name in mine:
            if name != "seq_id":
                mine[name], theirs[name] = theirs[name], mine[name]


@dataclass(frozen=True)
class EngineStats:
    """Counters for /metrics and the status bar."""

    requests_total: int
    prompt_tokens_total: int
    cached_tokens_total: int
    generated_tokens_total: int
    queue_depth: int
    active: int
    n_slots: int
    last_decode_tps: float
    drafted_tokens_total: int = 0
    accepted_tokens_total: int = 0
    preemptions_total: int = 0
    read_ahead_tokens_total: int = 0
    """Tokens of next turns' openings read while idle (READ_AHEAD_IDLE_S)."""


class Engine:
    """Owns one loaded model and the worker thread that runs every request on it."""

    def __init__(
        self,
        backend: Backend,
        *,
        chat_template: ChatTemplate | None = None,
        max_queue: int = 64,
        load_ms: float = 0.0,
        chat_checkpoints: int = DEFAULT_CHAT_CHECKPOINTS,
    ) -> None:
        self.backend = backend
        self.chat_checkpoints = chat_checkpoints
        """How many checkpoints a chat's slot keeps on a window cache (the plan's)."""
        self.info: ModelInfo = backend.info
        self.max_queue = max_queue
        self.load_ms = load_ms
        self._unreported_load_ms = load_ms
        self._template = chat_template or _template_for(self.info)
        self._prompts = PromptTokenizer(
            lambda text, add_special: backend.tokenize(text, add_special=add_special),
            backend.special_piece, backend.token_bytes, backend.max_special_bytes)
        self._slots = [_Slot(i) for i in range(self.info.n_slots)]
        self._steps = 0
        self._turn_marks: tuple[list[int], list[int]] | None = None
        """(a chat prompt's last tokens, the next user turn's opening): ``_chat_turn_marks``."""
        self._turn_marks_known = False
        self._read_ahead_total = 0
        self._pending: list[_Request] = []
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
        self._last_decode_tps = 0.0
        self.thread_tuner = ThreadTuner(backend.adaptive_threads, backend.set_threads)
        """Each step's thread count, following the machine's load (see threads.py)."""
        self.drafts = DraftPolicy()
        """Which drafts each step verifies, from the step costs it measures here."""
        self._jobs: list[tuple[Callable[[], object], Future[Any]]] = []
        self._step_jobs: list[tuple[Callable[[], object], Future[Any]]] = []
        """Work for the worker between two steps, even while requests run (embeddings)."""
        self.ready = threading.Event()
        """Set once the worker has warmed the model up (load_ms then includes it), or has
        failed to: ``check()`` says which."""
        self.failed: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="localinfer-engine", daemon=True)
        self._thread.start()

    # --- submitting (any thread) --------------------------------------------------------
    def chat(
        self,
        messages: Sequence[Message],
        params: SamplingParams = DEFAULT_SAMPLING,
        *,
        priority: Priority = Priority.NORMAL,
        sink: Sink | None = None,
    ) -> Generation:
        """Generate the assistant's reply to ``messages`` with the model's chat template."""
        return self.submit(self.chat_tokens(messages), params, priority=priority, sink=sink)

    def complete(
        self,
        prompt: str,
        params: SamplingParams = DEFAULT_SAMPLING,
        *,
        priority: Priority = Priority.NORMAL,
        sink: Sink | None = None,
    ) -> Generation:
        """Continue ``prompt`` as raw text (no chat template)."""
        return self.submit(self.completion_tokens(prompt), params, priority=priority,
                           sink=sink)

    def completion_tokens(self, prompt: str) -> list[int]:
        if not prompt:
            raise InvalidRequest("prompt must not be empty.")
        return self.backend.tokenize(prompt, add_special=True)

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

    def infill_tokens(self, prefix: str, suffix: str, *, prompt: str = "",
                      extra: Sequence[FimFile] = (), n_predict: int | None = None,
                      ) -> list[int]:
        """The FIM prompt, built as llama-server's /infill builds it (see fim.py): ``extra``
        files as repo-level context (``<|file_sep|>`` for families that have it), then prefix,
        ``prompt`` (text typed at the cursor), suffix, in the family's order."""
        if self.info.fim is None:
            raise InvalidRequest(f"{self.info.name} has no fill-in-the-middle tokens; use a"
                                 " code model (e.g. qwen2.5-coder) for completions with a"
                                 " suffix.")
        return fim_prompt(self.backend, self.info, prefix, suffix, prompt=prompt,
                          extra=extra, n_predict=n_predict)

    @property
    def chat_template_source(self) -> str:
        """The Jinja source chats are rendered with (the model's, its family's, or one the
        caller gave)."""
        return self._template.source

    def render_chat(self, messages: Sequence[Message], *,
                    add_generation_prompt: bool = True,
                    tools: Sequence[dict[str, Any]] | None = None,
                    template_vars: Mapping[str, Any] | None = None) -> str:
        return self._template.render(messages, add_generation_prompt=add_generation_prompt,
                                     tools=tools, template_vars=template_vars)

    def chat_tokens(self, messages: Sequence[Message], *,
                    add_generation_prompt: bool = True,
                    tools: Sequence[dict[str, Any]] | None = None,
                    template_vars: Mapping[str, Any] | None = None) -> list[int]:
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt,
                                tools=tools, template_vars=template_vars)
        return self.prompt_tokens(text)

    def prompt_tokens(self, text: str) -> list[int]:
        """A rendered chat prompt's tokens."""
        return self._prompts.tokenize(text, add_special=self._adds_bos(text))

    def _adds_bos(self, text: str) -> bool:
        """Whether a rendered prompt needs the tokenizer's BOS: templates usually write it
        themselves; it is added only when they do not."""
        bos = self.info.bos_text
        return not (bos and text.startswith(bos))

    def tokenize(self, text: str) -> list[int]:
        return self.backend.tokenize(text, add_special=False)

    def embedding_tokens(self, text: str, *, truncate: bool = True) -> list[int]:
        """``text`` as the model reads it for an embedding: cut to the embedding context
        when ``truncate``, else refused when longer."""
        if not isinstance(text, str) or not text:
            raise InvalidRequest("an input to embed must be a non-empty string.")
        return self.embedding_input(self.backend.tokenize(text, add_special=True),
                                    truncate=truncate)

    def embedding_input(self, tokens: list[int], *, truncate: bool = True) -> list[int]:
        n_max = self.backend.n_ctx_embed
        if not tokens:
            raise InvalidRequest("an input to embed must not be empty.")
        if any(not 0 <= t < self.info.n_vocab for t in tokens):
            raise InvalidRequest(f"token ids must be between 0 and {self.info.n_vocab - 1}.")
        if len(tokens) <= n_max:
            return tokens
        if not truncate:
            raise ContextOverflow(
                f"an input is {len(tokens)} tokens but {self.info.name} embeds at most"
                f" {n_max} at a time; shorten it, or send truncate: true to cut it.",
                n_prompt=len(tokens), n_ctx=n_max)
        return tokens[:n_max]

    def embed(self, inputs: Sequence[list[int]]) -> Embeddings:
        """The model's pooled vector for each input (token lists from ``embedding_tokens``),
        as they come (not normalised). Many inputs share each decode; an embedding model pools
        as it was trained to, a generative one by the mean of its last hidden states. Runs on
        the worker between two generation steps, so streams keep flowing."""
        if not inputs:
            raise InvalidRequest("there is nothing to embed: send at least one input.")
        started = time.perf_counter()
        vectors = self._between_steps(lambda: self.backend.embed(inputs))
        return Embeddings(vectors=vectors, prompt_tokens=sum(len(t) for t in inputs),
                          total_ms=(time.perf_counter() - started) * 1000.0)

    def _between_steps(self, fn: Callable[[], T]) -> T:
        future: Future[T] = Future()
        with self._cv:
            self._check_open()
            self._step_jobs.append((fn, future))
            self._cv.notify()
        return future.result()

    def tool_format(self) -> ToolFormat:
        """How this model writes a tool call; InvalidRequest (a clear 400) for a model whose
        template has no tools, or writes them in a format localinfer does not parse."""
        if not self._template.supports_tools:
            raise InvalidRequest(f"{self.info.name}'s chat template has no tool support, so"
                                 " it was not taught to call functions: send the request"
                                 " without 'tools', or use a model that has it (qwen3,"
                                 " llama3.1, mistral...).")
        return detect_format(self._template.source)

    def submit(
        self,
        prompt: list[int],
        params: SamplingParams = DEFAULT_SAMPLING,
        *,
        priority: Priority = Priority.NORMAL,
        sink: Sink | None = None,
    ) -> Generation:
        params = params.validate().bounded(self.info.n_ctx, self.info.n_vocab)
        if params.grammar is not None:
            self.backend.check_grammar(params.grammar)
        n_ctx = self.info.n_ctx
        if self.info.embedding_only:
            raise InvalidRequest(f"{self.info.name} is an embedding model: it returns vectors"
                                 " and generates no text. Use /api/embed or /v1/embeddings,"
                                 " or a chat or code model here.")
        if not prompt:
            raise InvalidRequest("the prompt is empty after tokenization.")
        if len(prompt) >= n_ctx:
            raise ContextOverflow(
                f"the prompt is {len(prompt)} tokens but the context window is {n_ctx} tokens"
                " (and at least one token must be left to generate). Shorten the prompt, start"
                " a new chat, or load the model with a larger context (--ctx).",
                n_prompt=len(prompt),
                n_ctx=n_ctx,
            )
        generation = Generation(self, sink)
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        request = _Request(
            id=next(self._ids),
            prompt=list(prompt),
            params=params,
            priority=priority,
            generation=generation,
            seed=seed,
            t_submit=time.perf_counter(),
            assembler=TextAssembler(params.stop, min_indent=params.n_indent),
            target=list(prompt),
        )
        generation.request = request
        if params.supersede is not None:
            self._supersede(params.supersede)
        with self._cv:
            self._check_open()
            if len(self._pending) >= self.max_queue:
                raise Busy(
                    f"{len(self._pending)} requests are already waiting; try again shortly."
                )
            heapq.heappush(self._pending, request)
            self._requests_total += 1
            self._cv.notify()
        return generation

    def _supersede(self, key: str) -> None:
        """Cancel the requests a new one with this key replaces (each ends within a token,
        its slot free for the new one; its KV cache stays for the new one's shared prefix)."""
        with self._cv:
            older = [r for r in self._pending if r.params.supersede == key] + [
                s.req for s in self._slots
                if s.req is not None and s.req.params.supersede == key]
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
                active=sum(1 for s in self._slots if s.req is not None),
                n_slots=len(self._slots),
                last_decode_tps=self._last_decode_tps,
                drafted_tokens_total=self._drafted_total,
                accepted_tokens_total=self._accepted_total,
                preemptions_total=self._preemptions_total,
                read_ahead_tokens_total=self._read_ahead_total,
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
                    self.backend.seq_trim(slot.seq_id, 0)
                    slot.cached.clear()
                    slot.checkpoints, slot.spare = [], None
                    slot.ahead = []

        self.run_on_worker(clear)

    def measure_decode_step(self, n_steps: int = 32) -> float:
        """The bare llama_decode rate for one sequence, in steps per second: a single token
        per step with its logits, no sampling, no Python bookkeeping around it. The yardstick
        for the engine's own decode rate."""

        def measure() -> float:
            slot = self._slots[0]
            self.backend.seq_trim(slot.seq_id, 0)
            slot.cached.clear()
            slot.ahead = []
            token = self.backend.tokenize("Hello", add_special=True)[-1]
            times = []
            try:
                for pos in range(n_steps + 1):
                    started = time.perf_counter()
                    self.backend.decode([token], [pos], [slot.seq_id], [True])
                    times.append(time.perf_counter() - started)
            finally:
                self.backend.seq_trim(slot.seq_id, 0)
            times = sorted(times[1:])
            return 1.0 / times[len(times) // 2]

        return self.run_on_worker(measure)

    def cancel_all(self) -> None:
        """Cancel every waiting and running request; each ends within one token."""
        with self._cv:
            requests = list(self._pending) + [s.req for s in self._slots if s.req is not None]
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
                generation._emit(_done(request, "cancelled", time.perf_counter()))
            self._cv.notify()

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
                    self._read_ahead()
                    continue
                # Cancelled requests leave first: a superseding keystroke's request then finds
                # the slot (and cache) of the one it cancelled free.
                for slot in self._active():
                    if slot.running.generation.cancelled:
                        self._finish(slot, "cancelled", time.perf_counter())
                with self._cv:
                    self._admit()
                self._compact()
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

    def _post(self, request: _Request, event: Event | BaseException) -> None:
        self._outbox.append((request.generation, event))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        for generation, event in outbox:
            generation._emit(event)

    def _active(self) -> list[_Slot]:
        return [s for s in self._slots if s.req is not None]

    def _admit(self) -> None:
        """Move waiting requests into free slots, reusing the best-matching cached prefix.
        An interactive request that finds every slot busy takes one from a lower-priority
        request, which goes back to the queue and resumes later where it stopped."""
        cancelled = [r for r in self._pending if r.generation.cancelled]
        if cancelled:  # preempted, then cancelled while waiting: end them now
            self._pending = [r for r in self._pending if not r.generation.cancelled]
            heapq.heapify(self._pending)
            for request in cancelled:
                self._free_sampler(request)
                self._post(request, _done(request, "cancelled", time.perf_counter()))
        if self._pending and not any(s.req is None for s in self._slots):
            self._preempt_for(self._pending[0])
        free = [s for s in self._slots if s.req is None]
        while self._pending and free:
            request = heapq.heappop(self._pending)
            target = request.target
            slot = max(free, key=lambda s: _slot_score(s, request))
            free.remove(slot)
            slot.supersede = request.params.supersede
            slot.ahead = []  # the request's own prompt decides what this cache holds
            # In its slot first: should anything below fail, _fail_all finds it there.
            slot.req, slot.next_token = request, None
            # The last REREAD_TAIL tokens are always read again (at least the last one must
            # be, for its logits): then the last token's logits come from a batch of as many
            # rows as when the prompt is read cold, and a cached prompt gives the same greedy
            # text as a cold one (see REREAD_TAIL).
            common = common_prefix(slot.cached, target)
            n_keep = self._cut(slot, min(common, max(0, len(target) - REREAD_TAIL)), target)
            del slot.cached[n_keep:]
            slot.turn_start = n_keep
            kept: list[_Checkpoint] = []
            dropped: list[_Checkpoint] = []
            for c in slot.checkpoints:  # those of another prompt go
                (kept if c.tokens == target[:len(c.tokens)] else dropped).append(c)
            if dropped:
                slot.checkpoints, slot.spare = kept, dropped[-1].state  # the newest: largest
            slot.checkpoint_at = None
            if request.params.supersede is None and self.backend.cut_reach:
                self._chat_checkpoints(slot, n_keep, len(request.prompt) - REREAD_TAIL)
            if request.params.supersede is not None and self.backend.needs_checkpoints and \
                    common >= CHECKPOINT_MIN_TOKENS:
                # An autocomplete request: the next keystroke's prompt differs from this one
                # at or after where this one differs from the last (the cursor moves on), so
                # the cache as it is there is worth keeping.
                slot.checkpoint_at = common
                self._take_checkpoint(slot)
            if request.sampler is None:  # first admission (not a resumption)
                request.t_start = time.perf_counter()
                request.n_cached = n_keep
                request.load_ms, self._unreported_load_ms = self._unreported_load_ms, 0.0
                params = request.params
                request.sampler = self.backend.new_sampler(params, request.seed)
                if params.penalized:
                    self.backend.accept(request.sampler,
                                        request.prompt[-params.repeat_last_n:])
                if params.speculative is not False:
                    request.lookup = PromptLookup(request.prompt, self.drafts.acceptance)
                self._prompt_tokens_total += len(request.prompt)
                self._cached_tokens_total += n_keep

    def _compact(self) -> None:
        """Keep the running sequences' ids consecutive. With a KV cache split by sequence,
        llama.cpp computes consecutive sequences' rows in one graph and every other run of
        them in a graph of its own (speculate.graph_rows), which reads every weight again:
        four sequences in slots 0, 2, 4 and 6 decode 1.55x slower than in slots 0-3 (starter,
        2-core AVX2). So a running sequence outside the block trades caches with an idle slot
        inside it, choosing the block that copies the fewest cached tokens: a copy of each
        (a few ms for a few thousand tokens), once, and the idle cache is kept."""
        running = [s.seq_id for s in self._slots if s.req is not None]
        k = len(running)
        if k < 2 or running[-1] - running[0] + 1 == k:
            return

        def copied(start: int) -> int:
            return sum(len(s.cached) for s in self._slots
                       if (s.req is not None) != (start <= s.seq_id < start + k))

        start = min(range(len(self._slots) - k + 1), key=copied)
        outside = [s for s in self._slots
                   if s.req is not None and not start <= s.seq_id < start + k]
        holes = [s for s in self._slots if s.req is None and start <= s.seq_id < start + k]
        for slot, hole in zip(outside, holes, strict=True):
            try:
                swapped = self.backend.seq_swap(slot.seq_id, hole.seq_id)
            except WorkerLost:
                raise  # the model's process is gone: stop (``failed``), the owner reloads it
            except LocalInferError as exc:  # nothing moved: the sequences decode apart
                log.warning("could not move a sequence's cache: %s", exc)
                return
            slot.exchange(hole)
            if not swapped:  # both caches are gone: the request reads its tokens back
                log.warning("could not move a sequence's cache; reading it again")
                for lost in (slot, hole):
                    lost.cached.clear()
                    lost.checkpoints, lost.spare = [], None
                    lost.ahead = []
                request = hole.running
                request.target = request.prompt + request.generated
                hole.next_token = None

    def _cut(self, slot: _Slot, n_keep: int, target: list[int]) -> int:
        """Cut the slot's cache to ``n_keep`` tokens, or to its longest checkpoint within
        them where a sliding window cannot be cut there: how many tokens it keeps."""
        fits = [c for c in slot.checkpoints
                if 0 < len(c.tokens) <= n_keep and c.tokens == target[:len(c.tokens)]]
        if fits:
            best = max(fits, key=lambda c: len(c.tokens))
            return self.backend.seq_restore(slot.seq_id, n_keep, len(best.tokens), best.state)
        return self.backend.seq_trim(slot.seq_id, n_keep)

    def _take_checkpoint(self, slot: _Slot) -> None:
        if slot.checkpoint_at == len(slot.cached):
            slot.checkpoint_at = None
            if not slot.checkpoints or slot.checkpoints[-1].tokens != slot.cached:
                self._checkpoint(slot)

    def _checkpoint(self, slot: _Slot) -> None:
        """Save the slot's window layers as they are now, into the memory of the oldest
        checkpoint, which this one replaces, or of one dropped before."""
        # One a slot where only autocomplete keeps them (a large model's: ~120 MB each).
        keep = self.chat_checkpoints if self.backend.cut_reach else 1
        reuse, slot.spare = slot.spare, None
        if len(slot.checkpoints) >= keep:
            reuse = slot.checkpoints[0].state
            slot.checkpoints = slot.checkpoints[len(slot.checkpoints) - keep + 1:]
        try:
            state = self.backend.seq_checkpoint(slot.seq_id, reuse)
        except WorkerLost:
            raise  # the model's process is gone: stop (``failed``), the owner reloads it
        except LocalInferError as exc:  # out of memory: the cache goes on without one
            log.warning("could not save a checkpoint of a sequence's cache: %s", exc)
            return
        slot.checkpoints = [*slot.checkpoints, _Checkpoint(list(slot.cached), state)]

    def _chat_checkpoints(self, slot: _Slot, n_keep: int, reply_start: int) -> None:
        """Checkpoints of a request that is not an autocomplete, on a window cache that can
        be cut back only ``Backend.cut_reach`` tokens: one where its reading begins
        (``n_keep``, now, before its first chunk) and, for a prompt longer than the reach,
        one where its reply will (``reply_start``: its last chunk then starts there). After
        a chat reply the first is taken while the engine is idle, once the next turn's opening
        is read (``_read_ahead``): a turn that comes later finds it held.

        After a reply longer than the reach, the window has moved past both: a regenerated
        reply, an edited last message or a template that drops the last reasoning would
        read the whole conversation again (927-981 ms against 40-41 for the starter's
        616-token chat asked again after a 300-token reply). llama.cpp saves only the cells
        in the window, so a checkpoint returns to its own length only, as llama-server's
        context checkpoints do: the turn's beginning, from which a short message is read
        again, and the reply's beginning, which costs the prompt's reading one more step.
        A slot keeps ``chat_checkpoints`` (the planner's, which the plan counts).

        A checkpoint held up to REREAD_TAIL tokens before ``n_keep`` serves as the turn's:
        restored, it reads those few tokens again with the rest, as a cached prompt's tail
        is read again anyway, where taking another costs every such turn a copy of the
        window (0.6-1.2 ms for the starter) before its first token. Questions asked in turn
        after one conversation, which share a first word or two, take one checkpoint."""
        def held(lo: int, hi: int) -> bool:
            return any(lo <= len(c.tokens) <= hi for c in slot.checkpoints)

        if n_keep >= CHECKPOINT_MIN_TOKENS and not held(n_keep - REREAD_TAIL, n_keep):
            self._checkpoint(slot)
        if reply_start - n_keep > self.backend.cut_reach and \
                not held(reply_start, reply_start):
            slot.checkpoint_at = reply_start

    def _preempt_for(self, waiting: _Request) -> None:
        if waiting.priority != Priority.INTERACTIVE:
            return
        victims = [s for s in self._active() if s.running.priority > waiting.priority]
        if not victims:
            return
        # The lowest priority first; among equals the one that started last loses least.
        slot = max(victims, key=lambda s: (int(s.running.priority), s.running.t_start))
        request = slot.running
        # Everything generated so far is already streamed; it resumes by reading it back
        # (mostly from this slot's cache, if nobody overwrote it) and sampling on.
        request.target = request.prompt + request.generated
        self._preemptions_total += 1
        slot.req = None
        slot.next_token = None
        slot.last_used = time.perf_counter()
        heapq.heappush(self._pending, request)

    def _step(self) -> None:
        """Build one batch from the active slots (the decoding ones that ``_stepping`` picks),
        decode it, and sample."""
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        outputs: list[bool] = []
        budget = self.backend.n_batch
        active = self._active()
        decoding = [s for s in active if not s.prefilling]
        # While a prompt is being read, every decoding slot steps and none drafts: the step
        # costs what the prompt's rows cost.
        reading = len(decoding) < len(active)
        if not reading:
            decoding = self._stepping(decoding)
        self._choose_drafts(decoding, reading)
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

        chunk_cap = PREFILL_CHUNK_WHILE_DECODING if decoding else budget
        prefilling = sorted((s for s in active if s.prefilling), key=lambda s: s.running)
        chunks: list[tuple[_Slot, int]] = []
        for slot in prefilling:
            start = len(slot.cached)
            target = slot.running.target
            n = min(len(target) - start, budget, chunk_cap)
            if n <= 0:
                break
            if slot.checkpoint_at is not None and start < slot.checkpoint_at:
                n = min(n, slot.checkpoint_at - start)  # the chunk ends at the checkpoint
            last = start + n == len(target)
            tokens.extend(target[start : start + n])
            positions.extend(range(start, start + n))
            seq_ids.extend([slot.seq_id] * n)
            outputs.extend([False] * (n - 1) + [last])
            slot.batch_index = len(tokens) - 1
            chunks.append((slot, n))
            budget -= n
            chunk_cap -= n

        # Hand over the previous step's events now: the consumers' threads then run while
        # llama_decode computes (it releases the GIL), not while this thread needs it.
        self._flush()
        started = time.perf_counter()
        try:
            with self.thread_tuner.step(len(tokens)):
                self.backend.decode(tokens, positions, seq_ids, outputs)
        except LocalInferError as exc:
            log.error("decode failed: %s", exc)
            for slot in decoding + [s for s, _ in chunks]:
                self._abort(slot, exc)
            if isinstance(exc, WorkerLost):
                raise  # the model's process is gone: stop (``failed``), the owner reloads it
            return

        now = time.perf_counter()
        self._steps += 1
        for slot in decoding + [s for s, _ in chunks]:
            slot.stepped_at = self._steps
        if not chunks:  # a step of decode rows alone: what drafting is weighed against
            self.drafts.costs.record(
                graph_rows([(s.seq_id, 1 + len(s.draft)) for s in decoding]), now - started)
        for slot in decoding:
            self._verify(slot, now)
        for slot, n in chunks:
            start = len(slot.cached)
            slot.cached.extend(slot.running.target[start : start + n])
            self._take_checkpoint(slot)
            if not slot.prefilling:
                token = self._sample_or_abort(slot, slot.batch_index)
                if token is not None:
                    self._on_token(slot, token, now)

    def _stepping(self, decoding: list[_Slot]) -> list[_Slot]:
        """The decoding slots that take this step: all, or those that waited longest where
        fewer rows give more tokens per second (see speculate.DraftPolicy.stepping)."""
        if len(decoding) < 2:
            return decoding
        chosen = self.drafts.stepping([s.seq_id for s in decoding],
                                      [self._steps - s.stepped_at for s in decoding])
        return [decoding[i] for i in chosen]

    def _choose_drafts(self, decoding: list[_Slot], reading: bool) -> None:
        """Set each decoding slot's draft for this step: what its prompt lookup proposes, where
        the step's expected tokens per second gain by it (see speculate.DraftPolicy); a draft
        not verified is checked as a shadow draft. Drafts only while the batch stays small
        enough for the single-row kernels (see speculate.py): not while a prompt is being read
        (``reading``)."""
        for slot in decoding:
            slot.draft = []
        if reading:
            return
        budget = min(EXACT_ROWS, self.backend.n_batch) - len(decoding)
        if budget <= 0:
            return
        proposals: list[Draft | None] = []
        for slot in decoding:
            lookup = slot.running.lookup
            room = min(budget, MAX_DRAFT, self.info.n_ctx - 1 - len(slot.cached))
            draft = lookup.draft(room) if lookup is not None else []
            proposals.append(Draft(draft, lookup.acceptance,
                                   forced=slot.running.params.speculative is True,
                                   preferred=lookup.draft_len)
                             if lookup is not None and draft else None)
        if not any(proposals):
            return
        lengths = self.drafts.choose([s.seq_id for s in decoding], proposals, budget)
        for slot, proposal, k in zip(decoding, proposals, lengths, strict=True):
            if proposal is None:
                continue
            if k:
                slot.draft = list(proposal.tokens[:k])
            else:
                lookup = slot.running.lookup
                assert lookup is not None  # it proposed the draft
                lookup.shadow(list(proposal.tokens[:proposal.suggested]))

    def _verify(self, slot: _Slot, now: float) -> None:
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

    def _sample_or_abort(self, slot: _Slot, index: int) -> int | None:
        """The running request's next token, or None when its sampler cannot go on (a
        grammar that allows no token here): that request ends with the error, the rest of
        the batch goes on."""
        try:
            return self._sample(slot.running, index)
        except LocalInferError as exc:
            log.info("a request's sampling failed: %s", exc)
            self._abort(slot, exc)
            return None

    def _sample(self, request: _Request, index: int) -> int:
        """Sample batch entry ``index`` with the request's sampler; with its log-probability
        when asked for (taken from the logits before sampling: the argmax shortcut and the
        native chain both leave the model's distribution behind them)."""
        n_top = request.params.logprobs
        if n_top is None:
            return self.backend.sample(request.sampler, index)
        row = self.backend.raw_logits(index)
        distribution = Distribution(row, n_top)
        token = self.backend.sample(request.sampler, index)
        if not self.backend.is_eog(token):  # the end of a turn is no part of the reply
            # The sampled token's own logit is as it was: the argmax shortcut overwrites only
            # the never-sampled tokens' logits.
            request.logprobs.append(distribution.entry(token, float(row[token]),
                                                       self.backend.token_bytes))
        return token

    def _on_token(self, slot: _Slot, token: int, now: float) -> bool:
        """Record a sampled token; False when the generation has ended."""
        request = slot.running
        request.generated.append(token)
        if request.lookup is not None:
            request.lookup.extend([token])
        if request.n_generated == 1:
            request.t_first = now
        request.t_last = now
        if self.backend.is_eog(token):
            self._finish(slot, "stop", now)
            return False
        text = request.assembler.push(self.backend.token_bytes(token))
        if text:
            self._post(request, Token(text, _live(request, now), request.unsent_logprobs()))
        limit_ms = request.params.t_max_predict_ms
        if limit_ms and "\n" in text and (now - request.t_first) * 1000.0 > limit_ms:
            self._finish(slot, "length", now)  # autocomplete's time limit, at a line's end
        elif request.assembler.stopped:
            self._finish(slot, "length" if request.assembler.indent_stopped else "stop", now)
        elif request.params.max_tokens is not None and \
                request.n_generated >= request.params.max_tokens:
            self._finish(slot, "length", now)
        elif len(slot.cached) >= self.info.n_ctx:
            self._finish(slot, "length", now)  # no room left to decode this token
        else:
            slot.next_token = token
            return True
        return False

    def _finish(self, slot: _Slot, reason: FinishReason, now: float) -> None:
        request = slot.running
        rest = request.assembler.flush()
        if rest:
            self._post(request, Token(rest, _live(request, now), request.unsent_logprobs()))
        done = _done(request, reason, now)
        self._generated_tokens_total += request.n_generated
        if done.timings.decode_tokens:
            self._last_decode_tps = done.timings.decode_tps
        self._release(slot, now)
        slot.ahead = self._next_turn_opening(slot, request, reason)
        self._post(request, done)

    def _next_turn_opening(self, slot: _Slot, request: _Request, reason: FinishReason
                           ) -> list[int]:
        """What to read into a finished chat request's slot ahead of the next turn: the
        template's opening of the next user turn (and the reply's last token where
        max_tokens cut it: sampled, not yet decoded). Nothing where the client's next prompt
        will not repeat this cache: a reply cut by a stop string (the client gets it without
        the stop text), one made under a grammar (tool calls come back rendered in another
        form), one ending in white space (templates trim it), a cancelled one."""
        generated = request.generated
        if not generated or request.params.grammar is not None:
            return []
        if reason == "stop" and self.backend.is_eog(generated[-1]):
            reply, unread = generated[:-1], []
        elif reason == "length" and request.params.max_tokens == len(generated):
            reply, unread = generated, generated[-1:]
        else:
            return []
        if not reply or len(slot.cached) != len(request.prompt) + len(reply) - len(unread):
            return []
        last = self.backend.token_bytes(reply[-1])
        marks = self._chat_turn_marks()
        if marks is None or not last or last != last.rstrip():
            return []
        generation, opening = marks
        if request.prompt[-len(generation):] != generation:
            return []  # not a chat prompt (a completion, an infill)
        ahead = unread + opening
        fits = len(slot.cached) + len(ahead) < self.info.n_ctx and \
            len(ahead) <= self.backend.n_batch
        return ahead if fits else []

    def _chat_turn_marks(self) -> tuple[list[int], list[int]] | None:
        """(the tokens the template ends a chat prompt with, the tokens it opens the next
        user turn with after a reply), worked out once by rendering a made-up chat; None
        where the template cannot render it or where those texts do not tokenize the same
        alone as in a prompt (the opening must start with a special token: then the reply
        before it cannot merge into it)."""
        if self._turn_marks_known:
            return self._turn_marks
        self._turn_marks_known = True
        first, reply, question = "LocalinferFirst", "LocalinferReply", "LocalinferQuestion"
        try:
            user = [Message("user", first)]
            asked = self.render_chat(user)
            told = self.render_chat(user, add_generation_prompt=False)
            chat = self.render_chat(user + [Message("assistant", reply),
                                            Message("user", question)])
        except Exception as exc:  # noqa: BLE001 - a template's own error: no read-ahead
            log.debug("no next-turn read-ahead: the template cannot render a chat (%s)", exc)
            return None
        end, start = chat.find(reply) + len(reply), chat.find(question)
        if not asked.startswith(told) or asked == told or chat.find(reply) < 0 or start <= end:
            return None
        tokens = self._uncached_prompt_tokens
        generation = self.backend.tokenize(asked[len(told):], add_special=False)
        opening = self.backend.tokenize(chat[end:start], add_special=False)
        head = tokens(chat[:end])
        if (not generation or not opening or tokens(asked)[-len(generation):] != generation
                or self.backend.special_piece(opening[0]) is None
                or tokens(chat)[:len(head) + len(opening)] != head + opening):
            return None
        self._turn_marks = (generation, opening)
        return self._turn_marks

    def _uncached_prompt_tokens(self, text: str) -> list[int]:
        """``prompt_tokens`` without keeping the prompt for reuse (a made-up one)."""
        return self.backend.tokenize(text, add_special=self._adds_bos(text))

    def _read_ahead(self) -> None:
        """Read idle slots' ``ahead`` tokens into their caches, in one step of at most a
        batch (no logits, no thread-count measurement: not a step like the others); any
        left over wait for the next idle moment."""
        slots = []
        room = self.backend.n_batch
        for slot in self._slots:
            if slot.req is None and slot.ahead and len(slot.ahead) <= room:
                # A request that ended inside a draft leaves its rejected tokens' cells.
                kept = self.backend.seq_trim(slot.seq_id, len(slot.cached))
                if kept == len(slot.cached):
                    slots.append(slot)
                    room -= len(slot.ahead)
                else:  # a sliding window cut back further: the next request reads it
                    del slot.cached[kept:]
                    slot.ahead = []
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        for slot in slots:
            start = len(slot.cached)
            tokens.extend(slot.ahead)
            positions.extend(range(start, start + len(slot.ahead)))
            seq_ids.extend([slot.seq_id] * len(slot.ahead))
        if not tokens:
            return
        try:
            self.backend.decode(tokens, positions, seq_ids, [False] * len(tokens))
        except WorkerLost:
            raise  # the model's process is gone: stop (``failed``), the owner reloads it
        except LocalInferError as exc:  # what these caches hold is unknown now: drop them
            log.warning("could not read the next turn's opening ahead: %s", exc)
            for slot in slots:
                self.backend.seq_trim(slot.seq_id, 0)
                slot.cached.clear()
                slot.ahead = []
            return
        for slot in slots:
            slot.cached.extend(slot.ahead)
            slot.ahead = []
            # Where the next turn's reading begins: taken now, not on its way to its first
            # token (see _chat_checkpoints); not in place of one of the last turn's own (a
            # long message's start and its reply's), which an edited message needs.
            if self.backend.cut_reach and len(slot.cached) >= CHECKPOINT_MIN_TOKENS and (
                    len(slot.checkpoints) < self.chat_checkpoints
                    or len(slot.checkpoints[0].tokens) < slot.turn_start):
                self._checkpoint(slot)
        self._read_ahead_total += len(tokens)

    def _abort(self, slot: _Slot, exc: BaseException) -> None:
        """A decode failed: the slot's cache state is unknown, so drop it and fail the request."""
        request = slot.running
        self.backend.seq_trim(slot.seq_id, 0)
        slot.cached.clear()
        self._release(slot, time.perf_counter())
        self._post(request, exc)

    def _release(self, slot: _Slot, now: float) -> None:
        if slot.req is not None:
            self._free_sampler(slot.req)
        slot.req = None
        slot.next_token = None
        slot.draft = []
        slot.last_used = now

    def _fail_all(self, exc: BaseException) -> None:
        self._flush()
        error = LocalInferError(f"the engine stopped unexpectedly: {exc}")
        with self._cv:
            pending, self._pending = self._pending, []
            jobs, self._jobs = self._jobs + self._step_jobs, []
            self._step_jobs = []
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

    def _free_sampler(self, request: _Request) -> None:
        if request.sampler is not None:
            try:
                self.backend.free_sampler(request.sampler)
            finally:
                request.sampler = None

    def _shutdown(self) -> None:
        now = time.perf_counter()
        with self._cv:
            pending, self._pending = self._pending, []
            jobs, self._jobs = self._jobs + self._step_jobs, []
            self._step_jobs = []
        for request in pending:
            self._free_sampler(request)  # a preempted request still holds its sampler
            self._post(request, _done(request, "cancelled", now))  # after its last tokens
        for slot in self._active():
            self._finish(slot, "cancelled", now)
        for _, future in jobs:
            future.set_exception(Busy("the engine is shutting down."))


def _template_for(info: ModelInfo) -> ChatTemplate:
    tokens = {"bos_token": info.bos_text, "eos_token": info.eos_text}
    if info.chat_template:
        return ChatTemplate(info.chat_template, **tokens)
    return ChatTemplate.named("chatml", **tokens)  # the loader found no better one


def _slot_score(slot: _Slot, request: _Request) -> tuple[bool, bool, int, float]:
    """Which free slot a request should take: the one its editor's previous keystroke used
    (an autocomplete prompt shares its prefix, often less than half of it, and the checkpoint
    there), else one whose cached tokens it mostly shares or that holds its whole prompt (the
    longest such prefix wins), else the least recently used, so that a small shared prefix (a
    common system prompt) does not evict a long cached conversation. A prompt cached whole is
    one asked again (a regenerated reply, a client retrying, several clients asking alike):
    what it drops there is the reply that followed it, which the asker is replacing.
    (llama-server takes the slot holding the largest share of a new prompt, and keeps what it
    drops in host memory.)"""
    key = request.params.supersede
    target = request.target
    common = common_prefix(slot.cached, target)
    keeps_most = 2 * common >= len(slot.cached) or (common > 0 and common == len(target))
    return (key is not None and slot.supersede == key, keeps_most,
            common if keeps_most else 0, -slot.last_used)


def _live(request: _Request, now: float) -> LiveStats:
    prefill_ms = (request.t_first - request.t_start) * 1000.0
    decode_s = now - request.t_first
    return LiveStats(
        n_tokens=request.n_generated,
        ttft_ms=(request.t_first - request.t_submit) * 1000.0,
        prefill_tps=(len(request.prompt) - request.n_cached) * 1000.0 / prefill_ms
        if prefill_ms > 0 else 0.0,
        decode_tps=(request.n_generated - 1) / decode_s if decode_s > 0 else 0.0,
    )


def _done(request: _Request, reason: FinishReason, now: float) -> Done:
    started = request.t_start > 0
    first = request.n_generated > 0
    timings = Timings(
        load_ms=request.load_ms,
        queue_ms=((request.t_start if started else now) - request.t_submit) * 1000.0,
        prompt_tokens=len(request.prompt),
        cached_tokens=request.n_cached,
        prefill_tokens=len(request.prompt) - request.n_cached if first else 0,
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
    return Done(request.assembler.text, reason, usage, timings, tuple(request.logprobs))
