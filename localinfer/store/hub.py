"""Talking to the Hugging Face Hub: a file's metadata, a resumable download, and a GGUF header
read with HTTP Range requests.

The protocol is huggingface_hub's own: ``get_hf_file_metadata`` sends the HEAD to the
``resolve`` endpoint (X-Repo-Commit, X-Linked-Etag = the file's SHA-256, X-Linked-Size, the
redirect to the CDN), ``http_get`` streams the file with a ``Range`` header from a given offset
and retries a dropped connection where it stopped. Around it this module adds what localinfer
needs: the bytes go to a partial file of the caller's that outlives the process (since 1.0,
huggingface_hub deletes its own partial file when a download fails), a cancel flag, and errors a
user can act on. ``HF_ENDPOINT`` is read on every call (a mirror, or the tests' local Hub),
``HF_TOKEN`` opens gated repos. The caller checks offline mode first (``HF_HUB_OFFLINE``, read
now by ``offline``): nothing here is called offline.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .. import __version__, gguf
from ..errors import (
    AccessDenied,
    Cancelled,
    DownloadError,
    InvalidModelFile,
    LocalInferError,
    ModelNotFound,
    OfflineError,
    StoreError,
)

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
SHA256_RE = re.compile(r"[0-9a-f]{64}")

HEADER_FIRST_READ = 2 << 20
"""The first Range read of a remote header: most GGUF headers are 1-7 MB (the vocabulary)."""
HEADER_GROWTH = 1.5
"""Each further read grows the prefix by half, so at most a third more is read than needed."""
MAX_HEADER_READ = gguf.MAX_HEADER_BYTES

BytesCallback = Callable[[int, int], None]
"""Called with (bytes done, bytes total; 0 when unknown)."""


def endpoint() -> str:
    """The Hub to talk to: ``HF_ENDPOINT``, read now (huggingface_hub reads it at import)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def has_token() -> bool:
    """Whether requests to the Hub carry a token: HF_TOKEN (or the older
    HUGGING_FACE_HUB_TOKEN), or the one ``hf auth login`` saved, as huggingface_hub sends."""
    from huggingface_hub import get_token

    return bool(get_token())


def offline() -> bool:
    """``HF_HUB_OFFLINE`` is set, read now (huggingface_hub reads it at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class RemoteFile:
    """One file of a Hub repo, as the HEAD of its ``resolve`` URL describes it."""

    repo: str
    file: str
    revision: str
    url: str
    """The ``resolve`` URL."""
    location: str
    """Where the bytes are: the CDN URL the Hub redirects to (or ``url``)."""
    size: int | None
    etag: str
    """X-Linked-Etag (the SHA-256 of an LFS file) or the ETag."""
    commit: str
    """The commit the revision resolved to (X-Repo-Commit)."""

    @property
    def sha256(self) -> str | None:
        """The SHA-256 the Hub publishes for the file (LFS files: every GGUF), else None."""
        return self.etag if SHA256_RE.fullmatch(self.etag) else None

    @property
    def page(self) -> str:
        return f"{endpoint()}/{self.repo}"


def _hf_headers() -> dict[str, str]:
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers(library_name="localinfer", library_version=__version__)


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    return (parts.scheme, (parts.hostname or "").lower(),
            parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0))


def _headers_for(remote: RemoteFile) -> dict[str, str]:
    """Headers for fetching the bytes: the token goes to the Hub, never to a CDN's signed URL."""
    headers = _hf_headers()
    if _origin(remote.location) not in (_origin(remote.url), _origin(endpoint())):
        headers.pop("authorization", None)
    return headers


