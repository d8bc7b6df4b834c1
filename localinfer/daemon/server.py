"""The daemon's lifecycle: one instance per user, its sockets, signals and housekeeping.

    lock (pid file) -> bind the Unix socket (0600) and loopback TCP -> serve -> shutdown

A second ``serve`` finds the first through the pid file, which the running daemon holds
locked (flock), and says where it listens. A pid file or socket left by a crash is not locked,
so it is recognised as stale and replaced. SIGINT/SIGTERM end every in-flight stream and pull
(each gets a final error line; a pull keeps its partial file), close the listeners, unload the
models and remove the socket. A request uvicorn cannot parse gets a JSON 400 too.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from ..errors import DaemonError
from ..instance import InstanceLock, default_socket_path, pid_file, runtime_dir
from ..paths import Paths, get_paths
from ..runtime.disk_cache import PrefixStore
from .bridge import STALLED, PullJob
from .error_replies import error_body
from .http_app import create_app
from .manager import EngineFactory, ModelManager
from .residency import MemoryPlan
from .state import DaemonSettings, DaemonState

log = logging.getLogger(__name__)

DEFAULT_PORT = 11480
_MAX_UNIX_PATH = 104  # sun_path is 108 bytes on Linux, 104 on macOS


@dataclass(frozen=True)
class ServeOptions:
    """Where and how the daemon listens."""

    socket_path: Path | None = None
    """Unix socket (default: <runtime dir>/localinfer.sock)."""
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    """TCP port; 0 picks a free one (tests)."""
    tcp: bool = True
    keep_alive_s: float = 300.0
    max_loaded: int | None = None
    """At most this many models loaded at once; None: as many as the memory plan fits."""
    settings: DaemonSettings = DaemonSettings()


# Listening from the bind on: a client that connects once `serve` has said where it listens
# waits in the kernel's queue until uvicorn runs, instead of being refused (seen under load).
BACKLOG = 2048  # uvicorn's own default


def bind_unix(path: Path) -> socket.socket:
    if len(os.fsencode(path)) > _MAX_UNIX_PATH:
        raise DaemonError(f"the socket path {path} is too long for a Unix socket; pass a"
                          " shorter one with --socket (or a shorter LOCALINFER_HOME).")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.is_socket():
        # This home's instance lock is ours, but --socket may name another home's socket:
        # one that answers is a live daemon's, never taken over (its clients would lose it,
        # and it would lose the path when this one exits).
        if _answers(path):
            raise DaemonError(f"a daemon is already listening on {path} (another home's);"
                              " choose another --socket path, or stop that daemon first.",
                              title="socket in use")
        path.unlink()  # a crash's leftover
    elif path.exists() or path.is_symlink():
        raise DaemonError(f"{path} exists and is not a socket: move it away, or start the"
                          " daemon with another --socket path.")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # created 0600 from the start: no window for other users
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


def _answers(path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket at ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (TimeoutError, BlockingIOError):  # a live daemon whose backlog is full
        return True
    except OSError:  # refused (nobody listens), or not ours to reach
        return False
    finally:
        probe.close()
    return True


def bind_tcp(host: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise DaemonError(f"port {port} on {host} is already in use by another program;"
                              " pick another with --port, or --no-tcp for the Unix socket"
                              " only.", title="port in use") from None
        raise DaemonError(f"cannot listen on {host}:{port}: {exc.strerror}.") from None
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


def url_for(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


MAX_CONNECTIONS = 512
"""Connections open at once past which a new one is answered 503 and closed: a client that
opens connections without closing them (each idle one lasts up to REQUEST_READ_S, or
uvicorn's keep-alive) would otherwise use up the daemon's file descriptors, and then nobody
could reach it (~21,000 did here). Editors and agents keep a few each."""
FD_SPARE = 128
"""File descriptors kept for the daemon's own files (models, the prefix cache, logs) below the
process's limit: the connection cap is at most the limit less these."""
_fd_limit = 1 << 20
"""The open-files limit ``raise_fd_limit`` found (before it runs: no bound of its own)."""


def raise_fd_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (as Go's runtime does;
    macOS starts processes at 256, below MAX_CONNECTIONS) and return the limit now."""
    global _fd_limit
    try:
        import resource
    except ImportError:  # not on a POSIX system
        return _fd_limit
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for want in (hard, 65536, 10240):  # macOS refuses more than OPEN_MAX (10240)
        if want == resource.RLIM_INFINITY or want <= soft:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            continue
        soft = want
        break
    _fd_limit = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return _fd_limit


def connection_cap() -> int:
    """Connections open at once past which a new one is refused: MAX_CONNECTIONS, or fewer
    where the open-files limit leaves less room."""
    return max(1, min(MAX_CONNECTIONS, _fd_limit - FD_SPARE))


REQUEST_READ_S = 30.0
"""How long a connection may take to send a whole request (from its first byte, or from the
connection when it sends none): one that sends nothing or half a request is closed after it,
or enough of them would use up the daemon's file descriptors; half a request is answered 408
first."""


UNFINISHED = "ASGI callable returned without completing response."
"""What uvicorn logs at error when an app returns mid-response; it then closes the connection."""


class _StallAwareLog:
    """uvicorn's error logger for one connection, where the close of a stream ended for a
    client that read nothing (``bridge.STALLED``) is logged at info as that, not at error as
    a response its app left unfinished; everything else goes to uvicorn's logger."""

    def __init__(self, logger: logging.Logger, protocol: asyncio.Protocol) -> None:
        self._logger = logger
        self._protocol = protocol

    def error(self, msg: object, *args: object, **kwargs: object) -> None:
        scope = getattr(self._protocol, "scope", None) or {}
        if msg == UNFINISHED and scope.get(STALLED):
            log.info("%s: closed the connection of the stream its client stopped reading",
                     scope.get("path"))
            return
        self._logger.error(msg, *args, **kwargs)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self._logger, name)


