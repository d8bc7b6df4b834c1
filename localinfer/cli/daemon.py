"""``localinfer serve``, ``ps`` and ``stop``: the daemon and talking to it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from ..config import Config
from ..errors import (
    BackendUnavailable,
    ConfigError,
    DaemonError,
    InvalidRequest,
    WorkerError,
)
from ..hardware.rpc import MISMATCH, parse_endpoints, probe_worker
from ..instance import running_daemon
from ..progress import human_bytes
from .common import (
    add_load_flags,
    duration,
    load_settings,
    non_negative_int,
    port_arg,
    positive_int,
    positive_seconds,
    print_table,
    split_text,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="run the daemon (OpenAI and Ollama API on a socket and loopback TCP)",
        description="Hold one model for the whole machine and serve it to the chat UI and to"
                    " editor plugins, in the OpenAI (/v1) and Ollama (/api) wire formats.")
    p.add_argument("--host", default=None, help="TCP address (default 127.0.0.1, or"
                   " LOCALINFER_HOST)")
    p.add_argument("--port", type=port_arg, default=None, help="TCP port (default 11480)")
    p.add_argument("--no-tcp", action="store_true", help="listen on the Unix socket only")
    p.add_argument("--socket", default=None, metavar="PATH",
                   help="Unix socket path (default <runtime dir>/localinfer.sock)")
    p.add_argument("--keep-alive", default=None, metavar="DURATION",
                   help="how long an idle model stays loaded: 5m, 1h, 0 (unload at once),"
                        " -1 or any negative value (forever, as Ollama); default 5m")
    p.add_argument("--idle-exit", type=positive_seconds, default=None, metavar="SECONDS",
                   help="exit after this many seconds without requests")
    p.add_argument("--max-loaded", type=positive_int, default=None, metavar="N",
                   help="at most N models loaded at once (default: as many as fit in memory"
                        " together, by the plan's figures)")
    p.add_argument("--max-queue", type=non_negative_int, default=64, metavar="N",
                   help="requests that may wait for a slot before 503 (default 64)")
    p.add_argument("--slots", type=positive_int, default=None, metavar="N",
                   help="sequences decoded in parallel per model")
    add_load_flags(p)
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow this browser origin (repeatable; none by default)")
    p.add_argument("--model", default=None, metavar="MODEL", help="load this model at start")
    p.add_argument("--workers", default=None, metavar="HOST:PORT,...",
                   help="RPC workers (`localinfer worker` on other machines) whose devices take"
                        " layers of the models (default: config workers, LOCALINFER_WORKERS)")
    p.add_argument("--layer-split", default=None, metavar="N,N,...",
                   help="with --workers: layers on this machine's CPU, then on each worker"
                        " device in order, instead of the planner's split (default: config"
                        " layer_split)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("ps", help="show the daemon's address and the models it has loaded",
                       description="Where the daemon listens and what it has loaded; with no"
                                   " daemon running, says so (exit 0).")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--socket", action="store_true",
                   help="print only the running daemon's Unix socket path, for scripts"
                        " (curl --unix-socket); exit 8 when none runs")
    p.set_defaults(func=cmd_ps)

    p = sub.add_parser("stop", help="unload a model from the daemon, or stop the daemon",
                       description="With MODEL, unload it from the daemon; without, stop the"
                                   " daemon (in-flight replies end first).")
    p.add_argument("model", nargs="?", metavar="MODEL")
    p.set_defaults(func=cmd_stop)


def parse_address(address: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` or ``http://host:port`` -> (host, port)."""
    text = address.split("://", 1)[-1].rstrip("/")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    try:
        number = int(port) if port else default_port
    except ValueError:
        number = -1
    if not 1 <= number <= 65535:
        raise ConfigError(f"invalid address {address!r}: use host:port, the port 1-65535.",
                          title="bad configuration")
    return host or "127.0.0.1", number


