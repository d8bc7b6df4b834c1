"""The engine's scheduling, streaming, stopping and cancelling, on the scripted fake backend.

The fake checks the batch contract as llama.cpp does (contiguous positions per sequence, no
position beyond the context), so these tests also catch bookkeeping bugs in the engine."""

from __future__ import annotations

import threading
import time

import pytest

from localinfer.errors import Busy, ContextOverflow, InvalidRequest
from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend
from localinfer.runtime.speculate import MAX_DRAFT
from localinfer.runtime.types import Done, Message, Priority, SamplingParams, Token

GREEDY = SamplingParams(temperature=0)


def started(generation):
    """Wait for the first token and return the live iterator (dropping it would cancel)."""
    stream = iter(generation)
    next(stream)
    return stream


def finish_order():
    """A list that records generations' names in the order they finish, and the sink that
    records one (``sink_for(name)``): sinks run on the engine's worker thread."""
    order: list[str] = []
    lock = threading.Lock()

    def sink_for(name):
        def sink(event):
            if isinstance(event, Done):
                with lock:
                    order.append(name)
        return sink

    return order, sink_for


def events(generation):
    tokens, done = [], None
    for ev in generation:
        if isinstance(ev, Token):
            tokens.append(ev)
        else:
            done = ev
    return tokens, done


def test_chat_streams_tokens_then_done(fake_engine):
    engine = fake_engine(reply="One two three.")
    tokens, done = events(engine.chat([Message("user", "hi")], GREEDY))
    assert "".join(t.text for t in tokens) == "One two three." == done.text
    assert len(tokens) >= 3
    assert done.finish_reason == "stop"
    assert [t.live.n_tokens for t in tokens] == sorted(t.live.n_tokens for t in tokens)
    assert done.usage.completion_tokens == len(engine.backend.tokenize("One two three.",
                                                                       add_special=False)) + 1
    t = done.timings
    assert t.prompt_tokens == done.usage.prompt_tokens > 0
    assert t.decode_tokens == t.completion_tokens - 1
    assert t.ttft_ms >= t.prefill_ms >= 0 and t.total_ms >= t.ttft_ms


def test_chat_uses_the_template(fake_engine):
    engine = fake_engine()
    text = engine.render_chat([Message("system", "Be brief."), Message("user", "hi")])
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\n"
    tokens = engine.chat_tokens([Message("user", "hi")])
    assert tokens.count(engine.backend.tokenize("<bos>", add_special=False)[0]) == 1


def test_max_tokens_ends_with_length(fake_engine):
    engine = fake_engine(reply="a b c d e f g h")
    done = engine.complete("x", SamplingParams(max_tokens=3)).result()
    assert done.finish_reason == "length"
    assert done.usage.completion_tokens == 3
    assert done.text == "a b"


def test_stop_string_cuts_the_text(fake_engine):
    engine = fake_engine(reply="alpha beta STOP gamma")
    done = engine.complete("x", SamplingParams(stop=("STOP",))).result()
    assert done.text == "alpha beta "
    assert done.finish_reason == "stop"


def test_bad_params_and_empty_prompt(fake_engine):
    engine = fake_engine()
    with pytest.raises(InvalidRequest, match="max_tokens"):
        engine.complete("x", SamplingParams(max_tokens=0))
    with pytest.raises(InvalidRequest, match="temperature"):
        engine.complete("x", SamplingParams(temperature=-1))
    with pytest.raises(InvalidRequest, match="empty"):
        engine.complete("", SamplingParams())
    with pytest.raises(InvalidRequest, match="empty"):
        engine.chat([], SamplingParams())


