"""The prefix cache on disk (runtime/disk_cache.py) on the fake backend: which prefixes are
saved, a later engine (a restarted daemon) restoring them, usage counting them, and the faults:
a torn, truncated or foreign file, a writer killed mid-save, a full disk. Each leaves the
engine serving and the directory holding only whole files."""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localinfer.runtime.checkpoints import REREAD_TAIL
from localinfer.runtime.disk_cache import (
    SUFFIX,
    TMP_PREFIX,
    PrefixCache,
    PrefixStore,
    Saved,
    identity,
)
from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend
from localinfer.runtime.types import Message, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=4)
MARKED = SamplingParams(temperature=0, max_tokens=4, cache_prompt=True)
SYSTEM = " ".join(f"rule{i}" for i in range(300))  # ~600 fake tokens
CHAT = [Message("system", SYSTEM), Message("user", "What now?")]


def engine_with(directory: Path, *, name: str = "fake:test", max_bytes: int = 10**9,
                min_tokens: int = 64, cut_back: bool = False, **kwargs) -> Engine:
    backend = FakeBackend(reply="Fine.", name=name, **kwargs)
    store = PrefixStore(directory, max_bytes)
    cache = PrefixCache(store, identity("model-file", backend.state_format),
                        min_tokens=min_tokens, reread_tail=REREAD_TAIL, cut_back=cut_back)
    return Engine(backend, prefix_cache=cache)


def ask(engine: Engine, params: SamplingParams = GREEDY, messages=CHAT):
    done = engine.chat(messages, params).result()
    store = engine._kept.disk.store
    store.flush()
    return done


def files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SUFFIX}"))


def test_a_prompt_read_twice_is_saved_and_restored_after_a_restart(tmp_path):
    directory = tmp_path / "kv"
    with engine_with(directory) as engine:
        first = ask(engine)
        assert files(directory) == []  # read once: not saved
        second = ask(engine)  # read again (from its slot): saved where its reading begins
        assert second.usage.cached_tokens == len_prompt(engine) - REREAD_TAIL
        assert second.timings.restored_tokens == 0
    saved = files(directory)
    assert len(saved) == 1 and f"-{second.usage.cached_tokens}-" in saved[0].name
    with engine_with(directory) as engine:  # a new process: its slots are empty
        again = ask(engine)
        assert again.text == first.text
        assert again.usage.cached_tokens == again.timings.restored_tokens == \
            second.usage.cached_tokens
        assert again.timings.prefill_tokens == REREAD_TAIL
        assert engine.backend.loaded == [again.usage.cached_tokens]
        status = engine._kept.disk.store.status()
        assert status["hits"] == 1 and status["restored_tokens"] == again.usage.cached_tokens


def test_a_prompt_its_slot_held_is_saved_after_its_first_token_where_states_cut_back(
        tmp_path):
    """Without sliding-window layers a restored state can be cut back: a prompt read again
    from its slot is saved whole once its first token is out (the copy, ~140 ms for a
    20k-token prefix here, would otherwise come before that token), and restored cut to
    leave the tail every request reads again."""
    directory = tmp_path / "kv"
    with engine_with(directory, cut_back=True) as engine:
        first = ask(engine)
        second = ask(engine)
        assert second.usage.cached_tokens == len_prompt(engine) - REREAD_TAIL
        assert engine.backend.saved == [len_prompt(engine)]
        ask(engine)  # asked a third time: saved already
        assert engine.backend.saved == [len_prompt(engine)]
    with engine_with(directory, cut_back=True) as engine:
        again = ask(engine)
        assert again.text == first.text
        assert again.timings.restored_tokens == len_prompt(engine) - REREAD_TAIL
        assert again.timings.prefill_tokens == REREAD_TAIL
        assert engine.backend.loaded == [len_prompt(engine)]


