"""Presets: a name over an installed model with its own system prompt, chat template, default
parameters and seed messages (Ollama's Modelfile and ``/api/create``), kept as data:

    <data>/presets/<name>.json      what ``localinfer create`` or /api/create made

No weights are copied: a preset names the installed model it is over, and ``rm`` of a preset
removes only its JSON. ``parse_modelfile`` reads Ollama's Modelfile syntax (FROM, PARAMETER,
SYSTEM, TEMPLATE, MESSAGE, LICENSE, ADAPTER; ``#`` comments; values quoted with ``"`` or, over
several lines, ``\"\"\"``); an instruction it does not know is an error naming its line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidRequest, ModelNotFound
from ..paths import atomic_write_text, parse_json
from ..runtime.types import Message
from . import hub_names

log = logging.getLogger(__name__)

PRESET_PARAMETERS: dict[str, type] = {
    "num_ctx": int, "temperature": float, "top_p": float, "top_k": int, "min_p": float,
    "repeat_penalty": float, "stop": str}
"""The Modelfile PARAMETERs a preset honours (Ollama's names): the context it loads with, its
default sampling (a request's own value wins) and its stop strings (``stop`` repeats)."""

REFUSED_PARAMETERS = {
    "seed": "a fixed seed would make every reply of the preset the same; give it per request",
    "num_predict": "give max_tokens / num_predict per request",
    "repeat_last_n": "not a per-model default in localinfer; give it per request",
    "presence_penalty": "not a per-model default in localinfer; give it per request",
    "frequency_penalty": "not a per-model default in localinfer; give it per request",
    "typical_p": "not a per-model default in localinfer; give it per request",
    "num_gpu": "the planner places layers; set gpu_layers in config.toml",
    "num_thread": "set threads in config.toml",
    "num_batch": "the planner picks the batch",
    "num_keep": "localinfer keeps the whole prompt's cache",
}
"""Ollama parameters a preset refuses, with what to do instead."""

ROLES = ("system", "user", "assistant")
MODELFILE_COMMANDS = ("from", "parameter", "system", "template", "message", "license",
                      "adapter")
_PRESET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}(:[a-z0-9][a-z0-9._-]{0,63})?$")


@dataclass(frozen=True)
class Preset:
    """A named preset over an installed model."""

    name: str
    model: str
    """The installed model (``family:size-quant``) it is over."""
    system: str | None = None
    """The system prompt a chat gets when it brings none of its own."""
    template: str | None = None
    """A chat template (Jinja, as GGUF files carry) used instead of the model's own."""
    parameters: dict[str, Any] = field(default_factory=dict)
    """PRESET_PARAMETERS by name; ``stop`` a list."""
    messages: tuple[tuple[str, str], ...] = ()
    """(role, content) turns every chat starts with, after the system prompt."""
    license: tuple[str, ...] = ()
    created: float = 0.0
    adapters: tuple[str, ...] = ()
    """LoRA adapter GGUFs (absolute paths, not copied) applied to the model's weights."""

    @property
    def stop(self) -> tuple[str, ...]:
        return tuple(self.parameters.get("stop") or ())

    @property
    def own_engine(self) -> bool:
        """Whether it loads apart from its model (its own template or LoRA adapters):
        otherwise it shares the loaded model, and only its prompt and sampling differ."""
        return self.template is not None or bool(self.adapters)

    def apply(self, messages: Sequence[Message]) -> list[Message]:
        """A chat's messages with the preset's system prompt (unless the chat has one) and
        seed turns before its own (as Ollama's chat does)."""
        if self.system is None and not self.messages:
            return list(messages)
        head = list(messages[:1]) if messages and messages[0].role == "system" else []
        if not head and self.system:
            head = [Message("system", self.system)]
        rest = list(messages[1:]) if messages and messages[0].role == "system" else list(
            messages)
        return head + [Message(role, content) for role, content in self.messages] + rest

    def modelfile(self) -> str:
        """The preset as a Modelfile (what `show --modelfile` and /api/show print)."""
        lines = [f"# Modelfile of the localinfer preset {self.name}", f"FROM {self.model}"]
        lines += [f"ADAPTER {path}" for path in self.adapters]
        if self.template is not None:
            lines.append(f'TEMPLATE """{self.template}"""')
        if self.system is not None:
            lines.append(f'SYSTEM """{self.system}"""')
        for name, value in self.parameters.items():
            for item in value if isinstance(value, list) else [value]:
                lines.append(f"PARAMETER {name} {json.dumps(item) if name == 'stop' else item}")
        lines += [f'MESSAGE {role} """{content}"""' for role, content in self.messages]
        lines += [f'LICENSE """{text}"""' for text in self.license]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["messages"] = [{"role": r, "content": c} for r, c in self.messages]
        data["license"] = list(self.license)
        data["adapters"] = list(self.adapters)
        return data


@dataclass
class CreateRequest:
    """What ``create`` is asked for: a Modelfile's lines or /api/create's fields, checked."""

    name: str
    source: str | None = None
    """The model it is over: an installed model or a preset's name, or (from a Modelfile on
    this machine) a .gguf path."""
    system: str | None = None
    template: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    messages: list[tuple[str, str]] = field(default_factory=list)
    license: list[str] = field(default_factory=list)
    adapters: list[str] = field(default_factory=list)
    quantize: str | None = None


def validate_preset_name(name: str) -> str:
    clean = name.strip().lower()
    if not _PRESET_NAME.match(clean) or ".." in clean:
        raise InvalidRequest(f"invalid preset name {name!r}: use letters, digits, '.', '_' and"
                             " '-', with at most one ':' (e.g. mario or mario:v1).")
    return clean


def check_parameters(raw: Mapping[str, Any], where: str = "parameters") -> dict[str, Any]:
    """Ollama's ``parameters`` object checked: each a PRESET_PARAMETER of the right type, or
    refused by name with the reason."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        out.update(_parameter(name, value, f"{where}.{name}"))
    return out


def _parameter(name: str, value: Any, where: str) -> dict[str, Any]:
    if name in REFUSED_PARAMETERS:
        raise InvalidRequest(f"'{where}' is not supported in a preset:"
                             f" {REFUSED_PARAMETERS[name]}.")
    kind = PRESET_PARAMETERS.get(name)
    if kind is None:
        known = ", ".join(PRESET_PARAMETERS)
        raise InvalidRequest(f"'{where}' is not a parameter a preset knows (known: {known}).")
    if name == "stop":
        items = value if isinstance(value, list) else [value]
        if not items or not all(isinstance(s, str) and s for s in items):
            raise InvalidRequest(f"'{where}' must be a string or a list of strings.")
        return {"stop": list(items)}
    if isinstance(value, str):  # a Modelfile's text, or a client that sends strings
        try:
            value = int(value) if kind is int else float(value)
        except ValueError:
            raise InvalidRequest(f"'{where}' must be a number, got {value!r}.") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (kind is int and not float(value).is_integer()):
        raise InvalidRequest(f"'{where}' must be {'an integer' if kind is int else 'a number'},"
                             f" got {value!r}.")
    if not 0 <= value < float("inf") or (name == "num_ctx" and value < 1):
        bound = "positive" if name == "num_ctx" else "a number of 0 or more"
        raise InvalidRequest(f"'{where}' must be {bound}, got {value}.")
    return {name: int(value) if kind is int else float(value)}


# --- the Modelfile ----------------------------------------------------------------------------
def parse_modelfile(text: str, base_dir: Path, name: str) -> CreateRequest:
    """A Modelfile's instructions as a CreateRequest. Relative paths (FROM, ADAPTER) are read
    from ``base_dir`` and may not leave it; an unknown instruction, a MESSAGE with another
    role or a value left open is an InvalidRequest naming its line."""
    request = CreateRequest(name=validate_preset_name(name))
    lines = text.lstrip("\ufeff").splitlines()
    i = 0
    while i < len(lines):
        number, line = i + 1, lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if "\t" in word:
            word, _, more = word.partition("\t")
            rest = more + " " + rest
        command = word.lower()
        where = f"line {number} ({line[:60]!r})"
        if command not in MODELFILE_COMMANDS:
            raise InvalidRequest(
                f"Modelfile {where}: unknown instruction {word!r}; a line starts with one of"
                f" {', '.join(c.upper() for c in MODELFILE_COMMANDS)} (or # for a comment).")
        rest = rest.strip()
        key = ""
        if command in ("parameter", "message"):
            key, _, rest = rest.partition(" ")
            rest = rest.strip()
        value, i = _value(rest, lines, i, where)
        if command == "from":
            request.source = _path_or_name(value, base_dir, where)
        elif command == "parameter":
            param = _parameter(key.lower(), value, f"PARAMETER {key} ({where})")
            if "stop" in param:
                request.parameters.setdefault("stop", []).extend(param["stop"])
            else:
                request.parameters.update(param)
        elif command == "message":
            if key.lower() not in ROLES:
                raise InvalidRequest(f"Modelfile {where}: MESSAGE role must be one of"
                                     f" {', '.join(ROLES)}, got {key!r}.")
            request.messages.append((key.lower(), value))
        elif command == "system":
            request.system = value
        elif command == "template":
            request.template = value
        elif command == "license":
            request.license.append(value)
        elif command == "adapter":
            request.adapters.append(_path_or_name(value, base_dir, where, path_only=True))
    if request.source is None:
        raise InvalidRequest("the Modelfile has no FROM line: name the model it is over"
                             " (FROM gemma3:270m) or a .gguf file.")
    return request


def _value(rest: str, lines: list[str], i: int, where: str) -> tuple[str, int]:
    """An instruction's value: the rest of its line, or a quoted text (\"\"\" may span lines)."""
    if rest.startswith('"""'):
        body = rest[3:]
        while '"""' not in body:
            if i >= len(lines):
                raise InvalidRequest(f'Modelfile {where}: the """ opened here is never closed.')
            body += "\n" + lines[i]
            i += 1
        text, _, after = body.partition('"""')
        if after.strip():
            raise InvalidRequest(f'Modelfile {where}: text after the closing """:'
                                 f" {after.strip()[:40]!r}.")
        return text, i
    if rest.startswith('"'):
        if len(rest) < 2 or not rest.endswith('"'):
            raise InvalidRequest(f'Modelfile {where}: the " opened here is never closed.')
        return rest[1:-1], i
    if not rest:
        raise InvalidRequest(f"Modelfile {where}: the instruction has no value.")
    return rest, i


def hub_model_name(value: str) -> bool:
    """Whether ``value`` is a Hub model's name (``hf.co/user/repo[:quant]``, as Ollama's
    FROM takes it), not a path."""
    if value.startswith(("/", "~", ".")) or not hub_names.is_hub_name(value):
        return False
    try:
        hub_names.parse(value)
    except InvalidRequest:
        return False
    return True


def _path_or_name(value: str, base_dir: Path, where: str, *, path_only: bool = False) -> str:
    """A FROM/ADAPTER value: an absolute path, ~, or a path relative to the Modelfile's folder
    (which may not leave it), returned absolute; else (FROM) a model name as written, a Hub
    model's too, unless a file of that name is there."""
    looks_like_path = (value.startswith(("/", "~", ".")) or "/" in value or os.sep in value
                       or value.endswith(".gguf"))
    if not path_only and looks_like_path and hub_model_name(value) and \
            not (base_dir / value).exists():
        return value
    if not looks_like_path and not path_only:
        return value
    if value.startswith("~") or os.path.isabs(value):
        return str(Path(value).expanduser().resolve())
    base = base_dir.resolve()
    path = (base / value).resolve()
    if path != base and base not in path.parents:
        raise InvalidRequest(f"Modelfile {where}: {value!r} leaves the Modelfile's folder"
                             f" ({base}); a relative path must stay inside it (give an"
                             " absolute path to use a file elsewhere).")
    return str(path)


# --- on disk ----------------------------------------------------------------------------------
class PresetStore:
    """The presets in ``<data>/presets``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.changes = 0
        """Presets saved or removed through this object (``ModelStore.changes``)."""

    def _path(self, name: str) -> Path:
        return self.root / (validate_preset_name(name).replace(":", "@") + ".json")

    def get(self, name: str) -> Preset | None:
        try:
            path = self._path(name)
        except InvalidRequest:
            return None
        try:
            data = parse_json(path.read_text(encoding="utf-8"))
            data["messages"] = tuple((m["role"], m["content"]) for m in data["messages"])
            data["license"] = tuple(data.get("license") or ())
            data["adapters"] = tuple(data.get("adapters") or ())
            return Preset(**data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("ignoring unreadable preset %s: %s", path, exc)
            return None

    def all(self) -> list[Preset]:
        if not self.root.is_dir():
            return []
        found = (self.get(p.stem.replace("@", ":")) for p in sorted(self.root.glob("*.json")))
        return [p for p in found if p is not None]

    def save(self, preset: Preset) -> Preset:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self._path(preset.name), json.dumps(preset.to_json(), indent=2) + "\n")
        self.changes += 1
        return preset

    def remove(self, name: str) -> Preset:
        preset = self.get(name)
        if preset is None:
            raise ModelNotFound(f"no preset named {name!r}.")
        self._path(name).unlink(missing_ok=True)
        self.changes += 1
        return preset

    def using(self, model: str) -> list[Preset]:
        """The presets over the installed model ``model``."""
        return [p for p in self.all() if p.model == model]


def make_preset(request: CreateRequest, model: str, over: Preset | None = None) -> Preset:
    """The preset ``request`` describes over the installed ``model``; a preset made FROM
    another preset (``over``) starts from that one's settings (its adapters, then these)."""
    params = dict(over.parameters) if over else {}
    params.update(request.parameters)
    return Preset(
        name=request.name, model=model,
        system=request.system if request.system is not None else (over.system if over else None),
        template=(request.template if request.template is not None
                  else over.template if over else None),
        parameters=params,
        messages=tuple(request.messages) or (over.messages if over else ()),
        license=tuple(request.license) or (over.license if over else ()),
        created=time.time(),
        adapters=(over.adapters if over else ()) + tuple(request.adapters))
