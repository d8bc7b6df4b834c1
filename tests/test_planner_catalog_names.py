"""Every repo and file the catalog names follows its publisher's naming, as public sources show
it; an unknown publisher or pattern fails here rather than as a 404 on a user's first `pull`.

Where each publisher's pattern was seen (public GitHub code quoting the Hugging Face URLs,
found with a code search): bartowski/google_gemma-3-1b-it-GGUF/google_gemma-3-1b-it-Q4_K_M.gguf,
bartowski/Meta-Llama-3.1-8B-Instruct-GGUF/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf,
bartowski/Llama-3.2-3B-Instruct-GGUF/Llama-3.2-3B-Instruct-Q4_K_M.gguf,
bartowski/microsoft_Phi-4-mini-instruct-GGUF/microsoft_Phi-4-mini-instruct-Q4_K_M.gguf,
bartowski/Qwen2.5-Coder-7B-Instruct-GGUF/Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf,
bartowski/Mistral-7B-Instruct-v0.3-GGUF/Mistral-7B-Instruct-v0.3-Q4_K_M.gguf,
bartowski/Mistral-Nemo-Instruct-2407-GGUF/Mistral-Nemo-Instruct-2407-Q4_K_M.gguf,
bartowski/SmolLM2-1.7B-Instruct-GGUF/SmolLM2-1.7B-Instruct-Q4_K_M.gguf,
unsloth/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_K_M.gguf, unsloth/Qwen3-4B-GGUF/Qwen3-4B-Q4_K_M.gguf,
ggml-org/gpt-oss-20b-GGUF/gpt-oss-20b-mxfp4.gguf; the embedding models' repos and files, each
at the address in a comment on its publisher's pattern below. The other repos of models.toml
follow the same patterns but were not found quoted anywhere: models.toml marks them "name: pattern
only".
"""

from __future__ import annotations

import re

import pytest

from localinfer.catalog import catalog_path, load_catalog

CHECKED_REPOS = {
    "bartowski/google_gemma-3-1b-it-GGUF", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
    "bartowski/Llama-3.2-3B-Instruct-GGUF", "bartowski/microsoft_Phi-4-mini-instruct-GGUF",
    "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF", "bartowski/Mistral-7B-Instruct-v0.3-GGUF",
    "bartowski/Mistral-Nemo-Instruct-2407-GGUF", "bartowski/SmolLM2-1.7B-Instruct-GGUF",
    "unsloth/Qwen3-0.6B-GGUF", "unsloth/Qwen3-4B-GGUF", "ggml-org/gpt-oss-20b-GGUF",
    "ggml-org/embeddinggemma-300M-GGUF", "nomic-ai/nomic-embed-text-v1.5-GGUF",
    "leliuga/all-MiniLM-L6-v2-GGUF", "Qwen/Qwen3-Embedding-0.6B-GGUF",
    "gpustack/bge-reranker-v2-m3-GGUF", "ggml-org/Qwen3-Reranker-0.6B-Q8_0-GGUF",
}


