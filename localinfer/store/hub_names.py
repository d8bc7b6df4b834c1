"""Hub GGUF names, as Ollama and llama-server take them: ``hf.co/{user}/{repo}[:{quant}]``,
``huggingface.co/{user}/{repo}[:{quant}]`` and a bare ``{user}/{repo}:{quant}``; and what a
repo's GGUF file names say (the quant, the shard). No network here: ``hub_repo.py`` lists a
repo, this module only reads names.

Every form has one canonical name, lower case, which the store keeps the model under:
``hf.co/bartowski/llama-3.2-1b-instruct-gguf:q4_k_m`` (its folder in the store is
``hf.co--bartowski--llama-3.2-1b-instruct-gguf``: the Hub allows no ``--`` in a repo id, so the
mapping is one to one). A name that looks like a Hub name but breaks the Hub's rules (``..``,
``--``, a character outside letters, digits, ``.``, ``_`` and ``-``, a third path part) is an
InvalidRequest naming the part, before anything touches the network or the disk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidRequest

HOSTS = ("hf.co/", "huggingface.co/")
"""The prefixes that make a name a Hub name whatever follows."""
PREFIX = "hf.co/"
"""The prefix of the canonical name."""
DEFAULT_QUANT = "Q4_K_M"
"""The quant pulled when a name gives none and the repo has it (Ollama's and llama.cpp's)."""
NO_QUANT_TAGS = ("latest",)
"""Tags that mean "no quant given" (Ollama's default tag)."""

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_QUANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")
_BARE = re.compile(r"[^/\s:]+/[^/\s:]+:[^/\s]+")
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_QUANT_IN_NAME = re.compile(
    r"(?:^|[-_.])((?:UD-)?(?:I?Q[0-9](?:_[A-Z0-9]+)*|B?F16|F32|MXFP4(?:_MOE)?|TQ[12]_0))$",
    re.IGNORECASE)


@dataclass(frozen=True)
class HubRef:
    """A Hub name, parsed: the repo as typed (the Hub's case) and the quant, if given."""

    repo: str
    """``user/repo`` as typed (the Hub resolves any case; the files are listed with its own)."""
    quant: str | None
    """Upper case (``Q4_K_M``), or None: the default, else the planner's choice."""

    @property
    def model(self) -> str:
        """The canonical name without the quant: ``hf.co/user/repo``, lower case."""
        return PREFIX + self.repo.lower()

    @property
    def name(self) -> str:
        """The canonical name: ``hf.co/user/repo:q4_k_m``, or the model without a quant."""
        return f"{self.model}:{self.quant.lower()}" if self.quant else self.model

    def with_quant(self, quant: str) -> HubRef:
        return HubRef(self.repo, quant.upper())


def is_hub_name(ref: str) -> bool:
    """Whether ``ref`` is meant as a Hub name: it starts with ``hf.co/`` or
    ``huggingface.co/`` (with or without https://), or is ``user/repo:quant``. Syntax only: a
    malformed one is still a Hub name, which ``parse`` then refuses."""
    text = _strip_scheme(ref.strip())
    if text.lower().startswith(HOSTS):
        return True
    return bool(_BARE.fullmatch(text)) and not text.lower().endswith(".gguf")


def parse(ref: str) -> HubRef:
    """A Hub name -> HubRef. InvalidRequest, naming the part, for anything the Hub would not
    accept as a repo id or a quant."""
    text = _strip_scheme(ref.strip())
    lowered = text.lower()
    for host in HOSTS:
        if lowered.startswith(host):
            text = text[len(host):]
            break
    path, colon, quant = text.partition(":")
    parts = path.split("/")
    shown = ref.strip()[:120]
    if len(parts) != 2 or not all(parts):
        raise InvalidRequest(
            f"invalid Hub model name {shown!r}: use hf.co/USER/REPO[:QUANT] (e.g."
            " hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M), USER/REPO:QUANT, or a"
            " catalog name.")
    for what, part in zip(("user", "repo"), parts, strict=True):
        _check(shown, what, part, _PART, 96)
    if colon:
        _check(shown, "quant", quant, _QUANT, 32)
    quant_text = quant.upper() if colon and quant.lower() not in NO_QUANT_TAGS else None
    return HubRef(f"{parts[0]}/{parts[1]}", quant_text)


def _strip_scheme(text: str) -> str:
    for scheme in ("https://", "http://"):
        if text.lower().startswith(scheme):
            return text[len(scheme):]
    return text


def _check(shown: str, what: str, part: str, pattern: re.Pattern[str], limit: int) -> None:
    if not pattern.fullmatch(part) or ".." in part or "--" in part or part[-1] in ".-":
        raise InvalidRequest(
            f"invalid Hub model name {shown!r}: the {what} {part[:100]!r} must be 1-{limit}"
            " letters, digits, '.', '_' or '-', starting with a letter or digit, not ending"
            " with '.' or '-', with no '..' or '--'.")


def canonical(ref: str) -> str:
    """The canonical name of a Hub name (``parse(ref).name``)."""
    return parse(ref).name


# --- a storage folder for a canonical name ------------------------------------------------------
def folder(family: str) -> str:
    """The store's folder for the part of a name before the ':': a Hub model's
    ``hf.co/user/repo`` becomes ``hf.co--user--repo``; a catalog family stays as it is."""
    return family.replace("/", "--")


def family_of_folder(name: str) -> str:
    """``folder``'s inverse."""
    return name.replace("--", "/") if name.startswith(folder(PREFIX)) else name


# --- what file names say ----------------------------------------------------------------------
def shard_of(file: str) -> tuple[int, int] | None:
    """``(number, count)`` of a split GGUF's file (``...-00002-of-00003.gguf``), else None."""
    match = _SHARD.search(file)
    if match is None:
        return None
    number, count = int(match[1]), int(match[2])
    return (number, count) if 1 <= number <= count else None


def shard_name(stem: str, number: int, count: int) -> str:
    """The file name llama.cpp looks for: ``{stem}-{number:05d}-of-{count:05d}.gguf``."""
    return f"{stem}-{number:05d}-of-{count:05d}.gguf"


def quant_of(file: str) -> str | None:
    """The quant a GGUF file's name ends with (``Model-Q4_K_M.gguf``, ``model.q8_0.gguf``,
    ``Model-UD-Q4_K_XL-00001-of-00002.gguf``), upper case; None when it names none."""
    base = file.rsplit("/", 1)[-1]
    stem = _SHARD.sub("", base)
    if stem.lower().endswith(".gguf"):
        stem = stem[: -len(".gguf")]
    match = _QUANT_IN_NAME.search(stem)
    return match[1].upper() if match else None


def is_model_file(file: str) -> bool:
    """A GGUF of a language model: not a vision projector (``mmproj``) or an imatrix."""
    lowered = file.lower()
    return lowered.endswith(".gguf") and "mmproj" not in lowered.rsplit("/", 1)[-1] \
        and "imatrix" not in lowered.rsplit("/", 1)[-1]