def test_prompt_longer_than_the_context_says_the_numbers(fake_engine):
    engine = fake_engine(n_ctx=64)
    with pytest.raises(ContextOverflow) as info:
        engine.complete("word " * 100, SamplingParams())
    assert "201 tokens" in str(info.value) and "64 tokens" in str(info.value)
    # At the most the model was trained for, a larger --ctx is no advice.
    message = str(info.value)
    assert "--ctx" not in message and "the most fake:test was trained for" in message
    smaller = fake_engine(n_ctx=64, n_ctx_train=128)
    with pytest.raises(ContextOverflow, match=r"a larger context \(--ctx\)"):
        smaller.complete("word " * 100, SamplingParams())


def test_generation_stops_when_the_context_is_full(fake_engine):
    engine = fake_engine(n_ctx=32, reply="x " * 100)
    done = engine.complete("a " * 10, SamplingParams(max_tokens=None)).result()
    assert done.finish_reason == "length"
    # All 32 cells are filled; the last token is sampled from them and never needs a cell.
    assert done.usage.prompt_tokens + done.usage.completion_tokens == 32 + 1


def test_cancel_stops_within_one_token(fake_engine):
    engine = fake_engine(reply="tok " * 500, step_delay_s=0.002)
    generation = engine.complete("x", SamplingParams(max_tokens=None))
    seen = 0
    for event in generation:
        if isinstance(event, Token):
            seen = event.live.n_tokens
            if seen == 10:
                generation.cancel()
        else:
            done = event
    assert done.finish_reason == "cancelled"
    assert done.usage.completion_tokens <= 11


def test_cancel_while_waiting_in_the_queue(fake_engine):
    engine = fake_engine(reply="tok " * 200, n_slots=1, step_delay_s=0.002)
    first = engine.complete("a", SamplingParams(max_tokens=None))
    second = engine.complete("b", SamplingParams(max_tokens=None))
    second.cancel()
    done = second.result()
    assert done.finish_reason == "cancelled" and done.usage.completion_tokens == 0
    first.cancel()
    assert first.result().finish_reason == "cancelled"


def test_leaving_the_iteration_early_cancels(fake_engine):
    engine = fake_engine(reply="tok " * 500, n_slots=1, step_delay_s=0.001)
    generation = engine.complete("x", SamplingParams(max_tokens=None))
    for _ in generation:
        break
    follow_up = engine.complete("y", SamplingParams(max_tokens=2)).result()
    assert follow_up.finish_reason == "length"  # the slot was freed
    assert generation.cancelled


def test_concurrent_requests_batch_together_and_each_gets_its_own_reply(fake_engine):
    engine = fake_engine(reply=lambda prompt: f"echo {prompt.split()[-1]} done", n_slots=4,
                         step_delay_s=0.002)
    gens = [engine.complete(f"question number{i}", GREEDY) for i in range(8)]
    texts = [g.result().text for g in gens]
    assert texts == [f"echo number{i} done" for i in range(8)]
    assert max(engine.backend.decode_calls) >= 4  # several sequences shared a decode step


def test_prefix_reuse_evaluates_only_the_new_suffix(fake_engine):
    engine = fake_engine(reply="Sure thing.")
    history = [Message("user", "first question " * 20)]
    first = engine.chat(history, GREEDY).result()
    history += [Message("assistant", first.text), Message("user", "and another")]
    second = engine.chat(history, GREEDY).result()
    n_first_prompt = first.usage.prompt_tokens
    assert second.usage.cached_tokens >= n_first_prompt - 1
    assert second.timings.prefill_tokens == second.usage.prompt_tokens - \
        second.usage.cached_tokens
    assert second.text == first.text == "Sure thing."


def read_ahead(engine, before=0):
    """Wait until the idle engine has read a next turn's opening ahead; how many tokens."""
    deadline = time.monotonic() + 5
    while engine.stats().read_ahead_tokens_total == before and time.monotonic() < deadline:
        time.sleep(0.005)
    return engine.stats().read_ahead_tokens_total - before


OPENING = 5
"""The fake's Gemma template opens a user turn after a reply with 5 tokens:
<end_of_turn>, newline, <start_of_turn>, user, newline."""


