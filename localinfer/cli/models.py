"""``localinfer pull``, ``list``, ``show``, ``rm`` and ``add``: the model store from the shell.

Thin: each command parses its flags, calls the store (``pull`` asks ``selection`` which variant
to download when the name leaves it open) and prints. ``pull`` draws the download as a progress
bar and turns Ctrl+C into a "run it again to resume" message (the store keeps the partial
file); ``rm`` asks first and will not remove what the daemon has loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..errors import Cancelled, InvalidRequest, ModelInUse, ModelNotFound
from ..hardware import probe
from ..progress import TerminalProgress, human_bytes
from .common import gpu_layers_text, kept_text, print_table

if TYPE_CHECKING:  # the store loads the catalog: not for building the parser
    from ..store import InstalledModel, ModelStore

TEMPLATE_LINES = 8
"""Lines of the chat template ``show`` prints (``--template`` prints it all)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pull", help="download a model from the catalog or the Hub (resumable, verified)",
        description="Download MODEL from the Hugging Face Hub into the store. MODEL is"
                    " family:size-quant (qwen3:1.7b-q5_k_m); without the quant (qwen3:1.7b)"
                    " or the size (qwen3) the planner picks the best variant for this machine"
                    " and says why. Any GGUF on the Hub: hf.co/USER/REPO[:QUANT] (also"
                    " huggingface.co/USER/REPO, USER/REPO:QUANT); without a quant, Q4_K_M,"
                    " else the planner's pick; a split model's shards come as one model."
                    " Run it again after an interruption to resume. The SHA-256"
                    " the Hub publishes and the GGUF header are checked before the model is"
                    " listed. Gated repos need HF_TOKEN; HF_ENDPOINT selects a mirror.")
    p.add_argument("model", metavar="MODEL")
    _offline_flag(p)
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("list", aliases=["ls"], help="list installed models",
                       description="List the installed models and presets (name, quant, size,"
                                   " file), and downloads that stopped before the end.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "show", help="what an installed model is and how it runs here",
        description="Architecture, parameters, quant, context, chat template, license, file"
                    " and the plan for this machine of an installed MODEL (or a .gguf PATH).")
    p.add_argument("model", metavar="MODEL|PATH")
    p.add_argument("--template", action="store_true", help="print the whole chat template")
    p.add_argument("--modelfile", action="store_true",
                   help="print a Modelfile that makes it (`localinfer create -f`)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "rm", help="remove installed models",
        description="Remove MODEL from the store (its file, unless it was added with --link,"
                    " and any partial download). Asks first unless --yes.")
    p.add_argument("models", nargs="+", metavar="MODEL")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser(
        "add", help="register a local .gguf file as a model",
        description="Check that PATH is a GGUF model and add it to the store: copied (the"
                    " default) or linked where it is (--link). Its name comes from the file's"
                    " header (family:size-quant) unless --name is given.")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--name", help="family:size (the quant is appended), or family")
    p.add_argument("--link", action="store_true",
                   help="do not copy: point at the file where it is (keep it there)")
    p.set_defaults(func=cmd_add)


