"""How the chat UI reaches a model: through the daemon (started in the background when none
runs) or an engine in this process, behind one small interface. No Textual here: the app calls
these from its worker threads and only renders what they return.

    Launcher.open(model, progress) -> ChatSession
    ChatSession.chat(messages, params) -> a generation: iterate Token/Done events, cancel()
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

from ..config import Config
from ..errors import DaemonError, LocalInferError, ModelLoadError
from ..paths import ensure_dir, get_paths
from ..runtime.backend import ModelInfo
from ..runtime.types import Done, Message, Priority, SamplingParams, Token
from ..store import STARTER_NAME, ModelStore, looks_like_path

log = logging.getLogger(__name__)

DAEMON_IDLE_EXIT_S = 1800.0
"""An auto-started daemon exits after this long without requests (the model itself unloads
after the daemon's keep-alive, 5 minutes by default)."""
DAEMON_START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class LoadStep:
    """Progress while a model gets ready, for the loading screen."""

    message: str
    fraction: float | None = None
    """0..1, or None when the step cannot say how far it is."""


Progress = Callable[[LoadStep], None]


class Generation(Protocol):
    def __iter__(self) -> Iterator[Token | Done]: ...

    def cancel(self) -> None: ...


class ChatSession(Protocol):
    """One model, ready to chat."""

    info: ModelInfo
    model: str
    """The name to ask for (canonical, with the quant)."""
    where: str
    """Where it runs, in words: "daemon unix:/run/...sock" or "in this process"."""

    def chat(self, messages: Sequence[Message], params: SamplingParams) -> Generation: ...

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        """Tokens the conversation takes in the context, when this session can count them."""
        ...

    def close(self) -> None: ...


class EngineSession:
    """An engine loaded in this process (``--no-daemon``)."""

    def __init__(self, engine: Any, model: str | None = None) -> None:
        self.engine = engine
        self.info: ModelInfo = engine.info
        self.model = model or engine.info.name
        self.where = "in this process"

    def chat(self, messages: Sequence[Message], params: SamplingParams) -> Generation:
        return self.engine.chat(messages, params, priority=Priority.INTERACTIVE)

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return len(self.engine.chat_tokens(messages))

    def close(self) -> None:
        self.engine.close()


class DaemonSession:
    """A model held by the daemon; the UI's requests go first (interactive priority)."""

    def __init__(self, client: Any, model: str, info: ModelInfo) -> None:
        self.client = client
        self.model = model
        self.info = info
        self.where = f"daemon {client.where}"

    def chat(self, messages: Sequence[Message], params: SamplingParams) -> Generation:
        generation = self.client.generate(self.model, messages=list(messages), params=params,
                                          priority=Priority.INTERACTIVE)
        return _InfoTracking(generation, self)

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return None  # the daemon counts at submit: ContextOverflow says when it is too long

    def close(self) -> None:
        self.client.close()


class _InfoTracking:
    """A daemon generation that updates the session's ModelInfo from its start event (the
    daemon may have reloaded the model with other settings since)."""

    def __init__(self, generation: Any, session: DaemonSession) -> None:
        self._generation = generation
        self._session = session

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt's size as the daemon counted it (known after the first event)."""
        return self._generation.prompt_tokens

    def __iter__(self) -> Iterator[Token | Done]:
        for event in self._generation:
            info = self._generation.info
            if info is not None and info is not self._session.info:
                self._session.info = info
            yield event

    def cancel(self) -> None:
        self._generation.cancel()


EngineOpener = Callable[..., Any]
"""``runtime.loader.open_engine``'s signature: (ref, config, on_copy=, on_load=) -> Engine."""


class Launcher:
    """Finds or starts what runs the model, and opens sessions on it."""

    def __init__(self, config: Config, *, no_daemon: bool = False,
                 open_engine: EngineOpener | None = None,
                 store: ModelStore | None = None,
                 serve_args: Sequence[str] = (),
                 start_daemon: bool = True,
                 idle_exit_s: float = DAEMON_IDLE_EXIT_S) -> None:
        self.config = config
        self.no_daemon = no_daemon
        self._open_engine = open_engine
        self.store = store or ModelStore()
        self.serve_args = tuple(serve_args)
        self.start_daemon = start_daemon
        self.idle_exit_s = idle_exit_s
        self.started_daemon_pid: int | None = None
        self._client: Any = None

    @property
    def in_process(self) -> bool:
        return self.no_daemon

    # --- choosing a model ---------------------------------------------------------------
    def pick_model(self, hardware: Any | None) -> str:
        """No model named: the config's default, else the planner's pick among the installed
        models, else the starter (installed from the ``starter`` extra on first use)."""
        if self.config.default_model:
            return self.config.default_model
        installed = self.store.list()
        if not installed:
            return STARTER_NAME
        if len(installed) == 1 or hardware is None:
            return installed[0].name
        from .. import gguf
        from ..hardware.calibration import load_ratios
        from ..planner import Candidate, PlanPrefs, plan

        candidates = []
        for m in installed:
            try:
                candidates.append(Candidate.from_header(gguf.read_header(m.path), name=m.name,
                                                        model=m.model))
            except LocalInferError as exc:
                log.warning("not planning %s: %s", m.name, exc)
        if not candidates:
            return installed[0].name
        try:
            chosen = plan(hardware, candidates, PlanPrefs(
                n_ctx=self.config.ctx, min_tps=self.config.min_tps,
                n_gpu_layers=self.config.gpu_layers, n_threads=self.config.threads,
                calibration=load_ratios(hardware))).choice
        except LocalInferError:
            chosen = None
        return chosen.candidate.name if chosen else candidates[0].name

    # --- opening ------------------------------------------------------------------------
    def open(self, model: str, progress: Progress) -> ChatSession:
        """Get ``model`` ready (install the starter, start the daemon, load) and return a
        session on it. Raises LocalInferError subclasses with a message for the user."""
        if self.no_daemon or looks_like_path(model):
            return self._open_in_process(model, progress)
        client = self.client(progress)
        # Resolve here, with progress: the starter is copied into the store on first use,
        # and an unknown name fails before the daemon is asked.
        resolved = self.store.resolve(model, progress=_copy_progress(progress))
        label = f"Loading {resolved.name} in the daemon…"
        progress(LoadStep(label))
        try:
            info = client.load(resolved.name,
                               progress=lambda f: progress(LoadStep(label, f)))
        except DaemonError as exc:
            if "cannot reach" in exc.message:
                raise
            raise ModelLoadError(f"the daemon could not load {resolved.name}: {exc.message}"
                                 ) from None
        return DaemonSession(client, resolved.name, info)

    def _open_in_process(self, model: str, progress: Progress) -> ChatSession:
        opener = self._open_engine
        if opener is None:
            from ..runtime.loader import open_engine as opener
        progress(LoadStep(f"Loading {model}…", 0.0))
        engine = opener(model, self.config, on_copy=_copy_progress(progress),
                        on_load=lambda f: progress(LoadStep(f"Loading {model}…", f)))
        engine.wait_ready()
        progress(LoadStep(f"Loaded {engine.info.name}", 1.0))
        return EngineSession(engine)

    def client(self, progress: Progress | None = None) -> Any:
        """The daemon's client: the running daemon, or one started now (detached, with an
        idle exit, so the model stays warm for editors after the chat ends)."""
        from ..client import HOST_ENV, DaemonClient

        if self._client is not None:
            try:
                self._client.health()
                return self._client
            except DaemonError:
                self._client.close()
                self._client = None
        client = DaemonClient.discover()
        if client is None:
            if os.environ.get(HOST_ENV):
                raise DaemonError(f"no daemon answers at {HOST_ENV}={os.environ[HOST_ENV]}."
                                  f" Start it there, unset {HOST_ENV}, or chat with"
                                  " --no-daemon.", title="daemon unreachable")
            if not self.start_daemon:
                raise DaemonError("no localinfer daemon is running. Start one with"
                                  " `localinfer serve`, or chat with --no-daemon.",
                                  title="daemon unreachable")
            if progress:
                progress(LoadStep("Starting the localinfer daemon…"))
            client = self._spawn_daemon()
        self._client = client
        return client

    def _spawn_daemon(self) -> Any:
        from ..client import DaemonClient

        log_path = ensure_dir(get_paths().cache_dir) / "daemon.log"
        args = [*self.serve_args]
        for attempt in range(2):
            proc = spawn_daemon(args, self.idle_exit_s, log_path)
            deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
            while time.monotonic() < deadline:
                client = DaemonClient.discover()
                if client is not None:
                    self.started_daemon_pid = proc.pid
                    return client
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
                return client
            raise DaemonError(f"the daemon could not start: {reason or 'it exited'}"
                              f" (log: {log_path}).", title="daemon unreachable")
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def spawn_daemon(args: Iterable[str], idle_exit_s: float, log_path: Path) -> subprocess.Popen:
    """``localinfer serve --idle-exit N`` in its own session: it outlives this UI."""
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


def _copy_progress(progress: Progress) -> Callable[[int, int], None]:
    def on_copy(done: int, total: int) -> None:
        progress(LoadStep("Installing the starter model into the store…",
                          done / total if total else None))
    return on_copy
