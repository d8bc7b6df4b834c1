"""The status bar under the transcript, and the machine figures behind its roofline.

It shows the loaded model, its placement and the context on the first line, the live speed with
a sparkline on the second, the roofline and the plan's prediction on the third. It keeps the
hardware profile the roofline is computed from: probed when the app connects, the memory
bandwidth measured in a thread worker when unknown, and measured again when a reply decodes
faster than the cached figure allows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual import work
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Label, Sparkline

from ..planner import Candidate, Roofline
from ..protocol import ModelInfo
from ..runtime.types import Done, LiveStats
from ..session import DecodeReference, Launcher, Session, decode_reference, with_loaded_backend
from .figures import placement, thousands, tps, ttft

if TYPE_CHECKING:
    from ..chats import ReplyStats
    from ..hardware import HardwareProfile

log = logging.getLogger(__name__)


class HardwareReady(Message):
    """This machine's profile and its decode ratios, probed or measured. The app's connecting
    worker posts it, and so do the status bar's measuring workers (it bubbles up from there):
    the app applies it, in order with the session it connects."""

    def __init__(self, hardware: HardwareProfile, calibration: dict[str, float]) -> None:
        super().__init__()
        self.hardware = hardware
        self.calibration = calibration


@dataclass(frozen=True)
class ChatFigures:
    """What the conversation shows in the status bar: the context it takes, and the measured
    speed of the reply streaming now, else of the last one."""

    context_tokens: int | None
    context_at_least: bool
    """The context is at least ``context_tokens`` (the daemon counts a reply's prompt only
    when the reply ends)."""
    streaming: bool
    live: LiveStats | None
    """The streaming reply's figures from its last token (None before the first)."""
    samples: Sequence[float]
    """The streaming reply's sparkline."""
    last: ReplyStats | None
    """The last reply's figures, shown while none streams."""


