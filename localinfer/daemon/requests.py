"""Reading request bodies: JSON parsing and typed fields, with errors that name the field.

Both wire formats (OpenAI and Ollama) go through here, so a wrong type, an out-of-range value
or a missing field always gets a 400 with a message saying which field and what it needs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from ..config import (
    SAMPLING_SETTINGS,
    ModelSettings,
    duration_seconds,
    keep_alive_value,
)
from ..errors import InvalidRequest, refuse_unknown_fields
from ..runtime.types import DEFAULT_SAMPLING, Message, Priority, SamplingParams, ToolCall
from .fields import CHAT_MESSAGE

_MISSING = object()

SMALL_BODY_BYTES = 4096
SMALL_BODY: ContextVar[bool] = ContextVar("small_body", default=False)
"""Whether the request being served sent a JSON body of at most ``SMALL_BODY_BYTES`` (set by
``read_json``; a route whose prompt is more than its body, a stored conversation, sets it
False): its prompt may be rendered and tokenized on the event loop (bridge._encoded)."""


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, whatever its Content-Type (as Ollama reads it: ``curl -d``
    sends a form type). Refused with a 400: not JSON (truncated, invalid UTF-8), nested too
    deeply, a number Python cannot hold (an integer of thousands of digits, 1e999, NaN,
    Infinity), or a string with a lone UTF-16 surrogate, which no tokenizer can encode."""
    raw = await request.body()
    SMALL_BODY.set(len(raw) <= SMALL_BODY_BYTES)
    if not raw.strip():
        raise InvalidRequest("the request body is empty; send a JSON object.")
    return parse_json_body(raw)


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """``read_json``'s checks on a body's bytes."""
    try:
        body = json.loads(raw, parse_float=_finite_float, parse_constant=_no_constant)
    except RecursionError:
        raise InvalidRequest("the request body nests JSON too deeply.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}.") from None
    except ValueError as exc:  # Python's int-string limit, or a non-finite number
        reason = f"an integer of more than {sys.get_int_max_str_digits()} digits" \
            if "integer string conversion" in str(exc) else str(exc)
        raise InvalidRequest(f"the request body has a number that is out of range: {reason}."
                             ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object.")
    # A lone surrogate can only arrive as a \ud800-style escape (raw ones are invalid UTF-8).
    if b"\\ud" in raw.lower():
        try:
            _refuse_surrogates(body, "")
        except RecursionError:
            raise InvalidRequest("the request body nests JSON too deeply.") from None
    return body


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _refuse_surrogates(value: Any, where: str) -> None:
    """Refuse a string with an unpaired UTF-16 surrogate (what an editor plugin sends when
    it cuts a string inside an emoji), naming the field; the request is not guessed at."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest(
                f"'{where or 'body'}' contains an unpaired UTF-16 surrogate (such as"
                " \\ud800), which is not text; send whole characters.") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_surrogates(key, where)
            _refuse_surrogates(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_surrogates(item, f"{where}[{i}]")


class Fields:
    """Typed access to a JSON object; ``where`` prefixes field names in errors."""

    def __init__(self, data: Any, where: str = "") -> None:
        if not isinstance(data, dict):
            raise InvalidRequest(f"'{where.rstrip('.') or 'body'}' must be a JSON object.")
        self.data = data
        self.where = where

    def _get(self, key: str, default: Any) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise InvalidRequest(f"'{self.where}{key}' is required.")
            return default
        return value

    def string(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if value is not default and not isinstance(value, str):
            raise InvalidRequest(f"'{self.where}{key}' must be a string, got {_kind(value)}.")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if value is not default and not isinstance(value, bool):
            raise InvalidRequest(f"'{self.where}{key}' must be true or false, got {_kind(value)}.")
        return value

    def integer(self, key: str, default: Any = _MISSING, *, low: int | None = None) -> Any:
        value = self._get(key, default)
        if value is default:
            return value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidRequest(f"'{self.where}{key}' must be an integer, got {_kind(value)}.")
        if low is not None and value < low:
            raise InvalidRequest(f"'{self.where}{key}' must be at least {low}, got {value}.")
        return value

    def number(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if value is default:
            return value
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise InvalidRequest(f"'{self.where}{key}' must be a number, got {_kind(value)}.")
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            number = math.inf
        if not math.isfinite(number):
            raise InvalidRequest(f"'{self.where}{key}' is out of range.")
        return number

    def stop(self, key: str = "stop") -> tuple[str, ...]:
        value = self._get(key, None)
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,) if value else ()
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return tuple(s for s in value if s)
        raise InvalidRequest(f"'{self.where}{key}' must be a string or a list of strings.")


def parse_messages(raw: Any, *, allow_empty: bool = False) -> list[Message]:
    """OpenAI/Ollama chat messages -> Messages. Content may be a string or a list of text
    parts (OpenAI); images and other part types are refused with a clear message."""
    if not isinstance(raw, list):
        raise InvalidRequest("'messages' must be a list of {role, content} objects.")
    if not raw and not allow_empty:
        raise InvalidRequest("'messages' must not be empty.")
    messages = []
    for i, item in enumerate(raw):
        f = Fields(item, f"messages[{i}].")
        CHAT_MESSAGE.audit(item, route="a chat message", where=f.where)
        role = f.string("role")
        if role not in ("system", "user", "assistant", "tool", "developer"):
            raise InvalidRequest(f"'messages[{i}].role' must be system, developer, user,"
                                 f" assistant or tool, got {role!r}.")
        messages.append(Message("system" if role == "developer" else role,
                                _content(item.get("content"), i),
                                tool_calls=_tool_calls(item.get("tool_calls"), i),
                                tool_call_id=f.string("tool_call_id", ""),
                                tool_name=f.string("tool_name", "") or f.string("name", "")))
    return messages


def _tool_calls(raw: Any, i: int) -> tuple[ToolCall, ...]:
    """An assistant message's calls: OpenAI's (arguments as JSON text, with an id) or
    Ollama's (arguments as an object)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRequest(f"'messages[{i}].tool_calls' must be a list.")
    calls = []
    for j, item in enumerate(raw):
        where = f"messages[{i}].tool_calls[{j}]"
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"'{where}' must be {{\"function\": {{\"name\": ...,"
                                 " \"arguments\": ...}}.")
        refuse_unknown_fields(item, _CALL_FIELDS, where, "a tool call")
        refuse_unknown_fields(function, _FUNCTION_FIELDS, where + ".function",
                              "a tool call's function")
        if item.get("type", "function") != "function":
            raise InvalidRequest(f"'{where}.type' must be \"function\", got {item['type']!r}.")
        arguments = function.get("arguments", {})
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        elif not isinstance(arguments, str):
            raise InvalidRequest(f"'{where}.function.arguments' must be an object or JSON"
                                 " text.")
        ident = item.get("id", "")
        calls.append(ToolCall(function["name"], arguments, ident if isinstance(ident, str)
                              else ""))
    return tuple(calls)


