"""The engines of one process take turns on the CPU cores (runtime/turns.py): never two
decodes at once, and embeddings (indexing) wait while another engine generates, for at most
BACKGROUND_WAIT_S, in groups of at most BACKGROUND_TURN_TOKENS tokens."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from localinfer.errors import StepInterrupted
from localinfer.runtime import turns as turns_module
from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend
from localinfer.runtime.turns import BACKGROUND_TURN_TOKENS, Turns, in_turns
from localinfer.runtime.types import Message, SamplingParams


class Overlap:
    """Counts the decodes and embeddings of several backends running at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.spans: dict[str, list[tuple[float, float]]] = {}

    def watch(self, backend: FakeBackend, name: str, method: str) -> None:
        real = getattr(backend, method)

        def watched(*args, **kwargs):
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
            started = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                with self.lock:
                    self.running -= 1
                self.spans.setdefault(name, []).append((started, time.perf_counter()))

        setattr(backend, method, watched)


def engines(shared: Turns | None, overlap: Overlap, *, step_delay_s=0.01,
            embed_delay_s=0.05) -> tuple[Engine, Engine]:
    chat = FakeBackend(reply="word " * 200, name="fake:chat", step_delay_s=step_delay_s)
    index = FakeBackend(name="fake:embed", embedding_only=True, embed_delay_s=embed_delay_s)
    overlap.watch(chat, "chat", "decode")
    overlap.watch(index, "embed", "embed")
    return Engine(chat, turns=shared), Engine(index, turns=shared)


def test_two_engines_never_decode_at_once_and_embeddings_wait_for_generation():
    overlap = Overlap()
    chat, index = engines(Turns(), overlap)
    with chat, index:
        reply = chat.chat([Message("user", "Go on.")], SamplingParams(max_tokens=30))
        time.sleep(0.05)  # generating now
        inputs = [index.embedding_tokens(f"chunk {i} " * 20) for i in range(3)]
        started = time.perf_counter()
        vectors = index.embed(inputs).vectors
        waited = time.perf_counter() - started
        done = reply.result()
    assert len(vectors) == 3 and done.usage.completion_tokens == 30
    assert overlap.most == 1  # one decode at a time, over both engines
    # The embeddings waited for the generation's end (~0.3 s of steps), not a second more.
    last_step = max(end for _, end in overlap.spans["chat"])
    first_embed = min(start for start, _ in overlap.spans["embed"])
    assert first_embed >= last_step
    assert waited < turns_module.BACKGROUND_WAIT_S + 0.5


def test_without_turns_they_overlap():
    """The same two engines without shared turns decode at the same time (the test above
    can fail)."""
    overlap = Overlap()
    chat, index = engines(None, overlap)
    with chat, index:
        reply = chat.chat([Message("user", "Go on.")], SamplingParams(max_tokens=30))
        time.sleep(0.05)
        index.embed([index.embedding_tokens("chunk " * 20)] * 3)
        reply.result()
    assert overlap.most == 2


def test_embeddings_take_a_turn_after_waiting_at_most_the_bound(monkeypatch):
    """Generation that goes on and on does not stop indexing: a background decode waits
    BACKGROUND_WAIT_S at most, then takes its turn between two steps."""
    monkeypatch.setattr(turns_module, "BACKGROUND_WAIT_S", 0.2)
    overlap = Overlap()
    chat, index = engines(Turns(), overlap, step_delay_s=0.02)
    with chat, index:
        reply = chat.chat([Message("user", "Go on.")], SamplingParams(max_tokens=150))
        time.sleep(0.05)
        started = time.perf_counter()
        index.embed([index.embedding_tokens("chunk " * 20)])
        waited = time.perf_counter() - started
        assert not reply.done  # still generating: the embedding did not wait for its end
        reply.cancel()
    assert 0.2 <= waited < 1.0
    assert overlap.most == 1


