"""Thread counts that follow the machine's load: the engine's worker times every step, and
when other processes take cores it tries fewer threads, keeping them only while they are
measured faster; it tries more again when the load leaves.

llama.cpp's threads meet at a barrier after every operation of a step, so a step is as slow as
its slowest thread: with one core busy in another process, the thread that shares that core is
descheduled half the time and the others wait for it. On a 2-core x86 the starter model then
decodes faster with 1 thread than with 2 (17.5 against 11.1 tok/s; 14.2 against 0.42 at a load
of 5-9). Which count is best depends on the CPU, the model and the load, so it is measured, not
assumed: ``ThreadPolicy`` is the pure explore/exploit rule for one kind of step (fed with
thread counts and step times), ``ThreadTuner`` applies one policy per kind of step to a backend
and samples the other processes' CPU use, the cheap signal that says when to try. A request that
comes to an idle engine starts from the count learned for the cores other processes hold at
that instant (``others_running_now``), which ``ThreadMemory`` keeps per model across processes.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..paths import atomic_write_text, parse_json

log = logging.getLogger(__name__)

WINDOW_STEPS = 6
"""Steps measured at one thread count before it is judged (their median): a decode step of a
small model takes 20-60 ms, so a window is a fraction of a second."""
SWITCH_MARGIN = 0.08
"""Another count is kept only when its median step is this much faster: two counts within
noise of each other must not take turns."""
JUMP = 0.3
"""A window this much slower than the last settled one tries one thread fewer at once. (A
faster one tries nothing by itself: under a fluctuating load steps speed up and slow down
all the time, while a core that comes free shows in the other processes' CPU use.)"""
GIVE_UP = 1.3
"""A tried count whose first two steps are both this much slower than the current count's
median is given up at once, and one whose first step is ``2 * GIVE_UP`` slower after that
step: under load a worse count can be several times slower (0.5 s a step against 0.045 s),
so a whole window of it would cost more than the try can win."""
TRY_BUDGET = 0.02
"""After a try that changed nothing, the next periodic one waits until the time the try lost
(its steps' excess over the current count's) is at most this share of the time between;
after a switch, until one step of the old count would be."""
FIRST_INTERVAL_STEPS = 32
"""Steps between the first two periodic tries; the interval doubles after each try that
changes nothing, up to ``LAST_INTERVAL_STEPS``, so that a stable machine pays almost nothing
(a try of a worse count costs two slower steps)."""
LAST_INTERVAL_STEPS = 1024
SLACK_CORES = 0.5
"""How far the other processes' CPU use may exceed the cores this count leaves them before
the machine counts as crowded (try fewer threads), and how far below what one more thread
needs it must stay for there to be room (try more)."""
BUSY_SHARE = 0.25
"""The share of a core other processes must have used over ``ADMIT_SPAN_S`` for a thread of
theirs in the run queue at an admission to count as a busy core (``ThreadTuner.admit``)."""
ADMIT_SPAN_S = 1.0
"""At an admission, the other processes must have used a busy core's share over at least this
span (with a thread of theirs in the run queue at that instant) for the core to count as busy:
a client's burst as it sends its request (the streams bench's client between two runs: 0.1-0.3
s of a core, which started 4 streams at one thread of two, 0.7x) is then not a core kept busy,
and a process that keeps one busy shows over any span."""
CONFIRM_S = (0.001, 0.002)
"""At an admission where another process's thread is in the run queue, the pauses after which
it is read again (``ThreadTuner.admit``): a core kept busy is taken at every instant, while the
client that just sent the request, or a server that just sent its last reply (the other server
of a side by side), leaves the queue within a millisecond or two. Only a machine that looks
busy pays them."""
LOAD_SAMPLE_S = 0.5
"""The shortest span over which the other processes' CPU use is measured."""
FIRST_SAMPLE_S = 0.1
"""The shortest span for the first figure, taken when the first step of a kind comes (its
count starts from it): the load since the engine was made, its warm-up included. /proc/stat
counts in 10 ms ticks, so 0.1 s on 2 cores reads the load to about 0.1 of a core."""


def step_group(rows: int) -> str:
    """The kind of step a batch of ``rows`` tokens is, for the thread count: llama.cpp runs a
    one-row step with ``n_threads`` and any other with ``n_threads_batch``, and the costs
    differ in kind (one row reads every weight for one token: memory-bound; a prompt chunk
    is compute-bound), so each kind learns its own count."""
    if rows <= 1:
        return "1 row"
    if rows <= 8:
        return "2-8 rows"
    if rows <= 64:
        return "9-64 rows"
    return "65+ rows"


EMBED_GROUP = "embeddings"
"""The kind of step a decode of inputs to embed or rank is: compute-bound as a prompt chunk is,
but at positions from 0 and without the output layer, so it learns its own count. With a core
kept busy by another process a 117-token input took 510-760 ms at 2 threads of 2 against
325-330 ms at 1 (starter, 2-core x86); idle 195-205 ms against 330."""


def step_cost(rows: int, seconds: float) -> float:
    """A step's time made comparable across the row counts of one group. Up to 8 rows a step
    costs about the square root of its rows (an 8-row step ~2-3x a 1-row one on x86, as the
    weights are read once for all rows); a larger one about its rows (compute-bound)."""
    if rows <= 8:
        return seconds / max(1, rows) ** 0.5
    return seconds / rows


@dataclass
class ThreadPolicy:
    """Which thread count one kind of step runs with. It runs with ``n_threads`` and tries a
    neighbouring count for a window: one fewer when other processes start to crowd the cores
    or the step time jumps up, one more when a core comes free, and both now and then (see
    ``FIRST_INTERVAL_STEPS``); it moves only to a count measured ``SWITCH_MARGIN`` faster."""

    max_threads: int
    n_threads: int = 0
    """The count the next step runs with (0: start at ``max_threads``)."""
    switches: int = 0
    """How many times the count changed: a stable machine should see few."""
    steps: int = 0
    """Steps recorded, at any count."""
    _recent: list[float] = field(default_factory=list)
    _settled_cost: float | None = None
    _trying: list[int] = field(default_factory=list)
    """The counts still to try, the current one first."""
    _tried: dict[int, list[float]] = field(default_factory=dict)
    _since_try: int = 0
    _interval: int = FIRST_INTERVAL_STEPS
    _room: bool = False
    _crowded: bool = False
    _fewer_lost_at: float | None = None
    """The other processes' load at the last try of one thread fewer that lost (None after
    a switch): see ``record``."""
    _try_load: float = 0.0
    _more_wait: int = 0
    """Steps at this count before a core coming free tries one more again, after a try of it
    that lost: see ``record``."""

    def __post_init__(self) -> None:
        self.max_threads = max(1, self.max_threads)
        self.n_threads = min(self.n_threads or self.max_threads, self.max_threads)
        if self.n_threads < self.max_threads:
            # Started below all cores by the measured load: a core coming free starts a try
            # at once, so the periodic one only guards against a misleading figure, and
            # under a heavy load one step of more threads costs as much as 40 (see _decide).
            self._interval = 8 * FIRST_INTERVAL_STEPS

    @property
    def judged(self) -> bool:
        """A window at its count has been judged, and no other count is being tried."""
        return self._settled_cost is not None and not self._trying

    @property
    def next_threads(self) -> int:
        """The count for the next step of this kind."""
        return self._trying[0] if self._trying else self.n_threads

    def record(self, threads: int, cost: float, others_cores: float) -> None:
        """One step of this kind ran with ``threads`` threads at ``cost`` (``step_cost``),
        while other processes used ``others_cores`` cores' worth of CPU."""
        self.steps += 1
        if self._trying:
            self._record_try(threads, cost)
            return
        if threads != self.n_threads:
            return
        self._recent.append(cost)
        self._since_try += 1
        if len(self._recent) < WINDOW_STEPS:
            return
        now = statistics.median(self._recent)
        self._recent.clear()
        n, most = self.n_threads, self.max_threads
        # Whether the other processes leave a core for one more thread, and whether they
        # want more than the cores this count leaves them. Tries start when either turns
        # true (an edge, not a level: a count that stays worse is not tried every window).
        room = n < most and others_cores <= most - n - 1 + SLACK_CORES
        crowded = n > 1 and others_cores >= most - n + SLACK_CORES
        more = room and not self._room
        fewer = crowded and not self._crowded
        self._room, self._crowded = room, crowded
        if fewer and self._fewer_lost_at is not None and \
                others_cores < self._fewer_lost_at + SLACK_CORES:
            # One fewer lost at this load already: a load that comes and goes around the
            # threshold (a laptop's background work) would otherwise try it at every edge,
            # a window in two (each try's steps at 1 of 2 threads took twice as long).
            fewer = False
        if more and self._since_try < self._more_wait:
            # One more lost lately: at a load that comes and goes, a core comes free at every
            # other window. It waits, as a periodic try does, until the time that try lost is
            # at most TRY_BUDGET of the time since; a core still free then is tried (the edge
            # is kept for it). After a try that lost 1-2 steps, that is 50-100 steps.
            more = False
            self._room = False
        settled = self._settled_cost
        if settled is None:
            self._settled_cost = now
        elif now > settled * (1 + JUMP):
            fewer = True
        if self._since_try >= self._interval:
            more, fewer = True, fewer or crowded
        if more or fewer:
            self._try_load = others_cores
            self._try(now, more=more, fewer=fewer)

    def _record_try(self, threads: int, cost: float) -> None:
        if threads != self._trying[0]:
            return  # not the count being tried (a step that began before the change)
        samples = self._tried.setdefault(threads, [])
        samples.append(cost)
        current = self._tried[self.n_threads][0]
        if len(samples) >= WINDOW_STEPS or min(samples) > current * GIVE_UP * (
                1 if len(samples) >= 2 else 2):
            self._trying.pop(0)
            if not self._trying:
                self._decide()

    def _try(self, cost_now: float, *, more: bool, fewer: bool) -> None:
        """Try the neighbouring counts, after a window at the current one (``cost_now``)."""
        candidates = [n for n, wanted in ((self.n_threads - 1, fewer),
                                          (self.n_threads + 1, more))
                      if wanted and 1 <= n <= self.max_threads]
        if not candidates:
            self._since_try = 0
            return
        self._tried = {self.n_threads: [cost_now]}
        self._trying = candidates

    def _decide(self) -> None:
        current = self._tried.pop(self.n_threads)[0]
        medians = {n: statistics.median(costs) for n, costs in self._tried.items()}
        best = min(medians, key=lambda n: medians[n])
        if medians[best] < current * (1 - SWITCH_MARGIN):
            self.n_threads = best
            self.switches += 1
            self._settled_cost = medians[best]
            # Trying the old count again costs what it was measured to lose: under a heavy
            # load one step of 2 threads took as long as 40 of 1.
            self._interval = _interval_for(current / medians[best] - 1, self._interval)
            # Judged afresh at the new count: still crowded, it tries one fewer again.
            self._room = self._crowded = False
            self._fewer_lost_at = None
            self._more_wait = 0
        else:
            self._settled_cost = current
            lost_steps = sum(max(0.0, cost / current - 1) for costs in self._tried.values()
                             for cost in costs)
            if self.n_threads - 1 in self._tried:
                self._fewer_lost_at = self._try_load
            if self.n_threads + 1 in self._tried:
                # Tried again once the wait is over if the core is still free (its edge
                # then comes again): a load that left just after the try is not missed.
                self._more_wait = _interval_for(lost_steps, 0)
                self._room = False
            self._interval = _interval_for(lost_steps, 2 * self._interval)
        self._tried = {}
        self._since_try = 0


def _interval_for(lost_steps: float, at_least: int) -> int:
    """Steps until the next periodic try, for a try that loses ``lost_steps`` steps' time."""
    return min(max(at_least, round(lost_steps / TRY_BUDGET)), LAST_INTERVAL_STEPS)


def others_cpu_seconds() -> tuple[float, float]:
    """(seconds of CPU every process has used, seconds this process has used) so far; their
    difference over a span is the other processes' use (the host's steal counts as theirs)."""
    import psutil

    times = psutil.cpu_times()
    waiting = times.idle + getattr(times, "iowait", 0.0)
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    own = os.times()
    return total - waiting, own.user + own.system


def others_running_now() -> int | None:
    """How many threads of other processes are running or waiting to run right now, from the
    kernel's run queue (Linux: /proc/stat's procs_running, less this process's own running
    threads); None where the kernel does not say. An instant, not an average: a process that
    keeps a core busy is in the run queue at every instant, and one that finished a second
    ago is not (the load average still counts it for a minute)."""
    try:
        with open("/proc/stat", "rb") as f:
            stat = f.read()
        at = stat.index(b"procs_running ")
        running = int(stat[at + 14:stat.index(b"\n", at)])
    except (OSError, ValueError):
        return None
    if running <= 1:
        return 0  # the one running is the thread asking
    own = 0
    try:
        for task in os.scandir("/proc/self/task"):
            try:
                with open(f"{task.path}/stat", "rb") as f:
                    state = f.read()
            except OSError:
                continue  # a thread that ended meanwhile
            if state[state.rindex(b")") + 2:][:1] == b"R":
                own += 1
    except OSError:
        return None
    return max(0, running - max(1, own))


class ThreadMemory:
    """The thread counts learned for one model on this machine, kept in a small JSON file
    across requests and processes (each ``localinfer run`` is a new one): for each kind of
    step and each number of cores other processes kept busy, the count that was fastest."""

    def __init__(self, path: Path | None, max_threads: int) -> None:
        self.path = path
        self.max_threads = max_threads
        self.counts: dict[str, int] = {}
        """``"<kind of step>@<busy cores>"`` -> thread count."""
        if path is not None:
            try:
                saved = parse_json(path.read_text())
                if saved.get("max_threads") == max_threads:
                    self.counts = {str(k): int(v) for k, v in saved["counts"].items()
                                   if 1 <= int(v) <= max_threads}
            except FileNotFoundError:
                pass
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("ignoring the learned thread counts in %s: %s", path, exc)

    def get(self, group: str, busy: int) -> int | None:
        return self.counts.get(f"{group}@{busy}")

    def learn(self, group: str, busy: int, threads: int) -> None:
        key = f"{group}@{busy}"
        if self.counts.get(key) == threads:
            return
        self.counts[key] = threads
        if self.path is None:
            return
        try:  # atomically: another process of the same model may read it now
            atomic_write_text(self.path, json.dumps({"max_threads": self.max_threads,
                                                     "counts": self.counts}, sort_keys=True),
                              sync=False)  # on the engine's thread: no fsync's wait
        except OSError as exc:
            log.warning("cannot keep the learned thread counts in %s: %s", self.path, exc)


def forget_thread_memory(directory: Path) -> bool:
    """Remove the learned thread counts kept in ``directory``: whether there were any."""
    files = list(directory.glob("*.json")) if directory.is_dir() else []
    for f in files:
        f.unlink(missing_ok=True)
    return bool(files)


# Only the count adapts. llama.cpp's threadpool settings (polling level, priority) do not
# apply to llama-cpp-python's build: it runs ggml's threads as an OpenMP team, whose barrier
# waits by libgomp's rules (spin briefly, then sleep), and 0.3.36 binds no
# llama_attach_threadpool; a higher priority needs privileges, a lower one loses to the load.
class ThreadTuner:
    """Sets each step's thread count from a ``ThreadPolicy`` per kind of step (``step_group``)
    and feeds the policy the step's time. Off (never sets anything) when ``max_threads`` is 0:
    the user fixed the count."""

    def __init__(self, max_threads: int, apply: Callable[[int, int], None], *,
                 cpu_seconds: Callable[[], tuple[float, float]] = others_cpu_seconds,
                 running_now: Callable[[], int | None] = others_running_now,
                 memory: ThreadMemory | None = None,
                 admit_span_s: float = ADMIT_SPAN_S) -> None:
        self.max_threads = max_threads
        self.admit_span_s = admit_span_s
        self._apply = apply
        self.cpu_seconds = cpu_seconds
        """(all processes' CPU seconds, this process's) so far; tests give a simulated one."""
        self.running_now = running_now
        """Other processes' threads in the run queue now (``others_running_now``)."""
        self.memory = memory or ThreadMemory(None, max_threads)
        self.policies: dict[str, ThreadPolicy] = {}
        self._busy: int | None = None
        """The cores other processes held at the last admission (``admit``); None before the
        first, or where the kernel does not say. Between admissions the load sampled over the
        steps (``others_cores``) stands for it."""
        self._recheck = False
        """The next step samples the load after FIRST_SAMPLE_S (``_rechecked``)."""
        self._applied = (max_threads, max_threads)
        self._measured = False  # others_cores is a figure, not the 0 it starts as
        self.others_cores = 0.0
        """Cores' worth of CPU the other processes used over the last sample."""
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=16)
        """The latest samples (time, all processes' CPU seconds, this one's), oldest first:
        ``others_cores`` is the load between the last two."""
        if max_threads:
            self._sample_load(time.perf_counter())  # known by the first step, to start from

    @property
    def threads(self) -> dict[str, int]:
        """The count each kind of step runs with now."""
        return {group: p.n_threads for group, p in self.policies.items()}

    @contextmanager
    def step(self, rows: int, group: str | None = None) -> Iterator[None]:
        """Around one decode of ``rows`` tokens: set its thread count, time it. ``group``:
        its kind where it is not a generation step's (``EMBED_GROUP``), else by its rows."""
        if not self.max_threads:
            yield
            return
        policy = self.policies.get(group := group or step_group(rows))
        if policy is None:
            policy = self.policies[group] = ThreadPolicy(self.max_threads,
                                                          self._start_count(group))
        threads = policy.next_threads
        wanted = (threads, self._applied[1]) if rows <= 1 else (self._applied[0], threads)
        if wanted != self._applied:
            self._apply(*wanted)
            self._applied = wanted
        started = time.perf_counter()
        yield
        now = time.perf_counter()
        self._sample_load(now, FIRST_SAMPLE_S if self._recheck else LOAD_SAMPLE_S)
        if self._recheck and self._samples and self._samples[-1][0] == now:
            self._rechecked()
        policy.record(threads, step_cost(rows, now - started), self.others_cores)
        if policy.judged:
            self.memory.learn(group, self._busy_cores(), policy.n_threads)

    @contextmanager
    def embedding(self, rows: int, *, idle: bool) -> Iterator[None]:
        """Around one decode of ``rows`` tokens to embed or rank: a step of its own kind
        (``EMBED_GROUP``) which, where the engine generates nothing (``idle``), starts from
        the cores other processes hold now, as a request that comes to an idle engine does
        (``admit``): a window of steps at the count of a load that has left took 1.6-1.8x as
        long (2-core x86)."""
        if idle:
            self.admit()
        with self.step(rows, EMBED_GROUP):
            yield

    def admit(self) -> None:
        """A request comes to an idle engine: each kind of step starts from the count learned
        for as many cores as other processes hold now (``others_running_now``, where their
        CPU use since the last step agrees), else from the cores they leave; the step times
        go on from there. Replies are short: a count that has
        to be learned again in each, or that follows the load of minutes ago, costs most of
        one (a 96-token reply with a core kept busy took 0.88x the best fixed count's rate)."""
        if not self.max_threads:
            return
        busy = self.running_now()
        if busy is None:  # not known here: the load sampled over the steps decides
            return
        for pause in CONFIRM_S if busy else ():
            time.sleep(pause)
            busy = min(busy, self.running_now() or 0)
            if not busy:
                break
        # A thread in the run queue at this instant may be there for a moment only: the
        # client that sent the request, still parsing other streams. A process that keeps a
        # core busy also used a good share of it over the last second (the idle time, or the
        # steps, whose threads it shared the cores with: ~0.5): the cores counted are those
        # both figures show.
        # (No figure yet, as at a process's first request just after the model's load: the
        # run queue alone.)
        self._sample_load(time.perf_counter(), FIRST_SAMPLE_S)
        recent = int(self._others_over(self.admit_span_s) + 1 - BUSY_SHARE) \
            if self._measured else busy
        self._busy = min(busy, recent, self.max_threads)
        self.others_cores = float(self._busy)
        self._recheck = self._busy > 0
        self._restart_policies()

    def _restart_policies(self) -> None:
        """Each kind of step starts again from the count for the cores now counted busy."""
        for group, policy in list(self.policies.items()):
            start = self._count_for(group)
            if start is not None and start != policy.n_threads:
                self.policies[group] = ThreadPolicy(self.max_threads, start)

    def _rechecked(self) -> None:
        """The load sampled FIRST_SAMPLE_S after an admission that counted busy cores: where
        it shows fewer, each kind of step starts again from the count for them. The process
        that held them at that instant has stopped: a server that had just sent its last
        reply (the other server of a side by side), whose threads spin for a while after;
        else its steps would run at the cores it left until a window of steps is judged and
        one more thread tried (a second or more of a three-second run)."""
        self._recheck = False
        recent = min(self.max_threads, int(self.others_cores + 1 - BUSY_SHARE))
        if self._busy is not None and recent < self._busy:
            self._busy = recent
            self.others_cores = float(recent)
            self._restart_policies()

    def _busy_cores(self) -> int:
        return min(self.max_threads, round(self.others_cores))

    def _count_for(self, group: str) -> int | None:
        """The count learned for this kind of step at the present load, else the cores that
        load leaves (None: the load is not known)."""
        if self._busy is None:
            return None
        busy = self._busy_cores()
        learned = self.memory.get(group, busy)
        return learned if learned is not None else max(1, self.max_threads - busy)

    def _start_count(self, group: str) -> int:
        """The count a new kind of step starts with: the one learned for it at the load of
        the last admission (``admit``), else the one the most measured kind runs
        with once it has judged a window, else the cores the other processes leave now (all
        when the load is not known yet); the step times decide from there. A kind's first
        step can come long after the engine started (the first long prompt), and a tenth of a
        second of load then is no guide: a client's burst of CPU as it started 8 streams left
        the daemon's prompt chunks at 1 of 2 threads, 1.7x slower, for the rest of the run."""
        learned = self.memory.get(group, self._busy_cores()) if self._busy is not None \
            else None
        if learned is not None:
            return learned
        known = max(self.policies.values(), key=lambda p: p.steps, default=None)
        if known is not None and known.steps >= WINDOW_STEPS:
            return known.n_threads
        if self._busy is None:
            self._sample_load(time.perf_counter(), FIRST_SAMPLE_S)
        return max(1, self.max_threads - self._busy_cores())

    def _sample_load(self, now: float, span_s: float = LOAD_SAMPLE_S) -> None:
        if self._samples and now - self._samples[-1][0] < span_s:
            return
        try:
            every, own = self.cpu_seconds()
        except (OSError, RuntimeError, ImportError):  # no figures here: the step times decide
            return
        if self._samples:
            self.others_cores = _others_between(self._samples[-1], (now, every, own))
            self._measured = True
        self._samples.append((now, every, own))

    def _others_over(self, span_s: float) -> float:
        """The other processes' CPU use, in cores, from the newest sample at least ``span_s``
        before the latest (else the oldest kept) to the latest."""
        latest = self._samples[-1]
        old = [s for s in self._samples if s[0] <= latest[0] - span_s]
        start = old[-1] if old else self._samples[0]
        return _others_between(start, latest) if start[0] < latest[0] else self.others_cores


def _others_between(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """The other processes' CPU use, in cores, between two samples (time, all processes' CPU
    seconds, this one's)."""
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / (b[0] - a[0]))
