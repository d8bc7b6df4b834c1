"""The models screen's data: installed and catalog models with the planner's verdict for this
machine. Plain functions over the store, the catalog and a hardware profile (no Textual)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..errors import LocalInferError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelRow:
    name: str
    """What to load or pull: an installed model's full name, or a catalog variant's."""
    installed: bool
    size_bytes: int
    size_estimated: bool
    fits: bool | None
    """None when the planner could not evaluate it."""
    gpu_layers: str
    """"24/32", or "" when unknown."""
    decode_tps: float
    """Predicted decode tok/s for this machine (0 when unknown)."""
    verdict: str
    reason: str
    description: str = ""


def model_rows(store: Any, hardware: Any, *, calibration: dict[str, float] | None = None,
               min_tps: float = 10.0) -> list[ModelRow]:
    """Installed models first (exact sizes from their headers), then the best variant of each
    catalog model that is not installed, each with the plan for ``hardware``."""
    from .. import gguf
    from ..planner import Candidate, PlanPrefs, plan

    catalog = store.catalog
    installed = store.list()
    installed_models = {m.model for m in installed}
    groups: list[tuple[bool, str, list]] = []
    for m in installed:
        try:
            header = gguf.read_header(m.path)
            groups.append((True, "", [Candidate.from_header(header, name=m.name,
                                                            model=m.model)]))
        except LocalInferError as exc:
            log.warning("cannot plan %s: %s", m.name, exc)
            groups.append((True, f"unreadable: {exc.message}", [m]))
    for spec in catalog.models.values():
        if spec.name in installed_models:
            continue
        cands = [Candidate.from_spec(spec, v) for v in spec.variants]
        groups.append((False, spec.family.description, cands))
    prefs = PlanPrefs(min_tps=min_tps, calibration=calibration or {})
    rows = []
    for is_installed, note, cands in groups:
        if not isinstance(cands[0], Candidate):
            m = cands[0]
            rows.append(ModelRow(m.name, True, m.size_bytes, False, None, "", 0.0, "?", note))
            continue
        try:
            result = plan(hardware, cands, prefs)
        except LocalInferError as exc:
            c = cands[0]
            rows.append(ModelRow(c.name, is_installed, c.file_bytes, c.estimated, None, "",
                                 0.0, "?", exc.message, note))
            continue
        e = result.choice or min(result.evaluations, key=lambda e: e.candidate.file_bytes)
        c = e.candidate
        rows.append(ModelRow(
            name=c.name, installed=is_installed, size_bytes=c.file_bytes,
            size_estimated=c.estimated, fits=e.fits,
            gpu_layers=f"{e.n_gpu_layers}/{e.n_layers_total}", decode_tps=e.decode_tps,
            verdict="fits" if e.fits else "too big", reason=e.reason, description=note))
    return rows