@pytest.mark.parametrize("params, n_ahead", [
    (GREEDY, OPENING),  # the reply ends with its end of turn (not read: the opening has it)
    (SamplingParams(temperature=0, max_tokens=3), 1 + OPENING),  # and its last token
    (SamplingParams(temperature=0, speculative=True), OPENING),  # ended inside a draft
])
def test_an_idle_engine_reads_the_next_turn_opening_after_a_chat_reply(
        fake_engine, monkeypatch, params, n_ahead):
    """The next turn then reads only its own message: its prompt's cached part is longer by
    the opening than where it comes at once (a script's next request, no time to read)."""
    import localinfer.runtime.engine as engine_module

    cached = {}
    for pause in (False, True):
        monkeypatch.setattr(engine_module, "READ_AHEAD_IDLE_S", 0.0 if pause else 60.0)
        engine = fake_engine(reply="a b a b a b a b a b.")
        history = [Message("user", "a b a b a b a b a b a b")]
        first = engine.chat(history, params).result()
        assert (read_ahead(engine) if pause else engine.stats().read_ahead_tokens_total) \
            == (n_ahead if pause else 0)
        history += [Message("assistant", first.text), Message("user", "and another")]
        second = engine.chat(history, GREEDY).result()
        assert second.text == "a b a b a b a b a b."
        cached[pause] = second.usage.cached_tokens
    assert cached[True] == cached[False] + n_ahead


def test_a_stop_left_asked_while_idle_does_not_cost_a_chat_its_cache(fake_engine,
                                                                     monkeypatch):
    """A stop asked during a step that ends before it takes effect (a client that left during
    its reply's last step) stays asked until the next step: the next turn's opening, read
    ahead before it, must not take it for a failure and drop the chat's cache."""
    import localinfer.runtime.engine as engine_module

    monkeypatch.setattr(engine_module, "READ_AHEAD_IDLE_S", 0.3)
    engine = fake_engine(reply="a b a b a b a b a b.")
    history = [Message("user", "a b a b a b a b a b a b")]
    first = engine.chat(history, GREEDY).result()
    engine.backend.interrupt()  # long before the engine has been idle 0.3 s
    assert read_ahead(engine) == OPENING
    history += [Message("assistant", first.text), Message("user", "and another")]
    second = engine.chat(history, GREEDY).result()
    assert second.usage.cached_tokens == first.usage.prompt_tokens + \
        first.usage.completion_tokens - 1 + OPENING  # all but the new message's own tokens


def test_openings_read_ahead_for_several_slots_fill_a_batch_at_most(fake_engine,
                                                                   monkeypatch):
    import localinfer.runtime.engine as engine_module

    monkeypatch.setattr(engine_module, "READ_AHEAD_IDLE_S", 0.0)
    engine = fake_engine(reply="Fine.", n_slots=3, n_batch=8)
    gens = [engine.chat([Message("user", f"chat {i}")], GREEDY) for i in range(3)]
    assert all(g.result().text == "Fine." for g in gens)
    deadline = time.monotonic() + 5
    while engine.stats().read_ahead_tokens_total < 3 * OPENING and time.monotonic() < deadline:
        time.sleep(0.005)
    assert engine.stats().read_ahead_tokens_total == 3 * OPENING
    assert engine.backend.decode_calls[-3:] == [OPENING] * 3  # one a step: 8 rows hold one


