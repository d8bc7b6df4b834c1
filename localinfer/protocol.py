"""The types that cross the process boundary and their JSON: what the daemon's own routes
(``/health``, ``/localinfer/*``) send and what ``client.py`` reads back, in one place.

Both sides import this module, so a field is added or renamed once. It needs only the standard
library, the error tree and the runtime's plain data types: a client that imports it loads
neither the engine nor the web stack. The ``timings`` object that every route (OpenAI, Ollama
and native) adds to its replies is encoded here too. ``ModelInfo`` is the runtime's (its
runtime/types.py): it crosses the wire as it is, and is imported from here by the front ends.

A native generation streams one JSON object per line:

    {"type": "start", "id", "model", "prompt_tokens", "info", "thinking"}    then, for each
    piece of text,
    {"type": "token", "text", "live": {n_tokens, ttft_ms, prefill_tps, decode_tps,
                                       prompt_tokens}}    and last
    {"type": "done", "text", "finish_reason", "usage", "timings"}
    or {"type": "error", "error": {"class", "title", "message"}}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from . import errors
from .errors import Busy, ContextOverflow, DaemonError, LocalInferError, ModelNotFound
from .runtime.thinking import ThinkingFormat
from .runtime.types import (
    Done,
    LiveStats,
    Message,
    ModelInfo,
    Priority,
    SamplingParams,
    Timings,
    Token,
    Usage,
)


@dataclass(frozen=True)
class Start:
    """The first event of a native generation: which model answers, and the request's id
    (for ``/localinfer/cancel``)."""

    id: str | None
    model: str | None
    prompt_tokens: int | None
    """The prompt's length in tokens."""
    info: ModelInfo | None
    thinking: ThinkingStart | None = None
    """How the reply's reasoning is told from its answer, for a chat with a thinking model
    (the client splits the text as the daemon's other routes do); None otherwise."""


@dataclass(frozen=True)
class ThinkingStart:
    """A thinking model's reply: its format, and whether the prompt opened the reasoning
    block (the reply then begins inside it)."""

    format: ThinkingFormat
    opened: bool


def thinking_json(start: ThinkingStart | None) -> dict[str, Any] | None:
    if start is None:
        return None
    f = start.format
    return {"open": f.open_tag, "close": f.close_tag, "harmony": f.harmony,
            "opened": start.opened}


def thinking_from(data: Any) -> ThinkingStart | None:
    if not isinstance(data, dict):
        return None
    fmt = ThinkingFormat(str(data.get("open", "")), str(data.get("close", "")), None, False,
                         harmony=bool(data.get("harmony")))
    return ThinkingStart(fmt, bool(data.get("opened")))


WireEvent = Start | Token | Done
"""What a native generation stream carries, besides an error."""


def json_line(obj: Any) -> str:
    """One compact JSON text (a line of NDJSON, or an SSE ``data:`` payload)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# --- timings: added to every route's replies ---------------------------------------------------
def timings_json(timings: Timings) -> dict[str, Any]:
    """A finished request's timings, with its prefill and decode rates."""
    return {**asdict(timings), "prefill_tps": timings.prefill_tps,
            "decode_tps": timings.decode_tps}


def timings_from(data: dict[str, Any]) -> Timings:
    names = {f.name for f in fields(Timings)}
    return Timings(**{k: v for k, v in data.items() if k in names})


def live_json(live: LiveStats) -> dict[str, Any]:
    """The speed so far, sent with every piece of text."""
    return {"n_tokens": live.n_tokens, "decode_tps": live.decode_tps, "ttft_ms": live.ttft_ms,
            "prefill_tps": live.prefill_tps, "prompt_tokens": live.prompt_tokens}


def live_from(data: dict[str, Any]) -> LiveStats:
    return LiveStats(n_tokens=data.get("n_tokens", 0), ttft_ms=data.get("ttft_ms", 0.0),
                     prefill_tps=data.get("prefill_tps", 0.0),
                     decode_tps=data.get("decode_tps", 0.0),
                     prompt_tokens=data.get("prompt_tokens", 0))


