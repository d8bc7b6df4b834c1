"""A local stand-in for the Hugging Face Hub's file protocol, for tests reached via HF_ENDPOINT.

Two loopback HTTP servers, like the real thing: the Hub answers ``HEAD/GET
/<org>/<repo>/resolve/<revision>/<file>`` with a 302 to a CDN URL and the metadata headers
huggingface_hub reads (X-Repo-Commit, X-Linked-Etag = SHA-256, X-Linked-Size, ETag), or with
its error codes (X-Error-Code RepoNotFound / EntryNotFound / RevisionNotFound / GatedRepo);
``GET /api/models/<org>/<repo>[/revision/<rev>]`` (``HfApi.model_info``) lists the repo's files,
with their sizes and LFS SHA-256 when asked (``?blobs=true``), for anyone, gated repos
included, as the Hub does (only their files need the token); the
CDN serves the bytes with single ``Range`` requests (206 + Content-Range). Every request is
recorded with the body bytes actually sent, and the CDN can misbehave on demand: cut the
connection at an offset, pause there until released, flip a byte, or answer 503.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN = "hf_localinfer_test_token"
CHUNK = 1 << 20

# The repos the tests serve, and the catalog (LOCALINFER_CATALOG) that points at them.
REPO = "localinfer-test/tiny-gemma-GGUF"
GATED_REPO = "localinfer-test/gated-gemma-GGUF"
FILE = "tiny-gemma-270m-Q4_K_M.gguf"
# Repos for Hub names (hf.co/...): small generated GGUFs (hub_fixtures.tiny_quant_files) in
# several quants, one of them split; one without Q4_K_M; one with no GGUF at all; and the
# starter split into two shards (hub_fixtures.split_repo).
QUANTS_REPO = "localinfer-test/Tiny-Quants-GGUF"
NO_Q4_REPO = "localinfer-test/tiny-noq4-GGUF"
NO_GGUF_REPO = "localinfer-test/safetensors-only"
SPLIT_REPO = "localinfer-test/tiny-gemma-split-GGUF"
SPLIT_STEM = "tiny-gemma-270m-Q4_K_M"
FILE_TYPES = {"Q4_K_M": 15, "Q8_0": 7, "F16": 1, "Q2_K": 10}
"""llama.cpp's file types (general.file_type) of the generated quants."""
STARTER_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
STARTER_BYTES = 253_113_024

_MODEL = """
[[models]]
name = "{name}"
family = "tinygemma"
params = 268_098_176
layers = 18
embedding = 640
heads = 4
kv_heads = 1
head_dim = 256
vocab = 262_144
context = 32_768
sliding_window = 512
swa_period = 6
feed_forward = 2048
tied_embeddings = true
repo = "{repo}"
default_quant = "Q4_K_M"
variants = [
{variants}
]
"""

_Q4 = f'  {{ quant = "Q4_K_M", file = "{FILE}" }},'
_MODELS = [
    ("tinygemma:270m", REPO, _Q4),
    ("tinygemma:gated", GATED_REPO, _Q4),
    ("tinygemma:missing", "localinfer-test/no-such-repo", _Q4),
    # Two variants for the planner to choose from; the Q8_0 file is not on the Hub.
    ("tinygemma:pick", REPO,
     f'  {{ quant = "Q4_K_M", file = "{FILE}", size = {STARTER_BYTES} }},\n'
     '  { quant = "Q8_0", file = "tiny-gemma-270m-Q8_0.gguf", size = 285_000_000 },'),
]

CATALOG = """\
# The tests' catalog: added to the packaged one through LOCALINFER_CATALOG.
schema = 1

[families.tinygemma]
title = "Tiny Gemma (tests)"
architecture = "gemma3"
chat_template = "gemma"
license = "gemma"
description = "The starter model's file, served by the tests' local Hub."
""" + "".join(_MODEL.format(name=name, repo=repo, variants=variants)
              for name, repo, variants in _MODELS)


