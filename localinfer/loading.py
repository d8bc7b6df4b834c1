"""Loading a model file into an engine: validate the header, pick the chat template, plan the
load on this machine (and its RPC workers), start llama.cpp. The composition root above the
runtime: it alone brings the store, the selection, the planner and hardware to the engine,
which is handed what a plan decided (``LoadOptions``, the chat checkpoints) and reads none of
them. Importing llama.cpp is deferred to here so that commands that never load a model
(``--help``, ``list``, ``plan``) start fast."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from . import gguf
from .catalog import Catalog, load_catalog
from .config import FLASH_ATTN, Config
from .errors import (
    BackendUnavailable,
    InvalidRequest,
    LocalInferError,
    ModelNotFound,
    ModelTooLarge,
)
from .hardware import probe
from .hardware.profile import HardwareProfile
from .hardware.rpc import parse_endpoints, probe_workers, worker_answers
from .paths import get_paths
from .planner import (
    CHAT_CHECKPOINTS,
    Candidate,
    WorkerSplit,
    attention,
    physical_batch,
    plan,
    plan_split,
    shrinks_window_cache,
)
from .planner.attention import AttentionChoice
from .runtime.backend import Backend, LoadOptions, ProgressCallback
from .runtime.chat_template import BUILTIN_TEMPLATES, ChatTemplate
from .runtime.checkpoints import REREAD_TAIL
from .runtime.disk_cache import PrefixCache, PrefixStore, identity, model_file_id, open_store
from .runtime.engine import Engine
from .runtime.turns import TURNS, Turns
from .selection import model_settings, plan_prefs
from .store import CopyProgress, ModelStore, ResolvedModel

log = logging.getLogger(__name__)


def fallback_template(header: gguf.GGUFHeader, family: str | None,
                      catalog: Catalog | None = None) -> str | None:
    """The catalog's template for a file without its own: by the model's family when the
    store knows it, else by the file's architecture."""
    if header.chat_template:
        return None
    catalog = catalog or load_catalog()
    fam = (catalog.family_for(family) if family else None) or catalog.family_for(
        header.architecture)
    return BUILTIN_TEMPLATES.get(fam.chat_template) if fam else None


def is_base_model(name: str, catalog: Catalog | None = None) -> bool:
    """Whether the catalog lists ``name`` (``family:size`` or ``family:size-quant``) as a
    base model; False for a name it does not know."""
    try:
        spec, _ = (catalog or load_catalog()).lookup(name)
    except KeyError:
        return False
    return spec.base


def is_embedding_only(name: str, catalog: Catalog | None = None) -> bool:
    """Whether the catalog lists ``name`` as an embedding model (False for a name it does
    not know: the GGUF header still decides, see runtime/llama/model.py)."""
    try:
        spec, _ = (catalog or load_catalog()).lookup(name)
    except KeyError:
        return False
    return spec.embedding_only


def prefix_store(config: Config) -> PrefixStore | None:
    """The prefix cache on disk as config.toml bounds it (``prefix_cache_gb``), or None when
    it is off."""
    if config.prefix_cache_gb <= 0:
        return None
    return open_store(get_paths().prefix_cache_dir, int(config.prefix_cache_gb * 1e9))


def prefix_cache(config: Config | None, model_id: str, backend: Backend, name: str
                 ) -> PrefixCache | None:
    """One loaded model's view of the prefix cache (None: off, or a backend that saves no
    state, or no settings given); ``model_id``: its file's ``model_file_id``."""
    store = prefix_store(config) if config is not None else None
    if store is None or not backend.state_format:
        return None
    return PrefixCache(store, identity(model_id, backend.state_format),
                       min_tokens=config.prefix_cache_min_tokens if config else 1024,
                       reread_tail=REREAD_TAIL, label=name,
                       cut_back=not backend.needs_checkpoints)


