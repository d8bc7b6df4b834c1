"""Settings: an optional ``config.toml`` in the config directory, overridden by environment
variables, overridden by command-line flags (which the CLI applies on top).

    # ~/.config/localinfer/config.toml
    default_model = "gemma3:270m"
    ctx = 8192
    gpu_layers = -1
    threads = 4

    [models."qwen3:8b"]             # one model's own settings, over the ones above
    ctx = 16384
    kv_type = "q8_0"
    temperature = 0.6               # its default sampling: a request's own fields win
    top_p = 0.95

Every top-level key has an environment variable: ``LOCALINFER_<KEY>`` in upper case
(``LOCALINFER_CTX=8192``); the ``[models."NAME"]`` tables are only in the file. NAME is a model
as the store names it, with its quant (``qwen3:8b-q4_k_m``) or without (``qwen3:8b``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import ConfigError
from .paths import Paths, get_paths
from .runtime.types import kv_cache_types

FLASH_ATTN = {"auto": None, "on": True, "off": False}
"""The flash_attn setting's values, as LoadOptions.flash_attn takes them."""


@dataclass(frozen=True)
class ModelSettings:
    """One model's own settings (``[models."NAME"]`` in config.toml): each set one overrides
    the global setting or the default for this model only."""

    ctx: int | None = None
    """Context window per sequence in tokens: the model loads with it, and a longer request
    is refused rather than reloaded with more (default: the plan's)."""
    kv_type: str | None = None
    """KV cache type: "f16", "q8_0" or "q4_0" for K and V, or "K,V" such as "q8_0,q4_0"
    (default: the global kv_type)."""
    temperature: float | None = None
    """Default sampling temperature of its requests (a request's own value wins)."""
    top_p: float | None = None
    """Default nucleus sampling threshold."""
    top_k: int | None = None
    """Default top-k (0 = off)."""
    min_p: float | None = None
    """Default min-p threshold (0 = off)."""
    repeat_penalty: float | None = None
    """Default repetition penalty (1 = off)."""

    def sampling(self) -> dict[str, float | int]:
        """The default sampling it sets, by SamplingParams field name."""
        return {name: value for name in SAMPLING_SETTINGS
                if (value := getattr(self, name)) is not None}

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any]) -> ModelSettings:
        """A preset's parameters (Ollama's names: num_ctx, temperature...) as settings."""
        return cls(ctx=parameters.get("num_ctx"),
                   **{name: parameters.get(name) for name in SAMPLING_SETTINGS})

    def over(self, other: ModelSettings | None) -> ModelSettings:
        """These settings, with ``other``'s where these set none."""
        if other is None:
            return self
        return ModelSettings(**{f.name: getattr(other, f.name) if getattr(self, f.name) is None
                                else getattr(self, f.name) for f in fields(self)})

    def to_json(self) -> dict[str, Any]:
        """The settings it sets (what `plan`, `ps` and /api/show print)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


SAMPLING_SETTINGS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty")
"""The per-model settings that are default sampling, named as SamplingParams names them."""


@dataclass(frozen=True)
class Config:
    """Settings shared by the CLI, the daemon and the chat UI."""

    default_model: str | None = None
    """Model used when a command names none (default: the planner's pick, or the starter)."""
    ctx: int | None = None
    """Context window per sequence in tokens (default: the plan's, at most the model's)."""
    gpu_layers: int | None = None
    """Layers to offload to the GPU, -1 for all (default: as many as the plan fits)."""
    threads: int | None = None
    """CPU threads (default: physical cores)."""
    slots: int | None = None
    """Sequences the daemon decodes in parallel (default: from the memory plan)."""
    kv_type: str = "f16"
    """KV cache type: "f16", "q8_0" (half the memory) or "q4_0" (a quarter) for K and V, or
    "K,V" for each its own, e.g. "q8_0,q4_0" (quantized types need flash attention)."""
    flash_attn: str = "auto"
    """Flash attention: "auto" (off on the CPU, where greedy text with speculation is then
    identical to plain decoding; llama.cpp's choice on a GPU), "on" or "off"."""
    host: str = "127.0.0.1"
    """Loopback address the daemon listens on and clients connect to."""
    port: int = 11480
    """TCP port of the daemon."""
    keep_alive: float = 300.0
    """Seconds an idle model stays loaded in the daemon."""
    api_key: str | None = None
    """When set, TCP clients of the daemon must send ``Authorization: Bearer <key>``."""
    min_tps: float = 10.0
    """Decode speed (tokens/s) the planner aims for when it picks a model variant."""
    offline: bool = False
    """Never touch the network (also set by HF_HUB_OFFLINE=1)."""
    workers: str | None = None
    """RPC workers whose devices take layers of the daemon's models: "HOST:PORT,..."
    (``localinfer worker`` or llama.cpp's rpc-server on each; ``serve --workers``)."""
    layer_split: str | None = None
    """Layers per device with workers, instead of the planner's split: "6,6,6" = this
    machine's CPU, then each worker device in order (``serve --layer-split``)."""
    prefix_cache_gb: float = 4.0
    """Most disk space the prefix cache (the KV cache of long prompt prefixes, kept across
    restarts; ``localinfer cache``) takes, in GB; 0 turns it off."""
    prefix_cache_min_tokens: int = 1024
    """The shortest prompt prefix the prefix cache saves, in tokens."""
    models: dict[str, ModelSettings] = field(default_factory=dict)
    """Per-model settings (``[models."NAME"]``), by lower-case model name."""

    def replace(self, **changes: Any) -> Config:
        """A copy with the given fields changed; None values are ignored."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def model_settings(self, *names: str | None) -> ModelSettings | None:
        """The settings of the first of ``names`` (a model with its quant, then without) that
        has a ``[models."NAME"]`` table; None when none has."""
        for name in names:
            if name and name.lower() in self.models:
                return self.models[name.lower()]
        return None

    def for_model(self, *names: str | None) -> Config:
        """These settings with the model's own (``model_settings``) over them: its ctx and
        kv_type."""
        own = self.model_settings(*names)
        if own is None:
            return self
        return self.replace(ctx=own.ctx, kv_type=own.kv_type)


_ENV_PREFIX = "LOCALINFER_"


def load_config(paths: Paths | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read config.toml (if any), then apply environment overrides (from ``os.environ``
    unless ``environ`` is given)."""
    paths = paths or get_paths()
    env_vars: Mapping[str, str] = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    path = paths.config_file
    if path.is_file():
        try:
            with open(path, "rb") as toml_file:
                raw = tomllib.load(toml_file)
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} cannot be read: {exc}") from None
        except RecursionError:
            raise ConfigError(f"{path} cannot be read: it nests arrays or tables too deeply."
                              ) from None
        for key, value in raw.items():
            if key == "models":
                values[key] = _models(value, str(path))
            else:
                values[key] = _check(key, value, str(path))
    for f in fields(Config):
        if f.name == "models":
            continue  # a table: only in the file
        env = env_vars.get(_ENV_PREFIX + f.name.upper())
        if env is not None and env != "":
            # A string setting (an API key, a model name) is taken as written, never parsed.
            kind = _TYPES[f.name]
            value = env if kind.startswith("str") else (
                _ENV_BOOLS.get(env.strip().lower(), env) if "bool" in kind else _parse_env(env))
            values[f.name] = _check(f.name, value, _ENV_PREFIX + f.name.upper())
    if env_vars.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        values["offline"] = True
    return Config(**values)