_CALL_FIELDS = {"id", "type", "function", "index"}
"""A past tool call's fields (``index``: as a streamed delta carried it, echoed back)."""
_FUNCTION_FIELDS = {"name", "arguments", "index"}
"""A past call's function (``index``: Ollama's, which its clients send back)."""
_TEXT_PART_FIELDS = {"type", "text", "cache_control"}
"""A text part's fields (``cache_control``: as Cline and others mark prompt-caching points)."""


def check_tool_history(messages: Sequence[Message]) -> None:
    """As OpenAI's Chat Completions API checks a conversation: each tool message names, with
    its ``tool_call_id``, a call an assistant message before it made, and each call has its
    tool message before the next user message."""
    made: set[str] = set()
    open_calls: list[str] = []
    for i, message in enumerate(messages):
        if message.role == "assistant":
            ids = [c.id for c in message.tool_calls]
            made.update(ids)
            open_calls += ids
        elif message.role == "tool":
            if not message.tool_call_id:
                raise InvalidRequest(f"'messages[{i}].tool_call_id' is required: the tool"
                                     " message answers that call.")
            if message.tool_call_id not in made:
                raise InvalidRequest(f"'messages[{i}].tool_call_id' {message.tool_call_id!r}"
                                     " answers no tool call of an assistant message before"
                                     " it.")
            if message.tool_call_id in open_calls:
                open_calls.remove(message.tool_call_id)
        elif message.role == "user" and open_calls:
            raise InvalidRequest(f"the tool calls {', '.join(open_calls)} have no tool message"
                                 f" before 'messages[{i}]': each call needs its result.")


