"""``localinfer chat``: the terminal chat UI (localinfer/tui/)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..config import Config
from ..errors import ConfigError, LocalInferError
from .common import duration, load_settings

if TYPE_CHECKING:  # the session loads the planner and the store: not for building the parser
    from ..session import Launcher, Session


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat", help="chat in the terminal, with live speed figures",
        description="Chat with a model in a terminal UI that shows, while the reply streams,"
                    " decode tok/s, time to first token, prefill speed, the context used, where"
                    " the layers run and how close decode is to the memory-bandwidth roofline."
                    " It attaches to the running daemon, or starts one in the background (it"
                    " exits after 30 idle minutes) so the model stays warm for editors.",
        epilog="Keys: Enter sends, Shift+Enter or Ctrl+J new line, Esc cancels the reply,"
               " Ctrl+N new chat, Ctrl+R chats, Ctrl+O models, Ctrl+S chat settings, F2 copy"
               " the last reply, F3 attach a file (/file PATH), F4 edit the last message,"
               " F5 regenerate the last reply (←/→ on it: the others), F8 thinking"
               " (/think on|off|low|medium|high), F1 help, Ctrl+Q quit.")
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="model name (gemma3:270m) or .gguf path; default: the config's"
                        " default_model, else the planner's pick among installed models,"
                        " else the starter model")
    p.add_argument("--no-daemon", action="store_true",
                   help="load the model in this process instead of the daemon")
    resume = p.add_mutually_exclusive_group()
    resume.add_argument("-c", "--continue", dest="resume", action="store_const",
                        const="latest", help="resume the most recent chat")
    resume.add_argument("--chat", dest="resume", metavar="ID",
                        help="resume the chat with this id (Ctrl+R lists them)")
    p.add_argument("--light", action="store_true", help="start in the light theme")
    p.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace, config: Config) -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # a script, a pipe, a CI job
        raise ConfigError("`localinfer chat` is a full-screen terminal program and this is not"
                          " a terminal; run it in one, or use `localinfer run MODEL PROMPT`"
                          " (`--chat` for a chat turn) from a script.", title="not a terminal")
    from ..tui.app import create_app  # Textual: not for building the parser

    app = create_app(args.model, config=load_settings(config, args), no_daemon=args.no_daemon,
                     resume=args.resume,
                     theme="textual-light" if args.light else None)
    app.run()
    note = daemon_note(app.launcher, app.session)
    if note:
        print(note)
    return app.return_code or 0


def daemon_note(launcher: Launcher, session: Session | None) -> str | None:
    """The line printed once the chat UI is gone, when it used the daemon (or started it):
    the daemon keeps running with the model loaded for editors, for how long, and how to stop
    it. None when the chat ran in this process, or the daemon is gone."""
    started = launcher.started_daemon_pid is not None
    if not started and (session is None or session.in_process):
        return None
    from ..client import DaemonClient  # httpx: not for building the parser

    client = DaemonClient.discover()
    if client is None:
        return None
    try:
        status = client.status()
    except LocalInferError:
        status = {}
    finally:
        client.close()
    pid = status.get("pid") or launcher.started_daemon_pid
    line = f"localinfer: the daemon{f' (pid {pid})' if pid else ''}"
    loaded = status.get("loaded") or []
    if loaded:
        names = ", ".join(entry["info"]["name"] for entry in loaded)
        keep = [entry["expires_in_s"] if entry.get("expires_in_s") is not None
                else entry["keep_alive_s"] for entry in loaded]
        line += f" keeps {names} loaded for editors " + (
            "until it is stopped" if min(keep) < 0 else f"for {duration(max(keep))}")
    else:
        line += " keeps running"
    if started:
        line += f", and exits after {duration(launcher.idle_exit_s)} without requests"
    return line + "; `localinfer stop` stops it now."