def file_info(repo: str, file: str, *, revision: str = "main", retry: bool = True
              ) -> RemoteFile:
    """The Hub's metadata for ``repo``/``file`` (one HEAD request, following the Hub's own
    redirects). Raises ModelNotFound, AccessDenied or DownloadError."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo, file, revision=revision, endpoint=endpoint())
    try:
        meta = get_hf_file_metadata(url, library_name="localinfer",
                                    library_version=__version__, retry_on_errors=retry)
    except Exception as exc:
        error = translate(exc, repo=repo, file=file)
        if error is None:
            raise
        raise error from None
    if not meta.commit_hash or not meta.etag:
        missing = "X-Repo-Commit" if not meta.commit_hash else "ETag"
        raise DownloadError(
            f"{endpoint()} answered for {repo}/{file} without an {missing} header: it does not"
            " look like a Hugging Face Hub. Check HF_ENDPOINT (and any proxy)."
        )
    return RemoteFile(repo=repo, file=file, revision=revision, url=url,
                      location=meta.location or url, size=meta.size, etag=meta.etag,
                      commit=meta.commit_hash)


class _ProgressBar:
    """What ``http_get`` drives as its progress bar (the part of tqdm it uses). It reports
    each chunk and stops the download when the cancel flag is set: raised before the chunk
    is written, so the partial file always ends on a whole chunk."""

    def __init__(self, *, on_bytes: BytesCallback | None, cancel: threading.Event | None,
                 total: int | None = None, initial: int = 0, **_: Any) -> None:
        self.on_bytes = on_bytes
        self.cancel = cancel
        self.total = total or 0
        self.n = initial
        if on_bytes:
            on_bytes(self.n, self.total)

    def update(self, n: int = 1) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("the download was cancelled.")
        self.n += n
        if self.on_bytes:
            self.on_bytes(self.n, self.total)

    def close(self) -> None:
        pass

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def download(remote: RemoteFile, dest: Path, *, on_bytes: BytesCallback | None = None,
             cancel: threading.Event | None = None) -> None:
    """Download ``remote`` into ``dest``, continuing after the bytes ``dest`` already has (a
    ``Range`` request). On any failure or cancel the bytes received so far stay in ``dest``."""
    from huggingface_hub.file_download import http_get

    if cancel is not None and cancel.is_set():
        raise Cancelled("the download was cancelled.")
    done = dest.stat().st_size if dest.exists() else 0
    bar = functools.partial(_ProgressBar, on_bytes=on_bytes, cancel=cancel)
    with open(dest, "ab") as out, _hub_errors(remote):
        http_get(remote.location, out, resume_size=done, headers=_headers_for(remote),
                 expected_size=remote.size, displayed_filename=remote.file,
                 tqdm_class=bar)  # type: ignore[arg-type]


def read_header(remote: RemoteFile, *, on_bytes: BytesCallback | None = None
                ) -> tuple[gguf.GGUFHeader, bytes, int]:
    """Read only the GGUF header of ``remote`` with Range requests: 2 MiB, then half as much
    again each time the parser needs more. Returns the header, the prefix it was parsed from
    (to cache) and the bytes received."""
    if remote.size is None:
        raise DownloadError(f"the Hub did not say how large {remote.repo}/{remote.file} is,"
                            " so its header cannot be read in parts.")
    source = f"{remote.repo}/{remote.file}"
    headers = _headers_for(remote)
    buf = bytearray()
    want = min(HEADER_FIRST_READ, remote.size)
    while True:
        buf += _read_range(remote, len(buf), want - 1, headers)
        if on_bytes:
            on_bytes(len(buf), remote.size)
        try:
            header = gguf.parse_header(buf, remote.size, source=source)
        except gguf.NeedMoreData as more:
            if len(buf) >= remote.size:
                raise InvalidModelFile(f"{source} ends inside its GGUF header.") from None
            want = min(remote.size, max(more.needed, int(len(buf) * HEADER_GROWTH)))
            if want > MAX_HEADER_READ:
                raise InvalidModelFile(f"{source} has a GGUF header larger than"
                                       f" {MAX_HEADER_READ >> 20} MiB.") from None
            continue
        return header, bytes(buf[: min(len(buf), header.data_offset)]), len(buf)


@contextlib.contextmanager
def _hub_errors(remote: RemoteFile) -> Iterator[None]:
    """Turn huggingface_hub's and the network's exceptions into the store's errors."""
    try:
        yield
    except (LocalInferError, KeyboardInterrupt):
        raise
    except Exception as exc:
        error = translate(exc, repo=remote.repo, file=remote.file)
        if error is None:
            raise
        raise error from None


def _read_range(remote: RemoteFile, start: int, end: int, headers: dict[str, str]) -> bytes:
    """Bytes ``start..end`` (inclusive) of the file; never more, even from a server that
    ignores ``Range`` and sends the whole file."""
    from huggingface_hub import constants
    from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

    want = end - start + 1
    with _hub_errors(remote):
        with http_stream_backoff("GET", remote.location,
                                 headers={**headers, "Range": f"bytes={start}-{end}"},
                                 timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                                 max_retries=2) as response:
            hf_raise_for_status(response)
            skip = start if response.status_code == 200 else 0
            if response.status_code == 206:
                content_range = response.headers.get("Content-Range", "")
                if not content_range.startswith(f"bytes {start}-"):
                    raise DownloadError(
                        f"asked for bytes {start}-{end} of {remote.repo}/{remote.file}, the"
                        f" server sent {content_range or 'no Content-Range'}.")
            out = bytearray()
            for chunk in response.iter_bytes():
                if skip:
                    dropped = min(skip, len(chunk))
                    chunk, skip = chunk[dropped:], skip - dropped
                out += chunk
                if len(out) >= want:
                    break
    if len(out) < want:
        raise DownloadError(f"the server sent {len(out)} of the {want} bytes asked for from"
                            f" {remote.repo}/{remote.file}.")
    return bytes(out[:want])