def test_no_read_ahead_where_the_next_prompt_will_not_repeat_the_cache(fake_engine,
                                                                         monkeypatch):
    """Not after a stop string (the client gets the reply without it), a completion (no chat
    template), a cancelled reply or one ending in white space (templates trim it)."""
    import localinfer.runtime.engine as engine_module

    monkeypatch.setattr(engine_module, "READ_AHEAD_IDLE_S", 0.0)
    engine = fake_engine(reply="Sure thing.<More to say. " * 20, step_delay_s=0.002)
    chat = [Message("user", "Hello")]

    def none_read() -> bool:
        time.sleep(0.1)  # the idle engine would have read it by now
        return engine.stats().read_ahead_tokens_total == 0

    cut = engine.chat(chat, SamplingParams(stop=["<More"])).result()
    assert cut.finish_reason == "stop" and cut.text == "Sure thing." and none_read()
    engine.complete("Hello", SamplingParams(max_tokens=4)).result()
    assert none_read()
    generation = engine.chat(chat, SamplingParams(speculative=False))
    started(generation)
    generation.cancel()
    assert generation.result().finish_reason == "cancelled" and none_read()
    engine.backend.reply = "ends in a newline\n"
    engine.chat(chat, GREEDY).result()
    assert none_read()
    engine.backend.reply = "and this one does not"
    engine.chat(chat, GREEDY).result()
    assert read_ahead(engine) == OPENING


def test_prefix_reuse_picks_the_slot_holding_the_prefix(fake_engine):
    engine = fake_engine(reply="ok", n_slots=3)
    for topic in ("apples", "pears", "plums"):
        engine.complete(f"context about {topic} " * 10, GREEDY).result()
    again = engine.complete("context about pears " * 10 + "and a question of ten words that"
                            " follows the context", GREEDY).result()
    assert again.usage.cached_tokens == len(engine.backend.tokenize(
        "context about pears " * 10, add_special=True))


def test_a_prompt_asked_again_takes_the_slot_holding_it(fake_engine):
    """Its reply there is longer than the prompt, and an empty slot is free: the slot holding
    the prompt is still the one to take (a regenerated reply, several clients asking alike)."""
    from localinfer.runtime.engine import REREAD_TAIL

    engine = fake_engine(reply="word " * 40, n_slots=3)
    prompts = [f"tell me about {topic} please" for topic in ("apples", "pears")]
    for prompt in prompts:
        engine.complete(prompt, GREEDY).result()
    for prompt in prompts[::-1]:
        again = engine.complete(prompt, GREEDY).result()
        assert again.usage.cached_tokens == again.usage.prompt_tokens - REREAD_TAIL > 0
    assert not engine.backend._seqs.get(2)  # the empty slot stayed empty


def test_a_prompt_sharing_only_a_prefix_leaves_a_long_conversation_cached(fake_engine):
    """A new chat that shares a system prompt with a long conversation takes the least
    recently used slot; the conversation's next turn still finds all of it cached."""
    engine = fake_engine(reply="Fine, and here is a long answer to that. " * 4, n_slots=2)
    system = Message("system", "You are terse.")
    engine.complete("something else entirely", GREEDY).result()  # the other slot
    chat = [system, Message("user", "first question")]
    first = engine.chat(chat, GREEDY).result()
    engine.chat([system, Message("user", "a new chat")], GREEDY).result()
    chat += [Message("assistant", first.text), Message("user", "and then?")]
    second = engine.chat(chat, GREEDY).result()
    # The first turn and its reply (but the few tokens the template renders anew after it).
    n_conversation = first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.cached_tokens >= n_conversation - 3


def test_long_prompt_is_chunked_while_others_decode(fake_engine):
    engine = fake_engine(reply="tok " * 100, n_slots=2, n_batch=256, step_delay_s=0.001)
    streaming = engine.complete("a", SamplingParams(max_tokens=None))
    stream = started(streaming)
    long = engine.complete("word " * 400, SamplingParams(max_tokens=2))
    assert long.result().finish_reason == "length"
    streaming.cancel()
    assert list(stream)[-1].finish_reason == "cancelled"
    # While the first sequence was decoding, no batch carried a full 256-token chunk: only
    # its next token (and a speculative draft of at most MAX_DRAFT) plus a 64-token chunk.
    assert max(engine.backend.decode_calls[1:]) <= 1 + MAX_DRAFT + 64


