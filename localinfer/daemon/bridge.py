"""Carrying the core's blocking work into the event loop: a generation (on the engine's worker
thread) and a pull (on a thread of its own) both hand their items over through one
``ThreadBridge``.

Items are handed to the loop with ``call_soon_threadsafe``. A generation is submitted when
its ``EventStream`` is created, so a bad request (a prompt longer than the context, a full
queue) fails before any response is sent. If the consumer goes away (the client disconnected,
the task was cancelled), the work is cancelled: the engine stops a generation within one
token, freeing its slot; a pull stops within a chunk and keeps its partial file.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from ..errors import Cancelled
from ..runtime.engine import Engine, Generation, Sink
from ..runtime.types import Done, Event, Priority, SamplingParams
from ..store import HubTarget, ModelStore, PullProgress, PullTarget, pull_model
from .error_replies import ClientLeft
from .guard import RECEIVED_AT
from .manager import LoadedModel, ModelManager
from .requests import SMALL_BODY, with_model_defaults
from .state import DaemonState

log = logging.getLogger(__name__)
T = TypeVar("T")
_END = object()


class ThreadBridge(Generic[T]):
    """Items a worker thread makes, iterated in the event loop in order. The worker calls
    ``put`` for each item and ``end`` once; the loop's side iterates, and when it stops early
    (or is cancelled) the work is cancelled. Subclasses say how in ``cancel``."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def put(self, item: T) -> bool:
        """Hand one item over (from the worker thread); False when nobody listens any more
        (the event loop is closed)."""
        return self._send(item)

    def end(self, error: BaseException | None = None) -> bool:
        """No more items: the work is done, or failed with ``error`` (raised in the loop)."""
        return self._send(_END if error is None else error)

    def _send(self, item: Any) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed
            return False
        return True

    def cancel(self) -> None:
        """Stop the work; safe to call again, or once it has ended."""
        raise NotImplementedError

    @property
    def waiting(self) -> bool:
        """Whether an item (or the end, or an error) waits to be read."""
        return not self._queue.empty()

    async def __aiter__(self) -> AsyncIterator[T]:
        try:
            while True:
                item = await self._queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()

    async def last(self) -> T | None:
        """Every item until the end; the last one (None if there was none)."""
        final: T | None = None
        async for item in self:
            final = item
        return final

    async def drain(self, request: Request) -> T | None:
        """Every item until the end (a non-streaming response), cancelled if the client
        disconnects while it waits; the last item."""
        return await unless_disconnected(request, self.last(), self.cancel)


class EventStream(ThreadBridge[Event]):
    """A generation's events, from the engine's worker thread."""

    def __init__(self, submit: Callable[[Sink], Generation]) -> None:
        super().__init__()
        self.generation = submit(self._sink)
        self.others: list[EventStream] = []
        """The other completions of the same prompt (``start_generation``'s ``copies``)."""

    def _sink(self, event: Event | BaseException) -> None:
        if isinstance(event, BaseException):
            heard = self.end(event)
        else:
            heard = self.put(event)
            if isinstance(event, Done):
                self.end()
        if not heard:  # nobody is listening any more: the worker drops the request
            self.generation.cancelled = True

    def cancel(self) -> None:
        if self.generation.done is None:
            self.generation.cancel()


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Choices:
    """The streams of one request's choices (a stream and its ``others``: ``n``,
    ``n_cmpl``), in order, cancelled together."""

    def __init__(self, events: EventStream) -> None:
        self.streams = [events, *events.others]

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()


