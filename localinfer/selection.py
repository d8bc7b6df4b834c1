"""Choosing models, above the store and the planner: the planner's preferences from the
settings, its candidates for installed and catalog models, the model to open when none is
named, and the variant a pull downloads. The CLI, the session (chat UI), the loader and the
daemon all ask here, so that `plan`, `pull`, the models list and a load answer alike.

    plan_prefs(config, calibration)        the one way settings become PlanPrefs
    installed_candidate / catalog_candidates
    best_or_smallest(plan)                 the choice, else the smallest file
    pick_model(store, config, hardware)    no model named: which one to open
    pull_target(store, ref, config)        a reference without a quant: which variant to pull
    hub_candidates(store, ref, listing)    a Hub repo's quants, exact from their headers
    instruct_offer(store, config, hardware)  only base models installed: the chat model to offer
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import gguf
from .catalog import ModelSpec, Variant
from .config import Config, ModelSettings, load_config
from .errors import LocalInferError
from .planner import Candidate, Evaluation, Plan, PlanPrefs, plan, smallest_file
from .store import (
    STARTER_NAME,
    HeaderFetch,
    HubRef,
    HubTarget,
    InstalledModel,
    ModelStore,
    PullTarget,
    RepoListing,
    ResolvedModel,
    hub_header,
    hub_target,
    installed_hub_target,
    is_hub_name,
    list_repo,
    lookup,
    no_gguf,
    remote_header,
)
from .store.hub_names import DEFAULT_QUANT, parse

if TYPE_CHECKING:
    from .hardware import HardwareProfile

log = logging.getLogger(__name__)


def plan_prefs(config: Config, calibration: Mapping[str, float] | None = None, *,
               n_slots: int | None = 1) -> PlanPrefs:
    """The planner's preferences from the settings: context, decode speed to aim for, GPU
    layers, threads and KV cache type. ``calibration``: this machine's measured/predicted
    decode ratios (``planner.calibration.load_ratios``), none for another machine's profile.
    ``n_slots``: sequences decoded at once (None: as many as fit)."""
    return PlanPrefs(n_ctx=config.ctx, min_tps=config.min_tps, n_slots=n_slots,
                     n_gpu_layers=config.gpu_layers, n_threads=config.threads,
                     kv_type=config.kv_type, calibration=dict(calibration or {}))


# --- candidates --------------------------------------------------------------------------------
def model_settings(config: Config, model: ResolvedModel) -> ModelSettings | None:
    """A model's own settings: a preset's ``[models."NAME"]`` table in config.toml, over the
    preset's parameters, over the table of the model it is over (by its name with the quant,
    then without); None when none sets anything."""
    base = config.model_settings(model.installed.name if model.installed else model.name,
                                 model.installed.model if model.installed else None)
    preset = model.preset
    if preset is None:
        return base
    own = ModelSettings.from_parameters(preset.parameters).over(base)
    table = config.model_settings(preset.name)
    return table.over(own) if table is not None else own


def installed_candidate(model: InstalledModel) -> Candidate:
    """The planner's view of an installed model, exact from its header."""
    return Candidate.from_header(gguf.read_header(model.path), name=model.name,
                                 model=model.model)


def catalog_candidates(store: ModelStore, spec: ModelSpec,
                       variants: list[Variant] | None = None, *,
                       fetch: HeaderFetch | None = None) -> list[Candidate]:
    """The planner's candidates for ``spec``'s variants (all, or ``variants``): exact from the
    file when installed, else from a GGUF header read from the Hub (cached; read over the
    network only when ``fetch`` allows), else estimated from the catalog."""
    installed = {m.name: m for m in store.installed()}
    out = []
    for variant in variants if variants is not None else spec.variants:
        name = spec.variant_name(variant)
        if name in installed:
            out.append(installed_candidate(installed[name]))
            continue
        header = remote_header(store.paths, spec, variant, fetch=fetch)
        if header is not None:
            out.append(Candidate.from_header(header, name=name, model=spec.name,
                                             installed=False))
        else:
            out.append(Candidate.from_spec(spec, variant))
    return out


def hub_candidates(store: ModelStore, ref: HubRef, listing: RepoListing, *,
                   fetch: HeaderFetch | None = None) -> tuple[list[Candidate], list[str]]:
    """The planner's candidates for a Hub repo's quants (all, or the one ``ref`` names): exact
    from the file when installed, else from the GGUF header (each shard's of a split model)
    read with Range requests and cached (over the network only when ``fetch`` allows). A
    quant whose header cannot be had is left out (a Hub model has no catalog estimate): the
    second list names them."""
    installed = {m.name: m for m in store.installed()}
    quants = [listing.pick(ref.quant)] if ref.quant else list(listing.quants)
    out, unknown = [], []
    for quant in quants:
        name = ref.with_quant(quant.quant).name
        if name in installed:
            out.append(installed_candidate(installed[name]))
            continue
        header = hub_header(store.paths, listing.repo, [f.path for f in quant.files], name,
                            fetch=fetch)
        if header is None:
            unknown.append(name)
        else:
            out.append(Candidate.from_header(header, name=name, model=ref.model,
                                             installed=False))
    return out, unknown


# --- choosing ----------------------------------------------------------------------------------
def best_or_smallest(result: Plan) -> Evaluation:
    """The planner's choice; when nothing fits, the variant with the smallest file (the one
    the plan's summary names)."""
    return result.choice or smallest_file(result.evaluations)