def test_a_request_to_generate_interrupts_indexing_that_took_idle_cores():
    """Embeddings that took the cores while nothing generated stop for a chat that comes
    (within llama.cpp's next check), and are decoded again after it: the chat does not wait
    for them, and every vector comes back, in order."""
    overlap = Overlap()
    chat, index = engines(Turns(), overlap, step_delay_s=0.005, embed_delay_s=1.0)
    with chat, index:
        inputs = [index.embedding_tokens(f"chunk {i}") for i in range(2)]
        embedding = threading.Thread(target=lambda: results.append(index.embed(inputs)))
        results: list = []
        embedding.start()
        time.sleep(0.2)  # the embeddings hold the cores now
        started = time.perf_counter()
        reply = chat.chat([Message("user", "Go on.")], SamplingParams(max_tokens=5)).result()
        waited = time.perf_counter() - started
        embedding.join(10)
        expected = index.embed(inputs).vectors  # alone, uninterrupted
    assert reply.usage.completion_tokens == 5
    assert waited < 0.5  # not the second its embeddings' decode would have taken
    assert index.backend.interrupted_calls >= 1
    (done,) = results
    assert done.vectors == expected  # all of them, as asked
    assert overlap.most == 1


def test_a_chats_new_turn_stops_indexing_that_waited_its_turn(monkeypatch):
    """Indexing that waited out BACKGROUND_WAIT_S beside a long reply holds the cores: an
    editor's keystroke does not stop it, a chat's new turn does (its first token came after
    a whole turn of indexing: 0.35 s on a 2-core AVX2 CPU), and the indexing goes on right
    after the turn's step, not after another wait, every vector back."""
    monkeypatch.setattr(turns_module, "BACKGROUND_WAIT_S", 0.2)
    shared, overlap = Turns(), Overlap()
    chat, index = engines(shared, overlap, step_delay_s=0.02, embed_delay_s=1.5)
    with chat, index:
        inputs = [index.embedding_tokens("chunk one")]
        expected = index.embed(inputs).vectors  # alone, nothing generating
        story = chat.chat([Message("user", "Go on.")], SamplingParams(max_tokens=300))
        results: list = []
        embedding = threading.Thread(target=lambda: results.append(index.embed(inputs)))
        embedding.start()
        deadline = time.monotonic() + 10
        while not shared._protected and time.monotonic() < deadline:
            time.sleep(0.01)  # the embedding waited its 0.2 s and holds the cores now
        assert shared._protected
        keystroke = chat.submit(chat.prompt_tokens("x = 1"), SamplingParams(
            max_tokens=1, supersede="editor"))
        time.sleep(0.1)
        assert index.backend.interrupted_calls == 0 and not keystroke.done
        started = time.perf_counter()
        turn = chat.chat([Message("user", "Why?")], SamplingParams(max_tokens=1)).result()
        waited = time.perf_counter() - started
        while not shared._protected and time.monotonic() < deadline:
            time.sleep(0.01)  # the embedding's owed turn, without another 0.2 s of waiting
        assert shared._protected and time.perf_counter() - started < 0.5
        # The turn it was owed runs to its end: another chat turn does not stop it again.
        chat.chat([Message("user", "And?")], SamplingParams(max_tokens=1)).result()
        embedding.join(10)
        story.cancel()
        keystroke.result()
    assert turn.usage.completion_tokens == 1 and waited < 0.5
    assert index.backend.interrupted_calls == 1
    (done,) = results
    assert done.vectors == expected
    assert overlap.most == 1


