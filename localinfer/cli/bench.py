"""``localinfer bench``: measure a model on this machine and say how close it runs to its limits."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..config import Config
from ..errors import InvalidRequest
from ..progress import TerminalProgress, human_bytes
from .common import add_load_flags, gpu_layers_text, load_flags_given, load_settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="measure prefill, decode, batching, prefix reuse and speculation",
        description="Load MODEL and measure, through the same engine that serves chats:"
                    " prefill and time to first token, single-stream decode against the bare"
                    " llama_decode step and the memory-bandwidth roofline, aggregate decode"
                    " with concurrent streams, the 5th turn of a chat with and without KV"
                    " prefix reuse, a code edit with and without speculation, and decode with"
                    " one core kept busy by another process at 1 thread, all cores and the"
                    " adaptive count. The decode figure calibrates the planner for this"
                    " machine.")
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="model name or .gguf path (default: the configured default model,"
                        " else the starter gemma3:270m)")
    p.add_argument("--quick", action="store_true",
                   help="fewer and shorter runs: several minutes on a 2-core CPU (the"
                        " docs/benchmarks.md has measured times)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--editor", action="store_true",
                   help="instead, the editor workload through `localinfer serve`: a chat, three"
                        " editors' FIM requests (/infill) with superseded keystrokes, and"
                        " embeddings at once; MODEL needs FIM tokens (see"
                        " bench/editor_workload.py)")
    p.add_argument("--llama-server", default=None, metavar="PATH",
                   help="with --editor: run the same workload on this llama-server too")
    p.add_argument("--prefill", action="store_true",
                   help="instead, prefill rate and TTFT at agent lengths (1k, 4k, 16k and 32k"
                        " tokens; 1k and 4k with --quick), a next turn after a history and 1"
                        " and 4 streams generating after it and after a line, with flash"
                        " attention off and on and 256-"
                        " and 512-row batches: about 25 minutes in full for the starter on a"
                        " 2-core CPU, 1-2 with --quick; CPU loads then take the set-up that"
                        " does the model's work here fastest")
    p.add_argument("--lengths", default=None, metavar="N,N,...",
                   help="with --prefill: the prompt lengths to read, in tokens")
    p.add_argument("--setups", default=None, metavar="off-256,on-512,...",
                   help="with --prefill: the set-ups to measure, flash attention off or on and"
                        " the batch (default off-256,off-512,on-256,on-512)")
    add_load_flags(p, ctx_help="context per stream, tokens (default 4096)")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace, config: Config) -> int:
    from ..bench.engine_bench import run_bench  # the engine: not for building the parser

    model = args.model or config.default_model or "gemma3:270m"
    if args.llama_server and not args.editor:
        raise InvalidRequest("--llama-server goes with --editor (the editor workload on both"
                             " servers); the other benches measure localinfer alone.")
    if args.editor and (load_flags_given(args) or args.prefill or args.lengths or args.setups):
        raise InvalidRequest("--editor runs `localinfer serve` as it starts by default, with"
                             " the config's settings: leave out --prefill, --lengths, --setups"
                             " and the loading flags, or set them in config.toml.")
    if args.editor:
        return editor_bench(model, args.llama_server, quick=args.quick, as_json=args.json)
    if (args.lengths or args.setups) and not args.prefill:
        flag = "--lengths" if args.lengths else "--setups"
        raise InvalidRequest(f"{flag} goes with --prefill (the prompt-reading bench); the"
                             " default bench reads prompts of its own lengths.")
    config = load_settings(config, args)
    if args.prefill:
        return prefill_bench(model, config, args)
    bar = TerminalProgress(f"bench {model}", unit="steps")
    result = run_bench(model, config, quick=args.quick,
                       progress=stage_progress(bar, f"bench {model}"))
    bar.finish(f"bench {model}: done in {bar.elapsed_s:.0f} s")
    if args.json:
        print(result.to_json())
    else:
        print(report(result))
    return 0


def stage_progress(bar: TerminalProgress, label: str) -> Callable[[str, int, int], None]:
    """A bench's progress callback (stage, step, total) on ``bar``: the stage in its label,
    and a line a stage on stderr where it is not a terminal."""
    def progress(stage: str, step: int, total: int) -> None:
        bar.label = f"{label}: {stage}"
        bar.update(step - 1, total)
        if not bar.tty:
            print(f"bench [{step}/{total}] {stage}...", file=sys.stderr, flush=True)
    return progress


def prefill_bench(model: str, config: Config, args: argparse.Namespace) -> int:
    """``--prefill``: prompt reading at agent lengths for each attention set-up."""
    from ..bench.prefill_bench import (
        LENGTHS,
        QUICK_LENGTHS,
        SETUPS,
        parse_setups,
        prefill_lengths,
        report,
    )

    lengths: tuple[int, ...] = QUICK_LENGTHS if args.quick else LENGTHS
    if args.lengths:
        try:
            lengths = tuple(int(n) for n in args.lengths.split(","))
        except ValueError:
            lengths = ()
        if not lengths or min(lengths) < 16:
            print(f"localinfer bench: --lengths must be token counts of 16 or more separated by"
                  f" commas (e.g. 1024,4096), got {args.lengths!r}", file=sys.stderr)
            return 2
    setups = SETUPS
    if args.setups:
        try:
            setups = parse_setups(args.setups)
        except ValueError as exc:
            print(f"localinfer bench: --setups: {exc}", file=sys.stderr)
            return 2
    bar = TerminalProgress(f"bench --prefill {model}", unit="prompts")
    progress = stage_progress(bar, f"prefill {model}")
    try:
        result = prefill_lengths(model, config, lengths=lengths, setups=setups,
                                 progress=progress)
    except ValueError as exc:
        bar.finish(f"bench --prefill {model}: stopped")
        print(f"localinfer bench: {exc}", file=sys.stderr)
        return 2
    bar.finish(f"bench --prefill {model}: done in {bar.elapsed_s:.0f} s")
    print(json.dumps(result, indent=2) if args.json else report(result))
    return 0


def editor_bench(model: str, llama_server: str | None, *, quick: bool, as_json: bool) -> int:
    """The editor workload on ``model`` (chat, FIM and embeddings alike), through a fresh
    `localinfer serve` and, when given, llama-server; a short table of the figures."""
    from ..bench.editor_workload import (
        Workload,
        measure,
        start_llama_server,
        start_localinfer,
        table,
    )
    from ..store import ModelStore

    path = ModelStore().resolve(model).path
    workload = Workload()
    if quick:
        workload = replace(workload, chat_turns=3, fim_completed=3, embed_chunks=16)
    with tempfile.TemporaryDirectory(prefix="li-editor-") as tmp:
        logs = Path(tmp)
        (logs / "home").mkdir()
        results = [measure(lambda: start_localinfer(path, path, logs / "home",
                                                    logs / "localinfer.log"), workload)]
        if llama_server:
            results.append(measure(lambda: start_llama_server(
                Path(llama_server), path, path, logs / "llama-server.log"), workload))
    print(json.dumps(results, indent=2) if as_json else table(results))
    return 0


def report(r) -> str:
    gpu_layers = gpu_layers_text(r.n_gpu_layers, r.n_layers)
    lines = [
        f"{r.model} ({r.quant}, {human_bytes(r.size_bytes)}) on {r.machine}, {r.threads}"
        f" threads, " + (f"{gpu_layers} layers on GPU" if r.n_gpu_layers
                         else "CPU only") + f", {r.kv_type} KV cache"
        + {True: ", flash attention", False: ", no flash attention"}.get(r.flash_attn, ""),
        "",
        f"  load                    {r.load_ms / 1000:.2f} s",
    ]
    for p in r.prefill:
        lines.append(f"  prefill {p['tokens']:>5} tokens    {p['prefill_tps']:7.0f} tok/s"
                     f"   TTFT {p['ttft_ms']:.0f} ms")
    d = r.decode
    if d:
        lines.append(f"  decode, 1 stream        {d['decode_tps']:7.1f} tok/s   TTFT"
                     f" {d['ttft_ms']:.0f} ms")
        lines.append(f"    = {d['share_of_bare_step']:.0%} of the bare llama_decode step"
                     f" ({d['bare_step_tps']:.1f}/s)")
        if d["roofline_tps"]:
            lines.append(
                f"    = {d['share_of_roofline']:.0%} of the memory-bandwidth roofline:"
                f" {d['bandwidth_gbps']:.1f} GB/s ({d['bandwidth_source']}) /"
                f" {human_bytes(d['bytes_per_token'])} read per token ="
                f" {d['roofline_tps']:.0f} tok/s")
        lines.append(f"    planner predicted {d['predicted_tps']:.1f} tok/s")
    if r.concurrency:
        lines.append("  concurrent streams      aggregate tok/s (speedup), outputs equal to"
                     " a solo run")
        for c in r.concurrency:
            diverged = c["first_divergent_token"]
            where = (f" (others diverge at token {', '.join(map(str, diverged))})"
                     if diverged else "")
            lines.append(f"    {c['streams']} stream{'s' if c['streams'] > 1 else ' '}"
                         f"             {c['aggregate_tps']:7.1f} ({c['speedup']:.2f}x)"
                         f"   {c['equal_to_solo']}/{c['streams']}{where}")
    if r.speculation_streams:
        lines.append("  speculation by streams  aggregate tok/s: off / on / adaptive (default),"
                     f" median of {r.speculation_streams[0]['rounds']}")
        for row in r.speculation_streams:
            lines.append(f"    {row['streams']} stream{'s' if row['streams'] > 1 else ' '}"
                         f"             {row['off_tps']:7.1f} / {row['on_tps']:.1f} /"
                         f" {row['adaptive_tps']:.1f}")
    cr = r.chat_reuse
    if cr:
        lines.append(
            f"  chat, 5th turn ({cr['history_tokens']} tokens): TTFT"
            f" {cr['ttft_with_reuse_ms']:.0f} ms with prefix reuse"
            f" ({cr['cached_tokens']} cached), {cr['ttft_without_reuse_ms']:.0f} ms without;"
            f" the new message alone {cr['ttft_new_message_alone_ms']:.0f} ms"
            f" ({cr['ratio_to_message_alone']:.2f}x)")
    s = r.speculation
    if s:
        lines.append(
            f"  code edit ({s['tokens']} tokens): {s['plain_tps']:.1f} tok/s plain,"
            f" {s['speculative_tps']:.1f} tok/s with prompt lookup ({s['speedup']:.2f}x,"
            f" {s['accepted']}/{s['drafted']} drafted tokens accepted),"
            f" {s['adaptive_tps']:.1f} tok/s adaptive (the default), "
            + ("identical text" if s["identical"] else
               f"text parts from plain decoding at token {s['first_divergent_token']}"
               + (" (flash attention on an F16 cache: see --flash-attn)"
                  if r.flash_attn and r.kv_type == "f16" else "")))
    st = r.structured
    if st:
        lines.append(
            f"  JSON schema ({st['tokens']} tokens): {st['schema_tps']:.1f} tok/s constrained,"
            f" {st['plain_tps']:.1f} tok/s plain ({st['ratio']:.2f}x); sampled"
            f" {st['sampled_schema_tps']:.1f} against {st['sampled_plain_tps']:.1f} tok/s"
            f" ({st['sampled_ratio']:.2f}x); a forced tool call"
            f" {st['tool_call_ms']:.0f} ms ({st['tool_call_tokens']} tokens, TTFT"
            f" {st['tool_call_ttft_ms']:.0f} ms" + ("" if st["tool_call_parsed"]
                                                    else ", did not parse") + ")")
    b = r.busy_machine
    if b:
        lines.append(f"  busy machine: decode tok/s, median of {b['rounds']}   1 thread"
                     f"  {b['threads']} threads   adaptive (its threads)")
        for row in b["rows"]:
            what = {"idle": "as it is", "one_core_busy": "+1 core busy"}[row["load"]]
            lines.append(f"    {what:<14} (load {row['loadavg_1min']:4.1f})  {row['1_thread']:8.1f}"
                         f"  {row['all_threads']:9.1f}   {row['adaptive']:8.1f}"
                         f" ({'/'.join(map(str, row['adaptive_threads']))})")
    raw = r.raw_llama_cpp_python
    if raw.get("decode_tps"):
        lines.append(
            f"  llama-cpp-python        create_completion {raw['decode_tps']:.1f} tok/s"
            f" (engine {raw['engine_vs_create_completion']:.2f}x); Llama.eval prefill of"
            f" {raw['prefill_tokens']} tokens {raw['prefill_tps']:.0f} tok/s"
            f" (engine {raw['engine_vs_eval_prefill_512']:.2f}x)")
    elif raw.get("error"):
        lines.append(f"  llama-cpp-python        {raw['error']}")
    for line in r.self_check:
        lines.append(f"  self-check: {line}")
    if r.calibration:
        c = r.calibration
        used = ("recorded but not used by `localinfer plan`: taken under load"
                if c.get("under_load") else "saved for `localinfer plan`")
        lines.append(f"  calibration: the planner predicted {c['predicted_tps']:.1f} tok/s,"
                     f" measured {c['measured_tps']:.1f} (x{c['ratio']:.2f}) at"
                     f" {c.get('load', 'an unrecorded load')}; {used}")
        if c.get("drift_note"):
            lines.append(f"  {c['drift_note']}")
    return "\n".join(lines)
