"""Ollama-compatible routes: /api/version, tags, ps, show, chat, generate, pull, delete (and /
for probes).

Streaming is NDJSON by default (``"stream": false`` for one object); the final object carries
``done_reason`` and the durations in nanoseconds, as Ollama's does. As in Ollama, a chat with
no messages (or a generate with no prompt) only loads the model, and with ``keep_alive: 0``
unloads it. Each streamed object also carries localinfer's ``timings``. ``/api/pull`` runs the
store's blocking pull on its own thread and streams Ollama's progress objects (``status``,
``digest``, ``total``, ``completed``, then ``{"status": "success"}``); a second pull of the
same model joins the first; when every client has gone away the download stops, keeping its
partial file for the next pull.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .. import __version__, gguf
from ..config import ModelSettings
from ..errors import InvalidRequest, LocalInferError, ModelInUse
from ..protocol import ModelInfo, json_line, live_json, timings_json
from ..runtime.engine import Engine
from ..runtime.thinking import thinking_format
from ..runtime.types import Done, Message, Priority, SamplingParams, TokenLogprob
from ..store import InstalledModel, PullProgress
from ..store.local import available_models
from .autocomplete import autocomplete_params, autocomplete_priority
from .bridge import BridgeResponse, PullJob, start_generation, whole_reply
from .error_replies import guarded, message_of
from .fields import audit
from .logprob_fields import entries_json
from .manager import LoadedModel
from .reasoning_fields import Thinking, ollama_think
from .replies import Piece, reply_parts, whole_parts
from .requests import (
    Fields,
    parse_keep_alive,
    parse_messages,
    priority_of,
    read_json,
    sampling,
    top_logprobs,
)
from .state import DaemonState
from .structured import (
    Constraints,
    format_only,
    ollama_calls,
    ollama_constraints,
    ollama_format,
)

# The Ollama API version whose routes and fields this daemon implements; some clients check it
# before they send a field. 0.12.11 added logprobs, the last of the generation fields localinfer
# serves (tools came in 0.3.0, format schemas in 0.5.0, think in 0.9.0, think levels in
# 0.11.0). What it lacks of that API is refused by name (images, truncate, shift).
OLLAMA_API_VERSION = "0.12.11"

def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def details(model: InstalledModel | None, quant: str = "", arch: str = "",
            n_params: int = 0) -> dict[str, Any]:
    family = model.family if model else arch
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family],
            "parameter_size": _param_size(n_params),
            "quantization_level": model.quant if model else quant}


def _param_size(n: int) -> str:
    if n <= 0:
        return ""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def durations(done: Done) -> dict[str, Any]:
    t = done.timings
    # eval_count / eval_duration is what clients show as the generation rate: keep it equal
    # to the measured decode rate, the first token's share of it taken from the prompt's
    # time (which made it), so that the parts add up to no more than total_duration.
    eval_ms = t.decode_ms / t.decode_tokens * t.completion_tokens if t.decode_tokens else 0.0
    prompt_ms = max(0.0, t.prefill_ms - (eval_ms - t.decode_ms))
    ns = 1_000_000
    return {
        "total_duration": int((t.total_ms + t.load_ms) * ns),
        "load_duration": int(t.load_ms * ns),
        "prompt_eval_count": t.prompt_tokens,
        "prompt_eval_duration": int(prompt_ms * ns),
        "eval_count": t.completion_tokens,
        "eval_duration": int(eval_ms * ns),
    }


def routes(state: DaemonState) -> list[Route]:
    manager = state.manager

    async def root(request: Request) -> Response:
        return PlainTextResponse("localinfer is running (OpenAI and Ollama compatible API)")

    async def version(request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_API_VERSION, "localinfer": __version__})

    async def tags(request: Request) -> Response:
        installed = await asyncio.to_thread(available_models, manager.store)
        catalog = manager.store.catalog
        presets = await asyncio.to_thread(manager.store.presets.all)
        by_name = {m.name: m for m in installed}
        params = await asyncio.to_thread(
            lambda: {m.name: getattr(catalog.models.get(m.model), "params", 0) or
                     _file_params(m.path) for m in installed})
        tags = [_tag(m, params[m.name]) for m in installed]
        for preset in presets:  # a preset lists as its model does, under its own name
            base = by_name.get(preset.model)
            if base is not None:
                tag = _tag(base, params[base.name])
                tag.update(name=preset.name, model=preset.name,
                           modified_at=_iso(preset.created))
                tag["details"]["parent_model"] = base.name
                tags.append(tag)
        return JSONResponse({"models": tags})

    async def ps(request: Request) -> Response:
        return JSONResponse({"models": [_running(e) for e in manager.loaded.values()]})

    async def show(request: Request) -> Response:
        body = await read_json(request)
        audit("/api/show", body)
        f = Fields(body)
        name = f.string("model", None) or f.string("name", None)
        if not name:
            raise InvalidRequest("'model' is required.")
        model = await manager.resolve(name)
        header = await asyncio.to_thread(gguf.read_header, model.path)
        if f.boolean("verbose", False):
            raise InvalidRequest("'verbose': the tokenizer's vocabulary is not shown; leave"
                                 " it out.")
        # As Ollama shows it: every key, the vocabulary's arrays as null; the template apart.
        info: dict[str, Any] = {
            key: None if isinstance(value, gguf.ArrayStub) or key in _VOCABULARY_KEYS
            else value
            for key, value in header.metadata.items() if key != "tokenizer.chat_template"
        }
        info["general.parameter_count"] = header.parameter_count
        loaded = manager.loaded.get(model.name)
        # The loaded engine's template is the one chats use (the GGUF's, or its family's).
        template = (loaded.engine.chat_template_source if loaded is not None
                    else header.chat_template or "")
        own = manager.settings_of(model)
        n_ctx = (loaded.engine.info.n_ctx if loaded is not None
                 else own.ctx if own is not None else None)
        preset = model.preset
        if preset is not None and preset.template is not None and loaded is None:
            template = preset.template
        reply: dict[str, Any] = {
            "license": "\n".join(preset.license) if preset and preset.license
            else header.license or "",
            "modelfile": (preset.modelfile() if preset is not None else
                          f"# Modelfile generated by localinfer\nFROM {model.path}\n"),
            "parameters": show_parameters(template, n_ctx, own,
                                          preset.stop if preset is not None else ()),
            "template": template,
            "details": details(model.installed, header.quant, header.architecture,
                               header.parameter_count),
            "model_info": info,
            "capabilities": capabilities(header, template,
                                         loaded.engine.info if loaded is not None else None),
            "modified_at": _iso(model.installed.added) if model.installed else now_iso(),
        }
        if preset is not None:
            reply["system"] = preset.system or ""
            reply["messages"] = [{"role": r, "content": c} for r, c in preset.messages]
            reply["details"]["parent_model"] = preset.model
        return JSONResponse(reply)

    async def chat(request: Request) -> Response:
        body = await read_json(request)
        audit("/api/chat", body)
        f = Fields(body)
        name = f.string("model")
        raw_messages = body.get("messages") or []
        messages = parse_messages(raw_messages, allow_empty=True)
        thinking = Thinking(ollama_think(body.get("think")))
        if not messages:
            return await _load_only(state, name, f, chat=True)

        params = _options(f, top_level=True)
        constraints = ollama_constraints(body, params.grammar)
        messages = await manager.with_preset(name, messages)
        return await _generate(state, request, f, name, constraints.encoder(messages, thinking),
                               params, priority_of(request, body), chat=True,
                               thinking=thinking, constraints=constraints)

    async def generate(request: Request) -> Response:
        body = await read_json(request)
        audit("/api/generate", body)
        f = Fields(body)
        name = f.string("model")
        prompt = f.string("prompt", "")
        suffix = f.string("suffix", "")
        system = f.string("system", "")
        raw = f.boolean("raw", False)
        thinking = Thinking(ollama_think(body.get("think")))
        if thinking.think and (raw or suffix):
            raise InvalidRequest("'think' needs the chat template: it cannot go with 'raw' or"
                                 " 'suffix'.")
        if not prompt and not suffix:
            return await _load_only(state, name, f, chat=False)
        # A preset's system prompt and seed turns, as Ollama's generate uses them.
        chat_messages = await manager.with_preset(name, (
            [Message("system", system)] if system else []) + [Message("user", prompt)])

        def encode(engine: Engine) -> list[int]:
            if suffix:
                return engine.infill_tokens(prompt, suffix)
            if raw or _unwrapped(engine, prompt):
                return engine.completion_tokens(prompt)
            return thinking.chat_tokens(engine, chat_messages)

        if suffix:  # fill-in-the-middle: an editor's autocomplete
            return await _generate(state, request, f, name, encode,
                                   autocomplete_params(_options(f), request, name, prompt,
                                                       suffix),
                                   autocomplete_priority(request, body), chat=False,
                                   thinking=thinking)
        params = _options(f)
        return await _generate(state, request, f, name, encode, params,
                               priority_of(request, body), chat=False, thinking=thinking,
                               constraints=format_only(params.grammar, thinking))

    async def pull(request: Request) -> Response:
        body = await read_json(request)
        audit("/api/pull", body)
        f = Fields(body)
        name = f.string("model", None) or f.string("name", None)
        if not name:
            raise InvalidRequest("'model' is required.")
        stream = f.boolean("stream", True)
        # An unknown name, a path or a bad quant fails here, with a status code.
        target = await asyncio.to_thread(manager.pull_target, name)
        job = PullJob.follow(manager.store, target)  # joins a pull of it already running
        if not stream:
            await job.drain(request)
            return JSONResponse({"status": "success"})

        async def lines() -> AsyncIterator[str]:
            status = ""
            try:
                async for step in job:
                    if step.status == "downloading" or step.status != status:
                        yield json_line(pull_json(step)) + "\n"
                    status = step.status
            except Exception as exc:  # noqa: BLE001 - headers sent: report it in the stream
                message = message_of(exc) if isinstance(exc, LocalInferError) else str(exc)
                yield json_line({"error": message}) + "\n"

        return BridgeResponse(lines(), job, media_type="application/x-ndjson")

    async def delete(request: Request) -> Response:
        body = await read_json(request)
        audit("/api/delete", body)
        f = Fields(body)
        name = f.string("model", None) or f.string("name", None)
        if not name:
            raise InvalidRequest("'model' is required.")
        preset = manager.store.presets.get(name)
        if preset is not None:  # a preset: its JSON only, never the file it is over
            entry = manager.loaded.get(preset.name)
            if entry is not None and not entry.in_flight:
                await manager.unload(preset.name)
            await asyncio.to_thread(manager.store.presets.remove, preset.name)
            return Response(status_code=200)
        model = await asyncio.to_thread(manager.store.find_installed, name)
        manager.store.check_removable(model)  # before it is unloaded for nothing
        entry = manager.loaded.get(model.name)
        if entry is not None:
            if entry.in_flight:
                raise ModelInUse(f"{model.name} is answering requests; try again when they"
                                 " are done.")
            await manager.unload(model.name)
        await asyncio.to_thread(manager.store.remove, model.name)
        return Response(status_code=200)

    return [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/api/version", guarded(state, "api/version", version), methods=["GET"]),
        Route("/api/tags", guarded(state, "api/tags", tags), methods=["GET"]),
        Route("/api/ps", guarded(state, "api/ps", ps), methods=["GET"]),
        Route("/api/show", guarded(state, "api/show", show), methods=["POST"]),
        Route("/api/chat", guarded(state, "api/chat", chat), methods=["POST"]),
        Route("/api/generate", guarded(state, "api/generate", generate), methods=["POST"]),
        Route("/api/pull", guarded(state, "api/pull", pull), methods=["POST"]),
        Route("/api/delete", guarded(state, "api/delete", delete), methods=["DELETE"]),
    ]


def _unwrapped(engine: Engine, prompt: str) -> bool:
    """A prompt for a model with no chat template, or a base model, is read as it is (as
    Ollama does for a model without a TEMPLATE), and so is one that already holds the model's
    FIM tokens (llm.nvim sends them without ``raw``): chat turns around it would make the
    completion prose."""
    info = engine.info
    return (info.base_model or not info.chat_template
            or (info.fim is not None and info.fim[0] in prompt))


PULL_STATUS = {"resolving": "pulling manifest", "verifying": "verifying sha256 digest",
               "writing": "writing manifest", "success": "success"}


def pull_json(step: PullProgress) -> dict[str, Any]:
    """A pull step as Ollama streams it."""
    if step.status == "downloading":
        out: dict[str, Any] = {"status": f"pulling {step.digest[:12]}" if step.digest
                               else f"pulling {step.name}"}
        if step.digest:
            out["digest"] = f"sha256:{step.digest}"
        out["total"] = step.total
        out["completed"] = step.completed
        return out
    return {"status": PULL_STATUS.get(step.status, step.status)}


TOP_LEVEL_SAMPLING = {"temperature": "temperature", "top_p": "top_p",
                      "max_output_tokens": "num_predict"}
"""The sampling fields the AI SDK's Ollama provider (ollama-ai-provider-v2: Cline's) writes
at the top of an /api/chat body, and the option each stands for. Ollama ignores them; they
are honoured here where ``options`` leaves them out (``options`` wins)."""


def _options(f: Fields, *, top_level: bool = False):
    given = f.data.get("options") or {}
    if top_level and isinstance(given, dict):
        given = {**{option: f.data[name] for name, option in TOP_LEVEL_SAMPLING.items()
                    if f.data.get(name) is not None}, **given}
    options = Fields(given, "options.")
    num_predict = options.integer("num_predict", None)
    max_tokens = None if num_predict is None or num_predict < 0 else num_predict
    if num_predict is not None and (num_predict == 0 or num_predict < -2):
        raise InvalidRequest("'options.num_predict' must be positive, or -1 (no limit) or -2"
                             f" (until the context is full), got {num_predict}.")
    return dataclasses.replace(sampling(options, max_tokens=max_tokens),
                               logprobs=top_logprobs(f, asked=f.boolean("logprobs", False)),
                               grammar=ollama_format(f.data))


_VOCABULARY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                   "tokenizer.ggml.token_type", "tokenizer.ggml.scores")

# The texts that end a turn in the families' chat templates: the stop strings Ollama's
# Modelfiles list (localinfer stops at the model's end-of-generation tokens, these among them).
_END_OF_TURN = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                "<|return|>", "<|call|>", "<|endoftext|>", "</s>", "<｜end▁of▁sentence｜>")


def show_parameters(template: str, n_ctx: int | None, own: ModelSettings | None = None,
                    stop: tuple[str, ...] = ()) -> str:
    """/api/show's ``parameters`` as Ollama prints them: one ``name value`` line each, the
    name padded to 30 columns, strings quoted. The context is the loaded one (a model not
    loaded yet: its own ctx setting, else none: its plan gives it one at load); then the
    model's default sampling from config.toml (``own``), by Ollama's names."""
    lines = [] if n_ctx is None else [("num_ctx", str(n_ctx))]
    lines += [(name, f"{value:g}") for name, value in (own.sampling() if own else {}).items()]
    lines += [("stop", json.dumps(text, ensure_ascii=False)) for text in
              (stop or [t for t in _END_OF_TURN if t in template])]
    return "\n".join(f"{name:<30} {value}" for name, value in lines)


def capabilities(header: gguf.GGUFHeader, template: str, info: ModelInfo | None) -> list[str]:
    """What /api/show says a model can do, as Ollama names it: ``completion`` (it generates
    text), ``tools`` (its chat template takes tools), ``thinking`` (it thinks: see
    runtime/thinking.py), ``insert`` (it has fill-in-the-middle tokens) and ``embedding``
    (an embedding model, which generates no text: its GGUF sets a pooling type)."""
    embedding = (info.embedding_only if info is not None else
                 f"{header.architecture}.pooling_type" in header.metadata)
    found = ["embedding"] if embedding else ["completion"]
    if not embedding and "tools" in template:
        found.append("tools")
    if not embedding and thinking_format(template) is not None:
        found.append("thinking")
    if "tokenizer.ggml.fim_pre_token_id" in header.metadata or (info and info.fim):
        found.append("insert")
    return found


def _keep_alive(f: Fields) -> float | None:
    return parse_keep_alive(f.data.get("keep_alive"))


def _num_ctx(f: Fields) -> int | None:
    return Fields(f.data.get("options") or {}, "options.").integer("num_ctx", None, low=1)


async def _load_only(state: DaemonState, name: str, f: Fields, *, chat: bool) -> Response:
    """Ollama's preload/unload: an empty chat or prompt only (un)loads the model."""
    keep_alive = _keep_alive(f)
    if keep_alive == 0:
        model = await state.manager.resolve(name)
        await state.manager.unload(model.name)
        reason = "unload"
    else:
        async with state.manager.lease(name, keep_alive_s=keep_alive, num_ctx=_num_ctx(f)):
            pass
        reason = "load"
    body: dict[str, Any] = {"model": name, "created_at": now_iso(), "done": True,
                            "done_reason": reason}
    if chat:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    return JSONResponse(body)


