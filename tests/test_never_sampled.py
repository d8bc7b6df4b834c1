"""Which tokens a text-only runtime never samples, on made-up vocabularies with llama.cpp's
token attributes (runtime/llama/vocab.py's never_sampled_tokens), and on a harmony vocabulary as
llama.cpp reads it."""

from __future__ import annotations

import ctypes

import numpy as np

import ggufgen
from localinfer.runtime.llama import HARMONY_TOKENS, L, harmony_tokens, never_sampled_tokens

NORMAL = L.LLAMA_TOKEN_ATTR_NORMAL
CONTROL = L.LLAMA_TOKEN_ATTR_CONTROL
UNUSED = L.LLAMA_TOKEN_ATTR_UNUSED
UNKNOWN = L.LLAMA_TOKEN_ATTR_UNKNOWN
USER = L.LLAMA_TOKEN_ATTR_USER_DEFINED
BYTE = L.LLAMA_TOKEN_ATTR_BYTE

# (text, attribute, end of generation, never sampled): Gemma 3's, Qwen's and others' kinds.
VOCAB = [
    ("<pad>", CONTROL, False, True),
    ("<eos>", CONTROL, True, False),
    ("<bos>", CONTROL, False, True),
    ("<unk>", UNKNOWN, False, True),
    ("[multimodal]", USER, False, True),
    ("<start_of_turn>", CONTROL, False, True),
    ("<end_of_turn>", CONTROL, True, False),
    ("</s>", CONTROL | USER, True, False),
    ("<unused0>", UNUSED | CONTROL, False, True),
    ("<unused1>", UNUSED, False, True),
    ("<start_of_image>", USER, False, True),
    ("<end_of_image>", USER, False, True),
    ("<image_soft_token>", CONTROL, False, True),
    ("<|vision_start|>", CONTROL, False, True),
    ("<|AUDIO|>", USER, False, True),
    ("<|video_pad|>", CONTROL, False, True),
    ("<img>", USER, False, False),  # HTML, not an image placeholder
    ("<table>", USER, False, False),
    ("\n\n", USER, False, False),
    ("<think>", USER, False, False),  # Qwen's reasoning and tool-call markers: parsed
    ("</think>", USER, False, False),
    ("<tool_call>", USER, False, False),
    ("[TOOL_CALLS]", CONTROL, False, False),  # Mistral's, Llama's, Phi-4's
    ("<|python_tag|>", CONTROL, False, False),
    ("<|tool_call|>", CONTROL, False, False),
    ("<|im_start|>", CONTROL, False, True),
    ("<|im_end|>", CONTROL, True, False),
    ("<|channel|>", USER, False, False),  # gpt-oss's, made user-defined by llama.cpp
    ("<0x0A>", BYTE, False, False),
    ("hello", NORMAL, False, False),
    ("image", NORMAL, False, False),
]


def test_placeholders_unused_and_control_tokens_are_never_sampled():
    attrs = np.array([attr for _, attr, _, _ in VOCAB], dtype=np.int32)
    asked: list[int] = []

    def text(token: int) -> str:
        asked.append(token)
        return VOCAB[token][0]

    banned = never_sampled_tokens(attrs, is_eog=lambda token: VOCAB[token][2], text=text)
    assert banned.dtype == np.intp
    assert [VOCAB[t][0] for t in banned] == [t for t, _, _, never in VOCAB if never]
    # Text is read only where the attributes leave a doubt: not for the bulk of a vocabulary.
    assert "<start_of_image>" in {VOCAB[t][0] for t in asked}
    assert {VOCAB[t][0] for t in asked}.isdisjoint({
        "hello", "image", "<0x0A>", "<unused0>", "<unused1>", "<unk>", "<eos>",
        "<end_of_turn>", "</s>", "<|im_end|>"})


def test_a_vocabulary_of_plain_text_bans_nothing():
    attrs = np.full(1000, NORMAL, dtype=np.int32)
    banned = never_sampled_tokens(attrs, is_eog=lambda token: False,
                                  text=lambda token: "never asked")
    assert banned.size == 0
    assert np.zeros(1000)[banned].size == 0  # an index array all the same


# gpt-oss's markers as its GGUF declares them (control tokens; <|return|> and <|call|> end the
# generation), among others of its vocabulary.
HARMONY_VOCAB = [("<|startoftext|>", CONTROL, False), ("<|start|>", CONTROL, False),
                 ("<|channel|>", CONTROL, False), ("<|message|>", CONTROL, False),
                 ("<|constrain|>", CONTROL, False), ("<|end|>", CONTROL, False),
                 ("<|return|>", CONTROL, True), ("<|call|>", CONTROL, True),
                 ("<|reserved_200013|>", CONTROL, False), ("hello", NORMAL, False)]


