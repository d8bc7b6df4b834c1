"""The engine on the real starter model (Gemma 3 270M Q4_K_M through llama.cpp), loaded once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import localinfer.runtime.engine as engine_module
from localinfer.bench.engine_bench import first_divergence
from localinfer.errors import ContextOverflow, InvalidModelFile, InvalidRequest
from localinfer.loading import load_engine
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.engine import CHECKPOINT_MIN_TOKENS, REREAD_TAIL
from localinfer.runtime.types import Message, Priority, SamplingParams, Token

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0, max_tokens=24)
PROMPT = "The three primary colors are"


def test_model_info(real_engine):
    info = real_engine.info
    assert info.architecture == "gemma3" and info.quant == "Q4_K_M"
    assert info.n_layers == 18 and info.n_ctx == 2048 and info.n_slots == 2
    assert info.n_vocab == 262144
    assert info.bos_text == "<bos>"
    # The file has no chat template; the gemma family's one from models.toml is used.
    assert "<start_of_turn>" in info.chat_template


def test_greedy_output_is_deterministic(real_engine):
    runs = [real_engine.complete(PROMPT, GREEDY).result() for _ in range(3)]
    assert runs[0].text == runs[1].text == runs[2].text
    assert len(runs[0].text.split()) >= 5
    assert runs[0].usage.completion_tokens == 24 and runs[0].finish_reason == "length"
    # With both slots holding this prompt plus a reply, the third run takes one of them; all
    # of its prompt but the last REREAD_TAIL tokens (here: all of it) can come from the cache.
    assert runs[2].usage.cached_tokens == max(0, runs[2].usage.prompt_tokens - REREAD_TAIL)


def test_streamed_tokens_add_up_to_the_text(real_engine):
    gen = real_engine.complete(PROMPT, GREEDY)
    pieces = [e.text for e in gen if isinstance(e, Token)]
    assert "".join(pieces) == gen.done.text
    assert len(pieces) >= 10


def test_seeded_sampling_is_reproducible(real_engine):
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=16)
    a = real_engine.complete("Once upon a time", params).result().text
    b = real_engine.complete("Once upon a time", params).result().text
    assert a == b


def test_stop_string_stops(real_engine):
    full = real_engine.complete(PROMPT, GREEDY).result().text
    word = full.split()[2]
    stopped = real_engine.complete(PROMPT, SamplingParams(temperature=0, max_tokens=24,
                                                         stop=(word,))).result()
    assert stopped.finish_reason == "stop"
    assert word not in stopped.text
    assert full.startswith(stopped.text)
    assert stopped.usage.completion_tokens < 24


def test_cancel_from_another_thread_stops_within_one_token(real_engine):
    gen = real_engine.complete(PROMPT, SamplingParams(temperature=0, max_tokens=500))
    n_at_cancel = []
    for event in gen:
        if isinstance(event, Token) and event.live.n_tokens >= 5 and not n_at_cancel:
            n_at_cancel.append(event.live.n_tokens)
            threading.Thread(target=gen.cancel).start()
    assert gen.done.finish_reason == "cancelled"
    assert gen.done.usage.completion_tokens <= n_at_cancel[0] + 2


def test_timings_are_positive_and_consistent(real_engine):
    done = real_engine.complete("A long time ago, " * 20, SamplingParams(
        temperature=0, max_tokens=32)).result()
    t = done.timings
    assert t.prompt_tokens == done.usage.prompt_tokens > 100
    assert t.prefill_ms > 0 and t.ttft_ms >= t.prefill_ms
    assert t.decode_ms > 0 and t.total_ms >= t.ttft_ms + t.decode_ms * 0.99
    assert t.completion_tokens == 32 and t.decode_tokens == 31
    assert t.decode_tps == pytest.approx(t.decode_tokens / (t.decode_ms / 1000))
    assert t.prefill_tps == pytest.approx(t.prefill_tokens / (t.prefill_ms / 1000))


def test_chat_turns_reuse_the_cache(real_engine):
    history = [Message("user", "Name a fruit that is red.")]
    first = real_engine.chat(history, GREEDY).result()
    history += [Message("assistant", first.text), Message("user", "And one that is yellow?")]
    second = real_engine.chat(history, GREEDY).result()
    assert second.usage.cached_tokens >= first.usage.prompt_tokens - 1
    assert second.usage.completion_tokens > 0


def test_an_idle_engine_reads_the_next_turn_opening_ahead(real_engine, monkeypatch):
    """llama.cpp reads the opening of the next user turn without logits while the engine is
    idle, and the next turn finds it cached: the reply's last token (max_tokens cut it, so
    it was not decoded yet) and Gemma's <end_of_turn>, newline, <start_of_turn>, user,
    newline."""
    import time

    import localinfer.runtime.engine as engine_module

    real_engine.clear_cache()  # and any read-ahead still due after the tests before
    monkeypatch.setattr(engine_module, "READ_AHEAD_IDLE_S", 0.0)
    before = real_engine.stats().read_ahead_tokens_total
    history = [Message("user", "Name a fruit that is green.")]
    first = real_engine.chat(history, SamplingParams(temperature=0, max_tokens=1)).result()
    deadline = time.monotonic() + 10
    while real_engine.stats().read_ahead_tokens_total == before and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    assert real_engine.stats().read_ahead_tokens_total - before == 1 + 5
    history += [Message("assistant", first.text), Message("user", "And one that is purple?")]
    second = real_engine.chat(history, GREEDY).result()
    assert second.usage.cached_tokens == first.usage.prompt_tokens + 1 + 5
    assert second.usage.completion_tokens > 0


def test_concurrent_requests_both_complete(real_engine):
    gens = [real_engine.complete(p, GREEDY) for p in (PROMPT, "The largest planet is")]
    done = [g.result() for g in gens]
    assert all(d.usage.completion_tokens == 24 for d in done)
    assert done[0].text != done[1].text


def test_prompt_longer_than_the_context(real_engine):
    with pytest.raises(ContextOverflow, match="2048 tokens"):
        real_engine.complete("word " * 3000, GREEDY)


def test_invalid_params(real_engine):
    with pytest.raises(InvalidRequest):
        real_engine.complete(PROMPT, SamplingParams(max_tokens=-1))


def test_load_refuses_a_context_beyond_training(starter_path):
    with pytest.raises(InvalidRequest, match="32768"):
        load_engine(starter_path, LoadOptions(n_ctx=100_000), name="gemma3:270m")


def test_load_refuses_a_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"<html>404</html>" * 10)
    with pytest.raises(InvalidModelFile, match="not a GGUF"):
        load_engine(path, LoadOptions(), name="bad")


def test_flash_attention_is_off_on_the_cpu_unless_asked_or_needed():
    from localinfer.runtime.llama import flash_attn_type

    assert flash_attn_type(LoadOptions(), on_gpu=False) == 0
    assert flash_attn_type(LoadOptions(), on_gpu=True) == -1  # llama.cpp decides
    assert flash_attn_type(LoadOptions(flash_attn=True), on_gpu=False) == 1
    assert flash_attn_type(LoadOptions(flash_attn=False), on_gpu=True) == 0
    assert flash_attn_type(LoadOptions(kv_type="q8_0"), on_gpu=False) == 1
    with pytest.raises(InvalidRequest, match="needs flash attention"):
        flash_attn_type(LoadOptions(kv_type="q8_0", flash_attn=False), on_gpu=False)


def test_a_cpu_only_build_reads_the_starter_in_256_row_batches(real_engine):
    """planner.shrinks_window_cache: the starter's window layers weigh (7.9% of a token's
    arithmetic for 256 cells), so on the CPU it gets 256-row batches, its window layers hold
    512 + 256 cells instead of 512 + 512, and chats keep checkpoints for the shorter reach."""
    from localinfer.runtime.llama import devices

    if any(d.kind in ("gpu", "igpu") for d in devices()):
        pytest.skip("a GPU build keeps 512-row batches")
    assert real_engine.backend.cut_reach == 256


def test_a_prompt_asked_again_after_a_long_reply_keeps_its_cache(real_engine):
    """A reply longer than the window cache's reach (256 tokens) moves the window past where
    it began; the checkpoint taken there, in the prompt's reading, brings it back (without it:
    927-981 ms to read a 616-token chat again, against 40-41)."""
    prompt = ", ".join(str(i) for i in range(1, 151)) + ","  # longer than the reach
    params = SamplingParams(temperature=0, max_tokens=320)
    real_engine.clear_cache()
    tokens = real_engine.backend.tokenize(prompt, add_special=True)
    assert len(tokens) > 256 + REREAD_TAIL
    first = real_engine.submit(tokens, params)
    first.result()
    assert first.done is not None and first.done.usage.completion_tokens == 320
    again = real_engine.submit(first.request.prompt, params)
    again.result()
    assert again.done is not None
    assert again.done.usage.cached_tokens == len(first.request.prompt) - REREAD_TAIL
    divergence = first_divergence(real_engine, first, again)
    assert divergence is None or divergence.near_tie, divergence


def test_checkpoints_saved_into_reused_memory_bring_a_chat_back(real_engine, monkeypatch):
    """A chat of long messages takes two checkpoints a turn, each into the memory of the one
    it replaces (a buffer larger than the state, at times): a regenerated reply and an edited
    last message still come back from them."""
    if not real_engine.backend.cut_reach:
        pytest.skip("no chat checkpoints here (a GPU build keeps 512-row batches)")
    backend = real_engine.backend
    reused: list[bool] = []
    save = backend.seq_checkpoint

    def watched(seq_id, reuse=None):
        state = save(seq_id, reuse)
        reused.append(reuse is not None and state.buffer is reuse.buffer)
        return state

    monkeypatch.setattr(backend, "seq_checkpoint", watched)
    # Read-ahead (which takes the next turn's checkpoint while idle) only if asked.
    monkeypatch.setattr(engine_module, "READ_AHEAD_IDLE_S", 60.0)
    params = SamplingParams(temperature=0, max_tokens=24)
    real_engine.clear_cache()
    history: list[Message] = []
    for turn in range(3):
        numbers = ", ".join(str(i) for i in range(100 * turn + 100, 100 * turn + 170))
        history.append(Message("user", f"Continue: {numbers},"))
        history.append(Message("assistant", real_engine.chat(history, params).result().text))
    begins = len(real_engine.chat_tokens(history[:-2], add_generation_prompt=False))
    assert reused.count(True) >= 3, reused
    last = history[:-1]
    again = real_engine.chat(last, params).result()
    assert again.usage.cached_tokens == len(real_engine.chat_tokens(last)) - REREAD_TAIL
    assert again.text == history[-1].content
    edited = real_engine.chat([*history[:-2], Message("user", "Continue: 7, 8,")], params)
    assert begins - 8 <= edited.result().usage.cached_tokens <= begins


@pytest.fixture(scope="module", params=["f16", "q8_0"])
def kv_engine(request, real_engine, starter_path):
    """The two CPU set-ups in which attention computes speculative and batched steps like
    single-token steps: the default (F16 KV cache, flash attention off; with it on, llama.cpp
    would split the attention of a long single-token step differently) and a q8_0 KV cache
    (flash attention on, one kernel for any number of rows). The matrix products of a few
    rows still round differently from a single row's on some CPUs (AVX2-only ones), so a
    greedy text may part from the plain one where two tokens nearly tie
    (``first_divergence``)."""
    if request.param == "f16":
        assert real_engine.info.flash_attn is False
        yield real_engine
        return
    engine = load_engine(starter_path, LoadOptions(n_ctx=2048, n_slots=2, kv_type="q8_0"),
                         name="gemma3:270m", family="gemma3")
    assert engine.info.flash_attn is True
    yield engine
    engine.close()


def test_a_q4_0_v_cache_beside_a_q8_0_k_cache_loads_and_generates(starter_path):
    # K and V of their own types, as llama-server's -ctk q8_0 -ctv q4_0: llama.cpp quantizes V
    # only with flash attention, which the load then turns on.
    engine = load_engine(starter_path, LoadOptions(n_ctx=1024, n_slots=1,
                                                   kv_type="q8_0,q4_0"),
                         name="gemma3:270m", family="gemma3")
    try:
        assert (engine.info.kv_type, engine.info.flash_attn) == ("q8_0,q4_0", True)
        done = engine.complete("The capital of France is",
                               SamplingParams(temperature=0, max_tokens=8)).result()
        assert done.usage.completion_tokens > 0 and done.text.strip()
    finally:
        engine.close()
    with pytest.raises(InvalidRequest, match="needs flash attention"):
        load_engine(starter_path, LoadOptions(n_ctx=1024, kv_type="f16,q4_0",
                                              flash_attn=False), name="gemma3:270m")


def test_speculation_gives_the_same_greedy_text(kv_engine):
    from localinfer.bench.engine_bench import CODE_EDIT_PROMPT

    params = {"temperature": 0, "max_tokens": 600, "stop": ("```",)}
    # Both read the prompt cold (once a slot has passed the sliding window, a cached prompt
    # is summed in another order: see engine.REREAD_TAIL).
    kv_engine.clear_cache()
    plain_run = kv_engine.complete(CODE_EDIT_PROMPT, SamplingParams(**params, speculative=False))
    plain = plain_run.result()
    kv_engine.clear_cache()
    fast_run = kv_engine.complete(CODE_EDIT_PROMPT, SamplingParams(**params, speculative=True))
    fast = fast_run.result()
    divergence = first_divergence(kv_engine, plain_run, fast_run)
    assert divergence is None or divergence.near_tie, divergence
    assert plain.timings.drafted_tokens == 0
    assert fast.timings.accepted_tokens > 0.5 * fast.timings.drafted_tokens > 100
    assert "totals_by_customer" in fast.text  # the model really is copying the function


def test_batched_sequences_equal_their_solo_runs(kv_engine):
    # Together, the second prompt is read in other chunks, then each step decodes two rows
    # (the KV cache passes 512 cells): the same arithmetic as alone, rounded differently on
    # some CPUs.
    params = SamplingParams(temperature=0, max_tokens=64, speculative=False)
    texts = ["A long time ago, in a kingdom by the sea, " * 30, "Once upon a time, a fox " * 40]
    prompts = [kv_engine.backend.tokenize(t, add_special=True)[:400] for t in texts]
    solo = []
    for prompt in prompts:
        kv_engine.clear_cache()
        solo.append(kv_engine.submit(prompt, params))
        solo[-1].result()
    kv_engine.clear_cache()
    together = [kv_engine.submit(p, params) for p in prompts]
    for batched in together:
        batched.result()
    for alone, batched in zip(solo, together, strict=True):
        divergence = first_divergence(kv_engine, alone, batched)
        assert divergence is None or divergence.near_tie, divergence


def test_greedy_argmax_picks_what_llama_cpps_greedy_sampler_picks(real_engine, monkeypatch):
    # Plain greedy reads the argmax of the logits directly (runtime.llama: LlamaBackend.sample);
    # it must choose the tokens llama.cpp's own greedy sampler chooses.
    params = SamplingParams(temperature=0, max_tokens=48, speculative=False)
    real_engine.clear_cache()
    fast = real_engine.complete(PROMPT, params).result()

    class NeverArgmax(set):
        def add(self, item):
            pass

    monkeypatch.setattr(real_engine.backend, "_argmax_chains", NeverArgmax())
    real_engine.clear_cache()
    native = real_engine.complete(PROMPT, params).result()
    assert fast.text == native.text and fast.usage.completion_tokens == 48


@pytest.mark.parametrize("paragraphs, topic", [(1, "a lighthouse keeper"), (3, "tea")])
def test_a_cached_prompt_gives_the_same_greedy_text_as_a_cold_one(real_engine, paragraphs,
                                                                   topic):
    # Two prompts whose reply changed when only their last token was read again (llama.cpp
    # rounds a 1-row batch differently from the many-row batch of a cold read). Re-reading
    # REREAD_TAIL tokens gives the cold reply on AVX2-only CPUs; on AVX-512 ones the 8 rows
    # still round differently from the cold read, and the replies part at a near tie.
    from localinfer.bench.engine_bench import _PARAGRAPH

    prompt = f"{_PARAGRAPH * paragraphs} In short, {topic}"
    params = SamplingParams(temperature=0, max_tokens=48, speculative=False)
    real_engine.clear_cache()
    cold_run = real_engine.complete(prompt, params)
    cold = cold_run.result()
    cached_run = real_engine.complete(prompt, params)
    cached = cached_run.result()
    assert cold.usage.cached_tokens == 0 and cached.usage.cached_tokens > 0
    divergence = first_divergence(real_engine, cold_run, cached_run)
    assert divergence is None or divergence.near_tie, divergence


def test_a_cache_moved_to_another_slot_goes_on_as_it_would_have(real_engine):
    """``seq_swap`` (the engine keeps running sequences in consecutive slots with it): two
    prompts read in slots 0 and 1 and traded go on, each in the other's slot, with the same
    greedy tokens as where they were read."""
    backend = real_engine.backend

    def read(seq: int, tokens: list[int]) -> None:
        backend.decode(tokens, list(range(len(tokens))), [seq] * len(tokens),
                       [False] * len(tokens))

    def go_on(seq: int, tokens: list[int], n: int = 12) -> list[int]:
        """Decode the last token again (for its logits), then n greedy tokens."""
        out = [tokens[-1]]
        assert backend.seq_trim(seq, len(tokens) - 1) == len(tokens) - 1
        for _ in range(n):
            backend.decode([out[-1]], [len(tokens) + len(out) - 2], [seq], [True])
            out.append(int(np.argmax(backend.raw_logits(0))))
        return out[1:]

    def run() -> tuple[list[list[int]], list[list[int]]]:
        prompts = [backend.tokenize(text, add_special=True) for text in (
            "The capital of France is Paris. The capital of Italy is", "One, two, three,")]
        plain = []
        for prompt in prompts:
            backend.seq_trim(0, 0)
            read(0, prompt)
            plain.append(go_on(0, prompt))
        for seq, prompt in enumerate(prompts):
            backend.seq_trim(seq, 0)
            read(seq, prompt)
        assert backend.seq_swap(0, 1)
        moved = [go_on(1, prompts[0]), go_on(0, prompts[1])]
        for seq in (0, 1):
            backend.seq_trim(seq, 0)
        return plain, moved

    real_engine.clear_cache()
    plain, moved = real_engine.run_on_worker(run)
    assert moved == plain


def test_another_completion_copies_the_prompt_and_goes_on_as_a_cached_read(real_engine):
    """llama-server's n_cmpl: a second completion of a prompt copies the first's cache once
    that has read the prompt (through host memory: llama.cpp's whole-sequence state, sliding
    window included) and samples its first token from the first's logits, reading nothing;
    greedy, it writes what the first writes, and what a prompt cached in its own slot
    writes."""
    from localinfer.bench.engine_bench import _PARAGRAPH

    prompt = real_engine.completion_tokens(f"{_PARAGRAPH * 8} In short, the harbour")
    params = SamplingParams(temperature=0, max_tokens=32, speculative=False)
    real_engine.clear_cache()
    first = real_engine.submit(prompt, params)
    second = real_engine.submit(prompt, params, follows=first)
    done = [first.result(), second.result()]
    assert len(prompt) > 512 and done[0].usage.cached_tokens == 0
    assert done[1].usage.cached_tokens == len(prompt)
    again = real_engine.submit(prompt, params).result()  # cached in its own slot
    assert again.usage.cached_tokens == len(prompt) - REREAD_TAIL
    assert done[1].text == done[0].text == again.text


def test_completions_that_write_otherwise_part_and_decode_on_their_own(real_engine):
    """Sampled completions of one prompt ride on the first's rows while they agree; one that
    samples another token copies the cache they shared (llama.cpp's whole-sequence state,
    through host memory) and decodes on in its own sequence, at the positions that follow."""
    from localinfer.bench.engine_bench import _PARAGRAPH

    prompt = real_engine.completion_tokens(f"{_PARAGRAPH} Three ideas for the harbour:")
    params = {"temperature": 1.0, "top_k": 40, "max_tokens": 24, "speculative": False}
    real_engine.clear_cache()
    first = real_engine.submit(prompt, SamplingParams(seed=1, **params))
    others = [real_engine.submit(prompt, SamplingParams(seed=seed, **params), follows=first)
              for seed in (2, 3)]
    done = [g.result() for g in (first, *others)]
    assert [d.finish_reason for d in done] == ["length"] * 3
    assert [d.usage.completion_tokens for d in done] == [24] * 3
    assert len({d.text for d in done}) > 1  # they parted (seeds 1-3 do, at temperature 1)


@pytest.mark.parametrize("sharing", ["a system prompt", "the BOS alone"])
def test_a_sliding_window_moved_past_the_shared_prefix_is_read_again(starter_path, sharing):
    """A slot whose sliding-window layers have moved on past where a new prompt parts from
    its cache cannot keep that prefix, not even its BOS: those layers would attend over
    nothing before it. The prompt is read cold instead, with the cold reply (llama.cpp
    reports the emptied window as position -1, which once passed for a window that holds
    everything, and a kept BOS was never checked) - unless the prefix is long enough for a
    checkpoint (CHECKPOINT_MIN_TOKENS), taken before the long prompt moved the window on,
    which then brings the window back."""
    from localinfer.bench.engine_bench import _PARAGRAPH

    # One slot and 64-token batches: a sliding-window cache of 768 cells, which the long
    # prompt below moves wholly past what it shares with the short one (~80 tokens, or 1).
    engine = load_engine(starter_path, LoadOptions(n_ctx=1024, n_slots=1, n_batch=64),
                         name="gemma3:270m", family="gemma3")
    try:
        shared = "You are a careful assistant. " + _PARAGRAPH if sharing == "a system prompt" \
            else ""
        short = engine.backend.tokenize(
            shared + "Question: what did the committee agree to do? " + _PARAGRAPH,
            add_special=True)
        params = SamplingParams(temperature=0, max_tokens=24, speculative=False)
        cold = engine.submit(short, params)
        cold.result()
        long = engine.complete(shared + "Notes. " + _PARAGRAPH * 11,
                               SamplingParams(max_tokens=1)).result()
        n_shared = len(engine.tokenize(shared)) + 1  # and the BOS
        assert long.usage.prompt_tokens > 768 + n_shared
        again = engine.submit(short, params)
        again.result()
        assert again.done is not None
        if n_shared >= CHECKPOINT_MIN_TOKENS:
            assert again.done.usage.cached_tokens >= n_shared - 2  # where the prompts part
            divergence = first_divergence(engine, cold, again)
            assert divergence is None or divergence.near_tie, divergence
        else:
            assert again.done.usage.cached_tokens == 0
            assert cold.done is not None and again.done.text == cold.done.text
    finally:
        engine.close()


def test_a_long_prompt_chunk_yields_to_an_urgent_request_and_reads_on(real_engine):
    """llama.cpp stops the decode in flight (its abort callback) when an interactive request
    comes during a background prompt's chunk; the background prompt goes on from the
    micro-batches it finished and answers as a cold read does (up to a near-tie)."""
    from localinfer.bench.engine_bench import _PARAGRAPH

    params = SamplingParams(temperature=0, max_tokens=12, speculative=False)
    prompt = "Summarise: " + _PARAGRAPH * 14  # about 1,300 tokens: three 512-token chunks
    real_engine.clear_cache()
    cold = real_engine.complete(prompt, params)
    cold.result()
    real_engine.clear_cache()
    before = real_engine.stats().interrupted_steps_total
    background = real_engine.complete(prompt, params, priority=Priority.BACKGROUND)
    deadline = time.monotonic() + 60
    while real_engine._in_step_prompt_rows < 64:  # its first chunk is being read
        assert time.monotonic() < deadline and background.done is None
        time.sleep(0.001)
    urgent = real_engine.complete("Hi", SamplingParams(temperature=0, max_tokens=2),
                                  priority=Priority.INTERACTIVE)
    assert urgent.result().finish_reason == "length"
    assert background.done is None  # the urgent request did not wait for the long prompt
    done = background.result()
    assert real_engine.stats().interrupted_steps_total > before
    assert done.usage.prompt_tokens == cold.result().usage.prompt_tokens
    divergence = first_divergence(real_engine, cold, background)
    assert divergence is None or divergence.near_tie, divergence


def test_a_spent_reasoning_budget_closes_the_block(real_engine):
    """llama.cpp's sampler takes the forced end of the reasoning as sampled: after the
    budget's tokens the close is written (each of its tokens, in order), then the model
    goes on; under a grammar that lets the reply reason first, the grammar follows the forced
    tokens and the answer after them is its JSON."""
    import dataclasses

    from localinfer.runtime.grammar import json_grammar
    from localinfer.runtime.types import ReasoningBudget

    close = "\n</think>\n\n"
    budget = ReasoningBudget(6, "<think>", close, "</think>", opened=True)
    prompt = real_engine.chat_tokens([Message("user", "What is 2+2? Think first.")]) + \
        real_engine.tokenize("<think>\n")
    n_close = len(real_engine.tokenize(close))
    params = SamplingParams(temperature=0, max_tokens=40, logprobs=0, reasoning_budget=budget)
    done = real_engine.submit(prompt, params).result()
    texts = [entry.text for entry in done.logprobs]
    assert "".join(texts[6:6 + n_close]) == close and "</think>" not in "".join(texts[:6])
    assert done.text.startswith("".join(texts[:6]) + close)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"]}
    grammar = dataclasses.replace(json_grammar(schema), reasoning=("", "</think>"))
    constrained = real_engine.submit(prompt, dataclasses.replace(
        params, grammar=grammar, logprobs=None)).result()
    thought, closed, answer = constrained.text.partition("</think>")
    assert closed and len(real_engine.tokenize(thought)) <= 8
    # The grammar went on from the forced close: what follows is its JSON (the 270M model
    # lingers on the whitespace the grammar allows before it).
    assert not answer.strip() or answer.lstrip().startswith("{"), repr(answer)


def test_a_context_llama_cpp_rounds_up_reads_a_prompt_longer_than_its_batch(starter_path):
    # Asked for 320 tokens, llama.cpp makes a context of 512 but a batch of 320: a prompt of
    # 400 tokens must be read in batches of 320, or llama.cpp aborts the whole process
    # (GGML_ASSERT n_tokens_all <= n_batch). Run in a child: the abort would take pytest.
    import subprocess
    import sys

    code = (
        "from localinfer.loading import load_engine\n"
        "from localinfer.runtime.backend import LoadOptions\n"
        "from localinfer.runtime.types import SamplingParams\n"
        f"e = load_engine({str(starter_path)!r}, LoadOptions(n_ctx=320, n_slots=1),\n"
        "                name='gemma3:270m', family='gemma3')\n"
        "d = e.complete('word ' * 400, SamplingParams(temperature=0, max_tokens=2)).result()\n"
        "print(e.info.n_ctx, e.backend.n_batch, d.usage.prompt_tokens, d.finish_reason)\n"
        "e.close()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    n_ctx, n_batch, n_prompt, reason = run.stdout.split()
    assert (n_ctx, n_batch, reason) == ("512", "320", "length") and int(n_prompt) > 320


def test_a_prompt_no_context_could_hold_is_refused_before_it_is_tokenized(real_engine):
    # The bound is the vocabulary's longest token (its text: never shorter than what it
    # spells); a 1 MB prompt was tokenized for ~27 s to be told it is too long.
    longest = real_engine.backend.max_token_bytes()
    assert 8 <= longest <= 256
    # Past what any context holds (trained for 32768, at most 48 bytes a token): a context
    # loaded smaller is no bound, a daemon grows it for a long prompt.
    text = "def f(x):\n    return x\n" * 80_000
    with pytest.raises(ContextOverflow, match="the prompt is at least"):
        real_engine.completion_tokens(text)
    assert len(real_engine.embedding_tokens(text, truncate=True)) == real_engine.backend.n_ctx_embed