class StatusBar(Vertical):
    """Model, placement and context on the first line; live speed with a sparkline on the
    second; the roofline and the plan's prediction on the third."""

    info: reactive[ModelInfo | None] = reactive(None, always_update=True)

    def __init__(self, launcher: Launcher, *, hardware: HardwareProfile | None = None,
                 calibration: dict[str, float] | None = None, measure_bandwidth: bool = True,
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self.launcher = launcher
        self.hardware = hardware
        self.hardware_fixed = hardware is not None
        """A profile handed in (tests, snapshots) is kept: never probed nor measured."""
        self.calibration = calibration or {}
        self.measure_bandwidth = measure_bandwidth and hardware is None
        self.candidate: Candidate | None = None
        self.reference: DecodeReference | None = None
        self._measuring = False
        self._remeasured = False
        """The bandwidth was measured again after a reply beat the roofline (once a session)."""

    def compose(self):
        yield Label("", id="status-model", markup=False)
        with Horizontal(id="status-speed-row"):
            yield Label("", id="status-speed", markup=False)
            yield Sparkline([], id="status-spark")
        yield Label("", id="status-roofline", markup=False)

    # --- the machine ----------------------------------------------------------------------
    def use_hardware(self, hardware: HardwareProfile, calibration: dict[str, float],
                     session: Session | None) -> bool:
        """Take a probed or measured profile; False when the one handed in stays."""
        if self.hardware_fixed:
            return False
        if hardware.host_bandwidth_gbps:
            self._measuring = False
        self.hardware = hardware
        self.calibration = calibration
        self.update_reference(session)
        return True

    def model_loaded(self, session: Session, candidate: Candidate | None) -> None:
        self.candidate = candidate
        self.update_reference(session)

    def update_reference(self, session: Session | None) -> None:
        if session is None or self.hardware is None:
            self.reference = None
            return
        self.hardware = with_loaded_backend(self.hardware, session.info)
        self.reference = decode_reference(session.info, self.hardware, self.candidate,
                                          self.launcher.config, self.calibration)

    def measure_if_unknown(self) -> None:
        """Measure the host's memory bandwidth in the background when the profile has none
        (the first model of a session on a machine never measured)."""
        if self.measure_bandwidth and self.hardware is not None and \
                not self.hardware.host_bandwidth_gbps:
            self.measure_bandwidth = False
            self._measuring = True
            self._measure()

    @work(thread=True, exclusive=True, exit_on_error=False, group="bandwidth")
    def _measure(self) -> None:
        try:
            self.post_message(HardwareReady(
                *self.launcher.probe_hardware(measure_bandwidth=True)))
        except Exception:  # noqa: BLE001 - the roofline stays unknown; chatting works
            log.warning("measuring the memory bandwidth failed", exc_info=True)
            self._measuring = False

    def _check_roofline(self, roofline_pct: float | None, done: Done) -> None:
        """Decode steps faster than the roofline mean the cached host bandwidth is too low
        (``after_reply`` decides): mark it and measure it again in the background, once per
        session."""
        from ..planner.calibration import after_reply  # the probes: only here

        if self.hardware is None or self.hardware_fixed or self._remeasured:
            return
        check = after_reply(done, hardware=self.hardware, roofline_pct=roofline_pct)
        if check.remeasure is None:
            return
        self._remeasured = True
        if check.note:
            self.notify(check.note)
        self._remeasure(check.remeasure)

    @work(thread=True, exclusive=True, exit_on_error=False, group="bandwidth")
    def _remeasure(self, reason: str) -> None:
        """Mark the host bandwidth figure (``reason``: ``ReplyCheck.remeasure``) and measure
        it again."""
        from ..planner.calibration import flag_bandwidth  # the probes: only here

        try:
            if self.hardware is not None and flag_bandwidth(self.hardware, reason):
                self.post_message(HardwareReady(
                    *self.launcher.probe_hardware(measure_bandwidth=True)))
        except Exception:  # noqa: BLE001 - the old figure stays; chatting works
            log.warning("measuring the memory bandwidth again failed", exc_info=True)

    # --- showing --------------------------------------------------------------------------
    def show(self, session: Session | None, figures: ChatFigures, *, loading: str) -> None:
        """Everything the bar shows, for ``session`` (None: none ready; ``loading`` says
        what is happening instead)."""
        info = session.info if session else None
        where = ("in-process" if session.in_process else "daemon") if session else ""
        context = figures.context_tokens
        self.show_model(info, where, context, at_least=figures.context_at_least,
                        loading=loading)
        position = context or 0
        if figures.streaming:
            live = figures.live
            self.show_speed(decode_tps=live.decode_tps if live else 0.0,
                            ttft_ms=live.ttft_ms if live else 0.0,
                            prefill_tps=live.prefill_tps if live else 0.0,
                            n_tokens=live.n_tokens if live else 0,
                            samples=figures.samples, waiting=live is None)
            decode = live.decode_tps if live else 0.0
        elif figures.last is not None:
            s = figures.last
            self.show_speed(decode_tps=s.decode_tps, ttft_ms=s.ttft_ms,
                            prefill_tps=s.prefill_tps, n_tokens=s.completion_tokens,
                            samples=self.query_one("#status-spark", Sparkline).data or [],
                            last=True)
            decode = s.decode_tps
        else:
            self.show_speed(decode_tps=0, ttft_ms=0, prefill_tps=0, n_tokens=0, samples=[])
            decode = 0.0
        if self.hardware is None:
            note = "roofline: probing the hardware…"
        elif self._measuring:
            note = "roofline: measuring the memory bandwidth (once per machine)…"
        elif session is None:  # the bandwidth may be known: there is no model to weigh
            note = "roofline: no model loaded"
        else:
            note = "roofline: memory bandwidth unknown (`localinfer hw` measures it)"
        reference = self.reference if session else None
        predicted = reference.predicted_tps(position) if reference else None
        self.show_roofline(reference.roofline if reference else None, decode_tps=decode,
                           position=position, predicted_tps=predicted, bandwidth_note=note)

    def clear_samples(self) -> None:
        """A new chat: no reply's sparkline."""
        self.query_one("#status-spark", Sparkline).data = []

    def show_model(self, info: ModelInfo | None, where: str, context_tokens: int | None,
                   *, at_least: bool = False, loading: str = "") -> None:
        label = self.query_one("#status-model", Label)
        if info is None:
            label.update(loading or "no model loaded: ctrl+o picks one")
            return
        # The cache holds at most n_ctx: a reply the context stopped has one token more,
        # sampled last and never read (it said 257/256).
        ctx = "?" if context_tokens is None else ("≥" if at_least else "") + thousands(
            min(context_tokens, info.n_ctx))
        label.update(f"{info.name} · {info.quant} · {placement(info)} · ctx {ctx}/"
                     f"{thousands(info.n_ctx)} · {where}")

    def show_speed(self, *, decode_tps: float, ttft_ms: float, prefill_tps: float,
                   n_tokens: int, samples: Sequence[float], waiting: bool = False,
                   last: bool = False) -> None:
        label = self.query_one("#status-speed", Label)
        if waiting:
            label.update("waiting for the first token…")
        elif n_tokens == 0 and not last:
            label.update("decode – tok/s · TTFT – · prefill – (measured while a reply streams)")
        else:
            prefix = "last reply: " if last else ""
            label.update(f"{prefix}decode {tps(decode_tps)} tok/s · TTFT {ttft(ttft_ms, n_tokens)}"
                         f" · prefill {tps(prefill_tps)} tok/s · {n_tokens} tok")
        self.query_one(Sparkline).data = list(samples)

    def show_roofline(self, roofline: Roofline | None, *, decode_tps: float, position: int,
                      predicted_tps: float | None, bandwidth_note: str = "") -> None:
        label = self.query_one("#status-roofline", Label)
        parts = []
        ceiling = roofline.ceiling_tps(position) if roofline else None
        if roofline is None or ceiling is None:
            parts.append(bandwidth_note or "roofline: memory bandwidth not known yet")
        else:
            pct = roofline.percent(decode_tps, position)
            share = f"{pct:.0f}% of " if pct is not None and pct >= 10 else \
                f"{pct:.1f}% of " if pct is not None else ""
            bw = []
            if roofline.reads.cpu_weight_bytes:
                bw.append(f"host {roofline.host_bandwidth_gbps:.1f} GB/s"
                          f" {roofline.host_bandwidth_source}")
            if roofline.reads.gpu_weight_bytes:
                bw.append(f"GPU {roofline.gpu_bandwidth_gbps:.0f} GB/s spec")
            approx = "" if roofline.exact else "~"
            parts.append(f"{share}roofline {approx}{tps(ceiling)} tok/s ({', '.join(bw)})")
        if predicted_tps:
            parts.append(f"plan {tps(predicted_tps)} tok/s predicted")
        label.update(" · ".join(parts))