def translate(exc: BaseException, *, repo: str, file: str) -> LocalInferError | None:
    """A huggingface_hub or network error as one of localinfer's, with what to do about it."""
    import httpx2
    from huggingface_hub.errors import (
        FileMetadataError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, LocalInferError):
        return exc
    hub = endpoint()
    page = f"{hub}/{repo}"
    token = has_token()
    status = getattr(getattr(exc, "response", None), "status_code", None)
    server = (getattr(exc, "server_message", None) or "").strip().rstrip(".")
    if isinstance(exc, OfflineModeIsEnabled):
        return OfflineError(f"cannot download {repo}/{file}: HF_HUB_OFFLINE is set.")
    if isinstance(exc, GatedRepoError):
        if status == 403 or token:
            return AccessDenied(
                f"{repo} is a gated repo and the Hub token (HF_TOKEN, or the one"
                f" `hf auth login` saved) has no access to it"
                f" (HTTP {status}). Ask for access at {page}, then try again.")
        return AccessDenied(
            f"{repo} is a gated repo (HTTP {status}): accept its terms at {page}, create a"
            f" read token at {hub}/settings/tokens and set HF_TOKEN to it.")
    if isinstance(exc, RepositoryNotFoundError):
        private = "" if token else " If it is private, set HF_TOKEN to a token that can read it."
        return ModelNotFound(f"the Hub has no repo {repo} (HTTP {status}).{private} Check the"
                             " repo in the catalog (LOCALINFER_CATALOG).")
    if isinstance(exc, RevisionNotFoundError):
        return ModelNotFound(f"{repo} has no revision for {file} (HTTP {status}).")
    if isinstance(exc, RemoteEntryNotFoundError):
        return ModelNotFound(f"{repo} has no file {file} (HTTP {status}): it may have been"
                             f" renamed; see {page}/tree/main.")
    if isinstance(exc, HfHubHTTPError):
        detail = f": {server}" if server else ""
        if status == 401:
            return AccessDenied(
                f"the Hub refused the request for {repo}/{file} (HTTP 401{detail}). Check the"
                f" Hub token (HF_TOKEN, or `hf auth login`; {hub}/settings/tokens)." if token else
                f"{repo} needs a login (HTTP 401{detail}): set HF_TOKEN to a read token from"
                f" {hub}/settings/tokens.")
        if status == 403:
            return AccessDenied(f"the Hub refused access to {repo}/{file} (HTTP 403{detail}).")
        if status == 416:  # a resume past the file's end: it is shorter than listed
            return DownloadError(f"{hub} has fewer bytes of {repo}/{file} than it lists (HTTP"
                                 f" 416{detail}).", title="size mismatch")
        if status == 429:
            return DownloadError(f"the Hub is rate-limiting requests (HTTP 429{detail}); wait a"
                                 " minute and try again.")
        return DownloadError(f"{hub} answered HTTP {status} for {repo}/{file}{detail}.")
    if isinstance(exc, FileMetadataError):
        return DownloadError(f"{hub} did not describe {repo}/{file} as the Hub does ({exc});"
                             " check HF_ENDPOINT and any proxy.")
    if isinstance(exc, httpx2.ConnectError):
        return DownloadError(f"cannot connect to {hub} ({exc}). Check the network (or"
                             " HF_ENDPOINT), or use a model already installed.")
    if isinstance(exc, httpx2.TimeoutException):
        return DownloadError(f"{hub} did not answer in time ({type(exc).__name__}).")
    if isinstance(exc, httpx2.HTTPError):
        return DownloadError(f"the connection to the Hub failed: {exc}.")
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno == errno.ENOSPC:
            return StoreError(f"the disk filled up while downloading {file}: {exc}.",
                              title="disk full")
        return StoreError(f"cannot write the download of {file}: {exc}.")
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return DownloadError(f"the server sent a different number of bytes than it announced"
                             f" for {repo}/{file}.", title="size mismatch")
    return None  # not a network or Hub error: a bug, let it show