class _JsonRejects(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's HTTP protocol, answering a request it cannot parse (a malformed request
    line or header) with the JSON error shape instead of its plain-text 400, closing a
    connection whose request does not arrive whole within REQUEST_READ_S (with a 408 where
    part of it came: a client on a slow link learns why), refusing connections past
    MAX_CONNECTIONS, and logging a stalled stream's close as that (``_StallAwareLog``)."""

    _reading: asyncio.TimerHandle | None = None
    _begun = False
    """A request's first byte has come, and not yet its last."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.logger = _StallAwareLog(logging.getLogger("uvicorn.error"), self)

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        cap = connection_cap()
        if len(self.connections) > cap:
            log.warning("refusing a connection: %d are open", len(self.connections) - 1)
            self._close_with(503, "Service Unavailable",
                             f"the daemon has {cap} connections open already: close"
                             " the ones not in use (a client that opens one per request"
                             " without closing it?), then try again", "too_many_connections")
            return
        if hasattr(AutoHTTPProtocol, "on_message_complete"):  # httptools' parser (h11's has
            self._read_deadline()  # no such callbacks: no deadline rather than a wrong one)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun = True
        self._read_deadline()

    def on_message_complete(self) -> None:
        self._begun = False
        self._read_done()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._read_done()
        super().connection_lost(exc)

    def _read_deadline(self) -> None:
        self._read_done()
        self._reading = self.loop.call_later(REQUEST_READ_S, self._too_slow)

    def _read_done(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None

    def _too_slow(self) -> None:
        self._reading = None
        log.info("closing a connection whose request did not arrive within %.0f s",
                 REQUEST_READ_S)
        cycle = getattr(self, "cycle", None)
        answered = cycle is not None and getattr(cycle, "response_started", False)
        if self._begun and not answered and not self.transport.is_closing():
            self._close_with(408, "Request Timeout", f"the request did not arrive whole within"
                             f" {REQUEST_READ_S:g} s; send it again, all of it at once",
                             "request_timeout")
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._close_with(400, "Bad Request", msg.rstrip(".") + ": send a well-formed HTTP/1.1"
                         " request.", "invalid_http_request")

    def _close_with(self, status: int, reason: str, message: str, code: str) -> None:
        """Answer ``status`` with the JSON error shape and close the connection (the request
        was never handed to the app: its path is unknown, hence the OpenAI shape)."""
        body = json.dumps(error_body("/", status, message, code)).encode()
        self.transport.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json"
                             f"\r\ncontent-length: {len(body)}\r\nconnection: close"
                             f"\r\n\r\n".encode() + body)
        self.transport.close()


class _Server(uvicorn.Server):
    """uvicorn's server, ending in-flight streams at the first signal and not re-raising the
    signal afterwards (the caller cleans up and exits normally)."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._on_exit()

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit)
                     for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


