"""``localinfer bench``: how fast a model runs on this machine, and why, in one run.

Every figure is measured here, through the same engine that serves chats and editors:

- load time; prefill rate and time to first token at 128, 512 and 2048-token prompts;
- single-stream decode, as a share of the bare ``llama_decode`` step (the engine's overhead)
  and of the memory-bandwidth roofline (bytes read per token / measured bandwidth);
- aggregate decode with 1, 2, 4 and 8 concurrent streams (continuous batching), each stream's
  tokens compared with the same request run alone (``first_divergence``), with speculation
  off, on (every draft verified) and adaptive (the default: drafts verified where they pay),
  taking turns (medians of 3 rounds; 1 with ``--quick``);
- the 5th turn of a chat with ~1,500 tokens of history, with and without KV prefix reuse;
- decode on a code-edit request with and without prompt-lookup speculation;
- decode with a JSON schema's grammar against without, and a forced tool call's latency;
- decode on an idle machine and with one core kept busy by a process the bench starts, at
  1 thread, at all physical cores (llama.cpp's default) and with the adaptive count;
- (full mode) llama-cpp-python's own ``create_completion`` and ``Llama.eval`` on the same model.

The single-stream measurement is stored as a measured/predicted ratio so the planner's
predictions for this machine improve (``localinfer plan`` says when they are calibrated).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..config import Config
from ..runtime.engine import Engine, Generation
from ..runtime.grammar import json_grammar
from ..runtime.tools import FORMATS, ToolChoice, call_grammar, parse_reply, parse_tools
from ..runtime.types import Done, Message, SamplingParams

Progress = Callable[[str, int, int], None]
"""Called with (what is being measured, step number, number of steps)."""

STORY_PROMPTS = [f"Story {i}: Once upon a time, a {who} lived in" for i, who in enumerate(
    ["fox", "king", "robot", "sailor", "baker", "wizard", "cat", "farmer"])]

_PARAGRAPH = (
    "The committee met on a grey Tuesday morning to review the budget for the coming year."
    " Revenue from the northern office had grown by eleven percent, while costs in logistics"
    " rose faster than anyone had planned. After a long discussion about hiring, travel and"
    " the new warehouse, the members agreed to postpone two projects and to publish a short"
    " report for the staff before the end of the month. "
)


@dataclass
class BenchResult:
    model: str
    quant: str
    size_bytes: int
    machine: str
    threads: int
    n_gpu_layers: int
    n_layers: int
    quick: bool
    kv_type: str = "f16"
    flash_attn: bool | None = None
    """None: llama.cpp chose (on a GPU)."""
    load_ms: float = 0.0
    prefill: list[dict[str, float]] = field(default_factory=list)
    decode: dict[str, Any] = field(default_factory=dict)
    concurrency: list[dict[str, Any]] = field(default_factory=list)
    speculation_streams: list[dict[str, Any]] = field(default_factory=list)
    chat_reuse: dict[str, Any] = field(default_factory=dict)
    speculation: dict[str, Any] = field(default_factory=dict)
    structured: dict[str, Any] = field(default_factory=dict)
    raw_llama_cpp_python: dict[str, Any] = field(default_factory=dict)
    busy_machine: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def run_bench(model_ref: str, config: Config, *, quick: bool = False,
              progress: Progress | None = None) -> BenchResult:
    """Load ``model_ref`` and measure it (see the module docstring). Takes about 30 s with
    ``quick`` and a few minutes in full on a 2-core laptop with the starter model."""
    from .. import gguf
    from ..hardware import probe
    from ..hardware.load import LoadWindow
    from ..loading import load_engine, options_for
    from ..planner import Candidate, decode_bytes_per_token, predict
    from ..store import ModelStore

    stages = ["load", "prefill", "decode and the bare step", "concurrent streams",
              "speculation by streams", "chat prefix reuse", "speculation", "structured output",
              "calibration", "busy machine"]
    if not quick:
        stages.append("llama-cpp-python")
    step = iter(range(1, len(stages) + 1))

    def stage(name: str) -> None:
        if progress is not None:
            progress(name, next(step), len(stages))

    hardware = probe()
    model = ModelStore().resolve(model_ref)
    header = gguf.read_header(model.path)
    n_slots = 4 if quick else 8
    options = options_for(header, config.replace(ctx=config.ctx or 4096), n_slots=n_slots,
                          hardware=hardware, name=model.name, path=model.path)
    stage("load")
    started = time.perf_counter()
    engine = load_engine(model.path, options, name=model.name, family=model.family,
                         header=header)
    engine.wait_ready()
    info = engine.info
    result = BenchResult(
        model=info.name, quant=info.quant, size_bytes=info.size_bytes,
        machine=hardware.cpu.model or "unknown CPU",
        threads=options.n_threads or hardware.cpu.runtime_threads,
        n_gpu_layers=info.n_gpu_layers, n_layers=info.n_layers,
        quick=quick, kv_type=options.kv_type, flash_attn=info.flash_attn,
        load_ms=(time.perf_counter() - started) * 1000.0)
    try:
        stage("prefill")
        filler = engine.tokenize(_PARAGRAPH * 60)
        for n in ((128, 512) if quick else (128, 512, 2048)):
            if n + 8 > info.n_ctx:
                continue
            runs = [_prefill(engine, filler, n, k) for k in range(2)]
            best = max(runs, key=lambda d: d.timings.prefill_tps)
            result.prefill.append({"tokens": n, "prefill_tps": best.timings.prefill_tps,
                                   "ttft_ms": best.timings.ttft_ms})

        stage("decode and the bare step")
        n_decode = 64 if quick else 128
        greedy = SamplingParams(temperature=0, max_tokens=n_decode, speculative=False)
        # The bare llama_decode step is measured right before each run, so that both see
        # the machine in the same state (a laptop's clock moves with its temperature).
        runs, bare = [], []
        window = LoadWindow()  # the machine's load over the decode runs, for the calibration
        for k in range(3):
            bare.append(engine.measure_decode_step(32))
            runs.append(engine.complete(f"Run {k}. {STORY_PROMPTS[0]}", greedy).result())
        decode_load = window.finish()
        decode_tps = statistics.median(d.timings.decode_tps for d in runs)
        bare_tps = statistics.median(bare)
        candidate = Candidate.from_header(header, name=info.name)
        position = runs[0].usage.prompt_tokens + n_decode // 2
        bytes_per_token = decode_bytes_per_token(candidate, position, options.kv_type)
        bandwidth = hardware.host_bandwidth_gbps
        roofline = bandwidth * 1e9 / bytes_per_token if bandwidth else 0.0
        prediction = predict(candidate, hardware, info.n_gpu_layers, position=position,
                             n_threads=options.n_threads or None, kv_type=options.kv_type)
        result.decode = {
            "tokens": n_decode,
            "decode_tps": decode_tps,
            "bare_step_tps": bare_tps,
            "share_of_bare_step": decode_tps / bare_tps if bare_tps else 0.0,
            "bytes_per_token": bytes_per_token,
            "bandwidth_gbps": bandwidth,
            "bandwidth_source": hardware.bandwidth_source,
            "roofline_tps": roofline,
            "share_of_roofline": decode_tps / roofline if roofline else 0.0,
            "predicted_tps": prediction.decode_tps,
            "ttft_ms": statistics.median(d.timings.ttft_ms for d in runs),
        }

        rounds = 1 if quick else 3  # of the parts whose figures are medians of rounds
        stage("concurrent streams")
        n_stream_tokens = 48 if quick else 64
        result.concurrency = _concurrency(engine, (1, 4) if quick else (1, 2, 4, 8),
                                          n_tokens=n_stream_tokens)

        stage("speculation by streams")
        result.speculation_streams = _speculation_streams(
            engine, [row["streams"] for row in result.concurrency], n_tokens=n_stream_tokens,
            rounds=rounds)

        stage("chat prefix reuse")
        result.chat_reuse = _chat_reuse(engine, rounds=rounds)

        stage("speculation")
        result.speculation = _speculation(engine, quick=quick)

        stage("structured output")
        result.structured = _structured(engine, quick=quick, rounds=rounds)

        stage("calibration")
        from ..planner.calibration import drift_note, record_run

        measurement = record_run(
            model_path=model.path, model_name=info.name, n_gpu_layers=info.n_gpu_layers,
            n_threads=options.n_threads or None, prompt_tokens=runs[0].usage.prompt_tokens,
            decode_tokens=runs[0].timings.decode_tokens, decode_tps=decode_tps, hw=hardware,
            load=decode_load)
        if measurement is not None:
            result.calibration = {"predicted_tps": measurement.predicted_tps,
                                  "measured_tps": measurement.measured_tps,
                                  "ratio": measurement.ratio,
                                  "under_load": not measurement.quiet,
                                  "load": decode_load.describe(),
                                  "drift_note": drift_note(measurement.drift)
                                  if measurement.drift else None}
    finally:
        engine.close()

    stage("busy machine")
    result.busy_machine = busy_machine(
        lambda n_threads, adapt: load_engine(
            model.path, replace(options, n_slots=1, n_threads=n_threads, n_threads_batch=0,
                                adapt_threads=adapt), name=model.name, family=model.family,
            header=header).wait_ready(),
        # Quick: one round of short runs (two threads beside a busy core can crawl at ~1
        # tok/s on a loaded machine, and each run decodes twice n_tokens).
        all_threads=result.threads, n_tokens=32 if quick else 128, rounds=1 if quick else 2)

    if not quick:
        stage("llama-cpp-python")
        result.raw_llama_cpp_python = _raw(model.path, options, prompt=f"Run 0. {STORY_PROMPTS[0]}",
                                           n_tokens=n_decode, filler=_PARAGRAPH * 60,
                                           flash_attn=info.flash_attn is not False)
        if result.raw_llama_cpp_python.get("decode_tps"):
            raw = result.raw_llama_cpp_python
            raw["engine_vs_create_completion"] = decode_tps / raw["decode_tps"]
            engine_512 = next((p["prefill_tps"] for p in result.prefill if p["tokens"] == 512),
                              0.0)
            raw["engine_vs_eval_prefill_512"] = engine_512 / raw["prefill_tps"]
    return result


BUSY_LOOP = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"
"""One core kept busy, as a browser tab or a build keeps one on a laptop; the loop ends by
itself should the bench die without killing it."""


def busy_machine(load: Callable[[int, bool], Engine], *, all_threads: int, n_tokens: int,
                 rounds: int = 2) -> dict[str, Any]:
    """Single-stream decode at 1 thread, at ``all_threads`` (llama.cpp's default: the
    physical cores) and adaptive (up to ``all_threads``), on the machine as it is and with
    one more core kept busy by a process started here (killed afterwards, also on Ctrl-C).
    ``load(n_threads, adapt)`` loads an engine. Each engine first decodes ``n_tokens`` unmeasured
    (the adaptive one learns there, as a running daemon has), then ``n_tokens`` measured; the
    three take turns, ``rounds`` times, and each figure is the median of its rounds."""
    if all_threads < 2:
        return {}
    configs = {"1_thread": (1, False), "all_threads": (all_threads, False),
               "adaptive": (all_threads, True)}
    params = SamplingParams(temperature=0, max_tokens=n_tokens, speculative=False)
    rows = []
    for label in ("idle", "one_core_busy"):
        busy = (subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
                if label == "one_core_busy" else None)
        try:
            rates: dict[str, list[float]] = {name: [] for name in configs}
            chosen: list[int] = []
            for k in range(rounds):
                for name, (n_threads, adapt) in configs.items():
                    engine = load(n_threads, adapt)
                    try:
                        engine.complete(f"Warm {k}. {STORY_PROMPTS[1]}", params).result()
                        done = engine.complete(f"Run {k}. {STORY_PROMPTS[0]}", params).result()
                        rates[name].append(done.timings.decode_tps)
                        if adapt:
                            chosen.append(engine.thread_tuner.threads.get("1 row", n_threads))
                    finally:
                        engine.close()
            load_average = os.getloadavg()[0]  # what the runs saw, the busy process included
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        row: dict[str, Any] = {name: statistics.median(r) for name, r in rates.items()}
        row.update(load=label, adaptive_threads=chosen, loadavg_1min=load_average,
                   runs=rates)
        rows.append(row)
    return {"threads": all_threads, "tokens": n_tokens, "rounds": rounds, "rows": rows}


def _prefill(engine: Engine, filler: list[int], n: int, k: int) -> Done:
    """A prompt of exactly ``n`` tokens that shares nothing with earlier ones."""
    head = engine.backend.tokenize(f"Sample {k}-{n}-{time.monotonic_ns()}.", add_special=True)
    tokens = (head + filler)[:n]
    return engine.submit(tokens, SamplingParams(temperature=0, max_tokens=1,
                                                speculative=False)).result()


NEAR_TIE_LOGITS = 1.0
"""Two greedy runs of one request may part only where their two tokens scored within this many
logits of the best one. llama.cpp computes a batch of several rows (sequences decoded together,
a speculative draft being verified, a prompt read cold) with other kernels than a single row,
which round differently, and how depends on the CPU: where two tokens nearly tie, rounding can
swap them, and from there the texts differ. Measured on the starter model (AVX-512 and
AVX2-only builds, F16 and q8_0 KV caches): 14 partings of batched, speculative or cached runs
from solo, plain or cold ones, at margins of 0.007-0.31; one position computed along two such
paths differs in its top-2 gap by up to 0.59, hence 1.0; and only 12-16% of greedy positions
have a gap under 1.0 (median 5.4-6.1), so a parting anywhere else is caught."""


@dataclass(frozen=True)
class Divergence:
    """Where a greedy generation first parts from a reference run of the same prompt."""

    index: int
    """The first generated token that differs."""
    margin: float
    """How far the lower-scored of the two runs' tokens there is below the best token, in
    logits, on a cold read of the prompt and the tokens both runs share; infinite when one
    run merely stopped before the other."""

    @property
    def near_tie(self) -> bool:
        return self.margin < NEAR_TIE_LOGITS


def first_divergence(engine: Engine, reference: Generation,
                     other: Generation) -> Divergence | None:
    """None when two finished greedy generations of one prompt made the same tokens; else where
    the second first parts from the reference, and by what margin. Empties the engine's
    cache: call it while no request is running."""
    assert reference.request is not None and other.request is not None
    prompt = reference.request.prompt
    if other.request.prompt != prompt:
        raise ValueError("first_divergence compares two runs of one prompt")
    ref, alt = reference.request.generated, other.request.generated
    shared = min(len(ref), len(alt))
    index = next((i for i, (a, b) in enumerate(zip(ref, alt, strict=False)) if a != b), shared)
    if index == shared:
        return None if len(ref) == len(alt) else Divergence(index, math.inf)
    return Divergence(index, _logit_margin(engine, prompt + ref[:index],
                                           (ref[index], alt[index])))


def _logit_margin(engine: Engine, context: list[int], tokens: tuple[int, ...]) -> float:
    """The best logit after ``context`` minus the lowest of ``tokens``' logits, on sequence 0
    (which ``clear_cache`` leaves empty and no slot claims to hold)."""
    engine.clear_cache()
    backend = engine.backend

    def measure() -> float:
        try:
            for start in range(0, len(context), backend.n_batch):
                chunk = context[start:start + backend.n_batch]
                last = start + len(chunk) == len(context)
                backend.decode(chunk, range(start, start + len(chunk)), [0] * len(chunk),
                               [False] * (len(chunk) - 1) + [last])
            scores = backend.logits(len(chunk) - 1)
        finally:
            backend.seq_trim(0, 0)
        return float(max(scores) - min(scores[t] for t in tokens))

    margin = engine.run_on_worker(measure)
    assert isinstance(margin, float)
    return margin


def _concurrency(engine: Engine, widths: tuple[int, ...], n_tokens: int) -> list[dict]:
    params = SamplingParams(temperature=0, max_tokens=n_tokens, speculative=False)
    engine.clear_cache()
    solo = {}
    for prompt in STORY_PROMPTS[:max(widths)]:
        solo[prompt] = engine.complete(prompt, params)
        solo[prompt].result()
    rows = []
    single = 0.0
    for width in widths:
        prompts = STORY_PROMPTS[:width]
        aggregate, generations = _streams(engine, prompts, params)
        done = [g.result() for g in generations]
        single = single or aggregate
        partings = (first_divergence(engine, solo[p], g)
                    for p, g in zip(prompts, generations, strict=True))
        diverged = [d for d in partings if d is not None]
        rows.append({
            "streams": width, "aggregate_tps": aggregate, "speedup": aggregate / single,
            "per_stream_decode_tps": [d.timings.decode_tps for d in done],
            "complete": all(d.usage.completion_tokens == n_tokens for d in done),
            "equal_to_solo": width - len(diverged),
            "first_divergent_token": [d.index for d in diverged],
            "divergence_margins": [d.margin for d in diverged],
            "diverged_at_near_tie": sum(d.near_tie for d in diverged),
        })
    return rows


def _streams(engine: Engine, prompts: list[str],
             params: SamplingParams) -> tuple[float, list[Generation]]:
    """Aggregate tokens per second of ``prompts`` run together, each read cold (as the first
    request after a load), and their generations."""
    engine.clear_cache()
    started = time.perf_counter()
    generations = [engine.complete(p, params) for p in prompts]
    tokens = sum(g.result().usage.completion_tokens for g in generations)
    return tokens / (time.perf_counter() - started), generations


SPECULATION_MODES = {"off": False, "on": True, "adaptive": None}
"""``speculative`` in a request: never draft, verify every draft, or let the engine decide."""


def _speculation_streams(engine: Engine, widths: list[int], n_tokens: int,
                         rounds: int) -> list[dict[str, Any]]:
    """Aggregate tok/s of each number of streams with speculation off, with every draft
    verified ("on") and with the engine's default, drafts verified where the measured step
    costs say they pay ("adaptive"): the three take turns, ``rounds`` times, and each figure
    is the median of its rounds (a run on a laptop varies by 10-20% from one to the next)."""
    rows = []
    for width in widths:
        runs: dict[str, list[float]] = {mode: [] for mode in SPECULATION_MODES}
        for _ in range(rounds):
            for mode, speculative in SPECULATION_MODES.items():
                params = SamplingParams(temperature=0, max_tokens=n_tokens,
                                        speculative=speculative)
                runs[mode].append(_streams(engine, STORY_PROMPTS[:width], params)[0])
        rows.append({"streams": width, "rounds": rounds,
                     **{f"{mode}_tps": statistics.median(r) for mode, r in runs.items()}})
    return rows


def _chat_reuse(engine: Engine, *, rounds: int) -> dict[str, Any]:
    """TTFT of a chat's 5th turn (~1,500 tokens of history) with the history cached, with
    nothing cached, and of the new message alone; medians over three new messages, ``rounds``
    times (each round reads the history cold once)."""
    topics = ["the history of the printing press", "how tides work", "baking sourdough bread",
              "the rules of chess"]
    history: list[Message] = []
    for i, topic in enumerate(topics):
        history.append(Message("user", f"Turn {i + 1}. Tell me about {topic}. " + _PARAGRAPH * 3))
        history.append(Message("assistant", f"Here is an overview of {topic}. " + _PARAGRAPH * 2))
    questions = [Message("user", text) for text in (
        "Now summarise everything we discussed in three sentences.",
        "Which of these topics would you explain to a child first, and why?",
        "List the four topics we covered, one per line, with a short title each.")]
    one = SamplingParams(temperature=0, max_tokens=1, speculative=False)
    warm, alone = [], []
    for _ in range(rounds):  # a few milliseconds apart: medians of 3 runs a round each
        engine.clear_cache()
        # What the cache holds after the 4th reply: the conversation so far. Each 5th turn
        # then reads only its new message (the one before it is dropped from the cache).
        engine.submit(engine.chat_tokens(history, add_generation_prompt=False), one).result()
        warm += [engine.submit(engine.chat_tokens(history + [q]), one).result()
                 for q in questions]
        for question in questions:
            engine.clear_cache()
            alone.append(engine.chat([question], one).result())
    engine.clear_cache()
    full = engine.chat_tokens(history + [questions[0]])
    cold = engine.submit(full, one).result()
    warm_ms = statistics.median(d.timings.ttft_ms for d in warm)
    alone_ms = statistics.median(d.timings.ttft_ms for d in alone)
    return {
        "history_tokens": len(full),
        "ttft_with_reuse_ms": warm_ms,
        "cached_tokens": min(d.usage.cached_tokens for d in warm),
        "ttft_without_reuse_ms": cold.timings.ttft_ms,
        "ttft_new_message_alone_ms": alone_ms,
        "ratio_to_message_alone": warm_ms / alone_ms,
    }


CODE_EDIT_FUNCTION = '''def summarize_orders(orders, currency="EUR", include_refunds=False):
    """Summarize a list of orders into totals per customer and per month."""
    totals_by_customer = {}
    totals_by_month = {}
    refunds = []
    skipped = 0
    for order in orders:
        if order.get("status") == "cancelled":
            skipped += 1
            continue
        customer = order["customer_id"]
        month = order["created_at"][:7]
        amount = order["amount"]
        if order.get("currency", currency) != currency:
            rate = EXCHANGE_RATES.get((order["currency"], currency))
            if rate is None:
                skipped += 1
                continue
            amount = round(amount * rate, 2)
        if order.get("refunded"):
            refunds.append(order["id"])
            if not include_refunds:
                continue
            amount = -amount
        totals_by_customer[customer] = totals_by_customer.get(customer, 0) + amount
        totals_by_month[month] = totals_by_month.get(month, 0) + amount
    best_customer = None
    best_total = 0
    for customer, total in totals_by_customer.items():
        if total > best_total:
            best_customer = customer
            best_total = total
    busiest_month = None
    busiest_total = 0
    for month, total in sorted(totals_by_month.items()):
        if total > busiest_total:
            busiest_month = month
            busiest_total = total
    average = 0
    if totals_by_customer:
        average = sum(totals_by_customer.values()) / len(totals_by_customer)
    report = {
        "currency": currency,
        "customers": len(totals_by_customer),
        "months": len(totals_by_month),
        "best_customer": best_customer,
        "best_total": round(best_total, 2),
        "busiest_month": busiest_month,
        "busiest_total": round(busiest_total, 2),
        "average_per_customer": round(average, 2),
        "refunded_orders": refunds,
        "skipped_orders": skipped,
    }
    if include_refunds:
        report["note"] = "refunds are counted as negative amounts"
    else:
        report["note"] = "refunded orders are left out"
    log.info("summarized %d orders for %d customers", len(orders), len(totals_by_customer))
    return report
'''

CODE_EDIT_PROMPT = (
    "Below is a Python function, then the same function after a refactor that renames it to"
    " `summarize_sales` and changes nothing else.\n\nBefore:\n\n```python\n"
    + CODE_EDIT_FUNCTION
    + "```\n\nAfter:\n\n```python\n"
    + 'def summarize_sales(orders, currency="EUR", include_refunds=False):\n'
)
"""A code-edit request (repeat a 60-line function with one change), as an editor sends it."""


def _speculation(engine: Engine, *, quick: bool) -> dict[str, Any]:
    runs, rows = {}, {}
    for label, speculative in (("plain", False), ("prompt_lookup", True), ("adaptive", None)):
        params = SamplingParams(temperature=0, max_tokens=300 if quick else 600,
                                speculative=speculative, stop=("```",))
        engine.clear_cache()
        runs[label] = engine.complete(CODE_EDIT_PROMPT, params)
        rows[label] = runs[label].result()
    plain, spec, adaptive = rows["plain"], rows["prompt_lookup"], rows["adaptive"]
    divergence = first_divergence(engine, runs["plain"], runs["prompt_lookup"])
    return {
        "prompt_tokens": plain.usage.prompt_tokens,
        "tokens": plain.usage.completion_tokens,
        "plain_tps": plain.timings.decode_tps,
        "speculative_tps": spec.timings.decode_tps,
        "speedup": spec.timings.decode_tps / plain.timings.decode_tps
        if plain.timings.decode_tps else 0.0,
        "adaptive_tps": adaptive.timings.decode_tps,
        "identical": divergence is None,
        "first_divergent_token": None if divergence is None else divergence.index,
        "divergence_margin": None if divergence is None else divergence.margin,
        "diverged_at_near_tie": divergence is not None and divergence.near_tie,
        "drafted": spec.timings.drafted_tokens,
        "accepted": spec.timings.accepted_tokens,
    }


CITIES_SCHEMA = {"type": "object", "required": ["cities"], "properties": {"cities": {
    "type": "array", "items": {"type": "object", "required": ["name", "population"],
                               "properties": {"name": {"type": "string", "maxLength": 24},
                                              "population": {"type": "integer",
                                                             "minimum": 0}}}}}}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city", "parameters": {
        "type": "object", "required": ["city", "unit"],
        "properties": {"city": {"type": "string"},
                       "unit": {"enum": ["celsius", "fahrenheit"]}}}}}


def _structured(engine: Engine, *, quick: bool, rounds: int) -> dict[str, Any]:
    """Decode with a JSON schema's grammar against plain decode of the same prompt, greedy
    and sampled with the default sampler settings (alternated, median of ``rounds`` each),
    and the time to a forced tool call: submitted to done, its arguments constrained by the
    tool's schema."""
    n_tokens = 64 if quick else 128
    prompt = "A list of large cities and their populations, as JSON:\n"
    rates: dict[str, list[float]] = {}
    for seed in range(rounds):
        for mode, temperature in (("", 0.0), ("sampled_", SamplingParams.temperature)):
            for label, grammar in (("plain", None), ("schema", json_grammar(CITIES_SCHEMA))):
                done = engine.complete(prompt, SamplingParams(
                    temperature=temperature, max_tokens=n_tokens, speculative=False,
                    grammar=grammar, seed=seed)).result()
                rates.setdefault(mode + label, []).append(done.timings.decode_tps)
    median = {label: statistics.median(values) for label, values in rates.items()}
    plain, schema = median["plain"], median["schema"]
    hermes = FORMATS["hermes"]
    tools = parse_tools([WEATHER_TOOL])
    call = SamplingParams(temperature=0, max_tokens=64, speculative=False,
                          grammar=call_grammar(hermes, tools, ToolChoice("required"),
                                               parallel=False))
    calls = [engine.complete("User: what's the weather in Paris?\nAssistant:", call).result()
             for _ in range(3)]
    best = min(calls, key=lambda d: d.timings.total_ms)
    return {
        "tokens": n_tokens,
        "plain_tps": plain,
        "schema_tps": schema,
        "ratio": schema / plain if plain else 0.0,
        "sampled_plain_tps": median["sampled_plain"],
        "sampled_schema_tps": median["sampled_schema"],
        "sampled_ratio": (median["sampled_schema"] / median["sampled_plain"]
                          if median["sampled_plain"] else 0.0),
        "tool_call_ms": best.timings.total_ms,
        "tool_call_ttft_ms": best.timings.ttft_ms,
        "tool_call_tokens": best.usage.completion_tokens,
        "tool_call_parsed": bool(parse_reply(hermes, best.text)[1]),
    }


def _raw(path: Any, options: Any, *, prompt: str, n_tokens: int, filler: str,
         flash_attn: bool) -> dict:
    """llama-cpp-python's Llama class in a child process (see runtime.llama.measure_raw_llama),
    with the engine's flash attention setting."""
    args = {"path": str(path), "prompt": prompt, "max_tokens": n_tokens,
            "n_ctx": options.n_ctx, "n_threads": options.n_threads or _threads(),
            "prefill_tokens": 512, "prefill_text": filler, "flash_attn": flash_attn}
    code = ("import json, sys; from localinfer.runtime.llama import measure_raw_llama;"
            " print(json.dumps(measure_raw_llama(**json.loads(sys.argv[1]))))")
    try:
        out = subprocess.run([sys.executable, "-c", code, json.dumps(args)],
                             capture_output=True, text=True, timeout=600)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        return {"error": f"could not run llama-cpp-python's Llama: {exc}"}


def _threads() -> int:
    from ..runtime.llama import _physical_cores

    return _physical_cores()