# --- model info --------------------------------------------------------------------------------
def model_info_json(info: ModelInfo, *, with_template: bool = True) -> dict[str, Any]:
    """``with_template=False`` leaves out the chat template (kilobytes of Jinja that only the
    load reply needs to carry)."""
    data = asdict(info)
    if not with_template:
        data["chat_template"] = None
    return data


def model_info_from(data: dict[str, Any]) -> ModelInfo | None:
    """The model described by ``data``, or None when it does not describe one."""
    names = {f.name for f in fields(ModelInfo)}
    values = {k: v for k, v in data.items() if k in names}
    if isinstance(values.get("fim"), list):
        values["fim"] = tuple(values["fim"])
    if isinstance(values.get("split"), list):
        values["split"] = tuple((str(device), int(layers)) for device, layers in values["split"])
    if isinstance(values.get("buffers"), list):
        values["buffers"] = tuple((str(d), str(k), int(n)) for d, k, n in values["buffers"])
    try:
        return ModelInfo(**values)
    except TypeError:
        return None


# --- errors ------------------------------------------------------------------------------------
ERROR_CODES: dict[type[LocalInferError], str] = {
    ContextOverflow: "context_length_exceeded", ModelNotFound: "model_not_found",
    Busy: "server_busy"}
"""The machine-readable ``code`` (OpenAI's names) of the errors a client may act on."""

_ERROR_BY_CODE = {code: cls for cls, code in ERROR_CODES.items()}
_ERROR_BY_STATUS: dict[int, type[LocalInferError]] = {
    400: errors.InvalidRequest, 404: ModelNotFound, 503: Busy}


def http_status(exc: LocalInferError) -> int:
    return exc.http_status if 400 <= exc.http_status < 600 else 500


def error_json(exc: LocalInferError) -> dict[str, Any]:
    """What localinfer's own client needs to raise the same error again: its class by name,
    its title and message (the daemon adds these to its error bodies and stream events)."""
    return {"class": type(exc).__name__, "title": exc.title, "message": exc.message}


def error_from(payload: Any, status: int | None = None) -> LocalInferError:
    """Rebuild a core error from the daemon's JSON (an error body or an error event): the class
    it names, else one fitting its code or the HTTP status. The CLI then exits with the same
    code as if the model ran in-process."""
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        error = {"message": error}
    name = error.get("class")
    cls = getattr(errors, str(name), None) if name else None
    if not (isinstance(cls, type) and issubclass(cls, LocalInferError)):
        cls = (_ERROR_BY_CODE.get(str(error.get("code")))
               or _ERROR_BY_STATUS.get(status or 0, DaemonError))
    err = cls.__new__(cls)  # its own __init__ may want more than a message (ContextOverflow)
    LocalInferError.__init__(err, str(error.get("message") or f"HTTP {status}"),
                             title=error.get("title"))
    return err


# --- generation events -------------------------------------------------------------------------
def event_json(event: WireEvent | LocalInferError) -> dict[str, Any]:
    """One line of a native generation stream."""
    if isinstance(event, Start):
        return {"type": "start", "id": event.id, "model": event.model,
                "prompt_tokens": event.prompt_tokens,
                "info": None if event.info is None else model_info_json(event.info,
                                                                         with_template=False),
                "thinking": thinking_json(event.thinking)}
    if isinstance(event, Token):
        return {"type": "token", "text": event.text, "live": live_json(event.live)}
    if isinstance(event, Done):
        return {"type": "done", "text": event.text, "finish_reason": event.finish_reason,
                "usage": asdict(event.usage), "timings": timings_json(event.timings)}
    return {"type": "error", "error": error_json(event)}


