"""Autocomplete keeps its KV cache from keystroke to keystroke: the editor's previous slot,
and on a sliding-window cache (Gemma 3's), a checkpoint where the next prompt will differ."""

from __future__ import annotations

import time

import pytest

from localinfer.errors import InvalidRequest
from localinfer.runtime.fim import FIM_BATCH, FIM_TEXT_CHARS
from localinfer.runtime.types import Priority, SamplingParams

PREFIX = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(8))
SUFFIX = "".join(f"\ndef g{i}(y):\n    return y * {i}\n" for i in range(8))
TYPED = ["r", "r e", "r e s", "r e s u", "r e s u l"]


def keystrokes(engine, key="editor-1", typed=TYPED, suffix=SUFFIX):
    """One FIM request per keystroke, each to its end; the Done of each."""
    params = SamplingParams(max_tokens=3, temperature=0, supersede=key)
    return [engine.submit(engine.infill_tokens(PREFIX, suffix, prompt=t and "    " + t), params,
                          priority=Priority.INTERACTIVE).result() for t in typed]


def prefix_tokens(engine):
    """The prompt's tokens up to the text typed at the cursor (BOS, FIM prefix token,
    prefix): what every keystroke's prompt shares."""
    return len(engine.infill_tokens(PREFIX, "")) - 2  # less the suffix and middle tokens


