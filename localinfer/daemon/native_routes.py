"""localinfer's own routes: /health, /metrics, and /localinfer/* used by its own client.

``POST /localinfer/generate`` streams the engine's events as they are (NDJSON of tokens with
live speed, then the full usage and timings, in protocol.py's format), so the chat UI and
``localinfer run`` show the same figures through the daemon as in-process.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .. import __version__
from ..errors import InvalidRequest, LocalInferError
from ..hardware import probe
from ..protocol import (
    Start,
    ThinkingStart,
    event_json,
    health_json,
    json_line,
    load_reply_json,
    loaded_model_json,
    status_json,
)
from ..runtime.types import Done, SamplingParams
from .bridge import BridgeResponse, start_generation
from .error_replies import guarded
from .reasoning_fields import Thinking, ollama_think
from .requests import (
    Fields,
    parse_keep_alive,
    parse_messages,
    parse_priority,
    read_json,
    sampling,
)
from .state import DaemonState

if TYPE_CHECKING:
    from ..runtime.engine import Engine


def routes(state: DaemonState) -> list[Route]:
    manager = state.manager

    async def health(request: Request) -> Response:
        body, status_code = health_json(version=__version__, loading=manager.loading,
                                        load_fraction=manager.load_fraction,
                                        loaded=list(manager.loaded))
        return JSONResponse(body, status_code)

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(_metrics(state),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def status(request: Request) -> Response:
        loaded = []
        for entry in manager.loaded.values():
            stats = entry.engine.stats()
            expires_in = None if entry.expires_at is None else max(
                0.0, entry.expires_at - time.monotonic())
            item = loaded_model_json(
                entry.engine.info, in_flight=entry.in_flight, load_ms=entry.load_ms,
                keep_alive_s=entry.keep_alive_s, expires_in_s=expires_in, stats=stats)
            item["memory"] = entry.footprint.to_json() if entry.footprint else None
            own = manager.settings_of(entry.model)
            item["settings"] = own.to_json() if own else None  # its [models."NAME"] table
            loaded.append(item)
        body = status_json(version=__version__, pid=os.getpid(), started=state.started,
                           loading=manager.loading, loaded=loaded,
                           hardware=await _hardware(state))
        body["memory"] = await manager.memory_json()
        cache = state.prefix_cache
        body["prefix_cache"] = await asyncio.to_thread(cache.status) if cache else None
        return JSONResponse(body)

    async def generate(request: Request) -> Response:
        body = await read_json(request)
        f = Fields(body)
        name = f.string("model")
        params = _params(Fields(body.get("params") or {}, "params."))
        priority = parse_priority(body.get("priority"))
        # A chat's thinking: switched by "think" (as Ollama's), split by the client.
        thinking = Thinking(ollama_think(body.get("think")))
        if "messages" in body:
            messages = parse_messages(body["messages"])

            def tokens(engine: Engine) -> list[int]:
                return thinking.chat_tokens(engine, messages)
        else:
            if body.get("think") is not None:
                raise InvalidRequest("'think' is for a chat ('messages'), not a 'prompt'.")
            prompt: str = f.string("prompt")

            def tokens(engine: Engine) -> list[int]:
                return engine.completion_tokens(prompt)
        entry, events, stack = await start_generation(
            manager, name, tokens, params, priority,
            keep_alive_s=parse_keep_alive(body.get("keep_alive")))
        engine = entry.engine

        request_id = f"gen-{next(_ids)}"
        state.generations[request_id] = events

        submitted = events.generation.request  # set when the generation was submitted

        async def stream() -> AsyncIterator[str]:
            yield json_line(event_json(Start(
                id=request_id, model=entry.name,
                prompt_tokens=len(submitted.prompt) if submitted else None,
                info=engine.info,
                thinking=None if thinking.format is None else ThinkingStart(
                    thinking.format, thinking.opened)))) + "\n"
            try:
                async for event in events:
                    if isinstance(event, Done):
                        state.record(event)
                        if event.finish_reason == "cancelled" and state.shutting_down:
                            # An error, not the cancel a client asked for (the chat showed
                            # a reply cut by the shutdown as cancelled by the user).
                            raise state.cut_off(event)
                    yield json_line(event_json(event)) + "\n"
            except Exception as exc:
                err = exc if isinstance(exc, LocalInferError) else LocalInferError(str(exc))
                yield json_line(event_json(err)) + "\n"

        async def close() -> None:
            state.generations.pop(request_id, None)
            await stack.aclose()

        return BridgeResponse(stream(), events, media_type="application/x-ndjson",
                              on_close=close)

    async def cancel(request: Request) -> Response:
        """Cancel a generation by the id its stream started with; the stream then ends with
        its full ``done`` event (finish_reason "cancelled", usage and timings so far)."""
        body = await read_json(request)
        events = state.generations.get(Fields(body).string("id"))
        if events is not None:
            events.cancel()
        return JSONResponse({"cancelled": events is not None})

    async def load(request: Request) -> Response:
        """Load a model (as Ollama's empty generate does) and describe it."""
        body = await read_json(request)
        f = Fields(body)
        async with manager.lease(f.string("model"),
                                 keep_alive_s=parse_keep_alive(body.get("keep_alive"))) as entry:
            reply = load_reply_json(entry.name, entry.load_ms, entry.engine.info)
        return JSONResponse(reply)

    async def tokenize(request: Request) -> Response:
        """How many tokens a text takes for a model (the chat counts an attached file
        against the context left before it sends it)."""
        body = await read_json(request)
        f = Fields(body)
        text = f.string("text")
        async with manager.lease(f.string("model"),
                                 keep_alive_s=parse_keep_alive(body.get("keep_alive"))) as entry:
            tokens = await asyncio.to_thread(entry.engine.tokenize, text)
        return JSONResponse({"model": entry.name, "tokens": len(tokens)})

    async def unload(request: Request) -> Response:
        body = await read_json(request)
        name = Fields(body).string("model", None)
        if name is None:
            names = list(manager.loaded)
        else:
            names = [(await manager.resolve(name)).name]
        unloaded = [n for n in names if await manager.unload(n)]
        return JSONResponse({"unloaded": unloaded})

    async def shutdown(request: Request) -> Response:
        state.exit_requested.set()
        return JSONResponse({"status": "shutting down"})

    return [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", guarded(state, "metrics", metrics), methods=["GET"]),
        Route("/localinfer/status", guarded(state, "localinfer/status", status),
              methods=["GET"]),
        Route("/localinfer/generate", guarded(state, "localinfer/generate", generate),
              methods=["POST"]),
        Route("/localinfer/cancel", guarded(state, "localinfer/cancel", cancel),
              methods=["POST"]),
        Route("/localinfer/load", guarded(state, "localinfer/load", load), methods=["POST"]),
        Route("/localinfer/tokenize", guarded(state, "localinfer/tokenize", tokenize),
              methods=["POST"]),
        Route("/localinfer/unload", guarded(state, "localinfer/unload", unload),
              methods=["POST"]),
        Route("/localinfer/shutdown", guarded(state, "localinfer/shutdown", shutdown),
              methods=["POST"]),
    ]


_PARAM_FIELDS = {f.name for f in fields(SamplingParams)}
_ids = itertools.count(1)


async def _hardware(state: DaemonState) -> dict[str, Any]:
    """This machine as the daemon sees it (with llama.cpp's backends, which a client that
    never loads llama.cpp cannot know); probed once, the bandwidth from its cache."""
    if state.hardware is None:
        # The bandwidth from the cache only: a measurement here would load every core while
        # replies stream (and record a figure skewed by them).
        profile = await asyncio.to_thread(probe, measure_bandwidth=False)
        state.hardware = profile.to_dict()
    return state.hardware


def _params(f: Fields) -> SamplingParams:
    unknown = sorted(set(f.data) - _PARAM_FIELDS)
    if unknown:
        raise InvalidRequest(f"'params.{unknown[0]}' is not a sampling parameter.")
    if f.data.get("logprobs") is not None:
        raise InvalidRequest("'params.logprobs': log-probabilities are served by /v1 and"
                             " /api routes, not by the native stream.")
    if "max_tokens" in f.data and f.data["max_tokens"] is None:
        max_tokens = None  # until the context is full
    else:
        max_tokens = f.integer("max_tokens", SamplingParams.max_tokens, low=1)
    # Save the prompt's prefixes to the prefix cache on disk at their first reading.
    return replace(sampling(f, max_tokens=max_tokens),
                   cache_prompt=f.boolean("cache_prompt", False))


def _metrics(state: DaemonState) -> str:
    manager = state.manager
    c = state.counters
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str,
               samples: Sequence[tuple[str, float]]) -> None:
        lines.append(f"# HELP localinfer_{name} {help_text}")
        lines.append(f"# TYPE localinfer_{name} {kind}")
        for labels, value in samples:
            lines.append(f"localinfer_{name}{labels} {value:g}")

    metric("requests_total", "counter", "HTTP requests by route and status.",
           [(f'{{route="{route}",status="{status}"}}', n)
            for (route, status), n in sorted(c.requests.items())])
    metric("client_disconnects_total", "counter", "Requests whose client left before the"
           " reply's end (also counted above: status 499 when no reply had started).",
           [(f'{{route="{route}"}}', n) for route, n in sorted(c.clients_left.items())])
    metric("prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
           [("", c.prompt_tokens)])
    metric("cached_prompt_tokens_total", "counter", "Prompt tokens reused from the KV cache.",
           [("", c.cached_tokens)])
    metric("generated_tokens_total", "counter", "Tokens generated.", [("", c.generated_tokens)])
    metric("decode_tokens_per_second", "gauge", "Decode rate of the last finished request.",
           [("", c.last_decode_tps)])
    metric("ttft_milliseconds", "gauge", "Time to first token of the last request.",
           [("", c.last_ttft_ms)])
    stats = [(e.name, e.engine.stats()) for e in manager.loaded.values()]
    metric("queue_depth", "gauge", "Requests waiting for a free sequence slot.",
           [("", sum(s.queue_depth for _, s in stats))])
    metric("active_sequences", "gauge", "Sequences being generated now.",
           [("", sum(s.active for _, s in stats))])
    metric("model_loaded", "gauge", "Loaded models (1 each); 'loading' while one loads.",
           [(f'{{model="{e.name}"}}', 1) for e in manager.loaded.values()] +
           ([(f'{{model="{manager.loading}",state="loading"}}', 1)] if manager.loading else []))
    metric("model_size_bytes", "gauge", "Weight bytes of each loaded model.",
           [(f'{{model="{e.name}"}}', e.engine.info.size_bytes) for e in manager.loaded.values()])
    if state.prefix_cache is not None:
        cache = state.prefix_cache.status()
        for name, help_text in (
                ("bytes", "Bytes the prefix cache holds on disk."),
                ("entries", "Prompt prefixes saved in the prefix cache on disk."),
                ("lookups", "Requests that looked for a saved prefix."),
                ("hits", "Requests that restored a saved prefix."),
                ("restored_tokens", "Prompt tokens restored from the prefix cache on disk."),
                ("saves", "Prefixes this daemon saved to disk.")):
            metric(f"prefix_cache_{name}", "gauge" if name in ("bytes", "entries")
                   else "counter", help_text, [("", cache[name])])
    try:
        import psutil

        rss = psutil.Process().memory_info().rss
    except Exception:  # psutil is a dependency, but /metrics must never fail
        rss = 0
    metric("process_resident_memory_bytes", "gauge", "Resident memory of the daemon.",
           [("", rss)])
    metric("uptime_seconds", "gauge", "Seconds since the daemon started.",
           [("", time.time() - state.started)])
    return "\n".join(lines) + "\n"
