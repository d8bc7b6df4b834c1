"""The one client of the daemon, used by ``localinfer run`` and the chat UI.

It finds the daemon through its pid file (or ``LOCALINFER_HOST``), talks to it over the Unix
socket (or TCP), and turns the daemon's event stream back into the runtime's own ``Token`` and
``Done`` events (the wire format is protocol.py's), so a front end cannot tell a daemon from an
in-process engine.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from .errors import ConfigError, DaemonError, LocalInferError
from .instance import running_daemon
from .paths import Paths, ensure_dir, get_paths
from .protocol import (
    ModelInfo,
    Start,
    ThinkingStart,
    error_from,
    event_from,
    generate_request_json,
    load_fraction_from,
    model_info_from,
)
from .runtime.types import (
    DEFAULT_SAMPLING,
    Done,
    Message,
    Priority,
    SamplingParams,
    Token,
    Usage,
)

log = logging.getLogger(__name__)

HOST_ENV = "LOCALINFER_HOST"


class ClientGeneration:
    """A generation running in the daemon: iterate for events; ``cancel()`` from any thread
    closes the stream, and the daemon stops the generation within a token."""

    def __init__(self, response: httpx.Response, close: Any,
                 cancel: Any | None = None) -> None:
        self._response = response
        self._close = close
        self._cancel_request = cancel
        self.info: ModelInfo | None = None
        self.model: str | None = None
        self.id: str | None = None
        self.prompt_tokens: int | None = None
        """The prompt's length in tokens, known from the stream's first event."""
        self.thinking: ThinkingStart | None = None
        """A thinking model's reply format, known from the stream's first event."""
        self.cancelled = False
        self.done: Done | None = None
        self._text: list[str] = []
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """Ask the daemon to stop; the stream then ends with its own ``Done`` (cancelled,
        with the usage and timings so far). If the daemon cannot be asked, the connection is
        closed, which cancels too (but loses the final figures)."""
        with self._lock:
            if self.cancelled or self.done is not None:
                return
            self.cancelled = True
        if self.id is not None and self._cancel_request is not None:
            try:
                self._cancel_request(self.id)
                return
            except (DaemonError, httpx.HTTPError, OSError):
                pass
        self._close()

    def __iter__(self) -> Iterator[Token | Done]:
        try:
            for line in self._response.iter_lines():
                if not line:
                    continue
                event = event_from(json.loads(line))
                if isinstance(event, Start):
                    self.model, self.id = event.model, event.id
                    self.prompt_tokens, self.info = event.prompt_tokens, event.info
                    self.thinking = event.thinking
                elif isinstance(event, Token):
                    self._text.append(event.text)
                    yield event
                elif isinstance(event, Done):
                    self.done = event
                    yield event
                    return
                elif isinstance(event, LocalInferError):
                    raise event
        except (httpx.HTTPError, OSError, RuntimeError):
            if not self.cancelled:
                raise DaemonError("the connection to the daemon was lost mid-reply.") from None
        finally:
            self._close()
        if not self.cancelled:
            raise DaemonError("the daemon ended the reply without a result.")
        # Cancelled: end the way the engine does.
        self.done = Done("".join(self._text), "cancelled", Usage(0, len(self._text)))
        yield self.done

    def result(self) -> Done:
        for event in self:
            if isinstance(event, Done):
                return event
        raise DaemonError("the daemon ended the reply without a result.")


class DaemonClient:
    def __init__(self, *, socket_path: Path | None = None, url: str | None = None,
                 api_key: str | None = None, connect_timeout_s: float = 2.0) -> None:
        if socket_path is None and url is None:
            raise ValueError("a socket path or a URL is needed")
        self.socket_path = socket_path
        self.url = url
        self._api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key and url else {}
        transport = httpx.HTTPTransport(uds=str(socket_path)) if socket_path else None
        self._http = httpx.Client(
            base_url=url or "http://localhost", transport=transport, headers=headers,
            timeout=httpx.Timeout(connect=connect_timeout_s, read=None, write=30.0, pool=30.0))

    @property
    def where(self) -> str:
        return f"unix:{self.socket_path}" if self.socket_path else str(self.url)

    @classmethod
    def discover(cls, paths: Paths | None = None) -> DaemonClient | None:
        """A client of the running daemon, or None when none answers."""
        api_key = os.environ.get("LOCALINFER_API_KEY") or None
        host = os.environ.get(HOST_ENV)
        if host:
            client = cls.for_address(host, api_key=api_key)
        else:
            info = running_daemon(paths)
            if not info or not info.get("socket"):
                return None
            client = cls(socket_path=Path(info["socket"]))
        try:
            client.health()
        except DaemonError:
            client.close()
            return None
        return client

    @classmethod
    def for_address(cls, address: str, *, api_key: str | None = None) -> DaemonClient:
        """``unix:/path``, ``http://host:port`` or ``host:port`` (LOCALINFER_HOST's forms)."""
        given = address
        if address.startswith("unix:"):
            if not address[5:].strip():
                raise ConfigError(f"{HOST_ENV}={address!r} names no socket: use"
                                  " unix:/path/to/localinfer.sock.", title="bad configuration")
            return cls(socket_path=Path(address[5:]))
        if "://" not in address:
            address = "http://" + address
        try:
            parts = urlsplit(address)
            port = parts.port
            if port is None and parts.hostname:  # no port: the daemon's default
                address = address.rstrip("/") + ":11480"
                parts, port = urlsplit(address), 11480
        except ValueError:  # a bad port, a bad IPv6 address
            parts, port = None, None
        if parts is None or not parts.hostname or not port or \
                parts.scheme not in ("http", "https"):
            raise ConfigError(f"{HOST_ENV}={given!r} is not an address: use host:port,"
                              " http://host:port (the port 1-65535) or unix:/path.",
                              title="bad configuration")
        return cls(url=address.rstrip("/"), api_key=api_key)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- requests ---------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise DaemonError(f"the daemon at {self.where} did not answer in time.") from None
        except (httpx.HTTPError, OSError) as exc:
            raise DaemonError(f"cannot reach the daemon at {self.where}: {exc}. Start it with"
                              " `localinfer serve`.") from None
        payload = _json(response)
        if response.status_code >= 400 and not (path == "/health" and
                                                 response.status_code == 503):
            raise error_from(payload, response.status_code)
        return payload

    def health(self) -> dict:
        return self._request("GET", "/health")

    def status(self) -> dict:
        return self._request("GET", "/localinfer/status")

    def load(self, model: str, *, keep_alive: float | None = None,
             progress: Callable[[float], None] | None = None) -> ModelInfo:
        """Have the daemon load ``model`` (if it has not) and describe it. ``progress`` gets
        the load's fraction done (0..1), polled from /health while it loads."""
        body: dict[str, Any] = {"model": model}
        if keep_alive is not None:
            body["keep_alive"] = keep_alive
        done = threading.Event()

        def poll() -> None:
            with self._sibling() as probe:
                while not done.wait(0.1):
                    try:
                        health = probe.health()
                    except DaemonError:
                        return
                    fraction = load_fraction_from(health)
                    if fraction is not None and progress is not None:
                        progress(fraction)

        poller = threading.Thread(target=poll, daemon=True) if progress else None
        if poller:
            poller.start()
        try:
            payload = self._request("POST", "/localinfer/load", json=body)
        finally:
            done.set()
        if progress:
            progress(1.0)
        info = model_info_from(payload.get("info") or {})
        if info is None:
            raise DaemonError(f"the daemon loaded {model} but did not describe it.")
        return info

    def cancel(self, generation_id: str) -> bool:
        return bool(self._request("POST", "/localinfer/cancel",
                                  json={"id": generation_id}).get("cancelled"))

    def _sibling(self) -> DaemonClient:
        """Another client of the same daemon (its own connection, for another thread)."""
        return DaemonClient(socket_path=self.socket_path, url=self.url, api_key=self._api_key)

    def count_tokens(self, model: str, text: str) -> int:
        """How many tokens ``text`` takes for ``model`` (loaded if it is not)."""
        return int(self._request("POST", "/localinfer/tokenize",
                                 json={"model": model, "text": text})["tokens"])

    def unload(self, model: str | None = None) -> list[str]:
        return self._request("POST", "/localinfer/unload", json={"model": model})["unloaded"]

    def shutdown(self) -> None:
        self._request("POST", "/localinfer/shutdown", json={})

    def generate(self, model: str, *, messages: Sequence[Message] | None = None,
                 prompt: str | None = None, params: SamplingParams = DEFAULT_SAMPLING,
                 priority: Priority = Priority.NORMAL,
                 keep_alive: float | None = None,
                 think: bool | str | None = None) -> ClientGeneration:
        body = generate_request_json(model, messages=messages, prompt=prompt, params=params,
                                     priority=priority, keep_alive=keep_alive, think=think)
        request = self._http.build_request("POST", "/localinfer/generate", json=body)
        try:
            response = self._http.send(request, stream=True)
        except (httpx.HTTPError, OSError) as exc:
            raise DaemonError(f"cannot reach the daemon at {self.where}: {exc}.") from None
        if response.status_code >= 400:
            response.read()
            payload = _json(response)
            response.close()
            raise error_from(payload, response.status_code)
        def cancel(generation_id: str) -> None:
            with self._sibling() as other:  # this client's connection is busy streaming
                other.cancel(generation_id)

        return ClientGeneration(response, response.close, cancel)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"error": response.text[:200]}


