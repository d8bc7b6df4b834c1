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


def tiny_model(n_layers: int = 2, embd: int = 64, vocab: int = 32, *,
               file_type: int = 0) -> bytes:
    """A structurally valid llama-style header with F32 tensors and zeroed data.
    ``file_type``: what general.file_type says (llama.cpp's LLAMA_FTYPE: 15 = Q4_K_M)."""
    kvs = [
        kv("general.architecture", STRING, "llama"),
        kv("general.name", STRING, "tiny"),
        kv("general.file_type", U32, file_type),
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


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    """The offset after one metadata value of type ``vtype`` starting at ``pos``."""
    sizes = {U8: 1, I8: 1, U16: 2, I16: 2, U32: 4, I32: 4, F32: 4, BOOL: 1, U64: 8, I64: 8,
             F64: 8}
    if vtype == STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == ARRAY:
        item_type, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item_type in sizes:
            return pos + count * sizes[item_type]
        for _ in range(count):
            pos = _skip_value(buf, pos, item_type)
        return pos
    return pos + sizes[vtype]


def split_gguf(source, folder, stem: str, n_shards: int) -> list:
    """Split the GGUF file ``source`` into ``n_shards`` files in ``folder`` as llama.cpp's
    gguf-split does: ``{stem}-0000i-of-0000n.gguf``, the first with all the metadata, each
    with split.no (u16), split.count (u16) and split.tensors.count (i32), and the tensors
    shared out in order, each shard's data laid out afresh. Returns the paths."""
    from pathlib import Path

    from localinfer import gguf as reader

    source, folder = Path(source), Path(folder)
    header = reader.read_header(source)
    align = header.alignment
    with open(source, "rb") as f:
        head = f.read(min(header.data_offset, source.stat().st_size))
    (n_kv,) = struct.unpack_from("<Q", head, 16)
    pos = 24
    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", head, pos)
        pos += 8 + n
        (vtype,) = struct.unpack_from("<I", head, pos)
        pos = _skip_value(head, pos + 4, vtype)
    metadata = head[24:pos]
    tensors = list(header.tensors)
    per = -(-len(tensors) // n_shards)
    paths = []
    with open(source, "rb") as src:
        for i in range(n_shards):
            mine = tensors[i * per:(i + 1) * per]
            split = [kv("split.no", U16, i), kv("split.count", U16, n_shards),
                     kv("split.tensors.count", I32, len(tensors))]
            kvs = ([metadata] if i == 0 else []) + split
            n_keys = (n_kv if i == 0 else 0) + len(split)
            infos, offset = [], 0
            for t in mine:
                infos.append(tensor_info(t.name, t.shape, _type_id(t.type_name), offset))
                offset += t.n_bytes + (-t.n_bytes) % align
            body = (b"GGUF" + struct.pack("<IQQ", header.version, len(mine), n_keys)
                    + b"".join(kvs) + b"".join(infos))
            path = folder / f"{stem}-{i + 1:05d}-of-{n_shards:05d}.gguf"
            with open(path, "wb") as out:
                out.write(body + b"\0" * ((-len(body)) % align))
                for t in mine:
                    src.seek(header.data_offset + t.offset)
                    out.write(src.read(t.n_bytes) + b"\0" * ((-t.n_bytes) % align))
            paths.append(path)
    return paths


def _type_id(type_name: str) -> int:
    from localinfer.gguf import GGML_TYPES

    return next(i for i, (name, _, _) in GGML_TYPES.items() if name == type_name)
RERANK_WORDS = ("the", "cat", "sat", "on", "mat", "dog", "ran", "in", "park", "a", "what",
                "where", "is", "did", "sun", "hot", "cold", "paris", "france", "capital")
"""The whole words of ``reranker_model``'s vocabulary (anything else reads as [UNK])."""


def reranker_model(*, embd: int = 32, n_layers: int = 2, n_ctx: int = 128,
                   seed: int = 0) -> bytes:
    """A tiny BERT cross-encoder llama.cpp loads and runs: a WordPiece vocabulary, random F32
    weights, a classification head with one output, and ``pooling_type`` rank (4), as
    bge-reranker's GGUF has. Its scores mean nothing; they only differ from pair to pair."""
    import numpy as np

    rng = np.random.default_rng(seed)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens = specials + ["\u2581" + w for w in RERANK_WORDS] + list("abcdefghijklmnopqrstuvwxyz?.,")
    ffn = 2 * embd
    kvs = [
        kv("general.architecture", STRING, "bert"),
        kv("general.name", STRING, "tiny-reranker"),
        kv("general.file_type", U32, 0),
        kv("bert.context_length", U32, n_ctx),
        kv("bert.embedding_length", U32, embd),
        kv("bert.feed_forward_length", U32, ffn),
        kv("bert.block_count", U32, n_layers),
        kv("bert.attention.head_count", U32, 4),
        kv("bert.attention.layer_norm_epsilon", F32, 1e-12),
        kv("bert.attention.causal", BOOL, False),
        kv("bert.pooling_type", U32, 4),
        kv("tokenizer.ggml.model", STRING, "bert"),
        kv("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        kv("tokenizer.ggml.token_type", ARRAY, (I32, [3] * len(specials)
                                                + [1] * (len(tokens) - len(specials)))),
        kv("tokenizer.ggml.token_type_count", U32, 2),
        kv("tokenizer.ggml.padding_token_id", U32, 0),
        kv("tokenizer.ggml.unknown_token_id", U32, 1),
        kv("tokenizer.ggml.bos_token_id", U32, 2),
        kv("tokenizer.ggml.cls_token_id", U32, 2),
        kv("tokenizer.ggml.seperator_token_id", U32, 3),
        kv("tokenizer.ggml.eos_token_id", U32, 3),
        kv("tokenizer.ggml.mask_token_id", U32, 4),
        kv("tokenizer.ggml.add_bos_token", BOOL, True),
        kv("tokenizer.ggml.add_eos_token", BOOL, True),
    ]
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("token_embd.weight", (embd, len(tokens))),
        ("token_types.weight", (embd, 2)),
        ("position_embd.weight", (embd, n_ctx)),
        ("token_embd_norm.weight", (embd,)), ("token_embd_norm.bias", (embd,)),
    ]
    for i in range(n_layers):
        b = f"blk.{i}."
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            shapes += [(b + part + ".weight", (embd, embd)), (b + part + ".bias", (embd,))]
        shapes += [(b + "attn_output_norm.weight", (embd,)),
                   (b + "attn_output_norm.bias", (embd,)),
                   (b + "ffn_up.weight", (embd, ffn)), (b + "ffn_up.bias", (ffn,)),
                   (b + "ffn_down.weight", (ffn, embd)), (b + "ffn_down.bias", (embd,)),
                   (b + "layer_output_norm.weight", (embd,)),
                   (b + "layer_output_norm.bias", (embd,))]
    shapes += [("cls.weight", (embd, embd)), ("cls.bias", (embd,)),
               ("cls.output.weight", (embd, 1)), ("cls.output.bias", (1,))]
    tensors = []
    data = bytearray()
    for name, shape in shapes:
        n = int(np.prod(shape))
        if name.endswith("norm.weight"):
            values = np.ones(n, dtype="<f4")
        elif name.endswith("norm.bias"):
            values = np.zeros(n, dtype="<f4")
        else:
            values = (rng.standard_normal(n) * 0.5).astype("<f4")
        tensors.append((name, shape, 0, len(data)))
        data += values.tobytes()
        data += b"\0" * ((-len(data)) % 32)
    return gguf(kvs, tensors, bytes(data))


