"""The thread policy (runtime/threads.py): fed simulated step times, and driven by the engine
on the fake backend with a CPU cost model shared with a simulated busy process."""

from __future__ import annotations

import random
import time

import pytest

from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend, FakeCPU
from localinfer.runtime.threads import (
    LAST_INTERVAL_STEPS,
    WINDOW_STEPS,
    ThreadMemory,
    ThreadPolicy,
    ThreadTuner,
    others_running_now,
    step_group,
)
from localinfer.runtime.types import SamplingParams


def run(policy: ThreadPolicy, cpu: FakeCPU, steps: int, *, rows: int = 1,
        noise: float = 0.0, rng: random.Random | None = None) -> list[int]:
    """Feed ``policy`` ``steps`` steps costed by ``cpu``; the thread count of each step."""
    rng = rng or random.Random(0)
    used = []
    for _ in range(steps):
        threads = policy.next_threads
        seconds = cpu.step_seconds(rows, threads) * (1 + rng.uniform(-noise, noise))
        policy.record(threads, seconds, float(cpu.busy_cores))
        used.append(threads)
    return used


def test_a_busy_core_lowers_the_count_and_its_leaving_raises_it_again():
    cpu = FakeCPU(cores=2)
    policy = ThreadPolicy(max_threads=2)
    assert set(run(policy, cpu, 100)) == {2}
    cpu.busy_cores = 1
    used = run(policy, cpu, 100)
    # Settled within two windows; the later steps at 2 threads are the short periodic tries.
    assert used[-1] == 1 and used[20:].count(1) >= 76, used
    cpu.busy_cores = 0
    used = run(policy, cpu, 100)
    assert used[-1] == 2 and used[20:] == [2] * 80, used


def test_the_step_time_alone_lowers_the_count_without_a_load_figure():
    """A machine that gives no CPU figures: the jump in step time starts the try."""
    cpu = FakeCPU(cores=2)
    policy = ThreadPolicy(max_threads=2)
    for _ in range(50):
        policy.record(policy.next_threads, cpu.step_seconds(1, policy.next_threads), 0.0)
    cpu.busy_cores = 1
    for _ in range(50):
        policy.record(policy.next_threads, cpu.step_seconds(1, policy.next_threads), 0.0)
    assert policy.n_threads == 1


def test_recovery_without_a_load_figure_comes_from_the_periodic_try():
    cpu = FakeCPU(cores=2, busy_cores=1)
    policy = ThreadPolicy(max_threads=2, n_threads=1)
    cpu_free = FakeCPU(cores=2)
    for _ in range(10):
        policy.record(1, cpu.step_seconds(1, 1), 0.0)
    for _ in range(3 * LAST_INTERVAL_STEPS):
        if policy.n_threads == 2:
            break
        policy.record(policy.next_threads, cpu_free.step_seconds(1, policy.next_threads), 0.0)
    assert policy.n_threads == 2


def test_a_stable_machine_does_not_oscillate():
    for cores, busy in ((2, 0), (2, 1), (8, 0), (8, 3)):
        cpu = FakeCPU(cores=cores, busy_cores=busy)
        policy = ThreadPolicy(max_threads=cores)
        used = run(policy, cpu, 5000, noise=0.05, rng=random.Random(cores + busy))
        settled = used[-1]
        # It settles once (walking down one count at a time) and stays there: later steps
        # at another count are only the short tries.
        assert policy.switches <= cores - settled, (cores, busy, policy.switches)
        assert used[2500:].count(settled) >= 0.97 * 2500, (cores, busy)


