"""``localinfer bench --prefill``: prompt reading at agent lengths, a next turn and streams
generating, for each attention set-up.

Prefill is compute-bound and sets the time to the first token; a coding agent's every request
repeats a 10k-30k-token system prompt and tool list. How fast a CPU reads one depends on
settings whose best values depend on the CPU, the model and the length: flash attention (on a
CPU it computes attention in tiles instead of materialising the whole score matrix, which
pays at long positions) and the physical batch (``n_ubatch``: rows computed per graph). So
this measures them rather than assuming: each set-up loads the model once, with one slot and
a context that holds the longest prompt, and reads a prompt of each length with its cache
emptied first, timed by the engine from admission to the first token. The same set-ups
trade reading against generating (planner/attention.py weighs them by the work a daemon sees),
so each is also loaded with four slots and a short context to read a next turn after a
history and to generate with one stream and with four after it, and after a line.

The figures are the engine's own; ``bench/prefill_lengths.py`` puts them beside
``llama-bench -p`` and llama-server on the same file.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .. import gguf
from ..config import Config
from ..hardware import probe
from ..hardware.load import LoadWindow
from ..loading import attention_for, load_engine, options_for
from ..planner import Candidate, attention, physical_batch
from ..runtime.engine import Engine
from ..runtime.types import SamplingParams
from ..store import ModelStore
from .engine_bench import _PARAGRAPH, STORY_PROMPTS, Progress, _streams

TURN_HISTORY = 1200
"""The history a measured next turn's ``attention.TURN_NEW`` tokens are read after (a chat of
a few turns)."""
STREAMS = (1, 4)
"""Streams generating together, measured for each set-up after the next turns' history and
after a line (a story's first words)."""
STREAM_TOKENS = 32
"""Tokens each stream generates."""
REPEATS = 3
"""Runs of each next turn and each number of streams, of which the median counts."""
LENGTHS = (1024, 4096, 16384, 32000)
"""32,000 rather than 32,768: the prompt and the token it generates fit a 32k-trained model."""
QUICK_LENGTHS = (1024, 4096)


@dataclass(frozen=True)
class Setup:
    """One attention set-up: flash attention on or off, and the physical batch."""

    flash_attn: bool
    n_ubatch: int

    @property
    def label(self) -> str:
        return f"flash attention {'on' if self.flash_attn else 'off'}, ubatch {self.n_ubatch}"


SETUPS: tuple[Setup, ...] = (Setup(False, 256), Setup(False, 512), Setup(True, 256),
                            Setup(True, 512))


def parse_setups(text: str) -> tuple[Setup, ...]:
    """``off-256,on-512``: set-ups by flash attention (off, on) and physical batch (32 to
    4096 rows); ValueError naming what is not one."""
    setups = []
    for item in text.split(","):
        flash, _, rows = item.strip().partition("-")
        if flash not in ("off", "on") or not rows.isdigit() or not 32 <= int(rows) <= 4096:
            raise ValueError(f"{item.strip()!r} is not a set-up: write off-256, on-512, ..."
                             " (flash attention off or on, a batch of 32 to 4096 rows)")
        if Setup(flash == "on", int(rows)) not in setups:
            setups.append(Setup(flash == "on", int(rows)))
    return tuple(setups)


def prefill_lengths(model_ref: str, config: Config, *, lengths: Sequence[int] = LENGTHS,
                    setups: Sequence[Setup] = SETUPS, progress: Progress | None = None,
                    ) -> dict[str, Any]:
    """For each set-up: the prefill rate and TTFT of a fresh prompt of each length (rows of
    kind ``prompt``), a next turn's rate after a history (``turn``) and the rate of 1 and 4
    streams generating after it (``decode``) and after a line (``decode_short``; all three
    where the model's context holds them), with
    the model's name and what the choice of loads now is."""
    hardware = probe()
    model = ModelStore().resolve(model_ref)
    header = gguf.read_header(model.path)
    trained = header.context_length or max(lengths)
    usable = sorted(n for n in lengths if n + 16 <= trained)
    if not usable:
        raise ValueError(f"{model.name} was trained for {trained} tokens: none of the"
                         f" lengths {', '.join(map(str, lengths))} fits.")
    n_ctx = usable[-1] + 16
    base = options_for(header, config.replace(ctx=n_ctx), n_slots=1, hardware=hardware,
                       name=model.name)
    rows: list[dict[str, Any]] = []
    window = LoadWindow()  # other processes skew one set-up more than another
    total = len(setups) * (len(usable) + 1)
    work_ctx = TURN_HISTORY + (REPEATS + 1) * attention.TURN_NEW + STREAM_TOKENS
    done = 0

    def load(setup: Setup, n_ctx: int, n_slots: int) -> Engine:
        # cpu_window_ubatch 0: the physical batch is n_ubatch whatever the model's layers.
        options = replace(base, flash_attn=setup.flash_attn, n_ubatch=setup.n_ubatch,
                          cpu_window_ubatch=0, n_batch=max(base.n_batch, setup.n_ubatch),
                          n_ctx=n_ctx, n_slots=n_slots)
        return load_engine(model.path, options, name=model.name, family=model.family,
                           header=header).wait_ready()

    for setup in setups:
        tag = {"flash_attn": setup.flash_attn, "n_ubatch": setup.n_ubatch}
        engine = load(setup, n_ctx=n_ctx, n_slots=1)
        try:
            filler = engine.tokenize(_PARAGRAPH * 8)
            for n in usable:
                done += 1
                if progress is not None:
                    progress(f"{setup.label}, {n} tokens", done, total)
                rows.append({**tag, "kind": "prompt", **read_fresh(engine, filler, n)})
        finally:
            engine.close()
        done += 1
        if trained < work_ctx:
            continue
        if progress is not None:
            progress(f"{setup.label}, a next turn and {' and '.join(map(str, STREAMS))}"
                     " streams", done, total)
        # A load of its own: as many slots as streams, a context for the turn's history.
        engine = load(setup, n_ctx=work_ctx, n_slots=max(STREAMS))
        try:
            rate, history = next_turn(engine, filler)
            rows.append({**tag, "kind": "turn", "tokens": TURN_HISTORY, "tps": rate})
            rows += [{**tag, "kind": "decode", "tokens": width,
                      "tps": streams_after(engine, history, width)} for width in STREAMS]
            rows += [{**tag, "kind": "decode_short", "tokens": width, "tps": statistics.median(
                _streams(engine, STORY_PROMPTS[:width], GENERATE)[0] for _ in range(REPEATS))}
                for width in STREAMS]
        finally:
            engine.close()
    load_seen = window.finish()
    choice = None
    if not base.n_gpu_layers and not base.rpc_servers:  # the CPU's set-ups: what loads use
        attention.record(hardware, model.path, model.name, rows, busy_share=load_seen.busy_share)
        rule = physical_batch(base.n_batch, Candidate.from_header(header, name=model.name),
                              cpu_only=True)
        choice = attention_for(model.path, hardware, base, rule)
    if choice is not None:
        verdict = f"loads of {model.name} on this CPU now take {choice.reason}"
    elif load_seen.busy_share > attention.BUSY_LIMIT:
        verdict = (f"measured under load ({load_seen.describe()}): kept, not used by loads; run it"
                   " again on a quieter machine")
    else:
        verdict = "loads keep their default set-up (flash attention off on the CPU)"
    return {"model": model.name, "machine": hardware.cpu.model or "unknown CPU",
            "threads": base.n_threads or hardware.cpu.runtime_threads,
            "trained_ctx": trained, "load": load_seen.describe(), "verdict": verdict,
            "rows": rows}


def read_fresh(engine: Engine, filler: list[int], n: int) -> dict[str, Any]:
    """Read a prompt of exactly ``n`` tokens with an empty cache (as a prompt begins, with
    the model's BOS), and generate one token: the engine's prefill rate and TTFT for it."""
    engine.clear_cache()
    head = engine.completion_tokens(f"Sample {n}-{time.monotonic_ns()}.")
    tokens = head + filler * (n // max(1, len(filler)) + 1)
    done = engine.submit(tokens[:n], SamplingParams(temperature=0, max_tokens=1,
                                                    speculative=False)).result()
    t = done.timings
    return {"tokens": n, "prefill_tps": t.prefill_tps, "ttft_ms": t.ttft_ms,
            "cached_tokens": t.cached_tokens}


GENERATE = SamplingParams(temperature=0, max_tokens=STREAM_TOKENS, speculative=False)


def next_turn(engine: Engine, filler: list[int], repeats: int = REPEATS
              ) -> tuple[float, list[int]]:
    """Tokens per second of a next turn: ``attention.TURN_NEW`` tokens read after a history of
    ``TURN_HISTORY`` cached ones, each repeat one turn more (the median of ``repeats``); and
    the history with its turns, cached."""
    engine.clear_cache()
    head = engine.completion_tokens(f"Chat {time.monotonic_ns()}.")
    prompt = (head + filler * (TURN_HISTORY // max(1, len(filler)) + 1))[:TURN_HISTORY]
    once = SamplingParams(temperature=0, max_tokens=1, speculative=False)
    engine.submit(prompt, once).result()
    rates = []
    for i in range(repeats):
        prompt = prompt + filler[i * attention.TURN_NEW:(i + 1) * attention.TURN_NEW]
        rates.append(engine.submit(prompt, once).result().timings.prefill_tps)
    return statistics.median(rates), prompt


def streams_after(engine: Engine, history: list[int], width: int,
                  repeats: int = REPEATS) -> float:
    """Tokens per second of ``width`` streams generating together after ``history`` (cached),
    as a daemon generates: after a chat's or a file's tokens, not after a line. One stream
    reads it and the others copy its cache, as an editor's other completions do (greedy,
    they generate the same tokens, each its own row). The median of ``repeats``."""
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        first = engine.submit(history, GENERATE)
        others = [engine.submit(history, GENERATE, follows=first) for _ in range(width - 1)]
        tokens = sum(g.result().usage.completion_tokens for g in (first, *others))
        rates.append(tokens / (time.perf_counter() - started))
    return statistics.median(rates)


def best_by_work(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The fastest set-up for each kind and size of work."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        key = (row["kind"], row["tokens"])
        if key not in best or attention.row_tps(row) > attention.row_tps(best[key]):
            best[key] = row
    return best


def report(result: dict[str, Any]) -> str:
    """A table: a row per set-up; a column per prompt length (tok/s, TTFT s), then the next
    turn (tok/s of its new tokens) and each number of streams (tok/s together); the best
    marked."""
    rows = result["rows"]
    columns = sorted({(r["kind"], r["tokens"]) for r in rows},
                     key=lambda k: (list(attention.KINDS).index(k[0]), k[1]))
    heads = {"prompt": "{n:,}", "turn": "turn@{n:,}", "decode": "{n} stream(s)",
             "decode_short": "{n} after a line"}
    best = best_by_work(rows)
    lines = [f"{result['model']} on {result['machine']}, {result['threads']} threads:"
             " prefill tok/s (TTFT s) of a fresh prompt; tok/s of a next turn's"
             f" {attention.TURN_NEW} tokens after a history; tok/s of streams generating"
             " together; * the fastest", "",
             f"  {'set-up':<36}" + "".join(f"{heads[k].format(n=n):>18}" for k, n in columns)]
    for setup in sorted({(r["flash_attn"], r["n_ubatch"]) for r in rows}):
        cells = []
        for key in columns:
            row = next((r for r in rows if (r["flash_attn"], r["n_ubatch"]) == setup
                        and (r["kind"], r["tokens"]) == key), None)
            if row is None:
                cells.append(f"{'-':>18}")
                continue
            mark = "*" if best[key] is row else " "
            ttft = f" ({row['ttft_ms'] / 1000:5.1f})" if key[0] == "prompt" else ""
            cells.append(f"{attention.row_tps(row):>9.0f}{ttft}{mark}".rjust(18))
        lines.append(f"  {Setup(*setup).label:<36}" + "".join(cells))
    lines += ["", f"  {result['load']}: {result['verdict']}"]
    return "\n".join(lines)