DAEMON_START_TIMEOUT_S = 30.0


def start_daemon(serve_args: Sequence[str], idle_exit_s: float
                 ) -> tuple[DaemonClient, int | None]:
    """Start ``localinfer serve`` for this home (detached, with an idle exit) and wait for it
    to answer: its client, and its pid (None where another front end's daemon answered
    first). Once more on the Unix socket alone when another program has the TCP port."""
    try:
        log_path = ensure_dir(get_paths().cache_dir) / "daemon.log"
    except OSError as exc:
        raise _cannot_start(exc) from None
    args = [*serve_args]
    for attempt in range(2):
        try:
            proc = spawn_daemon(args, idle_exit_s, log_path)
        except OSError as exc:  # a read-only home: its log cannot be written
            raise _cannot_start(exc) from None
        deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
        while time.monotonic() < deadline:
            client = DaemonClient.discover()
            if client is not None:
                return client, proc.pid
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        else:
            raise DaemonError(f"the daemon started (pid {proc.pid}) but did not answer"
                              f" within {DAEMON_START_TIMEOUT_S:.0f} s; see {log_path}.",
                              title="daemon unreachable")
        reason = last_error_line(log_path)
        if attempt == 0 and "port" in reason and "--no-tcp" not in args:
            # Another program has the TCP port: the Unix socket is enough for this UI.
            log.warning("daemon: %s; starting it on the Unix socket only", reason)
            args.append("--no-tcp")
            continue
        client = DaemonClient.discover()  # another UI may have started one meanwhile
        if client is not None:
            return client, None
        raise DaemonError(f"the daemon could not start: {reason or 'it exited'}"
                          f" (log: {log_path}).", title="daemon unreachable")
    raise AssertionError("unreachable")  # pragma: no cover


def _cannot_start(exc: OSError) -> DaemonError:
    """Why a daemon could not be started here (its log or socket folder cannot be written):
    a daemon error, so that a front end offers to run in process."""
    where = f" ({exc.filename})" if exc.filename else ""
    return DaemonError(f"cannot start the daemon: {exc.strerror or exc}{where}. Make"
                       " LOCALINFER_HOME writable, or run without the daemon (--no-daemon).",
                       title="daemon unreachable")


def spawn_daemon(args: Iterable[str], idle_exit_s: float, log_path: Path) -> subprocess.Popen:
    """``localinfer serve --idle-exit N`` in its own session: it outlives this front end."""
    command = [sys.executable, "-m", "localinfer", "serve", "--idle-exit",
               f"{idle_exit_s:g}", *args]
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file,
                                stderr=log_file, start_new_session=True, close_fds=True)


def last_error_line(log_path: Path) -> str:
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines[-20:]):
        if line.startswith("localinfer:"):
            return line.removeprefix("localinfer:").strip()
    return lines[-1].strip() if lines else ""