async def merged(sources: Sequence[AsyncIterable[T]]) -> AsyncIterator[tuple[int, T]]:
    """The items of several async iterators as they come (each choice of a streamed reply),
    each with its source's index. An error raised by one ends them all and is raised here;
    so does stopping early (the client left)."""
    if len(sources) == 1:  # one choice: no task between it and the client
        async for item in sources[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(index: int, source: AsyncIterable[T]) -> None:
        try:
            async for item in source:
                queue.put_nowait((index, item))
        except Exception as exc:
            queue.put_nowait((index, _Raised(exc)))
        finally:
            queue.put_nowait((index, _END))

    tasks = [asyncio.ensure_future(pump(i, source)) for i, source in enumerate(sources)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, _Raised):
                raise item.error
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # their sources' cleanup runs


@dataclasses.dataclass(frozen=True)
class _Raised:
    error: Exception


class PullJob:
    """A pull running on its own thread, its progress handed to every request that asked for
    it: a second /api/pull of a model being pulled joins the first and streams the same
    progress (as Ollama does). When the last of them goes away (the clients left) or the
    daemon shuts down, the download stops within a chunk; the partial file stays."""

    running: ClassVar[set[PullJob]] = set()
    """Pulls whose thread has not finished."""

    def __init__(self, store: ModelStore, target: PullTarget | HubTarget) -> None:
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._listeners: list[PullListener] = []
        self._last: PullProgress | None = None
        self._finished = False
        self._store = store
        self.target = target
        PullJob.running.add(self)

    @classmethod
    def follow(cls, store: ModelStore, target: PullTarget | HubTarget) -> PullListener:
        """Listen to the running pull of ``target``, or start one (in the event loop)."""
        for job in list(cls.running):
            if job.target.name == target.name:
                listener = job._add()
                if listener is not None:
                    return listener
        job = cls(store, target)
        listener = job._add()
        assert listener is not None  # a new job
        threading.Thread(target=job._run, name=f"pull {target.name}", daemon=True).start()
        return listener

    @classmethod
    def cancel_all(cls) -> None:
        """Stop every pull (the daemon shuts down): each request gets its error at once, even
        from a stalled download, and the thread stops at its next chunk; thread-safe."""
        for job in list(cls.running):
            with job._lock:
                job._cancel.set()
                listeners, job._listeners = job._listeners, []
            name = job.target.name
            for listener in listeners:
                listener.end(Cancelled(
                    f"the daemon is shutting down: the pull of {name} stopped. Its partial"
                    f" download is kept: `localinfer pull {name}` resumes it."))

    def _add(self) -> PullListener | None:
        with self._lock:
            if self._finished or self._cancel.is_set():
                return None
            listener = PullListener(self)
            self._listeners.append(listener)
            if self._last is not None:  # where the pull is now
                listener.put(self._last)
            return listener

    def _remove(self, listener: PullListener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)
            if not self._listeners:
                self._cancel.set()  # nobody waits for it any more

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            pull_model(self._store, self.target, progress=self._progress,
                       cancel=self._cancel)
        except BaseException as exc:  # noqa: BLE001 - handed to the requests, raised there
            error = exc
        with self._lock:
            self._finished = True
            listeners = list(self._listeners)
            PullJob.running.discard(self)
        for listener in listeners:
            listener.end(error)

    def _progress(self, step: PullProgress) -> None:
        with self._lock:
            self._last = step
            listeners = list(self._listeners)
        heard = [listener.put(step) for listener in listeners]
        if listeners and not any(heard):  # the event loop is gone
            self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()


class PullListener(ThreadBridge[PullProgress]):
    """One request's view of a ``PullJob``: its progress, then its end or its error."""

    def __init__(self, job: PullJob) -> None:
        super().__init__()
        self.job = job

    def cancel(self) -> None:
        self.job._remove(self)  # the last one to leave stops the download


QUICK_ENCODE_S = 0.002
"""A small request's prompt is rendered and tokenized on the event loop when the model's last
small one took less than this (``_encoded``)."""
_encodes_quickly: weakref.WeakKeyDictionary[Engine, bool] = weakref.WeakKeyDictionary()


async def _encoded(encode: Callable[[Engine], list[int]], engine: Engine, small: bool
                   ) -> list[int]:
    """The prompt's tokens: on a worker thread (a large prompt takes a while, and the event
    loop must keep streaming other replies meanwhile), but on the event loop for a ``small``
    one (a small body, no preset's messages added), where a thread's hand-over costs more
    (1-3 ms once the thread has slept, against well under 1 ms to render and tokenize a short
    chat). Only when the model's last small prompt took under ``QUICK_ENCODE_S`` (its first
    goes to a thread): a template that loops for long on every prompt (a hostile model file)
    never holds up the event loop, one slow on some prompts once in a while. Not for a model
    in another process, whose tokenizer waits behind its step (``tokenizes_here``)."""
    small = small and engine.backend.tokenizes_here

    def timed() -> tuple[list[int], float]:
        started = time.perf_counter()
        return encode(engine), time.perf_counter() - started

    if small and _encodes_quickly.get(engine):
        tokens, took = timed()
    else:
        tokens, took = await asyncio.to_thread(timed)
    if small:
        _encodes_quickly[engine] = took < QUICK_ENCODE_S
    return tokens


async def start_generation(
    manager: ModelManager, name: str, encode: Callable[[Engine], list[int]],
    params: SamplingParams | Callable[[Engine], SamplingParams], priority: Priority, *,
    keep_alive_s: float | None = None,
    num_ctx: int | None = None,
    copies: int = 1,
) -> tuple[LoadedModel, EventStream, contextlib.AsyncExitStack]:
    """Lease the model, tokenize on a worker thread (a large prompt takes a while: the event
    loop must keep streaming other replies meanwhile; a small request's prompt may be
    tokenized here, ``_encoded``) and submit. A prompt longer than the
    loaded context reloads the model with a larger one when the request names no ``num_ctx``
    (``ModelManager.context_for``); a prompt longer than the model can have here, or a full
    queue, fails here, before any response is sent. Closing the returned stack gives the model
    back. ``copies`` above 1 asks for that many completions of the prompt (llama-server's
    ``n_cmpl``): the others, in the returned stream's ``others``, copy its cache once it has
    read the prompt, each with its own seed."""
    received_at = RECEIVED_AT.get()
    # A preset's own settings (its parameters over the model's), and its context as a
    # request's num_ctx when the request names none (as Ollama merges a model's options).
    requested = await manager.resolve(name)
    own = manager.settings_of(requested)
    stop = requested.preset.stop if requested.preset is not None else ()
    small = SMALL_BODY.get() and requested.preset is None  # a preset's messages may be long
    if num_ctx is None and requested.preset is not None:
        num_ctx = requested.preset.parameters.get("num_ctx")
    stack = contextlib.AsyncExitStack()
    entry = await stack.enter_async_context(
        manager.lease(name, keep_alive_s=keep_alive_s, num_ctx=num_ctx))
    try:
        engine = entry.engine
        tokens = await _encoded(encode, engine, small)
        if num_ctx is None and len(tokens) >= engine.info.n_ctx \
                and not engine.info.embedding_only:
            larger = await manager.context_for(entry, len(tokens))
            await stack.aclose()  # give it back: the reload waits for the model to be idle
            stack = contextlib.AsyncExitStack()
            entry = await stack.enter_async_context(
                manager.lease(name, keep_alive_s=keep_alive_s, num_ctx=larger))
            engine = entry.engine
            tokens = await _encoded(encode, engine, small)  # the encoder may hold state
        # A grammar can depend on the model (its tool-call format): then params is a function.
        chosen = params(engine) if callable(params) else params
        # The model's default sampling (config.toml, a preset), where the request set none.
        chosen = with_model_defaults(chosen, own, stop=stop)
        events = EventStream(lambda sink: engine.submit(tokens, chosen, priority=priority,
                                                        sink=sink, received_at=received_at))

        def another(sampling: SamplingParams) -> Callable[[Sink], Generation]:
            return lambda sink: engine.submit(tokens, sampling, priority=priority, sink=sink,
                                              received_at=received_at, follows=events.generation)

        try:
            for i in range(1, copies):
                events.others.append(EventStream(another(
                    chosen if chosen.seed is None else
                    dataclasses.replace(chosen, seed=(chosen.seed + i) % 2**32))))
        except BaseException:
            for stream in (events, *events.others):
                stream.cancel()
            raise
    except BaseException:
        await stack.aclose()
        raise
    return entry, events, stack


async def whole_reply(state: DaemonState, request: Request, events: EventStream,
                      stack: contextlib.AsyncExitStack) -> Done:
    """A non-streaming response's reply: wait for it, give the model back, count it."""
    return (await whole_replies(state, request, events, stack))[0]


async def whole_replies(state: DaemonState, request: Request, events: EventStream,
                        stack: contextlib.AsyncExitStack) -> list[Done]:
    """``whole_reply`` for a stream and its ``others`` (several completions of one prompt),
    in that order; a client that leaves, or an error in one, stops them all."""
    choices = Choices(events)

    async def every_last() -> list[Event | None]:
        # A task of its own: a gather future cancelled ends with an error, not cancelled,
        # and the client's leaving would not read as such.
        return await asyncio.gather(*(stream.last() for stream in choices.streams))

    try:
        try:
            dones = await unless_disconnected(request, every_last(), choices.cancel)
        except BaseException:
            choices.cancel()
            raise
    finally:
        await stack.aclose()
    for done in dones:
        assert isinstance(done, Done)  # a generation's last event
        state.record(done)
    for done in dones:
        # Stopped by the shutdown: an error, never a 200 that looks whole (a superseded
        # autocomplete, cancelled otherwise, is llama-server's 200 with "superseded").
        if isinstance(done, Done) and done.finish_reason == "cancelled" and \
                state.shutting_down:
            raise state.cut_off(done)
    return [done for done in dones if isinstance(done, Done)]


async def unless_disconnected(request: Request, work: Awaitable[T],
                              cancel: Callable[[], None]) -> T:
    """Await ``work`` while watching the client; if it disconnects first, stop the work,
    call ``cancel`` and raise ClientLeft."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    worker = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({worker, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not worker.done():
            worker.cancel()
            cancel()
            await asyncio.gather(worker, return_exceptions=True)  # let it finish cancelling
    if worker.cancelled():
        raise ClientLeft("the client disconnected before the reply.")
    return worker.result()  # or raise the work's own error


STALL_S = 60.0
"""How long a stream waits for a client that reads none of it before ending it."""
STALLED = "localinfer.stalled"
"""Set in the ASGI scope of a stream ended after STALL_S: the server then logs its connection's
close as that, not as a response its app left unfinished (see server._StallAwareLog)."""


class BridgeResponse(StreamingResponse):
    """A streaming response that cancels the work behind it however the response ends (even
    if the client left before the first byte), and then runs ``on_close``."""

    def __init__(self, body: AsyncIterator[str], work: Cancellable, *, media_type: str,
                 on_close: Callable[[], object] | None = None) -> None:
        super().__init__(self._to_the_end(body), media_type=media_type,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._work = work
        self._on_close = on_close
        self._ended = False
        self.on_client_left: Callable[[], None] | None = None
        """Called when the client leaves before the stream's end (set by ``guarded``)."""

    async def _to_the_end(self, body: AsyncIterator[str]) -> AsyncIterator[str]:
        async for item in body:
            yield item
        self._ended = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_in_time(message: Message) -> None:
            # A client that stops reading (a suspended editor, a stuck script) would hold its
            # slot for ever once the socket's buffers fill: after STALL_S it is taken as gone.
            with anyio.fail_after(STALL_S):
                await send(message)

        try:
            await super().__call__(scope, receive, send_in_time)
        except ClientDisconnect:
            pass  # counted below, like a disconnect noticed while waiting for the next item
        except TimeoutError:
            log.info("%s: the client read nothing for %.0f s: its stream is ended",
                     scope.get("path"), STALL_S)
            scope[STALLED] = True
        finally:
            if not self._ended:
                if not scope.get(STALLED):
                    log.info("%s: the client left mid-stream", scope.get("path"))
                if self.on_client_left is not None:
                    self.on_client_left()
            self._work.cancel()
            if self._on_close is not None:
                with anyio.CancelScope(shield=True):  # release the model even when cancelled
                    result = self._on_close()
                    if asyncio.iscoroutine(result):
                        await result
