"""``localinfer hw`` and ``localinfer plan``: what this machine has, and what runs well on it.

Both are thin: ``hw`` prints the hardware profile the probes return; ``plan`` turns a model
name, a family, a GGUF path (or the whole catalog) into candidates, hands them to the pure
planner with the profile of this machine (or of ``--hardware FILE``) and prints its table.
For a model or variant that is not installed, ``plan`` reads only the GGUF header from the Hub
(HTTP Range requests, a few MB, cached) to plan with exact sizes; offline, or for a whole
family, it uses cached headers and else the catalog's estimates, marked ``~``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from ..config import Config
from ..errors import InvalidRequest, ModelNotFound, OfflineError
from ..hardware import bandwidth, load_profile, probe
from ..hardware.rpc import parse_endpoints, probe_workers
from ..paths import get_paths
from ..progress import TerminalProgress, human_bytes
from ..runtime.threads import forget_thread_memory
from . import worker
from .common import gpu_layers_text, print_table

PROFILE_HELP = """\
A --hardware file is the JSON that `localinfer hw --json` prints, or one written by hand:

  {"name": "16 GB MacBook Air M2", "ram_total_gib": 16, "ram_available_gib": 12,
   "cpu": {"model": "Apple M2", "physical_cores": 4, "logical_cores": 8, "ghz": 3.5,
           "flags": ["neon", "dotprod", "i8mm"]},
   "host_bandwidth_gbps": 80, "bandwidth_source": "spec",
   "gpus": [{"name": "Apple M2", "vendor": "apple", "kind": "integrated",
             "vram_total_gib": 10.7, "vram_free_gib": 10.7, "bandwidth_gbps": 100,
             "unified_memory": true, "fp16_tflops": 7.2}],
   "backends": ["CPU", "Metal"]}

Required: ram_total_gib, cpu.physical_cores, and for each GPU name, vendor (nvidia, amd,
intel, apple, other), vram_total_gib and bandwidth_gbps. Sizes are GiB, bandwidths GB/s.
ram_available_gib defaults to 80% of the total; host_bandwidth_gbps to an estimate from the
cores (for a data-sheet figure set bandwidth_source "spec"); "backends" lists what the
llama.cpp build can use (["CPU"] = a CPU-only build, which never offloads).
"workers" lists RPC workers whose devices the plan splits a model across:
  "workers": [{"endpoint": "192.168.1.20:50052", "rtt_ms": 0.4, "link_gbps": 0.112,
               "devices": [{"name": "CUDA0", "kind": "gpu", "memory_total_gib": 24,
                            "memory_free_gib": 23.2, "bandwidth_gbps": 1008}]}]
