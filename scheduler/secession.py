"""Tasks that submit tasks: seceded runs, and the resource deadlock they can cause (no I/O).

A run that *secedes* (``secede()``, ``worker_client()``) gives its thread back: the worker
runs another task in its place, and here its slot counts no more (the worker gets one more
slot while the run stays seceded). It keeps its resources, unless it asked to release
them: then they are free for other tasks (its own subtasks, typically) until it asks for
them back (``reacquire``), which is granted, before any queued task, as soon as they are
free on its worker again.

The deadlock that remains possible: a seceded run that kept its resources waits for a
subtask that could only ever run on those very units (a ``GPU=1`` task on a ``GPU=1``
worker waiting for a ``GPU=1`` subtask). Subtasks are known by their parent (the task whose
client submitted them); a queued subtask that fits no worker even once every other run
there ends, because its seceded ancestors hold the units, fails with
``ResourceDeadlockError`` instead of waiting forever.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from apportion.scheduler.adjustments import adjustments
from apportion.scheduler.model import resize_slots

from apportion.errors import ResourceDeadlockError
from apportion.resources import Shape, fits, format_resources

if TYPE_CHECKING:
    from apportion.scheduler.model import TaskState, WorkerState
    from apportion.scheduler.recovery import WorkerReport
    from apportion.scheduler.state_view import StateView

logger = logging.getLogger("apportion.scheduler")

Message = dict[str, Any]


class SecededRun:
    __slots__ = ("address", "key", "released", "run_id", "shape")

    def __init__(self, address: str, key: str, run_id: int, shape: Shape, released: bool) -> None:
        self.address = address
        self.key = key
        self.run_id = run_id
        self.shape = shape
        self.released = released


class Secession:
    """The scheduler's books on seceded runs and on which task submitted which."""

    def __init__(self, state: StateView) -> None:
        self.state = state
        self.runs: dict[int, SecededRun] = {}
        # Subtask key -> the key of the task that submitted it, and the reverse.
        self.parent: dict[str, str] = {}
        self.children: dict[str, set[str]] = {}
        # Runs that released their resources and asked for them back, per worker address.
        self.reacquiring: dict[str, list[SecededRun]] = {}
        # Runs that rejoined, until they end (run id -> worker address).
        self.rejoined: dict[int, str] = {}

    # ----------------------------------------------------------------- stimuli
    def spawned(self, parent: str, keys: Iterable[str]) -> None:
        """A task's client submitted ``keys``: check them for the deadlock at once."""
        if len(self.parent) > 2 * len(self.state.tasks) + 1000:  # drop forgotten ones
            self.forget([k for k in self.parent if k not in self.state.tasks])
        kids = self.children.setdefault(parent, set())
        for key in keys:
            self.parent[key] = parent
            kids.add(key)
        self.check(kids)

    def secede(self, address: str, run_id: int, release: bool) -> None:
        state = self.state
        ws = state.workers.get(address)
        ts = ws.processing.get(run_id) if ws is not None else None
        if ws is None or ts is None or run_id in self.runs or ts.processing_on is not ws:
            return
        run = self._book(ws, run_id, ts, release)
        logger.info(
            "task %s seceded on %s (%s)",
            ts.key,
            ws.name,
            "resources released" if release and ts.shape else "resources kept",
        )
        state.offer_slots(ws)
        if not run.released:
            self.check(self.children.get(ts.key, ()))

    def _book(self, ws: WorkerState, run_id: int, ts: TaskState, release: bool) -> SecededRun:
        run = self.runs[run_id] = SecededRun(ws.address, ts.key, run_id, ts.shape, release)
        if release and ts.shape:
            _give_back(ws, ts.shape)
            adjustments(self.state).unheld_runs.add(run_id)
        self._extra_slot(ws, +1)
        return run

    def adopt(self, ws: WorkerState, report: WorkerReport) -> None:
        """A worker registering with a new scheduler (after ``adoption.adopt`` booked
        its runs, before it gets new work): its seceded runs stand as they did, their
        resources released or kept, and those waiting for theirs back ask again (their
        ``reacquire`` went to the scheduler that is gone). Runs adopted as stale too: they
        hold what they hold until they end."""
        for reported in report.running:
            ts = ws.processing.get(reported.run_id)
            if not reported.seceded or ts is None or reported.run_id in self.runs:
                continue
            self._book(ws, reported.run_id, ts, reported.released)
            if reported.reacquiring and reported.released:
                self.reacquire(ws.address, reported.run_id)

    def respawned(self, specs: Iterable[Message]) -> None:
        """Tasks a reconnecting client re-registered: which task submitted which comes
        with them (their ``parent``), as it was first submitted."""
        by_parent: dict[str, list[str]] = {}
        for spec in specs:
            parent = spec.get("parent")
            if isinstance(parent, str) and parent:
                by_parent.setdefault(parent, []).append(spec["key"])
        for parent, keys in by_parent.items():
            self.spawned(parent, keys)

    def recovered(self) -> None:
        """Subtasks held back or waiting for a worker may be queued now (the recovery wait
        is over, or a worker came back with seceded runs): the deadlock check they could
        not have then."""
        if self.parent:
            self.check(list(self.parent))

    def rejoin(self, address: str, run_id: int) -> None:
        """The run takes a thread again (its resources, if released, came back first).
        Its extra slot stays until it ends: the task that slot brought in meanwhile waits
        on the worker for a thread, like a prefetched one."""
        if self.runs.pop(run_id, None) is not None:
            self.rejoined[run_id] = address

    def reacquire(self, address: str, run_id: int) -> None:
        run = self.runs.get(run_id)
        if run is None or not run.released or run in self.reacquiring.get(address, ()):
            return  # (asked again: its worker reported it asking, then its message came)
        self.reacquiring.setdefault(address, []).append(run)
        adjustments(self.state).reacquire = self.grant  # called as resources come free
        ws = self.state.workers.get(address)
        if ws is not None:
            self.grant(ws)

    def grant(self, ws: WorkerState) -> None:
        """Give back released resources to the runs asking for them on ``ws`` that fit
        now, oldest request first (called whenever resources come free there)."""
        waiting = self.reacquiring.get(ws.address)
        state = self.state
        while waiting and fits(waiting[0].shape, ws.free):
            run = waiting.pop(0)
            run.released = False
            adjustments(state).unheld_runs.discard(run.run_id)
            _take(ws, run.shape)
            state.send(ws.address, {"op": "reacquired", "run_id": run.run_id})
        if not waiting:
            self.reacquiring.pop(ws.address, None)
            if not self.reacquiring:
                adjustments(state).reacquire = None

    def run_ended(self, address: str, run_id: int) -> None:
        """Before the state hears the run is over: a seceded run's extra slot goes (the
        state's _end_run releases what it still holds)."""
        run = self.runs.pop(run_id, None)
        if run is None:
            if self.rejoined.pop(run_id, None) is None:
                return
        else:
            waiting = self.reacquiring.get(address)
            if waiting and run in waiting:
                waiting.remove(run)
        ws = self.state.workers.get(address)
        if ws is not None:
            self._extra_slot(ws, -1)

    def forget(self, keys: Iterable[str]) -> None:
        for key in keys:
            parent = self.parent.pop(key, None)
            if parent is not None and parent in self.children:
                self.children[parent].discard(key)
                if not self.children[parent]:
                    del self.children[parent]

    def descendants(self, keys: Iterable[str]) -> list[str]:
        found: list[str] = []
        stack = list(keys)
        while stack:
            for child in self.children.get(stack.pop(), ()):
                found.append(child)
                stack.append(child)
        return found

    def worker_lost(self, address: str) -> None:
        self.reacquiring.pop(address, None)
        if not self.reacquiring:
            adjustments(self.state).reacquire = None
        for run_id in [r for r, run in self.runs.items() if run.address == address]:
            adjustments(self.state).unheld_runs.discard(run_id)
            del self.runs[run_id]
        for run_id in [r for r, where in self.rejoined.items() if where == address]:
            del self.rejoined[run_id]

    # ----------------------------------------------------------------- deadlock
    def check(self, keys: Iterable[str]) -> None:
        state = self.state
        for key in list(keys):
            ts = state.tasks.get(key)
            if ts is None or ts.state != "queued" or not ts.shape:
                continue
            blockers = self._held_by_ancestors(key)
            if not blockers:
                continue
            if any(_could_run(ts.shape, ws, blockers) for ws in state.fitting.get(ts.shape, ())):
                continue
            state.fail(ts, deadlock_error(ts, blockers, state.fitting.get(ts.shape, ())))

    def _held_by_ancestors(self, key: str) -> dict[str, list[SecededRun]]:
        """Seceded runs of ``key``'s ancestors that kept their resources, per worker."""
        ancestors = set()
        parent = self.parent.get(key)
        while parent is not None and parent not in ancestors:
            ancestors.add(parent)
            parent = self.parent.get(parent)
        held: dict[str, list[SecededRun]] = {}
        for run in self.runs.values():
            if run.key in ancestors and not run.released and run.shape:
                held.setdefault(run.address, []).append(run)
        return held

    def _extra_slot(self, ws: WorkerState, delta: int) -> None:
        state = self.state
        # A worker gone meanwhile is counted, but not put back among those with slots.
        resize_slots(ws, delta, state.with_slots if ws.address in state.workers else {})