def test_interactive_requests_jump_the_queue(fake_engine):
    engine = fake_engine(reply="tok " * 20, n_slots=1, step_delay_s=0.001)
    blocker = engine.complete("busy", SamplingParams(max_tokens=None))
    stream = started(blocker)  # noqa: F841 - held: dropping the iterator would cancel
    order, sink_for = finish_order()
    for i in range(3):
        engine.complete(f"editor {i}", GREEDY, priority=Priority.BACKGROUND,
                        sink=sink_for(f"editor{i}"))
    engine.complete("chat", GREEDY, priority=Priority.INTERACTIVE, sink=sink_for("chat"))
    blocker.cancel()
    deadline = time.time() + 10
    while len(order) < 4 and time.time() < deadline:
        time.sleep(0.01)
    assert order[0] == "chat"
    assert order[1:] == ["editor0", "editor1", "editor2"]


def test_full_queue_is_busy(fake_engine):
    backend = FakeBackend(reply="tok " * 50, n_slots=1, step_delay_s=0.002)
    engine = Engine(backend, max_queue=2)
    try:
        gens = [engine.complete("a", SamplingParams(max_tokens=None))]
        stream = started(gens[0])
        gens += [engine.complete("b"), engine.complete("c")]
        with pytest.raises(Busy):
            engine.complete("d")
    finally:
        engine.close()
    assert list(stream)[-1].finish_reason == "cancelled"
    assert all(g.done is not None for g in gens)


def test_a_burst_the_free_slots_take_is_not_counted_as_waiting():
    # Slots 2 + queue 1 take three at once: submitted together before the worker seats
    # them, two of them counted as waiting and the third was refused (a 503 beside idle
    # slots).
    backend = FakeBackend(reply="tok " * 50, n_slots=2, step_delay_s=0.002)
    engine = Engine(backend, max_queue=1)
    try:
        with engine._cv:  # the worker seats nothing meanwhile
            gens = [engine.complete(p, SamplingParams(max_tokens=None)) for p in "abc"]
            with pytest.raises(Busy, match="1 requests are already waiting"):
                engine.complete("d")
        for g in gens:
            g.cancel()
    finally:
        engine.close()


def test_close_ends_every_stream_as_cancelled():
    engine = Engine(FakeBackend(reply="tok " * 500, n_slots=1, step_delay_s=0.002))
    running = engine.complete("a", SamplingParams(max_tokens=None))
    waiting = engine.complete("b", SamplingParams(max_tokens=None))
    stream = started(running)
    engine.close()
    assert list(stream)[-1].finish_reason == "cancelled"
    assert waiting.result().finish_reason == "cancelled"
    assert engine.backend.closed
    with pytest.raises(Busy):
        engine.complete("c")


def test_sink_receives_events_on_the_worker_thread(fake_engine):
    engine = fake_engine(reply="a b")
    got = []
    finished = threading.Event()

    def sink(event):
        got.append((threading.current_thread().name, event))
        if isinstance(event, Done):
            finished.set()

    engine.complete("x", GREEDY, sink=sink)
    assert finished.wait(5)
    assert {name for name, _ in got} == {"localinfer-engine"}
    assert isinstance(got[-1][1], Done) and got[-1][1].text == "a b"


def test_stats_count_requests_and_tokens(fake_engine):
    engine = fake_engine(reply="a b c")
    for _ in range(3):
        engine.complete("x y z", GREEDY).result()
    stats = engine.stats()
    assert stats.requests_total == 3
    assert stats.generated_tokens_total == 3 * 6  # 5 pieces + end of sequence, each time
    assert stats.queue_depth == 0 and stats.active == 0


def test_warm_up_runs_on_the_worker_thread(fake_engine):
    engine = fake_engine()
    assert engine.ready.wait(5)
    assert engine.backend.warmed_up_on == "localinfer-engine"


