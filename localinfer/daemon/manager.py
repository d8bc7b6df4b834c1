"""Which models the daemon holds: loading on demand, several side by side, evicting the least
recently used, and unloading after keep-alive.

Models stay loaded together (a chat model, an autocomplete model, an embedding model) while
their memory footprints fit the machine's budget together (``memory.MemoryPlan``: the
planner's weights + KV + compute buffers per device, less the reserve), up to ``max_loaded``
models when a cap is set. A model that does not fit beside the others evicts the least
recently used idle one; when every other is answering, the least recently used is drained:
new requests for it wait while the ones it has finish, then it unloads. A request for a loaded
model never waits for another model's load. A model that cannot fit even alone is refused
with its sizes (``ModelTooLarge``). After its last request a model stays loaded for its
keep-alive (default five minutes, per request as in Ollama: 0 unloads at once, a negative
value keeps it forever).

A model loads with the context its plan gives it (planner: 32k where it fits). A request that
asks for more (Ollama's ``num_ctx``) reloads it with that much; one whose prompt is longer than
the loaded context (``context_for``) reloads it with the next power of two that holds the
prompt and REPLY_ROOM, up to the largest context this machine can give the model (its memory
plan, at most its trained length; the model's own ``ctx`` in config.toml fixes it). Only a
prompt longer than that is refused, with the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..config import Config, ModelSettings, load_config
from ..errors import ContextOverflow, DaemonError, InvalidRequest
from ..runtime.engine import Engine
from ..runtime.types import Message
from ..selection import model_settings, pull_target
from ..store import HubTarget, ModelStore, PullTarget, ResolvedModel, looks_like_path
from .residency import Footprint, MemoryPlan

log = logging.getLogger(__name__)

NAME_MEMO_S = 5.0
"""How long a name that resolved to a loaded model by another of its names (a family,
``bench-fim`` for ``bench-fim:270m-q4_k_m``; never a preset's) is answered without reading the
store again, unless the daemon itself added or removed a model or preset meanwhile: a change
another process makes (``localinfer pull``, ``add``, ``rm``) is seen by that name at most this
late."""
NAME_MEMO_SIZE = 64

REPLY_ROOM = 4096
"""Tokens a prompt longer than the loaded context gets for its reply when it reloads the model
with a larger context (at most what the model can have: then the rest of that)."""

EngineFactory = Callable[..., Engine]
"""Loads a model (blocking; run in a thread):
``factory(model, num_ctx, progress=fraction_callback) -> Engine``; num_ctx may be None."""


@dataclass
class LoadedModel:
    name: str
    engine: Engine
    model: ResolvedModel
    loaded_at: float
    load_ms: float
    in_flight: int = 0
    keep_alive_s: float = 300.0
    expires_at: float | None = None
    """Monotonic time at which it unloads; None while in use or when kept forever."""
    last_used: float = field(default_factory=time.time)
    footprint: Footprint | None = None
    """Its memory as the plan counts it; None without a memory plan."""


def _stopped(entry: LoadedModel) -> BaseException | None:
    """Why a loaded model can no longer answer: its engine's worker failed, or the process
    that held it (a model with RPC workers, runtime/isolated.py) is gone."""
    return entry.engine.failed or getattr(entry.engine.backend, "lost", None)


class ModelManager:
    def __init__(
        self,
        factory: EngineFactory,
        *,
        store: ModelStore | None = None,
        config: Config | None = None,
        keep_alive_s: float = 300.0,
        max_loaded: int | None = 1,
        memory: MemoryPlan | None = None,
    ) -> None:
        self._factory = factory
        self.config = config or load_config(store.paths if store else None)
        """The settings a pull's choice of variant is planned with."""
        self.store = store or ModelStore(offline=self.config.offline)
        self.default_keep_alive_s = keep_alive_s
        self.max_loaded = None if max_loaded is None else max(1, max_loaded)
        """At most this many models at once; None: as many as the memory plan fits."""
        self.memory = memory
        """Each model's footprint and the budget they share; None: only max_loaded counts."""
        self.loaded: dict[str, LoadedModel] = {}
        self.loading: str | None = None
        self.load_fraction = 0.0
        """How far the current load is (0..1), while ``loading`` names a model."""
        self._switch = asyncio.Lock()
        self._evicting: set[str] = set()
        """Models being drained to make room: their new requests wait for the switch."""
        self._changed = asyncio.Condition()
        self._closed = False
        self._stopping = asyncio.Event()
        """Set at shutdown (``cancel_all``): a load in progress stops, and the requests
        waiting for one get a 503 at once."""
        self._names: dict[str, tuple[float, int, ResolvedModel]] = {}
        """Names resolved to a loaded model, by name, with when they expire (NAME_MEMO_S) and
        the store's ``changes`` then."""

    # --- resolving names ----------------------------------------------------------------
    async def resolve(self, name: str) -> ResolvedModel:
        """A request's model name -> an installed model. Paths are refused: over the API a
        model name can never reach outside the store."""
        if not isinstance(name, str) or not name.strip():
            raise InvalidRequest("'model' must name a model, e.g. gemma3:270m.")
        if looks_like_path(name):
            raise InvalidRequest(
                f"model {name!r} looks like a file path; the API serves installed models only"
                " (add a file to the store with `localinfer add PATH`)."
            )
        for loaded in self.loaded.values():  # fast path: no disk access for a loaded model
            if name.lower() in (loaded.name, loaded.model.installed and
                                loaded.model.installed.model) and (
                    loaded.model.preset is None or loaded.model.preset.name == name.lower()):
                return loaded.model
        key = name.lower()
        memo = self._names.get(key)
        if memo is not None and time.monotonic() < memo[0] and memo[1] == self.store.changes \
                and memo[2].name in self.loaded:
            return memo[2]  # another name of a loaded model: no store read, no thread hop
        changes = self.store.changes
        model = await asyncio.to_thread(self.store.resolve, name)
        if model.name in self.loaded and model.preset is None:
            if len(self._names) >= NAME_MEMO_SIZE:
                self._names.clear()
            self._names[key] = (time.monotonic() + NAME_MEMO_S, changes, model)
        return model

    async def with_preset(self, name: str, messages: list[Message]) -> list[Message]:
        """A chat's ``messages`` with the system prompt and seed turns of the preset ``name``
        names (unchanged for a model that is no preset)."""
        model = await self.resolve(name)
        return model.preset.apply(messages) if model.preset is not None else messages

    def pull_target(self, ref: str) -> PullTarget | HubTarget:
        """What /api/pull downloads for ``ref`` (blocking: it may probe this machine)."""
        return pull_target(self.store, ref, self.config)

    # --- leasing a model for one request -------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, name: str, *, keep_alive_s: float | None = None,
                    num_ctx: int | None = None) -> AsyncIterator[LoadedModel]:
        """Hold a loaded model for the duration of one request."""
        model = await self.resolve(name)
        entry = await self._acquire(model, num_ctx)
        # As Ollama: the keep_alive of the request scheduled last holds when the model goes
        # idle (each request's, or the daemon's when it gives none: a request's "10s" or -1
        # does not stay for the requests after it). Set at the finish, an older request that
        # ended last undid a stop or a keep_alive 0 sent while it ran.
        entry.keep_alive_s = keep_alive_s if keep_alive_s is not None else \
            self.default_keep_alive_s
        try:
            yield entry
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled request still gives it back
                await self._release(entry)

    async def _acquire(self, model: ResolvedModel, num_ctx: int | None) -> LoadedModel:
        if model.preset is not None and not model.preset.own_engine:
            model = dataclasses.replace(model, preset=None)  # it shares its model's engine
        entry = self.loaded.get(model.name)
        if entry is not None and model.name not in self._evicting and self._serves(
                entry, num_ctx):
            return self._take(entry)  # no lock: another model's load or drain is no reason to wait
        self._check_stopping()
        async with self._switch:
            self._check_stopping()  # it waited for another model's load, which shutdown ended
            entry = self.loaded.get(model.name)
            if entry is not None and _stopped(entry) is not None:
                # Its worker stopped on an error (a bug, already reported to the requests
                # it had): load the model afresh rather than fail every request after it.
                log.warning("%s stopped working (%s); loading it again", model.name,
                            _stopped(entry))
                await self._evict(entry)
                entry = None
            if entry is not None and num_ctx:
                # As Ollama does, a context beyond what the model was trained for is capped.
                num_ctx = min(num_ctx, entry.engine.info.n_ctx_train or num_ctx)
            if entry is not None and not self._serves(entry, num_ctx):
                # Ollama's num_ctx: a larger context than loaded means reloading this model.
                await self._evict(entry)
                entry = None
            if entry is None:
                footprint = await self._footprint(model, num_ctx)
                await self._make_room(footprint)
                entry = await self._load(model, num_ctx)
                entry.footprint = footprint
            return self._take(entry)

    def settings_of(self, model: ResolvedModel) -> ModelSettings | None:
        """``model``'s own settings (``[models."NAME"]`` in config.toml, a preset's parameters:
        ``selection.model_settings``), or None."""
        return model_settings(self.config, model)

    async def context_for(self, entry: LoadedModel, n_prompt: int) -> int:
        """The context to reload ``entry``'s model with for a prompt of ``n_prompt`` tokens
        that its loaded context cannot hold: the next power of two with room for the prompt
        and REPLY_ROOM, at most the largest context this machine can give the model.
        ContextOverflow, with the figures, when even that cannot hold the prompt."""
        info = entry.engine.info
        trained = info.n_ctx_train
        own = self.settings_of(entry.model)
        if own is not None and own.ctx:  # the model's own context: fixed, never grown
            largest, why = own.ctx, "its own ctx in config.toml"
        else:
            largest, why = trained or info.n_ctx, "what it was trained for"
            if self.memory is not None:
                fits = await asyncio.to_thread(self.memory.largest_context, entry.model)
                if fits and fits < largest:
                    largest, why = fits, "what fits this machine's memory"
        largest = min(max(largest, info.n_ctx), trained or largest)
        if n_prompt >= largest:
            trained_text = (f", trained for {trained}" if trained and largest < trained
                            else f": {trained}" if trained else "")
            raise ContextOverflow(
                f"the prompt is {n_prompt} tokens but the largest context {entry.name} can have"
                f" here is {largest} tokens ({why}{trained_text}; at least one token must be"
                " left to generate). Shorten the prompt or use a model with a longer context.",
                n_prompt=n_prompt, n_ctx=largest)
        return min(1 << (n_prompt + REPLY_ROOM - 1).bit_length(), largest)

    @staticmethod
    def _serves(entry: LoadedModel, num_ctx: int | None) -> bool:
        """The loaded ``entry`` can take a request with this context (as Ollama does, a
        context beyond what the model was trained for is capped)."""
        if _stopped(entry) is not None:
            return False
        info = entry.engine.info
        return not num_ctx or min(num_ctx, info.n_ctx_train or num_ctx) <= info.n_ctx

    @staticmethod
    def _take(entry: LoadedModel) -> LoadedModel:
        entry.in_flight += 1
        entry.expires_at = None
        entry.last_used = time.time()
        return entry

    async def _footprint(self, model: ResolvedModel, num_ctx: int | None) -> Footprint | None:
        """What ``model`` will take; ModelTooLarge when it can never fit."""
        if self.memory is None:
            return None
        memory = self.memory
        footprint = await asyncio.to_thread(memory.estimate, model, num_ctx)
        budget = await asyncio.to_thread(lambda: memory.budget)
        error = budget.too_large(model.name, footprint)
        if error is not None:
            raise error
        return footprint

    def _has_room(self, footprint: Footprint | None) -> bool:
        if self.max_loaded is not None and len(self.loaded) >= self.max_loaded:
            return False
        if footprint is None or self.memory is None:
            return True
        held = [e.footprint for e in self.loaded.values() if e.footprint is not None]
        return self.memory.budget.fits([*held, footprint])

    async def _make_room(self, footprint: Footprint | None) -> None:
        """Unload least-recently-used models until ``footprint`` fits beside the rest: idle
        ones first; a busy one only after its requests finish (drained)."""
        while self.loaded and not self._has_room(footprint):
            idle = [e for e in self.loaded.values() if e.in_flight == 0]
            victim = min(idle or self.loaded.values(), key=lambda e: e.last_used)
            log.info("unloading %s to make room", victim.name)
            await self._evict(victim)

    async def _release(self, entry: LoadedModel) -> None:
        async with self._changed:
            entry.in_flight -= 1
            entry.last_used = time.time()
            if entry.in_flight == 0 and entry.keep_alive_s >= 0:
                entry.expires_at = time.monotonic() + entry.keep_alive_s
            self._changed.notify_all()
        if entry.in_flight == 0 and entry.keep_alive_s == 0:
            await self.unload(entry.name)

    async def _evict(self, entry: LoadedModel) -> None:
        """Drain and unload ``entry`` (under the switch lock), handing it to no new request
        meanwhile: the lock-free path in _acquire skips a model being evicted, so steady
        traffic cannot starve the drain."""
        self._evicting.add(entry.name)
        try:
            await self._drain_and_unload(entry)
        finally:
            self._evicting.discard(entry.name)

    async def _drain_and_unload(self, entry: LoadedModel) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: entry.in_flight == 0)
        await self._unload_entry(entry)

    async def _load(self, model: ResolvedModel, num_ctx: int | None) -> LoadedModel:
        self.loading = model.name
        self.load_fraction = 0.0
        started = time.perf_counter()

        stopping = self._stopping

        def progress(fraction: float) -> bool:
            self.load_fraction = fraction
            return not stopping.is_set()  # False stops llama.cpp's load at shutdown

        def load() -> Engine:
            engine = self._factory(model, num_ctx, progress=progress)
            # Warmed up, ready to answer at once (the warm-up itself can fail: out of GPU
            # memory...; the model is then freed and the error raised).
            engine.wait_ready()
            return engine

        loaded = asyncio.ensure_future(asyncio.to_thread(load))
        stopped = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({loaded, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: nobody takes what the thread loads
            loaded.add_done_callback(_close_loaded)
            raise
        finally:
            stopped.cancel()
            self.loading = None
        if not loaded.done():  # shutdown: the load goes on in its thread, closed at its end
            loaded.add_done_callback(_close_loaded)
            self._check_stopping()
        engine = loaded.result()
        load_ms = (time.perf_counter() - started) * 1000.0
        entry = LoadedModel(name=model.name, engine=engine, model=model, loaded_at=time.time(),
                            load_ms=load_ms, keep_alive_s=self.default_keep_alive_s)
        self.loaded[model.name] = entry
        log.info("loaded %s in %.0f ms", model.name, load_ms)
        return entry

    # --- unloading ----------------------------------------------------------------------
    async def unload(self, name: str, *, only_if_expired: bool = False) -> bool:
        """Unload a model now if it is idle (True), else mark it to unload when done.
        ``only_if_expired``: only if its keep-alive is still over once the switch lock is
        held (a request may have taken it while this waited for the lock)."""
        entry = self.loaded.get(name) or next(
            (e for e in self.loaded.values() if e.model.installed
             and e.model.installed.model == name), None)
        if entry is None:
            return False
        async with self._switch:
            if self.loaded.get(entry.name) is not entry:
                return False
            if only_if_expired and (entry.in_flight or entry.expires_at is None
                                    or time.monotonic() < entry.expires_at):
                return False
            if entry.in_flight:
                entry.keep_alive_s = 0
                return True
            await self._unload_entry(entry)
        return True

    async def _unload_entry(self, entry: LoadedModel) -> None:
        self.loaded.pop(entry.name, None)
        await asyncio.to_thread(entry.engine.close)
        log.info("unloaded %s", entry.name)

    async def expire(self) -> None:
        """Unload models whose keep-alive has run out, and idle ones that stopped working
        (called periodically)."""
        now = time.monotonic()
        for entry in list(self.loaded.values()):
            if entry.in_flight == 0 and _stopped(entry) is not None:
                await self.unload(entry.name)  # stopped (a lost RPC worker): `ps` drops it now
            elif entry.in_flight == 0 and entry.expires_at is not None and \
                    now >= entry.expires_at:
                await self.unload(entry.name, only_if_expired=True)

    def _check_stopping(self) -> None:
        if self._stopping.is_set():
            raise DaemonError("the daemon is shutting down: send the request again once it is"
                              " back.")

    def cancel_all(self) -> None:
        """End every in-flight generation (shutdown): each stream ends within a token, and
        a model's load stops (its waiting requests get a 503)."""
        self._stopping.set()
        for entry in self.loaded.values():
            entry.engine.cancel_all()

    async def close(self) -> None:
        self._closed = True
        self.cancel_all()
        for entry in list(self.loaded.values()):
            await self._unload_entry(entry)

    async def memory_json(self) -> dict[str, Any]:
        """The budget the loaded models share, what they hold together, and the cap on their
        number."""
        memory = self.memory
        budget = await asyncio.to_thread(lambda: memory.budget) if memory else None  # a probe
        held = [e.footprint for e in self.loaded.values() if e.footprint is not None]
        return {"budget": budget.to_json() if budget else None,
                "used": {"ram_bytes": sum(f.ram_bytes for f in held),
                         "vram_bytes": sum(f.vram_bytes for f in held)},
                "max_loaded": self.max_loaded}

    @property
    def busy(self) -> bool:
        return self.loading is not None or any(e.in_flight for e in self.loaded.values())


def _close_loaded(task: asyncio.Future) -> None:
    """A load that shutdown left running: close the engine it made (if it made one)."""
    if not task.cancelled() and task.exception() is None:
        task.result().close()