async def _generate(state: DaemonState, request: Request, f: Fields, name: str,
                    encode: Callable[[Engine], list[int]], params: SamplingParams,
                    priority: Priority, *, chat: bool, thinking: Thinking,
                    constraints: Constraints | None = None) -> Response:
    stream = f.boolean("stream", True)
    entry, events, stack = await start_generation(
        state.manager, name, encode,
        constraints.sampling(params) if constraints is not None else params, priority,
        keep_alive_s=_keep_alive(f), num_ctx=_num_ctx(f))

    def piece(text: str, reasoning: str = "",
              entries: tuple[TokenLogprob, ...] = ()) -> dict[str, Any]:
        if chat:
            out: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
            if reasoning:
                out["message"]["thinking"] = reasoning
        else:
            out = {"response": text}
            if reasoning:
                out["thinking"] = reasoning
        if params.logprobs is not None:
            out["logprobs"] = entries_json(entries)
        return out

    def final(done: Done, text: str, reasoning: str = "",
              entries: tuple[TokenLogprob, ...] = ()) -> dict[str, Any]:
        return {"model": name, "created_at": now_iso(), **piece(text, reasoning, entries),
                "done": True,
                "done_reason": "length" if done.finish_reason == "length" else "stop",
                **durations(done), "timings": timings_json(done.timings)}

    if not stream:
        done = await whole_reply(state, request, events, stack)
        reasoning, content, calls = whole_parts(done, thinking, constraints)
        reply = final(done, content, reasoning, done.logprobs)
        if calls:
            reply["message"]["tool_calls"] = ollama_calls(calls)
        return JSONResponse(reply)

    async def body() -> AsyncIterator[str]:
        try:
            async for part in reply_parts(state, events, thinking, constraints):
                if isinstance(part, Piece):
                    yield json_line({"model": name, "created_at": now_iso(),
                                     **piece(part.content, part.reasoning, part.logprobs),
                                     "done": False, "timings": live_json(part.live)}) + "\n"
                    continue
                event, reasoning, content = part.done, part.reasoning, part.content
                if part.calls:
                    said: dict[str, Any] = {"role": "assistant", "content": content,
                                            "tool_calls": ollama_calls(part.calls)}
                    if reasoning:
                        said["thinking"] = reasoning
                    yield json_line({"model": name, "created_at": now_iso(),
                                     "message": said, "done": False,
                                     "timings": timings_json(event.timings)}) + "\n"
                    reasoning, content = "", ""
                yield json_line(final(event, content, reasoning)) + "\n"
        except Exception as exc:  # headers are sent: report the error in the stream
            message = exc.message if isinstance(exc, LocalInferError) else str(exc)
            yield json_line({"error": message}) + "\n"

    return BridgeResponse(body(), events, media_type="application/x-ndjson",
                          on_close=stack.aclose)