def _could_run(shape: Shape, ws: WorkerState, blockers: dict[str, list[SecededRun]]) -> bool:
    """Whether ``shape`` fits ``ws`` once every run there ends except the blocking ones."""
    held: dict[str, float] = {}
    for run in blockers.get(ws.address, ()):
        for name, amount in run.shape:
            held[name] = held.get(name, 0) + amount
    return fits(shape, {name: total - held.get(name, 0) for name, total in ws.total.items()})


def deadlock_error(
    ts: TaskState, blockers: dict[str, list[SecededRun]], fitting: Iterable[WorkerState]
) -> ResourceDeadlockError:
    holders = sorted({run.key for runs in blockers.values() for run in runs})
    names = sorted(ws.name for ws in fitting)
    return ResourceDeadlockError(
        f"task {ts.key!r} needs {format_resources(dict(ts.shape))}, which it could only get "
        f"on worker(s) {names}, where task(s) {holders} hold it while they wait for their "
        "subtasks: it could never run. Release the parent's resources while it waits "
        "(worker_client(release_resources=True)), or add a worker with these resources",
        key=ts.key,
        holders=holders,
    )


def _give_back(ws: WorkerState, shape: Shape) -> None:
    used, free, total = ws.used, ws.free, ws.total
    for name, amount in shape:
        left = used[name] - amount
        used[name] = left = 0 if -1e-9 < left < 1e-9 else left
        free[name] = total[name] - left - ws.held.get(name, 0)


def _take(ws: WorkerState, shape: Shape) -> None:
    used, free, total = ws.used, ws.free, ws.total
    for name, amount in shape:
        used[name] += amount
        free[name] = total[name] - used[name] - ws.held.get(name, 0)
