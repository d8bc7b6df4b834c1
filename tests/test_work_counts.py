"""runtime/workload.py: what a model's engines read and generate, counted by kind and kept
across processes; and the loads that weigh it (loading.options_for)."""

from __future__ import annotations

import fcntl
import json
import logging

from localinfer import gguf
from localinfer.config import Config
from localinfer.hardware import load_profile
from localinfer.loading import options_for, with_batches
from localinfer.planner.attention import record, workload_file, workload_seen
from localinfer.runtime import workload
from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend
from localinfer.runtime.types import SamplingParams
from localinfer.runtime.workload import DECAY_AT, SAVE_EVERY, Workload, WorkloadCounter
from test_attention import KINDS, PROFILES


def test_reads_are_prompts_by_length_or_turns_after_a_history(tmp_path):
    counter = WorkloadCounter(tmp_path / "w.json")
    counter.read(3000, 0)  # a fresh agent prompt: 3,000 tokens of a <= 4,096 prompt
    counter.read(1300, 1200)  # a next turn: 100 new tokens after a history
    counter.read(1300, 200)  # 1,100 new: a prompt, however much is cached
    counter.read(300, 0)
    counter.read(1300, 1300)  # all cached: nothing read
    counter.stepped([600])
    counter.stepped([10, 600, 511])  # two of the three before SHORT_POSITION
    counter.stepped([600] * 20)  # wider steps count as MAX_WIDTH
    counter.stepped([])
    assert counter.unsaved == Workload(requests=5, prompts={4096: 3000, 2048: 1100, 512: 300},
                                       turns=100, decode={1: 1, 3: 1, 8: 20},
                                       decode_short={3: 2})


def test_counts_of_two_processes_add_up_and_old_work_fades(tmp_path):
    path = tmp_path / "sub" / "w.json"
    first, second = WorkloadCounter(path), WorkloadCounter(path)
    first.read(100, 0)
    second.read(100, 0)
    second.stepped([600, 600])
    first.save()
    second.save()
    assert workload.load(path) == Workload(requests=2, prompts={128: 200}, decode={2: 2})
    second.save()  # nothing new: the file stays
    assert workload.load(path).requests == 2
    # Every SAVE_EVERY requests the next step adds the counts without waiting for the close,
    # and not while another process holds the file: they wait for the next step.
    for _ in range(SAVE_EVERY):
        first.read(100, 0)
    assert workload.load(path).requests == 2
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        first.stepped([600])
    assert workload.load(path).requests == 2 and first.unsaved.requests == SAVE_EVERY
    first.stepped([600])
    assert workload.load(path).requests == 2 + SAVE_EVERY and first.unsaved == Workload()
    assert workload.load(path).decode == {1: 2, 2: 2}
    # Steps after the last save are kept at the close, requests or not.
    first.stepped([600] * 3)
    first.save()
    assert workload.load(path).decode == {1: 2, 2: 2, 3: 3}
    # A file that has seen DECAY_AT requests is halved: the recent work weighs most.
    path.write_text(json.dumps(Workload(requests=DECAY_AT - 1, prompts={128: 1000}).to_json()))
    first.read(100, 0)
    first.save()
    assert workload.load(path) == Workload(requests=DECAY_AT // 2, prompts={128: 550})


def test_a_damaged_file_is_started_again_with_a_warning(tmp_path, caplog):
    path = tmp_path / "w.json"
    for text in ("{not json", '{"requests": 1}', '[1, 2]',
                 '{"requests": Infinity, "prompts": {}, "turns": 0, "decode": {}}',
                 '{"requests": 1, "prompts": {"8": 1e999}, "turns": 0, "decode": {}}',
                 '{"requests": -5, "prompts": {}, "turns": 0, "decode": {}}',
                 '{"requests": 1, "prompts": {"0": 3}, "turns": 0, "decode": {}}'):
        path.write_text(text)
        with caplog.at_level(logging.WARNING, logger="localinfer.runtime.workload"):
            assert workload.load(path) is None
        assert "ignoring the workload counts" in caplog.text
        caplog.clear()
        counter = WorkloadCounter(path)
        counter.read(10, 0)
        counter.save()
        assert workload.load(path) == Workload(requests=1, prompts={16: 10})
    # A file written before positions were counted is read.
    path.write_text('{"requests": 3, "prompts": {}, "turns": 0, "decode": {"2": 4}}')
    assert workload.load(path) == Workload(requests=3, decode={2: 4})
    # A file that cannot be written loses the counts, not the request.
    blocked = WorkloadCounter(tmp_path / "file" / "w.json")
    (tmp_path / "file").write_text("a file where the directory would be")
    blocked.read(10, 0)
    blocked.save()
    assert "cannot keep the workload counts" in caplog.text


def test_the_engine_counts_what_it_reads_and_generates(tmp_path):
    path = tmp_path / "w.json"
    engine = Engine(FakeBackend(n_slots=4), workload=path)
    try:
        params = SamplingParams(temperature=0, max_tokens=8, speculative=False)
        history = list(range(1, 700))
        engine.submit(history, params).result()
        turn = engine.submit(history + [5, 6, 7], params).result()  # a next turn
        streams = [engine.submit([100 + i, 7, 8, 9], params) for i in range(3)]
        for g in streams:
            g.result()
    finally:
        engine.close()  # adds the counts to the file
    seen = workload.load(path)
    assert seen is not None and seen.requests == 5
    assert seen.prompts == {1024: 699, 4: 12}
    assert seen.turns == turn.timings.prefill_tokens >= 3  # with what the cut-back re-read
    # Every generated token, at the width of the step it was in (8 tokens a request, the
    # first sampled from the prompt's read): the long prompts' after a history, the three
    # streams' after a line.
    assert sum(seen.decode.values()) == 2 * 7 and set(seen.decode) == {1}
    assert sum(seen.decode_short.values()) == 3 * 7 and set(seen.decode_short) <= {1, 2, 3}


def test_a_load_weighs_the_work_its_model_did_here(home, starter_path):
    """options_for on the real starter's header with this machine's measurement of every
    kind: one prompt of each length takes flash attention; the turns of long chats turn it
    off; many streams take it again."""
    hw = load_profile(PROFILES / "laptop-8gb-cpu.json")
    header = gguf.read_header(starter_path)
    record(hw, starter_path, "gemma3:270m", KINDS, busy_share=0.0)

    def load():
        return with_batches(options_for(header, Config(), hardware=hw, name="gemma3:270m",
                                        path=starter_path), header, "gemma3:270m")

    assert workload_seen(starter_path) is None and load().flash_attn is True
    counter = WorkloadCounter(workload_file(starter_path))
    for _ in range(40):
        counter.read(1300, 1200)
        for _ in range(10):
            counter.stepped([1300])
    counter.save()
    assert load().flash_attn is False  # measured: off, with its 512-row batches
    for _ in range(4000):
        counter.stepped([1300] * 4)
    counter.read(10, 0)
    counter.save()
    assert load().flash_attn is True