def expected_file(repo: str, quant: str) -> str:
    """The file a publisher names for ``quant`` in ``repo`` (``{base}-GGUF``)."""
    publisher, name = repo.split("/", 1)
    match = re.fullmatch(r"(.+)-GGUF", name)
    if match is None:
        raise AssertionError(f"{repo}: not a <base>-GGUF repo, an unknown naming pattern")
    base = match.group(1)
    if publisher == "bartowski":  # upper-case quants, lower-case full-precision types
        return f"{base}-{quant.lower() if quant in ('F16', 'BF16') else quant}.gguf"
    if publisher == "unsloth":
        return f"{base}-{quant}.gguf"
    if publisher == "ggml-org" and base.endswith(f"-{quant}"):
        # A one-quant repo (gguf-my-repo's naming): its file is the repo's base in lower case,
        # Qwen3-Reranker-0.6B-Q8_0-GGUF/qwen3-reranker-0.6b-q8_0.gguf, in the same qmd file
        # as below (tobi/qmd src/llm.ts).
        return f"{base.lower()}.gguf"
    if publisher == "gpustack":  # upper-case quants after a dash
        # bge-reranker-v2-m3-GGUF/bge-reranker-v2-m3-Q4_K_M.gguf:
        # sinjab/ollama-reranker-test MODEL_SETUP.md; -Q8_0.gguf: a pinned download of
        # .../bge-reranker-v2-m3-GGUF/resolve/3093af03b1a635e67b084b1d8c03c5f5e020fd05/
        return f"{base}-{quant}.gguf"
    if publisher == "ggml-org":  # upper-case quants (Q8_0), lower-case mxfp4
        # embeddinggemma-300M-GGUF/embeddinggemma-300M-Q8_0.gguf and
        # Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf:
        # https://github.com/tobi/qmd/blob/013ef36e33a2d01a7ab240a0b16dabae7ad62676/src/llm.ts
        return f"{base}-{quant.lower() if quant == 'MXFP4' else quant}.gguf"
    if publisher == "Qwen":  # upper-case quants, lower-case f16
        # Qwen3-Embedding-0.6B-Q8_0.gguf, in the same qmd file as ggml-org's above;
        # Qwen3-Embedding-0.6B-f16.gguf:
        # https://github.com/stonefruit/Data2Evidence-coding-agent-tools/blob/0b209f132aee4fa2c6ef15216f9b8107b01ead59/tools/code-rag/docs/llama-cpp-setup.md
        return f"{base}-{quant.lower() if quant == 'F16' else quant}.gguf"
    if publisher == "nomic-ai":  # a dot before the quant; upper-case quants, lower-case f16
        # nomic-embed-text-v1.5.Q8_0.gguf:
        # https://github.com/neozenith/sqlite-muninn/blob/d24e0c7f34edb504b99aaff630cc87e1475e97a2/benchmarks/harness/prep/gguf_models.py
        # nomic-embed-text-v1.5.f16.gguf:
        # https://github.com/miyako/4d-example-local-inference-llamafile/blob/3a1d5acbf4147a8cd7de18ebf815498a1745cdd4/local-inference/Project/Sources/DatabaseMethods/onStartup.4dm
        return f"{base}.{quant.lower() if quant == 'F16' else quant}.gguf"
    if publisher == "leliuga":  # a dot before the quant; upper case throughout, F16 included
        # all-MiniLM-L6-v2.Q8_0.gguf, in the same sqlite-muninn file as nomic-ai's above;
        # all-MiniLM-L6-v2.F16.gguf:
        # https://github.com/mozilla-ai/byota/blob/04bce87331a841367abddfe679273ec8200e7619/Dockerfile
        return f"{base}.{quant}.gguf"
    raise AssertionError(f"{repo}: unknown publisher {publisher!r}: add its naming pattern"
                         " here, with a public source that shows it")


VARIANTS = [(spec, v) for spec in load_catalog().models.values() for v in spec.variants
            if v.source is None]  # the starter comes from PyPI, not a repo


@pytest.mark.parametrize("spec, variant", VARIANTS,
                         ids=[spec.variant_name(v) for spec, v in VARIANTS])
def test_every_file_follows_its_publishers_naming(spec, variant):
    repo = variant.repo or spec.repo
    assert variant.file == expected_file(repo, variant.quant), repo


def test_an_unknown_publisher_or_pattern_fails():
    with pytest.raises(AssertionError, match="unknown publisher"):
        expected_file("someone/Model-GGUF", "Q4_K_M")
    with pytest.raises(AssertionError, match="unknown naming pattern"):
        expected_file("bartowski/Model", "Q4_K_M")


def test_models_toml_marks_the_repos_no_public_source_showed():
    marked = set(re.findall(r'^repo = "([^"]+)"\n# name: pattern only',
                            catalog_path().read_text(), re.MULTILINE))
    repos = {v.repo or s.repo for s, v in VARIANTS}
    assert marked == repos - CHECKED_REPOS