def event_from(data: dict[str, Any]) -> WireEvent | LocalInferError | None:
    """A line of a native generation stream back as its event (an error as the error to
    raise); None for a kind of line this client does not know."""
    kind = data.get("type")
    if kind == "start":
        return Start(id=data.get("id"), model=data.get("model"),
                     prompt_tokens=data.get("prompt_tokens"),
                     info=model_info_from(data.get("info") or {}),
                     thinking=thinking_from(data.get("thinking")))
    if kind == "token":
        return Token(data["text"], live_from(data.get("live") or {}))
    if kind == "done":
        return Done(data.get("text", ""), data.get("finish_reason", "stop"),
                    Usage(**data.get("usage", {})), timings_from(data.get("timings") or {}))
    if kind == "error":
        return error_from(data)
    return None


# --- requests and replies of the native routes -------------------------------------------------
def generate_request_json(model: str, *, messages: Sequence[Message] | None, prompt: str | None,
                          params: SamplingParams, priority: Priority,
                          keep_alive: float | None, think: bool | str | None = None
                          ) -> dict[str, Any]:
    """The body of ``POST /localinfer/generate`` (a chat when ``messages`` is given;
    ``think``: thinking on, off, an effort, or None for the model's default)."""
    body: dict[str, Any] = {
        "model": model,
        "params": {k: v for k, v in asdict(params).items() if k != "speculative" or
                   v is not None},
        "priority": priority.name.lower(),  # interactive, normal or background
    }
    body["params"]["stop"] = list(params.stop)
    # logit_bias goes as OpenAI's object (a banned token's -inf as -100); off, it and
    # logprobs stay out.
    del body["params"]["logit_bias"]
    if params.logprobs is None:
        del body["params"]["logprobs"]
    if params.logit_bias:
        body["params"]["logit_bias"] = {str(token): max(bias, -100.0)
                                        for token, bias in params.logit_bias}
    if messages is not None:
        body["messages"] = [{"role": m.role, "content": m.content} for m in messages]
    else:
        body["prompt"] = prompt
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    if think is not None:
        body["think"] = think
    return body


def health_json(*, version: str, loading: str | None, load_fraction: float,
                loaded: list[str]) -> tuple[dict[str, Any], int]:
    """``GET /health`` and its HTTP status: 503 while the first model loads (with how far it
    is, as llama-server's), 200 once one serves, a model loading beside it named in the body
    (a supervisor took a daemon serving its chat model for down while it loaded another)."""
    if loading and not loaded:
        return {"status": "loading", "model": loading, "progress": round(load_fraction, 3)}, 503
    body: dict[str, Any] = {"status": "ok", "version": version, "loaded": sorted(loaded)}
    if loading:
        body |= {"loading": loading, "progress": round(load_fraction, 3)}
    return body, 200


def load_fraction_from(health: dict[str, Any]) -> float | None:
    """How far the daemon's current load is (0..1), or None when it is not loading."""
    if (health.get("status") == "loading" or health.get("loading")) and "progress" in health:
        return float(health["progress"])
    return None


def loaded_model_json(info: ModelInfo, *, in_flight: int, load_ms: float,
                      keep_alive_s: float, expires_in_s: float | None,
                      stats: Any) -> dict[str, Any]:
    """One loaded model in ``GET /localinfer/status``; ``stats`` is the engine's
    ``EngineStats`` (a dataclass)."""
    return {"info": model_info_json(info, with_template=False), "in_flight": in_flight,
            "load_ms": load_ms, "keep_alive_s": keep_alive_s, "expires_in_s": expires_in_s,
            "stats": asdict(stats)}


def status_json(*, version: str, pid: int, started: float, loading: str | None,
                loaded: list[dict[str, Any]], hardware: dict[str, Any]) -> dict[str, Any]:
    """``GET /localinfer/status``, which the client hands to the CLI as it is (``localinfer
    ps`` prints it, with ``--json`` verbatim)."""
    return {"version": version, "pid": pid, "started": started, "loading": loading,
            "loaded": loaded, "hardware": hardware}


def load_reply_json(model: str, load_ms: float, info: ModelInfo) -> dict[str, Any]:
    """``POST /localinfer/load``: the model loaded, how long it took, and all about it."""
    return {"model": model, "load_ms": load_ms, "info": model_info_json(info)}