_TYPES = {f.name: str(f.type) for f in fields(Config)}
_MODEL_TYPES = {f.name: str(f.type) for f in fields(ModelSettings)}


def _models(raw: Any, where: str) -> dict[str, ModelSettings]:
    """The ``[models."NAME"]`` tables, each key checked as the global one of its name is."""
    if not isinstance(raw, dict):
        raise ConfigError(f'{where}: models must be tables such as [models."qwen3:8b"],'
                          f" got {raw!r}.")
    out = {}
    for name, table in raw.items():
        here = f'{where} [models."{name}"]'
        if not isinstance(table, dict):
            raise ConfigError(f"{here} must be a table of settings, got {table!r}.")
        values = {}
        for key, value in table.items():
            if key not in _MODEL_TYPES:
                known = ", ".join(_MODEL_TYPES)
                raise ConfigError(f"{here}: unknown setting {key!r} (known: {known}).")
            values[key] = _check_value(key, value, here, _MODEL_TYPES[key])
        out[name.strip().lower()] = ModelSettings(**values)
    return out


FOREVER = -1.0
"""A keep_alive that never expires."""


def keep_alive_value(seconds: float) -> float:
    """A keep_alive in seconds as stored: negative or beyond a year (infinite) is forever,
    as Ollama takes it."""
    return FOREVER if seconds < 0 or seconds > 365 * 86400 else seconds


