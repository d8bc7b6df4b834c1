"""The ``localinfer`` command line.

Each area keeps its sub-commands in its own module with a ``register(subparsers)``:

    run.py      run                          one prompt, streamed
    daemon.py   serve, ps, stop              the daemon and talking to it
    plan.py     hw, plan                     this machine, and what runs well on it
    bench.py    bench                        measured speed against the limits
    chat.py     chat                         the terminal chat UI
    models.py   pull, list, show, rm, add    the model store
    common.py   the flags and output helpers several areas share

Building the parser loads none of the engine, the daemon, Textual or the store: each command
imports those when it runs. Errors from the core (``LocalInferError``) are printed as one line
on stderr and mapped to the exit codes listed in ``errors.py``; ``--debug`` shows tracebacks
and llama.cpp's own log.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .. import __version__, errors
from ..config import load_config
from ..errors import Cancelled, LocalInferError
from . import bench, chat, daemon, models, plan, run

INTERNAL_ERROR = 70

AREAS = (run, daemon, plan, bench, chat, models)
"""In the order their commands are listed in ``--help``."""


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
        epilog=exit_codes_epilog(),
    )
    parser.add_argument("--version", action="version", version=f"localinfer {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks and llama.cpp's log")
    parser.add_argument("--offline", action="store_true",
                        help="never touch the network (as HF_HUB_OFFLINE=1): `pull` refuses,"
                             " `plan` uses cached headers or the catalog's estimates")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for area in AREAS:
        area.register(sub)
    return parser


def exit_codes_epilog() -> str:
    """The exit codes, from the error tree in ``errors.py``: each code with the title of the
    most general error that exits with it."""
    titles: dict[int, str] = {0: "ok"}
    pending: list[type[LocalInferError]] = [LocalInferError]
    while pending:  # breadth first: a base class before its subclasses
        cls = pending.pop(0)
        if cls.__module__ != errors.__name__:
            continue  # errors other modules define reuse these codes
        titles.setdefault(cls.exit_code, cls.title)
        pending += cls.__subclasses__()
    titles[INTERNAL_ERROR] = "internal error"
    listed = ", ".join(f"{code} {title}" for code, title in sorted(titles.items()))
    return f"Exit codes: {listed}; bad arguments also exit 2."
