"""The one way a front end reaches a model: the daemon (started in the background when none runs)
or an engine in this process, behind one interface; and what a front end shows about models
besides their replies (the planner's verdict on each, the roofline and the predicted speed of
the loaded one; which model to pick is ``selection.py``'s). No UI here: the chat UI calls these
from its worker threads.

    Launcher(config).open(model, progress) -> Session
    Session.chat(messages, params, think=) | Session.complete(prompt, params) -> Generation:
        iterate Token/Thought/Done events, cancel() from any thread
    Launcher.pick_model / model_rows / pull: the models a front end lists, picks and pulls

``Session`` and ``Generation`` are the typed seam a front end reads a model through (its info,
the prompt's size, the events with their timings); ``EngineSession`` and ``DaemonSession`` are
the two kinds of session. A chat with a thinking model is split here, for both, by the
runtime's splitter (runtime/thinking.py, the one the daemon's routes use): ``Thought`` events
carry the reasoning, ``Token`` events the answer alone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import gguf
from .config import Config, ModelSettings
from .errors import DaemonError, LocalInferError, ModelLoadError, ModelNotFound, OfflineError
from .planner import Candidate, Roofline, plan, predict, roofline_for
from .progress import human_bytes
from .protocol import ModelInfo, ThinkingStart
from .runtime.thinking import (
    Splitter,
    splitter_for,
    starts_thinking,
    template_vars,
    thinking_format,
)
from .runtime.types import Done, LiveStats, Message, Priority, SamplingParams, Token
from .sampling_defaults import SamplingDefaults, model_defaults
from .selection import (
    best_or_smallest,
    catalog_candidates,
    installed_candidate,
    instruct_offer,
    pick_model,
    plan_prefs,
    pull_target,
)
from .store import (
    InstalledModel,
    ModelStore,
    PullCallback,
    PullProgress,
    is_hub_name,
    looks_like_path,
    pull_model,
)
from .store.presets import Preset

if TYPE_CHECKING:  # the client loads httpx, the engine jinja2, numpy and llama.cpp
    from .client import ClientGeneration, DaemonClient
    from .hardware import HardwareProfile
    from .planner import PlanPrefs
    from .runtime.engine import Engine
    from .runtime.engine import Generation as EngineGeneration
    from .store import CopyProgress

log = logging.getLogger(__name__)

DAEMON_IDLE_EXIT_S = 1800.0
"""An auto-started daemon exits after this long without requests (the model itself unloads
after the daemon's keep-alive, 5 minutes by default)."""
IF_NO_DAEMON = ("start", "fail", "in_process")
"""What a Launcher does when no daemon answers: start one (the chat UI), fail with a message,
or load the model in this process (``localinfer run``)."""


@dataclass(frozen=True)
class LoadStep:
    """Progress while a model gets ready, for a loading screen or a progress bar."""

    message: str
    fraction: float | None = None
    """0..1, or None when the step cannot say how far it is."""
    stage: str = ""
    """"starter" (copying the starter model into the store; ``total_bytes`` is its size),
    "pull" (downloading a Hub model named hf.co/...; ``total_bytes`` is its size), "daemon"
    (starting it), "load" (fraction: of the load) or "loaded" (in process)."""
    total_bytes: int = 0


Progress = Callable[[LoadStep], None]


@dataclass(frozen=True)
class Thought:
    """A piece of a thinking model's reasoning, split from the answer (``Token`` events then
    carry the answer alone)."""

    text: str
    live: LiveStats


@dataclass(frozen=True)
class ThoughtStats:
    """A thinking reply's reasoning and the answer's own figures, measured by the session as
    the pieces arrived (the engine's timings count from the first token, reasoning or not)."""

    text: str
    tokens: int
    """Tokens generated before the answer's first (the reasoning, with its tags)."""
    ms: float
    """From the reasoning's first token to the answer's first (or to the end)."""
    decode_tps: float
    """The reasoning's tokens after its first, over that time."""
    answer_ttft_ms: float
    """From the request to the answer's first token (0: no answer came)."""
    answer_decode_tps: float
    """The answer's tokens after its first, over the time since it."""


Event = Token | Thought | Done


class Generation(Protocol):
    """One reply being made: iterate it for ``Token`` events (the text, with the live
    figures), ``Thought`` events (a thinking model's reasoning) and a final ``Done`` (the
    answer's whole text, the usage and the engine's timings); ``cancel()`` from any
    thread."""

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt's size in tokens as the model's side counted it, once known (through the
        daemon: after the stream's first event); None until then, and in this process, where
        ``Session.count_tokens`` counts it before the request is sent."""
        ...

    @property
    def thought(self) -> ThoughtStats | None:
        """The reasoning, once the reply has ended; None when there was none."""
        ...

    def __iter__(self) -> Iterator[Event]: ...

    def cancel(self) -> None: ...


class Session(Protocol):
    """One model, ready to generate."""

    info: ModelInfo
    model: str
    """The name to ask for (canonical, with the quant)."""
    where: str
    """Where it runs, in words: "daemon unix:/run/...sock" or "in this process"."""
    in_process: bool

    def chat(self, messages: Sequence[Message], params: SamplingParams, *,
             think: bool | str | None = None) -> Generation:
        """The reply to ``messages``; ``think``: a thinking model's reasoning on, off, an
        effort ("low", "medium", "high"), or None for the model's default (refused with
        InvalidRequest, naming the model, where its template cannot do it)."""
        ...

    def complete(self, prompt: str, params: SamplingParams) -> Generation:
        """Continue ``prompt`` as raw text (no chat template)."""
        ...

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        """Tokens the conversation takes in the context, when this session can count them."""
        ...

    def count_text(self, text: str) -> int:
        """Tokens ``text`` takes (an attached file, before it is sent)."""
        ...

    def close(self) -> None: ...


class EngineSession:
    """An engine loaded in this process (``--no-daemon``)."""

    in_process = True

    def __init__(self, engine: Engine, model: str | None = None, *,
                 priority: Priority = Priority.INTERACTIVE) -> None:
        self.engine = engine
        self.info: ModelInfo = engine.info
        self.model = model or engine.info.name
        self.where = "in this process"
        self.priority = priority

    def chat(self, messages: Sequence[Message], params: SamplingParams, *,
             think: bool | str | None = None) -> Generation:
        engine = self.engine
        fmt = thinking_format(engine.chat_template_source)
        text = engine.render_chat(messages, template_vars=template_vars(
            fmt, think, model=self.info.name))
        generation = _EngineGeneration(engine.submit(engine.prompt_tokens(text), params,
                                                     priority=self.priority))
        start = None if fmt is None else ThinkingStart(fmt, starts_thinking(fmt, text))
        return _SplitThinking(generation, lambda: start)

    def complete(self, prompt: str, params: SamplingParams) -> Generation:
        return _EngineGeneration(self.engine.complete(prompt, params, priority=self.priority))

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return len(self.engine.chat_tokens(messages))

    def count_text(self, text: str) -> int:
        return len(self.engine.tokenize(text))

    def close(self) -> None:
        self.engine.close()


class _EngineGeneration:
    """An engine's generation as a session's. Its prompt was counted before it was submitted
    (``EngineSession.count_tokens``), so ``prompt_tokens`` stays None."""

    prompt_tokens: int | None = None
    thought: ThoughtStats | None = None

    def __init__(self, generation: EngineGeneration) -> None:
        self._generation = generation

    def __iter__(self) -> Iterator[Event]:
        return iter(self._generation)

    def cancel(self) -> None:
        self._generation.cancel()


class DaemonSession:
    """A model held by the daemon; a chat UI's requests go first (interactive priority)."""

    in_process = False

    def __init__(self, client: DaemonClient, model: str, info: ModelInfo, *,
                 priority: Priority = Priority.INTERACTIVE) -> None:
        self.client = client
        self.model = model
        self.info = info
        self.where = f"daemon {client.where}"
        self.priority = priority

    def chat(self, messages: Sequence[Message], params: SamplingParams, *,
             think: bool | str | None = None) -> Generation:
        generation = self.client.generate(self.model, messages=list(messages), params=params,
                                          priority=self.priority, think=think)
        return _SplitThinking(_InfoTracking(generation, self), lambda: generation.thinking)

    def complete(self, prompt: str, params: SamplingParams) -> Generation:
        return _InfoTracking(self.client.generate(self.model, prompt=prompt, params=params,
                                                  priority=self.priority), self)

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return None  # the daemon counts at submit: ContextOverflow says when it is too long

    def count_text(self, text: str) -> int:
        return self.client.count_tokens(self.model, text)

    def close(self) -> None:
        self.client.close()


class PresetSession:
    """A session on a preset: its system prompt and seed turns go before every chat's
    (``Preset.apply``), and its stop strings where a request gives none. Its default sampling
    is the front end's to merge (``selection.model_settings``): a session cannot tell the
    values a user chose from the defaults."""

    def __init__(self, inner: Session, preset: Preset) -> None:
        self.inner = inner
        self.preset = preset
        self.info = inner.info
        self.in_process = inner.in_process
        self.where = inner.where
        self.model = preset.name

    def _params(self, params: SamplingParams) -> SamplingParams:
        if self.preset.stop and not params.stop:
            return replace(params, stop=self.preset.stop)
        return params

    def with_defaults(self, params: SamplingParams, given: Iterable[str]) -> SamplingParams:
        """``params`` with the preset's default sampling in the fields not in ``given`` (the
        ones its front end set itself: the chat UI's temperature)."""
        own = ModelSettings.from_parameters(self.preset.parameters).sampling()
        chosen = set(given)
        changes: dict[str, Any] = {k: v for k, v in own.items() if k not in chosen}
        return replace(params, **changes)

    def chat(self, messages: Sequence[Message], params: SamplingParams, *,
             think: bool | str | None = None) -> Generation:
        return self.inner.chat(self.preset.apply(messages), self._params(params), think=think)

    def complete(self, prompt: str, params: SamplingParams) -> Generation:
        return self.inner.complete(prompt, self._params(params))

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        return self.inner.count_tokens(self.preset.apply(messages))

    def count_text(self, text: str) -> int:
        return self.inner.count_text(text)

    def close(self) -> None:
        self.inner.close()


def _with_preset(session: Session, preset: Preset | None) -> Session:
    return session if preset is None else PresetSession(session, preset)


class _InfoTracking:
    """A daemon generation that updates the session's ModelInfo from its start event (the
    daemon may have reloaded the model with other settings since)."""

    thought: ThoughtStats | None = None

    def __init__(self, generation: ClientGeneration, session: DaemonSession) -> None:
        self._generation = generation
        self._session = session

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt's size as the daemon counted it (known after the first event)."""
        return self._generation.prompt_tokens

    def __iter__(self) -> Iterator[Event]:
        for event in self._generation:
            info = self._generation.info
            if info is not None and info is not self._session.info:
                # A stream's info comes without the chat template (the load's had it): the
                # chat UI reads from it whether the model thinks.
                if info.chat_template is None and self._session.info.path == info.path:
                    info = dataclasses.replace(info,
                                               chat_template=self._session.info.chat_template)
                self._session.info = info
            yield event

    def cancel(self) -> None:
        self._generation.cancel()


class _SplitThinking:
    """A chat generation whose text is split into reasoning (``Thought``) and answer
    (``Token``) as it streams, when the model thinks (``start()``, asked at the first event:
    through the daemon, the stream's start says it); the final ``Done`` carries the answer
    alone, and ``thought`` the reasoning with its figures."""

    def __init__(self, generation: Generation, start: Callable[[], ThinkingStart | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._generation = generation
        self._start = start
        self._clock = clock
        self.thought: ThoughtStats | None = None

    @property
    def prompt_tokens(self) -> int | None:
        return self._generation.prompt_tokens

    def cancel(self) -> None:
        self._generation.cancel()

    def __iter__(self) -> Iterator[Event]:
        t_asked = self._clock()
        splitter: Splitter | None = None
        started = False
        t_first = t_answer = None
        n_answer = 0  # tokens generated when the answer's first piece came
        ttft_ms = 0.0
        live: LiveStats | None = None
        for event in self._generation:
            if not started:
                started = True
                start = self._start()
                if start is not None:
                    splitter = splitter_for(start.format, thinking=start.opened)
            if splitter is None:
                yield event
                continue
            if isinstance(event, Done):
                thinking, content = splitter.flush()
                if thinking and live is not None:
                    yield Thought(thinking, live)
                if content and live is not None:
                    if t_answer is None:
                        t_answer, n_answer = self._clock(), live.n_tokens
                    yield Token(content, live)
                now = self._clock()
                n = live.n_tokens if live is not None else 0
                if splitter.thinking and t_first is not None:
                    end = t_answer if t_answer is not None else now
                    n_thought = (n_answer - 1) if t_answer is not None else n
                    ms = (end - t_first) * 1000.0
                    answer_s = now - t_answer if t_answer is not None else 0.0
                    self.thought = ThoughtStats(
                        text=splitter.thinking, tokens=max(0, n_thought), ms=round(ms, 1),
                        decode_tps=round(_rate(n_thought - 1, ms / 1000.0), 2),
                        answer_ttft_ms=0.0 if t_answer is None else round(
                            ttft_ms + (t_answer - t_first) * 1000.0, 1),
                        answer_decode_tps=round(_rate(n - n_answer, answer_s), 2))
                yield replace(event, text=splitter.content)
                return
            if isinstance(event, Token):
                if t_first is None:
                    t_first, ttft_ms = self._clock(), event.live.ttft_ms or \
                        (self._clock() - t_asked) * 1000.0
                live = event.live
                thinking, content = splitter.push(event.text)
                if thinking:
                    yield Thought(thinking, event.live)
                if content:
                    if t_answer is None:
                        t_answer, n_answer = self._clock(), event.live.n_tokens
                    yield Token(content, event.live, event.logprobs)
            else:
                yield event


def _rate(n: int, seconds: float) -> float:
    return n / seconds if n > 0 and seconds > 0 else 0.0


class EngineOpener(Protocol):
    """``loading.open_engine``, as a launcher calls it (tests pass engines on the fake
    backend)."""

    def __call__(self, ref: str, config: Config, *, on_copy: CopyProgress | None = None,
                 on_load: Callable[[float], None] | None = None) -> Engine: ...


class Launcher:
    """Finds or starts what runs the model, and opens sessions on it. Whether that is the
    daemon or this process is decided once: by ``no_daemon``, else by the first daemon look-up
    (with ``if_no_daemon="in_process"``, no daemon means this process from then on)."""

    def __init__(self, config: Config, *, no_daemon: bool = False,
                 open_engine: EngineOpener | None = None,
                 store: ModelStore | None = None,
                 serve_args: Sequence[str] = (),
                 if_no_daemon: str = "start",
                 priority: Priority = Priority.INTERACTIVE,
                 idle_exit_s: float = DAEMON_IDLE_EXIT_S) -> None:
        if if_no_daemon not in IF_NO_DAEMON:
            raise ValueError(f"if_no_daemon must be one of {IF_NO_DAEMON}, got {if_no_daemon!r}")
        self.config = config
        self.no_daemon = no_daemon
        self._open_engine = open_engine
        self.store = store or ModelStore(offline=config.offline)
        self.serve_args = tuple(serve_args)
        self.if_no_daemon = if_no_daemon
        self.priority = priority
        self.idle_exit_s = idle_exit_s
        self.started_daemon_pid: int | None = None
        self._client: DaemonClient | None = None
        self._opening_here = False

    @property
    def in_process(self) -> bool:
        """Whether models load in this process: no daemon asked for, or none was found, or
        the model being opened is a file path (always loaded here)."""
        return self.no_daemon or self._opening_here

    # --- the machine --------------------------------------------------------------------
    def probe_hardware(self, *, measure_bandwidth: bool) -> tuple[HardwareProfile,
                                                                  dict[str, float]]:
        """This machine's profile and its measured/predicted decode ratios."""
        from .hardware import probe
        from .planner.calibration import load_ratios

        # Only an in-process engine may load llama.cpp here (to list its GPU backends); with
        # the daemon, the backend it used is taken from the model it loaded.
        hardware = probe(measure_bandwidth=measure_bandwidth, with_build=self.in_process)
        return hardware, load_ratios(hardware)

    # --- models -------------------------------------------------------------------------
    def pick_model(self, hardware: HardwareProfile | None) -> str:
        """The model to open when none is named (``selection.pick_model`` on this launcher's
        store and settings)."""
        return pick_model(self.store, self.config, hardware)

    def model_rows(self, hardware: HardwareProfile, *,
                   calibration: Mapping[str, float] | None = None) -> list[ModelRow]:
        """The models a front end lists, with the plan for ``hardware`` (``model_rows``)."""
        return model_rows(self.store, hardware, self.config, calibration=calibration)

    def instruct_offer(self, hardware: HardwareProfile, *,
                       calibration: Mapping[str, float] | None = None) -> ModelRow | None:
        """When only base models are installed: the instruct model the planner picks for
        this machine, as a models list's row (``selection.instruct_offer``); None when one
        is installed, none fits, or this launcher is offline."""
        if self.config.offline or self.store.offline:
            return None
        choice = instruct_offer(self.store, self.config, hardware, calibration)
        if choice is None:
            return None
        c = choice.candidate
        spec = self.store.catalog.models.get(c.model or "")
        return ModelRow(name=c.name, installed=False, size_bytes=c.file_bytes,
                        size_estimated=c.estimated, fits=choice.fits,
                        gpu_layers=f"{choice.n_gpu_layers}/{choice.n_layers_total}",
                        decode_tps=choice.decode_tps, verdict="fits", reason=choice.reason,
                        description=spec.family.description if spec else "")

    def pull(self, name: str, *, progress: PullCallback | None = None,
             cancel: threading.Event | None = None) -> InstalledModel:
        """Download a catalog model into this launcher's store (blocking; ``pull_model``)."""
        return pull_model(self.store, name, progress=progress, cancel=cancel)

    def sampling_defaults(self, session: Session) -> SamplingDefaults:
        """The loaded model's default sampling (``sampling_defaults.model_defaults``: its
        catalog family's, its file's metadata, its config table), for the requests a front
        end builds whole. Reads the file's header: call it from a worker."""
        return model_sampling(self.store, self.config, session.info, session.model)

    # --- opening ------------------------------------------------------------------------
    def open(self, model: str, progress: Progress) -> Session:
        """Get ``model`` ready (pull a Hub model named hf.co/... on first use, install the
        starter, start the daemon, load) and return a session on it. Raises LocalInferError
        subclasses with a message for the user."""
        from .client import HOST_ENV

        self._opening_here = False
        remote = not self.no_daemon and bool(os.environ.get(HOST_ENV))
        if is_hub_name(model) and not looks_like_path(model) and not remote:
            model = self._pulled(model, progress)  # a daemon at LOCALINFER_HOST pulls its own
        if not self.no_daemon and not looks_like_path(model):
            client = self.client(progress)
            if client is not None:
                return self._open_in_daemon(client, model, progress)
        return self._open_in_process(model, progress)

    def _pulled(self, model: str, progress: Progress) -> str:
        """A Hub name, installed: pulled now (as ``ollama run hf.co/...`` does) unless it is
        there already. Returns the installed model's name."""
        try:
            return self.store.resolve(model).name
        except ModelNotFound:
            if self.store.offline:
                raise OfflineError(f"{model} is not installed and offline mode is on"
                                   " (HF_HUB_OFFLINE=1 or --offline): unset it to pull it,"
                                   " or run a model that is installed (`localinfer list`)."
                                   ) from None
        target = pull_target(self.store, model, self.config)
        if target.reason:
            progress(LoadStep(f"{model} -> {target.reason}", stage="pull"))

        said: list[str] = []

        def pulled(step: PullProgress) -> None:
            if step.status == "downloading" and step.total:  # bytes, for a bar
                progress(LoadStep(step.message, step.completed / step.total, "pull",
                                  step.total))
            elif step.status in ("verifying", "success") and step.status not in said:
                said.append(step.status)  # once each, in words
                progress(LoadStep(step.message, None, "pull"))

        return pull_model(self.store, target, progress=pulled).name

    def _open_in_daemon(self, client: DaemonClient, model: str, progress: Progress
                        ) -> Session:
        session = self._open_in_daemon_as_is(client, model, progress)
        return _with_preset(session, self.store.presets.get(model))

    def _open_in_daemon_as_is(self, client: DaemonClient, model: str, progress: Progress
                              ) -> Session:
        from .client import HOST_ENV

        if os.environ.get(HOST_ENV):
            # A daemon found through LOCALINFER_HOST has a store of its own (another home,
            # another machine): it resolves the name, and nothing is copied here.
            name = model
        else:
            # Resolve here, with progress: the starter is copied into the store on first
            # use, and an unknown name fails before the daemon is asked.
            name = self.store.resolve(model, progress=_copy_progress(progress)).name
        label = f"Loading {name} in the daemon…"
        progress(LoadStep(label, stage="load"))
        try:
            info = client.load(name, progress=lambda f: progress(LoadStep(label, f, "load")))
        except DaemonError as exc:
            if "cannot reach" in exc.message:
                raise
            raise ModelLoadError(f"the daemon could not load {name}: {exc.message}") from None
        return DaemonSession(client, name, info, priority=self.priority)

    def _open_in_process(self, model: str, progress: Progress) -> Session:
        self._opening_here = True
        opener = self._open_engine
        if opener is None:
            from .loading import open_engine

            opener = open_engine
        label = f"Loading {model}…"
        progress(LoadStep(label, 0.0, "load"))
        engine = opener(model, self.config, on_copy=_copy_progress(progress),
                        on_load=lambda f: progress(LoadStep(label, f, "load")))
        engine.wait_ready()
        progress(LoadStep(f"Loaded {engine.info.name}", 1.0, "loaded"))
        preset = None if looks_like_path(model) else self.store.presets.get(model)
        return _with_preset(EngineSession(engine, priority=self.priority), preset)

    def client(self, progress: Progress | None = None) -> DaemonClient | None:
        """The daemon's client: the running daemon, or one started now (detached, with an
        idle exit, so the model stays warm for editors after the chat ends). None when none
        runs and ``if_no_daemon`` is "in_process" (this launcher then stays in process)."""
        from .client import HOST_ENV, DaemonClient

        if self._client is not None:
            try:
                self._client.health()
                return self._client
            except DaemonError:
                self._client.close()
                self._client = None
        client = DaemonClient.discover()
        if client is None:
            if self.if_no_daemon == "in_process":
                self.no_daemon = True
                return None
            if os.environ.get(HOST_ENV):
                raise DaemonError(f"no daemon answers at {HOST_ENV}={os.environ[HOST_ENV]}."
                                  f" Start it there, unset {HOST_ENV}, or chat with"
                                  " --no-daemon.", title="daemon unreachable")
            if self.if_no_daemon == "fail":
                raise DaemonError("no localinfer daemon is running. Start one with"
                                  " `localinfer serve`, or chat with --no-daemon.",
                                  title="daemon unreachable")
            if progress:
                progress(LoadStep("Starting the localinfer daemon…", stage="daemon"))
            client = self._spawn_daemon()
        self._client = client
        return client

    def _spawn_daemon(self) -> DaemonClient:
        from .client import start_daemon

        client, pid = start_daemon(self.serve_args, self.idle_exit_s)
        if pid is not None:
            self.started_daemon_pid = pid
        return client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _copy_progress(progress: Progress) -> Callable[[int, int], None]:
    def on_copy(done: int, total: int) -> None:
        progress(LoadStep("Installing the starter model into the store…",
                          done / total if total else None, "starter", total))
    return on_copy


def model_sampling(store: ModelStore, config: Config, info: ModelInfo, model: str
                   ) -> SamplingDefaults:
    """``info``'s default sampling, its header read from its file when it is readable here."""
    metadata = None
    path = Path(info.path)
    if path.is_file():
        try:
            metadata = gguf.read_header(path).metadata
        except Exception:  # noqa: BLE001 - then the catalog's and config's alone
            log.debug("cannot read %s's header", path, exc_info=True)
    bare = info.name.rsplit("-", 1)[0]
    return model_defaults(store.catalog, bare, metadata, config, info.name, model)


# --- models, as the planner sees them ----------------------------------------------------------
def loaded_candidate(info: ModelInfo) -> Candidate | None:
    """The planner's view of the loaded file (exact per-layer bytes), or None when its header
    cannot be read here (the daemon's file elsewhere, or unreadable)."""
    path = Path(info.path)
    if not path.is_file():
        return None
    try:
        return Candidate.from_header(gguf.read_header(path), name=info.name)
    except Exception:  # noqa: BLE001 - the roofline then falls back to the file size
        log.debug("cannot read %s's header", path, exc_info=True)
        return None


@dataclass(frozen=True)
class ModelRow:
    """One line of a models list: a model and the planner's verdict for this machine."""

    name: str
    """What to load or pull: an installed model's full name, or a catalog variant's."""
    installed: bool
    size_bytes: int
    size_estimated: bool
    fits: bool | None
    """None when the planner could not evaluate it."""
    gpu_layers: str
    """"24/32", or "" when unknown."""
    decode_tps: float
    """Predicted decode tok/s for this machine (0 when unknown)."""
    verdict: str
    reason: str
    description: str = ""


def model_rows(store: ModelStore, hardware: HardwareProfile, config: Config, *,
               calibration: Mapping[str, float] | None = None) -> list[ModelRow]:
    """Installed models first (exact sizes from their headers), then the best variant of each
    catalog model that is not installed, each with the plan for ``hardware``."""
    prefs = plan_prefs(config, calibration)
    installed = store.installed()
    rows = []
    for m in installed:
        try:
            candidate = installed_candidate(m)
        except LocalInferError as exc:
            log.warning("cannot plan %s: %s", m.name, exc)
            rows.append(ModelRow(m.name, True, m.size_bytes, False, None, "", 0.0, "?",
                                 f"unreadable: {exc.message}"))
            continue
        rows.append(_model_row(True, "", [candidate], hardware, prefs))
    installed_models = {m.model for m in installed}
    for spec in store.catalog.models.values():
        if spec.name not in installed_models:
            rows.append(_model_row(False, spec.family.description,
                                   catalog_candidates(store, spec), hardware, prefs))
    return rows


def _model_row(installed: bool, note: str, candidates: list[Candidate],
               hardware: HardwareProfile, prefs: PlanPrefs) -> ModelRow:
    try:
        result = plan(hardware, candidates, prefs)
    except LocalInferError as exc:
        c = candidates[0]
        return ModelRow(c.name, installed, c.file_bytes, c.estimated, None, "", 0.0, "?",
                        exc.message, note)
    e = best_or_smallest(result)
    c = e.candidate
    return ModelRow(name=c.name, installed=installed, size_bytes=c.file_bytes,
                    size_estimated=c.estimated, fits=e.fits,
                    gpu_layers=f"{e.n_gpu_layers}/{e.n_layers_total}", decode_tps=e.decode_tps,
                    verdict="fits" if e.fits else "too big", reason=e.reason, description=note)


# --- the loaded model's speed, predicted ---------------------------------------------------------
@dataclass(frozen=True)
class DecodeReference:
    """What the measured decode of a loaded model is compared with: the memory-bandwidth
    roofline, and the planner's prediction for the same placement (calibrated for this
    machine when a ratio is known)."""

    roofline: Roofline
    candidate: Candidate | None
    hardware: HardwareProfile
    n_gpu_layers: int
    n_threads: int | None
    kv_type: str
    calibration: Mapping[str, float]

    def predicted_tps(self, position: int) -> float | None:
        if self.candidate is None:
            return None
        try:
            p = predict(self.candidate, self.hardware, self.n_gpu_layers, position=position,
                        n_threads=self.n_threads, kv_type=self.kv_type)
        except Exception:  # noqa: BLE001 - a prediction is a nicety
            log.debug("no prediction", exc_info=True)
            return None
        return p.decode_tps * self.calibration.get(p.key, 1.0)


def decode_reference(info: ModelInfo, hardware: HardwareProfile, candidate: Candidate | None,
                     config: Config, calibration: Mapping[str, float]) -> DecodeReference:
    """The reference for ``info`` as it was loaded (its GPU layers and KV cache type), with
    ``config``'s thread count."""
    return DecodeReference(roofline_for(info, hardware, candidate, info.kv_type), candidate,
                           hardware, info.n_gpu_layers, config.threads, info.kv_type,
                           calibration)


def with_loaded_backend(hardware: HardwareProfile, info: ModelInfo) -> HardwareProfile:
    """With the daemon a front end does not load llama.cpp to list its backends; the model
    the daemon offloaded says which one it has."""
    backend = info.gpu_backend
    if backend and info.n_gpu_layers > 0 and backend not in hardware.backends:
        return replace(hardware, backends=(*hardware.backends, backend))
    return hardware


# --- what is loaded ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadedRow:
    """A model loaded in the daemon or in this process, as a models list shows it."""

    name: str
    where: str
    """"daemon" or "this process"."""
    memory: str
    """"1.1 GB RAM + 2.1 GB VRAM" by the daemon's memory plan, else the weights' size."""
    processor: str
    """"100% CPU", "100% GPU (CUDA)", "40%/60% CPU/GPU (CUDA)"..."""
    in_use: bool


def memory_text(memory: Mapping[str, Any] | None) -> str:
    """RAM (+ VRAM) one loaded model takes by the daemon's memory plan; "?" when unplanned."""
    if not memory:
        return "?"
    text = human_bytes(memory["ram_bytes"]) + " RAM"
    if memory["vram_bytes"]:
        text += f" + {human_bytes(memory['vram_bytes'])} VRAM"
    return text


def processor_text(info: Mapping[str, Any], memory: Mapping[str, Any] | None) -> str:
    """Where a loaded model's layers run: the plan's split of its memory, else layer counts."""
    layers, gpu = info["n_layers"], info["n_gpu_layers"]
    if gpu == 0:
        return "100% CPU"
    backend = info.get("gpu_backend") or "GPU"
    if memory:
        return f"{memory['processor']} ({backend})"
    if gpu > layers:
        return f"100% GPU ({backend})"
    return f"{gpu}/{layers + 1} layers GPU"  # the output layer counts as one, as llama.cpp


def loaded_rows(session: Session | None) -> list[LoadedRow]:
    """What is loaded where ``session`` runs (blocking: it may ask the daemon): every model
    the daemon holds, or this process's one engine."""
    if session is None:
        return []
    if isinstance(session, DaemonSession):
        status = session.client.status()
        return [LoadedRow(entry["info"]["name"], "daemon", memory_text(entry.get("memory")),
                          processor_text(entry["info"], entry.get("memory")),
                          bool(entry["in_flight"]))
                for entry in status["loaded"]]
    info = session.info
    processor = processor_text({"n_layers": info.n_layers, "n_gpu_layers": info.n_gpu_layers,
                                "gpu_backend": info.gpu_backend}, None)
    return [LoadedRow(info.name, "this process", human_bytes(info.size_bytes) + " weights",
                      processor, False)]