def _offline_flag(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: given after the command it sets the same flag as `localinfer --offline`,
    # and left out it does not reset that one.
    p.add_argument("--offline", action="store_true", default=argparse.SUPPRESS,
                   help="never touch the network (as HF_HUB_OFFLINE=1)")


def _store(config: Config):
    from ..store import ModelStore  # the store: not for building the parser

    return ModelStore(offline=config.offline)


# --- pull --------------------------------------------------------------------------------------
class _PullDisplay:
    """Progress bars for the download and the verification, one line each."""

    def __init__(self) -> None:
        self.bar: TerminalProgress | None = None
        self.stage = ""
        self.started = time.monotonic()
        self.first = 0
        self.last = None

    def __call__(self, step) -> None:
        if step.status in ("downloading", "verifying"):
            if step.status != self.stage:
                self.finish()
                self.first = step.completed
                self.stage = step.status
                self.started = time.monotonic()
                if step.status == "downloading" and step.completed and step.total:
                    print(f"Resuming at {human_bytes(step.completed)} of"
                          f" {human_bytes(step.total)}.", file=sys.stderr)
                label = (f"Pulling {step.name}" if step.status == "downloading"
                         else "Verifying SHA-256")
                self.bar = TerminalProgress(label, total=step.total or None,
                                            initial=step.completed)
            assert self.bar is not None
            self.bar.update(step.completed, step.total or None)
        self.last = step

    def finish(self, message: str | None = None) -> None:
        if self.bar is None:
            return
        if message is None and self.last is not None and self.stage:
            seconds = max(time.monotonic() - self.started, 1e-3)
            done = self.last.completed - self.first
            # The hash read, not yet compared: a mismatch is said after this line.
            what = "Downloaded" if self.stage == "downloading" else "Hashed"
            message = (f"{what} {human_bytes(done)} in {seconds:.1f}s"
                       f" ({human_bytes(done / seconds)}/s)")
        self.bar.finish(message)
        self.bar = None
        self.stage = ""


def cmd_pull(args: argparse.Namespace, config: Config) -> int:
    if not args.debug:  # its retry warnings would break the progress line
        from huggingface_hub.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    # The planner and the store: not for building the parser.
    from ..selection import pull_target
    from ..store import HubTarget, pull_model

    store = _store(config)
    target = pull_target(store, args.model, config)
    if target.reason:
        print(f"{args.model} -> {target.reason}")
    if isinstance(target, HubTarget) and target.note:
        print(f"localinfer: note: {target.note}", file=sys.stderr)
    display = _PullDisplay()
    try:
        model = pull_model(store, target, progress=display)
    except KeyboardInterrupt:
        display.finish("Stopped.")
        partial = next((p for p in store.partials() if p.name == target.name), None)
        raise Cancelled(f"the pull of {target.name} was interrupted{kept_text(partial)}; run"
                        f" `localinfer pull {target.name}` again to resume.") from None
    finally:
        display.finish()
    final = display.last
    print(final.message if final is not None and final.message else f"pulled {model.name}")
    return 0


# --- list --------------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace, config: Config) -> int:
    store = _store(config)
    models = store.installed()
    missing = store.missing()
    if args.json:
        print(json.dumps([{**asdict(m), "base_model": _is_base(store, m),
                           "file_missing": m in missing}
                          for m in sorted(models + missing, key=lambda m: m.name)]
                         + [{**asdict(m), "manifest_unreadable": True}
                            for m in store.unreadable()]
                         + [{**p.to_json(), "preset": True} for p in store.presets.all()],
                         indent=2))
        return 0
    if not models and not missing and not store.unreadable():
        print("No models installed. `localinfer run gemma3:270m \"Hello\"` installs the starter"
              " model; `localinfer pull NAME` downloads one.")
    elif models or missing:
        rows = [("NAME", "QUANT", "SIZE", "PATH")]
        for m in sorted(models + missing, key=lambda m: m.name):
            notes = [note for note, present in (("linked", m.linked),
                                                ("FILE MISSING", m in missing),
                                                ("base model", _is_base(store, m))) if present]
            rows.append((m.name, m.quant, human_bytes(m.size_bytes),
                         m.path + (f" ({', '.join(notes)})" if notes else "")))
        print_table(rows)
        if any(_is_base(store, m) for m in models):
            print("A base model continues text; it does not follow instructions.")
    presets = store.presets.all()
    if presets:
        print()
        preset_rows: list[tuple[str, str, str]] = [("PRESET", "OVER", "SETS")]
        for preset in presets:
            sets = [k for k, v in (("system", preset.system), ("template", preset.template),
                                   ("messages", preset.messages), ("adapters", preset.adapters),
                                   ("license", preset.license)) if v]
            sets += [f"{k} {v}" for k, v in preset.parameters.items()]
            preset_rows.append((preset.name, preset.model, ", ".join(sets) or "-"))
        print_table(preset_rows)
    for m in missing:
        print(m.missing_file_error().message)
    for m in store.unreadable():
        print(store.unreadable_error(m).message)
    for partial in store.partials():
        if not partial.size_bytes:
            continue  # nothing downloaded yet: nothing to resume (or to show)
        total = f" of {human_bytes(partial.total_bytes)}" if partial.total_bytes else ""
        # Of a model installed already, it is an update: rm would delete the model too.
        drop = (f"`localinfer rm {partial.name}` deletes it and the installed model"
                if any(m.name == partial.name for m in models + missing)
                else f"`localinfer rm {partial.name}` deletes it")
        print(f"Partial download: {partial.name}, {human_bytes(partial.size_bytes)}{total}"
              f" (`localinfer pull {partial.name}` resumes it, {drop}).")
    return 0


# --- show --------------------------------------------------------------------------------------
def cmd_show(args: argparse.Namespace, config: Config) -> int:
    # GGUF parsing, the planner and the store: not for building the parser.
    from .. import gguf
    from ..planner import Candidate, plan
    from ..planner.calibration import load_ratios
    from ..runtime.chat_template import BUILTIN_TEMPLATES
    from ..sampling_defaults import model_defaults
    from ..selection import model_settings, plan_prefs
    from ..store import looks_like_path, validate_name

    store = _store(config)
    installed = None
    preset = None if looks_like_path(args.model) else store.presets.get(args.model)
    if preset is not None:  # the preset, then the model it is over
        if args.json:
            print(json.dumps({"preset": preset.to_json()}, indent=2))
            return 0
        if args.template and preset.template is not None:
            print(preset.template)
            return 0
        if args.modelfile:
            print(preset.modelfile(), end="")
            return 0
        _print_preset(preset, model_settings(config, store.resolve_preset(preset)))
        args.model = preset.model
    if looks_like_path(args.model):
        resolved = store.resolve(args.model)
        path, name = resolved.path, resolved.name
    else:
        try:
            installed = store.find_installed(args.model, file_missing_ok=True)
        except ModelNotFound:
            typed, name = args.model.strip(), validate_name(args.model)
            if not _in_catalog(store, name):
                raise
            raise ModelNotFound(f"{typed} is not installed: `localinfer plan {name}` shows what"
                                f" it needs here, `localinfer pull {name}` downloads it."
                                ) from None
        if installed.file_missing:
            raise installed.missing_file_error()
        path, name = installed.path, installed.name
    if args.modelfile:
        print(f"# Modelfile of {name}\nFROM {name if installed else path}")
        return 0
    header = gguf.read_header(path)
    catalog = store.catalog
    # The family by the model's name says its title and license; by the file's architecture
    # alone it only picks the chat template the loader would (any "llama" file is not
    # Llama 3.2, nor under its license).
    named = catalog.families.get(installed.family) if installed else None
    family = named or catalog.family_for(header.architecture)
    base_model = installed is not None and _is_base(store, installed)
    # The template a chat uses, as the loader and the engine choose it: the file's, else the
    # catalog's built-in one for the family, else the generic ChatML.
    template = header.chat_template
    template_source = "the file"
    if template is None:
        builtin = family.chat_template if family and family.chat_template in \
            BUILTIN_TEMPLATES else None
        if builtin is not None:
            template_source = f"built-in {builtin!r} (the file has none)"
        elif not base_model:
            builtin = "chatml"
            template_source = ("generic 'chatml' (neither the file nor the catalog has"
                               " one)")
        template = BUILTIN_TEMPLATES.get(builtin or "")
    license_ = header.license or (named.license if named else "") or "not stated"
    # The default sampling of its chat and `run`: its card's, its file's, config.toml's.
    sampling = model_defaults(catalog, installed.model if installed else name,
                              header.metadata, config, name)

    hw = probe()
    candidate = Candidate.from_header(header, name=name,
                                      model=installed.model if installed else name)
    result = plan(hw, [candidate], plan_prefs(config, load_ratios(hw)))
    evaluation = result.evaluations[0]

    if args.template:
        if template is None:
            print("no chat template: base model")
        else:
            if template_source != "the file":  # stdout stays the template alone
                print(f"# chat template of {name}: {template_source}", file=sys.stderr)
            print(template)
        return 0
    if args.json:
        data: dict[str, Any] = {
            "name": name, "path": str(path), "architecture": header.architecture,
            "parameters": header.parameter_count, "quant": header.quant,
            "context_length": header.context_length, "layers": header.block_count,
            "embedding_length": header.embedding_length, "vocab_size": header.vocab_size,
            "license": license_, "base_model": base_model,
            "chat_template": header.chat_template,
            "chat_template_builtin": (None if header.chat_template
                                      else family.chat_template if family else None),
            "installed": asdict(installed) if installed else None,
            "sampling": {key: {"value": value, "source": sampling.sources[key]}
                         for key, value in sampling.values.items()},
            "plan": result.to_dict(),
        }
        print(json.dumps(data, indent=2))
        return 0

    size = installed.size_bytes if installed else header.file_size
    rows = [
        ("architecture", header.architecture + (f" ({named.title})" if named else "")),
        *([("kind", "base model: continues text, does not follow instructions")]
          if base_model else []),
        ("parameters", _params(header.parameter_count)),
        ("quantization", header.quant),
        ("context length", f"{header.context_length} tokens (trained)"),
        ("layers", f"{header.block_count} (+1 output layer, which --gpu-layers counts),"
                   f" embedding {header.embedding_length},"
                   f" {header.head_count} heads ({header.head_count_kv} KV),"
                   f" vocabulary {header.vocab_size}"),
        ("KV cache", f"{header.kv_bytes_per_token() / 1024:.1f} KiB per token (F16)"),
        ("license", license_),
        ("file", f"{path} ({human_bytes(size)})" + (" (linked)" if installed and
                                                    installed.linked else "")),
    ]
    if installed:
        if installed.sha256:
            rows.append(("sha256", installed.sha256))
        source = installed.source + (f" @ {installed.revision[:12]}" if installed.revision
                                     else "")
        rows += [("source", source),
                 ("added", datetime.fromtimestamp(installed.added).strftime("%Y-%m-%d %H:%M"))]
    rows.append(("sampling", "; ".join(sampling.lines()) or
                 "llama.cpp's defaults (nothing in its card's catalog entry, its file or"
                 " config.toml)"))
    print(name)
    for key, value in rows:
        print(f"  {key:<15} {value}")
    print()
    if template is None:
        print("Chat template: none (base model).")
    elif template_source == "the file":
        lines = template.strip("\n").splitlines()
        more = (f"; the first {TEMPLATE_LINES} of {len(lines)} lines, `--template` prints it"
                " all" if len(lines) > TEMPLATE_LINES else "")
        print(f"Chat template (from {template_source}{more}):")
        for line in lines[:TEMPLATE_LINES]:
            print(f"  {line}")
    else:
        print(f"Chat template: {template_source}; `--template` prints it.")
    print()
    print("Plan for this machine:")
    e = evaluation
    where = (f"{gpu_layers_text(e.n_gpu_layers, e.candidate.n_layers)} layers on"
             f" {e.gpu.device}" if e.gpu
             else "all layers on the CPU")
    if e.fits:
        memory = f"RAM {e.host.total_bytes / 2**30:.1f} GiB" + (
            f", VRAM {e.gpu.total_bytes / 2**30:.1f} GiB" if e.gpu else "")
        if e.candidate.embedding_only:  # it generates nothing: no decode speed
            print(f"  {where}, context {e.n_ctx}: {memory}; an embedding model, predicted"
                  f" to embed {e.prefill_tps:.0f} tokens/s.")
        else:
            print(f"  {where}, context {e.n_ctx}: {memory}; predicted prefill"
                  f" {e.prefill_tps:.0f} tok/s, decode {e.decode_tps:.1f} tok/s"
                  f"{' (calibrated)' if e.calibration != 1.0 else ''}.")
    else:
        print(f"  does not fit: {e.reason}.")
    if e.verdict == "slow":
        print(f"  {e.reason}.")
    return 0


def _print_preset(preset, own) -> None:
    """A preset's own settings, as `show` prints them before its model's."""
    print(f"{preset.name}: a preset over {preset.model}")
    if preset.system is not None:
        print(f"  {'system':<15} {preset.system!r}")
    if own is not None and own.to_json():
        print(f"  {'parameters':<15} " + ", ".join(f"{k} {v}" for k, v in
                                                   own.to_json().items()))
    if preset.stop:
        print(f"  {'stop':<15} " + ", ".join(repr(s) for s in preset.stop))
    for role, content in preset.messages:
        print(f"  {'message':<15} {role}: {content!r}")
    if preset.template is not None:
        print(f"  {'template':<15} its own (`show {preset.name} --template` prints it)")
    for adapter in preset.adapters:
        print(f"  {'adapter':<15} {adapter}")
    for text in preset.license:  # the model's own license follows with the model
        first = text.strip().splitlines()[0] if text.strip() else ""
        print(f"  {'license':<15} {first[:60]}{'…' if len(first) > 60 else ''}")
    print()


def _is_base(store: ModelStore, model: InstalledModel) -> bool:
    """Whether an installed model is a base model, as its catalog entry says."""
    spec = store.catalog.models.get(model.model)
    return spec is not None and spec.base


def _in_catalog(store, name: str) -> bool:
    """Whether ``name`` is a model `pull` can fetch: in the catalog, or a Hub name."""
    from ..store import is_hub_name  # the store: not for building the parser

    if is_hub_name(name):
        return True
    try:
        store.catalog.lookup(name)
    except KeyError:
        return bool(store.catalog.in_family(name))
    return True


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


# --- rm ----------------------------------------------------------------------------------------
def cmd_rm(args: argparse.Namespace, config: Config) -> int:
    from ..store import InstalledModel  # the store: not for building the parser

    store = _store(config)
    found = []
    for ref in list(args.models):
        preset = store.presets.get(ref)
        if preset is not None:  # a preset: its JSON only, never the file it is over
            store.presets.remove(preset.name)
            print(f"removed the preset {preset.name} ({preset.model} is kept)")
            args.models.remove(ref)
            continue
        try:
            found.append(store.find_installed(ref, file_missing_ok=True))
        except ModelNotFound:
            partial = store.partial_named(ref)
            if partial is None:
                raise
            found.append(partial)
    if not found:
        return 0
    loaded = _loaded_in_daemon()
    for item in found:
        if isinstance(item, InstalledModel) and (item.name in loaded or item.path in loaded):
            raise ModelInUse(f"the daemon has {item.name} loaded; unload it with `localinfer"
                             f" stop {item.name}`, then remove it.")
    if not args.yes:
        if not sys.stdin.isatty():
            raise InvalidRequest("`rm` asks before removing models and this is not a terminal;"
                                 " pass --yes to remove without asking.")
        what = ", ".join(_describe(item) for item in found)
        sys.stderr.write(f"Remove {what}? [y/N] ")
        sys.stderr.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            print("Nothing removed.")
            return 0
    for item in found:
        gone = isinstance(item, InstalledModel) and item.file_missing  # before the removal
        store.remove(item.name)
        if isinstance(item, InstalledModel):
            kept = (f" (its file {item.path} was already gone)" if gone
                    else f" (the linked file {item.path} is kept)" if item.linked
                    else f" (deleted {item.path})" if item.parts <= 1
                    else f" (deleted its {item.parts} files: {item.path} and the shards beside it)")
            print(f"removed {item.name}{kept}")
        else:
            print(f"removed the partial download of {item.name}")
    return 0


def _describe(item) -> str:
    from ..store import InstalledModel  # the store: not for building the parser

    if isinstance(item, InstalledModel):
        if item.file_missing:
            return f"{item.name} (its file {item.path} is gone)"
        if item.linked:
            return f"{item.name} (a link to {item.path}, which is kept)"
        return f"{item.name} ({human_bytes(item.size_bytes)}, {item.path})"
    return f"the partial download of {item.name} ({human_bytes(item.size_bytes)})"


def _loaded_in_daemon() -> set[str]:
    """Names and paths of what a running daemon holds (or is loading); empty when none runs."""
    from ..client import DaemonClient  # httpx: not for building the parser

    client = DaemonClient.discover()
    if client is None:
        return set()
    with client:
        status = client.status()
    held = {status["loading"]} if status.get("loading") else set()
    for entry in status.get("loaded", []):
        info = entry.get("info") or {}
        held.update(str(info[k]) for k in ("name", "path") if info.get(k))
    return held


# --- add ---------------------------------------------------------------------------------------
def cmd_add(args: argparse.Namespace, config: Config) -> int:
    store = _store(config)
    bar: list[TerminalProgress] = []

    def copied(done: int, total: int) -> None:
        if not bar:
            bar.append(TerminalProgress("Copying into the store", total=total))
        bar[0].update(done, total)

    try:
        model = store.add(args.path, name=args.name, link=args.link, progress=copied)
    finally:
        for b in bar:
            b.finish()
    how = f"linked to {model.path}" if model.linked else f"copied to {model.path}"
    print(f"added {model.name} ({model.quant}, {human_bytes(model.size_bytes)}): {how}")
    return 0