def _file_params(path: str) -> int:
    """The parameter count in a model file's header (0 where it cannot be read now), for a
    model the catalog does not size: a Hub or local file, as ``/api/show`` gives it."""
    try:
        stat = os.stat(path)
    except OSError:
        return 0
    return _header_params(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)
def _header_params(path: str, mtime_ns: int, size: int) -> int:
    """``_file_params`` of one version of a file: its header is read once, not at every
    listing (clients poll ``/api/tags``)."""
    try:
        return gguf.read_header(path).parameter_count
    except (OSError, LocalInferError):
        return 0


def _tag(m: InstalledModel, n_params: int) -> dict[str, Any]:
    return {"name": m.name, "model": m.name, "modified_at": _iso(m.added), "size": m.size_bytes,
            "digest": m.sha256 or "", "details": details(m, n_params=n_params)}


def _running(entry: LoadedModel) -> dict[str, Any]:
    info = entry.engine.info
    size = info.size_bytes
    on_gpu = info.n_gpu_layers / (info.n_layers + 1)  # llama.cpp counts the output layer
    size_vram = int(size * on_gpu)
    if entry.footprint is not None:  # as Ollama: all it holds in memory, and the VRAM part
        size, size_vram = entry.footprint.total_bytes, entry.footprint.vram_bytes
    elif info.buffers:  # no memory plan: what llama.cpp said it allocated while loading
        size, size_vram = sum(n for _, _, n in info.buffers), info.gpu_bytes
    expires = entry.expires_at
    if expires is None:
        # Kept for ever: as Ollama, the farthest time its clock can say (292 years on).
        until = _iso(time.time() + FOREVER_S) if entry.keep_alive_s < 0 else now_iso()
    else:
        until = _iso(time.time() + (expires - time.monotonic()))
    installed = entry.model.installed
    return {"name": entry.name, "model": entry.name, "size": size,
            "digest": (installed.sha256 if installed else "") or "",
            "details": details(installed, info.quant, info.architecture, info.n_params),
            "expires_at": until, "size_vram": size_vram,
            "context_length": info.n_ctx}


FOREVER_S = 292 * 365.25 * 86400
"""Ollama's expiry of a model kept for ever: Go's longest duration from now (~292 years)."""


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(
        timespec="seconds").replace("+00:00", "Z")
