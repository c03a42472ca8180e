"""What the scheduler saw happen, for the dashboard and ``/metrics``.

The task stream (which run ended where, on which units, when), task durations per
task-name prefix, and workers joining and leaving. The state machine calls in only
when a scheduler serves HTTP (``SchedulerState.events`` is None otherwise), and each
call only appends to a list: durations are folded into histograms when someone reads
them, not on the scheduler's hot path.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from apportion.core.events import TaskRun

# Upper bounds (seconds) of the task-duration histogram buckets; the last is +Inf.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 3600.0)
# Runs kept for the task stream, and worker events kept for the dashboard.
STREAM_LENGTH = 10_000
WORKER_EVENTS = 500
# Ended runs folded into the histograms at the latest after this many (bounds memory
# when nobody reads them).
FOLD_EVERY = 50_000


@dataclass(frozen=True)
class WorkerEvent:
    time: float
    kind: str  # "joined" or "left"
    name: str
    detail: str


@dataclass
class Histogram:
    """The runs of one task name: counts per bucket of ``DURATION_BUCKETS`` (+Inf last),
    the sum of their durations, and how many of them failed."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    total: float = 0.0
    erred: int = 0

    @property
    def runs(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(upper bound, count at or below it)`` pairs as Prometheus histograms give them."""
        out, running = [], 0
        for bound, count in zip((*map(str, DURATION_BUCKETS), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


# One ended run as the state machine records it, a tuple being the cheapest thing to
# build: (key, worker name, state, start, stop, units, dependencies fetched).
Ended = tuple[str, str, str, Any, Any, Any, Any]


class EventLog:
    def __init__(self, clock: Any = time.time) -> None:
        self.clock = clock
        # The task stream: the latest runs.
        self.stream: collections.deque[Ended] = collections.deque(maxlen=STREAM_LENGTH)
        self.workers: collections.deque[WorkerEvent] = collections.deque(maxlen=WORKER_EVENTS)
        # Runs ended since the last fold (see fold).
        self._unfolded: list[Ended] = []
        # Per task name prefix.
        self.durations: dict[str, Histogram] = {}
        # Dependencies workers fetched from other workers, as the runs report them.
        self.transfers = 0
        # Per worker address, the unit numbers its running tasks held at its last
        # heartbeat: run id -> {"GPU": [1]}.
        self.units: dict[str, dict[int, dict[str, list[int]]]] = {}
        # Runs folded so far.
        self.recorded = 0
        # What the Kubernetes operator last said of this cluster (see cluster_status).
        self.cluster: dict[str, Any] | None = None

    # ------------------------------------------------- called by the state machine
    def task_ended(self, key: str, worker: str, state: str, report: dict[str, Any]) -> None:
        """A worker reported a run over; ``report`` is its message (``start``, ``stop``,
        ``units`` and ``fetched`` when the worker sent them). Only appends: this runs
        for every task."""
        self._unfolded.append(
            (
                key,
                worker,
                state,
                report.get("start"),
                report.get("stop"),
                report.get("units"),
                report.get("fetched"),
            )
        )

    def heartbeat(self, address: str, units: list[list[Any]] | None) -> None:
        """A worker's heartbeat: the unit numbers its running tasks hold, by run id."""
        if units:
            self.units[address] = {int(run_id): held for run_id, held in units}
        else:
            self.units.pop(address, None)
        if len(self._unfolded) >= FOLD_EVERY:
            self.fold()  # nobody reads: keep memory bounded all the same

    def worker_joined(self, name: str, detail: str) -> None:
        self.workers.append(WorkerEvent(self.clock(), "joined", name, detail))

    def worker_left(self, name: str, detail: str) -> None:
        self.workers.append(WorkerEvent(self.clock(), "left", name, detail))

    # ------------------------------------------------------------------ readers
    def fold(self) -> dict[str, Histogram]:
        """Bring the task stream, duration histograms and counts up to date; returns the
        histograms. (One pass of plain operations per run: it runs for every task while a
        dashboard is open.)"""
        runs, self._unfolded = self._unfolded, []
        if not runs:
            return self.durations
        now = self.clock()
        durations = self.durations
        bounds = DURATION_BUCKETS
        where = bisect.bisect_left
        transfers = 0
        for run in runs:
            key = run[0]
            stop = run[4] or now
            seconds = stop - (run[3] or stop)
            prefix = key.rpartition("-")[0] or key  # key_prefix, inlined
            histogram = durations.get(prefix)
            if histogram is None:
                histogram = durations[prefix] = Histogram()
            histogram.counts[where(bounds, seconds) if seconds > 0 else 0] += 1
            histogram.total += seconds
            if run[2] == "erred":
                histogram.erred += 1
            if run[6]:
                transfers += run[6]
        self.transfers += transfers
        self.stream.extend(runs)
        self.recorded += len(runs)
        return durations

    @property
    def ended(self) -> dict[str, int]:
        """Runs ended so far: finished ("memory") and failed ("erred")."""
        histograms = self.fold().values()
        erred = sum(h.erred for h in histograms)
        return {"memory": sum(h.runs for h in histograms) - erred, "erred": erred}

    @property
    def outcomes(self) -> dict[str, dict[str, int]]:
        """Per task name: runs finished ("memory") and failed ("erred") so far."""
        return {
            prefix: {"memory": h.runs - h.erred, "erred": h.erred}
            for prefix, h in self.fold().items()
        }

    def recent_runs(self, n: int) -> list[TaskRun]:
        """The last ``n`` runs of the task stream, oldest first."""
        self.fold()
        latest = list(itertools.islice(reversed(self.stream), n))[::-1]
        return [
            TaskRun(key, worker, state, start or stop or 0.0, stop or 0.0, units or {})
            for key, worker, state, start, stop, units, _ in latest
        ]