def thread_memory(model_id: str, backend: Backend) -> Path | None:
    """The file the engine keeps the thread counts it learns for this model file
    (``model_id``) and build in (runtime.threads.ThreadMemory), or None where the count is
    fixed (``--threads``)."""
    if not backend.adaptive_threads:
        return None
    key = identity(model_id, f"{backend.state_format}|{backend.adaptive_threads} threads")
    return get_paths().thread_counts_dir / f"{key[:16]}.json"


def engine_files(config: Config | None, path: str | Path, backend: Backend, name: str
                 ) -> tuple[PrefixCache | None, Path | None, Path | None]:
    """What the engine keeps on disk for this model file and build: its view of the prefix
    cache, the file of its learned thread counts, the file's identity read once (neither
    where the file cannot be read for it), and the file it counts its work in where it is
    loaded with the settings (attention.workload_file)."""
    work = attention.workload_file(path) if config is not None else None
    try:
        model_id = model_file_id(path)
    except OSError as exc:
        log.warning("prefix cache and learned thread counts off for %s: %s", path, exc)
        return None, None, work
    return prefix_cache(config, model_id, backend, name), thread_memory(model_id, backend), work


def load_engine(
    path: str | Path,
    options: LoadOptions,
    *,
    name: str,
    family: str | None = None,
    progress: ProgressCallback | None = None,
    header: gguf.GGUFHeader | None = None,
    max_queue: int = 64,
    config: Config | None = None,
    chat_template: str | None = None,
    lora: tuple[str, ...] = (),
) -> Engine:
    """Load the GGUF at ``path`` with llama.cpp and return a running engine (with the prefix
    cache on disk that ``config`` sets, if given); its chats are rendered with
    ``chat_template`` (a preset's) when given, else the model's own, and the LoRA adapters
    ``lora`` (a preset's) are applied to its weights."""
    header = header or gguf.read_header(path)  # a bad file fails here, clearly, not in C++
    trained = header.context_length
    if options.n_ctx <= 0:
        raise InvalidRequest(f"the context must be at least 1 token, got {options.n_ctx}.")
    if trained and options.n_ctx > trained:
        raise InvalidRequest(
            f"a context of {options.n_ctx} tokens is beyond what {name} was trained for"
            f" ({trained}); ask for {trained} or less (--ctx, or ctx in config.toml: its"
            f" [models.\"NAME\"] table or LOCALINFER_CTX)."
        )
    if options.chat_template is None:
        options = replace(options, chat_template=fallback_template(header, family))
    if lora:
        missing = [p for p in lora if not Path(p).is_file()]
        if missing:
            raise ModelNotFound(f"the LoRA adapter {missing[0]} of {name} is gone; put it back"
                                " or make the preset again without it.")
        options = replace(options, lora_adapters=tuple(lora))
    if not options.base_model:
        options = replace(options, base_model=is_base_model(name))
    if not options.embedding_only:
        options = replace(options, embedding_only=is_embedding_only(name))
    fam = load_catalog().family_for(family) if family else None
    if fam is not None and fam.fim_order == "spm":
        options = replace(options, fim_spm=True)
    try:
        from .runtime.llama import LlamaBackend
    except ImportError as exc:
        raise BackendUnavailable(
            f"llama-cpp-python cannot be imported ({exc}). Install it with"
            " `pip install llama-cpp-python` (it builds llama.cpp from source, ~10 min)."
        ) from None
    options = with_batches(options, header, name)
    if options.rpc_servers:
        # llama.cpp aborts its process when a worker dies: that process must not be ours.
        from .runtime.isolated import IsolatedBackend

        isolated = IsolatedBackend(path, options, name=name, progress=progress,
                                   answers=worker_answers)
        cache, threads, work = engine_files(config, path, isolated, name)
        return Engine(isolated, load_ms=isolated.load_ms, max_queue=max_queue,
                      chat_checkpoints=CHAT_CHECKPOINTS, prefix_cache=cache,
                      thread_memory=threads, turns=cpu_turns(isolated), workload=work)
    backend = LlamaBackend(path, options, name=name, header=header, progress=progress)
    template = None
    if chat_template is not None:
        try:
            template = ChatTemplate(chat_template, bos_token=backend.info.bos_text,
                                    eos_token=backend.info.eos_text)
        except Exception as exc:  # a Jinja syntax error: the preset's, named
            backend.close()
            raise InvalidRequest(f"the chat template of {name} cannot be read: {exc}"
                                 ) from None
    cache, threads, work = engine_files(config, path, backend, name)
    return Engine(backend, load_ms=backend.load_ms, max_queue=max_queue,
                  chat_checkpoints=CHAT_CHECKPOINTS, chat_template=template,
                  prefix_cache=cache, thread_memory=threads, turns=cpu_turns(backend),
                  workload=work)


