"""``localinfer run``: one prompt, its completion streamed to stdout, the speed figures to
stderr; through the running daemon when there is one, else a model loaded in this process."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from dataclasses import asdict

from ..config import Config
from ..errors import Cancelled
from ..progress import TerminalProgress
from .common import (
    add_load_flags,
    add_sampling_flags,
    config_with_flags,
    load_flags_given,
    sampling_params,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="generate a completion for one prompt",
                       description="Stream a completion for PROMPT to stdout, then one line of"
                                   " speed figures to stderr.")
    p.add_argument("model", metavar="MODEL", help="model name (gemma3:270m) or .gguf path")
    p.add_argument("prompt", metavar="PROMPT", help="the prompt; - reads it from stdin")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the model's chat template as a user message")
    p.add_argument("--system", help="system prompt (implies --chat)")
    add_sampling_flags(p)
    add_load_flags(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object with text, usage and timings instead")
    p.add_argument("--no-daemon", action="store_true",
                   help="load the model in this process even when a daemon is running")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace, config: Config) -> int:
    # runtime/__init__ loads the engine: not for building the parser.
    from ..runtime.types import Message

    params = sampling_params(args)  # bad flags fail before a model is loaded
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    messages = None
    if args.chat or args.system:
        messages = ([Message("system", args.system)] if args.system else []) + [
            Message("user", prompt)]
    client = None
    if not (args.no_daemon or load_flags_given(args)):
        # httpx and the store: not for building the parser.
        from ..client import DaemonClient
        from ..store import looks_like_path

        if not looks_like_path(args.model):
            client = DaemonClient.discover()
    if client is not None:
        # The daemon already holds (or will load) the model: one copy for the whole machine.
        with client:
            generation = client.generate(args.model, messages=messages, prompt=prompt,
                                         params=params)
            done = _stream(generation, args.json)
            model_name = generation.model or args.model
    else:
        engine = _load_in_process(args, config_with_flags(config, args))
        with engine:
            if messages is not None:
                generation = engine.chat(messages, params)
            else:
                generation = engine.complete(prompt, params)
            done = _stream(generation, args.json)
        model_name = engine.info.name
    if args.json:
        print(json.dumps(run_result_json(model_name, done), indent=2))
    else:
        if not done.text.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
        print(stats_line(done), file=sys.stderr)
    if client is None:  # after the output: measured vs predicted decode, for the planner
        # The hardware probes and the planner: not for building the parser.
        from ..hardware.calibration import record_calibration

        record_calibration(engine.info, done, config)
    return Cancelled.exit_code if done.finish_reason == "cancelled" else 0


def _load_in_process(args: argparse.Namespace, config: Config):
    # The engine and the store: not for building the parser.
    from ..runtime.loader import open_engine

    copying: list[TerminalProgress] = []

    def on_copy(done: int, total: int) -> None:
        if not copying:
            copying.append(TerminalProgress("Installing the starter model", total=total))
        copying[0].update(done, total)

    loading = None if args.json else TerminalProgress(f"Loading {args.model}",
                                                      unit="fraction")
    try:
        engine = open_engine(args.model, config, on_copy=on_copy,
                             on_load=loading.fraction if loading else None)
    finally:
        for bar in copying:
            bar.finish()
    engine.wait_ready()
    if loading:
        info = engine.info
        loading.finish(f"Loaded {info.name} ({info.quant}, {info.n_gpu_layers}/"
                       f"{info.n_layers} layers on GPU) in {engine.load_ms / 1000:.1f}s")
    return engine


def _stream(generation, quiet: bool):
    """Print a generation's text as it streams (unless quiet) and return its Done event.
    Ctrl+C cancels it: it stops within a token and the figures are still printed."""
    # runtime/__init__ loads the engine: not for building the parser.
    from ..runtime.types import Done, Token

    done = None
    previous = signal.signal(signal.SIGINT, lambda *_: generation.cancel())
    try:
        for event in generation:
            if isinstance(event, Token) and not quiet:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, Done):
                done = event
    finally:
        signal.signal(signal.SIGINT, previous)
    return done


def stats_line(done) -> str:
    """The speed figures printed to stderr after the text, on one line."""
    t = done.timings
    parts = [f"prompt {t.prompt_tokens} tok"]
    if t.cached_tokens:
        parts.append(f"cached {t.cached_tokens} tok")
    parts += [
        f"TTFT {t.ttft_ms:.0f} ms",
        f"prefill {t.prefill_tps:.0f} tok/s",
        f"decode {t.decode_tps:.1f} tok/s",
        f"{t.completion_tokens} tok",
    ]
    if done.finish_reason != "stop":
        parts.append(done.finish_reason)
    return " · ".join(parts)


def run_result_json(model: str, done) -> dict:
    """What ``run --json`` prints: the text, usage and timings (with the derived rates)."""
    t = done.timings
    timings = asdict(t)
    timings["prefill_tps"] = t.prefill_tps
    timings["decode_tps"] = t.decode_tps
    return {
        "model": model,
        "text": done.text,
        "finish_reason": done.finish_reason,
        "usage": {**asdict(done.usage), "total_tokens": done.usage.total_tokens},
        "timings": timings,
    }