# --- speculation, preemption ---------------------------------------------------------------
def test_prompt_lookup_drafts_are_verified_and_change_nothing(fake_engine):
    # The fake model copies its prompt: the situation prompt lookup is made for.
    engine = fake_engine(reply=lambda prompt: prompt.split("COPY:")[-1], n_slots=2)
    prompt = "COPY:" + " ".join(f"line{i} = value{i % 7} + offset" for i in range(60))
    plain = engine.complete(prompt, SamplingParams(temperature=0, max_tokens=None,
                                                   speculative=False)).result()
    fast = engine.complete(prompt, SamplingParams(temperature=0, max_tokens=None,
                                                  speculative=True)).result()
    assert fast.text == plain.text and len(plain.text) > 200
    assert plain.timings.drafted_tokens == 0
    assert fast.timings.accepted_tokens > 0.8 * fast.timings.drafted_tokens > 50
    # Fewer decode steps for the same tokens: several accepted per step.
    assert fast.usage.completion_tokens == plain.usage.completion_tokens


def test_rejected_drafts_leave_the_cache_consistent(fake_engine):
    # Repetitive prompts make drafts that the model then rejects; the fake backend raises
    # if a rejected draft's cells were left behind (positions must stay contiguous).
    engine = fake_engine(reply="a b a b a c a b a d a b a e " * 5, n_slots=1)
    done = engine.complete("a b a b a b a b", SamplingParams(max_tokens=None,
                                                             speculative=True)).result()
    assert done.text == ("a b a b a c a b a d a b a e " * 5)
    assert done.timings.drafted_tokens > done.timings.accepted_tokens
    again = engine.complete("a b a b a b a b", SamplingParams(speculative=False)).result()
    assert again.text == done.text


def test_speculation_stops_at_the_token_limit(fake_engine):
    engine = fake_engine(reply=lambda p: p, n_slots=1)
    done = engine.complete("x y " * 40, SamplingParams(max_tokens=7, speculative=True)
                           ).result()
    assert done.usage.completion_tokens == 7 and done.finish_reason == "length"


def test_interactive_request_preempts_a_background_one(fake_engine):
    engine = fake_engine(reply="tok " * 300, n_slots=1, step_delay_s=0.001)
    background = engine.complete("editor request", SamplingParams(max_tokens=None,
                                                                  speculative=False),
                                 priority=Priority.BACKGROUND)
    stream = started(background)
    chat = engine.complete("user question", SamplingParams(max_tokens=5),
                           priority=Priority.INTERACTIVE).result()
    assert chat.finish_reason == "length"  # served while the background one was running
    rest = list(stream)
    done = rest[-1]
    # The background request resumed where it stopped: its text is whole and unchanged.
    assert done.finish_reason == "stop" and done.text == ("tok " * 300)
    assert done.usage.prompt_tokens == len(engine.backend.tokenize("editor request",
                                                                   add_special=True))
    assert engine.stats().preemptions_total == 1
    assert done.usage.completion_tokens == 601  # 600 pieces and the end of sequence


def test_burst_of_editor_requests_does_not_starve_a_chat(fake_engine):
    # Editor replies long enough that none can finish before the chat is even submitted.
    engine = fake_engine(reply="tok " * 200, n_slots=2, step_delay_s=0.001)
    order, sink_for = finish_order()
    for i in range(8):
        engine.complete(f"file {i}", GREEDY, priority=Priority.BACKGROUND,
                        sink=sink_for(f"editor{i}"))
    while engine.stats().active < 2:
        time.sleep(0.001)
    engine.complete("hello", SamplingParams(max_tokens=3), priority=Priority.INTERACTIVE,
                    sink=sink_for("chat"))
    deadline = time.time() + 20
    while len(order) < 9 and time.time() < deadline:
        time.sleep(0.01)
    assert order[0] == "chat"  # before any editor request, although they were all first
    assert sorted(order[1:]) == [f"editor{i}" for i in range(8)]


def test_cancel_mid_batch_frees_the_slot_and_spares_the_others(fake_engine):
    engine = fake_engine(reply=lambda p: "answer " + p.split()[-1] + " end", n_slots=3,
                         step_delay_s=0.002)
    long = engine.complete("x", SamplingParams(max_tokens=None))
    others = [engine.complete(f"question q{i}", GREEDY) for i in range(2)]
    stream = started(long)
    long.cancel()
    assert list(stream)[-1].finish_reason == "cancelled"
    late = engine.complete("question q9", GREEDY)
    assert [g.result().text for g in others + [late]] == [
        "answer q0 end", "answer q1 end", "answer q9 end"]