def cpu_turns(backend: Backend) -> Turns | None:
    """The process's turns on the CPU cores (runtime/turns.py) for a model with layers or
    experts (``n_cpu_moe``) on the CPU; None for one wholly on a GPU, whose decodes take a
    core only to wait."""
    return TURNS if backend.info.computes_on_cpu else None


def with_batches(options: LoadOptions, header: gguf.GGUFHeader, name: str) -> LoadOptions:
    """``options`` with the planner's physical batches for this model (``n_ubatch``, and
    ``cpu_window_ubatch`` for a CPU-only load), which the backend picks from as it loads."""
    if options.measured_ubatch:
        return replace(options, n_ubatch=min(options.n_batch, options.measured_ubatch),
                       cpu_window_ubatch=0)
    shape = Candidate.from_header(header, name=name)
    window = shrinks_window_cache(shape, cpu_only=True)
    return replace(options, n_ubatch=physical_batch(options.n_batch, shape, cpu_only=False),
                   cpu_window_ubatch=physical_batch(options.n_batch, shape, cpu_only=True)
                   if window else 0)


def worker_split(header: gguf.GGUFHeader, endpoints: tuple[str, ...], *,
                 hardware: HardwareProfile, config: Config, n_ctx: int, n_slots: int,
                 name: str = "model") -> WorkerSplit | None:
    """The planner's split of the model across this machine (``hardware``) and the RPC
    workers that answer now (probed here, before llama.cpp is given them: it aborts on one it
    cannot reach), or the one ``config.layer_split`` gives; None when no worker answers. A
    worker that does not answer is left out with a warning; one of another protocol version
    is refused (WorkerError)."""
    workers, skipped = probe_workers(endpoints, skip_unreachable=True)
    for reason in skipped:
        log.warning("leaving a worker out: %s", reason)
    if not workers:
        log.warning("no RPC worker answers (%s): loading on this machine alone",
                    ", ".join(endpoints))
        return None
    pooled = replace(hardware, workers=tuple(workers))
    prefs = replace(plan_prefs(config, n_slots=n_slots), n_ctx=n_ctx)
    layers = parse_layer_split(config.layer_split) if config.layer_split else None
    local_gpu = 1 if hardware.usable_gpus() and prefs.n_gpu_layers != 0 else 0
    n_devices = 1 + sum(len(w.devices) for w in workers) + local_gpu
    if layers is not None and len(layers) != n_devices:
        # A worker has gone since the split was written: still use the ones left.
        log.warning("layer_split %s names %d devices, and this machine and the workers that"
                    " answer have %d: planning a split over them instead", config.layer_split,
                    len(layers), n_devices)
        layers = None
    return plan_split(Candidate.from_header(header, name=name), pooled, prefs, n_ctx=n_ctx,
                      layers=layers, require_workers=config.layer_split is not None)


def with_workers(options: LoadOptions, header: gguf.GGUFHeader, endpoints: tuple[str, ...],
                 *, hardware: HardwareProfile, config: Config, name: str = "model"
                 ) -> LoadOptions:
    """``options`` with the layers ``worker_split`` puts on the workers (``split_options``);
    unchanged when no worker answers."""
    split = worker_split(header, endpoints, hardware=hardware, config=config,
                         n_ctx=options.n_ctx, n_slots=options.n_slots, name=name)
    return options if split is None else split_options(options, split, name)


