"""The GGUF header reader: the real starter model, and hostile files written here."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ggufgen as g
from localinfer import gguf
from localinfer.errors import InvalidModelFile, ModelNotFound


@pytest.mark.model
def test_starter_header_facts(starter_path):
    h = gguf.read_header(starter_path)
    assert h.architecture == "gemma3"
    assert (h.block_count, h.embedding_length, h.head_count, h.head_count_kv) == (18, 640, 4, 1)
    assert (h.key_length, h.value_length) == (256, 256)
    assert h.sliding_window == 512
    assert h.context_length == 32768
    assert h.vocab_size == 262144
    assert h.quant == "Q4_K_M"
    assert h.chat_template is None  # the starter file has none: the catalog supplies it
    assert isinstance(h.metadata["tokenizer.ggml.tokens"], gguf.ArrayStub)


@pytest.mark.model
def test_starter_tensor_bytes_add_up_to_the_file(starter_path):
    h = gguf.read_header(starter_path)
    size = starter_path.stat().st_size
    # Every tensor's exact size, laid out at its offset, ends exactly at the end of the file.
    end = max(t.offset + t.n_bytes for t in h.tensors)
    assert h.data_offset + end == size
    # ...and the tensors tile the data section with only alignment padding between them.
    padded = sum(t.n_bytes + (-t.n_bytes) % h.alignment for t in h.tensors[:-1])
    assert padded + h.tensors[-1].n_bytes == size - h.data_offset
    # Grouping: every tensor is in exactly one of layers / embedding / output-only / other.
    layers = h.layer_bytes()
    assert len(layers) == 18 and all(b > 0 for b in layers)
    own_output = sum(t.n_bytes for t in h.tensors if t.name.startswith("output"))
    assert sum(layers) + h.embedding_bytes + own_output + h.other_bytes == h.tensor_bytes


@pytest.mark.model
def test_starter_kv_cache_counts_sliding_window_layers_at_their_window(starter_path):
    h = gguf.read_header(starter_path)
    kinds = [layer.sliding_window for layer in h.layer_kv()]
    assert kinds.count(None) == 3  # layers 5, 11, 17 are global (period 6)
    assert kinds[5] is None and kinds[0] == 512
    per_token = 1 * (256 + 256) * 2  # kv heads x (k + v dims) x f16 bytes, per layer
    assert h.kv_bytes_per_token() == 18 * per_token
    assert h.kv_cache_bytes(4096) == 3 * 4096 * per_token + 15 * 512 * per_token
    assert h.kv_cache_bytes(100) == 18 * 100 * per_token


def test_tiny_model_round_trip(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(g.tiny_model(n_layers=3, embd=64, vocab=32))
    h = gguf.read_header(path)
    assert h.architecture == "llama" and h.block_count == 3
    assert h.head_count_kv == 2 and h.key_length == 16
    assert h.vocab_size == 32 and h.chat_template
    assert h.layer_bytes() == [64 * 64 * 4 + 64 * 128 * 4] * 3
    assert h.embedding_bytes == 64 * 32 * 4
    assert h.output_bytes == 64 * 4 + 64 * 32 * 4
    assert h.quant == "F32"


def _write(tmp_path, data: bytes, name: str = "bad.gguf"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _expect_invalid(path, *words: str) -> str:
    with pytest.raises(InvalidModelFile) as info:
        gguf.read_header(path)
    message = str(info.value)
    for word in words:
        assert word in message
    return message


def test_not_gguf(tmp_path):
    _expect_invalid(_write(tmp_path, b"PK\x03\x04" + b"\0" * 100), "not a GGUF model file")


def test_empty_and_tiny_files(tmp_path):
    _expect_invalid(_write(tmp_path, b""), "too small")
    _expect_invalid(_write(tmp_path, b"GGUF\x03\0\0\0"), "too small")


def test_missing_file_and_directory(tmp_path):
    _expect_invalid(tmp_path / "nope.gguf", "does not exist")
    _expect_invalid(tmp_path, "directory")


def test_unsupported_version(tmp_path):
    data = g.gguf([], [], version=1) + b"\0" * 32
    _expect_invalid(_write(tmp_path, data), "version 1")
    data = g.gguf([], [], version=99) + b"\0" * 32
    _expect_invalid(_write(tmp_path, data), "version 99")


def test_string_declared_2_to_the_60_bytes(tmp_path):
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**60) + b"x" * 64
    _expect_invalid(_write(tmp_path, data), "string")


def test_absurd_counts(tmp_path):
    data = b"GGUF" + struct.pack("<IQQ", 3, 2**62, 0) + b"\0" * 64
    _expect_invalid(_write(tmp_path, data), "tensors")
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40) + b"\0" * 64
    _expect_invalid(_write(tmp_path, data), "metadata entries")
    array = g.s("big") + struct.pack("<IIQ", g.ARRAY, g.U32, 2**61)
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + array + b"\0" * 64
    _expect_invalid(_write(tmp_path, data), "more than the file holds")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("layers", [2**31, 2**32 - 1, 8])
def test_more_layers_than_tensors_is_refused_before_the_planner_lists_them(tmp_path, layers):
    """A header whose block_count outnumbers its tensors (each layer has tensors of its own):
    2**31 layers made `plan` take all the memory listing them."""
    data = g.tiny_model(n_layers=2)
    data = data.replace(g.kv("llama.block_count", g.U32, 2),
                        g.kv("llama.block_count", g.U32, layers), 1)
    _expect_invalid(_write(tmp_path, data), f"declares {layers} layers", "holds 7 tensors")


def test_a_tensor_of_a_layer_past_the_tensors_is_refused(tmp_path):
    """``blk.999999999999.*``: the planner would size a list of that many layers."""
    data = g.tiny_model(n_layers=2).replace(b"blk.1.ffn_up.weight", b"blk.9999999999999.x", 1)
    _expect_invalid(_write(tmp_path, data), "blk.9999999999999.x", "names a layer past")


@pytest.mark.timeout(5)
def test_deeply_nested_arrays_are_rejected_quickly(tmp_path):
    nested = struct.pack("<IQ", g.ARRAY, 1) * 10_000 + struct.pack("<IQ", g.U8, 0)
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + g.s("deep") + struct.pack("<I", g.ARRAY)
    _expect_invalid(_write(tmp_path, data + nested + b"\0" * 64), "nests arrays")


@pytest.mark.timeout(10)
def test_millions_of_empty_strings_hit_the_item_budget(tmp_path):
    count = gguf.MAX_PARSED_ITEMS + 10
    array = g.s("vocab") + struct.pack("<IIQ", g.ARRAY, g.STRING, count)
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + array + b"\0" * (8 * count)
    _expect_invalid(_write(tmp_path, data), "strings or arrays")


def test_unknown_value_type(tmp_path):
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + g.s("k") + struct.pack("<I", 77) + b"\0" * 64
    _expect_invalid(_write(tmp_path, data), "unknown value type 77")


def test_unknown_tensor_type_names_the_tensor(tmp_path):
    data = g.gguf([g.kv("general.architecture", g.STRING, "llama")],
                  [("blk.0.w", (32, 2), 200, 0)], b"\0" * 512)
    _expect_invalid(_write(tmp_path, data), "blk.0.w", "ggml type 200")


def test_tensor_beyond_the_end_of_file_says_truncated(tmp_path):
    data = g.gguf([], [("w", (64, 64), 0, 0)], b"\0" * 100)
    _expect_invalid(_write(tmp_path, data), "truncated")


def test_tensor_with_absurd_shape(tmp_path):
    data = g.gguf([], [("w", (2**40, 2**40, 2**40), 0, 0)], b"\0" * 64)
    _expect_invalid(_write(tmp_path, data), "outside")
    data = g.gguf([], [("w", (1, 1, 1, 1, 1), 0, 0)], b"\0" * 64)
    _expect_invalid(_write(tmp_path, data), "dimensions")


def test_misaligned_tensor_and_bad_alignment(tmp_path):
    data = g.gguf([], [("w", (4,), 0, 4)], b"\0" * 64)
    _expect_invalid(_write(tmp_path, data), "outside")
    data = g.gguf([g.kv("general.alignment", g.U32, 24)], [], b"\0" * 64)
    _expect_invalid(_write(tmp_path, data), "alignment")


def test_layers_and_tensors_that_disagree_are_refused_before_llama_cpp(tmp_path):
    """llama.cpp aborts the whole process (a daemon with every model it holds) on a layer
    count of 0; a header of no tensors planned as a model decoding at 3,333 tok/s."""
    data = g.tiny_model(n_layers=2).replace(g.kv("llama.block_count", g.U32, 2),
                                            g.kv("llama.block_count", g.U32, 0), 1)
    _expect_invalid(_write(tmp_path, data), "'blk.1.", "declares 0 layers",
                    "llama.block_count")
    data = g.tiny_model(n_layers=3).replace(g.kv("llama.block_count", g.U32, 3),
                                            g.kv("llama.block_count", g.U32, 2), 1)
    _expect_invalid(_write(tmp_path, data), "names layer 2", "declares 2 layers")
    count = g.kv("llama.block_count", g.U32, 2**32 - 1)
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + count
    _expect_invalid(_write(tmp_path, data), "holds no tensors")
    _expect_invalid(_write(tmp_path, b"GGUF" + struct.pack("<IQQ", 3, 0, 0)), "no tensors")
    # A LoRA adapter declares no layer count, and may hold a few high layers' tensors only
    # (here layer 9 among 8 tensors, as layers 30-31 of q_proj are 4).
    adapter = g.lora_adapter(n_layers=2).replace(b"blk.1.", b"blk.9.")
    assert gguf.read_header(_write(tmp_path, adapter, "lora.gguf")).block_count == 0
    # The first KB of a model of 236 tensors (the starter's) is a file cut short.
    cut = b"GGUF" + struct.pack("<IQQ", 3, 236, 40) + b"\0" * 1000
    _expect_invalid(_write(tmp_path, cut), "236 tensors", "cut short", "download it again")


def test_every_truncation_of_a_valid_file_is_a_clean_error(tmp_path):
    full = g.tiny_model(n_layers=1, embd=32, vocab=8)
    header_end = gguf.parse_header(full, len(full)).data_offset
    path = tmp_path / "cut.gguf"
    for cut in range(0, header_end + 64, 7):
        path.write_bytes(full[:cut])
        with pytest.raises(InvalidModelFile):
            gguf.read_header(path)


def test_parse_header_asks_for_more_bytes_when_given_a_prefix():
    full = g.tiny_model()
    with pytest.raises(gguf.NeedMoreData) as info:
        gguf.parse_header(full[:100], len(full))
    assert 100 < info.value.needed <= len(full)
    h = gguf.parse_header(full, len(full))
    assert h.block_count == 2


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_corrupted_headers_never_crash(data):
    """Flip random bytes of a valid header: the reader either parses it or raises
    InvalidModelFile, and never anything else."""
    original = bytearray(g.tiny_model(n_layers=1, embd=32, vocab=8))
    header_end = gguf.parse_header(bytes(original), len(original)).data_offset
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, header_end - 1))
        original[pos] = data.draw(st.integers(0, 255))
    try:
        gguf.parse_header(bytes(original), len(original), source="fuzzed")
    except InvalidModelFile:
        pass


def test_a_link_that_loops_or_dangles_says_so(tmp_path, home):
    """`ls` shows the link; "does not exist" beside it sent users looking in the wrong place."""
    from localinfer.store import ModelStore

    loop, dangling = tmp_path / "loop.gguf", tmp_path / "dangling.gguf"
    loop.symlink_to(loop)
    dangling.symlink_to(tmp_path / "moved" / "model.gguf")
    for path, why in ((loop, "loops back on itself"), (dangling, "moved/model.gguf, which does")):
        _expect_invalid(path, why)
        with pytest.raises(ModelNotFound, match=why):
            ModelStore().add(path)
        with pytest.raises(ModelNotFound, match=why):
            ModelStore().resolve(str(path))