def flapping(policy: ThreadPolicy, cpu: FakeCPU, windows: int, steps: int = 3000) -> list[int]:
    """Steps whose other processes' load reads 0.7 and 0.3 cores by turns, ``windows``
    windows each: around both thresholds of a 2-core machine."""
    used = []
    for step in range(steps):
        others = 0.7 if (step // (WINDOW_STEPS * windows)) % 2 else 0.3
        threads = policy.next_threads
        policy.record(threads, cpu.step_seconds(1, threads), others)
        used.append(threads)
    return used


@pytest.mark.parametrize("windows", [1, 2, 3])
def test_a_load_that_comes_and_goes_at_the_threshold_is_not_tried_at_every_edge(windows):
    """Background work on a laptop: the other processes' CPU use goes above and below what
    counts as crowded every few windows, and one thread fewer is twice as slow each time."""
    policy = ThreadPolicy(max_threads=2)
    used = flapping(policy, FakeCPU(cores=2), windows)
    # The first edge tries one fewer; later ones at the same load do not (each edge used to
    # try it: 374, 250 and 166 steps at 1 thread).
    assert used.count(1) <= 12, used.count(1)
    assert policy.switches == 0


@pytest.mark.parametrize("windows", [1, 2, 3])
def test_a_core_that_comes_and_goes_is_tried_within_the_budget(windows):
    """At 1 thread beside a busy core whose process pauses now and then: each pause looks
    like a free core, and 2 threads are 1.5x slower each time they are tried."""
    policy = ThreadPolicy(max_threads=2, n_threads=1)
    used = flapping(policy, FakeCPU(cores=2, busy_cores=1), windows)
    # A try loses one step's time; they come at most once per 1 / TRY_BUDGET steps of it
    # (every free-core edge used to try: 374, 250 and 168 steps at 2 threads).
    assert used.count(2) <= 0.04 * len(used), used.count(2)
    assert policy.switches == 0


def test_a_core_that_stays_free_after_a_try_that_lost_is_taken():
    cpu = FakeCPU(cores=2, busy_cores=1)
    policy = ThreadPolicy(max_threads=2, n_threads=1)
    used: list[int] = []
    while used[-2:] != [2, 1]:  # the busy process pauses: a free core is tried, and loses
        used.append(threads := policy.next_threads)
        policy.record(threads, cpu.step_seconds(1, threads), 0.3)
    assert policy.n_threads == 1
    cpu.busy_cores = 0  # the other process ends, while later tries wait
    used = run(policy, cpu, 200)
    assert used[-1] == 2 and used[100:] == [2] * 100, used


def test_a_core_taken_after_a_try_that_lost_still_lowers_the_count():
    cpu = FakeCPU(cores=2)
    policy = ThreadPolicy(max_threads=2)
    run(policy, cpu, 60)
    tried = []
    for _ in range(60):  # a burst of CPU elsewhere that does not slow the steps
        tried.append(threads := policy.next_threads)
        policy.record(threads, cpu.step_seconds(1, threads), 0.7)
    assert 1 in tried and policy.n_threads == 2  # one fewer was tried, and lost
    cpu.busy_cores = 1  # now a core is taken: the steps slow down
    used = run(policy, cpu, 100)
    assert used[-1] == 1 and used[20:].count(1) >= 76, used


def test_a_much_slower_count_is_given_up_after_two_steps():
    """Under heavy load 2 threads can be several times slower than 1: each periodic try of
    them costs one step, not a window, and the tries back off until they cost at most
    TRY_BUDGET of the time."""
    cpu = FakeCPU(cores=2, busy_cores=1, barrier_wait=10.0)  # 2 threads 7.5x slower
    policy = ThreadPolicy(max_threads=2)
    used = run(policy, cpu, 3000, noise=0.05)
    tries = sum(1 for a, b in zip(used[100:], used[101:], strict=False) if (a, b) == (1, 2))
    assert used[-1] == 1 and used[100:].count(2) == tries
    lost = 6.5 * tries  # each try's step at 2 threads cost 6.5 steps more than at 1
    assert lost <= 0.05 * 2900, tries
    assert 2 <= tries


def test_an_idle_machine_at_all_cores_never_tries_fewer():
    """No loss when idle: with no other process taking CPU and a steady step time, every
    step runs with all cores."""
    cpu = FakeCPU(cores=4)
    policy = ThreadPolicy(max_threads=4)
    assert set(run(policy, cpu, 3000, noise=0.05)) == {4}


def test_equal_counts_within_the_margin_stay_put():
    """Two counts that cost the same (within noise) never take turns."""
    policy = ThreadPolicy(max_threads=2)
    rng = random.Random(3)
    for _ in range(4000):
        policy.record(policy.next_threads, 0.02 * (1 + rng.uniform(-0.04, 0.04)), 1.0)
    assert policy.switches == 0


def test_each_kind_of_step_has_its_own_count():
    """One-row decode steps and prompt chunks are judged apart; a prompt chunk's count goes
    to n_threads_batch, a one-row step's to n_threads."""
    applied = []
    tuner = ThreadTuner(2, lambda n, nb: applied.append((n, nb)), cpu_seconds=lambda: (0.0, 0.0))
    policy = ThreadPolicy(max_threads=2, n_threads=1)
    tuner.policies[step_group(1)] = policy
    with tuner.step(1):
        pass
    with tuner.step(512):
        pass
    assert applied == [(1, 2)]
    assert tuner.threads == {"1 row": 1, "65+ rows": 2}
    assert step_group(8) != step_group(9) != step_group(65)


def test_a_fixed_count_is_never_changed():
    applied = []
    tuner = ThreadTuner(0, lambda n, nb: applied.append((n, nb)))
    for _ in range(3 * WINDOW_STEPS):
        with tuner.step(1):
            pass
    assert applied == [] and tuner.threads == {}


@pytest.fixture
def busy_engine():
    # Wide margins (idle: 10 against 20 ms a step; busy: 20 against 60), as the steps are
    # real sleeps on a machine that other tests may load.
    cpu = FakeCPU(cores=2, step_s=0.02, barrier_wait=4.0)
    backend = FakeBackend(" ".join(f"w{i}" for i in range(60)), cpu=cpu)
    engine = Engine(backend)
    engine.thread_tuner.cpu_seconds = cpu.cpu_seconds
    engine.thread_tuner.running_now = cpu.running_now
    engine.thread_tuner._samples.clear()  # measured from here on, by the cost model
    engine.thread_tuner._sample_load(time.perf_counter())
    yield engine, backend, cpu
    engine.close()


def test_the_engine_follows_a_busy_core_and_back(busy_engine):
    engine, backend, cpu = busy_engine
    params = SamplingParams(temperature=0, speculative=False)
    cpu.busy_cores = 1
    engine.complete("Busy", params).result()
    assert backend.threads[0] == 1
    cpu.busy_cores = 0
    engine.complete("Idle again", params).result()
    assert backend.threads[0] == 2
    assert (1, 2) in backend.thread_changes and backend.thread_changes[-1] == (2, 2)


def test_embeddings_run_at_the_count_the_load_leaves(busy_engine):
    """A decode that embeds is a step of its own kind for the tuner, and a request to embed
    that comes to an idle engine starts from the cores the load leaves now: with a core kept
    busy, the one left (a 117-token input took 510-760 ms at 2 threads of 2 against 325-330
    ms at 1 on a 2-core CPU), and both once it has gone. It used to run at the count the
    model loaded with, whatever the load."""
    from localinfer.runtime.threads import EMBED_GROUP

    engine, backend, cpu = busy_engine
    cpu.busy_cores = 1
    time.sleep(0.15)  # long enough for a load figure
    vectors = engine.embed([engine.embedding_tokens("def f(x): return x")]).vectors
    assert len(vectors) == 1
    assert engine.thread_tuner.threads == {EMBED_GROUP: 1}
    assert backend.threads[1] == 1
    cpu.busy_cores = 0  # the load leaves: the next request starts from both cores
    time.sleep(0.15)
    engine.embed([engine.embedding_tokens("def g(y): return y")])
    assert engine.thread_tuner.threads == {EMBED_GROUP: 2}
    assert backend.threads[1] == 2


def test_without_a_cost_model_the_engine_sets_no_threads(fake_engine):
    engine = fake_engine(reply="a b c d e f g h i j k l m n o p")
    engine.complete("x", SamplingParams(temperature=0)).result()
    assert engine.backend.thread_changes == []


def test_the_bench_busy_row_runs_each_count_and_stops_its_busy_process():
    import psutil

    from localinfer.bench.engine_bench import busy_machine

    loaded = []

    def load(n_threads, adapt):
        cpu = FakeCPU(cores=2, step_s=0.002)
        engine = Engine(FakeBackend(" ".join(f"w{i}" for i in range(40)), cpu=cpu))
        if not adapt:  # as --threads N: the fake then keeps that count
            engine.backend.threads = (n_threads, n_threads)
            engine.thread_tuner.max_threads = 0
        loaded.append((n_threads, adapt, len(psutil.Process().children())))
        return engine

    result = busy_machine(load, all_threads=2, n_tokens=16, rounds=1)
    assert loaded == [(1, False, 0), (2, False, 0), (2, True, 0),
                      (1, False, 1), (2, False, 1), (2, True, 1)]
    assert psutil.Process().children() == []
    assert [row["load"] for row in result["rows"]] == ["idle", "one_core_busy"]
    assert all(len(row["adaptive_threads"]) == 1 for row in result["rows"])


def test_a_kind_of_step_starts_with_the_cores_the_load_leaves():
    tuner = ThreadTuner(4, lambda n, nb: None, cpu_seconds=lambda: (0.0, 0.0))
    tuner.others_cores = 2.8  # as sampled since the engine started
    with tuner.step(1):
        pass
    tuner.others_cores = 0.0
    with tuner.step(512):
        pass
    assert tuner.threads == {"1 row": 1, "65+ rows": 4}


@pytest.mark.parametrize("measured", [1, 2])
def test_a_new_kind_of_step_starts_from_the_count_another_kind_measured(measured):
    """A prompt's first long chunk can come long after the engine started: it takes the count
    the decode steps have measured, not the load of the moment (a client's burst of CPU as it
    opens its streams left a daemon's prompt chunks at 1 of 2 threads for good)."""
    tuner = ThreadTuner(2, lambda n, nb: None, cpu_seconds=lambda: (0.0, 0.0))
    tuner.policies[step_group(1)] = ThreadPolicy(max_threads=2, n_threads=measured)
    for _ in range(WINDOW_STEPS):
        with tuner.step(1):
            pass
    tuner.others_cores = 0.9 if measured == 2 else 0.0  # the moment says the other count
    with tuner.step(512):
        pass
    assert tuner.threads == {"1 row": measured, "65+ rows": measured}


@pytest.mark.model
def test_llama_cpp_runs_with_the_counts_set_and_writes_the_same_text(starter_path):
    """On the real model: the adaptive backend offers the cores, set_threads changes what
    llama.cpp runs with, and the greedy text does not depend on the count (each thread
    computes whole rows)."""
    import llama_cpp as L

    from localinfer.loading import load_engine
    from localinfer.runtime.backend import LoadOptions

    engine = load_engine(starter_path, LoadOptions(n_ctx=512, n_threads=2, adapt_threads=True),
                         name="gemma3:270m", family="gemma3")
    try:
        backend = engine.backend
        assert backend.adaptive_threads == 2
        params = SamplingParams(temperature=0, max_tokens=24, speculative=False)
        texts = []
        for counts in ((1, 1), (2, 2)):
            def pin(counts=counts):
                engine.thread_tuner.max_threads = 0  # the tuner leaves the count alone
                backend.set_threads(*counts)
                return L.llama_n_threads(backend._ctx), L.llama_n_threads_batch(backend._ctx)

            assert engine.run_on_worker(pin) == counts
            texts.append(engine.complete("The capital of France is", params).result().text)
        assert texts[0] == texts[1] and texts[0]
    finally:
        engine.close()


def test_the_embedding_context_runs_with_the_counts_set(starter_path):
    """On the real model: a generative model's embedding context (a second context) takes
    the counts set_threads gives, made before them or after."""
    import llama_cpp as L

    from localinfer.loading import load_engine
    from localinfer.runtime.backend import LoadOptions

    engine = load_engine(starter_path, LoadOptions(n_ctx=512, n_threads=2, adapt_threads=True),
                         name="gemma3:270m", family="gemma3")
    try:
        backend = engine.backend

        def counts(after: tuple[int, int]):
            backend.set_threads(*after)
            ctx = backend._embedding_context()
            return L.llama_n_threads(ctx), L.llama_n_threads_batch(ctx)

        engine.thread_tuner.max_threads = 0  # the tuner leaves the count alone
        assert engine.run_on_worker(lambda: counts((1, 1))) == (1, 1)  # made after
        assert engine.run_on_worker(lambda: counts((2, 1))) == (2, 1)  # made before
        assert engine.embed([engine.embedding_tokens("hello")]).vectors
    finally:
        engine.close()


def test_the_first_step_starts_from_the_load_measured_since_the_engine_started():
    """A process that took a core before the engine's first step (the bench's busy process,
    a build already running) counts at once: the step starts with the core it leaves, not at
    all cores until a figure comes half a second later."""
    import time

    start = time.perf_counter()

    def one_core_busy() -> tuple[float, float]:
        return time.perf_counter() - start, 0.0  # the others use one core; this process none

    tuner = ThreadTuner(2, lambda n, nb: None, cpu_seconds=one_core_busy)
    time.sleep(0.15)  # the engine's warm-up
    with tuner.step(1):
        pass
    assert tuner.threads == {"1 row": 1}
    assert tuner.others_cores == pytest.approx(1.0, abs=0.2)


def test_an_admission_starts_from_the_cores_other_processes_hold_now():
    """The load of the moment a request comes, not of the idle minutes before it: a reply of
    a hundred tokens has no time to learn it (item 5 of issue 35)."""
    import time

    cpu = FakeCPU(cores=2)
    tuner = ThreadTuner(2, lambda n, nb: None, cpu_seconds=cpu.cpu_seconds,
                        running_now=cpu.running_now, admit_span_s=0.1)  # the sleeps below

    def admit(busy: int) -> None:
        cpu.busy_cores = busy
        time.sleep(0.12)  # the idle time before the request: the load is measured over it
        tuner.admit()

    admit(0)
    with tuner.step(1):
        pass
    assert tuner.threads == {"1 row": 2}
    admit(1)
    assert tuner.threads == {"1 row": 1}
    with tuner.step(512):  # a kind not seen yet starts from the same figure
        pass
    assert tuner.threads == {"1 row": 1, "65+ rows": 1}
    admit(5)  # more than the cores: all of them
    assert tuner.others_cores == 2.0 and tuner.threads == {"1 row": 1, "65+ rows": 1}
    admit(0)
    assert tuner.threads == {"1 row": 2, "65+ rows": 2}


def test_a_clients_burst_before_its_request_is_not_a_busy_core():
    """The client that sends the request may keep a core busy for the moment before it (the
    streams bench's client between two runs: 0.1-0.3 s): over the admission's span the
    others used little, so the request starts at every core. A process that keeps a core
    busy over the span still counts."""
    import time

    cpu = FakeCPU(cores=2)
    tuner = ThreadTuner(2, lambda n, nb: None, cpu_seconds=cpu.cpu_seconds,
                        running_now=cpu.running_now, admit_span_s=0.5)
    time.sleep(0.55)
    with tuner.step(1):  # the last request's last step, where the load is sampled
        pass
    cpu.cpu_seconds()  # (the fake counts the load up to here at its last reading)
    cpu.busy_cores = 1  # the burst: the 0.12 s before the request, a thread running
    time.sleep(0.12)
    tuner.admit()
    assert tuner.threads == {"1 row": 2}
    time.sleep(0.6)  # that core stays busy over the span
    tuner.admit()
    assert tuner.threads == {"1 row": 1}


def test_a_busy_core_that_leaves_just_after_the_admission_is_given_back_at_once():
    """Another server that had just sent its last reply keeps its threads spinning a while,
    so the admission counts its cores; the first load sampled after the admission (after
    FIRST_SAMPLE_S, not LOAD_SAMPLE_S) shows them free, and the steps go back to every core
    without waiting for a window of steps to be judged."""
    import time

    cpu = FakeCPU(cores=2)
    tuner = ThreadTuner(2, lambda n, nb: None, cpu_seconds=cpu.cpu_seconds,
                        running_now=cpu.running_now, admit_span_s=0.1)
    with tuner.step(4):
        pass
    cpu.cpu_seconds()
    cpu.busy_cores = 2  # the other server's run
    time.sleep(0.3)
    tuner.admit()
    assert tuner.threads == {"2-8 rows": 1}
    cpu.cpu_seconds()
    cpu.busy_cores = 0  # its threads stop spinning
    time.sleep(0.12)
    with tuner.step(4):
        pass
    assert tuner.threads == {"2-8 rows": 2}
    time.sleep(0.12)
    cpu.busy_cores = 1  # a core kept busy stays counted after the recheck
    tuner.admit()
    time.sleep(0.12)
    with tuner.step(4):
        pass
    assert tuner.threads == {"2-8 rows": 1}


def test_a_thread_in_the_run_queue_for_a_moment_is_not_a_busy_core():
    """The client that sent the request (parsing the other streams it reads) is often in the
    run queue as the request comes; it used next to no CPU since the last step."""
    import time

    tuner = ThreadTuner(2, lambda n, nb: None, cpu_seconds=lambda: (0.0, 0.0),
                        running_now=lambda: 1)
    time.sleep(0.12)
    tuner.admit()
    with tuner.step(1):
        pass
    assert tuner.threads == {"1 row": 2}
    # A process's first request, just after the model's load, before any figure: the run
    # queue alone (`localinfer run` beside a busy core).
    first = ThreadTuner(2, lambda n, nb: None, cpu_seconds=lambda: (0.0, 0.0),
                        running_now=lambda: 1)
    first.admit()
    with first.step(1):
        pass
    assert first.threads == {"1 row": 1}


def test_an_unknown_load_leaves_the_counts_to_the_step_times():
    tuner = ThreadTuner(2, lambda n, nb: None, cpu_seconds=lambda: (0.0, 0.0),
                        running_now=lambda: None)
    tuner.policies[step_group(1)] = ThreadPolicy(max_threads=2, n_threads=1)
    tuner.admit()
    assert tuner.threads == {"1 row": 1}


def learn_one_thread(memory: ThreadMemory, monkeypatch) -> ThreadTuner:
    """A tuner at all cores of an idle machine whose steps then turn 5x slower at two threads
    than at one (a count the rule would not start from): it learns one, into ``memory``."""
    from types import SimpleNamespace

    from localinfer.runtime import threads as module

    clock = [0.0]
    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    tuner = ThreadTuner(2, lambda n, nb: None, cpu_seconds=lambda: (0.0, 0.0),
                        running_now=lambda: 0, memory=memory)
    tuner.admit()
    for step in range(WINDOW_STEPS * 4):
        threads = tuner.policies[step_group(1)].next_threads if tuner.policies else 2
        with tuner.step(1):
            clock[0] += 0.002 if threads == 1 or step < WINDOW_STEPS else 0.010
    monkeypatch.undo()
    return tuner


def test_a_learned_count_is_kept_for_the_next_process(tmp_path, monkeypatch):
    path = tmp_path / "threads" / "model.json"
    learned = learn_one_thread(ThreadMemory(path, 2), monkeypatch)
    assert learned.threads == {"1 row": 1} and path.is_file()

    def first_step(cores: int) -> dict[str, int]:
        """A new process's (`localinfer run` is one each time) count at its first step."""
        tuner = ThreadTuner(cores, lambda n, nb: None, cpu_seconds=lambda: (0.0, 0.0),
                            running_now=lambda: 0, memory=ThreadMemory(path, cores))
        tuner.admit()
        with tuner.step(1):
            pass
        return tuner.threads

    assert first_step(2) == {"1 row": 1}  # the learned count
    # Another core count (another machine's home, a changed --threads cap): not used.
    assert first_step(4) == {"1 row": 4}


def test_a_torn_memory_file_is_ignored_with_a_warning(tmp_path, caplog):
    path = tmp_path / "model.json"
    path.write_text('{"max_threads": 2, "counts": {"1 row@0": ')
    memory = ThreadMemory(path, 2)
    assert memory.counts == {} and "ignoring the learned thread counts" in caplog.text
    memory.learn("1 row", 0, 1)  # written over, whole
    assert ThreadMemory(path, 2).counts == {"1 row@0": 1}
    path.write_text('{"max_threads": 2, "counts": {"1 row@0": 7}}')  # more than the cores
    assert ThreadMemory(path, 2).counts == {}
    path.write_text("[" * 100_000)  # deeper than Python's json recurses
    assert ThreadMemory(path, 2).counts == {}


def test_the_run_queue_shows_a_process_that_keeps_a_core_busy():
    import subprocess
    import sys
    import time

    if others_running_now() is None:
        pytest.skip("this kernel has no /proc/stat run queue figure")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        seen = []
        for _ in range(10):
            seen.append(others_running_now())
            time.sleep(0.01)
    finally:
        spinner.kill()
        spinner.wait()
    assert all(isinstance(n, int) and n >= 0 for n in seen)
    assert max(seen) >= 1, seen


def test_the_engine_starts_a_busy_machine_at_the_core_left(busy_engine):
    engine, backend, cpu = busy_engine
    cpu.busy_cores = 1
    time.sleep(0.12)  # busy for a while before the request
    engine.complete("Busy", SamplingParams(temperature=0, speculative=False)).result()
    # The prompt's step (n_threads_batch), then the first decode step's (n_threads): at the
    # core left from the first, none at 2.
    assert backend.thread_changes[:2] == [(2, 1), (1, 1)]
