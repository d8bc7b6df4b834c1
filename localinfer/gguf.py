"""A small, bounds-checked reader for GGUF headers: architecture facts and exact tensor sizes.

It reads only the header (metadata and tensor table), never the weights, from a local file or
from the first bytes of a remote one (``parse_header(buf, total_size)`` raises ``NeedMoreData``
when ``buf`` is too short). Large arrays such as the 262k-entry vocabulary are skipped, not
decoded, which keeps the starter model's header read to a few milliseconds. Every count, length
and offset is checked against the bytes that exist, so a hostile file gets ``InvalidModelFile``
quickly instead of a hang, a crash or a huge allocation.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InvalidModelFile
from .paths import not_there

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# Limits that no real model comes near; they keep a hostile header cheap to reject.
MAX_KV_COUNT = 100_000
MAX_TENSOR_COUNT = 1_000_000
MAX_STRING_BYTES = 64 * 1024 * 1024  # a chat template is ~10 KB; nothing legitimate is this big
MAX_ARRAY_DEPTH = 3
MAX_PARSED_ITEMS = 4_000_000  # strings/arrays walked one by one (a vocab + merges is ~600k)
MAX_HEADER_BYTES = 256 * 1024 * 1024
SMALL_ARRAY = 4096  # arrays up to this length are decoded; longer ones become ArrayStub

# GGUF metadata value types: id -> (struct format, size) for fixed-size scalars.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),  # uint8
    1: ("<b", 1),  # int8
    2: ("<H", 2),  # uint16
    3: ("<h", 2),  # int16
    4: ("<I", 4),  # uint32
    5: ("<i", 4),  # int32
    6: ("<f", 4),  # float32
    7: ("<?", 1),  # bool
    10: ("<Q", 8),  # uint64
    11: ("<q", 8),  # int64
    12: ("<d", 8),  # float64
}
_STRING = 8
_ARRAY = 9

# ggml tensor types: id -> (name, elements per block, bytes per block). From ggml.h / gguf-py.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

# llama.cpp's LLAMA_FTYPE values (general.file_type) -> the quant name users know.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}

# Architectures whose sliding-window layers follow a fixed period that llama.cpp hard-codes
# (every Nth layer attends globally) when the file does not say so itself.
_SWA_PERIOD = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "gpt-oss": 2}

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


class NeedMoreData(Exception):
    """The buffer ends before the header does; fetch at least ``needed`` bytes and retry."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


@dataclass(frozen=True)
class ArrayStub:
    """A long metadata array that was skipped, not decoded (e.g. the vocabulary)."""

    item_type: int
    count: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str
    shape: tuple[int, ...]
    offset: int
    """Offset from the start of the tensor data section."""
    n_bytes: int
    n_elements: int