def _content(value: Any, i: int) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if isinstance(part, dict) and part.get("type") == "text" and \
                    not isinstance(part.get("text"), str):
                raise InvalidRequest(f"'messages[{i}].content[{j}].text' must be a string, got"
                                     f" {_kind(part.get('text'))}.")
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else _kind(part)
                raise InvalidRequest(f"'messages[{i}].content[{j}]' is {kind!r}; only text"
                                     " parts are supported.")
            refuse_unknown_fields(part, _TEXT_PART_FIELDS, f"messages[{i}].content[{j}]",
                                  "a text part")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequest(f"'messages[{i}].content' must be a string or a list of text parts.")


@dataclass(frozen=True)
class RequestSampling(SamplingParams):
    """A request's sampling parameters, knowing which of them it set itself."""

    given: frozenset[str] = frozenset()
    """The per-model settings (config.SAMPLING_SETTINGS) the request (or its route's own
    defaults) set: the model's default sampling fills only the others (``with_model_defaults``)."""


def sampling(f: Fields, *, max_tokens: Any, defaults: SamplingParams = DEFAULT_SAMPLING
             ) -> SamplingParams:
    """Sampling parameters shared by both APIs (names as in OpenAI and llama.cpp's server)."""
    d = defaults
    given = frozenset(name for name in SAMPLING_SETTINGS
                      if f.data.get(name) is not None
                      or getattr(d, name) != getattr(DEFAULT_SAMPLING, name))
    return RequestSampling(
        given=given,
        max_tokens=max_tokens,
        temperature=f.number("temperature", d.temperature),
        top_p=f.number("top_p", d.top_p),
        top_k=f.integer("top_k", d.top_k, low=0),
        min_p=f.number("min_p", d.min_p),
        repeat_penalty=f.number("repeat_penalty", d.repeat_penalty),
        repeat_last_n=f.integer("repeat_last_n", d.repeat_last_n, low=-1),
        frequency_penalty=f.number("frequency_penalty", d.frequency_penalty),
        presence_penalty=f.number("presence_penalty", d.presence_penalty),
        seed=_seed(f.integer("seed", None)),
        stop=f.stop(),
        # localinfer's extension: prompt-lookup speculation on/off (default: the engine's).
        speculative=f.boolean("speculative", None),
        typical_p=f.number("typical_p", d.typical_p),
        mirostat=f.integer("mirostat", d.mirostat),
        mirostat_tau=f.number("mirostat_tau", d.mirostat_tau),
        mirostat_eta=f.number("mirostat_eta", d.mirostat_eta),
        logit_bias=logit_bias(f),
    ).validate()


def with_model_defaults(params: SamplingParams, own: ModelSettings | None,
                        stop: tuple[str, ...] = ()) -> SamplingParams:
    """``params`` with a model's default sampling (its ``[models."NAME"]`` settings, a
    preset's parameters) in the fields the request did not set itself
    (``RequestSampling.given``), and a preset's ``stop`` strings when it gave none."""
    if own is None and not stop:
        return params
    given = params.given if isinstance(params, RequestSampling) else frozenset()
    changes: dict[str, Any] = {name: value for name, value in
                               (own.sampling() if own is not None else {}).items()
                               if name not in given}
    if stop and not params.stop:
        changes["stop"] = stop
    return dataclasses.replace(params, **changes).validate() if changes else params


