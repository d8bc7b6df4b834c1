"""A model's default sampling, and where each value comes from, for the front ends that send
whole requests (the chat UI, ``localinfer run``): the catalog family's (from its model card,
whose address is the source), then its size's in the catalog (a repeat penalty measured to
help it), then the GGUF file's own ``general.sampling.*`` metadata, then
its ``[models."NAME"]`` table in config.toml. A chat's settings screen and ``run``'s flags go
over these; llama.cpp's defaults (``SamplingParams``) fill what none sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .catalog import Catalog
from .config import SAMPLING_SETTINGS, Config

GGUF_SAMPLING = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p",
                 "general.sampling.top_k": "top_k", "general.sampling.min_p": "min_p",
                 "general.sampling.penalty_repeat": "repeat_penalty",
                 "general.sampling.penalty_last_n": "repeat_last_n"}
"""GGUF metadata keys (llama.cpp's gguf-py ``Keys.General.SAMPLING_*``) -> SamplingParams."""
_INTEGERS = ("top_k", "repeat_last_n")


@dataclass(frozen=True)
class SamplingDefaults:
    """A model's default sampling by SamplingParams name, and each value's source."""

    values: dict[str, float | int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """One line per value, "temperature 0.6 (catalog: https://...)"."""
        return [f"{name} {value:g} ({self.sources[name]})" for name, value in
                self.values.items()]

    def summary(self) -> str:
        """The values grouped by source: "temperature 0.6, top_k 20 (catalog: https://...)";
        empty when there are none."""
        groups: dict[str, list[str]] = {}
        for name, value in self.values.items():
            groups.setdefault(self.sources[name], []).append(f"{name} {value:g}")
        return "; ".join(f"{', '.join(values)} ({source})" for source, values in
                         groups.items())


def model_defaults(catalog: Catalog, name: str, metadata: Mapping[str, Any] | None,
                   config: Config, *names: str | None) -> SamplingDefaults:
    """The defaults of the model ``name`` (``family:size[-quant]``, or a file's name), read
    from its catalog family, its header's ``metadata`` and ``config``'s table for the first
    of ``names`` (with its quant, then without) that has one."""
    values: dict[str, float | int] = {}
    sources: dict[str, str] = {}
    family = catalog.family_for(name)
    if family is not None and family.sampling:
        for key, number in family.sampling.items():
            values[key] = number
            sources[key] = f"catalog: {family.sampling_source}"
    spec = catalog.models.get(name)
    if spec is not None:
        for key, number in spec.sampling.items():
            values[key] = number
            sources[key] = f"catalog: {spec.sampling_source}"
    for key, param in GGUF_SAMPLING.items():
        raw = (metadata or {}).get(key)
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            values[param] = int(raw) if param in _INTEGERS else round(float(raw), 4)
            sources[param] = f"GGUF {key}"
    own = config.model_settings(name, *names)
    if own is not None:
        for key, number in own.sampling().items():
            values[key] = number
            sources[key] = "config.toml [models]"
    order = [*SAMPLING_SETTINGS, "repeat_last_n"]
    ordered = dict(sorted(values.items(), key=lambda kv: order.index(kv[0])
                          if kv[0] in order else len(order)))
    return SamplingDefaults(ordered, sources)
