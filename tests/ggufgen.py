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


def moe_model(n_layers: int = 4, embd: int = 512, n_ff: int = 64, n_expert: int = 16,
              n_expert_used: int = 1, seed: int = 0) -> bytes:
    """A loadable mixture-of-experts model (llama architecture with experts, as Mixtral):
    random F16 weights, a byte-fallback SentencePiece vocabulary of 259 tokens plus a few
    words. It writes nonsense, and every expert tensor is where llama.cpp can be asked to put
    it (``blk.N.ffn_{gate,up,down}_exps.weight``). Its proportions are a large MoE's (attention
    weighs more than the active experts a token reads; the experts most of the file): 20 MB."""
    import numpy as np

    rng = np.random.default_rng(seed)
    words = ["▁the", "▁a", "▁is", "▁of", "▁and", "▁to", "▁in", "▁it"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    head_count, head_kv = 4, 2
    kvs = [
        kv("general.architecture", STRING, "llama"),
        kv("general.name", STRING, "tiny-moe"),
        kv("general.file_type", U32, 1),
        kv("llama.block_count", U32, n_layers),
        kv("llama.context_length", U32, 512),
        kv("llama.embedding_length", U32, embd),
        kv("llama.feed_forward_length", U32, n_ff),
        kv("llama.attention.head_count", U32, head_count),
        kv("llama.attention.head_count_kv", U32, head_kv),
        kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        kv("llama.rope.dimension_count", U32, embd // head_count),
        kv("llama.expert_count", U32, n_expert),
        kv("llama.expert_used_count", U32, n_expert_used),
        kv("tokenizer.ggml.model", STRING, "llama"),
        kv("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        kv("tokenizer.ggml.scores", ARRAY, (F32, [0.0] * 3 + [-1000.0] * 256
                                            + [-float(i) for i in range(len(words))])),
        kv("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        kv("tokenizer.ggml.bos_token_id", U32, 1),
        kv("tokenizer.ggml.eos_token_id", U32, 2),
        kv("tokenizer.ggml.unknown_token_id", U32, 0),
    ]
    vocab, kv_dim = len(tokens), embd // head_count * head_kv
    shapes: list[tuple[str, tuple[int, ...], bool]] = [("token_embd.weight", (embd, vocab), False)]
    for i in range(n_layers):
        shapes += [(f"blk.{i}.attn_norm.weight", (embd,), True),
                   (f"blk.{i}.attn_q.weight", (embd, embd), False),
                   (f"blk.{i}.attn_k.weight", (embd, kv_dim), False),
                   (f"blk.{i}.attn_v.weight", (embd, kv_dim), False),
                   (f"blk.{i}.attn_output.weight", (embd, embd), False),
                   (f"blk.{i}.ffn_norm.weight", (embd,), True),
                   (f"blk.{i}.ffn_gate_inp.weight", (embd, n_expert), False),
                   (f"blk.{i}.ffn_gate_exps.weight", (embd, n_ff, n_expert), False),
                   (f"blk.{i}.ffn_up_exps.weight", (embd, n_ff, n_expert), False),
                   (f"blk.{i}.ffn_down_exps.weight", (n_ff, embd, n_expert), False)]
    shapes += [("output_norm.weight", (embd,), True), ("output.weight", (embd, vocab), False)]
    tensors, blobs, offset = [], [], 0
    for name, shape, is_norm in shapes:
        count = int(np.prod(shape))
        # Norms in F32 (llama.cpp's own converters keep them so), the rest F16.
        data = (np.ones(count, np.float32) if is_norm
                else rng.normal(0.0, 0.05, count).astype(np.float16)).tobytes()
        data += b"\0" * ((-len(data)) % 32)
        tensors.append((name, shape, 0 if is_norm else 1, offset))
        blobs.append(data)
        offset += len(data)
    return gguf(kvs, tensors, b"".join(blobs))
