"""Hub names (hf.co/user/repo[:quant]) without the network: parsing, the canonical name the
store keeps, hostile names refused before anything is touched, what file names say, how a
repo's files group into quants, and split GGUF headers read as one model."""

from __future__ import annotations

import pytest

import ggufgen
from localinfer import gguf
from localinfer.errors import InvalidModelFile, InvalidRequest
from localinfer.store import ModelStore, looks_like_path, validate_name
from localinfer.store.hub_names import is_hub_name, parse, quant_of, shard_of
from localinfer.store.hub_repo import listing_of


@pytest.mark.parametrize(("ref", "repo", "quant", "canonical"), [
    ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", "bartowski/Llama-3.2-1B-Instruct-GGUF",
     "Q4_K_M", "hf.co/bartowski/llama-3.2-1b-instruct-gguf:q4_k_m"),
    ("huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF:q8_0",
     "bartowski/Llama-3.2-1B-Instruct-GGUF", "Q8_0",
     "hf.co/bartowski/llama-3.2-1b-instruct-gguf:q8_0"),
    ("https://huggingface.co/unsloth/Qwen3-8B-GGUF", "unsloth/Qwen3-8B-GGUF", None,
     "hf.co/unsloth/qwen3-8b-gguf"),
    ("  unsloth/Qwen3-8B-GGUF:UD-Q4_K_XL ", "unsloth/Qwen3-8B-GGUF", "UD-Q4_K_XL",
     "hf.co/unsloth/qwen3-8b-gguf:ud-q4_k_xl"),
    ("hf.co/TheBloke/Mistral-7B-v0.1-GGUF:latest", "TheBloke/Mistral-7B-v0.1-GGUF", None,
     "hf.co/thebloke/mistral-7b-v0.1-gguf"),
])
def test_the_three_forms_parse_to_one_canonical_name(ref, repo, quant, canonical):
    assert is_hub_name(ref)
    parsed = parse(ref)
    assert (parsed.repo, parsed.quant, parsed.name) == (repo, quant, canonical)
    assert validate_name(ref) == canonical
    assert not looks_like_path(ref)


@pytest.mark.parametrize("ref", [
    "hf.co/..", "hf.co/../etc:Q4_K_M", "hf.co/user/..", "hf.co/user/repo/../x:Q4_K_M",
    "hf.co/user/repo/extra", "hf.co/user", "hf.co//repo", "hf.co/user/re po",
    "hf.co/user/repo:../../x", "hf.co/user/repo:Q4/..", "hf.co/us--er/repo",
    "hf.co/user/repo.:Q4_K_M", "hf.co/-user/repo", "hf.co/user/r%2e%2e", "hf.co/üser/repo",
    "hf.co/user/repo:" + "Q" * 40, "hf.co/" + "u" * 97 + "/repo", "hf.co/user/repo\x00:Q4",
    "huggingface.co/user/repo:Q4_K_M;rm", "hf.co/user/repo:",
])
def test_hostile_hub_names_are_refused_naming_the_part(ref):
    with pytest.raises(InvalidRequest) as info:
        validate_name(ref)
    assert "Hub model name" in info.value.message
    assert not looks_like_path(ref)  # a name, refused; never opened as a file


def test_names_that_are_not_hub_names():
    for ref in ("gemma3:270m", "qwen3", "./model.gguf", "models/x.gguf", "dir/file",
                "a/b:c.gguf"):
        assert not is_hub_name(ref), ref
    assert looks_like_path("dir/file") and looks_like_path("a/b:c.gguf")


def test_an_existing_file_wins_over_a_bare_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "repo:Q4_K_M").write_bytes(b"x")
    assert looks_like_path("user/repo:Q4_K_M")
    assert not looks_like_path("user/other:Q4_K_M")


@pytest.mark.parametrize(("file", "quant"), [
    ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
    ("qwen2.5-0.5b-instruct-q8_0.gguf", "Q8_0"),
    ("llama-2-7b.Q5_K_S.gguf", "Q5_K_S"),
    ("Qwen3-8B-UD-Q4_K_XL-00001-of-00002.gguf", "UD-Q4_K_XL"),
    ("Q8_0/Model-Q8_0-00002-of-00003.gguf", "Q8_0"),
    ("phi-4-IQ4_XS.gguf", "IQ4_XS"),
    ("ggml-model-f16.gguf", "F16"),
    ("gpt-oss-20b-MXFP4.gguf", "MXFP4"),
    ("model.gguf", None),
])
def test_the_quant_a_file_name_ends_with(file, quant):
    assert quant_of(file) == quant


def test_shards_by_name():
    assert shard_of("x-00002-of-00003.gguf") == (2, 3)
    assert shard_of("x-00004-of-00003.gguf") is None
    assert shard_of("x-Q4_K_M.gguf") is None