def test_measure_decode_step_runs_on_the_worker(fake_engine):
    engine = fake_engine(step_delay_s=0.001)
    rate = engine.measure_decode_step(8)
    assert rate > 0
    engine.complete("after", SamplingParams(max_tokens=2)).result()  # still serving


def test_a_failed_warm_up_is_reported_and_the_model_still_freed():
    class BrokenGPU(FakeBackend):
        def warm_up(self):
            raise RuntimeError("out of device memory")

    engine = Engine(BrokenGPU())
    assert engine.ready.wait(5)
    with pytest.raises(Exception, match="out of device memory"):
        engine.check()
    with pytest.raises(Exception, match="stopped working: out of device memory"):
        engine.complete("x")
    engine.close()
    assert engine.backend.closed
    engine.close()  # twice is fine


def test_a_preempted_request_cancelled_while_waiting_ends_after_its_tokens(fake_engine):
    engine = fake_engine(reply="tok " * 300, n_slots=1, step_delay_s=0.002)
    background = engine.complete("bg", SamplingParams(max_tokens=None),
                                 priority=Priority.BACKGROUND)
    stream = started(background)
    chat = engine.complete("chat", SamplingParams(max_tokens=None),
                           priority=Priority.INTERACTIVE)
    chat_stream = started(chat)  # the chat took the only slot
    background.cancel()
    events = list(stream)
    assert isinstance(events[-1], Done) and events[-1].finish_reason == "cancelled"
    assert all(isinstance(e, Token) for e in events[:-1])  # nothing after Done
    # Its text is the first piece ("tok", read by started()) and every piece after it.
    assert events[-1].text == "tok" + "".join(e.text for e in events[:-1])
    chat.cancel()
    assert list(chat_stream)[-1].finish_reason == "cancelled"


def test_a_crash_while_admitting_a_request_fails_it_instead_of_hanging(fake_engine):
    engine = fake_engine()

    def broken(params, seed):
        raise TypeError("a bug in the backend")

    engine.backend.new_sampler = broken
    generation = engine.complete("hello", SamplingParams(max_tokens=4))
    done = threading.Event()
    outcome = []

    def wait():
        try:
            generation.result()
        except Exception as exc:  # noqa: BLE001 - the error is what the test looks at
            outcome.append(exc)
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    assert done.wait(10), "the request was left waiting after the worker crashed"
    assert "the engine stopped unexpectedly" in str(outcome[0])
    with pytest.raises(Exception, match="stopped working: a bug in the backend"):
        engine.complete("again", SamplingParams(max_tokens=4)).result()


def test_running_sequences_are_kept_in_consecutive_slots(fake_engine):
    # Four conversations cached in slots 0-3; the two in slots 0 and 2 come back together.
    # llama.cpp would decode slots 0 and 2 as two graphs: one trades caches with slot 1, and
    # each keeps its cached prefix (the fake checks every position against its cells).
    engine = fake_engine(reply="a b c d e f", n_slots=4)
    prompts = [f"conversation {i} " + "word " * 20 for i in range(4)]
    for prompt in prompts:
        engine.complete(prompt, GREEDY).result()
    backend = engine.backend
    cells = [len(backend._seqs.get(i, [])) for i in range(4)]
    assert all(cells) and len(set(cells)) == 1
    n_calls = len(backend.splits)
    again = [engine.complete(prompts[i] + "more", GREEDY) for i in (0, 2)]
    done = [g.result() for g in again]
    assert all(d.text == "a b c d e f" for d in done)
    assert all(d.usage.cached_tokens >= 20 for d in done)
    assert len(backend.swaps) == 1
    decode_steps = [s for s in backend.splits[n_calls:] if sum(s) == 2]
    assert decode_steps and all(len(s) == 1 for s in decode_steps)
    # Every slot's cache is still there, one of them in another slot.
    grown = [len(backend._seqs.get(i, [])) for i in range(4)]
    assert sorted(grown)[:2] == cells[:2] and min(grown[0], grown[1]) > cells[0]