def cmd_serve(args: argparse.Namespace, config: Config) -> int:
    # Starlette, uvicorn and the engine: not for building the parser.
    from ..daemon.guard import host_is_loopback
    from ..daemon.requests import parse_keep_alive
    from ..daemon.residency import MemoryPlan
    from ..daemon.server import Daemon, ServeOptions
    from ..daemon.state import DaemonSettings
    from ..loading import engine_factory, prefix_store

    config = load_settings(config, args).replace(slots=args.slots, workers=args.workers,
                                                 layer_split=args.layer_split)
    _check_workers(config)
    host, port = parse_address(args.host or config.host, config.port)
    if args.port is not None:
        port = args.port
    parsed = parse_keep_alive(args.keep_alive) if args.keep_alive else None
    keep_alive = config.keep_alive if parsed is None else parsed
    settings = DaemonSettings(
        api_key=config.api_key,
        cors_origins=tuple(args.cors_origin),
        extra_hosts=() if host_is_loopback(host) else (host,),
        any_host=host in ("0.0.0.0", "::"),
        idle_exit_s=args.idle_exit,
    )
    options = ServeOptions(
        socket_path=Path(args.socket).expanduser() if args.socket else None,
        host=host, port=port, tcp=not args.no_tcp, keep_alive_s=keep_alive,
        max_loaded=args.max_loaded, settings=settings)
    daemon = Daemon(options, engine_factory(config, max_queue=args.max_queue),
                    memory=MemoryPlan.for_machine(config), prefix_cache=prefix_store(config))
    daemon.start()
    if options.tcp and not host_is_loopback(host):
        print(f"localinfer serve: warning: {host} is not a loopback address; the API is"
              " reachable from the network" + ("" if config.api_key else
                                                " without an API key (set LOCALINFER_API_KEY)"),
              file=sys.stderr)
    print(f"localinfer serve: listening on {daemon.where} (pid {os.getpid()});"
          " Ctrl+C to stop", flush=True)
    if args.model:
        _preload(daemon, args.model)
    daemon.run()
    print("localinfer serve: stopped", flush=True)
    return 0


def _check_workers(config: Config) -> None:
    """Say what each RPC worker offers, before serving: a worker of another protocol
    version, or a build without RPC, stops ``serve`` here; one that does not answer yet is
    only warned about (each load probes the workers again)."""
    from ..loading import parse_layer_split
    from ..runtime.llama import RPC_MISSING, supports_rpc

    endpoints = parse_endpoints(config.workers)
    if config.layer_split:
        parse_layer_split(config.layer_split)
        if not endpoints:
            raise InvalidRequest("layer_split splits a model across RPC workers: give"
                                 " --workers too (or leave layer_split out).")
    if not endpoints:
        return
    if not supports_rpc():
        raise BackendUnavailable(RPC_MISSING, title="no RPC support in this build")
    for endpoint in endpoints:
        try:
            worker = probe_worker(endpoint, measure_link=False)
        except WorkerError as exc:
            if exc.title == MISMATCH:
                raise
            print(f"localinfer serve: warning: {exc.message}", file=sys.stderr)
            continue
        offered = ", ".join(f"{d.name} {d.memory_free_gib:.1f} GiB free" for d in worker.devices)
        print(f"localinfer serve: worker {endpoint}"
              f"{f' ({worker.name})' if worker.name else ''}: {offered}", flush=True)


def _preload(daemon, model: str) -> None:
    """Load a model as soon as the server runs, through its own API (so keep-alive applies)."""
    from ..client import DaemonClient  # httpx: not for building the parser

    def load() -> None:
        if not daemon.ready.wait(30):
            return
        client = DaemonClient(socket_path=daemon.socket_path)
        try:
            client._request("POST", "/api/generate", json={"model": model})
            print(f"localinfer serve: loaded {model}", flush=True)
        except Exception as exc:
            print(f"localinfer serve: could not load {model}: {exc}", file=sys.stderr)
        finally:
            client.close()

    threading.Thread(target=load, name="preload", daemon=True).start()


NO_DAEMON = "no daemon is running (`localinfer serve` starts one)"


def _client():
    """A client of the running daemon, or None when none answers."""
    from ..client import DaemonClient  # httpx: not for building the parser

    return DaemonClient.discover()