def test_a_repos_files_group_into_quants():
    sha = "a" * 64
    listing = listing_of("u/r", "c0ffee", [
        ("README.md", 10, None),
        ("m-Q4_K_M.gguf", 100, sha),
        ("m-Q8_0.gguf", 200, sha),
        ("Q8_0-big/m-BF16-00002-of-00002.gguf", 300, sha),
        ("Q8_0-big/m-BF16-00001-of-00002.gguf", 300, sha),
        ("m-Q6_K-00001-of-00002.gguf", 150, sha),  # its second shard is missing
        ("mmproj-m-f16.gguf", 50, sha),
    ])
    assert listing.quant_names() == ["Q4_K_M", "Q8_0", "BF16"]  # by size
    bf16 = listing.pick("bf16")
    assert [f.path for f in bf16.files] == ["Q8_0-big/m-BF16-00001-of-00002.gguf",
                                            "Q8_0-big/m-BF16-00002-of-00002.gguf"]
    assert bf16.size == 600 and bf16.parts == 2
    assert listing.incomplete == ("Q6_K",)
    assert "README.md" in listing.other_files
    with pytest.raises(Exception) as info:
        listing.pick("Q6_K")
    assert "hf.co/u/r has no GGUF file for the quant Q6_K" in str(info.value)
    assert "some of its shards are missing" in str(info.value)
    assert "it has Q4_K_M, Q8_0, BF16" in str(info.value)


def test_a_split_gguf_reads_as_one_model(tmp_path):
    whole = tmp_path / "whole.gguf"
    whole.write_bytes(ggufgen.tiny_model(n_layers=4))
    shards = ggufgen.split_gguf(whole, tmp_path, "tiny", 3)
    original = gguf.read_header(whole)
    merged = gguf.read_header(shards[0])
    assert [t.name for t in merged.tensors] == [t.name for t in original.tensors]
    assert merged.parameter_count == original.parameter_count
    assert merged.file_size == sum(p.stat().st_size for p in shards)
    assert merged.block_count == 4 and gguf.split_count(merged) == 3
    assert len(gguf.read_file_header(shards[0]).tensors) < len(original.tensors)
    # A later shard, a missing shard, a renamed first shard: each said plainly.
    with pytest.raises(InvalidModelFile, match="is shard 2 of a model split into 3"):
        gguf.read_header(shards[1])
    renamed = tmp_path / "renamed.gguf"
    renamed.write_bytes(shards[0].read_bytes())
    with pytest.raises(InvalidModelFile, match="not named NAME-00001-of-00003.gguf"):
        gguf.read_header(renamed)
    shards[2].unlink()
    with pytest.raises(InvalidModelFile, match="a shard of a split model, is missing"):
        gguf.read_header(shards[0])


def test_a_split_file_is_added_shard_by_shard(home, tmp_path):
    whole = tmp_path / "whole.gguf"
    whole.write_bytes(ggufgen.tiny_model(n_layers=4))
    shards = ggufgen.split_gguf(whole, tmp_path, "tiny", 2)
    store = ModelStore()
    model = store.add(shards[0], name="tiny:split")
    assert model.parts == 2 and len(model.paths) == 2
    assert all(p.is_file() and p.parent == store.root / "tiny" for p in model.paths)
    assert model.size_bytes == sum(p.stat().st_size for p in shards)
    assert gguf.read_header(model.path).parameter_count == \
        gguf.read_header(whole).parameter_count
    store.remove(model.name)
    assert not any(p.exists() for p in model.paths)
    with pytest.raises(InvalidRequest, match="is a Hub name"):
        store.add(whole, name="hf.co/a/b")


def test_a_file_naming_no_quant_gets_a_label_a_name_can_spell():
    listing = listing_of("u/r", None, [("My--Model..v2 (final)-----------------------.gguf",
                                        10, None)])
    [quant] = listing.quant_names()
    assert parse(f"hf.co/u/r:{quant}").quant == quant


def test_two_files_of_one_quant_pull_the_first_and_say_so():
    # A base and an instruct model side by side: the first was pulled, the other unsaid.
    from localinfer.store.pull import hub_target

    listing = listing_of("u/r", None, [("Alpha-Q4_K_M.gguf", 10, None),
                                       ("Beta-Q4_K_M.gguf", 10, None)])
    target = hub_target(parse("hf.co/u/r:Q4_K_M"), listing=listing)
    assert target.quant.files[0].path == "Alpha-Q4_K_M.gguf"
    assert "2 Q4_K_M files" in target.note and "not Beta-Q4_K_M.gguf" in target.note
    single = listing_of("u/r", None, [("Alpha-Q4_K_M.gguf", 10, None)])
    assert hub_target(parse("hf.co/u/r:Q4_K_M"), listing=single).note == ""


def test_a_repo_named_without_hf_co_is_pointed_at_it():
    """`pull demo/Quants-GGUF` said only that it is a path."""
    from localinfer.catalog import load_catalog
    from localinfer.errors import InvalidRequest
    from localinfer.store.pull import lookup

    with pytest.raises(InvalidRequest, match=r"pull hf\.co/demo/Quants-GGUF"):
        lookup(load_catalog(), "demo/Quants-GGUF")


def test_a_repo_of_a_split_model_missing_a_shard_says_so():
    """It said the repo "has no GGUF file (it has no files)"."""
    from localinfer.store.hub_repo import listing_of, no_gguf

    listing = listing_of("demo/split-GGUF", None,
                         [("model-Q4_K_M-00001-of-00002.gguf", 100, None)])
    assert listing.quants == ()
    message = no_gguf(listing).message
    assert "part of a split GGUF for Q4_K_M" in message and "no files" not in message
