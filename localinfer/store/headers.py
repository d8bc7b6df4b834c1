"""The GGUF headers of catalog variants and Hub models that are not installed, to plan with
exact sizes before a download: read from the Hub with HTTP Range requests (a few MB, not the
model; each shard's of a split model), and cached under ``<cache>/gguf-headers/`` so that
planning them again, even offline, needs no network."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import gguf
from ..catalog import ModelSpec, Variant
from ..errors import DownloadError, LocalInferError, OfflineError
from ..paths import Paths, atomic_write_text, ensure_dir, read_json_object
from . import hub, starter

log = logging.getLogger(__name__)


@dataclass
class HeaderFetch:
    """Whether ``remote_header`` may read headers over the network, and what it did."""

    enabled: bool = True
    """False offline, or after the Hub could not be reached once."""
    announce: Callable[[str], None] | None = None
    """Called with a variant's name before its header is read over the network."""
    notes: list[str] = field(default_factory=list)
    bytes_read: int = 0
    """Bytes received from the Hub for headers."""
    files_read: int = 0


def _cache_files(paths: Paths, repo: str, file: str) -> tuple[Path, Path]:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", f"{repo}--{file}".replace("/", "--"))
    folder = paths.cache_dir / "gguf-headers"
    return folder / f"{safe}.head", folder / f"{safe}.json"


def remote_header(paths: Paths, spec: ModelSpec, variant: Variant, *,
                  fetch: HeaderFetch | None = None) -> gguf.GGUFHeader | None:
    """The GGUF header of a catalog variant: from the cache in ``paths``, else (when ``fetch``
    allows) read from the Hub with Range requests and cached. None when neither is possible;
    ``fetch.notes`` says why."""
    repo, file = variant.repo or spec.repo, variant.file
    if not file:
        return None
    cached = _cached(paths, repo, file)
    if cached is not None:
        return cached
    if variant.source == f"pypi:{starter.STARTER_PACKAGE}":
        return starter.packaged_header()  # on this machine already: no network
    return _fetched(paths, repo, file, spec.variant_name(variant), fetch)


def hub_header(paths: Paths, repo: str, files: list[str], name: str, *,
               fetch: HeaderFetch | None = None) -> gguf.GGUFHeader | None:
    """The GGUF header of a Hub model: one file, or the shards of a split model (each
    shard's header read, then merged as ``gguf.read_header`` merges local shards); cached
    like ``remote_header``. None when a header can be neither found in the cache nor read;
    ``fetch.notes`` says why."""
    headers = []
    for number, file in enumerate(files, 1):
        label = f"{name} (file {number} of {len(files)})" if len(files) > 1 else name
        header = _cached(paths, repo, file) or _fetched(paths, repo, file, label, fetch)
        if header is None:
            return None
        headers.append(header)
    try:
        header = headers[0] if len(headers) == 1 else gguf.merge_split(
            headers, source=f"{repo}/{files[0]}")
        # Checked as a local file's header is (the planner lists each layer it declares).
        gguf.check_layers(header, f"{repo}/{files[0]}")
        return header
    except LocalInferError as exc:
        if fetch is not None:
            fetch.notes.append(f"{name}: {exc.one_line()}")
        return None


def _cached(paths: Paths, repo: str, file: str) -> gguf.GGUFHeader | None:
    data_path, meta_path = _cache_files(paths, repo, file)
    meta = read_json_object(meta_path) or None
    if meta is not None and data_path.is_file():
        try:
            return gguf.parse_header(data_path.read_bytes(), int(meta["size"]),
                                     source=f"{repo}/{file}")
        except (LocalInferError, gguf.NeedMoreData, KeyError, TypeError, ValueError):
            log.warning("ignoring the broken cached header %s", data_path)
    return None


def _fetched(paths: Paths, repo: str, file: str, name: str, fetch: HeaderFetch | None
             ) -> gguf.GGUFHeader | None:
    """Read ``repo``/``file``'s header from the Hub when ``fetch`` allows, and cache it."""
    if fetch is None or not fetch.enabled:
        return None
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
    data_path, meta_path = _cache_files(paths, repo, file)
    ensure_dir(data_path.parent)
    tmp = data_path.with_name(data_path.name + ".tmp")
    tmp.write_bytes(prefix)
    os.replace(tmp, data_path)
    atomic_write_text(meta_path, json.dumps({
        "repo": repo, "file": file, "size": remote.size, "etag": remote.etag,
        "commit": remote.commit, "header_bytes": len(prefix), "read_at": time.time(),
    }) + "\n")
    return header
