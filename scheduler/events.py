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
import time
from dataclasses import dataclass, field
from typing import Any

# Upper bounds (seconds) of the task-duration histogram buckets; the last is +Inf.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 3600.0)
# Runs kept for the task stream, and worker events kept for the dashboard.
STREAM_LENGTH = 10_000
WORKER_EVENTS = 500
# Ended runs folded into the histograms at the latest after this many (bounds memory
# when nobody reads them).
FOLD_EVERY = 50_000


def key_prefix(key: str) -> str:
    """The task name a key starts with: ``inc`` for ``inc-5f3a...`` (keys are
    ``name-token``); the whole key when it has no ``-``."""
    name, dash, _ = key.rpartition("-")
    return name if dash else key


@dataclass(frozen=True)
class TaskRun:
    """One run that ended: ``state`` is ``memory`` (finished) or ``erred``; times are
    the worker's wall clock (seconds since the epoch)."""

    key: str
    worker: str
    state: str
    start: float
    stop: float
    units: dict[str, list[int]] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return key_prefix(self.key)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "prefix": self.prefix,
            "worker": self.worker,
            "state": self.state,
            "start": self.start,
            "stop": self.stop,
            "units": self.units,
        }


@dataclass(frozen=True)
class WorkerEvent:
    time: float
    kind: str  # "joined" or "left"
    name: str
    detail: str


@dataclass
class Histogram:
    """Cumulative counts per bucket of ``DURATION_BUCKETS`` (+Inf last), and the sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    total: float = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """``(upper bound, count at or below it)`` pairs as Prometheus histograms give them."""
        out, running = [], 0
        for bound, count in zip((*map(str, DURATION_BUCKETS), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class EventLog:
    def __init__(self, clock: Any = time.time) -> None:
        self.clock = clock
        self.stream: collections.deque[TaskRun] = collections.deque(maxlen=STREAM_LENGTH)
        self.workers: collections.deque[WorkerEvent] = collections.deque(maxlen=WORKER_EVENTS)
        # Runs ended since the histograms were last brought up to date.
        self._unfolded: list[TaskRun] = []
        self.durations: dict[str, Histogram] = {}
        self.ended = {"memory": 0, "erred": 0}
        # Per task name prefix: runs finished ("memory") and failed ("erred").
        self.outcomes: dict[str, dict[str, int]] = {}
        # Dependencies workers fetched from other workers, as the runs report them.
        self.transfers = 0
        # Per worker address, the unit numbers its running tasks held at its last
        # heartbeat: run id -> {"GPU": [1]}.
        self.units: dict[str, dict[int, dict[str, list[int]]]] = {}
        # Runs ever recorded: lets a reader ask for only what is new (see runs_since).
        self.recorded = 0

    # ------------------------------------------------- called by the state machine
    def task_ended(self, key: str, worker: str, state: str, report: dict[str, Any]) -> None:
        """A worker reported a run over; ``report`` is its message (``start``, ``stop``,
        ``units`` and ``fetched`` when the worker sent them)."""
        stop = report.get("stop") or self.clock()
        run = TaskRun(
            key, worker, state, report.get("start") or stop, stop, report.get("units") or {}
        )
        self.stream.append(run)
        self._unfolded.append(run)
        self.recorded += 1
        fetched = report.get("fetched")
        if fetched:
            self.transfers += fetched
        if len(self._unfolded) >= FOLD_EVERY:
            self.fold()

    def heartbeat(self, address: str, units: list[list[Any]] | None) -> None:
        """A worker's heartbeat: the unit numbers its running tasks hold, by run id."""
        if units:
            self.units[address] = {int(run_id): held for run_id, held in units}
        else:
            self.units.pop(address, None)

    def worker_joined(self, name: str, detail: str) -> None:
        self.workers.append(WorkerEvent(self.clock(), "joined", name, detail))

    def worker_left(self, name: str, detail: str) -> None:
        self.workers.append(WorkerEvent(self.clock(), "left", name, detail))

    # ------------------------------------------------------------------ readers
    def fold(self) -> dict[str, Histogram]:
        """Bring the duration histograms and counts up to date; returns them."""
        runs, self._unfolded = self._unfolded, []
        durations, ended, outcomes = self.durations, self.ended, self.outcomes
        for run in runs:
            prefix = run.prefix
            histogram = durations.get(prefix)
            if histogram is None:
                histogram = durations[prefix] = Histogram()
                outcomes[prefix] = {"memory": 0, "erred": 0}
            histogram.add(max(0.0, run.stop - run.start))
            ended[run.state] = ended.get(run.state, 0) + 1
            outcomes[prefix][run.state] = outcomes[prefix].get(run.state, 0) + 1
        return durations

    def runs_since(self, recorded: int) -> list[TaskRun]:
        """The runs recorded after the reader's count ``recorded`` that are still kept."""
        new = min(self.recorded - recorded, len(self.stream))
        return list(self.stream)[-new:] if new > 0 else []
