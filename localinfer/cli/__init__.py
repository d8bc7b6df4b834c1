"""The ``localinfer`` command line.

Each area keeps its sub-commands in its own module with a ``register(subparsers)``:

    run.py      run                          one prompt, streamed
    daemon.py   serve, ps, stop              the daemon and talking to it
    plan.py     hw, plan                     this machine, and what runs well on it
    bench.py    bench                        measured speed against the limits
    chat.py     chat                         the terminal chat UI
    models.py   pull, list, show, rm, add    the model store
    presets.py  create                       presets from Modelfiles, quantizing
    worker.py   worker                       lend this machine's devices over llama.cpp RPC
    cache.py    cache                        the prefix cache on disk: list, clear
    common.py   the flags and output helpers several areas share

Building the parser loads none of the engine, the daemon, Textual or the store: each command
imports those when it runs. Errors from the core (``LocalInferError``) are printed as one line
on stderr and mapped to the exit codes listed in ``errors.py``; ``--debug`` shows tracebacks
and llama.cpp's own log.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import logging
import os
import sys
from collections.abc import Sequence

from .. import __version__, errors
from ..config import load_config
from ..errors import Cancelled, LocalInferError
from ..runtime.inflight import loads_in_progress
from . import bench, cache, chat, daemon, models, plan, presets, run, worker

INTERNAL_ERROR = 70

AREAS = (run, daemon, plan, bench, chat, models, presets, cache, worker)
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
        _exit_if_llama_busy(Cancelled.exit_code)
        return Cancelled.exit_code
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: say so in one line unless asked for the traceback
        if args.debug:
            raise
        if isinstance(exc, OSError) and exc.errno in _DISK_ERRORS:
            # Anything that writes the home (the store, chats, caches) on a read-only or
            # full disk, or a file this user may not use: a one-line store error, not a bug.
            where = f" ({exc.filename})" if exc.filename else ""
            fix = ("check its permissions" if exc.errno in (errno.EACCES, errno.EPERM) else
                   "free some space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else
                   "make it writable")
            print(f"localinfer: store error: {exc.strerror}{where}: {fix}, or point"
                  " LOCALINFER_HOME at a directory this user can write.", file=sys.stderr)
            return errors.StoreError.exit_code
        print(f"localinfer: internal error: {type(exc).__name__}: {exc}"
              " (run with --debug for the traceback)", file=sys.stderr)
        return INTERNAL_ERROR


_DISK_ERRORS = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


def _exit_if_llama_busy(code: int) -> None:
    """Exit now when a model load is inside llama.cpp on another thread (Ctrl-C during a
    load): the interpreter's shutdown would tear down what that thread is using under it (a
    segfault, now and then). Otherwise the process ends as usual (atexit flushes run)."""
    if loads_in_progress():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" hint for a mistyped option, command or choice (Python
    3.11's argparse has no ``suggest_on_error``)."""

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self.unrecognized(extras))
        return namespace

    def unrecognized(self, extras: Sequence[str]) -> str:
        options = [s for action in self._actions for s in action.option_strings]
        hints = [close for extra in extras if extra.startswith("-")
                 for close in difflib.get_close_matches(extra.split("=", 1)[0], options, n=1)]
        return (f"unrecognized arguments: {' '.join(extras)}"
                + (f"; did you mean {' or '.join(hints)}?" if hints else ""))

    def _check_value(self, action: argparse.Action, value: object) -> None:
        # argparse's one hook for a value outside an argument's choices (a command too).
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            close = difflib.get_close_matches(str(value), [str(c) for c in action.choices or ()],
                                              n=1)
            if not close:
                raise
            raise argparse.ArgumentError(action, f"{exc.message}; did you mean {close[0]}?"
                                         ) from None


class CommandParser(Parser):
    """A command's parser. It reports the arguments it does not know itself, with its own
    usage; argparse would leave them to the top-level parser, whose usage does not show the
    command's options."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self.unrecognized(extras))
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=CommandParser)
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
