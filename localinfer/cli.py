"""The ``localinfer`` command line.

Each sub-command is a small function that parses its flags and calls the core. Errors from the
core (``LocalInferError``) are printed as one line on stderr and mapped to the exit codes listed
in ``errors.py``; ``--debug`` shows tracebacks and llama.cpp's own log.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
from dataclasses import asdict
from typing import Callable, Sequence

from . import __version__
from .config import Config, load_config
from .errors import Cancelled, LocalInferError

INTERNAL_ERROR = 70

# Modules that add sub-commands (each has ``register(subparsers)``).
COMMAND_MODULES: tuple[str, ...] = ("cli_daemon", "cli_plan", "cli_bench", "cli_chat",
                                    "cli_models")

Command = Callable[[argparse.Namespace, Config], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    if getattr(args, "offline", False):
        # Before anything reads it: the config, huggingface_hub, a daemon this process starts.
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        config = load_config()
        return args.func(args, config)
    except LocalInferError as exc:
        if args.debug:
            raise
        print(f"localinfer: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("localinfer: interrupted", file=sys.stderr)
        return Cancelled.exit_code
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: say so in one line unless asked for the traceback
        if args.debug:
            raise
        print(f"localinfer: internal error: {type(exc).__name__}: {exc}"
              " (run with --debug for the traceback)", file=sys.stderr)
        return INTERNAL_ERROR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localinfer",
        description="Run LLMs locally: pick what fits this machine, chat, serve editors.",
        epilog="Exit codes: 0 ok, 1 error, 2 bad arguments or config, 3 model not found,"
               " 4 invalid model file, 5 model failed to load, 6 prompt too long, 7 store"
               " error, 8 daemon error, 9 llama.cpp unavailable, 70 internal error,"
               " 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"localinfer {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks and llama.cpp's log")
    parser.add_argument("--offline", action="store_true",
                        help="never touch the network (as HF_HUB_OFFLINE=1): `pull` refuses,"
                             " `plan` uses cached headers or the catalog's estimates")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    p = sub.add_parser("run", help="generate a completion for one prompt",
                       description="Stream a completion for PROMPT to stdout, then one line of"
                                   " speed figures to stderr.")
    p.add_argument("model", metavar="MODEL", help="model name (gemma3:270m) or .gguf path")
    p.add_argument("prompt", metavar="PROMPT", help="the prompt; - reads it from stdin")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the model's chat template as a user message")
    p.add_argument("--system", help="system prompt (implies --chat)")
    _sampling_flags(p)
    _load_flags(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object with text, usage and timings instead")
    p.add_argument("--no-daemon", action="store_true",
                   help="load the model in this process even when a daemon is running")
    p.set_defaults(func=cmd_run)

    # Each area keeps its commands in its own module: cli_<area>.py with register(sub).
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return parser


def _sampling_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("-n", "--max-tokens", type=int, default=256, metavar="N",
                   help="most tokens to generate (default 256)")
    g.add_argument("-t", "--temperature", type=float, default=0.8, metavar="T",
                   help="0 = greedy (default 0.8)")
    g.add_argument("--top-p", type=float, default=0.95, metavar="P")
    g.add_argument("--top-k", type=int, default=40, metavar="K")
    g.add_argument("--min-p", type=float, default=0.05, metavar="P")
    g.add_argument("--repeat-penalty", type=float, default=1.0, metavar="X")
    g.add_argument("--seed", type=int, default=None, metavar="S")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop before this text (repeatable)")


def _load_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("loading")
    g.add_argument("--ctx", type=int, default=None, metavar="N",
                   help="context window in tokens")
    g.add_argument("--gpu-layers", type=int, default=None, metavar="N",
                   help="layers to offload to the GPU (-1 = all)")
    g.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads")
    add_attention_flags(g)


def add_attention_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--kv-type and --flash-attn, for every command that loads a model."""
    p.add_argument("--kv-type", choices=["f16", "q8_0"], default=None,
                   help="KV cache type (q8_0 halves its memory; needs flash attention)")
    p.add_argument("--flash-attn", choices=["auto", "on", "off"], default=None,
                   help="flash attention (auto: off on the CPU, where speculative greedy"
                        " text is then exact; llama.cpp's choice on a GPU)")


def _sampling_params(args: argparse.Namespace):
    from .runtime.types import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
    ).validate()


def _config_with_flags(config: Config, args: argparse.Namespace) -> Config:
    return config.replace(ctx=args.ctx, gpu_layers=args.gpu_layers, threads=args.threads,
                          kv_type=args.kv_type, flash_attn=args.flash_attn)


# --- run -------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace, config: Config) -> int:
    from .runtime.types import Message

    params = _sampling_params(args)  # bad flags fail before a model is loaded
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    messages = None
    if args.chat or args.system:
        messages = ([Message("system", args.system)] if args.system else []) + [
            Message("user", prompt)]
    client = None
    load_flags = (args.ctx, args.gpu_layers, args.threads, args.kv_type,
                  args.flash_attn) != (None,) * 5
    if not (args.no_daemon or load_flags):
        from .client import DaemonClient
        from .store import looks_like_path

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
        engine = _load_in_process(args, _config_with_flags(config, args))
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
        from .cli_plan import record_calibration

        record_calibration(engine.info, done, config)
    return Cancelled.exit_code if done.finish_reason == "cancelled" else 0


def _load_in_process(args: argparse.Namespace, config: Config):
    from .progress import TerminalProgress
    from .runtime.loader import open_engine

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
    from .runtime.types import Done, Token

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


# --- tables --------------------------------------------------------------------------------------
def print_table(rows: list[tuple[str, ...]], stream=None) -> None:
    stream = stream or sys.stdout
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [str(c).ljust(w) for c, w in zip(row, widths)]
        stream.write("  ".join(cells).rstrip() + "\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