def split_options(options: LoadOptions, split: WorkerSplit, name: str = "model") -> LoadOptions:
    """``options`` that load the model as ``split`` places it. A split that does not fit is
    ModelTooLarge; one that leaves the workers out (their link costs more than their layers
    save): the options as they were."""
    endpoints = tuple(dict.fromkeys(d.endpoint for d in split.remote_devices))
    if not split.fits:
        raise ModelTooLarge(f"{name} does not fit this machine and the workers"
                            f" ({', '.join(endpoints)}): {split.reason}")
    if not split.uses_workers:
        log.warning("%s stays on this machine: with the workers it would decode at %.1f tok/s"
                    " (%s)", name, split.decode_tps, "; ".join(split.notes) or "their link"
                    " costs more than their layers save")
        return options
    log.info("%s split across machines: %s; predicted %.1f tok/s", name,
             split.placement_text(), split.decode_tps)
    # The workers' devices, then this machine's GPU when the split gives it layers (its
    # weight is tensor_split's last: runtime.llama adds the device after the workers').
    return replace(options, rpc_servers=endpoints, tensor_split=split.tensor_split(),
                   n_gpu_layers=split.n_gpu_layers, local_gpu=split.local_gpu_layers > 0)


def parse_layer_split(text: str) -> list[int]:
    """``layer_split`` ("6,6,7": repeating layers on this machine's CPU, then on each worker
    device in order) as numbers; InvalidRequest naming the setting when it is not that."""
    try:
        layers = [int(part) for part in text.split(",")]
    except ValueError:
        layers = []
    if not layers or any(n < 0 for n in layers):
        raise InvalidRequest(f"layer_split {text!r} is not a list of layer counts such as"
                             " '6,6,6' (this machine's CPU first, then each worker device).")
    return layers


UNPLANNED_CTX = 4096
"""The context when nothing was planned (the planner refused the file; also the cap on the
settings' where the header names no trained length): LoadOptions' default, below the planner's
AGENT_CTX because no memory estimate backs it."""


def model_config(config: Config, model: ResolvedModel) -> Config:
    """The settings ``model`` loads with: the global ones with its own over them (its
    ``[models."NAME"]`` table, a preset's parameters: ``selection.model_settings``)."""
    own = model_settings(config, model)
    return config if own is None else config.replace(ctx=own.ctx, kv_type=own.kv_type)


def options_for(header: gguf.GGUFHeader, config: Config, *, n_slots: int | None = 1,
                hardware=None, name: str | None = None, path: str | Path | None = None,
                ) -> LoadOptions:
    """Load options from the planner's plan for this file on this machine (``hardware``, or
    a quick probe without the bandwidth measurement), each overridden by the settings:
    config.ctx, config.gpu_layers, config.threads (and config.slots when n_slots is None).
    On the CPU with flash attention left to ``auto`` and an F16 cache, the attention set-up
    this machine measured fastest for the file at ``path`` (``attention_for``)."""
    trained = header.context_length or UNPLANNED_CTX
    if hardware is None:
        hardware = probe(measure_bandwidth=False)
    slots = n_slots if n_slots is not None else config.slots
    candidate = Candidate.from_header(header, name=name or header.name or "model")
    ctx = config.ctx if config.ctx and config.ctx <= trained else None  # load_engine reports
    prefs = replace(plan_prefs(config, n_slots=slots), n_ctx=ctx)
    try:
        chosen = plan(hardware, [candidate], prefs).evaluations[0]
    except LocalInferError:
        chosen = None
    if chosen is not None and not chosen.fits:
        log.warning("%s may not fit in memory here: %s", name or "the model", chosen.reason)
    options = LoadOptions(
        n_ctx=config.ctx or (chosen.n_ctx if chosen else min(UNPLANNED_CTX, trained)),
        n_slots=slots or (chosen.n_slots if chosen else 1),
        n_gpu_layers=(config.gpu_layers if config.gpu_layers is not None
                      else chosen.n_gpu_layers if chosen else 0),
        n_cpu_moe=(chosen.n_cpu_moe if chosen and config.gpu_layers is None else 0),
        n_threads=config.threads or (chosen.n_threads if chosen else 0),
        adapt_threads=not config.threads,
        kv_type=config.kv_type,
        flash_attn=FLASH_ATTN[config.flash_attn],
    )
    rule_ubatch = physical_batch(options.n_batch, candidate, cpu_only=True)
    choice = attention_for(path, hardware, options, rule_ubatch) if path is not None else None
    if choice is None or (choice.flash_attn, choice.n_ubatch) == (False, rule_ubatch):
        return options  # the rule's own set-up: its batches, and its checkpoints, stand
    return replace(options, flash_attn=choice.flash_attn, measured_ubatch=choice.n_ubatch)