def logit_bias(f: Fields) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: an object from token ids (as strings) to a bias from -100 to
    100, added to the logits; -100 bans the token (as llama-server does, with -inf)."""
    value = f.data.get("logit_bias")
    if value is None:
        return ()
    where = f"{f.where}logit_bias"
    if isinstance(value, list):  # llama-server's [[token id, bias or false], ...]
        value = _bias_pairs(value, where)
    if not isinstance(value, dict):
        raise InvalidRequest(f"'{where}' must be an object from token ids to biases.")
    pairs = []
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidRequest(f"'{where}' keys must be token ids, got {key!r}.") from None
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or \
                not -100 <= bias <= 100:
            raise InvalidRequest(f"'{where}.{key}' must be a number from -100 to 100.")
        pairs.append((token, -math.inf if bias == -100 else float(bias)))
    return tuple(pairs)


def _bias_pairs(value: list[Any], where: str) -> dict[str, Any]:
    """llama-server's array form of ``logit_bias``, as the object form: ``false`` bans the
    token (-100). A token given as text is refused: give its id (``/tokenize``)."""
    out: dict[str, Any] = {}
    for i, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise InvalidRequest(f"'{where}[{i}]' must be a [token id, bias] pair.")
        token, bias = pair
        if isinstance(token, str):
            raise InvalidRequest(f"'{where}[{i}]': a token given as text ({token!r}) is not"
                                 " taken; give its id (POST /tokenize tells it).")
        if isinstance(token, bool) or not isinstance(token, int):
            raise InvalidRequest(f"'{where}[{i}]' must start with a token id.")
        if bias is True:
            raise InvalidRequest(f"'{where}[{i}]': a bias must be a number, or false to ban"
                                 " the token.")
        out[str(token)] = -100 if bias is False else bias
    return out


def top_logprobs(f: Fields, *, asked: bool) -> int | None:
    """How many alternatives per token a request asks for (``top_logprobs``, 0 to 20, with
    ``logprobs: true``); None when it asks for no log-probabilities."""
    n = f.integer("top_logprobs", None, low=0)
    if not asked:
        if n:
            raise InvalidRequest(f"'{f.where}top_logprobs' needs 'logprobs': true.")
        return None
    return n or 0


def _seed(value: int | None) -> int | None:
    """Ollama and llama.cpp's server use -1 for "a random seed"."""
    return None if value is None or value == -1 else value



def parse_keep_alive(value: Any) -> float | None:
    """Ollama's keep_alive: seconds as a number, or a duration like "5m", "1h30m", "-1"."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidRequest("'keep_alive' must be a duration like \"5m\" or seconds.")
    if isinstance(value, (int, float)):
        return _keep_alive_seconds(float(value))
    if isinstance(value, str):
        seconds = duration_seconds(value)
        if seconds is not None:
            return _keep_alive_seconds(seconds)
    raise InvalidRequest(f"'keep_alive' must be a duration like \"5m\" or seconds, got {value!r}.")


def _keep_alive_seconds(seconds: float) -> float:
    """Negative or absurdly long (beyond a year, infinite) means forever; NaN is refused."""
    if math.isnan(seconds):
        raise InvalidRequest("'keep_alive' must be a number of seconds or a duration.")
    return keep_alive_value(seconds)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


_PRIORITIES = {"interactive": Priority.INTERACTIVE, "normal": Priority.NORMAL,
               "background": Priority.BACKGROUND}


def parse_priority(value: Any) -> Priority:
    """``"interactive"`` (a person is waiting), ``"normal"`` (None too) or ``"background"``;
    anything else is refused (never taken for normal)."""
    if value is None:
        return Priority.NORMAL
    if not isinstance(value, str) or value not in _PRIORITIES:
        raise InvalidRequest("'priority' must be \"interactive\", \"normal\" or"
                             f" \"background\", got {value!r}.")
    return _PRIORITIES[value]


def asked_priority(request: Request, body: dict[str, Any]) -> Any:
    """The priority a client asked for: the body's ``priority``, else the
    ``X-Localinfer-Priority`` header; None when neither says one."""
    asked = body.get("priority")
    return asked if asked is not None else request.headers.get("x-localinfer-priority")


def priority_of(request: Request, body: dict[str, Any]) -> Priority:
    """Interactive chat goes first; a client may say so (localinfer's chat UI does) with a
    ``priority`` field or an ``X-Localinfer-Priority`` header."""
    return parse_priority(asked_priority(request, body))
