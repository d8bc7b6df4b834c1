"""Writes small GGUF files byte by byte, valid or deliberately broken, for reader tests."""

from __future__ import annotations

import struct
from typing import Any

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)


def s(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def value(vtype: int, v: Any) -> bytes:
    fmt = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
    if vtype == STRING:
        return s(v)
    if vtype == ARRAY:
        item_type, items = v
        return struct.pack("<IQ", item_type, len(items)) + b"".join(value(item_type, i)
                                                                     for i in items)
    return struct.pack(fmt[vtype], v)


def kv(key: str, vtype: int, v: Any) -> bytes:
    return s(key) + struct.pack("<I", vtype) + value(vtype, v)


def tensor_info(name: str, shape: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    return (s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d)
                                                               for d in shape)
            + struct.pack("<IQ", ggml_type, offset))


def gguf(kvs: list[bytes], tensors: list[tuple[str, tuple[int, ...], int, int]],
         data: bytes = b"", *, version: int = 3, n_kv: int | None = None,
         n_tensors: int | None = None, alignment: int = 32) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version,
                                 len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensor_info(*t) for t in tensors)
    pad = (-len(body)) % alignment
    return body + b"\0" * pad + data


def tiny_model(n_layers: int = 2, embd: int = 64, vocab: int = 32) -> bytes:
    """A structurally valid llama-style header with F32 tensors and zeroed data."""
    kvs = [
        kv("general.architecture", STRING, "llama"),
        kv("general.name", STRING, "tiny"),
        kv("general.file_type", U32, 0),
        kv("llama.block_count", U32, n_layers),
        kv("llama.embedding_length", U32, embd),
        kv("llama.attention.head_count", U32, 4),
        kv("llama.attention.head_count_kv", U32, 2),
        kv("llama.context_length", U32, 256),
        kv("tokenizer.ggml.tokens", ARRAY, (STRING, [f"t{i}" for i in range(vocab)])),
        kv("tokenizer.chat_template", STRING, "{{ messages[0]['content'] }}"),
    ]
    tensors = []
    offset = 0
    shapes = [("token_embd.weight", (embd, vocab))]
    for i in range(n_layers):
        shapes += [(f"blk.{i}.attn_q.weight", (embd, embd)),
                   (f"blk.{i}.ffn_up.weight", (embd, 2 * embd))]
    shapes += [("output_norm.weight", (embd,)), ("output.weight", (embd, vocab))]
    for name, shape in shapes:
        n = 4
        for d in shape:
            n *= d
        tensors.append((name, shape, 0, offset))
        offset += n + (-n) % 32
    return gguf(kvs, tensors, b"\0" * offset)
