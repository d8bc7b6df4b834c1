"""``localinfer create`` and ``/api/create``: a preset (presets.py) over an installed model,
made from a Modelfile's instructions or the API's fields, and, with ``quantize``, a new GGUF
file made from the model by llama.cpp's quantizer first. A Modelfile's ADAPTER is checked to
be a LoRA adapter GGUF for the model's architecture and kept where it is (llama.cpp applies it
when the preset loads).

A FROM that names a .gguf file on this machine (a Modelfile only: the API takes no paths) is
linked into the store as ``add --link`` does: no weights are copied. A quantized file is
written beside its place in the store under a temporary name, after the disk is checked for
room, and renamed into place, with its manifest, only once llama.cpp has finished it: a
failure or a full disk leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from .. import gguf
from ..catalog import BITS_PER_WEIGHT
from ..errors import (
    InvalidModelFile,
    InvalidRequest,
    LocalInferError,
    ModelLoadError,
    ModelNotFound,
)
from ..runtime.chat_template import ChatTemplate
from .local import InstalledModel, ModelStore, _magic
from .presets import CreateRequest, Preset, make_preset

CreateStatus = Callable[[str, int | None, int | None], None]
"""Called with (status text, bytes done, bytes total) as a create goes: Ollama's stream."""

FULL_PRECISION = ("F32", "F16", "BF16")
QUANTIZE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M",
                  "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "F16", "BF16")
"""What ``quantize`` can make (llama.cpp's quantizer's types, by their GGUF names)."""

_GO_TEMPLATE = re.compile(r"\{\{-?\s*(\.\w|if\s+\.|range\s+\.|end\s*-?\}\})")


def create_preset(store: ModelStore, request: CreateRequest, *, from_api: bool,
                  allow_requantize: bool = False, status: CreateStatus | None = None
                  ) -> Preset:
    """Make (or replace) the preset ``request`` names. ``from_api``: paths are refused (over
    HTTP a request never reaches a file outside the store)."""
    def say(text: str, done: int | None = None, total: int | None = None) -> None:
        if status is not None:
            status(text, done, total)

    name = request.name
    _check_free(store, name)
    if request.source is None:
        raise InvalidRequest("'from' is required: the installed model (or preset) the new"
                             " one is over.")
    if request.adapters and from_api:
        raise InvalidRequest("'adapters': adapters over the API are blobs pushed to"
                             " /api/blobs, which localinfer does not take; name the adapter's"
                             " file in a Modelfile's ADAPTER line and run `localinfer create`.")
    if request.template is not None and _GO_TEMPLATE.search(request.template):
        raise InvalidRequest(
            "TEMPLATE is written in Ollama's Go template syntax ({{ .Prompt }}, {{ if .System"
            " }}); localinfer renders chat templates in Jinja, as GGUF files carry them: give a"
            " Jinja chat template, or leave TEMPLATE out to use the model's own.")
    if request.template is not None:
        try:  # refused now, not at the preset's first chat
            ChatTemplate(request.template)
        except ModelLoadError as exc:
            raise InvalidRequest(f"TEMPLATE does not compile as a Jinja chat template:"
                                 f" {exc.__cause__ or exc.message}") from None
    over: Preset | None = None
    if os.path.isabs(request.source):
        if from_api:
            raise InvalidRequest("'from' must name an installed model: paths are not accepted"
                                 " over the API (add a file with `localinfer add PATH`).")
        model = _linked(store, Path(request.source), name)
    else:
        over = store.presets.get(request.source)
        resolved = store.resolve(request.source)
        if resolved.installed is None:
            raise ModelNotFound(f"{request.source} is not an installed model.")
        model = resolved.installed
    for path in request.adapters:
        _check_adapter(Path(path), gguf.read_header(model.path).architecture)
    _check_context(request, model)
    say("reading model metadata")  # the first status: the request has checked out
    if request.quantize:
        model = quantize_model(store, model, request.quantize, allow_requantize=allow_requantize,
                               status=say)
    preset = make_preset(request, model.name, over)
    say("writing manifest")
    store.presets.save(preset)
    say("success")
    return preset


def _check_context(request: CreateRequest, model: InstalledModel) -> None:
    """A ``num_ctx`` beyond what the model was trained for is refused when the preset is
    made (a daemon capped it unsaid; the model loaded in a process refused it, naming --ctx
    rather than the preset)."""
    num_ctx = request.parameters.get("num_ctx")
    if not num_ctx:
        return
    trained = gguf.read_header(model.path).context_length
    if trained and num_ctx > trained:
        raise InvalidRequest(f"PARAMETER num_ctx {num_ctx} is beyond what {model.name} was"
                             f" trained for ({trained} tokens); give {trained} or less.")


def _check_free(store: ModelStore, name: str) -> None:
    """A preset may replace a preset, never shadow an installed model."""
    taken = [m.name for m in store._manifests() if name in (m.name, m.model, m.family)]
    if taken:
        raise InvalidRequest(f"{name} is the name of the installed model {taken[0]}; choose"
                             " another name for the preset.")
    if store.presets.get(name) is not None:
        return  # made before this refusal: it may be made again
    try:
        store.catalog.lookup(name)
    except KeyError:
        if name not in store.catalog.families:
            return
    # A catalog model not pulled yet: the preset would hide it once it is (`show` and the
    # API found the preset, not the model pulled).
    raise InvalidRequest(f"{name} is a model of the catalog (`localinfer pull {name}`"
                         " downloads it); choose another name for the preset.")