def _banned(vocab):
    attrs = np.array([attr for _, attr, _ in vocab], dtype=np.int32)
    banned = never_sampled_tokens(attrs, is_eog=lambda token: vocab[token][2],
                                  text=lambda token: vocab[token][0])
    return {vocab[t][0] for t in banned}, harmony_tokens(
        attrs, is_eog=lambda token: vocab[token][2], text=lambda token: vocab[token][0])


def test_a_harmony_vocabulary_keeps_its_markers():
    banned, markers = _banned(HARMONY_VOCAB)
    assert banned == {"<|startoftext|>", "<|reserved_200013|>"}
    # printed as text; <|return|> and <|call|> end the generation, as any such token does
    assert [HARMONY_VOCAB[t][0] for t in markers] == list(HARMONY_TOKENS[:5])


def test_other_vocabularies_ban_the_same_control_tokens():
    # Without <|channel|> and <|message|> the vocabulary is not harmony: its control tokens
    # named alike (Phi-3's <|end|> ends the generation, so it stays) mean nothing as text.
    vocab = [entry for entry in HARMONY_VOCAB if entry[0] not in ("<|channel|>", "<|message|>")]
    banned, markers = _banned(vocab)
    assert banned == {"<|startoftext|>", "<|start|>", "<|constrain|>", "<|end|>",
                      "<|reserved_200013|>"}
    assert markers == []


def test_llama_cpp_reads_a_harmony_vocabulary_as_the_format_needs(tmp_path):
    """A vocabulary-only GGUF with gpt-oss's markers, as its file declares them (control),
    through llama.cpp: every marker but <|return|> and <|call|> stays sampled (and is printed:
    token_bytes asks with special=True), and those two end the generation, <|end|> not."""
    names = ["Ċ", "Hello", *HARMONY_TOKENS, "<|endoftext|>", "<|reserved_200013|>"]
    kvs = [ggufgen.kv("general.architecture", ggufgen.STRING, "llama"),
           *(ggufgen.kv(f"llama.{key}", ggufgen.U32, n) for key, n in [
               ("block_count", 1), ("embedding_length", 8), ("feed_forward_length", 16),
               ("attention.head_count", 2), ("context_length", 64)]),
           ggufgen.kv("tokenizer.ggml.model", ggufgen.STRING, "gpt2"),
           ggufgen.kv("tokenizer.ggml.pre", ggufgen.STRING, "gpt-4o"),
           ggufgen.kv("tokenizer.ggml.tokens", ggufgen.ARRAY, (ggufgen.STRING, names)),
           ggufgen.kv("tokenizer.ggml.token_type", ggufgen.ARRAY,
                      (ggufgen.I32, [1, 1] + [3] * (len(names) - 2))),  # normal, control
           ggufgen.kv("tokenizer.ggml.merges", ggufgen.ARRAY, (ggufgen.STRING, []))]
    path = tmp_path / "harmony-vocab.gguf"
    path.write_bytes(ggufgen.gguf(kvs, []))
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(path).encode(), params)
    assert model
    try:
        vocab = L.llama_model_get_vocab(model)
        attrs = np.array([L.llama_vocab_get_attr(vocab, t) for t in range(len(names))],
                         dtype=np.int32)

        def is_eog(token: int) -> bool:
            return bool(L.llama_vocab_is_eog(vocab, token))

        def text(token: int) -> str:
            return L.llama_vocab_get_text(vocab, token).decode()

        assert [names[t] for t in range(len(names)) if is_eog(t)] == [
            "<|return|>", "<|call|>", "<|endoftext|>"]
        banned = never_sampled_tokens(attrs, is_eog=is_eog, text=text)
        assert [names[t] for t in banned] == ["<|reserved_200013|>"]
        markers = harmony_tokens(attrs, is_eog=is_eog, text=text)
        assert [names[t] for t in markers] == list(HARMONY_TOKENS[:5])
        buf = ctypes.create_string_buffer(32)
        for token in markers:
            n = L.llama_token_to_piece(vocab, token, buf, 32, 0, True)
            assert buf.raw[:n].decode() == names[token]
    finally:
        L.llama_model_free(model)