def test_a_chats_new_turn_holds_back_indexing_about_to_go():
    """Indexing that is due (it waited out its second) but does not hold the cores yet goes
    after the chat's step, not before it; then first, before the other engine's next turn."""
    shared, order = Turns(), []
    shared.join("chat", lambda: True)
    chat_turn = shared.turn("chat")
    chat_turn.__enter__()  # a step in flight
    indexing = threading.Thread(target=lambda: _take(shared, "index", order, background=True))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(turns_module, "BACKGROUND_WAIT_S", 0.0)
        indexing.start()
        deadline = time.monotonic() + 10
        while not shared._due and time.monotonic() < deadline:
            time.sleep(0.005)
    assert shared._due == 1
    shared.yield_for(lambda: True)  # a chat's new turn came
    waiting = threading.Thread(target=lambda: _take(shared, "chat", order))
    waiting.start()
    time.sleep(0.05)
    chat_turn.__exit__(None, None, None)
    waiting.join(10)
    indexing.join(10)
    later = threading.Thread(target=lambda: _take(shared, "chat", order))
    later.start()
    later.join(10)
    # YIELD_TURNS (2) turns to generate before indexing: the one in flight and the chat's
    assert order == ["chat", "index", "chat"]


def test_a_request_that_comes_while_the_cores_are_taken_is_in_the_next_step():
    """An engine waiting for the cores (another engine's decode) admits the requests that came
    meanwhile once it holds them: a chat's turn that came after an editor's file is read in
    that first step, beside one chunk of the file, not after a whole batch of it."""
    from localinfer.runtime.slots import PREFILL_CHUNK_WHILE_DECODING

    shared = Turns()
    backend = FakeBackend(reply="ok", name="fake:code", n_batch=256)
    engine = Engine(backend, turns=shared).wait_ready()
    warm = len(backend.decode_calls)
    other = shared.turn("other engine")
    other.__enter__()
    try:
        file = engine.submit(engine.prompt_tokens("line " * 300), SamplingParams(max_tokens=1))
        time.sleep(0.05)  # the engine found the cores taken and waits for them
        question = engine.submit(engine.prompt_tokens("Why?"), SamplingParams(max_tokens=1))
        other.__exit__(None, None, None)
        file.result(), question.result()
        assert question.request.t_first < file.request.t_first
        assert backend.decode_calls[warm] <= PREFILL_CHUNK_WHILE_DECODING  # 256 before
    finally:
        engine.close()


def _take(shared: Turns, engine: str, order: list[str], *, background: bool = False) -> None:
    with shared.turn(engine, background=background):
        order.append(engine)


def test_a_turn_found_taken_hands_over_first():
    """``before_wait`` (the engine's hand-over of its last step's tokens) runs when the turn is
    taken by another engine, before waiting for it, and not when the turn is free."""
    shared, seen = Turns(), []
    with shared.turn("free", before_wait=lambda: seen.append("free")):
        waiting = threading.Thread(target=lambda: _wait_for(shared, seen))
        waiting.start()
        deadline = time.monotonic() + 10
        while "handed over" not in seen and time.monotonic() < deadline:
            time.sleep(0.005)
        assert seen == ["handed over"]  # while the turn is still held here
    waiting.join(10)
    assert seen == ["handed over", "held"]


def _wait_for(shared: Turns, seen: list[str]) -> None:
    with shared.turn("other", before_wait=lambda: seen.append("handed over")):
        seen.append("held")


def test_embeddings_come_in_short_turns_only_while_another_engine_generates():
    inputs = [[1] * 100, [2] * 20, [3] * 8, [4] * 700, [5] * 10]
    shared, calls = Turns(), []

    def fn(group):
        calls.append([len(t) for t in group])
        return [t[0] for t in group]

    for generating, expected in ((False, [[100, 20, 8, 700, 10]]),
                                 (True, [[100, 20, 8], [700], [10]])):
        shared.join("other", lambda g=generating: g)
        calls.clear()
        out = in_turns(shared, "this", inputs, fn, lambda job: job())
        assert out == [1, 2, 3, 4, 5]  # in order, none lost
        assert calls == expected
        assert all(sum(c) <= BACKGROUND_TURN_TOKENS or len(c) == 1 for c in calls[1:])