def _check_adapter(path: Path, architecture: str) -> None:
    """An ADAPTER file is a LoRA adapter GGUF for the model's architecture."""
    if not path.is_file():
        raise ModelNotFound(f"ADAPTER {path}: no such file.")
    if _magic(path) != gguf.GGUF_MAGIC:
        raise InvalidModelFile(f"ADAPTER {path} is not a GGUF file; convert a LoRA with"
                               " llama.cpp's convert_lora_to_gguf.py.")
    meta = gguf.read_header(path).metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise InvalidModelFile(f"ADAPTER {path} is not a LoRA adapter (its general.type is"
                               f" {meta.get('general.type')!r}, adapter.type"
                               f" {meta.get('adapter.type')!r}).")
    if meta.get("general.architecture") != architecture:
        raise InvalidRequest(f"ADAPTER {path} is for {meta.get('general.architecture')!r}"
                             f" models, and the model is {architecture!r}.")


def _linked(store: ModelStore, path: Path, name: str) -> InstalledModel:
    """The installed model of a FROM path: the one whose file it is, else the file linked
    into the store (no copy)."""
    if not path.is_file():
        raise ModelNotFound(f"FROM {path}: no such file.")
    if _magic(path) != gguf.GGUF_MAGIC:
        raise InvalidModelFile(f"FROM {path} is not a GGUF model file (.gguf); localinfer runs"
                               " GGUF files only (convert safetensors with llama.cpp's"
                               " convert_hf_to_gguf.py).")
    for m in store.installed():
        if Path(m.path).resolve() == path:
            return m
    header = gguf.read_header(path)
    if header.metadata.get("general.type") == "adapter":
        raise InvalidModelFile(f"FROM {path} is a LoRA adapter, not a model.")
    family = name.split(":")[0]
    return store.add(path, name=f"{family}-base", link=True)


# --- quantizing -------------------------------------------------------------------------------
def quantize_model(store: ModelStore, model: InstalledModel, quant: str, *,
                   allow_requantize: bool = False, status: CreateStatus | None = None
                   ) -> InstalledModel:
    """``model`` quantized to ``quant`` by llama.cpp, installed as ``family:size-quant`` (the
    installed one when it is there already). A file already quantized is refused unless
    ``allow_requantize``: quantizing a quantized file again loses more than quantizing its
    full-precision original."""
    quant = quant.strip().upper()
    if quant not in QUANTIZE_TYPES:
        raise InvalidRequest(f"quantize {quant!r}: not a type llama.cpp's quantizer makes"
                             f" (one of {', '.join(QUANTIZE_TYPES)}).")
    header = gguf.read_header(model.path)
    source_quant = header.quant
    if source_quant == quant:
        return model
    if source_quant not in FULL_PRECISION and not allow_requantize:
        raise InvalidRequest(
            f"{model.name} is already quantized ({source_quant}): quantizing it again to"
            f" {quant} loses more quality than quantizing its full-precision (F16/BF16/F32)"
            " original. Create from that file, or ask for it anyway with --allow-requantize.")
    name = f"{model.model}-{quant.lower()}"
    existing = store.get(name)
    if existing is not None:
        return existing
    target = store.file_for(name)
    expected = int(header.parameter_count * BITS_PER_WEIGHT.get(quant, 8.5) / 8) or \
        os.path.getsize(model.path)
    store.check_space(target.parent, expected)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".quantize-", suffix=".partial")
    os.close(fd)
    tmp = Path(tmp_name)
    label = f"quantizing {source_quant} model to {quant}"
    try:
        _run_quantizer(model.path, tmp, quant, allow_requantize, expected, label, status)
        if status is not None:
            status("verifying conversion", None, None)
        gguf.read_header(tmp)  # what llama.cpp wrote reads back as a GGUF
        sha256 = _sha256(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return store.register(name=name, model=model.model, quant=quant, path=target,
                          sha256=sha256, source=f"quantize:{model.name}")


def _run_quantizer(source: str, target: Path, quant: str, allow_requantize: bool,
                   expected: int, label: str, status: CreateStatus | None) -> None:
    """llama.cpp's quantizer on a thread, its progress read from the output file's size."""
    # The llama.cpp quantizer: loaded only by a create that quantizes.
    from ..runtime.llama.quantize import quantize_file

    ftype = next(n for n, q in gguf.FILE_TYPES.items() if q == quant)
    failed: list[BaseException] = []

    def work() -> None:
        try:
            quantize_file(source, target, ftype, allow_requantize=allow_requantize)
        except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=work, name="quantize", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.25)
        if status is not None:
            done = target.stat().st_size if target.exists() else 0
            status(label, min(done, expected), expected)
    if failed:
        error = failed[0]
        if isinstance(error, OSError) and error.errno == 28:
            raise LocalInferError("the disk filled up while quantizing; nothing was kept."
                                  " Free some space and try again.", title="not enough disk space")
        raise error
    if status is not None:
        status(label, expected, expected)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()
