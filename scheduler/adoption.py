"""A new scheduler adopting what survived the old one (no I/O).

Functions over ``SchedulerState``, through ``AdoptionHost`` (what they use of it), carrying
out the decisions of ``scheduler/recovery.py``.
For ``scheduler.recovery-wait`` seconds after start, the scheduler is *recovering*:

- a worker's reported runs are booked on it as they are (resources and all), and its held
  results are registered, before it gets any new work; results and runs of keys no client
  has re-registered yet are kept, wanted by the pseudo-client ``RECOVERING``;
- tasks that reconnecting clients re-register (``submit`` with ``recover``) are not placed
  before the wait ends, so that a worker still reconnecting can claim them first.

When the wait ends, what no client claimed is released, and the re-registered tasks that no
worker held or ran are computed from their lineage.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Protocol

from apportion.scheduler.adjustments import Adjustments, adjustments
from apportion.scheduler.model import NOTHING, TaskState, TaskStateName, WorkerState
from apportion.scheduler.prefetch import hold_runs
from apportion.scheduler.recovery import (
    RECOVERING,
    Decision,
    ReportedError,
    ReportedRun,
    WorkerReport,
    decide_erred,
    decide_held,
    decide_run,
)
from apportion.scheduler.restrictions import restrict

from apportion.resources import Shape, to_shape

logger = logging.getLogger("apportion.scheduler")

Message = dict[str, Any]


class AdoptionHost(Protocol):
    """What adopting a worker's report and the recovery wait take of ``SchedulerState``:
    its records, and the transitions they carry out as any other stimulus would."""

    tasks: dict[str, TaskState]
    idle: dict[WorkerState, None]
    with_slots: dict[WorkerState, None]
    clock: Callable[[], float]
    recovery: Recovery
    adjusted: Adjustments | None
    _seq: Iterator[int]  # also the run ids
    _shapes: dict[Shape, Shape]
    _notices: dict[tuple[str, Shape], list[str]]

    def send(self, dest: str, message: Message) -> None: ...

    def handle_release(self, client: str, keys: list[str]) -> None: ...

    def _with(self, members: frozenset[Any], item: Hashable) -> frozenset[Any]: ...

    def _without(self, members: frozenset[Any], item: Hashable) -> frozenset[Any]: ...

    def _set_state(self, ts: TaskState, new: TaskStateName, reason: str) -> None: ...

    def _make_ready(self, ts: TaskState) -> None: ...

    def _ensure_computed(self, root: TaskState) -> None: ...

    def _fail(self, ts: TaskState, exc: BaseException) -> None: ...

    def _fail_with(
        self, root: TaskState, exception: bytes, traceback: str, reason: str
    ) -> None: ...

    def _release_if_unneeded(self, ts: TaskState) -> None: ...

    def _finished_message(self, ts: TaskState, data: bytes | None) -> Message: ...


# ------------------------------------------------------------------ workers
def adopt(state: AdoptionHost, ws: WorkerState, report: WorkerReport) -> None:
    """Book what a registering worker runs and holds, before it gets new work."""
    recovering = state.recovery.active(state.clock())
    highest = 0
    for run in report.running:
        highest = max(highest, run.run_id)
        _adopt_run(state, ws, run, recovering)
    if highest:
        # The scheduler's next run ids must not clash with this worker's runs.
        state._seq = itertools.count(max(next(state._seq), highest + 1))
    for key, nbytes in report.held.items():
        _adopt_held(state, ws, key, nbytes, recovering, report.attempts.get(key))
    for error in report.erred:
        _adopt_error(state, ws, error, recovering)
    if any(used > ws.total.get(name, 0) + 1e-9 for name, used in ws.used.items()):
        # Its resources were set lower (set_resources) while these runs held them:
        # over its total until they end, as on the scheduler that set them.
        adjustments(state).shrunk.add(ws)
    if report.running or report.held or report.erred:
        logger.info(
            "worker %s brought %d results, %d runs and %d errors from before the restart",
            ws.name,
            len(report.held),
            len(report.running),
            len(report.erred),
        )


def _adopt_run(state: AdoptionHost, ws: WorkerState, run: ReportedRun, recovering: bool) -> None:
    ts = state.tasks.get(run.key)
    running_on = ts.processing_on.name if ts is not None and ts.processing_on else None
    decision = decide_run(
        run.key,
        ts.state if ts is not None else None,
        recovering,
        run,
        ts.shape if ts is not None and ts.func else None,
        running_on,
    )
    _log_conflict(ws, decision)
    if decision.action == "stale":
        # Not this key's run: it holds its resources until it ends, then is dropped.
        stale = TaskState(run.key, b"", b"", run.shape, 0, 0, -1)
        _book(state, ws, run.run_id, stale)
        if not run.cancelled:
            state.send(ws.address, {"op": "cancel", "run_id": run.run_id})
        return
    if ts is None:  # adopt-unclaimed
        ts = _placeholder(state, run.key, run.shape)
    elif ts.state != "released":
        state._set_state(ts, "released", "a worker runs it since before a restart")
    if tuple(ts.shape) != tuple(run.shape):  # kept when only a restriction differs
        ts.shape = run.shape
    _book(state, ws, run.run_id, ts)
    ts.processing_on = ws
    ts.run_id = run.run_id
    ts.attempt = max(ts.attempt, run.attempt)
    state._set_state(ts, "processing", "running since before a restart")


def _adopt_held(
    state: AdoptionHost,
    ws: WorkerState,
    key: str,
    nbytes: int,
    recovering: bool,
    attempt: int | None,
) -> None:
    ts = state.tasks.get(key)
    known, current = (ts.state, ts.attempt) if ts is not None else (None, 0)
    decision = decide_held(key, known, recovering, attempt, current)
    _log_conflict(ws, decision)
    if decision.action == "drop":
        state.send(ws.address, {"op": "free-keys", "keys": [key]})
        return
    if ts is None:  # keep-unclaimed
        ts = _placeholder(state, key, ())
    ts.nbytes = max(ts.nbytes, nbytes)  # placement prefers the holder of more bytes
    if decision.action == "add-holder" and ts.state == "memory":
        ts.who_has = state._with(ts.who_has, ws)
        ws.has_what.add(ts)
        return
    # A run elsewhere is cancelled on the way.
    state._set_state(ts, "memory", "held by a worker since before a restart")
    ts.who_has = state._with(ts.who_has, ws)
    ws.has_what.add(ts)
    finished = state._finished_message(ts, None)
    for wanter in ts.who_wants:
        state.send(wanter, finished)
    for dependent in ts.dependents:
        if dependent.state == "waiting":
            dependent.n_waiting -= 1
            if dependent.n_waiting == 0:
                state._make_ready(dependent)
    for dep in ts.dependencies:
        state._release_if_unneeded(dep)


def _adopt_error(
    state: AdoptionHost, ws: WorkerState, error: ReportedError, recovering: bool
) -> None:
    """A run that failed while no scheduler listened: its error is kept, not run again
    (unless the task has retries left, counting this failure)."""
    ts = state.tasks.get(error.key)
    decision = decide_erred(error.key, ts.state if ts is not None else None, recovering)
    _log_conflict(ws, decision)
    if decision.action == "drop":
        return
    if ts is None:  # keep-unclaimed: failed when its lineage comes (see claim)
        ts = _placeholder(state, error.key, ())
        state._set_state(ts, "erred", "failed on a worker before a restart")
        ts.exception, ts.traceback = error.exception, error.traceback
        return
    if ts.retries > 0:
        ts.retries -= 1
        if ts.state != "released":
            state._set_state(ts, "released", "failed before a restart, to be retried")
        if ts not in state.recovery.deferred:
            state._ensure_computed(ts)
        return
    state._fail_with(ts, error.exception, error.traceback, "failed on a worker before a restart")


def _placeholder(state: AdoptionHost, key: str, shape: Shape) -> TaskState:
    """A key a worker reported before any client re-registered it: no lineage yet."""
    ts = TaskState(key, b"", b"", shape, 0, 0, next(state._seq), state._with(NOTHING, RECOVERING))
    state.tasks[key] = ts
    state.recovery.unclaimed[ts] = None
    return ts


def _book(state: AdoptionHost, ws: WorkerState, run_id: int, ts: TaskState) -> None:
    """Count a run already under way on ``ws`` (as ``_assign`` does, without sending)."""
    if not ws.processing:
        state.idle.pop(ws, None)
        ws.idle_since = None
    ws.processing[run_id] = ts
    used, free, total = ws.used, ws.free, ws.total
    for name, amount in ts.shape:
        used[name] = used.get(name, 0) + amount
        free[name] = total.get(name, 0) - used[name]
    hold_runs(state, ws)  # a deep queue of short runs, sent by the previous scheduler
    if len(ws.processing) >= ws.slots:
        state.with_slots.pop(ws, None)


# -------------------------------------------------------------- clients
def claim(state: AdoptionHost, client: str, ts: TaskState, spec: Message) -> None:
    """A client re-registers a key the scheduler knows: it brings the lineage of a key
    only a worker reported; a different task under a known key gives way."""
    ts.who_wants = state._without(ts.who_wants, RECOVERING)
    if not ts.func:
        ts.func, ts.args = spec["func"], spec["args"]
        shape = to_shape(spec.get("resources"))
        if spec.get("workers"):  # part of the demand (see restrictions.py)
            shape = restrict(shape, spec["workers"], bool(spec.get("allow_other_workers")))
        shape = state._shapes.setdefault(shape, shape)
        # A run keeps the resources it holds: its demand changes only by a restriction.
        if ts.state != "processing" or tuple(shape) == tuple(ts.shape):
            ts.shape = shape
        ts.priority = int(spec.get("priority") or 0)
        ts.retries = int(spec.get("retries") or 0)
        if ts.state == "erred" and ts.retries > 0:  # its failure during the outage
            ts.retries -= 1
            state._set_state(ts, "released", "failed before a restart, to be retried")
        deps = [state.tasks[d] for d in spec.get("deps") or () if d in state.tasks]
        ts.dependencies = deps
        for dep in deps:
            if not isinstance(dep.dependents, set):
                dep.dependents = set()
            dep.dependents.add(ts)
        state.recovery.unclaimed.pop(ts, None)
    elif ts.func != spec["func"] or ts.args != spec["args"]:
        logger.warning(
            "client %s re-registered %r as a different task than the one known; "
            "keeping the one registered first",
            client,
            ts.key,
        )


def drop_unclaimed(state: AdoptionHost, ts: TaskState) -> None:
    """A reported key lost its holder or run before any client brought its lineage:
    forget it (a client re-registering it later has it computed); fail it only if
    something still waits for it, as nothing can compute it."""
    ts.who_wants = state._without(ts.who_wants, RECOVERING)
    state.recovery.unclaimed.pop(ts, None)
    if ts.who_wants or ts.dependents:
        state._fail(
            ts,
            LookupError(
                f"the result of {ts.key!r} was lost in a scheduler restart and no client "
                "re-registered how to compute it: submit it again"
            ),
        )
    else:
        state._release_if_unneeded(ts)


def release_when_recovered(state: AdoptionHost, client: str, keys: list[str]) -> None:
    """A reconnecting client's keys wanted only as lineage: released once the tasks
    held back until the wait ends are on their way (their dependents need them)."""
    if state.recovery.active(state.clock()):
        state.recovery.releases.append((client, keys))
    else:
        state.handle_release(client, keys)


# --------------------------------------------------------------- timers
def recovery_deadline(state: AdoptionHost) -> float | None:
    """When the wait ends, while something waits for that (None otherwise)."""
    recovery = state.recovery
    if recovery.over or not (
        recovery.deferred or recovery.unclaimed or recovery.releases or state._notices
    ):
        return None
    return recovery.until


def end_recovery(state: AdoptionHost) -> None:
    """The wait is over: release what nobody claimed, compute what nobody brought."""
    recovery = state.recovery
    recovery.over = True
    unclaimed = [ts.key for ts in recovery.unclaimed if ts.key in state.tasks]
    recovery.unclaimed = {}
    if unclaimed:
        logger.info("releasing %d results and runs no client claimed", len(unclaimed))
    deferred, recovery.deferred = recovery.deferred, []
    for ts in deferred:
        if ts.state == "released" and state.tasks.get(ts.key) is ts:
            state._ensure_computed(ts)
    releases, recovery.releases = recovery.releases, []
    for client, keys in releases:
        state.handle_release(client, keys)
    state.handle_release(RECOVERING, unclaimed)


class Recovery:
    """Where a scheduler stands in its recovery wait (see the module docstring)."""

    __slots__ = ("deferred", "over", "releases", "unclaimed", "until")

    def __init__(self, until: float, over: bool) -> None:
        self.until = until
        self.over = over
        # Re-registered tasks held back until the wait ends.
        self.deferred: list[TaskState] = []
        # Keys only a worker reported, wanted by RECOVERING until a client claims them.
        self.unclaimed: dict[TaskState, None] = {}
        # (client, keys) it re-registered as lineage only, released when the wait ends.
        self.releases: list[tuple[str, list[str]]] = []

    def active(self, now: float) -> bool:
        """Whether the wait is on at ``now``."""
        return not self.over and now < self.until


def _log_conflict(ws: WorkerState, decision: Decision) -> None:
    if decision.conflict is not None:
        logger.warning("recovery: report of worker %s: %s", ws.name, decision.conflict)
