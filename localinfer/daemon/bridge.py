"""Carrying a generation from the engine's worker thread into the event loop.

Events are handed to the loop with ``call_soon_threadsafe``. The request is submitted when the
``EventStream`` is created, so a bad request (a prompt longer than the context, a full queue)
fails before any response is sent. If the consumer goes away (the client disconnected, the
task was cancelled), the generation is cancelled and the engine stops it within one token,
freeing its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..runtime.engine import Engine, Generation, Sink
from ..runtime.types import Done, Event, Priority, SamplingParams
from .manager import LoadedModel, ModelManager

T = TypeVar("T")


async def start_generation(
    manager: ModelManager, name: str, encode: Callable[[Engine], list[int]],
    params: SamplingParams, priority: Priority, *, keep_alive_s: float | None = None,
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
        events = EventStream(lambda sink: engine.submit(tokens, params, priority=priority,
                                                        sink=sink))
    except BaseException:
        await stack.aclose()
        raise
    return entry, events, stack


class EventStream:
    def __init__(self, submit: Callable[[Sink], Generation]) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        self.generation = submit(self._sink)

    def _sink(self, event: Event | BaseException) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.generation.cancelled = True

    def cancel(self) -> None:
        if self.generation.done is None:
            self.generation.cancel()

    async def __aiter__(self) -> AsyncIterator[Event]:
        try:
            while True:
                event = await self._queue.get()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if isinstance(event, Done):
                    return
        finally:
            self.cancel()

    async def result(self, request: Request) -> Done:
        """The whole generation's ``Done`` (non-streaming responses), cancelled if the
        client disconnects while it waits."""
        done: list[Done] = []

        async def consume() -> None:
            async for event in self:
                if isinstance(event, Done):
                    done.append(event)

        await unless_disconnected(request, consume(), self.cancel)
        return done[-1]


async def whole_reply(state: Any, request: Request, events: EventStream,
                      stack: contextlib.AsyncExitStack) -> Done:
    """A non-streaming response's reply: wait for it, give the model back, count it."""
    try:
        done = await events.result(request)
    finally:
        await stack.aclose()
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


class EventStreamResponse(StreamingResponse):
    """A streaming response that cancels its generation however the response ends (even if
    the client left before the first byte), and then runs ``on_close``."""

    def __init__(self, body: AsyncIterator[str], events: EventStream, *, media_type: str,
                 on_close: Callable[[], object] | None = None) -> None:
        super().__init__(body, media_type=media_type,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._events.cancel()
            if self._on_close is not None:
                with anyio.CancelScope(shield=True):  # release the model even when cancelled
                    result = self._on_close()
                    if asyncio.iscoroutine(result):
                        await result