def test_a_window_models_prompt_its_slot_held_is_saved_after_its_first_token(tmp_path):
    """A sliding-window cache cannot be cut back: a prompt read again from its slot (there by
    the checkpoint taken where its reply began) is saved after its first token, whole, with
    that checkpoint of its window layers (saving the prefix alone would have to come before
    that token: ~140 ms for a 20k-token prefix here). A new process restores it there."""
    directory = tmp_path / "kv"
    with engine_with(directory, window=4, chat_checkpoints=True) as engine:
        first = ask(engine)
        second = ask(engine)
        n = len_prompt(engine) - REREAD_TAIL
        assert second.usage.cached_tokens == n
        assert engine.backend.saved == [len_prompt(engine)]  # the prompt, not the prefix
    (path,) = files(directory)
    assert f"-{n}-" in path.name
    with engine_with(directory, window=4, chat_checkpoints=True) as engine:
        again = ask(engine)
        assert again.text == first.text
        assert again.timings.restored_tokens == n
        assert again.timings.prefill_tokens == REREAD_TAIL
        assert engine.backend.loaded == [len_prompt(engine)]
        assert engine.backend.restored == [n]  # cut back to the prefix by its checkpoint


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_window_models_damaged_checkpoint_is_skipped_and_removed(tmp_path, damage, caplog):
    """The window layers' checkpoint ends the file: a torn or flipped one fails the file's
    checksum like its state would, and is never given to the backend."""
    directory = tmp_path / "kv"
    window = {"window": 4, "chat_checkpoints": True}
    with engine_with(directory, **window) as engine:
        expected = ask(engine).text
        ask(engine)
    (path,) = files(directory)
    data = path.read_bytes()
    path.write_bytes(data[:-5] if damage == "truncated"
                     else data[:-3] + bytes([data[-3] ^ 0xFF]) + data[-2:])
    with engine_with(directory, **window) as engine:
        done = ask(engine)
        assert done.text == expected and done.timings.restored_tokens == 0
        assert engine.backend.loaded == [] and engine.backend.restored == []
        assert engine._kept.disk.store.counters.bad_files == 1
    assert "prefix cache: skipping" in caplog.text


def test_read_before_holds_across_restarts(tmp_path):
    """Read once in one process, once in the next: saved then (the directory's ledger says
    it was read before), restored in the third."""
    directory = tmp_path / "kv"
    with engine_with(directory) as engine:
        ask(engine)
    assert files(directory) == []
    with engine_with(directory) as engine:
        assert ask(engine).usage.cached_tokens == 0
    assert len(files(directory)) == 1
    with engine_with(directory) as engine:
        assert ask(engine).timings.restored_tokens == len_prompt(engine) - REREAD_TAIL


def test_the_ledger_takes_other_processes_lines_and_a_torn_last_line(tmp_path):
    directory = tmp_path / "kv"
    one, two = PrefixStore(directory, 10**9), PrefixStore(directory, 10**9)
    assert one.remember(["a" * 32, "b" * 32]) == set()
    assert two.remember(["b" * 32, "c" * 32]) == {"b" * 32}
    with open(directory / "read-prefixes", "a") as ledger:
        ledger.write("d" * 16)  # a line another process is still writing
    assert one.remember(["c" * 32, "d" * 32]) == {"c" * 32}


def len_prompt(engine: Engine) -> int:
    return len(engine.chat_tokens(CHAT))


def test_a_marked_prompt_is_saved_on_its_first_reading_at_its_turn_ends(tmp_path):
    directory = tmp_path / "kv"
    long_chat = [Message("user", SYSTEM), Message("assistant", "Noted."),
                 Message("user", "And then?")]
    with engine_with(directory) as engine:
        ask(engine, MARKED, long_chat)
        tokens = engine.chat_tokens(long_chat)
    lengths = sorted(int(p.name.split("-")[1]) for p in files(directory))
    end = engine.backend._id("<end_of_turn>")
    turn_ends = [i + 1 for i, t in enumerate(tokens) if t == end]
    # The first turn's end (a new conversation that starts alike finds it) and the prompt's.
    assert lengths == [turn_ends[0], len(tokens) - REREAD_TAIL]
    follow_up = [long_chat[0], Message("assistant", "Noted."), Message("user", "Other?")]
    with engine_with(directory) as engine:
        done = ask(engine, GREEDY, follow_up)
        assert done.timings.restored_tokens == turn_ends[0]


def test_short_prompts_and_an_off_cache_save_nothing(tmp_path):
    directory = tmp_path / "kv"
    with engine_with(directory, min_tokens=5000) as engine:
        for _ in range(3):
            ask(engine, MARKED)
    assert files(directory) == []


def test_lru_bound(tmp_path):
    directory = tmp_path / "kv"
    with engine_with(directory) as engine:
        ask(engine, MARKED)
        size = sum(p.stat().st_size for p in files(directory))
    with engine_with(directory, max_bytes=int(size * 1.5)) as engine:
        other = [Message("system", SYSTEM + " extra"), Message("user", "Else?")]
        ask(engine, MARKED, other)
        kept = files(directory)
        assert len(kept) == 1 and sum(p.stat().st_size for p in kept) <= size * 1.5
        assert engine._kept.disk.store.counters.evicted == 1