class Daemon:
    """A configured daemon: ``start()`` binds (errors surface here), ``run()`` serves until
    a signal, ``/localinfer/shutdown``, the idle exit or ``stop()``."""

    def __init__(self, options: ServeOptions, factory: EngineFactory, *,
                 paths: Paths | None = None, manager: ModelManager | None = None,
                 memory: MemoryPlan | None = None, prefix_cache: PrefixStore | None = None
                 ) -> None:
        self.options = options
        self.memory = memory
        self.prefix_cache = prefix_cache
        """The prefix cache on disk the factory's engines use, for the status (or None)."""
        self.paths = paths or get_paths()
        self.factory = factory
        self._manager = manager
        self.socket_path = options.socket_path or default_socket_path(self.paths)
        self.url: str | None = None
        self._lock = InstanceLock(pid_file(self.paths))
        self._sockets: list[socket.socket] = []
        self._bound: int | None = None
        """The inode of the socket file this daemon bound (None: it bound none)."""
        self._server: _Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.state: DaemonState | None = None
        self.ready = threading.Event()

    def start(self) -> None:
        runtime_dir(self.paths)
        raise_fd_limit()
        self._lock.acquire()
        try:
            self._sockets.append(bind_unix(self.socket_path))
            self._bound = self.socket_path.stat().st_ino
            if self.options.tcp:
                tcp = bind_tcp(self.options.host, self.options.port)
                self._sockets.append(tcp)
                self.url = url_for(self.options.host, tcp.getsockname()[1])
            self._lock.write({"pid": os.getpid(), "socket": str(self.socket_path),
                              "url": self.url, "started": time.time()})
        except BaseException:
            self._cleanup()
            raise

    @property
    def where(self) -> str:
        return " and ".join(filter(None, [f"unix:{self.socket_path}", self.url]))

    def run(self) -> None:
        """Serve until asked to stop (blocking). Cleans up the socket and pid file."""
        # uvloop when installed: its transports and thread wake-ups cost less per token.
        loop_factory = uvicorn.Config(app="").get_loop_factory()  # no app needed to pick it
        try:
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                runner.run(self._serve())
        finally:
            self._cleanup()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        manager = self._manager or ModelManager(
            self.factory, keep_alive_s=self.options.keep_alive_s,
            max_loaded=self.options.max_loaded, memory=self.memory)
        state = DaemonState(manager, self.options.settings)
        state.prefix_cache = self.prefix_cache
        self.state = state
        app = create_app(state)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=5, server_header=False,
                                http=_JsonRejects)
        server = _Server(config, on_exit=self._end_streams)
        self._server = server
        housekeeping = asyncio.ensure_future(self._housekeeping(state, server))
        try:
            self.ready.set()
            await server.serve(sockets=self._sockets)
        finally:
            housekeeping.cancel()
            manager.cancel_all()
            await manager.close()
            if self.prefix_cache is not None:  # the saves still queued are written first
                await asyncio.to_thread(self.prefix_cache.flush)

    def _end_streams(self) -> None:
        PullJob.cancel_all()  # each pull stops within a chunk, its partial file kept
        if self._loop is not None and self.state is not None:
            self.state.shutting_down = True
            with contextlib.suppress(RuntimeError):  # stopped already: its loop is closed
                self._loop.call_soon_threadsafe(self.state.manager.cancel_all)

    async def _housekeeping(self, state: DaemonState, server: _Server) -> None:
        idle_exit = state.settings.idle_exit_s
        while not server.should_exit:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(state.exit_requested.wait(), timeout=0.5)
            if state.exit_requested.is_set():
                self.stop()
                return
            try:
                await state.manager.expire()
            except Exception:  # housekeeping must survive a failed unload
                log.exception("unloading an expired model failed")
            if state.manager.busy:  # a reply still streams: idle from its end, not its start
                state.touch()
            idle = time.monotonic() - state.last_activity
            if idle_exit and idle >= idle_exit:
                log.info("no requests for %.0f s: exiting", idle)
                self.stop()
                return

    def stop(self) -> None:
        """Ask the server to stop (thread-safe): streams end, then listeners close."""
        if self._server is not None:
            self._server.should_exit = True
            self._end_streams()

    def _cleanup(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self._sockets.clear()
        with contextlib.suppress(OSError):
            # Only the socket this daemon bound, still there: never a file at a mistyped
            # --socket path, nor another home's daemon's socket, which a start refused as
            # "socket in use" removed (that daemon then ran on, out of reach of ps and stop).
            if self._bound is not None and self.socket_path.is_socket() and \
                    self.socket_path.stat().st_ino == self._bound:
                self.socket_path.unlink()
        self._bound = None
        self._lock.release()