def lora_adapter(*, architecture: str = "bert", embd: int = 32, n_layers: int = 2,
                 rank: int = 4, alpha: float = 8.0, seed: int = 1) -> bytes:
    """A LoRA adapter GGUF for ``reranker_model``'s attention (``lora_a``/``lora_b`` of
    each layer's attn_q and attn_v, random F32), as llama.cpp's convert_lora_to_gguf.py
    writes one: ``general.type`` adapter, ``adapter.type`` lora, ``adapter.lora.alpha``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    kvs = [
        kv("general.architecture", STRING, architecture),
        kv("general.type", STRING, "adapter"),
        kv("adapter.type", STRING, "lora"),
        kv("adapter.lora.alpha", F32, alpha),
    ]
    tensors = []
    data = bytearray()
    for i in range(n_layers):
        for part in ("attn_q", "attn_v"):
            for suffix, shape in (("lora_a", (embd, rank)), ("lora_b", (rank, embd))):
                values = (rng.standard_normal(embd * rank) * 0.5).astype("<f4")
                tensors.append((f"blk.{i}.{part}.weight.{suffix}", shape, 0, len(data)))
                data += values.tobytes()
                data += b"\0" * ((-len(data)) % 32)
    return gguf(kvs, tensors, bytes(data))
def _llama_kvs(name: str, n_layers: int, embd: int, n_ff: int, head_count: int,
               head_kv: int, file_type: int, context: int = 512) -> tuple[list[bytes], int]:
    """The metadata of a llama-architecture model with a byte-fallback SentencePiece
    vocabulary of 259 tokens plus a few words, and the vocabulary's size."""
    words = ["▁the", "▁a", "▁is", "▁of", "▁and", "▁to", "▁in", "▁it"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    kvs = [
        kv("general.architecture", STRING, "llama"),
        kv("general.name", STRING, name),
        kv("general.file_type", U32, file_type),
        kv("llama.block_count", U32, n_layers),
        kv("llama.context_length", U32, context),
        kv("llama.embedding_length", U32, embd),
        kv("llama.feed_forward_length", U32, n_ff),
        kv("llama.attention.head_count", U32, head_count),
        kv("llama.attention.head_count_kv", U32, head_kv),
        kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        kv("llama.rope.dimension_count", U32, embd // head_count),
        kv("tokenizer.ggml.model", STRING, "llama"),
        kv("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        kv("tokenizer.ggml.scores", ARRAY, (F32, [0.0] * 3 + [-1000.0] * 256
                                            + [-float(i) for i in range(len(words))])),
        kv("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        kv("tokenizer.ggml.bos_token_id", U32, 1),
        kv("tokenizer.ggml.eos_token_id", U32, 2),
        kv("tokenizer.ggml.unknown_token_id", U32, 0),
    ]
    return kvs, len(tokens)


def _attention(i: int, embd: int, kv_dim: int) -> list[tuple[str, tuple[int, ...], bool]]:
    return [(f"blk.{i}.attn_norm.weight", (embd,), True),
            (f"blk.{i}.attn_q.weight", (embd, embd), False),
            (f"blk.{i}.attn_k.weight", (embd, kv_dim), False),
            (f"blk.{i}.attn_v.weight", (embd, kv_dim), False),
            (f"blk.{i}.attn_output.weight", (embd, embd), False),
            (f"blk.{i}.ffn_norm.weight", (embd,), True)]


def moe_model(n_layers: int = 4, embd: int = 512, n_ff: int = 64, n_expert: int = 16,
              n_expert_used: int = 1, seed: int = 0) -> bytes:
    """A loadable mixture-of-experts model (llama architecture with experts, as Mixtral):
    random F16 weights, a byte-fallback SentencePiece vocabulary of 259 tokens plus a few
    words. It writes nonsense, and every expert tensor is where llama.cpp can be asked to put
    it (``blk.N.ffn_{gate,up,down}_exps.weight``). Its proportions are a large MoE's (attention
    weighs more than the active experts a token reads; the experts most of the file): 20 MB."""
    import numpy as np

    rng = np.random.default_rng(seed)
    head_count, head_kv = 4, 2
    kvs, vocab = _llama_kvs("tiny-moe", n_layers, embd, n_ff, head_count, head_kv, 1)
    kvs += [kv("llama.expert_count", U32, n_expert),
            kv("llama.expert_used_count", U32, n_expert_used)]
    kv_dim = embd // head_count * head_kv
    shapes: list[tuple[str, tuple[int, ...], bool]] = [("token_embd.weight", (embd, vocab), False)]
    for i in range(n_layers):
        shapes += _attention(i, embd, kv_dim)
        shapes += [(f"blk.{i}.ffn_gate_inp.weight", (embd, n_expert), False),
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


def write_zero_model(path, *, n_layers: int = 8, embd: int = 2048, n_ff: int = 8192,
                     context: int = 65536) -> int:
    """Write at ``path`` a dense llama-architecture model whose F16 weights are all zero, as a
    sparse file (its data takes no disk and no memory here): a model of a given size for load
    tests, ~1 GiB as it comes, trained for ``context`` tokens (its F16 KV cache: 16 KiB a
    token). It loads and decodes (every logit 0). Returns its size."""
    head_count, head_kv = 16, 4
    kvs, vocab = _llama_kvs("zero", n_layers, embd, n_ff, head_count, head_kv, 1, context)
    kv_dim = embd // head_count * head_kv
    shapes: list[tuple[str, tuple[int, ...], bool]] = [("token_embd.weight", (embd, vocab), False)]
    for i in range(n_layers):
        shapes += _attention(i, embd, kv_dim)
        shapes += [(f"blk.{i}.ffn_gate.weight", (embd, n_ff), False),
                   (f"blk.{i}.ffn_up.weight", (embd, n_ff), False),
                   (f"blk.{i}.ffn_down.weight", (n_ff, embd), False)]
    shapes += [("output_norm.weight", (embd,), True), ("output.weight", (embd, vocab), False)]
    tensors, offset = [], 0
    for name, shape, is_norm in shapes:
        count = 1
        for d in shape:
            count *= d
        tensors.append((name, shape, 0 if is_norm else 1, offset))
        size = count * (4 if is_norm else 2)
        offset += size + (-size) % 32
    head = gguf(kvs, tensors)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + offset)
    return len(head) + offset