def attention_for(path: str | Path, hardware: HardwareProfile, options: LoadOptions,
                  rule_ubatch: int) -> AttentionChoice | None:
    """The attention set-up this machine measured fastest for the file at ``path``
    (planner.attention), where ``options`` leave it open: on the CPU (no layer on a GPU, no
    RPC worker), flash attention ``auto`` and an F16 cache. None: the rule stands."""
    if options.flash_attn is not None or options.kv_type != "f16" or options.rpc_servers \
            or (options.n_gpu_layers and hardware.gpus):
        return None
    entry = attention.measured(hardware).get(attention.file_key(path))
    if entry is None:
        return None
    return attention.choose(entry, attention.workload_seen(path), rule=(False, rule_ubatch))


def on_workers(options: LoadOptions, header: gguf.GGUFHeader, config: Config,
               name: str = "model") -> LoadOptions:
    """``with_workers`` for the config's ``workers`` (``serve --workers``), planned against
    this machine as it is now; the options unchanged without workers."""
    endpoints = parse_endpoints(config.workers)
    if not endpoints:
        return options
    return with_workers(options, header, endpoints, hardware=probe(measure_bandwidth=False),
                        config=config, name=name)


def open_engine(
    ref: str,
    config: Config,
    *,
    store: ModelStore | None = None,
    n_slots: int = 1,
    on_copy: CopyProgress | None = None,
    on_load: ProgressCallback | None = None,
) -> Engine:
    """Resolve a model name or path through the store and load it."""
    store = store or ModelStore()
    model = store.resolve(ref, progress=on_copy)
    config = model_config(config, model)
    header = gguf.read_header(model.path)
    options = options_for(header, config, n_slots=n_slots, name=model.name, path=model.path)
    options = on_workers(options, header, config, model.name)
    return load_engine(model.path, options, name=model.name, family=model.family,
                       progress=on_load, header=header, config=config,
                       chat_template=model.preset.template if model.preset else None,
                       lora=model.preset.adapters if model.preset else ())


def engine_factory(config: Config, *, n_slots: int | None = None, max_queue: int = 64):
    """The daemon's way to load a model: (resolved model, requested context) -> engine."""
    def load(model: ResolvedModel, num_ctx: int | None, progress: ProgressCallback | None = None
             ) -> Engine:
        header = gguf.read_header(model.path)
        if num_ctx and header.context_length:  # a request's num_ctx, capped as Ollama does
            num_ctx = min(num_ctx, header.context_length)
        # Slots from the settings, else the plan's (KV memory grows with slots x context).
        options = options_for(header, model_config(config, model).replace(ctx=num_ctx),
                              n_slots=n_slots or config.slots, name=model.name,
                              path=model.path)
        options = on_workers(options, header, config, model.name)
        return load_engine(model.path, options, name=model.name, family=model.family,
                           header=header, max_queue=max_queue, progress=progress,
                           config=config,
                           chat_template=model.preset.template if model.preset else None,
                           lora=model.preset.adapters if model.preset else ())

    return load