@dataclass(frozen=True)
class LayerKV:
    """What one layer keeps in the KV cache for each token."""

    n_head_kv: int
    key_length: int
    value_length: int
    sliding_window: int | None
    """The window in tokens for a sliding-window layer, None for a global layer."""

    @property
    def elements_per_token(self) -> int:
        return self.n_head_kv * (self.key_length + self.value_length)


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    alignment: int
    data_offset: int
    """Absolute offset of the tensor data section."""
    file_size: int
    metadata: dict[str, Any] = field(repr=False)
    tensors: tuple[TensorInfo, ...] = field(repr=False)

    # --- metadata with the architecture prefix resolved ---------------------------------
    def arch_value(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def name(self) -> str | None:
        value = self.metadata.get("general.name")
        return value if isinstance(value, str) else None

    @property
    def license(self) -> str | None:
        value = self.metadata.get("general.license")
        return value if isinstance(value, str) else None

    @property
    def quant(self) -> str:
        """The quant name (``Q4_K_M``...) from general.file_type, else the commonest weight type."""
        file_type = self.metadata.get("general.file_type")
        if isinstance(file_type, int) and file_type in FILE_TYPES:
            return FILE_TYPES[file_type]
        by_type: dict[str, int] = {}
        for t in self.tensors:
            if len(t.shape) >= 2:
                by_type[t.type_name] = by_type.get(t.type_name, 0) + t.n_bytes
        return max(by_type, key=by_type.__getitem__) if by_type else "unknown"

    @property
    def block_count(self) -> int:
        return _as_int(self.arch_value("block_count"), 0)

    @property
    def embedding_length(self) -> int:
        return _as_int(self.arch_value("embedding_length"), 0)

    @property
    def feed_forward_length(self) -> int:
        return _as_int(self.arch_value("feed_forward_length"), 0)

    @property
    def head_count(self) -> int:
        return _as_int(self.arch_value("attention.head_count"), 0)

    @property
    def head_count_kv(self) -> int:
        """KV heads of the first layer (files may store one value per layer)."""
        return self.layer_kv()[0].n_head_kv if self.block_count else 0

    @property
    def key_length(self) -> int:
        default = self.embedding_length // self.head_count if self.head_count else 0
        return _as_int(self.arch_value("attention.key_length"), default)

    @property
    def value_length(self) -> int:
        default = self.embedding_length // self.head_count if self.head_count else 0
        return _as_int(self.arch_value("attention.value_length"), default)

    @property
    def sliding_window(self) -> int | None:
        window = self.arch_value("attention.sliding_window")
        return int(window) if isinstance(window, int) and window > 0 else None

    @property
    def context_length(self) -> int:
        return _as_int(self.arch_value("context_length"), 0)

    @property
    def expert_count(self) -> int:
        return _as_int(self.arch_value("expert_count"), 0)

    @property
    def expert_used_count(self) -> int:
        return _as_int(self.arch_value("expert_used_count"), 0)

    @property
    def vocab_size(self) -> int:
        explicit = self.arch_value("vocab_size")
        if isinstance(explicit, int):
            return explicit
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, ArrayStub):
            return tokens.count
        if isinstance(tokens, list):
            return len(tokens)
        return 0

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return value if isinstance(value, str) and value.strip() else None

    # --- tensors ----------------------------------------------------------------------
    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def parameter_count(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def layer_bytes(self) -> list[int]:
        """Weight bytes of each repeating layer ``blk.N``, indexed by N."""
        sizes = [0] * self.block_count
        for t in self.tensors:
            match = _LAYER_RE.match(t.name)
            if match:
                index = int(match.group(1))
                if index >= len(sizes):
                    sizes.extend([0] * (index + 1 - len(sizes)))
                sizes[index] += t.n_bytes
        return sizes

    @property
    def embedding_bytes(self) -> int:
        """The token embedding table (kept on the CPU by llama.cpp)."""
        return sum(t.n_bytes for t in self.tensors if t.name.startswith("token_embd"))

    @property
    def output_bytes(self) -> int:
        """The output head and final norm. Tied embeddings (no output.weight) reuse the
        embedding table, which then also counts as the output layer's weights."""
        own = sum(t.n_bytes for t in self.tensors if t.name.startswith("output"))
        has_head = any(t.name == "output.weight" for t in self.tensors)
        return own if has_head else own + self.embedding_bytes

    @property
    def other_bytes(self) -> int:
        """Tensors outside the layers, the embedding and the output (rope factors...)."""
        return sum(
            t.n_bytes
            for t in self.tensors
            if not _LAYER_RE.match(t.name)
            and not t.name.startswith(("token_embd", "output"))
        )

    # --- KV cache ---------------------------------------------------------------------
    def layer_kv(self) -> list[LayerKV]:
        """Per-layer KV shape: heads, head dims and whether the layer uses a sliding window."""
        n_layers = self.block_count
        kv_heads = self.arch_value("attention.head_count_kv", self.head_count)
        if isinstance(kv_heads, list):
            heads = [_as_int(h, 0) for h in kv_heads] + [0] * n_layers
        else:
            heads = [_as_int(kv_heads, self.head_count)] * n_layers
        window = self.sliding_window
        pattern = self.arch_value("attention.sliding_window_pattern")
        swa: list[bool]
        if window is None:
            swa = [False] * n_layers
        elif isinstance(pattern, list):
            swa = [bool(p) for p in pattern] + [False] * n_layers
        else:
            period = _as_int(pattern, 0) or _SWA_PERIOD.get(self.architecture, 0)
            # llama.cpp: with period N, layer i is global when (i + 1) % N == 0.
            swa = [bool(period) and (i + 1) % period != 0 for i in range(n_layers)]
            if not period:
                swa = [True] * n_layers  # a window with no pattern applies to every layer
        return [
            LayerKV(heads[i], self.key_length, self.value_length, window if swa[i] else None)
            for i in range(n_layers)
        ]

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> float:
        """KV bytes one token adds on all layers (F16 cache by default), windows ignored."""
        return sum(layer.elements_per_token for layer in self.layer_kv()) * bytes_per_element

    def kv_cache_bytes(self, n_ctx: int, bytes_per_element: float = 2.0) -> float:
        """KV cache bytes for ``n_ctx`` tokens, sliding-window layers capped at their window."""
        total = 0.0
        for layer in self.layer_kv():
            cells = n_ctx if layer.sliding_window is None else min(n_ctx, layer.sliding_window)
            total += cells * layer.elements_per_token * bytes_per_element
        return total


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read the header of a local GGUF file. The first shard of a split model
    (``NAME-00001-of-00003.gguf``, with ``split.count`` in its metadata) gives the whole
    model's: its metadata and every shard's tensors (``merge_split``), read from the shards
    beside it, which llama.cpp loads with it."""
    header = _read_one(Path(path))
    count = split_count(header)
    if count > 1:
        prefix = split_prefix(Path(path), header)
        shards = [header] + [_read_one(Path(f"{prefix}-{i:05d}-of-{count:05d}.gguf"),
                                       shard=True) for i in range(2, count + 1)]
        header = merge_split(shards, source=str(path))
    check_layers(header, str(path))
    return header


def check_layers(header: GGUFHeader, source: str) -> None:
    """Refuse a header whose layers and tensors disagree, before llama.cpp sees it (it aborts
    the process on such a file, and the planner lists each layer: 2**31 of them took all the
    memory): no tensors at all, a layer count past the tensors, or ``blk.N`` tensors past the
    layer count (a count of 0 included). A LoRA adapter declares no layer count."""
    n_tensors = len(header.tensors)
    if not n_tensors:
        raise InvalidModelFile(f"{source} is not a valid GGUF file: it holds no tensors (no"
                               " weights). Download or convert the model again.")
    if not 0 <= header.block_count <= n_tensors:
        raise InvalidModelFile(f"{source} is not a valid GGUF file: it declares"
                               f" {header.block_count} layers but holds {n_tensors} tensors.")
    layers = [(int(m.group(1)), t.name) for t in header.tensors
              if (m := _LAYER_RE.match(t.name))]
    if not layers:
        return
    last, name = max(layers)
    if header.metadata.get("general.type") == "adapter":
        # An adapter holds a few layers' tensors (layers 30-31 of q_proj: 4 tensors): the
        # base model's count bounds them, read when the adapter is applied.
        if last >= MAX_TENSOR_COUNT:
            raise InvalidModelFile(f"{source} is not a valid GGUF file: its tensor {name!r}"
                                   " names a layer past any model's.")
        return
    if last >= n_tensors:
        raise InvalidModelFile(f"{source} is not a valid GGUF file: its tensor {name!r} names"
                               f" a layer past the {n_tensors} tensors it holds.")
    if last >= header.block_count:
        raise InvalidModelFile(f"{source} is not a valid GGUF file: its tensor {name!r} names"
                               f" layer {last}, but it declares {header.block_count} layers"
                               f" ({header.architecture}.block_count).")


def split_count(header: GGUFHeader) -> int:
    """How many files the model is split into (``split.count``; 1 when it is not split)."""
    count = header.metadata.get("split.count", 1)
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1


def split_prefix(path: Path, header: GGUFHeader) -> str:
    """The path of a split model's first shard without ``-00001-of-0000N.gguf``, as llama.cpp
    finds the others; InvalidModelFile for a later shard or a renamed file."""
    count = split_count(header)
    number = header.metadata.get("split.no", 0)
    if number != 0:
        raise InvalidModelFile(
            f"{path} is shard {number + 1 if isinstance(number, int) else number} of a model"
            f" split into {count} files: give the first, NAME-00001-of-{count:05d}.gguf.")
    suffix = f"-00001-of-{count:05d}.gguf"
    if not str(path).endswith(suffix):
        raise InvalidModelFile(
            f"{path} is the first of {count} shards of a split model but is not named"
            f" NAME{suffix}, so llama.cpp cannot find the others: keep the shards' names.")
    return str(path)[: -len(suffix)]


def merge_split(shards: list[GGUFHeader], *, source: str) -> GGUFHeader:
    """One header for a model split into ``shards`` (in order): the first shard's metadata,
    every shard's tensors, the files' sizes added up. Checks each shard's ``split.no`` and
    the tensor count the first declares (``split.tensors.count``)."""
    count = len(shards)
    for index, shard in enumerate(shards):
        if shard.metadata.get("split.no") != index or split_count(shard) != count:
            raise InvalidModelFile(
                f"{source}: shard {index + 1} of {count} says it is shard"
                f" {shard.metadata.get('split.no')!r} of {shard.metadata.get('split.count')!r}"
                " (a shard from another download?). Download the model again.")
    tensors = tuple(t for shard in shards for t in shard.tensors)
    declared = shards[0].metadata.get("split.tensors.count")
    if isinstance(declared, int) and declared != len(tensors):
        raise InvalidModelFile(f"{source}: its {count} shards hold {len(tensors)} tensors,"
                               f" the first declares {declared}. Download the model again.")
    first = shards[0]
    return GGUFHeader(version=first.version, alignment=first.alignment,
                      data_offset=first.data_offset,
                      file_size=sum(shard.file_size for shard in shards),
                      metadata=first.metadata, tensors=tensors)


def read_file_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """The header of one GGUF file as it is, a shard of a split model not merged."""
    return _read_one(Path(path))


def _read_one(path: Path, *, shard: bool = False) -> GGUFHeader:
    if shard and not path.is_file():
        raise InvalidModelFile(f"{path}, a shard of a split model, is missing: download the"
                               " model again (or put the shard back beside the first).")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise InvalidModelFile(
                    f"{path} is {size} bytes: too small to be a GGUF model file."
                )
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                try:
                    return parse_header(buf, size, source=str(path))
                except NeedMoreData as exc:  # the whole file is mapped: it is truncated
                    raise InvalidModelFile(
                        f"{path} is truncated: its header needs {exc.needed} bytes but the file"
                        f" has {size}. Download it again."
                    ) from None
    except FileNotFoundError:
        raise InvalidModelFile(not_there(Path(path))) from None
    except IsADirectoryError:
        raise InvalidModelFile(f"{path} is a directory, not a GGUF file.") from None
    except PermissionError:
        raise InvalidModelFile(f"{path} cannot be read: permission denied.") from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise InvalidModelFile(not_there(Path(path))) from None


def parse_header(buf: Any, total_size: int, *, source: str = "file") -> GGUFHeader:
    """Parse a GGUF header from ``buf`` (bytes, memoryview or mmap holding a prefix of the file).

    ``total_size`` is the size of the whole file, used to check tensor offsets. Raises
    ``NeedMoreData`` when the header continues past the end of ``buf`` and ``total_size`` says
    the file is longer, ``InvalidModelFile`` for anything malformed.
    """
    return _Parser(buf, total_size, source).parse()


class _Parser:
    def __init__(self, buf: Any, total_size: int, source: str) -> None:
        self.buf = buf
        self.available = len(buf)
        self.total = total_size
        self.source = source
        self.pos = 0
        self.items = 0

    # --- primitives ---------------------------------------------------------------------
    def fail(self, what: str) -> InvalidModelFile:
        return InvalidModelFile(f"{self.source} is not a valid GGUF file: {what}.")

    def need(self, n: int) -> None:
        end = self.pos + n
        if end > self.total:
            raise self.fail(f"it ends at byte {self.total} inside its header (needs {end})")
        if end > MAX_HEADER_BYTES:
            raise self.fail(f"its header is larger than {MAX_HEADER_BYTES >> 20} MiB")
        if end > self.available:
            raise NeedMoreData(end)

    def unpack(self, fmt: str, size: int) -> Any:
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self) -> int:
        return self.unpack("<I", 4)

    def u64(self) -> int:
        return self.unpack("<Q", 8)

    def string(self, what: str) -> str:
        n = self.u64()
        if n > MAX_STRING_BYTES or self.pos + n > self.total:
            raise self.fail(f"{what} declares a string of {n} bytes")
        self.need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def count_items(self, n: int) -> None:
        self.items += n
        if self.items > MAX_PARSED_ITEMS:
            raise self.fail(f"its metadata has more than {MAX_PARSED_ITEMS} strings or arrays")

    # --- values -----------------------------------------------------------------------
    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        scalar = _SCALARS.get(vtype)
        if scalar is not None:
            return self.unpack(*scalar)
        if vtype == _STRING:
            self.count_items(1)
            return self.string(f"metadata {key!r}")
        if vtype == _ARRAY:
            return self.array(key, depth + 1)
        raise self.fail(f"metadata {key!r} has unknown value type {vtype}")

    def array(self, key: str, depth: int) -> Any:
        if depth > MAX_ARRAY_DEPTH:
            raise self.fail(f"metadata {key!r} nests arrays more than {MAX_ARRAY_DEPTH} deep")
        item_type = self.u32()
        count = self.u64()
        remaining = self.total - self.pos
        scalar = _SCALARS.get(item_type)
        min_item = scalar[1] if scalar else 8 if item_type == _STRING else 12
        if item_type not in _SCALARS and item_type not in (_STRING, _ARRAY):
            raise self.fail(f"metadata {key!r} is an array of unknown type {item_type}")
        if count * min_item > remaining:
            raise self.fail(f"metadata {key!r} declares {count} items, more than the file holds")
        if scalar is not None:
            fmt, size = scalar
            if count > SMALL_ARRAY:
                self.need(count * size)
                self.pos += count * size
                return ArrayStub(item_type, count)
            self.need(count * size)
            values = list(struct.unpack_from(f"<{count}{fmt[1]}", self.buf, self.pos))
            self.pos += count * size
            return values
        self.count_items(count)
        if item_type == _STRING and count > SMALL_ARRAY:
            self.skip_strings(key, count)
            return ArrayStub(item_type, count)
        values = [self.value(item_type, key, depth) for _ in range(count)]
        return values if count <= SMALL_ARRAY else ArrayStub(item_type, count)

    def skip_strings(self, key: str, count: int) -> None:
        # The hot loop of the reader: 262k vocabulary strings in a few milliseconds.
        buf, pos, limit, unpack_from = self.buf, self.pos, self.available, struct.unpack_from
        total = min(self.total, MAX_HEADER_BYTES)
        for _ in range(count):
            if pos + 8 > limit:
                self.pos = pos
                self.need(8)
            (n,) = unpack_from("<Q", buf, pos)
            pos += 8 + n
            if pos > total:
                self.pos = pos - n
                raise self.fail(f"metadata {key!r} holds a string of {n} bytes past the end")
        self.pos = pos
        self.need(0)

    # --- the header ---------------------------------------------------------------------
    def parse(self) -> GGUFHeader:
        self.need(4)
        magic = bytes(self.buf[0:4])
        if magic != GGUF_MAGIC:
            raise InvalidModelFile(
                f"{self.source} is not a GGUF model file (it starts with {magic!r}, not b'GGUF')."
                " localinfer runs llama.cpp GGUF files; convert other formats with llama.cpp's"
                " convert_hf_to_gguf.py or download a .gguf."
            )
        self.pos = 4
        version = self.u32()
        if version not in SUPPORTED_VERSIONS:
            raise InvalidModelFile(
                f"{self.source} is GGUF version {version}; localinfer reads versions"
                f" {', '.join(map(str, SUPPORTED_VERSIONS))}. Re-convert it with a current"
                " llama.cpp."
            )
        n_tensors = self.u64()
        n_kv = self.u64()
        # Each entry takes at least ``least`` bytes of the header.
        for count, what, least, most in ((n_kv, "metadata entries", 13, MAX_KV_COUNT),
                                         (n_tensors, "tensors", 24, MAX_TENSOR_COUNT)):
            if count > most:
                raise self.fail(f"it declares {count} {what}")
            if count * least > self.total:
                raise self.fail(f"it declares {count} {what}, more than its {self.total} bytes"
                                " can hold: the file is cut short or damaged; download it again")

        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self.string("a metadata key")
            vtype = self.u32()
            metadata[key] = self.value(vtype, key)

        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise self.fail(f"general.alignment is {alignment!r}, not a power of two")

        raw_tensors = []
        for _ in range(n_tensors):
            name = self.string("a tensor name")
            n_dims = self.u32()
            if n_dims == 0 or n_dims > 4:
                raise self.fail(f"tensor {name!r} has {n_dims} dimensions")
            shape = tuple(self.u64() for _ in range(n_dims))
            type_id = self.u32()
            offset = self.u64()
            raw_tensors.append((name, shape, type_id, offset))

        data_offset = -(-self.pos // alignment) * alignment
        data_size = self.total - data_offset
        tensors = []
        for name, shape, type_id, offset in raw_tensors:
            ggml_type = GGML_TYPES.get(type_id)
            if ggml_type is None:
                raise InvalidModelFile(
                    f"{self.source}: tensor {name!r} has ggml type {type_id}, which this version"
                    " of localinfer does not know. Update localinfer, or use another quant."
                )
            type_name, block, block_bytes = ggml_type
            n_elements = 1
            for dim in shape:
                n_elements *= dim
            if shape[0] % block:
                raise self.fail(f"tensor {name!r} has a row of {shape[0]}, not a multiple of "
                                f"{type_name}'s block of {block}")
            n_bytes = n_elements // block * block_bytes
            if offset % alignment or offset + n_bytes > data_size:
                raise self.fail(
                    f"tensor {name!r} lies at {offset}..{offset + n_bytes}, outside the"
                    f" {data_size} bytes of tensor data (is the file truncated?)"
                )
            tensors.append(TensorInfo(name, type_name, shape, offset, n_bytes, n_elements))

        return GGUFHeader(
            version=version,
            alignment=alignment,
            data_offset=data_offset,
            file_size=self.total,
            metadata=metadata,
            tensors=tuple(tensors),
        )


def _as_int(value: Any, default: int) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return max(value)
    return default
