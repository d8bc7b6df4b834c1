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
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, Generic, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..runtime.engine import Engine, Generation, Sink
from ..runtime.types import Done, Event, Priority, SamplingParams
from ..store import ModelStore, PullProgress, PullTarget, pull_model
from .manager import LoadedModel, ModelManager
from .state import DaemonState

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

    async def drain(self, request: Request) -> T | None:
        """Every item until the end (a non-streaming response), cancelled if the client
        disconnects while it waits; the last item."""
        last: list[T] = []

        async def consume() -> None:
            async for item in self:
                last[:] = [item]

        await unless_disconnected(request, consume(), self.cancel)
        return last[0] if last else None


class EventStream(ThreadBridge[Event]):
    """A generation's events, from the engine's worker thread."""

    def __init__(self, submit: Callable[[Sink], Generation]) -> None:
        super().__init__()
        self.generation = submit(self._sink)

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


class PullJob(ThreadBridge[PullProgress]):
    """A pull running on its own thread, its progress handed to the event loop. Cancelling
    it (the client went away) stops the download within a chunk; the partial file stays."""

    running: ClassVar[set[PullJob]] = set()
    """Pulls whose thread has not finished."""

    def __init__(self, store: ModelStore, target: PullTarget) -> None:
        super().__init__()
        self._cancel = threading.Event()
        self._store = store
        self.target = target
        PullJob.running.add(self)
        threading.Thread(target=self._run, name=f"pull {target.name}", daemon=True).start()

    def _run(self) -> None:
        try:
            pull_model(self._store, self.target, progress=self._progress,
                       cancel=self._cancel)
        except BaseException as exc:  # noqa: BLE001 - handed to the request, raised there
            self.end(exc)
        else:
            self.end()
        finally:
            PullJob.running.discard(self)

    def _progress(self, step: PullProgress) -> None:
        if not self.put(step):
            self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        self._cancel.set()  # a no-op once the pull is done


async def start_generation(
    manager: ModelManager, name: str, encode: Callable[[Engine], list[int]],
    params: SamplingParams | Callable[[Engine], SamplingParams], priority: Priority, *,
    keep_alive_s: float | None = None,
    num_ctx: int | None = None,
) -> tuple[LoadedModel, EventStream, contextlib.AsyncExitStack]:
    """Lease the model, tokenize on a worker thread (a large prompt takes a while: the event
    loop must keep streaming other replies meanwhile) and submit. A prompt longer than the
    context or a full queue fails here, before any response is sent. Closing the returned
    stack gives the model back."""
    stack = contextlib.AsyncExitStack()
    entry = await stack.enter_async_context(
        manager.lease(name, keep_alive_s=keep_alive_s, num_ctx=num_ctx))
    try:
        engine = entry.engine
        tokens = await asyncio.to_thread(encode, engine)
        # A grammar can depend on the model (its tool-call format): then params is a function.
        chosen = params(engine) if callable(params) else params
        events = EventStream(lambda sink: engine.submit(tokens, chosen, priority=priority,
                                                        sink=sink))
    except BaseException:
        await stack.aclose()
        raise
    return entry, events, stack


async def whole_reply(state: DaemonState, request: Request, events: EventStream,
                      stack: contextlib.AsyncExitStack) -> Done:
    """A non-streaming response's reply: wait for it, give the model back, count it."""
    try:
        done = await events.drain(request)
    finally:
        await stack.aclose()
    assert isinstance(done, Done)  # a generation's last event
    state.record(done)
    return done


async def unless_disconnected(request: Request, work: Awaitable[T],
                              cancel: Callable[[], None]) -> T:
    """Await ``work`` while watching the client; if it disconnects first, stop the work,
    call ``cancel`` and raise CancelledError."""

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
        raise asyncio.CancelledError("the client disconnected")
    return worker.result()  # or raise the work's own error


class BridgeResponse(StreamingResponse):
    """A streaming response that cancels the work behind it however the response ends (even
    if the client left before the first byte), and then runs ``on_close``."""

    def __init__(self, body: AsyncIterator[str], work: ThreadBridge[Any], *, media_type: str,
                 on_close: Callable[[], object] | None = None) -> None:
        super().__init__(body, media_type=media_type,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._work = work
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._work.cancel()
            if self._on_close is not None:
                with anyio.CancelScope(shield=True):  # release the model even when cancelled
                    result = self._on_close()
                    if asyncio.iscoroutine(result):
                        await result