def duration_seconds(text: str) -> float | None:
    """A duration as Ollama writes keep_alive: seconds (``300``), or ``5m``, ``1h30m``,
    ``90s``, ``500ms``, ``-1`` (negative: forever); None where ``text`` is none."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)", text.lstrip("-"))
    if not parts or "".join(n + u for n, u in parts) != text.lstrip("-"):
        return None
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sign * sum(float(number) * units[unit] for number, unit in parts)


_ENV_BOOLS = dict.fromkeys(("1", "true", "yes", "on"), True) | dict.fromkeys(
    ("0", "false", "no", "off"), False)
"""A yes/no setting from the environment, spelt as HF_HUB_OFFLINE and shells spell it."""


def _parse_env(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return text  # a bare string (or one nested too deeply to be a value)


def _check(key: str, value: Any, where: str) -> Any:
    if key not in _TYPES:
        known = ", ".join(sorted(_TYPES))
        raise ConfigError(f"{where}: unknown setting {key!r} (known: {known}).")
    return _check_value(key, value, where, _TYPES[key])


def _check_value(key: str, value: Any, where: str, kind: str) -> Any:
    expected: tuple[type, ...]
    if "bool" in kind:
        expected = (bool,)
    elif "int" in kind:
        expected = (int,)
    elif "float" in kind:
        expected = (int, float)
    else:
        expected = (str,)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
    if key == "keep_alive" and isinstance(value, str):  # "5m", as --keep-alive takes it
        seconds = duration_seconds(value)
        if seconds is None:
            raise ConfigError(f"{where}: keep_alive must be seconds or a duration such as"
                              f" \"5m\" or \"1h\" (negative: forever), got {value!r}.")
        value = seconds
    if not isinstance(value, expected) or (expected != (bool,) and isinstance(value, bool)):
        words = " (true or false; 1 or 0, yes or no, on or off in the environment)" \
            if expected == (bool,) else ""
        raise ConfigError(f"{where}: {key} must be {kind.replace(' | None', '')}{words},"
                          f" got {value!r}.")
    if key in ("ctx", "threads", "slots", "port", "prefix_cache_min_tokens") and \
            isinstance(value, int) and value <= 0:
        raise ConfigError(f"{where}: {key} must be positive, got {value}.")
    if key == "kv_type":
        try:
            kv_cache_types(str(value))
        except ValueError as exc:
            raise ConfigError(f"{where}: kv_type: {exc}.") from None
    if key == "prefix_cache_gb" and isinstance(value, (int, float)) and \
            not 0 <= value < float("inf"):
        raise ConfigError(f"{where}: {key} must be 0 (off) or more GB, got {value}.")
    if key == "keep_alive" and isinstance(value, (int, float)):
        if math.isnan(value):
            raise ConfigError(f"{where}: keep_alive must be seconds or a duration, got {value}.")
        value = keep_alive_value(value)
    if key == "min_tps" and isinstance(value, (int, float)) and not 0 <= value < float("inf"):
        raise ConfigError(f"{where}: min_tps must be 0 or more tok/s, got {value}.")
    if key in SAMPLING_SETTINGS and isinstance(value, (int, float)) and \
            not 0 <= value < float("inf"):
        raise ConfigError(f"{where}: {key} must be a number of 0 or more, got {value}.")
    if key == "gpu_layers" and isinstance(value, int) and value < -1:
        raise ConfigError(f"{where}: gpu_layers must be -1 (all) or 0 or more, got {value}.")
    if key == "flash_attn" and value not in FLASH_ATTN:
        raise ConfigError(f"{where}: flash_attn must be \"auto\", \"on\" or \"off\","
                          f" got {value!r}.")
    return value
