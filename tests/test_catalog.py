"""models.toml: the packaged catalog loads, and a broken entry names its line and field."""

from __future__ import annotations

import pytest

from localinfer.catalog import load_catalog, parse_catalog
from localinfer.errors import ConfigError

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