def until_in_step(engine, requests=None) -> bool:
    """Wait (30 s at most) until a step is in flight, one of ``requests`` alone where given;
    whether it came."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with engine._cv:
            if engine._in_step if requests is None else engine._in_step == requests:
                return True
        time.sleep(0.005)
    return False


def test_a_sliding_window_cache_keeps_the_prefix_through_a_checkpoint(fake_engine):
    engine = fake_engine(fim=True, reply="ok", n_slots=2, window=8)
    done = keystrokes(engine)
    shared = prefix_tokens(engine)
    # The first has nothing cached and takes a checkpoint where the text typed at the
    # cursor begins; the window cannot be cut back there past its suffix and reply (longer
    # than the window), so each of the next restores that checkpoint.
    assert done[0].usage.cached_tokens == 0
    assert all(d.usage.cached_tokens == shared for d in done[1:])
    assert engine.backend.restored == [shared] * (len(TYPED) - 1)
    # The fake checks that each restored checkpoint holds the tokens the slot keeps.
    assert all(d.finish_reason == "stop" and d.text == "ok" for d in done)


def test_no_checkpoint_where_the_cache_can_be_cut(fake_engine):
    engine = fake_engine(fim=True, reply="ok", n_slots=2)
    done = keystrokes(engine)
    assert done[0].usage.cached_tokens == 0
    assert all(d.usage.cached_tokens >= prefix_tokens(engine) for d in done[1:])
    assert engine.backend.restored == []


def test_the_next_keystroke_returns_to_its_editors_slot(fake_engine):
    # The shared prefix is less than half of the cached prompt and reply: without the
    # editor's key, an empty slot would win and the prefix would be read again.
    engine = fake_engine(fim=True, reply="ok", n_slots=3)
    suffix = SUFFIX * 2
    keystrokes(engine, "editor-1", TYPED[:1], suffix)
    assert prefix_tokens(engine) * 2 < len(engine.infill_tokens(PREFIX, suffix, prompt="r"))
    second = keystrokes(engine, "editor-1", TYPED[1:2], suffix)[0]
    assert second.usage.cached_tokens >= prefix_tokens(engine)


def test_a_checkpoint_of_another_prompt_is_never_restored(fake_engine):
    engine = fake_engine(fim=True, reply="ok", n_slots=1, window=8)
    keystrokes(engine, typed=TYPED[:2])  # they leave a checkpoint
    other = "".join(f"class C{i}:\n    pass\n\n" for i in range(8))
    engine.submit(engine.infill_tokens(other, SUFFIX), SamplingParams(max_tokens=3),
                  priority=Priority.INTERACTIVE).result()
    restored = len(engine.backend.restored)
    done = keystrokes(engine, typed=TYPED[2:3])[0]
    # The only slot's checkpoint was of the first file's prefix, dropped when the other file
    # took the slot: the next keystroke reads its prompt cold.
    assert done.usage.cached_tokens == 0 and len(engine.backend.restored) == restored


def test_prefix_and_suffix_are_taken_to_fit_one_batch_as_llama_server_takes_them(fake_engine):
    engine = fake_engine(fim=True, n_ctx=8192)
    prefix = "".join(f"p{i} " for i in range(3000))
    suffix = "".join(f"s{i} " for i in range(3000))
    tokens = engine.infill_tokens(prefix, suffix, prompt="x y z")
    backend = engine.backend
    pre, suf, mid = (backend.tokenize(t, add_special=False)[0]
                     for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
    n_typed = len(backend.tokenize("x y z", add_special=False))
    n_prefix = tokens.index(suf) - tokens.index(pre) - 1 - n_typed
    n_suffix = tokens.index(mid) - tokens.index(suf) - 1
    # The prefix keeps its end (next to the cursor), the suffix its start: 3:1 of FIM_BATCH.
    head, tail = backend.detokenize(tokens).split("<fim_suffix>")
    assert head.endswith("p2999 x y z") and tail.startswith("s0 ")
    assert 512 < n_prefix <= 3 * FIM_BATCH // 4 and n_suffix <= FIM_BATCH // 4 - n_typed
    assert n_prefix + n_typed + n_suffix <= FIM_BATCH
    # A short file goes whole.
    short = engine.backend.detokenize(engine.infill_tokens("a b c", "d e f"))
    assert short.endswith("<fim_prefix>a b c<fim_suffix>d e f<fim_middle>")


def test_a_huge_prefix_and_suffix_are_cut_before_they_are_tokenized(fake_engine):
    # A 5 MB prefix was tokenized whole (minutes of CPU, out of reach of a cancel) to keep
    # ~1,000 tokens of it: now its tail and the suffix's head go to the tokenizer.
    engine = fake_engine(fim=True, n_ctx=8192)
    backend = engine.backend
    seen: list[int] = []
    tokenize = backend.tokenize

    def measured(text, **kwargs):
        seen.append(len(text))
        return tokenize(text, **kwargs)

    backend.tokenize = measured
    line = "def f(x):\n    return x\n"
    prefix, suffix = line * 100_000, line * 100_000
    tokens = engine.infill_tokens(prefix, suffix, prompt="y = ")
    assert max(seen) <= FIM_TEXT_CHARS
    head, tail = backend.detokenize(tokens).split("<fim_suffix>")
    assert head.endswith("    return x\ny = ") and tail.startswith("def f(x):")
    # Typing on keeps the same start of the prefix, and with it the cache.
    typed = engine.infill_tokens(prefix + "y = 1\n", suffix, prompt="")
    start = tokens.index(backend.tokenize("<fim_prefix>", add_special=False)[0]) + 1
    assert typed[:start + 64] == tokens[:start + 64]
    # A line typed at the cursor longer than that is refused, not tokenized.
    with pytest.raises(InvalidRequest, match="at most"):
        engine.infill_tokens("a", "b", prompt="x" * (FIM_TEXT_CHARS + 1))


def test_a_superseding_request_takes_the_slot_of_the_one_it_cancels(fake_engine):
    engine = fake_engine(fim=True, reply="tok " * 200, step_delay_s=0.005, n_slots=2)
    params = SamplingParams(max_tokens=200, supersede="editor-1")
    first = engine.submit(engine.infill_tokens(PREFIX, SUFFIX, prompt="    r"), params,
                          priority=Priority.INTERACTIVE)
    next(iter(first))  # running in its slot; the other slot is free and empty
    second = engine.submit(engine.infill_tokens(PREFIX, SUFFIX, prompt="    r e"), params,
                           priority=Priority.INTERACTIVE)
    assert first.result().finish_reason == "cancelled"
    assert second.result().usage.cached_tokens >= prefix_tokens(engine)


def test_the_cursor_is_where_the_typed_text_begins_in_either_order(fake_engine):
    for spm in (False, True):
        engine = fake_engine(fim=True, reply="ok")
        engine.backend.fim_spm = spm
        tokens = engine.infill_tokens(PREFIX, SUFFIX, prompt="    ret")
        typed = engine.backend.tokenize("    ret", add_special=False)
        assert tokens.cursor is not None
        assert tokens[tokens.cursor:tokens.cursor + len(typed)] == typed
        # The next keystroke's prompt is the same up to there.
        after = engine.infill_tokens(PREFIX, SUFFIX, prompt="    retu")
        assert after[:tokens.cursor] == tokens[:tokens.cursor]
        assert engine.infill_tokens(PREFIX, SUFFIX).cursor is None  # nothing typed apart
        # Typed apart and empty (a cursor at the start of a line): where the prefix ends.
        empty = engine.infill_tokens(PREFIX, SUFFIX, prompt="")
        assert empty.cursor is not None and after[:empty.cursor] == empty[:empty.cursor]


def test_a_keystroke_at_a_line_start_keeps_the_prefix_for_the_next(fake_engine):
    """llama.vscode and llama.vim send the text typed on the cursor's line apart: at the
    start of a line it is empty, and the checkpoint still goes where the prefix ends, so the
    first key typed there reads only what follows it."""
    engine = fake_engine(fim=True, reply="ok", n_slots=2, window=8)
    done = keystrokes(engine, typed=["", "r"])
    assert done[0].usage.cached_tokens == 0
    assert done[1].usage.cached_tokens == prefix_tokens(engine)


def test_a_superseded_prompt_read_is_not_interrupted():
    """An editor's next keystroke cancels the request before it (its client leaves too):
    a step reading that request's prompt from before its cursor (its file read cold) runs to
    its end, as the next keystroke's prompt starts with those tokens; a step of its reply is
    stopped."""
    from localinfer.runtime.engine import Engine
    from tui_util import GatedBackend

    backend = GatedBackend(fim=True, reply="ok " * 40, n_slots=1)
    interrupts = []
    backend.interrupt = lambda: interrupts.append(True)  # type: ignore[method-assign]
    engine = Engine(backend)
    params = SamplingParams(max_tokens=40, temperature=0, supersede="editor-1")

    def in_step(request, replying: bool) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with engine._cv:
                if engine._in_step == [request] and bool(request.generated) == replying:
                    return
            if replying:
                backend.release()
            time.sleep(0.005)
        raise AssertionError("the step never came")

    try:
        first = engine.submit(engine.infill_tokens(PREFIX, SUFFIX, prompt="r"), params,
                              priority=Priority.INTERACTIVE)
        in_step(first.request, replying=False)
        first.cancel()  # while its prompt's step is in flight
        assert interrupts == []
        backend.release()
        assert first.result().finish_reason == "cancelled"
        second = engine.submit(engine.infill_tokens(PREFIX, SUFFIX, prompt="re"), params,
                               priority=Priority.INTERACTIVE)
        in_step(second.request, replying=True)
        second.cancel()  # while a step of its reply is in flight
        assert interrupts == [True]
        backend.open()
        assert second.result().finish_reason == "cancelled"
    finally:
        backend.open()
        engine.close()


def test_a_superseded_read_past_the_cursor_is_interrupted():
    """The next keystroke's request cancels one whose step reads only what follows the
    cursor (the text typed there, the suffix): the next keystroke changes all of it, so
    that step stops instead of holding the new request back (~0.3 s for a 258-token read on
    a 2-core CPU); the new one reads from the checkpoint where the typed text begins."""
    from localinfer.runtime.engine import Engine
    from tui_util import GatedBackend

    backend = GatedBackend(fim=True, reply="ok", n_slots=1, window=8)
    interrupts = []
    backend.interrupt = lambda: interrupts.append(True)  # type: ignore[method-assign]
    engine = Engine(backend)
    params = SamplingParams(max_tokens=3, temperature=0, supersede="editor-1")

    def submit(typed):
        return engine.submit(engine.infill_tokens(PREFIX, SUFFIX, prompt="    " + typed),
                             params, priority=Priority.INTERACTIVE)

    try:
        backend.open()
        assert submit("r").result().text == "ok"  # the file read cold, a checkpoint taken
        while backend.gate.acquire(blocking=False):
            pass
        backend.gated = True
        second = submit("r e")
        assert until_in_step(engine, [second.request]), "the step never came"
        third = submit("r e s")  # the next keystroke: the second's read is all past the cursor
        assert interrupts == [True]
        backend.open()
        assert second.result().finish_reason == "cancelled"
        done = third.result()
        assert done.text == "ok" and done.usage.cached_tokens == prefix_tokens(engine)
        assert backend.restored == [prefix_tokens(engine)] * 2
    finally:
        backend.open()
        engine.close()


def test_the_shortest_autocomplete_prompt_is_read_first():
    """Two editors' requests being read at once: the one with less left to read goes first
    (a keystroke past its checkpoint before another editor's cold file); in order of arrival
    it would wait for the whole of the other."""
    from localinfer.runtime.engine import Engine
    from tui_util import GatedBackend

    backend = GatedBackend(fim=True, reply="ok", n_slots=2, n_batch=32)
    engine = Engine(backend)
    try:
        long_prompt = engine.infill_tokens(PREFIX * 3, SUFFIX, prompt="r")
        short_prompt = engine.infill_tokens("def h():\n", "\n", prompt="    r")
        assert len(long_prompt) > 4 * len(short_prompt)
        first = engine.submit(long_prompt, SamplingParams(max_tokens=2, supersede="editor-1"),
                              priority=Priority.INTERACTIVE)
        until_in_step(engine)  # the long prompt's first chunk is in flight
        second = engine.submit(short_prompt, SamplingParams(max_tokens=2, supersede="editor-2"),
                               priority=Priority.INTERACTIVE)
        backend.open()
        first.result(), second.result()
        assert second.request.t_first < first.request.t_first
    finally:
        backend.open()
        engine.close()


def test_a_short_chat_prompt_is_not_kept_behind_an_editors_cold_file():
    """A chat's new turn (normal priority) that one chunk finishes is read before an
    autocomplete request's long prompt, not after all of it (it waited 8 s behind three
    editors' cold files in the editor workload); background work still waits."""
    from localinfer.runtime.engine import Engine
    from tui_util import GatedBackend

    backend = GatedBackend(fim=True, reply="ok", n_slots=3, n_batch=32)
    engine = Engine(backend)
    try:
        long_prompt = engine.infill_tokens(PREFIX * 3, SUFFIX, prompt="r")
        chat = engine.prompt_tokens("What does it return?")
        assert len(chat) <= 32 < len(long_prompt) // 4
        editor = engine.submit(long_prompt, SamplingParams(max_tokens=2, supersede="editor"),
                               priority=Priority.INTERACTIVE)
        until_in_step(engine)  # the long prompt's first chunk is in flight
        question = engine.submit(chat, SamplingParams(max_tokens=2), priority=Priority.NORMAL)
        indexing = engine.submit(list(chat), SamplingParams(max_tokens=2),
                                 priority=Priority.BACKGROUND)
        backend.open()
        editor.result(), question.result(), indexing.result()
        assert question.request.t_first < editor.request.t_first < indexing.request.t_first
    finally:
        backend.open()
        engine.close()


def test_a_short_prompt_takes_a_short_step_beside_long_ones():
    """Nothing decoding, a chat's new turn and an editor's cold file to read: the turn's first
    token comes from a step of its own rows, not from a whole batch of the file (1.0 s for a
    29-token turn on a 2-core AVX2 CPU), nor from one with a chunk of it beside."""
    from localinfer.runtime.engine import Engine
    from localinfer.runtime.slots import PREFILL_CHUNK_WHILE_DECODING
    from tui_util import GatedBackend

    backend = GatedBackend(fim=True, reply="ok", n_slots=3, n_batch=256)
    engine = Engine(backend)
    try:
        long_prompt = engine.infill_tokens(PREFIX * 3, SUFFIX, prompt="r")
        chat = engine.prompt_tokens("What does it return?")
        assert len(chat) < PREFILL_CHUNK_WHILE_DECODING and len(long_prompt) > 256
        first = engine.submit(engine.prompt_tokens("warm up"), SamplingParams(max_tokens=1),
                              priority=Priority.INTERACTIVE)
        until_in_step(engine)  # its step is in flight: both below wait for the next one
        editor = engine.submit(long_prompt, SamplingParams(max_tokens=2, supersede="editor"),
                               priority=Priority.INTERACTIVE)
        question = engine.submit(chat, SamplingParams(max_tokens=2), priority=Priority.NORMAL)
        backend.open()
        first.result(), editor.result(), question.result()
        assert question.request.t_first < editor.request.t_first
        # the warm-up's step, the question's alone, then the file in chunks beside its reply
        assert backend.decode_calls[1:3] == [len(chat), 1 + PREFILL_CHUNK_WHILE_DECODING]
    finally:
        backend.open()
        engine.close()


def test_an_editors_cold_file_is_read_in_steps_a_keystroke_need_not_wait_long_for(fake_engine):
    """On the CPU an autocomplete prompt is read in steps of at most AUTOCOMPLETE_STEP_ROWS:
    another editor's keystroke, as urgent, does not stop a step and waited for a whole
    512-row batch of the file; a chat's long prompt is still read in whole batches."""
    from localinfer.runtime.slots import AUTOCOMPLETE_STEP_ROWS

    engine = fake_engine(fim=True, reply="ok", n_slots=2, n_batch=512, n_ctx=4096)
    calls = engine.backend.decode_calls
    cold = engine.infill_tokens(PREFIX * 6, SUFFIX, prompt="r")
    assert len(cold) > 512
    engine.submit(cold, SamplingParams(max_tokens=1, supersede="editor"),
                  priority=Priority.INTERACTIVE).result()
    assert max(calls) == AUTOCOMPLETE_STEP_ROWS < 512
    calls.clear()
    engine.submit(engine.prompt_tokens("line " * 600), SamplingParams(max_tokens=1),
                  priority=Priority.INTERACTIVE).result()
    assert max(calls) == 512


def test_a_keystrokes_prompt_is_read_to_its_end_without_part_of_a_cold_file():
    """Two editors' prompts to read and nothing decoding: the step that reads a keystroke's
    prompt to its end reads no part of another editor's cold file beside it, which would hold
    its first token back by that part's reading (on a 2-core CPU, 194 tokens of a keystroke
    beside 318 of a cold file took 1.0 s against ~0.4 alone); the file reads on after."""
    from localinfer.runtime.engine import Engine
    from tui_util import GatedBackend

    steps: list[dict[int, int]] = []

    class Recording(GatedBackend):
        def decode(self, tokens, positions, seq_ids, outputs) -> None:
            super().decode(tokens, positions, seq_ids, outputs)
            rows: dict[int, int] = {}
            for seq in seq_ids:
                rows[seq] = rows.get(seq, 0) + 1
            steps.append(rows)

    backend = Recording(fim=True, reply="ok", n_slots=3, n_batch=512)
    engine = Engine(backend)
    try:
        cold = engine.infill_tokens(PREFIX * 3, SUFFIX, prompt="r")
        keystroke = engine.infill_tokens("def h():\n", "\n", prompt="    r")
        assert len(keystroke) + len(cold) > 2 * 64 and len(keystroke) < 64
        first = engine.submit(engine.prompt_tokens("warm up"), SamplingParams(max_tokens=1),
                              priority=Priority.INTERACTIVE)
        until_in_step(engine)  # its step is in flight: both below wait for the next one
        editors = [engine.submit(prompt, SamplingParams(max_tokens=2, supersede=f"editor-{i}"),
                                 priority=Priority.INTERACTIVE)
                   for i, prompt in enumerate((cold, keystroke))]
        backend.open()
        for generation in (first, *editors):
            generation.result()
        assert editors[1].request.t_first < editors[0].request.t_first
        assert list(steps[1].values()) == [len(keystroke)], steps[:3]
    finally:
        backend.open()
        engine.close()


def test_a_whole_batch_of_prompts_yields_to_a_short_new_turn():
    """A step reading a whole batch of an editor's cold file stops for a chat's new turn that
    finds all but a chunk of its prompt cached (such a turn waited 0.8 s for that step on a
    2-core AVX2 CPU), not for a long prompt, nor for background work."""
    from localinfer.runtime.engine import Engine
    from tui_util import GatedBackend

    backend = GatedBackend(fim=True, reply="ok", n_slots=3, n_batch=256, gated=False)
    interrupts = []
    backend.interrupt = lambda: interrupts.append(True)  # type: ignore[method-assign]
    engine = Engine(backend)
    try:
        history = engine.prompt_tokens("word " * 150)
        engine.submit(history, SamplingParams(max_tokens=1)).result()  # cached in a slot
        backend.gated = True
        editor = engine.submit(engine.infill_tokens(PREFIX * 3, SUFFIX, prompt="r"),
                               SamplingParams(max_tokens=2, supersede="editor"),
                               priority=Priority.INTERACTIVE)
        until_in_step(engine, [editor.request])  # a whole batch of the file is in flight
        others = [engine.submit(engine.prompt_tokens("line " * 150), SamplingParams(
            max_tokens=1)), engine.submit(engine.prompt_tokens("Why?"), SamplingParams(
                max_tokens=1), priority=Priority.BACKGROUND)]
        assert interrupts == []
        turn = engine.submit(history + engine.prompt_tokens("And then?"),
                             SamplingParams(max_tokens=1))
        assert interrupts == [True]
        backend.open()
        for generation in (editor, turn, *others):
            generation.result()
    finally:
        backend.open()
        engine.close()


def test_a_short_prompt_is_not_kept_behind_a_long_one_of_its_own_priority():
    """Two interactive chats (localinfer's chat UI): a new turn that one chunk finishes, sent
    first, is not read after a long prompt that came after it."""
    from localinfer.runtime.engine import Engine
    from tui_util import GatedBackend

    backend = GatedBackend(reply="ok", n_slots=3, n_batch=32)
    engine = Engine(backend)
    try:
        long_prompt = engine.prompt_tokens("word " * 400)
        short = engine.prompt_tokens("What does it return?")
        assert len(short) <= 32 < len(long_prompt) // 4
        first = engine.submit(engine.prompt_tokens("warm up"), SamplingParams(max_tokens=2),
                              priority=Priority.INTERACTIVE)
        until_in_step(engine)  # a step is in flight: both below wait for the next one
        question = engine.submit(short, SamplingParams(max_tokens=2),
                                 priority=Priority.INTERACTIVE)
        document = engine.submit(long_prompt, SamplingParams(max_tokens=2),
                                 priority=Priority.INTERACTIVE)
        backend.open()
        first.result(), question.result(), document.result()
        assert question.request.t_first < document.request.t_first
    finally:
        backend.open()
        engine.close()


def a_reply_decoding_then_a_cold_file(engine, backend, max_tokens: int):
    """On a gated engine: an editor's completion of ``max_tokens`` whose prompt the step
    released reads, decoding, then another editor's file to read cold, submitted. Both
    generations."""
    from localinfer.runtime.slots import LONG_PROMPT

    cold = engine.infill_tokens(PREFIX * 8, SUFFIX, prompt="r")
    assert len(cold) > LONG_PROMPT
    typing = engine.submit(engine.infill_tokens(PREFIX, SUFFIX, prompt="x"),
                           SamplingParams(max_tokens=max_tokens, supersede="one"),
                           priority=Priority.INTERACTIVE)
    backend.release()  # its prompt, whole: it decodes from the next step on
    deadline = time.monotonic() + 30
    while typing.request.n_generated < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    opened = engine.submit(cold, SamplingParams(max_tokens=1, supersede="two"),
                           priority=Priority.INTERACTIVE)
    return typing, opened


def test_a_long_prompt_waits_while_an_autocomplete_reply_decodes():
    """An editor's file read cold is not read beside another editor's completion, which its
    editor shows whole, so that each step's length is that user's wait (a chunk of the file
    made those steps 3-5 times longer on a 2-core CPU): the reply's steps decode alone, and the
    file is read once it is done. A short prompt (a keystroke's) still reads beside it."""
    from localinfer.runtime.engine import Engine
    from tui_util import GatedBackend

    backend = GatedBackend(fim=True, reply="a b c d e f g h", n_slots=3, n_batch=256)
    engine = Engine(backend)
    try:
        typing, opened = a_reply_decoding_then_a_cold_file(engine, backend, max_tokens=6)
        keystroke = engine.submit(engine.infill_tokens(PREFIX, SUFFIX, prompt="y"),
                                  SamplingParams(max_tokens=1, supersede="three"),
                                  priority=Priority.INTERACTIVE)
        backend.open()
        typing.result(), opened.result(), keystroke.result()
        assert keystroke.request.t_read < typing.request.t_last  # beside the reply
        assert opened.request.t_read > typing.request.t_last  # once the reply is done
    finally:
        backend.open()
        engine.close()


def test_a_prompt_waiting_between_decoding_sequences_is_moved_out_of_their_way():
    """A cold file waiting while an autocomplete reply decodes sat in the slot between that
    reply's and a chat's: each step of the two took two graphs, as llama.cpp computes only
    consecutive sequences together (a chat and three completions: 55-78 ms a step against
    40-45 in one graph, 2-core CPU). The chat's sequence trades places with the waiting one."""
    from localinfer.runtime.engine import Engine
    from tui_util import GatedBackend

    backend = GatedBackend(fim=True, reply="a b c d e f g h", n_slots=3, n_batch=256)
    engine = Engine(backend)
    try:
        typing, opened = a_reply_decoding_then_a_cold_file(engine, backend, max_tokens=8)
        chat = engine.submit(engine.prompt_tokens("What does it return?"),
                             SamplingParams(max_tokens=8))
        n_steps = len(backend.splits)
        backend.open()
        typing.result(), opened.result(), chat.result()
        assert opened.request.t_read > typing.request.t_last  # it waited, as it should
        two = [split for split in backend.splits[n_steps:] if sum(split) == 2]
        assert two and all(split == (2,) for split in two), backend.splits[n_steps:]
        assert backend.swaps
    finally:
        backend.open()
        engine.close()
