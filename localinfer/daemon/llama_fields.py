"""llama-server's own request fields, read the way it reads them on each completion route
(``/infill``, ``/v1/chat/completions``, ``/v1/completions``: it parses all three with one
schema), so that editor plugins written against it (llama.vscode, llama.vim) work unchanged.

``n_predict`` caps the reply (-1: no cap) and wins over the route's own cap (``max_tokens``);
0 reads the prompt into the cache and predicts nothing (llama.vim's and llama.vscode's
warm-up requests): the engine samples one token to finish reading, and it is dropped from the
reply (``prompt_only``), which runs at background priority since no one waits for it.
llama-server serves one model, so its clients may name none (llama.vim does, unless
configured otherwise): ``default_model`` picks the one to answer.
``samplers`` is the chain that samples, in its order (``SamplingParams.chain``): one left
out does not run (as in llama.cpp, a missing ``temperature`` means 1), and ``infill``, which
llama.vscode and llama.vim ask for, runs llama.cpp's fill-in-the-middle sampler (it keeps only
tokens of 20% or more and ends the completion where none is left).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

from starlette.requests import Request

from ..errors import InvalidRequest
from ..runtime.engine import Engine
from ..runtime.prompts import check_ids
from ..runtime.types import (
    DEFAULT_SAMPLING,
    Done,
    Event,
    FinishReason,
    ModelInfo,
    Priority,
    SamplingParams,
)
from .requests import Fields, sampling
from .state import DaemonState


def used_last(state: DaemonState, wanted: Callable[[ModelInfo], bool]) -> str | None:
    """The loaded model of the ``wanted`` kind used last, or None."""
    loaded = [e for e in state.manager.loaded.values() if wanted(e.engine.info)]
    return max(loaded, key=lambda e: e.last_used).name if loaded else None


def default_model(state: DaemonState, route: str, *, fim: bool = False) -> str:
    """The model for a request that names none: the loaded model used last (one with
    fill-in-the-middle tokens for ``fim``; one that generates text otherwise), else
    config.toml's ``default_model``."""
    manager = state.manager
    name = used_last(state, lambda info: info.fim is not None if fim
                     else not info.embedding_only)
    if name is not None:
        return name
    if manager.config.default_model:
        return manager.config.default_model
    kind = (" (a code model with fill-in-the-middle tokens, e.g. qwen2.5-coder:1.5b)" if fim
            else "")
    raise InvalidRequest(f"{route} needs a model: send 'model'{kind}, load one, or set"
                         " default_model in config.toml.")


def completion_prompt(value: Any) -> str | list[int]:
    """A completion route's ``prompt``: text, or token ids (llama-server's ``/completion`` and
    OpenAI's ``/v1/completions`` take both), one prompt per request (a list of one is that
    one)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str) and value or isinstance(value, list) and value and all(
            isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    raise InvalidRequest("'prompt' must be a non-empty string or a list of token ids (one"
                         " prompt per request).")


def prompt_encoder(prompt: str | list[int]) -> Callable[[Engine], list[int]]:
    """The tokens a ``completion_prompt`` reads as: text with the model's BOS, ids as they
    are once each is in the model's vocabulary."""
    def encode(engine: Engine) -> list[int]:
        if isinstance(prompt, str):
            return engine.completion_tokens(prompt)
        check_ids(prompt, engine.info.n_vocab)
        return list(prompt)
    return encode


def within_slots(copies: int, encode: Callable[[Engine], list[int]],
                 too_many: Callable[[int], str]) -> Callable[[Engine], list[int]]:
    """``encode``, refused with ``too_many(n_slots)`` where the model has fewer slots than the
    ``copies`` a request asks (``n``, ``n_cmpl``: each completion is a sequence of its own)."""
    def encoded(engine: Engine) -> list[int]:
        if copies > engine.info.n_slots:
            raise InvalidRequest(too_many(engine.info.n_slots))
        return encode(engine)
    return encoded


def n_predict(f: Fields, cap: int | None) -> int | None:
    """``n_predict`` if the request gives it, else ``cap`` (the route's own field, checked
    by the route); 0 reads the prompt only, -1 or None is no cap."""
    value: int | None = f.integer("n_predict", None, low=-1)
    return cap if value is None else value


SAMPLER_LETTERS = {"k": "top_k", "p": "top_p", "m": "min_p", "t": "temperature",
                   "e": "penalties", "i": "infill"}
"""llama-server's one-letter sampler names (common_sampler_type_to_chr) for the samplers a
chain here may hold."""


def _sampler_letters(letters: str) -> list[str]:
    unknown = sorted({c for c in letters if c not in SAMPLER_LETTERS})
    if unknown:
        raise InvalidRequest(
            f"'samplers': {', '.join(repr(c) for c in unknown)} names no sampler this daemon"
            f" runs (it takes {', '.join(f'{c} ({n})' for c, n in SAMPLER_LETTERS.items())}).")
    return [SAMPLER_LETTERS[c] for c in letters]


def llama_sampling(f: Fields, predict: int | None) -> SamplingParams:
    """The request's sampling with ``samplers`` applied and ``predict`` (``n_predict``'s
    value) as its cap: 0 samples the one token that finishes reading the prompt."""
    defaults = DEFAULT_SAMPLING
    samplers = f.data.get("samplers")
    if isinstance(samplers, str):  # llama-server's letters: "kpt"
        samplers = _sampler_letters(samplers)
    if samplers is not None:
        if not isinstance(samplers, list) or not all(isinstance(s, str) for s in samplers):
            raise InvalidRequest("'samplers' must be a list of sampler names (or llama-server's"
                                 " letters, \"kpt\").")
        # As in llama.cpp, a sampler left out of the list does not run.
        defaults = SamplingParams(
            top_k=defaults.top_k if "top_k" in samplers else 0,
            top_p=defaults.top_p if "top_p" in samplers else 1.0,
            min_p=defaults.min_p if "min_p" in samplers else 0.0,
            temperature=defaults.temperature if "temperature" in samplers else 1.0)
    cap = None if predict is None or predict < 0 else max(predict, 1)
    params = sampling(f, max_tokens=cap, defaults=defaults)
    if samplers is None:
        return params
    return dataclasses.replace(params, chain=tuple(samplers)).validate()  # names checked there


def prompt_only_priority(request: Request, body: dict[str, Any], priority: Priority
                         ) -> Priority:
    """An ``n_predict`` 0 request's priority: background (no one waits for it), unless the
    client named one."""
    if "priority" in body or "x-localinfer-priority" in request.headers:
        return priority
    return Priority.BACKGROUND


def prompt_only(done: Done) -> Done:
    """The reply to an ``n_predict`` 0 request: the prompt read, nothing predicted (the one
    token sampled to finish the read is no part of it); it ends at its limit unless it was
    cancelled."""
    reason: FinishReason = "cancelled" if done.finish_reason == "cancelled" else "length"
    return dataclasses.replace(
        done, text="", finish_reason=reason, logprobs=(), stop_sequence="",
        usage=dataclasses.replace(done.usage, completion_tokens=0),
        timings=dataclasses.replace(done.timings, completion_tokens=0, decode_tokens=0,
                                    decode_ms=0.0))


async def prompt_only_events(events: AsyncIterable[Event]) -> AsyncIterator[Event]:
    """A streamed ``n_predict`` 0 request's events: only its ``prompt_only`` end."""
    async for event in events:
        if isinstance(event, Done):
            yield prompt_only(event)