@pytest.mark.parametrize("damage", ["truncated", "flipped", "foreign", "garbage", "huge",
                                    "nested"])
def test_a_damaged_or_foreign_file_is_skipped_removed_and_never_loaded(tmp_path, damage,
                                                                      caplog):
    directory = tmp_path / "kv"
    with engine_with(directory) as engine:
        ask(engine, MARKED)
        expected = ask(engine).text
    (path,) = files(directory)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:-5])
    elif damage == "flipped":
        path.write_bytes(data[:-3] + bytes([data[-3] ^ 0xFF]) + data[-2:])
    elif damage == "garbage":
        path.write_bytes(b"not a cache file at all")
    elif damage == "nested":  # a header deeper than Python's json recurses
        path.write_bytes(data[:8] + struct.pack("<I", 60_000) + b"[" * 60_000)
    elif damage == "huge":  # a whole header that asks for a terabyte: refused before it is taken
        (n_header,) = struct.unpack("<I", data[8:12])
        header = json.loads(data[12:12 + n_header])
        header["state_bytes"] = 10**12
        new = json.dumps(header).encode()
        path.write_bytes(data[:8] + struct.pack("<I", len(new)) + new + data[12 + n_header:])
    else:  # another model's file under this model's name (a copy, a collision)
        with engine_with(tmp_path / "other", name="fake:other") as other:
            ask(other, MARKED)
        (foreign,) = files(tmp_path / "other")
        path.write_bytes(foreign.read_bytes())
    with engine_with(directory) as engine:
        done = ask(engine)
        assert done.text == expected and done.timings.restored_tokens == 0
        assert engine.backend.loaded == []
        assert engine._kept.disk.store.counters.bad_files == 1
    assert "prefix cache: skipping" in caplog.text
    # Removed, then saved anew whole by the request that read it again.
    assert all(p.read_bytes()[:8] == b"LIKVPC01" for p in files(directory))


def test_a_full_disk_leaves_no_file_and_the_engine_serving(tmp_path, monkeypatch, caplog):
    directory = tmp_path / "kv"
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with engine_with(directory) as engine:
        first = ask(engine, MARKED)
        assert engine._kept.disk.store.counters.failed_saves == 1
        # No file, whole or torn (the lock, the ledger of prefixes read).
        assert sorted(p.name for p in directory.iterdir()) == [".lock", "read-prefixes"]
        assert "the disk is full" in caplog.text
        monkeypatch.setattr(os, "fsync", real_fsync)  # room again
        assert ask(engine).text == first.text  # still serving, and saving
    with engine_with(directory) as engine:
        assert ask(engine).timings.restored_tokens > 0