def cmd_ps(args: argparse.Namespace, config: Config) -> int:
    from ..session import memory_text, processor_text  # the store and planner: not for --help

    client = _client()
    if args.socket:
        if client is not None:
            client.close()
        if client is None or client.socket_path is None:
            if client is None:
                raise DaemonError(f"{NO_DAEMON}.", title="daemon not running")
            raise DaemonError(f"the daemon is reached at {client.where} (LOCALINFER_HOST),"
                              " not through a Unix socket.", title="no daemon socket")
        print(client.socket_path)
        return 0
    if client is None:
        print(json.dumps({"running": False, "loaded": []}) if args.json else f"{NO_DAEMON}.")
        return 0
    with client:
        status = client.status()
    if args.json:
        print(json.dumps({"running": True, "socket": str(client.socket_path or "") or None,
                          **status}, indent=2))
        return 0
    print(f"daemon (pid {status.get('pid', '?')}) on {_listening(client)}")
    shared = status.get("memory") or {}
    if shared.get("budget"):
        print(_budget_text(shared))
    if status.get("prefix_cache"):
        print(prefix_cache_text(status["prefix_cache"]))
    if status.get("loading"):
        print(f"loading {status['loading']}...")
    if not status["loaded"]:
        print("No model loaded.")
        return 0
    rows = [("NAME", "SIZE", "MEMORY", "PROCESSOR", "CONTEXT", "SLOTS", "ACTIVE", "UNTIL")]
    for entry in status["loaded"]:
        info = entry["info"]
        memory = entry.get("memory")
        expires = entry["expires_in_s"]
        until = ("in use" if entry["in_flight"] else "forever" if expires is None
                 else f"{duration(expires)} from now")
        rows.append((info["name"], human_bytes(info["size_bytes"]),
                     memory_text(memory), processor_text(info, memory),
                     str(info["n_ctx"]), str(info["n_slots"]),
                     str(entry["stats"]["active"]), until))
    print_table(rows)
    for entry in status["loaded"]:
        if entry["info"].get("split"):
            print(f"{entry['info']['name']} layers: {split_text(entry['info']['split'])}")
        if entry.get("settings"):
            print(f"{entry['info']['name']} settings (config.toml):"
                  f" {settings_text(entry['settings'])}")
    return 0


def prefix_cache_text(cache: dict) -> str:
    """One line: the prefix cache's size on disk and this daemon's hit rate."""
    lookups = cache["lookups"]
    rate = f"{cache['hits']} of {lookups} lookups hit ({100 * cache['hit_rate']:.0f}%)" \
        if lookups else "no lookups yet"
    return (f"prefix cache: {human_bytes(cache['bytes'])} of {human_bytes(cache['max_bytes'])}"
            f" on disk in {cache['entries']} prefix{'' if cache['entries'] == 1 else 'es'};"
            f" {rate},"
            f" {cache['restored_tokens']:,} tokens restored, {cache['saves']} saved")


def settings_text(settings: dict) -> str:
    """A model's own settings from config.toml in words: "ctx 16384, temperature 0.6"."""
    return ", ".join(f"{key} {value}" for key, value in settings.items())


def _budget_text(memory: dict) -> str:
    """One line: what the loaded models hold of the budget they share, and the cap."""
    budget, used = memory["budget"], memory["used"]
    text = f"memory: {human_bytes(used['ram_bytes'])} of {human_bytes(budget['ram_bytes'])} RAM"
    if budget["vram_bytes"] and not budget["unified"]:
        text += (f", {human_bytes(used['vram_bytes'])} of"
                 f" {human_bytes(budget['vram_bytes'])} VRAM")
    text += " for loaded models"
    if memory.get("max_loaded"):
        text += f" (at most {memory['max_loaded']} models)"
    return text


def _listening(client) -> str:
    """Where the daemon listens: its socket and URL from its pid file, else the address the
    client reached it at (LOCALINFER_HOST)."""
    info = running_daemon() or {}
    if client.socket_path is not None and info.get("socket") == str(client.socket_path):
        return " and ".join(filter(None, [f"unix:{info['socket']}", info.get("url")]))
    return client.where


def cmd_stop(args: argparse.Namespace, config: Config) -> int:
    client = _client()
    if client is None:
        print(f"{NO_DAEMON}; nothing to {'unload' if args.model else 'stop'}.")
        return 0
    with client:
        if args.model:
            unloaded = client.unload(args.model)
            print(f"unloaded {', '.join(unloaded)}" if unloaded else
                  f"{args.model} was not loaded")
            return 0
        where = client.where
        client.shutdown()
    # Wait for it to go, so that a following `serve` does not find it still running.
    deadline = time.monotonic() + 15
    while running_daemon() is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"stopped the daemon at {where}")
    return 0