def pick_model(store: ModelStore, config: Config, hardware: HardwareProfile | None) -> str:
    """No model named: the config's default, else the planner's pick among the installed
    models, else the starter (installed from the ``starter`` extra on first use)."""
    if config.default_model:
        return config.default_model
    installed = store.installed()
    if not installed:
        return STARTER_NAME
    if len(installed) == 1 or hardware is None:
        return installed[0].name
    candidates = []
    for m in installed:
        try:
            candidates.append(installed_candidate(m))
        except LocalInferError as exc:
            log.warning("not planning %s: %s", m.name, exc)
    if not candidates:
        return installed[0].name
    from .planner.calibration import load_ratios  # the probes (~50 ms): only to plan

    try:
        result = plan(hardware, candidates, plan_prefs(config, load_ratios(hardware)))
    except LocalInferError:
        return candidates[0].name
    return best_or_smallest(result).candidate.name


def pull_target(store: ModelStore, ref: str, config: Config | None = None, *,
                hardware: HardwareProfile | None = None,
                prefs: PlanPrefs | None = None) -> PullTarget | HubTarget:
    """A pull reference -> one catalog variant. ``family:size-quant`` names it; with no
    quant (``qwen3:1.7b``) or no size (``qwen3``) the planner picks the best variant for
    ``hardware`` (this machine, probed) with ``prefs`` (from ``config``, read when not
    given), else the smallest, and the target says why. A Hub name (``hf.co/user/repo``)
    -> its quant: the one named, else Q4_K_M, else the planner's pick among the repo's."""
    if is_hub_name(ref):
        return _hub_pull_target(store, ref, config, hardware=hardware, prefs=prefs)
    specs, variant = lookup(store.catalog, ref)
    if variant is not None:
        return PullTarget(specs[0].variant_name(variant), specs[0], variant)
    candidates = [c for spec in specs for c in catalog_candidates(store, spec)]
    # The probes (~50 ms): only when the planner chooses.
    result, chosen = _planned(store, candidates, config, hardware, prefs)
    reason = result.summary
    if result.choice is None:
        reason += (f" Pulling the smallest, {chosen.name}, anyway; name another variant to"
                   " choose it.")
    spec, variant = store.catalog.lookup(chosen.name)
    assert variant is not None
    return PullTarget(chosen.name, spec, variant, reason=reason)


def _planned(store: ModelStore, candidates: list[Candidate], config: Config | None,
             hardware: HardwareProfile | None, prefs: PlanPrefs | None
             ) -> tuple[Plan, Candidate]:
    """The planner's result for ``candidates`` on this machine (probed unless given, with its
    calibration), and the one to pull: its choice, else the smallest."""
    from .hardware import probe
    from .planner.calibration import load_ratios

    hardware = hardware or probe()
    if prefs is None:
        prefs = plan_prefs(config or load_config(store.paths),
                           load_ratios(hardware, store.paths.cache_dir))
    result = plan(hardware, candidates, prefs)
    return result, best_or_smallest(result).candidate


def _hub_pull_target(store: ModelStore, ref: str, config: Config | None, *,
                     hardware: HardwareProfile | None, prefs: PlanPrefs | None) -> HubTarget:
    parsed = parse(ref)
    if store.offline:  # installed: its pull says so; else list_repo says it is offline
        installed = installed_hub_target(store, parsed)
        if installed is not None:
            return installed
    listing = list_repo(parsed.repo, offline=store.offline)
    if not listing.quants:
        raise no_gguf(listing)
    if parsed.quant is not None or listing.find(DEFAULT_QUANT) is not None:
        return hub_target(parsed, listing=listing)
    # No Q4_K_M: the planner chooses among the quants, from their headers (a few MB each).
    candidates, unknown = hub_candidates(store, parsed, listing, fetch=HeaderFetch())
    if not candidates:
        raise LocalInferError(
            f"{parsed.model} has no {DEFAULT_QUANT} and none of its GGUF headers could be read"
            f" to choose another ({', '.join(unknown)}); name a quant:"
            f" {', '.join(listing.quant_names())}.")
    result, chosen = _planned(store, candidates, config, hardware, prefs)
    reason = f"no {DEFAULT_QUANT} in hf.co/{listing.repo}; {result.summary}"
    if result.choice is None:
        reason += (f" Pulling the smallest, {chosen.name}, anyway; name another quant to"
                   " choose it.")
    quant = chosen.name.rsplit(":", 1)[1]
    target = hub_target(parsed.with_quant(quant), listing=listing)
    return HubTarget(target.ref, target.repo, target.quant, reason=reason)
def instruct_offer(store: ModelStore, config: Config, hardware: HardwareProfile,
                   calibration: Mapping[str, float] | None = None) -> Evaluation | None:
    """The instruct model to offer when only base (or embedding) models are installed: the
    planner's pick for ``hardware`` among the catalog's chat models. None when an installed
    model follows instructions (a file the catalog does not know counts as one), or when
    none of the catalog's fits."""
    catalog = store.catalog
    for m in store.installed():
        spec = catalog.models.get(m.model)
        if spec is None or not (spec.base or spec.embedding_only):
            return None
    candidates = [c for spec in catalog.models.values()
                  if not spec.base and not spec.embedding_only and "chat" in spec.family.use
                  for c in catalog_candidates(store, spec)]
    if not candidates:
        return None
    try:
        result = plan(hardware, candidates, plan_prefs(config, calibration))
    except LocalInferError:
        return None
    return result.choice
