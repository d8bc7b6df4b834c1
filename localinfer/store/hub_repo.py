"""A Hub repo's GGUF files, by quant: what ``hf.co/user/repo[:quant]`` can pull.

``list_repo`` asks the Hub once (huggingface_hub's ``HfApi.model_info`` with
``files_metadata``: every file's size and the SHA-256 Git LFS keeps for it) and groups the
repo's GGUF files by the quant their names end with; a model split into shards
(``-00001-of-0000N.gguf``) is one quant of several files. ``RepoListing.pick`` finds the quant a
name asks for, or says which ones exist. Which quant to take when the name gives none is
``selection.py``'s question (Q4_K_M, else the planner's choice); the download is ``pull.py``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import __version__
from ..errors import LocalInferError, ModelNotFound, OfflineError
from . import hub, hub_names

MAX_LISTED = 12
"""Quants (or other files) named in an error before "and N more"."""


@dataclass(frozen=True)
class HubGGUF:
    """One GGUF file of a repo as the Hub lists it."""

    path: str
    """Its path in the repo (``Q8_0/Model-Q8_0-00001-of-00002.gguf``)."""
    size: int | None
    sha256: str | None
    """The SHA-256 Git LFS records for it (every GGUF on the Hub is an LFS file)."""


@dataclass(frozen=True)
class QuantFiles:
    """One quant of a repo: one file, or the shards of a split model, in order."""

    quant: str
    """Upper case, as the file names say it (``Q4_K_M``, ``UD-Q4_K_XL``, ``F16``)."""
    files: tuple[HubGGUF, ...]
    others: tuple[str, ...] = ()
    """Other files of the repo whose names say the same quant (a base and an instruct model
    side by side): not pulled by this name."""

    @property
    def size(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)

    @property
    def parts(self) -> int:
        return len(self.files)


@dataclass(frozen=True)
class RepoListing:
    """What a repo offers: its GGUF quants, and its other files (for the error when it has
    no GGUF)."""

    repo: str
    """The repo id as the Hub spells it."""
    commit: str | None
    quants: tuple[QuantFiles, ...]
    other_files: tuple[str, ...] = ()
    incomplete: tuple[str, ...] = ()
    """Quants whose shards are not all there (not offered)."""

    def quant_names(self) -> list[str]:
        return [q.quant for q in self.quants]

    def find(self, quant: str) -> QuantFiles | None:
        wanted = quant.upper()
        return next((q for q in self.quants if q.quant == wanted), None)

    def pick(self, quant: str) -> QuantFiles:
        """The files of ``quant``; ModelNotFound listing the quants there are."""
        found = self.find(quant)
        if found is not None:
            return found
        lacking = (f" ({quant.upper()} is split and some of its shards are missing)"
                   if quant.upper() in self.incomplete else "")
        example = self.quants[0].quant if self.quants else "Q4_K_M"
        raise ModelNotFound(
            f"hf.co/{self.repo} has no GGUF file for the quant {quant.upper()}{lacking}; it has"
            f" {_listed(self.quant_names())}. Name one of them, e.g."
            f" hf.co/{self.repo}:{example}.")


def list_repo(repo: str, *, offline: bool = False) -> RepoListing:
    """The GGUF quants of the Hub repo ``repo`` (one request). ModelNotFound for no such repo
    or one with no GGUF file, AccessDenied, DownloadError, OfflineError."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError

    if offline or hub.offline():
        raise OfflineError(
            f"cannot look up hf.co/{repo} on the Hub: offline mode is on (HF_HUB_OFFLINE=1 or"
            " --offline). Unset it to download, or run a model already installed"
            " (`localinfer list`).")
    api = HfApi(endpoint=hub.endpoint(), library_name="localinfer",
                library_version=__version__)
    try:
        # A Hub that takes the connection and never answers: the same limit as a file's
        # metadata request (HF_HUB_ETAG_TIMEOUT, 10 s), not a wait for ever.
        info = api.model_info(repo, files_metadata=True, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except RepositoryNotFoundError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        private = "" if hub.has_token() else (
            " If it is private or gated, set HF_TOKEN to a read token of an account that can"
            " see it.")
        raise ModelNotFound(
            f"the Hub ({hub.endpoint()}) has no model repo {repo} (HTTP {status}): check the"
            f" name (hf.co/USER/REPO[:QUANT]).{private}") from None
    except Exception as exc:
        error = hub.translate(exc, repo=repo, file="")
        if error is None or not isinstance(error, LocalInferError):
            raise
        raise error from None
    return listing_of(info.id or repo, info.sha, [
        (s.rfilename, s.size if s.lfs is None else s.lfs.size,
         None if s.lfs is None else s.lfs.sha256) for s in info.siblings or []])


def listing_of(repo: str, commit: str | None,
               files: list[tuple[str, int | None, str | None]]) -> RepoListing:
    """Group a repo's files (path, size, SHA-256) into its GGUF quants."""
    groups: dict[str, list[tuple[int, int, HubGGUF]]] = {}
    others = []
    for path, size, sha256 in sorted(files):
        if not hub_names.is_model_file(path):
            others.append(path)
            continue
        shard = hub_names.shard_of(path)
        number, count = shard or (1, 1)
        label = hub_names.quant_of(path) or _label_of(path)
        groups.setdefault(label, []).append((number, count, HubGGUF(path, size, sha256)))
    quants, incomplete = [], []
    for label, entries in groups.items():
        entries.sort(key=lambda e: (e[1], e[0], e[2].path))
        if entries[0][1] == 1:  # one file (the first, if two names say the same quant)
            same = tuple(e[2].path for e in entries[1:] if e[1] == 1)
            quants.append(QuantFiles(label, (entries[0][2],), same))
            continue
        count = entries[0][1]
        shards = [e for e in entries if e[1] == count]
        if [e[0] for e in shards] != list(range(1, count + 1)):
            incomplete.append(label)
            continue
        quants.append(QuantFiles(label, tuple(e[2] for e in shards)))
    quants.sort(key=lambda q: (q.size is None, q.size or 0, q.quant))
    return RepoListing(repo, commit, tuple(quants), tuple(others), tuple(incomplete))


def _label_of(path: str) -> str:
    """A quant label for a file whose name names none: its name, as a name can spell it."""
    stem = path.rsplit("/", 1)[-1][: -len(".gguf")]
    clean = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in stem)
    clean = re.sub(r"\.{2,}", ".", re.sub(r"-{2,}", "-", clean))[:32].strip("._-")
    return (clean or "GGUF").upper()


def no_gguf(listing: RepoListing) -> ModelNotFound:
    """The error for a repo with no GGUF file (or only split ones missing a shard)."""
    if listing.incomplete:
        return ModelNotFound(
            f"hf.co/{listing.repo} has only part of a split GGUF for"
            f" {_listed(list(listing.incomplete))}: a shard is missing from the repo (its"
            " files are named -0000N-of-0000M.gguf). Tell the repo's owner, or pick another"
            " repo.")
    files = _listed(list(listing.other_files)) if listing.other_files else "no files"
    return ModelNotFound(
        f"hf.co/{listing.repo} has no GGUF file (it has {files}): localinfer runs llama.cpp"
        " GGUF models. Look for a GGUF conversion of the model (a repo named ...-GGUF).")


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    more = len(names) - MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")
