"""Carrying a generation from the engine's worker thread into the event loop.

Events are handed to the loop with ``call_soon_threadsafe``. The request is submitted when the
``EventStream`` is created, so a bad request (a prompt longer than the context, a full queue)
fails before any response is sent. If the consumer goes away (the client disconnected, the
task was cancelled), the generation is cancelled and the engine stops it within one token,
freeing its slot.
"""

from __future__ import annotations

import asyncio

import anyio
from typing import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..runtime.engine import Generation, Sink
from ..runtime.types import Done, Event


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

    async def collect(self, request: Request) -> list[Event]:
        """The whole generation (non-streaming responses), cancelled if the client
        disconnects while it waits."""
        events: list[Event] = []

        async def consume() -> None:
            async for event in self:
                events.append(event)

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        consumer = asyncio.ensure_future(consume())
        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not consumer.done():
                consumer.cancel()
                self.cancel()
        if not consumer.done() or consumer.cancelled():
            raise asyncio.CancelledError("the client disconnected")
        consumer.result()  # re-raise an error from the generation
        return events


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