(rtt_ms, link_gbps and bandwidth_gbps 0 or absent = unknown: the plan assumes and says so).
Examples: tests/profiles/*.json (pool-*.json have workers)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hw", help="show this machine's hardware as the planner sees it",
                       description="Probe RAM, CPU, GPUs and the llama.cpp build, and measure"
                                   " host memory bandwidth (cached per machine).")
    p.add_argument("--json", action="store_true", help="print the profile as JSON (the"
                   " format `plan --hardware` reads)")
    p.add_argument("--remeasure", action="store_true",
                   help="measure the memory bandwidth again and compare with the cached figure"
                        " (a figure taken under load never replaces a quiet one; without"
                        " this, only a figure not taken on a quiet machine is measured again),"
                        " and the attention set-ups of each model `bench --prefill` measured"
                        " (at 1k and 4k tokens: a minute or two each for a small model)")
    p.add_argument("--reset", action="store_true",
                   help="forget this machine's bandwidth figures, decode calibration,"
                        " attention measurements and learned thread counts, then measure the"
                        " bandwidth again")
    p.add_argument("--workers", default=None, metavar="HOST:PORT,...",
                   help="also list these RPC workers' devices, memory and bandwidth, and the"
                        " link's round trip and throughput (default: config workers)")
    p.add_argument("--report", action="store_true",
                   help="print the last `localinfer bench` self-checks of this machine as"
                        " anonymous JSON lines (device, backend, model, quant, predicted,"
                        " measured) to paste into an issue")
    p.set_defaults(func=cmd_hw)

    p = sub.add_parser(
        "plan", help="which model variant fits and how fast it runs",
        description="Plan MODEL (gemma3:4b, gemma3:4b-q8_0), a FAMILY (qwen3), a .gguf PATH,"
                    " a Hub model (hf.co/USER/REPO[:QUANT]: each quant the repo offers, from"
                    " its GGUF header read with HTTP Range requests, before any download),"
                    " or the whole catalog: memory per device, GPU/CPU layer split, context,"
                    " predicted prefill and decode speed, and the choice with its reasons.",
        epilog=PROFILE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", metavar="MODEL|FAMILY|PATH",
                   help="what to plan (default: every model in the catalog)")
    p.add_argument("--ctx", type=int, metavar="N", help="context per sequence, tokens")
    p.add_argument("--min-tps", type=float, metavar="X",
                   help="decode speed to aim for, tok/s (default: config min_tps, 10)")
    p.add_argument("--slots", type=int, metavar="N",
                   help="parallel sequences (default 1; 0 = as many as fit, for the daemon)")
    p.add_argument("--hardware", metavar="PROFILE.json",
                   help="plan for the machine described in this file instead of this one")
    p.add_argument("--workers", default=None, metavar="HOST:PORT,...",
                   help="plan with these RPC workers' devices too, probed now (default: config"
                        " workers; with --hardware, the profile's \"workers\")")
    p.add_argument("--all", action="store_true",
                   help="with no MODEL: list every variant, not the best per model")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--offline", action="store_true", default=argparse.SUPPRESS,
                   help="do not read headers from the Hub: cached headers, else estimates")
    p.set_defaults(func=cmd_plan)


# --- hw ----------------------------------------------------------------------------------------
def cmd_hw(args: argparse.Namespace, config: Config) -> int:
    # The planner's caches of measured figures: not for building the parser.
    from ..planner import attention, calibration

    cache = get_paths().cache_dir / "hardware"
    if args.report:
        return hw_report()
    if args.reset:
        hw = probe(measure_bandwidth=False)  # the build's backends are in the calibration key
        forgot = [what for what, done in (
            ("bandwidth figures", bandwidth.forget(cache, bandwidth.profile_key(hw))),
            ("decode calibration", calibration.forget(hw)),
            ("attention measurements", attention.forget(hw)),
            ("learned thread counts", forget_thread_memory(get_paths().thread_counts_dir))) if done]
        print("Forgot this machine's " + (" and ".join(forgot) if forgot else "nothing (none"
                                          " cached)") + ".", file=sys.stderr)
    hw = probe(remeasure=args.remeasure, remeasure_under_load=True)
    if args.remeasure:
        remeasure_attention(hw, config)
    hw, worker_rows = worker.probe_for_hw(hw, args.workers or config.workers)
    if args.json:
        print(hw.to_json())
        return 0
    for label, value in hardware_lines(hw) + worker_rows:
        print(f"{label:<10} {value}")
    for label, value in measured_lines(bandwidth.cached(cache, bandwidth.profile_key(hw)),
                                       calibration.history(hw), hw.host_bandwidth_gbps):
        print(f"{label:<10} {value}")
    for entry in attention.measured(hw).values():
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry["at"]))
        use = ("used by CPU loads" if entry["busy_share"] <= attention.BUSY_LIMIT else
               f"not used (others kept {entry['busy_share']:.0%} of the cores busy)")
        sizes = {kind: sorted({int(r["tokens"]) for r in entry["rows"]
                               if attention.row_kind(r) == kind}) for kind in attention.KINDS}
        more = [f", a next turn after {n:,}" for n in sizes["turn"]] + [
            f", {n} stream{'s' if n > 1 else ''}" for n in sizes["decode"]] + [
            f", {n} after a line" for n in sizes["decode_short"]]
        print(f"{'ATTENTION':<10} {entry['model']}: set-ups measured at prompts of"
              f" {', '.join(f'{n:,}' for n in sizes['prompt'])} tokens{''.join(more)}, {when};"
              f" {use}")
    return 0


def remeasure_attention(hw, config: Config) -> None:
    """``hw --remeasure``: the attention set-ups of each model measured here before, again
    (the quick lengths), where its file is still there."""
    from ..bench.prefill_bench import QUICK_LENGTHS, prefill_lengths  # loads the engine
    from ..planner import attention

    for entry in attention.measured(hw).values():
        path = Path(entry["path"])
        if not path.is_file():
            print(f"hw: {entry['model']}: {path} is gone; its attention measurement stays"
                  " until `hw --reset`.", file=sys.stderr)
            continue
        bar = TerminalProgress(f"attention {entry['model']}", unit="prompts")

        def progress(stage: str, step: int, total: int, bar=bar, name=entry["model"]) -> None:
            bar.update(step - 1, total)
            if not bar.tty:
                print(f"hw [{step}/{total}] {name}: {stage}...", file=sys.stderr, flush=True)

        try:  # by its name, so that its record keeps it; else by the file
            result = prefill_lengths(entry["model"], config, lengths=QUICK_LENGTHS,
                                     progress=progress)
        except ModelNotFound:
            result = prefill_lengths(str(path), config, lengths=QUICK_LENGTHS,
                                     progress=progress)
        bar.finish(f"attention {entry['model']}: {result['verdict']}")
def hw_report() -> int:
    """``hw --report``: this machine's self-checks, one JSON line each, newest last."""
    from ..planner import selfcheck

    checks = selfcheck.checks(probe(measure_bandwidth=False))
    if not checks:
        print("No self-check recorded on this machine yet: run `localinfer bench` (it compares"
              " its measured decode and prefill with the plan), then `localinfer hw --report`.",
              file=sys.stderr)
        return 1
    for check in checks:
        print(check.report())
    return 0


def measured_lines(figures, runs, host_bandwidth_gbps: float) -> list[tuple[str, str]]:
    """When and under what load each cached figure was taken: the bandwidth figures (the one
    in use first) and the decode calibration's runs, each marked used or not and why."""
    lines = []
    if figures is not None:
        for m in (figures.quiet, figures.under_load):
            if m is not None:
                use = "in use" if m is figures.current else "not used (a quiet figure exists)"
                lines.append(("MEASURED", f"{m.describe()}; {m.trials or '?'} passes,"
                                          f" {m.seconds:.2f} s; {use}"))
        if figures.suspect:
            lines.append(("SUSPECT", f"{figures.suspect}: measured again at the next probe"))
    for backend, records in sorted(runs.items()):
        for r in records:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.at))
            load = (f"{'quiet' if r.quiet else 'under load'} ({r.load.describe()})" if r.load
                    else "load not recorded")
            if r.calibrates(host_bandwidth_gbps):
                use = "used"
            elif not r.quiet:
                use = "not used (not a quiet run)"
            else:
                use = f"not used (predicted with {r.host_bandwidth_gbps:.1f} GB/s)"
            lines.append(("CALIBRATE", f"{backend} x{r.ratio:.2f} ({r.model}: {r.measured_tps:.1f}"
                                       f" tok/s, predicted {r.predicted_tps:.1f}) {when},"
                                       f" {load}; {use}"))
    if not runs:
        lines.append(("CALIBRATE", "none yet (`localinfer run` and `bench` record measured"
                                   " against predicted decode)"))
    return lines


def hardware_lines(hw) -> list[tuple[str, str]]:
    cpu = hw.cpu
    ghz = f", {cpu.ghz:.1f} GHz" if cpu.ghz else ""
    flags = " ".join(cpu.flags) or "none detected"
    lines = [
        ("CPU", f"{cpu.model}: {cpu.physical_cores} cores / {cpu.logical_cores} threads{ghz};"
                f" runtime threads {cpu.runtime_threads}"),
        ("ISA", f"{cpu.simd} ({flags})"),
        ("RAM", f"{hw.ram_total_gib:.1f} GiB total, {hw.ram_available_gib:.1f} GiB available"
                + (f" (cgroup limit {hw.memory_limit_gib:.1f} GiB)" if hw.memory_limit_gib
                   else "") + f", swap {hw.swap_total_gib:.1f} GiB"),
    ]
    if hw.host_bandwidth_gbps:
        one = (f", 1 core {hw.host_bandwidth_1core_gbps:.1f} GB/s"
               if hw.host_bandwidth_1core_gbps else "")
        lines.append(("BANDWIDTH", f"{hw.host_bandwidth_gbps:.1f} GB/s host read,"
                                   f" {hw.bandwidth_source}{one}"))
    else:
        lines.append(("BANDWIDTH", "unknown (run `localinfer hw` to measure it)"))
    usable = {gpu.name: backend for gpu, backend in hw.usable_gpus()}
    if not hw.gpus:
        lines.append(("GPU", "none found"))
    for gpu in hw.gpus:
        memory = ("shared" if gpu.unified_memory else "VRAM")
        use = f"usable via {usable[gpu.name]}" if gpu.name in usable else \
            "NOT usable by this llama.cpp build"
        lines.append(("GPU", f"{gpu.name} ({gpu.vendor}, {gpu.kind}): {memory}"
                             f" {gpu.vram_free_gib:.1f}/{gpu.vram_total_gib:.1f} GiB free,"
                             f" {gpu.bandwidth_gbps:.0f} GB/s; {use}"))
    offload = "can offload to a GPU" if hw.can_offload else "CPU-only build: no GPU offload"
    built = (f"; built with {', '.join(hw.build_backends)}" if hw.build_backends else "")
    lines.append(("LLAMA.CPP", f"backends {', '.join(hw.backends)} ({offload}){built}"))
    for note in hw.notes:
        lines.append(("NOTE", note))
    return lines


# --- plan --------------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace, config: Config) -> int:
    # The planner and the store: not for building the parser.
    from ..planner import plan
    from ..planner.calibration import load_ratios
    from ..selection import best_or_smallest, plan_prefs
    from ..store import HeaderFetch

    if args.ctx is not None and args.ctx <= 0:
        raise InvalidRequest(f"--ctx must be at least 1 token, got {args.ctx}.")
    if args.min_tps is not None and args.min_tps < 0:
        raise InvalidRequest(f"--min-tps must be 0 or more, got {args.min_tps}.")
    if args.slots is not None and args.slots < 0:
        raise InvalidRequest(f"--slots must be 0 (as many as fit) or more, got {args.slots}.")
    fetch = HeaderFetch(enabled=not config.offline, announce=None if args.json else (
        lambda name: print(f"Reading the GGUF header of {name} from the Hub...",
                           file=sys.stderr)))
    groups = _candidates(args.model, fetch)  # a bad name fails before any probing
    if args.hardware:
        if args.workers:
            raise InvalidRequest("--workers probes workers from this machine; for a machine"
                                 " described in --hardware, list them in its \"workers\".")
        hw = load_profile(args.hardware)
        calibration: dict[str, float] = {}
    else:
        hw = probe()
        calibration = load_ratios(hw)
        endpoints = parse_endpoints(args.workers or config.workers)
        if endpoints:
            hw = dataclasses.replace(hw, workers=tuple(probe_workers(endpoints)[0]))
    # One model: its own settings from config.toml ([models."NAME"]: ctx, kv_type) count.
    own = config.model_settings(args.model, groups[0][0]) if len(groups) == 1 else None
    if own is not None:
        config = config.for_model(args.model, groups[0][0])
    prefs = plan_prefs(config.replace(ctx=args.ctx, min_tps=args.min_tps), calibration,
                       n_slots=None if args.slots == 0 else (args.slots or 1))
    every = [c for _, cands in groups for c in cands]
    overall = plan(hw, every, prefs)
    if args.model is None and not args.all:
        # One row per model: the variant the planner picks for that model alone.
        rows = []
        for _, cands in groups:
            try:
                sub = plan(hw, cands, prefs)
            except InvalidRequest:
                continue  # this model cannot take the asked context; others can
            chosen = best_or_smallest(sub)
            rows.append(next((e for e in overall.evaluations
                              if e.candidate is chosen.candidate), chosen))
        shown = rows
    else:
        shown = list(overall.evaluations)
    notes = _header_notes(shown, fetch, offline=config.offline, single=_names_one_model(
        args.model))
    if not args.hardware and args.model is not None:
        notes += _attention_notes(hw, shown, config)
    if args.json:
        data = overall.to_dict()
        data["hardware"] = hw.to_dict()
        data["shown"] = [e.candidate.name for e in shown]
        data["notes"] = notes
        data["settings"] = own.to_json() if own else None
        print(json.dumps(data, indent=2))
        return 0
    _print_plan(hw, overall, shown, calibration, from_file=args.hardware)
    if own is not None:
        print(f"Settings of {groups[0][0]} in config.toml: "
              + ", ".join(f"{k} {v}" for k, v in own.to_json().items()) + ".")
    for note in notes:
        print(note)
    return 0


def _attention_notes(hw, shown, config: Config) -> list[str]:
    """How a CPU load of each shown model sets up attention here: measured, or by rule."""
    # The measurement cache and the planner: not for building the parser.
    from ..planner import N_UBATCH, attention, physical_batch

    if config.flash_attn != "auto" or config.kv_type != "f16":
        return [f"Attention: flash attention {config.flash_attn}, {config.kv_type} KV cache"
                " (the settings')."]
    measured = {entry["model"]: entry for entry in attention.measured(hw).values()}
    notes = []
    for e in shown:
        if e.n_gpu_layers and hw.gpus:
            continue  # on a GPU llama.cpp chooses
        entry = measured.get(e.candidate.name)
        # The rule's batch at the default n_batch (512, as N_UBATCH).
        rule = (False, physical_batch(N_UBATCH, e.candidate, cpu_only=True))
        choice = attention.choose(entry, attention.workload_seen(entry["path"]), rule=rule) \
            if entry else None
        if choice is not None:
            notes.append(f"Attention for {e.candidate.name} on this CPU: {choice.reason}.")
        elif entry is not None:
            why = ("was taken under load; run `localinfer bench --prefill"
                   f" {e.candidate.name}` again on a quieter machine"
                   if entry["busy_share"] > attention.BUSY_LIMIT else
                   "does not hold every set-up at the same sizes; run `localinfer bench"
                   f" --prefill {e.candidate.name}` again")
            notes.append(f"Attention for {e.candidate.name} on this CPU: flash attention off"
                         f" (the rule): its measurement {why}.")
        else:
            notes.append(f"Attention for {e.candidate.name} on this CPU: flash attention off"
                         " (the rule, not measured here: `localinfer bench --prefill"
                         f" {e.candidate.name}` measures the set-ups at agent lengths).")
    return notes


def _names_one_model(ref: str | None) -> bool:
    # The store: not for building the parser.
    from ..store import ModelStore, is_hub_name, looks_like_path

    if ref is None or looks_like_path(ref):
        return False
    if is_hub_name(ref):
        return True
    try:
        ModelStore().catalog.lookup(ref.strip().lower())
    except KeyError:
        return False
    return True


def _header_notes(shown, fetch, *, offline: bool, single: bool) -> list[str]:
    """Where the sizes came from: headers read from the Hub, or estimates and why."""
    notes = []
    if fetch.files_read:
        notes.append(f"Read the GGUF headers of {fetch.files_read} file(s) from the Hub"
                     f" ({human_bytes(fetch.bytes_read)}, HTTP Range requests; cached).")
    notes += fetch.notes
    estimated = [e.candidate.name for e in shown if e.candidate.estimated]
    if estimated:
        if offline:
            notes.append(f"Offline: {len(estimated)} size(s) marked ~ are the catalog's"
                         " estimates (no header cached for them), so the plan is an estimate"
                         " too.")
        elif not single:
            notes.append("Sizes marked ~ are the catalog's estimates; `localinfer plan"
                         " family:size` reads the exact sizes from the Hub (a few MB each).")
    return notes


def _candidates(ref: str | None, fetch=None):
    """[(model name, [Candidate...])] for a model, a family, a path, or the whole catalog.
    Headers of variants not installed are read from the Hub (``fetch``) only for one model
    or variant; otherwise only cached ones are used."""
    # GGUF parsing, the planner and the store: not for building the parser.
    from .. import gguf
    from ..planner import Candidate
    from ..selection import catalog_candidates, installed_candidate
    from ..store import HeaderFetch, ModelStore, is_hub_name, looks_like_path

    store = ModelStore()
    catalog = store.catalog
    if ref is not None and looks_like_path(ref):
        model = store.resolve(ref)
        header = gguf.read_header(model.path)
        return [(model.name, [Candidate.from_header(header, name=model.name)])]
    if ref is not None and is_hub_name(ref):
        return [_hub_candidates(store, ref, fetch or HeaderFetch(enabled=False))]
    cached_only = HeaderFetch(enabled=False)

    if ref is None:
        return [(s.name, catalog_candidates(store, s, fetch=cached_only))
                for s in catalog.models.values()]
    name = ref.strip().lower()
    try:
        spec, variant = catalog.lookup(name)
        variants = [variant] if variant is not None else None
        return [(spec.name, catalog_candidates(store, spec, variants, fetch=fetch))]
    except KeyError:
        pass
    specs = catalog.in_family(name)
    if specs:
        return [(s.name, catalog_candidates(store, s, fetch=cached_only)) for s in specs]
    # A model installed under a name of its own (`add --name`, a file's own name) or a
    # preset (the model it is over), as `show`, `run` and `bench` take them.
    preset = store.presets.get(name)
    installed = store.installed()
    named = store.named(preset.model if preset is not None else name, installed)
    if named is not None:
        return [(named.model, [installed_candidate(named)])]
    families = ", ".join(sorted(catalog.families))
    raise ModelNotFound(f"unknown model or family {ref!r}: the catalog has {families}; give"
                        " family:size (gemma3:4b), family:size-quant, an installed model's"
                        " name (`localinfer list`), or a .gguf path.")


def _hub_candidates(store, ref: str, fetch):
    """A Hub model's quants (or the one named), from their GGUF headers: read with Range
    requests before any download and cached; offline, the installed ones only."""
    # The planner's candidates and the Hub listing: not for building the parser.
    from ..selection import hub_candidates, installed_candidate
    from ..store import list_repo, no_gguf
    from ..store.hub_names import parse

    parsed = parse(ref)
    if not fetch.enabled:  # offline: what is installed of it
        have = [m for m in store.installed()
                if m.model == parsed.model and (parsed.quant is None or m.name == parsed.name)]
        if not have:
            raise OfflineError(f"{parsed.name} is not installed and offline mode is on: its"
                               " quants cannot be listed without the Hub.")
        return parsed.model, [installed_candidate(m) for m in have]
    listing = list_repo(parsed.repo)
    if not listing.quants:
        raise no_gguf(listing)
    candidates, unknown = hub_candidates(store, parsed, listing, fetch=fetch)
    if not candidates:
        raise ModelNotFound(f"none of the GGUF headers of {parsed.name} could be read: "
                            + " ".join(fetch.notes))
    if unknown:
        fetch.notes.append(f"Not planned (header unreadable): {', '.join(unknown)}.")
    return parsed.model, candidates


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}G"


def _print_plan(hw, overall, shown, calibration, *, from_file: str | None) -> None:
    where = f"the profile {from_file}" if from_file else "this machine"
    gpu = hw.usable_gpus()
    gpu_text = ", ".join(f"{g.name} {g.vram_free_gib:.1f} GiB free, {g.bandwidth_gbps:.0f} GB/s"
                         f" via {b}" for g, b in gpu) or (
        "no GPU usable" + (" (CPU-only llama.cpp build)" if hw.gpus else ""))
    bw = (f"{hw.host_bandwidth_gbps:.1f} GB/s {hw.bandwidth_source}"
          if hw.host_bandwidth_gbps else "bandwidth not measured")
    print(f"Planning for {where}: {hw.ram_available_gib:.1f}/{hw.ram_total_gib:.1f} GiB RAM"
          f" available, {hw.cpu.runtime_threads} threads, host {bw}; {gpu_text}.")
    for remote in hw.workers:
        print(f"RPC worker {_worker_text(remote)}.")
    rows = [("VARIANT", "SIZE", "FITS", "GPU LAYERS", "RAM", "VRAM", "CTX", "PREFILL*",
             "DECODE*", "VERDICT", "REASON")]
    for e in shown:
        c = e.candidate
        size = _gib(c.file_bytes) + ("~" if c.estimated else "")
        rows.append((
            c.name + (" (installed)" if c.installed else ""), size,
            "yes" if e.fits else "no",
            gpu_layers_text(e.n_gpu_layers, c.n_layers) + (" pooled" if e.split else ""),
            _gib(e.host.total_bytes), _gib(e.gpu.total_bytes) if e.gpu else "-",
            str(e.n_ctx) + (f"x{e.n_slots}" if e.n_slots > 1 else ""),
            f"{e.prefill_tps:.0f}", "-" if c.embedding_only else f"{e.decode_tps:.1f}",
            e.verdict, e.reason,
        ))
    print_table(rows)
    print(f"Choice: {overall.summary}")
    if overall.choice is not None and not overall.choice.candidate.embedding_only:
        e = overall.choice
        (d_low, d_high), (p_low, p_high) = e.decode_range, e.prefill_range
        print(f"Interval: decode {d_low:.1f}-{d_high:.1f} tok/s, prefill {p_low:.0f}-{p_high:.0f}"
              f" tok/s (where ~80% of the published {e.interval_backend} llama-bench rows fell"
              " around the prediction; `localinfer bench` measures this machine).")
    if overall.choice is not None and overall.choice.ctx_reason:
        print(f"Context: {overall.choice.ctx_reason}.")
    # One split: the choice's, else the best pooled candidate's (the one the summary names).
    pooled = [e for e in ([overall.choice] if overall.choice else []) + shown
              if e.split is not None and e.fits]
    if pooled:
        _print_split(pooled[0] if pooled[0] is overall.choice else
                     max(pooled, key=lambda e: (e.candidate.quality_score, e.decode_tps)))
    for e in shown:
        _print_placements(e)
    notes = ["* tok/s predicted: decode = sum of bytes read per token / (efficiency x"
             " bandwidth) + per-token costs; prefill = FLOPs / compute. ~ = size estimated"
             " from the catalog."]
    if calibration:
        ratios = ", ".join(f"{k} x{v:.2f}" for k, v in sorted(calibration.items()))
        notes.append(f"decode calibrated from this machine's runs: {ratios}.")
    elif not from_file:
        notes.append("uncalibrated: `localinfer run` records measured/predicted decode.")
    if pooled:
        notes.append("pooled: decode = each device's bytes / (efficiency x bandwidth) + its"
                     " per-layer costs, in llama.cpp's device order, + per worker device one"
                     " round trip, a 2 ms hop and its activations (the last: the logits) over"
                     " the link.")
    for note in notes:
        print(note, file=sys.stdout)


def _print_placements(e) -> None:
    """A mixture of experts too large for the GPU: the two placements weighed, side by side."""
    if not e.placements:
        return
    print(f"\nPlacements of {e.candidate.name} weighed (context {e.n_ctx}):")
    rows = [("PLACEMENT", "GPU LAYERS", "VRAM", "RAM", "PREFILL*", "DECODE*", "")]
    for p in e.placements:
        chosen = p.n_cpu_moe == e.n_cpu_moe and p.n_gpu_layers == e.n_gpu_layers
        rows.append((p.label, gpu_layers_text(p.n_gpu_layers, e.candidate.n_layers),
                     _gib(p.vram_bytes), _gib(p.ram_bytes), f"{p.prefill_tps:.0f}",
                     f"{p.decode_tps:.1f}", "chosen" if chosen else ""))
    print_table(rows)
    if e.n_cpu_moe:
        print(f"llama.cpp: n_gpu_layers {e.n_gpu_layers}, expert tensors of layers"
              f" 0-{e.n_cpu_moe - 1} in RAM (llama-server --n-cpu-moe {e.n_cpu_moe})")


def _worker_text(worker) -> str:
    """One RPC worker from a profile: its devices and the link, unmeasured figures said."""
    devices = ", ".join(
        f"{d.name} ({d.description + ', ' if d.description else ''}{d.kind}"
        f" {d.memory_free_gib:.1f}/{d.memory_total_gib:.1f} GiB free, "
        + (f"{d.bandwidth_gbps:.0f} GB/s)" if d.bandwidth_gbps else "bandwidth unknown)")
        for d in worker.devices)
    rtt = f"round trip {worker.rtt_ms:.2f} ms" if worker.rtt_ms else "round trip unmeasured"
    link = f"{worker.link_gbps:.3g} GB/s" if worker.link_gbps else "throughput unmeasured"
    return f"{worker.endpoint}{' (' + worker.name + ')' if worker.name else ''}: {devices};" \
           f" link {rtt}, {link}"


def _print_split(e) -> None:
    """The split of one pooled evaluation across machines: layers, memory and time per
    device, the network's share, llama.cpp's parameters."""
    split = e.split
    ts = ",".join(f"{w:g}" for w in split.tensor_split())
    print(f"\nSplit of {e.candidate.name} across machines (context {split.n_ctx}):"
          f" llama.cpp n_gpu_layers {split.n_gpu_layers}, tensor_split {ts}")
    rows = [("DEVICE", "LAYERS", "MEMORY", "BANDWIDTH", "MS/TOKEN")]
    for d in split.devices:
        if d.n_layers:
            layers = f"{d.first_layer}-{d.first_layer + d.n_layers - 1}"
        else:
            layers = "-"
        if d.holds_output:
            layers += " + output"
        rows.append((d.label, layers,
                     f"{_gib(d.memory.total_bytes)}/{_gib(d.memory.budget_bytes)}",
                     f"{d.bandwidth_gbps:.0f} GB/s" + ("?" if d.note.startswith("bandwidth")
                                                        else ""),
                     f"{d.decode_ms:.1f}"))
    rows.append((f"network ({split.round_trips} round trip(s),"
                 f" {human_bytes(split.network_bytes)}/token)", "", "", "",
                 f"{split.decode_ms['network']:.1f}"))
    rows.append(("launch, logits, sampling", "", "", "", f"{split.decode_ms['fixed']:.1f}"))
    print_table(rows)
    total = 1000 / split.decode_tps
    print(f"decode ~{split.decode_tps:.1f} tok/s predicted: {total:.1f} ms per token, of which"
          f" the network {split.network_ms:.1f} ms ({100 * split.network_ms / total:.0f}%).")
    for note in split.notes:
        print(f"note: {note}.")