LONG = "a b c d e f g h i j k l m n o p"


def middle_one_ends_first(engine) -> None:
    """Slots 0, 1 and 2 in the order submitted (the least recently used first): the short
    request in slot 1 ends first, leaving the sequences of slots 0 and 2 apart."""
    first = engine.complete("long 0", GREEDY)
    short = engine.complete("one", SamplingParams(temperature=0, max_tokens=2))
    last = engine.complete("long 1", GREEDY)
    assert short.result().finish_reason == "length"
    assert all(g.result().text == LONG for g in (first, last))


def test_a_sequence_left_alone_between_others_is_moved_next_to_them(fake_engine):
    engine = fake_engine(reply=LONG, n_slots=3)
    middle_one_ends_first(engine)
    backend = engine.backend
    assert backend.swaps == [(2, 1)]  # slot 2's sequence moved into slot 1
    two = [s for s in backend.splits if sum(s) == 2]
    assert two and all(len(s) == 1 for s in two)


def test_a_cache_that_cannot_be_moved_is_read_again(fake_engine, monkeypatch):
    engine = fake_engine(reply=LONG, n_slots=3)
    backend = engine.backend

    def lost(a, b):  # as llama.cpp's state could not be written back: both sequences empty
        backend.swaps.append((a, b))
        backend._seqs[a], backend._seqs[b] = [], []
        return False

    monkeypatch.setattr(backend, "seq_swap", lost)
    middle_one_ends_first(engine)
    assert backend.swaps == [(2, 1)]


def test_a_cache_move_that_fails_leaves_the_sequences_where_they_are(fake_engine, monkeypatch):
    from localinfer.errors import LocalInferError

    engine = fake_engine(reply=LONG, n_slots=3)
    backend = engine.backend

    def refused(a, b):
        raise LocalInferError("llama.cpp could not save a sequence's cache")

    monkeypatch.setattr(backend, "seq_swap", refused)
    middle_one_ends_first(engine)
    assert (1, 1) in backend.splits  # slots 0 and 2 decoded apart


def test_a_new_chat_takes_a_slot_that_keeps_its_opening(fake_engine):
    """A window cache cuts back only a short sequence as far as a new chat's template opening:
    the new chat takes such a slot, even a more recently used one, and reads only what
    follows the opening; the long conversation in the other slot stays whole."""
    engine = fake_engine(reply="a b c d", n_slots=2, window=16)
    opening = "<start_of_turn>user "
    long_chat = engine.complete(opening + "word " * 40, GREEDY)
    long_chat.result()  # slot 0, the least recently used from here
    engine.complete(opening + "short one", GREEDY).result()  # slot 1
    cells = [list(engine.backend._seqs[i]) for i in range(2)]
    fresh = engine.complete(opening + "another " * 12, GREEDY).result()
    n_opening = len(engine.completion_tokens(opening))
    assert fresh.usage.cached_tokens == n_opening
    assert engine.backend._seqs[0] == cells[0]  # the long one, untouched


def test_a_new_chat_takes_an_empty_slot_before_a_cached_conversation(fake_engine):
    """Without a window every slot could keep the opening it shares: an empty slot loses
    nothing and goes first."""
    engine = fake_engine(reply="a b c d", n_slots=2)
    opening = "<start_of_turn>user "
    engine.complete(opening + "word " * 20, GREEDY).result()  # slot 0
    kept = list(engine.backend._seqs[0])
    fresh = engine.complete(opening + "another " * 12, GREEDY).result()
    assert fresh.usage.cached_tokens == 0 and engine.backend._seqs[0] == kept