@lru_cache(maxsize=8)
def sha256_of(path: str, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Served:
    """One request as the servers saw it."""

    server: str
    """"hub" or "cdn"."""
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int = 0
    authorized: bool = False
    """It carried the test token."""
    had_auth: bool = False
    """It carried an Authorization header at all."""


@dataclass
class HubFile:
    path: Path
    sha256: str
    size: int


@dataclass
class Repo:
    files: dict[str, HubFile]
    gated: bool = False
    commit: str = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Faults:
    """Misbehaviour of the CDN, each applied to GETs of file bodies."""

    cut_at: int | None = None
    """Close the connection once the response reaches this file offset (once)."""
    down_after_cut: bool = False
    """After the cut, answer 503 (the Hub stays down: the pull gives up)."""
    pause_at: int | None = None
    """Stop at this file offset until ``release()`` (once)."""
    corrupt_at: int | None = None
    """Send this file offset's byte flipped (every time)."""
    down: bool = False
    """Answer every GET with 503."""
    down_for: set[str] = field(default_factory=set)
    """Answer GETs of these files (by SHA-256) with 503."""
    rate_bytes_per_s: float | None = None
    """Send no faster than this (to watch a progress bar, or press Ctrl+C by hand)."""
    paused: threading.Event = field(default_factory=threading.Event)
    resume: threading.Event = field(default_factory=threading.Event)


class LocalHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, HubFile] = {}
        self.faults = Faults()
        self.log: list[Served] = []
        self._lock = threading.Lock()
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "hub"))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "cdn"))
        for server in (self._hub, self._cdn):
            server.daemon_threads = True
        self._threads: list[threading.Thread] = []

    # --- set-up -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The Hub's URL: what HF_ENDPOINT is set to."""
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def add_repo(self, repo: str, files: dict[str, Path], *, gated: bool = False) -> None:
        entries = {}
        for name, path in files.items():
            path = Path(path)
            entry = HubFile(path, sha256_of(str(path), path.stat().st_mtime_ns),
                            path.stat().st_size)
            entries[name] = entry
            self.blobs[entry.sha256] = entry
        self.repos[repo] = Repo(entries, gated=gated)

    def repo_id(self, name: str) -> str | None:
        """The repo ``name`` means: the Hub takes repo ids in any case."""
        return next((repo for repo in self.repos if repo.lower() == name.lower()), None)

    def start(self) -> LocalHub:
        for server in (self._hub, self._cdn):
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self.release()
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def release(self) -> None:
        """Let a paused response go on."""
        self.faults.resume.set()

    # --- what was served ----------------------------------------------------------------
    def record(self, served: Served) -> None:
        with self._lock:
            self.log.append(served)

    def requests(self, server: str | None = None, method: str | None = None) -> list[Served]:
        with self._lock:
            return [r for r in self.log if (server is None or r.server == server)
                    and (method is None or r.method == method)]

    def body_bytes(self) -> int:
        """File bytes the CDN has sent since the last ``reset_log``."""
        return sum(r.body_bytes for r in self.requests("cdn", "GET"))

    def reset_log(self) -> None:
        with self._lock:
            self.log.clear()


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def _handler(hub: LocalHub, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

        # --- the Hub: metadata and redirects --------------------------------------------
        def _serve(self, head: bool) -> None:
            served = Served(role, self.command, self.path.split("?")[0],
                            self.headers.get("Range"), 0,
                            authorized=self.headers.get("Authorization") == f"Bearer {TOKEN}",
                            had_auth="Authorization" in self.headers)
            # Recorded first, and every field set before the bytes it describes are sent: the
            # client may act on a response before this thread runs another line.
            hub.record(served)
            if role == "hub" and served.path.startswith("/api/models/"):
                self._info(served)
            elif role == "hub":
                self._resolve(served)
            else:
                self._blob(served, head)

        def _error(self, served: Served, status: int, code: str | None, message: str) -> None:
            served.status = status
            body = f'{{"error": "{message}"}}'.encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _info(self, served: Served) -> None:
            match = _INFO.match(served.path)
            repo_id = hub.repo_id(match["repo"]) if match else None
            repo = hub.repos.get(repo_id) if repo_id else None
            if match is None or repo is None:
                return self._error(served, 404, "RepoNotFound", "Repository not found")
            if match["rev"] not in (None, "main", repo.commit):
                return self._error(served, 404, "RevisionNotFound", "Invalid rev id")
            blobs = "blobs=true" in self.path.lower() or "blobs=1" in self.path.lower()
            siblings = []
            for name, entry in sorted(repo.files.items()):
                sibling: dict = {"rfilename": name}
                if blobs:
                    sibling.update(size=entry.size, blobId=entry.sha256[:40], lfs={
                        "size": entry.size, "sha256": entry.sha256, "pointerSize": 134})
                siblings.append(sibling)
            body = json.dumps({"id": repo_id, "modelId": repo_id,
                               "sha": repo.commit, "private": False,
                               "gated": "auto" if repo.gated else False,
                               "siblings": siblings}).encode()
            served.status = 200
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _resolve(self, served: Served) -> None:
            match = _RESOLVE.match(served.path)
            repo_id = hub.repo_id(match["repo"]) if match else None
            repo = hub.repos.get(repo_id) if repo_id else None
            if match is None or repo is None:
                # The real Hub says 401 to anonymous callers here; the error code is the same.
                return self._error(served, 404, "RepoNotFound", "Repository not found")
            auth = self.headers.get("Authorization")
            if repo.gated and auth != f"Bearer {TOKEN}":
                if auth is None:
                    return self._error(
                        served, 401, "GatedRepo",
                        f"Access to model {match['repo']} is restricted. You must have access to"
                        " it and be authenticated to access it. Please log in.")
                return self._error(
                    served, 403, "GatedRepo",
                    f"Access to model {match['repo']} is restricted and you are not in the"
                    " authorized list.")
            if match["rev"] not in ("main", repo.commit):
                return self._error(served, 404, "RevisionNotFound", "Invalid rev id")
            entry = repo.files.get(match["file"])
            if entry is None:
                return self._error(served, 404, "EntryNotFound", "Entry not found")
            served.status = 302
            self.send_response(302)
            self.send_header("Location", f"{hub.cdn_url}/cdn/{entry.sha256}?X-Signature=test")
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{entry.sha256}"')
            self.send_header("X-Linked-Size", str(entry.size))
            self.send_header("ETag", f'"{hashlib.sha1(entry.sha256.encode()).hexdigest()}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", "0")
            self.end_headers()

        # --- the CDN: bytes, with Range and faults -----------------------------------------
        def _blob(self, served: Served, head: bool) -> None:
            sha = served.path.rsplit("/", 1)[-1]
            entry = hub.blobs.get(sha)
            if entry is None or not served.path.startswith("/cdn/"):
                return self._error(served, 404, None, "no such blob")
            faults = hub.faults
            if (faults.down or sha in faults.down_for) and not head:
                return self._error(served, 503, None, "Service Unavailable")
            start, end = 0, entry.size - 1
            status = 200
            if served.range:
                match = _RANGE.match(served.range)
                if match is None or int(match[1]) >= entry.size:
                    served.status = 416
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{entry.size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = int(match[1])
                end = min(int(match[2]), entry.size - 1) if match[2] else entry.size - 1
                status = 206
            served.status = status
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start + 1))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{entry.size}")
            self.end_headers()
            if head:
                return
            with open(entry.path, "rb") as f:
                f.seek(start)
                pos = start
                while pos <= end:
                    n = min(CHUNK, end + 1 - pos)
                    for mark in (faults.cut_at, faults.pause_at):
                        if mark is not None and pos < mark < pos + n:
                            n = mark - pos  # stop exactly at the fault's offset
                    data = bytearray(f.read(n))
                    if faults.corrupt_at is not None and pos <= faults.corrupt_at < pos + n:
                        data[faults.corrupt_at - pos] ^= 0xFF
                    served.body_bytes += len(data)
                    try:
                        self.wfile.write(data)
                        self.wfile.flush()
                    except OSError:
                        served.body_bytes -= len(data)
                        return  # the client went away
                    pos += len(data)
                    if faults.rate_bytes_per_s:
                        time.sleep(len(data) / faults.rate_bytes_per_s)
                    if faults.cut_at is not None and pos == faults.cut_at:
                        faults.cut_at = None
                        faults.down = faults.down_after_cut
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if faults.pause_at is not None and pos == faults.pause_at:
                        faults.pause_at = None
                        faults.paused.set()
                        faults.resume.wait(120)

    return Handler


def main() -> None:
    """Serve the starter GGUF as the tests do, to try `localinfer pull` by hand:

        python tests/hub_server.py PATH/TO/gemma-3-270m-q4_k_m.gguf CATALOG.toml [MB/s]
        HF_ENDPOINT=<printed URL> LOCALINFER_CATALOG=CATALOG.toml localinfer pull tinygemma:270m
    """
    import sys

    path, catalog = Path(sys.argv[1]), Path(sys.argv[2])
    catalog.write_text(CATALOG, encoding="utf-8")
    hub = LocalHub()
    if len(sys.argv) > 3:
        hub.faults.rate_bytes_per_s = float(sys.argv[3]) * 1e6
    hub.add_repo(REPO, {FILE: path})
    hub.add_repo(GATED_REPO, {FILE: path}, gated=True)
    with hub:
        print(f"HF_ENDPOINT={hub.url} LOCALINFER_CATALOG={catalog}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
