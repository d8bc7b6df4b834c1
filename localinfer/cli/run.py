"""``localinfer run``: one prompt, its completion streamed to stdout, the speed figures to
stderr; through the session interface the chat UI uses: the running daemon when there is one,
else a model loaded in this process. The sampling flags left out take the model's defaults
(``sampling_defaults.py``); a thinking model's reasoning (``--chat``) goes to stderr, its
answer to stdout."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from ..config import Config
from ..errors import Cancelled, InvalidRequest
from ..hardware.load import LoadWindow
from ..progress import TerminalProgress
from ..runtime.types import Done, Message, Priority, Token
from .common import (
    add_load_flags,
    add_sampling_flags,
    gpu_layers_text,
    kept_text,
    load_flags_given,
    load_settings,
    sampling_params,
    split_text,
)

if TYPE_CHECKING:
    from ..session import Launcher, LoadStep, Session


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="generate a completion for one prompt",
                       description="Stream a completion for PROMPT to stdout, then one line of"
                                   " speed figures to stderr.")
    p.add_argument("model", metavar="MODEL", help="model name (gemma3:270m) or .gguf path")
    p.add_argument("prompt", metavar="PROMPT", help="the prompt; - reads it from stdin")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the model's chat template as a user message")
    p.add_argument("--system", help="system prompt (implies --chat)")
    p.add_argument("--think", choices=("on", "off", "low", "medium", "high"),
                   help="a thinking model's reasoning (with --chat): on, off or an effort"
                        " (default: the model's)")
    add_sampling_flags(p)
    add_load_flags(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object with text, usage and timings instead")
    p.add_argument("--no-daemon", action="store_true",
                   help="load the model in this process even when a daemon is running")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace, config: Config) -> int:
    # The session (the store, the planner, the daemon's client): not for building the parser.
    from ..selection import model_settings
    from ..session import Launcher

    sampling_params(args)  # bad flags fail before a model is loaded
    prompt = _stdin_text() if args.prompt == "-" else args.prompt
    if not prompt:  # before a model is loaded for it
        raise InvalidRequest("the prompt is empty: give the text to continue (or `-` and"
                             " pipe it in).")
    messages = None
    think = {None: None, "on": True, "off": False}.get(args.think, args.think)
    # The daemon when one runs (one copy of the model for the whole machine), else this
    # process; loading flags need a load of their own, so they mean this process.
    settings = load_settings(config, args)
    launcher = Launcher(settings, no_daemon=args.no_daemon or load_flags_given(args),
                        if_no_daemon="in_process", priority=Priority.NORMAL)
    # A preset's defaults (or the model's config.toml table) under the flags given; a preset
    # with a system prompt or seed turns is a chat (the session puts them first).
    preset = launcher.store.presets.get(args.model)
    own = (model_settings(config, launcher.store.resolve_preset(preset)) if preset
           else config.model_settings(args.model))
    if preset is not None and (preset.system or preset.messages):
        args.chat = True
    if args.think and not (args.chat or args.system):
        launcher.close()
        raise InvalidRequest("--think is for a chat: add --chat (the model's chat template"
                             " switches its thinking).")
    if args.chat or args.system:
        messages = ([Message("system", args.system)] if args.system else []) + [
            Message("user", prompt)]
    display = _LoadDisplay(args.model, launcher, quiet=args.json)
    session = None
    try:
        try:
            session = launcher.open(args.model, display)
        except KeyboardInterrupt:
            display.stop()
            raise _pull_interrupted(launcher, args.model) from None
        finally:
            display.close()
        display.loaded(session)
        asked = (own.ctx if own is not None and own.ctx else None) or settings.ctx
        if asked and session.in_process and not args.json and \
                session.info.n_ctx == -(-asked // 256) * 256 != asked:
            print(f"localinfer: warning: asked for a context of {asked} tokens; llama.cpp"
                  f" sizes it in steps of 256: it is {session.info.n_ctx}.", file=sys.stderr)
        # The machine's load over the generation goes with its calibration record.
        window = LoadWindow()
        # The model's defaults (catalog, GGUF, config.toml), a preset's over them, the
        # flags over both.
        defaults = {**launcher.sampling_defaults(session).values,
                    **(own.sampling() if own is not None else {})}
        params = sampling_params(args, defaults)
        generation = (session.chat(messages, params, think=think) if messages
                      else session.complete(prompt, params))
        done = _stream(generation, args.json)
        load = window.finish()
        if args.json:
            result = run_result_json(session.info.name, done)
            if generation.thought is not None:
                result["thinking"] = generation.thought.text
            print(json.dumps(result, indent=2))
        else:
            if not done.text.endswith("\n"):
                sys.stdout.write("\n")
            sys.stdout.flush()
            print(stats_line(done), file=sys.stderr)
        if session.in_process:  # after the output: measured vs predicted decode, for the planner
            # The hardware probes and the planner: not for building the parser.
            from ..planner.calibration import after_reply

            check = after_reply(done, info=session.info, n_threads=config.threads, load=load)
            if check.note:
                print(check.note, file=sys.stderr)
    finally:
        if session is not None:
            session.close()
        launcher.close()
    return Cancelled.exit_code if done.finish_reason == "cancelled" else 0


def _stdin_text() -> str:
    """The prompt piped in: UTF-8 text, else a clear error (not the unpaired surrogates
    Python's reader turns stray bytes into, refused later as if they were the user's)."""
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8-sig")  # a byte-order mark (Windows editors) is no text
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"the prompt piped in is not UTF-8 text (byte"
                             f" 0x{data[exc.start]:02x} at offset {exc.start}): convert it,"
                             " e.g. with iconv -t utf-8.") from None


def _pull_interrupted(launcher: Launcher, model: str) -> BaseException:
    """Ctrl+C while ``run`` opened ``model``: what a first-use pull left to resume (as
    ``pull`` says it), else a plain interruption."""
    from ..store import is_hub_name
    from ..store.hub_names import parse

    if not is_hub_name(model):
        return KeyboardInterrupt()
    try:
        prefix = parse(model).model + ":"
    except InvalidRequest:
        return KeyboardInterrupt()
    partial = next((p for p in launcher.store.partials() if p.name.startswith(prefix)), None)
    if partial is None or not partial.size_bytes:
        return KeyboardInterrupt()
    return Cancelled(f"the pull of {partial.name} was interrupted{kept_text(partial)}; run"
                     f" this command again (or `localinfer pull {partial.name}`) to resume.")


class _LoadDisplay:
    """The session's load steps as terminal bars: the starter model's bytes as it is copied
    into the store, then the load (this process's, or the daemon's) as a fraction; then the
    "Loaded" line, timed from the end of the copy. ``quiet`` (``--json``) keeps only the
    copy's bar."""

    def __init__(self, model: str, launcher: Launcher, *, quiet: bool) -> None:
        self.model = model
        self.launcher = launcher
        self.quiet = quiet
        self.started = time.monotonic()
        self.starter: TerminalProgress | None = None
        self.pulling: TerminalProgress | None = None
        self.load: TerminalProgress | None = None

    def __call__(self, step: LoadStep) -> None:
        if step.stage == "pull":  # a Hub model named hf.co/...: downloaded on first use
            if not step.total_bytes:  # a choice, a verification, the end: said in words
                if self.pulling is not None and step.fraction is None:
                    self.pulling.finish()
                    self.pulling = None
                if step.fraction is None and not self.quiet:
                    print(step.message, file=sys.stderr)
                return
            if self.pulling is None:
                self.pulling = TerminalProgress(f"Pulling {self.model}", total=step.total_bytes)
            self.pulling.update(round((step.fraction or 0.0) * step.total_bytes),
                                step.total_bytes)
            return
        if self.pulling is not None:
            self.pulling.finish()
            self.pulling = None
        if step.stage == "starter":
            if self.starter is None:
                self.starter = TerminalProgress("Installing the starter model",
                                                total=step.total_bytes)
            self.starter.update(round((step.fraction or 0.0) * step.total_bytes),
                                step.total_bytes)
            return
        self.close()
        if step.stage != "load" or not step.fraction or self.quiet:
            return
        if self.load is None:
            # A bar only for a load in progress: none before it starts (an early error stands
            # alone), none for a model the daemon already holds (done at once).
            if step.fraction >= 1.0:
                return
            label = (f"Loading {self.model}" if self.launcher.in_process
                     else f"Waiting for the daemon to load {self.model}")
            self.load = TerminalProgress(label, unit="fraction")
        self.load.fraction(step.fraction)

    def stop(self) -> None:
        """Interrupted: end the bar drawn now on a line of its own."""
        for bar in (self.pulling, self.load):
            if bar is not None:
                bar.finish("Stopped.")
        self.pulling = self.load = None

    def close(self) -> None:
        """The copy of the starter is over: end its bar and time the load from here."""
        if self.starter is not None:
            self.starter.finish()
            self.starter = None
            self.started = time.monotonic()

    def loaded(self, session: Session) -> None:
        if self.quiet:
            return
        info = session.info
        where = "" if session.in_process else f" ({session.where})"
        layers = (f"layers {split_text(info.split)}" if info.split else
                  f"{gpu_layers_text(info.n_gpu_layers, info.n_layers)} layers on GPU")
        line = (f"Loaded {info.name} ({info.quant}, {layers}) in"
                f" {time.monotonic() - self.started:.1f}s{where}")
        if self.load is not None:
            self.load.finish(line)
        else:
            print(line, file=sys.stderr)


def _stream(generation, quiet: bool):
    """Print a generation's text as it streams (unless quiet) and return its Done event.
    Ctrl+C cancels it: it stops within a token and the figures are still printed. A thinking
    model's reasoning goes to stderr (unless quiet)."""
    from ..session import Thought

    done = None
    previous = signal.signal(signal.SIGINT, lambda *_: generation.cancel())
    thinking = False
    try:
        for event in generation:
            if isinstance(event, Thought) and not quiet:
                sys.stderr.write(event.text)
                sys.stderr.flush()
                thinking = True
            elif isinstance(event, Token) and not quiet:
                if thinking:  # the reasoning ended: the answer starts on stdout
                    sys.stderr.write("\n")
                    thinking = False
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
