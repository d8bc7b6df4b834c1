"""``localinfer bench --prefill``: prompt reading at agent lengths, for each attention set-up.

Prefill is compute-bound and sets the time to the first token; a coding agent's every request
repeats a 10k-30k-token system prompt and tool list. How fast a CPU reads one depends on
settings whose best values depend on the CPU, the model and the length: flash attention (on a
CPU it computes attention in tiles instead of materialising the whole score matrix, which
pays at long positions) and the physical batch (``n_ubatch``: rows computed per graph). So
this measures them rather than assuming: each set-up loads the model once, with one slot and
a context that holds the longest prompt, and reads a prompt of each length with its cache
emptied first, timed by the engine from admission to the first token.

The figures are the engine's own; ``bench/prefill_lengths.py`` puts them beside
``llama-bench -p`` and llama-server on the same file.
"""

from __future__ import annotations

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
from .engine_bench import _PARAGRAPH, Progress

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


SETUPS = (Setup(False, 256), Setup(False, 512), Setup(True, 256), Setup(True, 512))


def prefill_lengths(model_ref: str, config: Config, *, lengths: Sequence[int] = LENGTHS,
                    setups: Sequence[Setup] = SETUPS, progress: Progress | None = None,
                    ) -> dict[str, Any]:
    """Prefill rate and TTFT of a fresh prompt of each length, for each set-up: a row per
    (set-up, length), with the model's name and the lengths its context allowed."""
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
    total = len(setups) * len(usable)
    done = 0
    for setup in setups:
        # cpu_window_ubatch 0: the physical batch is n_ubatch whatever the model's layers.
        options = replace(base, n_ctx=n_ctx, n_slots=1, flash_attn=setup.flash_attn,
                          n_ubatch=setup.n_ubatch, cpu_window_ubatch=0,
                          n_batch=max(base.n_batch, setup.n_ubatch))
        engine = load_engine(model.path, options, name=model.name, family=model.family,
                             header=header).wait_ready()
        try:
            filler = engine.tokenize(_PARAGRAPH * 8)
            for n in usable:
                done += 1
                if progress is not None:
                    progress(f"{setup.label}, {n} tokens", done, total)
                rows.append({"flash_attn": setup.flash_attn, "n_ubatch": setup.n_ubatch,
                             **read_fresh(engine, filler, n)})
        finally:
            engine.close()
    load = window.finish()
    choice = None
    if not base.n_gpu_layers and not base.rpc_servers:  # the CPU's set-ups: what loads use
        attention.record(hardware, model.path, model.name, rows, busy_share=load.busy_share)
        rule = physical_batch(base.n_batch, Candidate.from_header(header, name=model.name),
                              cpu_only=True)
        choice = attention_for(model.path, hardware, base, rule)
    if choice is not None:
        verdict = f"loads of {model.name} on this CPU now take {choice.reason}"
    elif load.busy_share > attention.BUSY_LIMIT:
        verdict = (f"measured under load ({load.describe()}): kept, not used by loads; run it"
                   " again on a quieter machine")
    else:
        verdict = "loads keep their default set-up (flash attention off on the CPU)"
    return {"model": model.name, "machine": hardware.cpu.model or "unknown CPU",
            "threads": base.n_threads or hardware.cpu.runtime_threads,
            "trained_ctx": trained, "load": load.describe(), "verdict": verdict,
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


def best_by_length(rows: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The fastest set-up at each length."""
    best: dict[int, dict[str, Any]] = {}
    for row in rows:
        n = row["tokens"]
        if n not in best or row["prefill_tps"] > best[n]["prefill_tps"]:
            best[n] = row
    return best


def report(result: dict[str, Any]) -> str:
    """A table: a row per set-up, a column per length (tok/s, TTFT), the best marked."""
    rows = result["rows"]
    lengths = sorted({r["tokens"] for r in rows})
    best = best_by_length(rows)
    lines = [f"{result['model']} on {result['machine']}, {result['threads']} threads:"
             " prefill tok/s (TTFT s) of a fresh prompt, * the fastest at its length", "",
             f"  {'set-up':<36}" + "".join(f"{n:>18,}" for n in lengths)]
    for setup in sorted({(r["flash_attn"], r["n_ubatch"]) for r in rows}):
        cells = []
        for n in lengths:
            row = next((r for r in rows if (r["flash_attn"], r["n_ubatch"]) == setup
                        and r["tokens"] == n), None)
            if row is None:
                cells.append(f"{'-':>18}")
                continue
            mark = "*" if best[n] is row else " "
            cells.append(f"{row['prefill_tps']:>9.0f} ({row['ttft_ms'] / 1000:5.1f}){mark}")
        lines.append(f"  {Setup(*setup).label:<36}" + "".join(cells))
    lines += ["", f"  {result['load']}: {result['verdict']}"]
    return "\n".join(lines)