@pytest.mark.model
def test_two_real_engines_take_turns_and_a_chat_interrupts_their_embeddings(starter_path):
    """The starter loaded twice in one process (a chat model and an embedding model, as a
    daemon holds them): their llama.cpp decodes never overlap, a chat interrupts embeddings
    that took idle cores (llama.cpp's abort callback on the embedding context) and they are
    read again after it, giving the vectors an uninterrupted run gives."""
    from localinfer import gguf
    from localinfer.loading import load_engine
    from localinfer.runtime.backend import LoadOptions
    from localinfer.runtime.turns import TURNS

    header = gguf.read_header(starter_path)
    options = LoadOptions(n_ctx=1024, n_slots=1)
    overlap = Overlap()
    chat = load_engine(starter_path, options, name="chat", header=header)
    index = load_engine(starter_path, options, name="index", header=header)
    assert chat._turns is TURNS and index._turns is TURNS
    overlap.watch(chat.backend, "chat", "decode")
    overlap.watch(index.backend, "embed", "embed")
    with chat, index:
        inputs = [index.embedding_tokens("def f(x):\n    return x * 2\n" * 30)] * 4
        expected = index.embed(inputs).vectors
        interrupted: list[int] = []
        real_embed = index.backend.embed

        def counted(group):
            try:
                return real_embed(group)
            except StepInterrupted:
                interrupted.append(len(group))
                raise

        index.backend.embed = counted
        results: list = []
        for _ in range(20):  # until a chat lands while the embeddings hold the cores
            results.clear()
            embedding = threading.Thread(target=lambda: results.append(index.embed(inputs)))
            embedding.start()
            time.sleep(0.05)
            reply = chat.chat([Message("user", "Say hi.")],
                              SamplingParams(max_tokens=4, temperature=0)).result()
            embedding.join(60)
            assert reply.usage.completion_tokens >= 1
            assert results and np.allclose(results[0].vectors, expected, rtol=1e-4, atol=1e-5)
            if interrupted:
                break
    assert interrupted, "no chat ever interrupted the embeddings"
    assert overlap.most == 1


def test_models_with_layers_or_experts_on_the_cpu_take_turns():
    """A model wholly on a GPU takes no turns; one with layers on the CPU does, and so does
    one whose layers are all on the GPU but whose experts stay in RAM (``n_cpu_moe``): its
    decodes run on the CPU's cores like any CPU model's."""
    from dataclasses import replace

    from localinfer.loading import cpu_turns

    backend = FakeBackend(name="fake:moe")
    n = backend.info.n_layers
    for gpu_layers, cpu_moe, takes_turns in ((n, 0, False), (n - 1, 0, True), (n, 2, True)):
        backend.info = replace(backend.info, n_gpu_layers=gpu_layers, n_cpu_moe=cpu_moe)
        assert (cpu_turns(backend) is not None) == takes_turns


def test_a_second_model_gets_turns_while_the_first_generates():
    """Two chat engines: the second's request waited for the first's whole reply (its
    engine's turn ended and was asked again at once, before the waiting thread woke): a
    code model's first token came only after the chat model's 400 tokens."""
    overlap = Overlap()
    shared = Turns()
    first = FakeBackend(reply="word " * 2000, name="fake:chat", step_delay_s=0.002)
    second = FakeBackend(reply="code " * 50, name="fake:code", step_delay_s=0.002)
    overlap.watch(first, "first", "decode")
    overlap.watch(second, "second", "decode")
    with Engine(first, turns=shared) as a, Engine(second, turns=shared) as b:
        long = a.chat([Message("user", "Go on.")], SamplingParams(max_tokens=1500))
        time.sleep(0.1)  # generating now
        short = b.chat([Message("user", "Complete.")], SamplingParams(max_tokens=20)).result()
        long.cancel()
    assert short.usage.completion_tokens == 20 and overlap.most == 1
    # The second's steps ran between the first's, not after its reply: it ended while the
    # first had made a few dozen of its 1,500 tokens.
    second_end = max(end for _, end in overlap.spans["second"])
    assert len([s for s, _ in overlap.spans["first"] if s < second_end]) < 500