def test_a_writer_killed_mid_save_leaves_only_a_temporary_file_that_is_swept(tmp_path):
    """kill -9 between the temporary file's first bytes and its rename: the next process
    finds no cache file, removes the dead writer's leftover and saves whole files."""
    directory = tmp_path / "kv"
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from localinfer.runtime import disk_cache
        real_fsync = os.fsync
        def die(fd):
            print("writing", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        os.fsync = die
        store = disk_cache.PrefixStore(disk_cache.Path({str(directory)!r}), 10**9)
        store.save("x" * 64, list(range(100)), disk_cache.Saved(bytes(10**6), 100))
        store.flush(60)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    leftovers = [p for p in directory.iterdir() if p.name.startswith(TMP_PREFIX)]
    assert leftovers and files(directory) == []
    with engine_with(directory) as engine:
        ask(engine, MARKED)
    assert not [p for p in directory.iterdir() if p.name.startswith(TMP_PREFIX)]
    assert len(files(directory)) == 1


def test_two_stores_on_one_directory_write_the_same_prefixes_at_once(tmp_path):
    """Two daemons of one home saving alike at the same time: every file whole, one per
    prefix, and the one read back is the one asked for."""
    directory = tmp_path / "kv"
    stores = [PrefixStore(directory, 10**9) for _ in range(2)]
    ident = identity("model-file", "fake fake:test")
    states = {n: bytes([n % 251]) * (200_000 + n) for n in range(100, 110)}
    for n, state in states.items():
        for store in stores:
            saved = Saved(state, n)
            assert store.save(ident, list(range(n)), saved) or store.flush() or \
                store.save(ident, list(range(n)), saved)
    for store in stores:
        store.flush()
    assert len(files(directory)) == len(states)
    reader = PrefixStore(directory, 10**9)
    for entry in reader.entries():
        read = reader.read(entry, ident, list(range(entry.n_tokens)))
        assert read is not None and read.state.tobytes() == states[entry.n_tokens]
    assert reader.counters.bad_files == 0


def test_the_daemon_serves_past_a_foreign_file_and_ps_and_cache_show_it(home, monkeypatch):
    """Through the daemon and the real openai SDK: a file of another model under this
    model's name is skipped and removed (the reply is a 200), the prompt read again is saved
    anew; ``ps`` and /localinfer/status show the cache's size and hit rate, and
    ``localinfer cache`` lists and clears it."""
    from daemon_util import install_fake_models, openai_client, serve
    from localinfer.paths import get_paths
    from localinfer.runtime.disk_cache import open_store
    from test_cli_daemon import cli

    monkeypatch.delenv("LOCALINFER_HOST", raising=False)
    install_fake_models("fake:1b-f16")
    store = open_store(get_paths().prefix_cache_dir, 10**9)

    def factory(model, num_ctx, progress=None):
        backend = FakeBackend(reply="Fine.", name=model.name)
        cache = PrefixCache(store, identity("fake-file", backend.state_format),
                            min_tokens=64, reread_tail=REREAD_TAIL, label=model.name)
        return Engine(backend, prefix_cache=cache)

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Now?"}]
    with serve(factory) as d:
        d.daemon.state.prefix_cache = store  # as `serve` hands it over
        client = openai_client(d)

        def ask():
            reply = client.chat.completions.create(model="fake:1b", messages=messages,
                                                   max_tokens=4, temperature=0)
            store.flush()
            return reply

        n = ask().usage.prompt_tokens
        ask()  # read again: saved
        (path,) = files(store.directory)
        path.write_bytes(path.read_bytes().replace(b'"identity": "', b'"identity": "0', 1))
        # As after a restart: nothing in memory.
        d.daemon.state.manager.loaded["fake:1b-f16"].engine.clear_cache()
        assert ask().usage.prompt_tokens_details.cached_tokens == 0  # served, from scratch
        assert store.counters.bad_files == 1
        ask()  # read again: saved whole
        d.daemon.state.manager.loaded["fake:1b-f16"].engine.clear_cache()
        assert ask().usage.prompt_tokens_details.cached_tokens == n - REREAD_TAIL  # from disk
        with d.uds() as http:
            cache = http.get("/localinfer/status").json()["prefix_cache"]
        assert cache["hits"] >= 1 and cache["entries"] == 1 and cache["bad_files"] == 1
        out = cli("ps")
        assert out.returncode == 0, out.stderr
        line = next(line for line in out.stdout.splitlines() if line.startswith("prefix cache"))
        assert "in 1 prefix" in line and "lookups hit" in line and "tokens restored" in line
    listed = cli("cache")
    assert listed.returncode == 0, listed.stderr
    assert "in 1 saved prefix " in listed.stdout and "fake:1b-f16" in listed.stdout
    assert f"{n - REREAD_TAIL:,}" in listed.stdout
    assert json.loads(cli("cache", "--json").stdout)["entries"][0]["tokens"] == n - REREAD_TAIL
    cleared = cli("cache", "clear")
    assert cleared.returncode == 0 and "removed 1 saved prefix " in cleared.stdout
    assert files(store.directory) == []


def test_a_state_llama_cpp_refuses_is_removed_and_the_prompt_read(tmp_path, caplog):
    """A whole file of the right model whose state the backend refuses (a build whose
    format changed under the same version): removed, the request read from scratch."""
    directory = tmp_path / "kv"
    with engine_with(directory) as engine:
        tokens = engine.chat_tokens(CHAT)
        n = len(tokens) - REREAD_TAIL
        disk = engine._kept.disk
        disk.save(tokens[:n], Saved(b"too\x00few\x00cells", n))
        disk.store.flush()
        assert len(files(directory)) == 1
        done = ask(engine)
        assert done.usage.cached_tokens == 0 and engine.backend.loaded == []
        assert files(directory) == [] and disk.store.counters.bad_files == 1
    assert "refused its state" in caplog.text
