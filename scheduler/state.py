"""The scheduler's state machine: stimuli in, messages out, no I/O.

Every ``handle_*`` method changes state and appends messages to ``outbox``
(destination -> messages); the network shell drains it after each batch.
Destinations are worker addresses and client ids.

Resource accounting: a worker's resources are acquired when a task is assigned
to it and released exactly once, when the worker reports that run over
(finished, erred, released after a cancel) or when the worker is removed.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator
from time import time as wall_clock
from typing import Any, Final

from apportion.scheduler.adjustments import Adjustments
from apportion.scheduler.adoption import (
    Recovery,
    adopt,
    claim,
    drop_unclaimed,
    end_recovery,
    recovery_deadline,
    release_when_recovered,
)
from apportion.scheduler.events import EventLog
from apportion.scheduler.model import (
    ACTIVE,
    NOTHING,
    TRANSITIONS,
    WAITING_TO_RUN,
    Retirement,
    TaskState,
    TaskStateName,
    WorkerState,
)
from apportion.scheduler.placement import (
    ReadyQueues,
    can_start,
    explain_no_worker,
    fits_unused,
    locality_holder,
    pick_reservation,
    pick_worker,
    reserving_shapes,
)
from apportion.scheduler.placement_groups import BundleShape, PlacementGroups, holding
from apportion.scheduler.prefetch import note_run
from apportion.scheduler.pushes import (
    AHEAD_LEAST_BYTES,
    AHEAD_TASKS,
    inputs_to_push,
    inputs_to_push_ahead,
    named_pusher,
    push_message,
)
from apportion.scheduler.recovery import WorkerReport
from apportion.scheduler.restrictions import (
    describe,
    placeable,
    preferred_worker,
    restrict,
)
from apportion.scheduler.retirement import (
    acquire_failed,
    advance_retirements,
    bytes_held,
    data_acquired,
    expire_retirements,
    forget_copy,
    in_service_first,
    retirement_lost,
    retirement_problems,
    start_retiring,
)
from apportion.scheduler.small_results import SmallResults
from apportion.scheduler.stored_arguments import take_stored
from apportion.scheduler.tenants import DEFAULT_TENANT, TenantShares, tenant_of

from apportion import config
from apportion.errors import InvalidTransitionError, KilledWorkerError, NoValidWorkerError
from apportion.resources import (
    EMPTY_SHAPE,
    TOLERANCE,
    Shape,
    fits,
    format_resources,
    to_shape,
)
from apportion.serialize import dumps_value

logger = logging.getLogger("apportion.scheduler")

Message = dict[str, Any]

# How many changes of state the story keeps at least, of all tasks together (at most
# twice as many: the oldest are dropped in bulk): bounded whatever the number of tasks,
# at 32 bytes per change.
STORY_LENGTH = 100_000
# A copy of a result fetched as a task's input is dropped once no task on its worker needs
# it only from this size on (see _drop_fetched): a smaller copy costs little memory, and
# dropping it costs messages and may cost a fetch again.
DROPPED_COPY_BYTES: Final = 2**20


def _any_large_input(tasks: list[TaskState]) -> bool:
    """Whether any of ``tasks`` takes an input large enough to push ahead (pushes.py)."""
    for ts in tasks:
        for dep in ts.dependencies:
            if dep.nbytes >= AHEAD_LEAST_BYTES:
                return True
    return False


# Pushes ahead (pushes.py) a worker's record keeps at most: entries of pushes that arrived
# are dropped as the worker reports them; this bounds those it never will (freed meanwhile).
AHEAD_FORGOTTEN: Final = 32
# Entries of the story log per change: key, from, to, reason (flat, so that recording a
# change allocates nothing); after each batch that changed some, None, the wall clock and
# two blanks (see take_outbox and story).
_STRIDE: Final = 4
# Held here, typed: the compiled build reads its own module's finals natively (another
# module's through a module attribute lookup), and a typed dict without a generic lookup.
_LEGAL: Final[dict[str, frozenset[str]]] = TRANSITIONS


class SchedulerState:
    """Retiring workers (retirement.py) and adopting what workers report after a restart
    (adoption.py) are functions over this state, through the protocols there that list
    what they use of it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.tasks: dict[str, TaskState] = {}
        self.workers: dict[str, WorkerState] = {}
        self.clients: set[str] = set()
        self.ready = ReadyQueues()
        # Workers able to take one more task, in arrival order (a dict used as ordered set).
        self.with_slots: dict[WorkerState, None] = {}
        # Every demand shape seen, with the workers whose totals cover it.
        self.fitting: dict[Shape, set[WorkerState]] = {}
        self.no_worker: dict[Shape, dict[TaskState, None]] = {}
        # Workers reserved for a queued task with resources (see _reserve), and that task.
        self.reserved: dict[WorkerState, TaskState] = {}
        # Shapes for which no worker could be reserved, with the priority of the task that
        # failed: a task of that shape and no higher priority (submitted later, so it
        # outranks no more holders) would fail too, so it skips the search. Cleared
        # whenever a worker may be free of reservations again.
        self._no_reservation: dict[Shape, int] = {}
        self.outbox: defaultdict[str, list[Message]] = defaultdict(list)
        self._notices: dict[tuple[str, Shape], list[str]] = {}
        # One counter for submission order (seq) and run ids: both only need to increase.
        # (One attribute fewer: see the note at the end of __init__.)
        self._seq: Iterator[int] = itertools.count(1)
        # One shared frozenset({x}) per worker or client: who_has and who_wants are
        # copy-on-write, and nearly always hold exactly one member.
        self._singletons: dict[Hashable, frozenset[Any]] = {}
        # Each singleton's member as messages name it ([client] or [worker address]), one
        # shared list each: messages only read it, and building it per message was 10% of
        # a placement. Keyed by the frozenset itself (frozensets keep their hash).
        self._named: dict[frozenset[Any], list[str]] = {}
        # Each distinct demand once (tasks share the tuple instead of holding copies).
        self._shapes: dict[Shape, Shape] = {}
        # Workers with free slots and nothing running (a subset of with_slots), and the most
        # threads any worker has had: other workers' loads are >= 1 / max_threads, which
        # lets pick_worker stop at the first such worker instead of scanning them all.
        # In the order they became idle: the last one is offered first, as its process is
        # the likeliest still awake and warm (one-at-a-time work stays on one worker).
        self.idle: dict[WorkerState, None] = {}
        self._max_threads = 1
        # The lowest priority ever submitted: a task above it may outrank runs that fill a
        # worker's slots (see _outranked_worker); when all share one, none can.
        self._least_priority = self._most_priority = 0
        self.settings = Settings()
        # Every change of state of all tasks, oldest first, _STRIDE entries each: key,
        # from, to, reason; or None, the wall clock, after each batch that changed some.
        # A list, not a deque with a maxlen: appending to a list is cheaper, and
        # take_outbox drops the oldest in bulk.
        self.story_log: list[Any] = []
        # Seceded runs and resources changed at runtime: None until either happens (see
        # adjustments.py), so that the hot path pays one check for them.
        self.adjusted: Adjustments | None = None
        # Retiring workers (see retirement.py).
        self.retirements: list[Retirement] = []
        # Workers a retirement waits for -> their results being copied off right now.
        self.awaiting: dict[WorkerState, set[TaskState]] = {}
        # Results being copied off retiring workers -> the worker receiving the copy.
        self.copying: dict[TaskState, WorkerState] = {}
        # The wait for workers and clients after a restart (see adoption.py).
        wait = float(config.get("scheduler.recovery-wait"))
        self.recovery = Recovery(clock() + wait, wait <= 0)
        # What happened, for the dashboard and /metrics: set only where someone can look.
        self.events: EventLog | None = None
        # Small results, sent inline with the tasks that take them (see small_results.py).
        self.small_results = SmallResults()
        # Keep this object at 29 attributes or fewer: from the 30th on, CPython 3.11 keeps
        # them in a plain dict, and every attribute read in placement gets slower (5% more
        # instructions placing the scheduler_only workload). Settings read off the hot
        # path go in ``settings``.

    @property
    def retire_timeout(self) -> float:
        """Seconds a retirement waits for copies at most (``scheduler.retire-timeout``)."""
        return self.settings.retire_timeout

    # ------------------------------------------------------------- set helpers
    def _with(self, members: frozenset[Any], item: Hashable) -> frozenset[Any]:
        if not members:
            one = self._singletons.get(item)
            if one is None:
                one = self._singletons[item] = frozenset((item,))
                self._named[one] = [_name(item)]
            return one
        return members if item in members else members | {item}

    def _without(self, members: frozenset[Any], item: Hashable) -> frozenset[Any]:
        if item not in members:
            return members
        return NOTHING if len(members) == 1 else members - {item}

    # ------------------------------------------------------------------ output
    def send(self, dest: str, message: Message) -> None:
        self.outbox[dest].append(message)

    def take_outbox(self) -> dict[str, list[Message]]:
        if self.settings.tenants is not None:
            for ts in self.settings.tenants.admit_waiting():  # runs ended: within quota again
                self._set_state(ts, "released", "within its tenant's quota again")
                self._make_ready(ts)
        if self.retirements:
            advance_retirements(self)
        if self._notices:
            self._send_notices()
        story_log = self.story_log
        if story_log and story_log[-_STRIDE] is not None:  # the changes of this batch: when
            story_log.extend((None, wall_clock(), "", ""))
            if len(story_log) > 2 * _STRIDE * STORY_LENGTH:
                del story_log[: len(story_log) - _STRIDE * STORY_LENGTH]
        out, self.outbox = self.outbox, defaultdict(list)
        return out

    def _send_notices(self) -> None:
        """Tell clients of their tasks no worker could run; not while recovering from a
        restart (the workers are still on their way back), and only of the tasks still
        waiting in no-worker when it is told."""
        if self.recovering():
            return  # kept until the wait ends (see recovery_deadline)
        for (client, shape), keys in self._notices.items():
            waiting = self.no_worker.get(shape, {})
            keys = [key for key in keys if self.tasks.get(key) in waiting]
            if not keys:
                continue
            self.send(
                client,
                {
                    "op": "no-worker",
                    "keys": keys,
                    "resources": dict(shape),
                    "why": explain_no_worker(shape, self.workers.values()),
                },
            )
        self._notices.clear()

    # ----------------------------------------------------------------- clients
    def add_client(self, client: str, tenant: str = DEFAULT_TENANT) -> None:
        """``client`` connected, with the token of ``tenant`` (see tenants.py)."""
        self.clients.add(client)
        if self.settings.tenants is not None:
            self.settings.tenants.client_joined(client, tenant)

    def use_tenants(self, tenants: TenantShares) -> None:
        """Share the cluster between ``tenants`` (tenants.py), before any client connects."""
        self.settings.tenants = tenants
        self.ready.fair = tenants
        tenants.workers_changed(self.workers.values())

    def remove_client(self, client: str) -> None:
        self.clients.discard(client)
        if self.settings.tenants is not None:
            self.settings.tenants.client_left(client)
        if self.groups is not None:
            self.groups.client_left(client)
        self._named.pop(self._singletons.pop(client, NOTHING), None)
        wanted = [ts for ts in self.tasks.values() if client in ts.who_wants]
        for ts in wanted:
            ts.who_wants = self._without(ts.who_wants, client)
        for ts in wanted:
            self._release_if_unneeded(ts)

    def handle_submit(self, client: str, specs: list[Message], recover: bool = False) -> None:
        """Register tasks ``client`` wants; ``recover``: re-registered after a restart."""
        new: list[TaskState] = []
        tasks = self.tasks
        shapes = self._shapes
        wants = self._with(NOTHING, client)
        seq = self._seq
        tenants = self.settings.tenants
        urgent = 0  # any priority in this batch
        for spec in specs:
            key = spec["key"]
            ts = tasks.get(key)
            if ts is not None:
                ts.who_wants = self._with(ts.who_wants, client)
                if recover or not ts.func:
                    claim(self, client, ts, spec)
                    if recover and ts.state == "released" and self.recovering():
                        self.recovery.deferred.append(ts)
                        continue
                self._report_existing(client, ts)
                continue
            resources = spec.get("resources")
            if resources:
                shape = to_shape(resources)
                shape = shapes.setdefault(shape, shape)
            else:
                shape = EMPTY_SHAPE
            workers = spec.get("workers")
            if workers:  # part of the demand (see restrictions.py)
                shape = restrict(shape, workers, bool(spec.get("allow_other_workers")))
                shape = shapes.setdefault(shape, shape)
            if tenants is not None and "placement_group" not in spec:
                shape = tenants.shape_for(client, shape)  # so is the tenant
                shape = shapes.setdefault(shape, shape)
            refused = None
            if "placement_group" in spec:  # a task in a bundle (placement_groups.py)
                shape, refused = self._bundle_shape(spec, shape)
            priority = spec.get("priority")
            if priority:
                priority = urgent = int(priority)
                if priority < self._least_priority:
                    self._least_priority = priority
                elif priority > self._most_priority:
                    self._most_priority = priority
            retries = spec.get("retries")
            ts = TaskState(
                key,
                spec["func"],
                spec["args"],
                shape,
                priority or 0,
                int(retries) if retries else 0,
                next(seq),
                wants,
            )
            tasks[key] = ts
            if "timeout" in spec:
                ts.timeout = spec["timeout"]
            if "stored" in spec and not recover and take_stored(self, ts, spec):
                continue  # held where its client put it: nothing to run
            if refused is not None:
                self._fail(ts, refused)
                continue
            deps = spec.get("deps")
            if not deps:
                new.append(ts)
                continue
            if key in deps:
                self._fail(
                    ts,
                    ValueError(f"task {key!r} depends on itself: it could never run"),
                )
                continue
            if len(set(deps)) != len(deps):
                deps = list(dict.fromkeys(deps))  # each dependency counts once
            missing = [dep for dep in deps if dep not in tasks]
            if missing:
                self._fail(
                    ts,
                    ValueError(
                        f"task {key!r} depends on {missing}, which the scheduler no longer knows: "
                        "keep the futures you pass as arguments alive until the task is submitted"
                    ),
                )
                continue
            ts.dependencies = [tasks[dep] for dep in deps]
            for dep in ts.dependencies:
                dependents = dep.dependents
                if not isinstance(dependents, set):  # NOTHING until the first dependent
                    dependents = dep.dependents = set()
                dependents.add(ts)
            new.append(ts)
        # Most urgent first, so priority holds within one batch as well as across batches
        # (already so when no task has a priority: seq follows the order of the batch).
        if urgent:
            new.sort(key=lambda t: (-t.priority, t.seq))
        if recover and self.recovering():
            self.recovery.deferred.extend(new)
            return
        for ts in new:
            if ts.dependencies:
                self._ensure_computed(ts)
            elif ts.state == "released":  # not made ready already, as another's dependency
                self._make_ready(ts)

    def _bundle_shape(self, spec: Message, demand: Shape) -> tuple[Shape, ValueError | None]:
        """The shape of a task submitted into a placement group's bundle, or why it cannot
        be (then the task fails)."""
        try:
            if self.groups is None:
                raise ValueError(f"no placement group {spec['placement_group']!r}")
            group, index = str(spec["placement_group"]), spec.get("bundle_index")
            return self.groups.bundle_shape(group, index, dict(demand)), None
        except ValueError as exc:
            return EMPTY_SHAPE, exc

    # Placement groups (placement_groups.py) ask these of the state.
    def queue_aside(self, ts: TaskState, reason: str) -> None:
        """``ts`` waits as queued, but outside the ready queues (in its bundle's queue)."""
        self._set_state(ts, "queued", reason)

    def start_in_bundle(self, ts: TaskState, ws: WorkerState, demand: dict[str, float]) -> None:
        """Start ``ts`` in its bundle on ``ws``: the bundle's units are booked already; the
        worker is told the demand, to hand the run its numbered units."""
        self._assign(ts, ws)
        self.outbox[ws.address][-1]["resources"] = dict(demand)

    @property
    def groups(self) -> PlacementGroups | None:
        """Placement groups (placement_groups.py): None until a client makes one. (Kept in
        ``settings``: see the note on this object's attributes at the end of __init__.)"""
        return self.settings.groups

    def placement_groups(self) -> PlacementGroups:
        groups = self.settings.groups
        if groups is None:
            groups = self.settings.groups = PlacementGroups(self)
        return groups

    def _report_existing(self, client: str, ts: TaskState) -> None:
        if ts.state == "memory":
            message = self._finished_message(ts, None)
            message["who_has"] = in_service_first(ts.who_has)
            self.send(client, message)
        elif ts.state == "erred":
            self.send(client, self._erred_message(ts))
        elif ts.state == "released":
            self._ensure_computed(ts)
        elif ts.state == "no-worker":
            self._notices.setdefault((client, ts.shape), []).append(ts.key)

    def handle_release(self, client: str, keys: list[str]) -> None:
        for key in keys:
            ts = self.tasks.get(key)
            if ts is not None:
                ts.who_wants = self._without(ts.who_wants, client)
                self._release_if_unneeded(ts)

    def handle_cancel(self, client: str, keys: list[str]) -> None:
        """Cancel tasks and everything still to run that depends on them, for every client."""
        stack = [self.tasks[k] for k in keys if k in self.tasks]
        seen: set[TaskState] = set()
        while stack:
            ts = stack.pop()
            if ts in seen or ts.state == "memory":
                continue
            seen.add(ts)
            for wanter in ts.who_wants:
                self.send(wanter, {"op": "task-cancelled", "key": ts.key})
            ts.who_wants = NOTHING
            stack.extend(d for d in ts.dependents if d.state in ACTIVE)
        for ts in seen:
            self._release_if_unneeded(ts)

    # ----------------------------------------------------------------- workers
    def add_worker(
        self,
        address: str,
        name: str,
        nthreads: int,
        resources: dict[str, float],
        memory_limit: int | None = None,
        info: dict[str, Any] | None = None,
        report: WorkerReport | None = None,
        adopted: Callable[[WorkerState, WorkerReport], None] | None = None,
    ) -> WorkerState:
        """A worker joins; ``report``: what it brings from before a scheduler restart
        (``adopted`` is told of it once its runs are booked, before any new work)."""
        ws = WorkerState(
            address, name, nthreads, resources, self.settings.prefetch, memory_limit, info
        )
        ws.last_seen = ws.idle_since = self.clock()
        self.workers[address] = ws
        self.idle[ws] = None
        self._max_threads = max(self._max_threads, ws.nthreads)
        self.with_slots[ws] = None
        self._no_reservation.clear()
        for shape, fitting in self.fitting.items():
            if placeable(shape, ws):
                fitting.add(ws)
                ws.fitting_shapes.add(shape)
        if report is not None:
            adopt(self, ws, report)  # its runs and results first, before any new work
            if adopted is not None:
                adopted(ws, report)
        for shape in [s for s in self.no_worker if s in ws.fitting_shapes]:
            for ts in self.no_worker.pop(shape):
                self._set_state(ts, "released", "a worker that fits it joined")
                self._make_ready(ts)
        if self.groups is not None:
            self.groups.worker_joined()
        if self.settings.tenants is not None:
            self.settings.tenants.workers_changed(self.workers.values())
        self._fill(ws)
        logger.info("worker %s joined from %s with %s", name, address, format_resources(ws.total))
        if self.events is not None:
            self.events.worker_joined(name, format_resources(ws.total))
        return ws

    def remove_worker(
        self, address: str, reason: str = "connection lost", expected: bool = False
    ) -> None:
        ws = self.workers.pop(address, None)
        if ws is None:
            return
        level = logging.INFO if expected else logging.WARNING
        logger.log(level, "worker %s (%s) removed: %s", ws.name, address, reason)
        if self.events is not None:
            self.events.worker_left(ws.name, reason)
        self.with_slots.pop(ws, None)
        self._named.pop(self._singletons.pop(ws, NOTHING), None)
        if self.adjusted is not None:
            self.adjusted.shrunk.discard(ws)
        displaced = ws.reserved_for
        if displaced is not None:
            self._unreserve(displaced)
        orphaned = []
        for shape in ws.fitting_shapes:
            self.fitting[shape].discard(ws)
            if not self.fitting[shape]:
                orphaned.extend(self.ready.drain(shape))
        # 1. Data that lived only there is lost.
        lost = []
        for ts in ws.has_what:
            ts.who_has = self._without(ts.who_has, ws)
            if ts.state != "memory":
                continue
            if not ts.who_has:
                lost.append(ts)
            elif ts.who_wants:
                # Clients fetch from the first holder they know of: name the survivors.
                update = {"op": "who-has", "key": ts.key, "who_has": in_service_first(ts.who_has)}
                for client in ts.who_wants:
                    self.send(client, update)
        ws.has_what.clear()
        for ts in lost:
            self._forget_data(ts)
        # 2. Tasks it was running go back to be placed elsewhere.
        rerun = []
        self.idle.pop(ws, None)
        for ts in ws.processing.values():
            if ts.processing_on is not ws:
                continue  # a run cancelled earlier; nothing to redo
            ts.suspicious += 1
            if ts.suspicious > self.settings.allowed_failures:
                self._fail(
                    ts,
                    KilledWorkerError(
                        f"task {ts.key!r} was running on {ts.suspicious} workers that died "
                        f"(last: {ws.name} at {address}, {reason}); it is probably what kills them"
                    ),
                )
            else:
                self._set_state(ts, "released", "its worker left")
                rerun.append(ts)
                # The worker may have told the clients waiting for it of its result itself
                # (before this scheduler heard): that result is gone with it.
                for client in ts.who_wants:
                    self.send(client, {"op": "task-lost", "key": ts.key})
        if self.settings.tenants is not None:
            for run_id in ws.processing:
                self.settings.tenants.ended(run_id)
            self.settings.tenants.workers_changed(self.workers.values())
        ws.processing.clear()
        if self.groups is not None:  # its bundles are placed again, its claims dropped
            self.groups.worker_lost(ws)
        # 3. Queued tasks no remaining worker could ever run now wait in no-worker; those
        # waiting for it (their inputs were there) go to any other.
        self._requeue_local(ws)
        for ts in orphaned:
            if ts.state == "queued":  # not sent back to waiting by a lost dependency above
                self._set_state(ts, "released", "the last worker that fits it left")
                self._make_ready(ts)
        # 4. Recompute what is still needed, from lineage.
        for ts in rerun + lost:
            if self._needed(ts):
                self._ensure_computed(ts)
            else:
                self._release_if_unneeded(ts)
        # 5. The task it was reserved for reserves another worker.
        # (unless it holds another already: a reservation that ended meanwhile passed to it)
        if displaced is not None and displaced.state == "queued" and displaced.reserved_on is None:
            self._reserve(displaced)
        # 6. Retirements and copies involving it go on without it.
        if self.copying or ws in self.awaiting:
            retirement_lost(self, ws, reason)
        # 7. It may be silent, not gone (frozen, or its host cut off): a worker or client
        # fetching from it would wait for ever. Its results count as lost from now on
        # (clients heard so above), so every fetch from it ends and goes to another holder
        # or waits for the result to be made again.
        if not expected:
            left = {"op": "worker-left", "address": address}
            for other in [*self.workers, *self.clients]:
                self.send(other, left)

    def handle_heartbeat(self, address: str, memory: dict[str, Any] | None = None) -> None:
        ws = self.workers.get(address)
        if ws is not None:
            ws.last_seen = self.clock()
            if memory is not None:
                ws.memory = memory
                ws.nearly_full = bool(memory.get("nearly_full"))

    def handle_worker_status(self, address: str, msg: Message) -> None:
        """The worker paused for memory (no new work goes there: its slots are 0) or
        resumed (its slots are back, and it is filled), or is closing (no new work, for good)."""
        ws = self.workers.get(address)
        if ws is None:
            return
        if msg.get("status") == "closing":
            # It ends itself soon (a run past its timeout): what is placed there meanwhile
            # would only be lost with it.
            logger.info("worker %s is closing: %s", ws.name, msg.get("reason", "no reason given"))
            ws.closing = True
            self._take_no_work(ws)
            self._requeue_local(ws)
            return
        paused = msg.get("status") == "paused"
        if ws.paused == paused:
            return
        ws.paused = paused
        measured = msg.get("memory")
        if measured:
            ws.memory = {**ws.memory, **measured}
            ws.nearly_full = bool(ws.memory.get("nearly_full"))
        logger.log(
            logging.WARNING if paused else logging.INFO,
            "worker %s %s",
            ws.name,
            "paused: its memory is above its pause threshold" if paused else "resumed",
        )
        if paused:
            self._take_no_work(ws)
            self._requeue_local(ws)
            # Clients hear of it once per pause: their work may slow down or wait.
            notice = {
                "op": "worker-paused",
                "worker": ws.name,
                "address": ws.address,
                "rss": ws.memory.get("rss"),
                "limit": ws.memory.get("limit", ws.memory_limit),
            }
            for client in self.clients:
                self.send(client, notice)
            return
        if ws.retiring or ws.closing:
            return
        ws.slots = ws.max_slots
        if len(ws.processing) < ws.slots:
            self.with_slots[ws] = None
        if not ws.processing:
            self.idle[ws] = None
        self.offer_slots(ws)

    def _take_no_work(self, ws: WorkerState) -> None:
        ws.slots = 0
        self.with_slots.pop(ws, None)
        self.idle.pop(ws, None)

    def handle_task_finished(self, address: str, msg: Message) -> None:
        ws = self.workers.get(address)
        ts = self._end_run(ws, msg["run_id"])
        if ws is None or ts is None:
            return
        if ts.processing_on is not ws or ts.run_id != msg["run_id"]:  # _current_run, inlined
            # A stale run (cancelled or reassigned): drop its result unless it is wanted here.
            if ts.state != "processing" or ts.processing_on is not ws:
                self._free_on(ws, ts)
            self._fill(ws)
            return
        self._set_state(ts, "memory", "finished")
        # How long it ran, when reported: the worker's depth follows (see prefetch.py).
        seconds = msg["stop"] - msg["start"] if "stop" in msg else None
        settings = self.settings
        note_run(self, ws, seconds, settings.prefetch, settings.prefetch_max)
        ts.nbytes = int(msg.get("nbytes", 0))
        ts.who_has = self._with(ts.who_has, ws)
        ws.has_what.add(ts)
        if self.events is not None:
            self.events.task_ended(ts.key, ws.name, "memory", msg)
        if "output" in msg:
            self._forward_output(ts, ws, msg["output"])
        data = msg.get("data")
        if data is not None:
            self.small_results.keep(ts, data)
        finished = self._finished_message(ts, data)
        told = msg.get("notified") or ()  # clients the worker told directly
        for wanter in ts.who_wants:
            if wanter not in told:
                self.send(wanter, finished)
        for dependent in ts.dependents:
            if dependent.state == "waiting":
                dependent.n_waiting -= 1
                if dependent.n_waiting == 0:
                    self._make_ready(dependent)
        for dep in ts.dependencies:
            self._release_if_unneeded(dep)
        if not ts.who_wants and not self._needed(ts):
            self._release_if_unneeded(ts)
        self._fill(ws)

    def handle_task_output(self, address: str, msg: Message) -> None:
        """What a run still going printed lately: for the clients waiting for it."""
        ws = self.workers.get(address)
        ts = ws.processing.get(msg["run_id"]) if ws is not None else None
        if ws is not None and ts is not None and ts.processing_on is ws:
            self._forward_output(ts, ws, msg["output"])

    def handle_task_erred(self, address: str, msg: Message) -> None:
        ws = self.workers.get(address)
        ts = self._end_run(ws, msg["run_id"])
        if ws is None or ts is None:
            return
        if _current_run(ts, ws, msg["run_id"]):
            if self.events is not None:
                self.events.task_ended(ts.key, ws.name, "erred", msg)
            if "output" in msg:
                self._forward_output(ts, ws, msg["output"])
            if ts.retries > 0:
                ts.retries -= 1
                self._set_state(ts, "released", "failed, to be retried")
                logger.info("task %s failed on %s; retrying (%d left)", ts.key, ws.name, ts.retries)
                self._ensure_computed(ts)
            else:
                self._fail_with(ts, msg["exception"], msg.get("traceback", ""), "its run failed")
        self._fill(ws)

    def handle_task_released(self, address: str, msg: Message) -> None:
        ws = self.workers.get(address)
        ts = self._end_run(ws, msg["run_id"])
        if ws is not None and ts is not None:
            if _current_run(ts, ws, msg["run_id"]):
                # The worker gave back a run we still wanted (it is shutting down): redo it.
                self._set_state(ts, "released", "its worker gave the run back")
                self._ensure_computed(ts)
            self._fill(ws)

    def handle_missing_deps(self, address: str, msg: Message) -> None:
        """A worker could not fetch some dependencies from the holders it was told of."""
        ws = self.workers.get(address)
        ts = self._end_run(ws, msg["run_id"])
        for dep_key, holders in msg.get("missing", {}).items():
            dep = self.tasks.get(dep_key)
            if dep is None:
                continue
            for holder_address in holders:
                holder = self.workers.get(holder_address)
                if holder is not None and holder in dep.who_has:
                    dep.who_has = self._without(dep.who_has, holder)
                    holder.has_what.discard(dep)
                    if holder in self.awaiting:
                        self.awaiting[holder].discard(dep)
                    self.send(holder.address, {"op": "free-keys", "keys": [dep.key]})
            if not dep.who_has and dep.state == "memory":
                self._forget_data(dep)
                if self._needed(dep):
                    self._ensure_computed(dep)
                else:
                    self._release_if_unneeded(dep)
        if ts is not None and _current_run(ts, ws, msg["run_id"]):
            self._set_state(ts, "released", "its worker could not fetch its inputs")
            self._ensure_computed(ts)
        if ws is not None:
            self._fill(ws)

    # ------------------------------------------------- retiring and recovering
    # (carried out by retirement.py and adoption.py)
    def retire_workers(
        self, requester: str, reply_id: Any, names: list[str], count: int | None = None
    ) -> list[str]:
        """Start retiring up to ``count`` (default: all) of the named workers; see
        ``retirement.start_retiring``."""
        chosen = start_retiring(self, requester, reply_id, names, count)
        for ws in list(self.workers.values()):
            if ws.local and ws.slots == 0:  # retiring: the tasks waiting there go elsewhere
                self._requeue_local(ws)
        return chosen

    def handle_data_acquired(self, address: str, msg: Message) -> None:
        """A worker holds a copy of a result now, as asked by ``acquire-data``, or
        fetched as an input of a task there (``replica``: dropped once no task there
        needs it, see _drop_fetched)."""
        data_acquired(self, address, msg)
        ws, ts = self.workers.get(address), self.tasks.get(msg["key"])
        if ws is not None and ws.pushing:
            ws.pushing.pop(msg["key"], None)  # a push ahead came (or the copy another way)
        if ws is not None and ts is not None:
            if msg.get("replica") and ws in ts.who_has and ts.nbytes >= DROPPED_COPY_BYTES:
                ws.fetched.add(ts)
            else:
                ws.fetched.discard(ts)  # asked for (or small): kept

    def handle_acquire_failed(self, address: str, msg: Message) -> None:
        """A copy off retiring workers failed: those holders stay in service."""
        acquire_failed(self, address, msg)

    def recovering(self) -> bool:
        """Whether the wait for workers and clients after a restart is on."""
        return self.recovery.active(self.clock())

    def release_after_recovery(self, client: str, keys: list[str]) -> None:
        """A reconnecting client's keys wanted only as lineage: released once the wait
        ends (see ``adoption.release_when_recovered``)."""
        release_when_recovered(self, client, keys)

    # ---------------------------------------------------- for the state's components
    # What the modules beside this one (secession.py, worker_resources.py, restart.py,
    # stored_arguments.py: see StateView in state_view.py) may ask of the state.
    def offer_slots(self, ws: WorkerState) -> None:
        """``ws`` may take more work now (a run gave its thread back): its reservation
        first, then queued tasks."""
        if ws.reserved_for is not None:
            self._serve(ws)
        self._fill(ws)

    def fail(self, ts: TaskState, exc: BaseException) -> None:
        """Fail ``ts`` (and what depends on it) with ``exc``, telling whoever wants them."""
        self._fail(ts, exc)

    def release_if_unneeded(self, ts: TaskState) -> None:
        """Release ``ts`` (and its dependencies) if nothing wants or needs it any more."""
        self._release_if_unneeded(ts)

    def redefine(self, ts: TaskState, func: bytes, args: bytes, shape: Shape, why: str) -> None:
        """``ts``, waiting in no-worker, becomes another task under the same key (``why``
        for its story), and is placed as that one."""
        self._set_state(ts, "released", why)  # out of no-worker, under the shape it waited with
        ts.func, ts.args = func, args
        ts.shape = self._shapes.setdefault(shape, shape)
        self._make_ready(ts)

    def hold_without_run(self, ts: TaskState, ws: WorkerState, nbytes: int, why: str) -> None:
        """``ts``, new, is held on ``ws`` from now on, ``nbytes`` pickled, made by no run
        (a value its client put there): its clients hear it finished."""
        ts.nbytes = nbytes
        ts.who_has = self._with(ts.who_has, ws)
        ws.has_what.add(ts)
        self._set_state(ts, "memory", why)
        finished = self._finished_message(ts, None)
        for wanter in ts.who_wants:
            self.send(wanter, finished)

    def refit(self, ws: WorkerState, why: str) -> None:
        """``ws``'s totals changed (``why``): which demands it fits is worked out again;
        queued tasks no worker could run any longer wait in no-worker, and those waiting
        there that it can run now are placed; its reservation is made again."""
        orphaned = []
        for shape, fitting in self.fitting.items():
            if placeable(shape, ws):
                fitting.add(ws)
                ws.fitting_shapes.add(shape)
            elif ws in fitting:
                fitting.discard(ws)
                ws.fitting_shapes.discard(shape)
                if not fitting:
                    orphaned.extend(self.ready.drain(shape))
        ws.menu_version = -1  # its menu of queues is made again (see ReadyQueues.pop_for)
        if self.settings.tenants is not None:
            self.settings.tenants.workers_changed(self.workers.values())
        self._no_reservation.clear()
        displaced = ws.reserved_for
        if displaced is not None:
            self._unreserve(displaced)
        for ts in orphaned:
            if ts.state == "queued":
                self._set_state(ts, "released", why)
                self._make_ready(ts)
        for shape in [s for s in self.no_worker if s in ws.fitting_shapes]:
            for ts in self.no_worker.pop(shape):
                self._set_state(ts, "released", why)
                self._make_ready(ts)
        if displaced is not None and displaced.state == "queued" and displaced.reserved_on is None:
            self._reserve(displaced)
        if ws.reserved_for is None:
            self._reserve_next(ws)
        self._fill(ws)

    # ---------------------------------------------------------------- timeouts
    def next_deadline(self) -> float | None:
        deadlines = [r.deadline for r in self.retirements]
        recovery = recovery_deadline(self)
        if recovery is not None:
            deadlines.append(recovery)
        local = self.ready.local.next_deadline()
        if local is not None:
            deadlines.append(local)
        if self.settings.no_worker_timeout is not None and self.no_worker:
            since = min(
                ts.no_worker_since or 0.0 for tasks in self.no_worker.values() for ts in tasks
            )
            deadlines.append(since + self.settings.no_worker_timeout)
        if self.settings.no_worker_timeout is not None and self.groups is not None:
            waits = self.groups.next_deadline(self.settings.no_worker_timeout)
            if waits is not None:
                deadlines.append(waits)
        return min(deadlines, default=None)

    def check_timeouts(self) -> None:
        now = self.clock()
        expire_retirements(self, now)
        recovery = recovery_deadline(self)
        if recovery is not None and now >= recovery:
            end_recovery(self)
        # Tasks that waited for their inputs' worker as long as moving them takes: any
        # worker with nothing of its own to do may take them now.
        expired = self.ready.local.expired(now)
        for ts in expired:
            self.ready.push(ts)
        if expired:
            for ws in list(self.with_slots):
                self._fill(ws)
        if self.settings.no_worker_timeout is None:
            return
        if self.groups is not None:  # waits for groups no workers could host
            self.groups.expire_waits(now, self.settings.no_worker_timeout)
        for shape in list(self.no_worker):
            expired = [
                ts
                for ts in self.no_worker[shape]
                if ts.no_worker_since is not None
                and now - ts.no_worker_since >= self.settings.no_worker_timeout
            ]
            for ts in expired:
                self._fail(
                    ts,
                    NoValidWorkerError(
                        f"task {ts.key!r} needs {format_resources(dict(shape))} but waited "
                        f"{self.settings.no_worker_timeout:g}s without any worker that could "
                        "run it: "
                        f"{explain_no_worker(shape, self.workers.values(), waiting=False)}. "
                        "Start a worker with "
                        "these resources, or lower the task's demand"
                    ),
                )

    # -------------------------------------------------------------- transitions
    def _needed(self, ts: TaskState) -> bool:
        if ts.who_wants:
            return True
        return any(d.state in ACTIVE for d in ts.dependents)

    def _ensure_computed(self, root: TaskState) -> None:
        """Bring a released task (and released dependencies) back on its way to memory."""
        stack = [root]
        while stack:
            ts = stack.pop()
            if ts.state != "released":
                continue
            if not ts.func:
                drop_unclaimed(self, ts)  # reported by a worker; no client knows its lineage
                continue
            if not ts.dependencies:
                self._make_ready(ts)
                continue
            missing = [d for d in ts.dependencies if d.state != "memory"]
            erred = next((d for d in missing if d.state == "erred"), None)
            if erred is not None:
                self._fail_with(
                    ts, erred.exception or b"", erred.traceback or "", "an input failed"
                )
                continue
            ts.n_waiting = len(missing)
            if missing:
                self._set_state(ts, "waiting", "waits for its inputs")
                stack.extend(d for d in missing if d.state == "released")
            else:
                self._make_ready(ts)

    def _make_ready(self, ts: TaskState) -> None:
        if type(ts.shape) is BundleShape and self.groups is not None:
            self.groups.task_ready(ts)  # runs in its bundle, on the bundle's worker
            return
        fitting = self.fitting.get(ts.shape)
        if fitting is None:
            fitting = self.fitting[ts.shape] = set()
            for worker in self.workers.values():
                if placeable(ts.shape, worker):
                    fitting.add(worker)
                    worker.fitting_shapes.add(ts.shape)
            self._update_reserving()
        if not fitting:
            self._set_state(ts, "no-worker", "no connected worker could ever run it")
            ts.no_worker_since = self.clock()
            self.no_worker.setdefault(ts.shape, {})[ts] = None
            for client in ts.who_wants:
                self._notices.setdefault((client, ts.shape), []).append(ts.key)
            return
        tenants = self.settings.tenants
        if tenants is not None and not tenants.admit(ts):
            self._over_quota(ts, tenants)
            return
        # Large inputs stay where they are: the task runs on their worker, or waits there.
        if ts.dependencies and not ts.shape and type(ts.shape) is tuple:
            if self._stay_near_inputs(ts, fitting):
                return
        # No worker has a free slot: nothing can start now (the common case under load).
        ws = None
        if self.with_slots:
            if type(ts.shape) is not tuple:  # preferring some workers (restrictions.py)
                ws = preferred_worker(ts, fitting)
            if ws is None:
                ws = pick_worker(
                    ts,
                    fitting,
                    self.with_slots,
                    reversed(self.idle),
                    1 / self._max_threads,
                    self.settings.locality_bytes,
                )
        if ws is None and ts.priority > self._least_priority:
            ws = self._outranked_worker(ts, fitting)
        if ws is None:
            self._set_state(ts, "queued", "no worker that fits it is free")
            self.ready.push(ts)
            if ts.shape and ts.shape in self.ready.reserving:
                self._reserve(ts)
        else:
            self._assign(ts, ws)

    def _over_quota(self, ts: TaskState, tenants: TenantShares) -> None:
        """``ts`` would take its tenant past its quota: it waits aside (tenants.py), or
        fails if its demand alone is more than the quota."""
        why = tenants.never_fits_quota(ts.shape)
        if why is not None:
            self._fail(ts, NoValidWorkerError(f"task {ts.key!r} can never run: {why}"))
        else:
            self._set_state(ts, "queued", "over its tenant's quota: waits for its runs to end")
            tenant = tenants.tenants[tenant_of(ts.shape)]
            for client in tenants.to_tell(ts):
                self.send(
                    client, {"op": "over-quota", "tenant": tenant.name, "quota": tenant.quota}
                )

    def _stay_near_inputs(self, ts: TaskState, fitting: set[WorkerState]) -> bool:
        """Start ``ts`` (no resources demanded) on the worker holding its large inputs, or
        queue it there until a slot comes free, for at most as long as moving the inputs
        would take (``scheduler.bandwidth``); False when its inputs are small, or no
        worker holding enough of them can take it."""
        settings = self.settings
        found = locality_holder(ts, fitting, settings.locality_bytes)
        if found is None:
            return False
        holder, nbytes = found
        if can_start(holder, ts.shape):
            self._assign(ts, holder)
            return True
        self._set_state(ts, "queued", f"waits for a slot on {holder.name}, holding its inputs")
        self.ready.local.push(ts, holder, self.clock() + nbytes / settings.bandwidth)
        return True

    def _requeue_local(self, ws: WorkerState) -> None:
        """``ws`` takes no more work (paused, retiring, gone): the tasks waiting for it
        there are placed again, as if just ready."""
        for ts in self.ready.local.take_all(ws):
            self._set_state(ts, "released", f"{ws.name}, holding its inputs, takes no work")
            self._make_ready(ts)

    def _fill_local(self, ws: WorkerState) -> None:
        """Start the tasks waiting on ``ws`` for its slots, unless a queued task of higher
        priority that ``ws`` could start is waiting too (then that one goes first)."""
        ready, local = self.ready, self.ready.local
        while len(ws.processing) < ws.slots:
            ts = local.head(ws)
            if ts is None:
                return
            other = ready.pop_for(ws) if ready.by_shape else None
            if other is not None:
                if other.priority > ts.priority:
                    self._assign(other, ws)
                    continue
                if other is not ws.reserved_for:  # the holder was not taken out of its queue
                    ready.push(other)  # back in its place
            local.pop(ws)
            self._assign(ts, ws)

    def _outranked_worker(self, ts: TaskState, fitting: set[WorkerState]) -> WorkerState | None:
        """A full worker whose runs waiting for a thread are less urgent than ``ts``.

        Its runs beyond its threads wait there in priority order; a more urgent task sent
        too starts before them, instead of waiting here until they have run. So slots are
        counted per priority: a worker takes ``ts`` while fewer than ``slots`` of its runs
        are at least as urgent (and at most twice its slots in all).
        """
        best: WorkerState | None = None
        best_ahead = 0
        for ws in fitting:
            if fits(ts.shape, ws.free):
                ahead = _runs_ahead(ts, ws)
                if ahead >= 0 and (best is None or ahead < best_ahead):
                    best, best_ahead = ws, ahead
        return best

    def _fill_urgent(self, ws: WorkerState) -> None:
        """Hand a full worker the queued tasks that outrank runs waiting there."""
        ready = self.ready
        while ready.by_shape:
            ts = ready.pop_for(ws)
            if ts is None:
                return
            if _runs_ahead(ts, ws) < 0:
                if ts is not ws.reserved_for:  # the holder was not taken out of its queue
                    ready.push(ts)  # back in its place (pop_for took the most urgent)
                return
            self._assign(ts, ws)

    def _assign(self, ts: TaskState, ws: WorkerState) -> None:
        run_id = next(self._seq)
        if not ws.processing:
            self.idle.pop(ws, None)
            ws.idle_since = None
        processing = ws.processing
        processing[run_id] = ts
        if self.settings.tenants is not None:
            self.settings.tenants.started(ts, run_id)
        shape = ts.shape
        if shape:
            # free stays total - used - held (also for a task lent held units, and for
            # the holder, whose held units go back to free as its reservation ends).
            used, free = ws.used, ws.free
            for name, amount in shape:
                used[name] += amount
                free[name] -= amount
        # The run is booked before the transition: a reservation ``ts`` gives up passes on
        # from there, and may start its next holder here at once.
        ts.processing_on = ws
        ts.run_id = run_id
        attempt = ts.attempt = ts.attempt + 1
        if attempt == 1:
            self._set_state(ts, "processing", "sent to a worker (attempt 1)")
        else:
            self._set_state(ts, "processing", f"sent to a worker (attempt {attempt})")
        if len(processing) >= ws.slots:
            self.with_slots.pop(ws, None)
        message: Message = {
            "op": "compute",
            "key": ts.key,
            "run_id": run_id,
            "func": ts.func,
            "args": ts.args,
        }
        if ts.who_wants and not ts.dependents and not self.ready.backlog(shape):
            # Clients the worker may tell of the result itself, a hop sooner. Not for a
            # result other tasks take (a client rarely waits on it), nor while more tasks
            # like it wait: the scheduler tells of many such results in one frame (a frame
            # per tick), where the worker would send one each.
            message["notify"] = self._names(ts.who_wants)
        # Left out when empty or zero (the worker's defaults): most tasks have none of them.
        if ts.dependencies:
            message["deps"] = deps = {d.key: self._names(d.who_has) for d in ts.dependencies}
            inline = self.small_results.for_task(ts.dependencies)
            if inline:
                message["inline"] = inline
            # Inputs on other workers: their holders send them as the task goes out.
            pushed = inputs_to_push(ts, ws, deps, inline, self.workers)
            if pushed:
                message["pushed"] = pushed
                ahead = ws.pushing
                now = self.clock() if ahead else 0.0
                for key in pushed:
                    holders = named_pusher(key, deps[key], ws, now) if ahead else None
                    if holders is not None:  # pushed ahead, on its way (pushes.py)
                        deps[key] = holders
                    else:
                        self.outbox[deps[key][0]].append(push_message(key, ws))
        if shape:
            message["resources"] = dict(shape)
            if ts.dependencies and not fits(shape, ws.free):
                self._push_ahead(ws, shape)  # the next of its demand wait for this one here
        if ts.priority:
            message["priority"] = ts.priority
        if attempt > 1:  # the worker's default is 1
            message["attempt"] = attempt
        if ts.timeout is not None:
            message["timeout"] = ts.timeout
        self.outbox[ws.address].append(message)  # self.send, inlined on the hot path

    def _push_ahead(self, ws: WorkerState, shape: Shape) -> None:
        """Push the large inputs of the next queued tasks of ``shape`` to ``ws``, whose
        units of it are all taken now, while they are (see pushes.py)."""
        after = self.ready.next_of(shape, AHEAD_TASKS)
        if not after or after == ws.next_up:
            return
        ws.next_up = after
        if not _any_large_input(after):
            return  # the usual case, decided in compiled code
        now = self.clock()
        ahead = inputs_to_push_ahead(after, ws, self.workers, now)
        if not ahead:
            return
        pushing = ws.pushing
        if len(pushing) > AHEAD_FORGOTTEN:
            pushing.clear()  # pushes long done or given up: a later task pushes again
        for key, pusher in ahead.items():
            pushing[key] = (pusher, now)
            self.outbox[pusher].append(push_message(key, ws))

    def _end_run(self, ws: WorkerState | None, run_id: int) -> TaskState | None:
        """Release the resources of a run the worker reports over (exactly once)."""
        if ws is None:
            return None
        ts = ws.processing.pop(run_id, None)
        if ts is None:
            return None
        if self.settings.tenants is not None:
            self.settings.tenants.ended(run_id)
        if not ws.processing:
            ws.idle_since = self.clock()
            if ws.slots > 0 and ws.address in self.workers:
                self.idle[ws] = None
        used, free, total = ws.used, ws.free, ws.total
        adjusted = self.adjusted
        if adjusted is not None and run_id in adjusted.unheld_runs:
            adjusted.unheld_runs.discard(run_id)  # gave its resources back when it seceded
        else:
            held = ws.held  # empty unless reserved
            for name, amount in ts.shape:
                left = used[name] - amount
                # Float sums of fractional demands drift; snap to the exact totals.
                used[name] = left = 0 if -1e-9 < left < 1e-9 else left
                free[name] = total[name] - left - held[name] if name in held else total[name] - left
        if ws.fetched:
            self._drop_fetched(ws)
        if ws.address in self.workers:
            if ws.gang is not None and self.groups is not None:
                self.groups.worker_freed(ws)  # placement groups first: their claims, bundles
            if adjusted is not None:
                if ws in adjusted.shrunk and all(
                    used[name] <= amount + 1e-9 for name, amount in total.items()
                ):
                    # Set below what its runs used, it is back within its totals: the
                    # accounting check holds for it again.
                    adjusted.shrunk.discard(ws)
                if adjusted.reacquire is not None:
                    adjusted.reacquire(ws)  # seceded runs asking for theirs back go first
            if ws.reserved_for is not None:
                # Its slots go first to the tasks outranking its holder, and to the holder
                # (see ReadyQueues.pop_for), before any task this run's end makes ready.
                processing, ready = ws.processing, self.ready
                while len(processing) < ws.slots:
                    next_ts = ready.pop_for(ws)
                    if next_ts is None:
                        break
                    self._assign(next_ts, ws)
            if len(ws.processing) < ws.slots:
                self.with_slots[ws] = None
        return ts

    def _drop_fetched(self, ws: WorkerState) -> None:
        """Drop the copies ``ws`` fetched as inputs that no task there needs any more
        (running, sent, or waiting there for a slot), where a worker in service holds
        another: a result is not held twice in memory for nothing. (Only copies of
        ``DROPPED_COPY_BYTES`` or more: smaller ones cost little memory, and may serve a
        later task there.)"""
        needed: set[TaskState] = set()
        for run in ws.processing.values():
            needed.update(run.dependencies)
        for entry in ws.local:
            needed.update(entry[3].dependencies)
        for nxt in ws.next_up:
            if nxt.state == "queued":  # its inputs were pushed here ahead of it
                needed.update(nxt.dependencies)
        dropped = []
        for ts in list(ws.fetched):
            if ts in needed:
                continue
            ws.fetched.discard(ts)
            if ts.state != "memory" or ws not in ts.who_has:
                continue  # released or lost meanwhile (freed there already)
            if not any(other is not ws and not other.retiring for other in ts.who_has):
                continue  # the copy that counts now
            ts.who_has = self._without(ts.who_has, ws)
            ws.has_what.discard(ts)
            dropped.append(ts.key)
        if dropped and ws.address in self.workers:
            self.send(ws.address, {"op": "free-keys", "keys": dropped})

    # ------------------------------------------------------------ reservations
    # A queued task with resources reserves one worker that could host it (the one
    # missing the fewest units, see pick_reservation). Its whole demand is held there
    # (``held``, taken out of ``free``): units free now, and units still in use, which
    # free then counts below zero. So no task it outranks takes a unit that is free there
    # or comes free (tasks without resources still use the worker's slots), and nothing
    # is done as units come and go: ``free`` is kept as for any worker. Once no unit of
    # its demand is missing (free >= 0) and a slot is free, it starts there. A worker has
    # at most one reservation; a task that outranks (priority, then submission) a worker's
    # holder takes it over. When the holder leaves the queue (started anywhere, cancelled,
    # released) the worker passes to the most urgent queued task it fits that holds none.
    #
    # A demand that nothing smaller can starve (the smallest of one resource alone, see
    # reserving_shapes) reserves nothing: it takes units as they come free, in queue order.
    # So that a newer reservation cannot hold such a task back, the held units are lent to
    # queued tasks that outrank the holder: worked out only when a task asks to start on
    # the worker (ReadyQueues.pop_for), not at every change of its runs.
    def _update_reserving(self) -> None:
        """Recompute the reserving shapes after a new one appeared; queued tasks of shapes
        that reserve from now on (a smaller demand of their resource came) reserve now."""
        before = self.ready.reserving
        self.ready.reserving = reserving_shapes(self.fitting)
        for shape in self.ready.reserving - before:
            queue = self.ready.by_shape.get(shape)
            for ts in queue.live() if queue is not None else ():
                if ts.state == "queued" and ts.reserved_on is None:
                    self._reserve(ts)

    def _reserve(self, ts: TaskState) -> None:
        """Reserve a worker for ``ts``, queued with resources, if one can be had."""
        failed_at = self._no_reservation.get(ts.shape)
        if failed_at is not None and ts.priority <= failed_at:
            return
        fitting: Iterable[WorkerState] = self.fitting[ts.shape]
        if self.ready.outranks_no_holder(ts):  # a reserved worker cannot be taken over
            fitting = self.fitting[ts.shape] - self.reserved.keys()
        ws = pick_reservation(ts, fitting)
        if ws is None:
            self._no_reservation[ts.shape] = ts.priority
            return
        displaced = ws.reserved_for
        if displaced is not None:
            self._unreserve(displaced)
        self._reserve_on(ts, ws)
        # ws may have started ts at once and passed back to the displaced task already.
        if displaced is not None and displaced.reserved_on is None:
            self._reserve(displaced)

    def _reserve_on(self, ts: TaskState, ws: WorkerState) -> None:
        """Reserve ``ws`` for ``ts``: hold its demand, and start it if it can start now."""
        ws.reserved_for = ts
        ts.reserved_on = ws
        self.reserved[ws] = ts
        self.ready.held_for(ts)
        held, free = ws.held, ws.free
        complete = True
        for name, amount in ts.shape:
            held[name] = amount
            left = free[name] = free[name] - amount
            if left < -TOLERANCE:
                complete = False
        if complete and len(ws.processing) < ws.slots:
            self._assign(ts, ws)

    def _unreserve(self, ts: TaskState) -> None:
        """Drop ``ts``'s reservation, giving the held units back to ``free``."""
        ws = ts.reserved_on
        assert ws is not None
        ts.reserved_on = None
        ws.reserved_for = None
        del self.reserved[ws]
        if ts.state == "queued":  # still waiting: a candidate for a reservation again
            self.ready.unreserved(ts)
        free, used, total = ws.free, ws.used, ws.total
        for name in ws.held:
            free[name] = total[name] - used[name]
        ws.held = {}
        if ws.gang is not None and self.groups is not None and ws.address in self.workers:
            self.groups.worker_freed(ws)  # units a placement group claims came free

    def _pass_on(self, ts: TaskState) -> None:
        """``ts`` left the queue: its worker passes to the next task waiting for one."""
        ws = ts.reserved_on
        assert ws is not None
        nxt = (
            self.ready.next_to_reserve(ws)
            if ws.slots and ws.address in self.workers  # (else it takes no new work)
            else None
        )
        if nxt is None or nxt.shape != ts.shape:
            self._unreserve(ts)
            if nxt is not None:
                self._reserve_on(nxt, ws)
            elif self._no_reservation:
                self._no_reservation.clear()  # a worker free of reservations again
            return
        # The same demand: the units held stay held, for the next task (the usual case).
        ts.reserved_on = None
        ws.reserved_for = nxt
        nxt.reserved_on = ws
        self.reserved[ws] = nxt
        self.ready.held_for(nxt)
        if len(ws.processing) < ws.slots and fits_unused(nxt.shape, ws):
            self._assign(nxt, ws)

    def _reserve_next(self, ws: WorkerState) -> None:
        """Pass a worker whose reservation ended to the next task waiting for one."""
        if ws.slots == 0 or ws.address not in self.workers:
            return
        ts = self.ready.next_to_reserve(ws)
        if ts is not None:
            self._reserve_on(ts, ws)
        elif self._no_reservation:
            self._no_reservation.clear()  # a worker free of reservations again

    def _serve(self, ws: WorkerState) -> None:
        """Start the task ``ws`` is reserved for if none of its units is missing and a slot
        is free (so it may start even if slots are all taken by tasks without resources
        when the units come free: it is first for the next slot)."""
        ts = ws.reserved_for
        assert ts is not None
        if len(ws.processing) < ws.slots and fits_unused(ts.shape, ws):
            self._assign(ts, ws)

    def _fill(self, ws: WorkerState) -> None:
        """Hand queued tasks to a worker while it has free slots and resources: those
        waiting for it (their inputs are here) first."""
        ready = self.ready
        if ws.local:
            self._fill_local(ws)
        while len(ws.processing) < ws.slots and ready.by_shape:
            ts = ready.pop_for(ws)
            if ts is None:
                return
            self._assign(ts, ws)
        if self._least_priority < self._most_priority and len(ws.processing) > ws.nthreads:
            self._fill_urgent(ws)

    def _set_state(self, ts: TaskState, new: TaskStateName, reason: str) -> None:
        """Every change of a task's state goes through here: it must be in TRANSITIONS
        (InvalidTransitionError otherwise), and goes into the task's story with ``reason``.
        What leaving a state takes is written once, below. (Entering one is up to the
        caller: the queue, the run.)"""
        old = ts.state
        # The changes nearly every task makes (legal ones) are accepted before looking in
        # the table: the compiled build compares interned strings in a few instructions,
        # where the lookup took 2% of a placement. A test tries every pair against it.
        if (
            not (
                (old == "released" and (new == "queued" or new == "processing"))
                or (old == "queued" and new == "processing")
                or (old == "processing" and new == "memory")
            )
            and new not in _LEGAL[old]
        ):
            raise InvalidTransitionError(ts.key, old, new)
        story_log = self.story_log
        story_log.append(ts.key)
        story_log.append(old)
        story_log.append(new)
        story_log.append(reason)
        if old == "processing":
            ws = ts.processing_on
            if ws is not None:
                if ts.run_id in ws.processing and ws.address in self.workers:
                    # Abandoned while it runs: the worker stops it. The run keeps its
                    # resources until the worker confirms it stopped (see _end_run).
                    self.send(ws.address, {"op": "cancel", "run_id": ts.run_id})
                ts.processing_on = None
                ts.run_id = None
        elif old == "no-worker":
            waiting = self.no_worker.get(ts.shape)
            if waiting is not None:
                waiting.pop(ts, None)
                if not waiting:
                    del self.no_worker[ts.shape]
            ts.no_worker_since = None
        elif old == "queued":
            # Its entry in the ready queues is dropped lazily; a reservation goes now.
            if ts.reserved_on is not None:
                ts.state = new
                self._pass_on(ts)
                return
        elif old == "memory" and self.small_results.kept:
            self.small_results.drop(ts)  # its bytes are no longer its result
        ts.state = new

    def _release_if_unneeded(self, ts: TaskState) -> None:
        stack = [ts]
        while stack:
            ts = stack.pop()
            if ts.key not in self.tasks:
                continue
            if ts.state == "released" and ts.dependents:
                # Nothing changes: its dependencies were visited when it was released (not
                # stopping here walked a whole chain's released past at every step).
                continue
            if self._needed(ts):
                continue
            if ts.state == "memory":
                if self.copying and ts in self.copying:
                    forget_copy(self, ts)
                holders = ts.who_has
                ts.who_has = NOTHING  # before _free_on, which skips holders still listed
                for holder in holders:
                    holder.has_what.discard(ts)
                    self._free_on(holder, ts)
            if ts.state != "released":
                self._set_state(ts, "released", "no longer wanted")
            if not ts.dependents:
                del self.tasks[ts.key]
                self._set_state(ts, "forgotten", "no longer wanted")
                for dep in ts.dependencies:
                    if ts in dep.dependents:
                        dep.dependents.discard(ts)  # type: ignore[union-attr]
                    stack.append(dep)
            else:
                stack.extend(ts.dependencies)

    def _forget_data(self, ts: TaskState) -> None:
        """Data of a task in memory vanished: dependents not yet started must wait again."""
        self._set_state(ts, "released", "its result was lost")
        if ts in self.copying:
            forget_copy(self, ts)
        for client in ts.who_wants:
            self.send(client, {"op": "task-lost", "key": ts.key})
        for dependent in ts.dependents:
            if dependent.state == "waiting":
                dependent.n_waiting += 1
            elif dependent.state in ("queued", "no-worker"):
                self._set_state(dependent, "waiting", "an input's result was lost")
                dependent.n_waiting = sum(d.state != "memory" for d in dependent.dependencies)

    def _free_on(self, ws: WorkerState, ts: TaskState) -> None:
        current = self.tasks.get(ts.key)
        if current is not None and (current.processing_on is ws or ws in current.who_has):
            return  # the same key is (again) wanted there
        if ws.address in self.workers:
            self.send(ws.address, {"op": "free-keys", "keys": [ts.key]})

    def _fail(self, ts: TaskState, exc: BaseException) -> None:
        self._fail_with(ts, dumps_value(exc), "", type(exc).__name__)

    def _fail_with(self, root: TaskState, exception: bytes, traceback: str, reason: str) -> None:
        """Mark a task erred (``reason``: why, for its story), and every dependent still to
        run, telling whoever wants them."""
        stack = [root]
        while stack:
            ts = stack.pop()
            if ts.state == "erred":
                continue
            self._set_state(ts, "erred", reason if ts is root else "an input failed")
            ts.exception = exception
            ts.traceback = traceback
            message = self._erred_message(ts)
            for wanter in ts.who_wants:
                self.send(wanter, message)
            # Not the runs under way: they were sent when this result was in memory and may
            # hold it already (a failed recomputation must not fail them); one that lacks it
            # reports missing-deps, and fails then.
            stack.extend(d for d in ts.dependents if d.state in WAITING_TO_RUN)
        for dep in root.dependencies:
            self._release_if_unneeded(dep)

    def _names(self, members: frozenset[Any]) -> list[str]:
        """Clients, or workers' addresses, as a message names them (do not change it)."""
        named = self._named.get(members)
        if named is not None:
            return named
        return [_name(member) for member in members]

    def _finished_message(self, ts: TaskState, data: bytes | None) -> Message:
        message: Message = {
            "op": "task-finished",
            "key": ts.key,
            "nbytes": ts.nbytes,
            "who_has": self._names(ts.who_has),
        }
        if data is not None:
            message["data"] = data
        return message

    def _forward_output(self, ts: TaskState, ws: WorkerState, output: Any) -> None:
        """What a run printed, for the clients waiting for it (before its result)."""
        message = {"op": "task-output", "key": ts.key, "worker": ws.name, "output": output}
        for wanter in ts.who_wants:
            self.send(wanter, message)

    @staticmethod
    def _erred_message(ts: TaskState) -> Message:
        return {
            "op": "task-erred",
            "key": ts.key,
            "exception": ts.exception,
            "traceback": ts.traceback,
        }

    # ------------------------------------------------------------ introspection
    def info(self) -> dict[str, Any]:
        now = self.clock()
        counts: dict[str, int] = {}
        for ts in self.tasks.values():
            counts[ts.state] = counts.get(ts.state, 0) + 1
        return {
            "workers": {
                ws.address: {
                    "name": ws.name,
                    "address": ws.address,
                    "nthreads": ws.nthreads,
                    "resources": dict(ws.total),
                    "used_resources": dict(ws.used),
                    "memory_limit": ws.memory_limit,
                    "processing": len(ws.processing),
                    "retiring": ws.retiring,
                    "retired": ws.retired,
                    "status": "closing" if ws.closing else "paused" if ws.paused else "running",
                    "memory": dict(ws.memory),
                    "in_memory": len(ws.has_what),
                    "nbytes": bytes_held(ws),
                    "idle_seconds": None if ws.idle_since is None else now - ws.idle_since,
                    **ws.info,
                }
                for ws in self.workers.values()
            },
            "tasks": counts,
            "clients": len(self.clients),
            "no_worker": [
                {
                    **describe(shape),
                    "tasks": len(tasks),
                    "why": explain_no_worker(shape, self.workers.values()),
                }
                for shape, tasks in self.no_worker.items()
            ],
            "queued": [{**describe(shape), "tasks": n} for shape, n in self.ready.counts().items()],
            "placement_groups": {} if self.groups is None else self.groups.info(),
            "tenants": {}
            if self.settings.tenants is None
            else self.settings.tenants.info(self.ready.counts()),
        }

    def story(self, key: str) -> list[dict[str, Any]]:
        """The changes of state of ``key`` still kept (see STORY_LENGTH), oldest first:
        ``{"time": wall clock, "from": state, "to": state, "reason": why}``; the time is
        that of the end of the batch of messages that made the change."""
        records: list[dict[str, Any]] = []
        undated: list[dict[str, Any]] = []
        log = self.story_log
        for i in range(0, len(log) - _STRIDE + 1, _STRIDE):
            task = log[i]
            if task is None:
                for record in undated:
                    record["time"] = log[i + 1]
                undated = []
            elif task == key:
                record = {"time": 0.0, "from": log[i + 1], "to": log[i + 2], "reason": log[i + 3]}
                records.append(record)
                undated.append(record)
        now = wall_clock()
        for record in undated:  # made in the batch under way
            record["time"] = now
        return records

    def check_invariants(self) -> list[str]:
        """Problems with resource accounting (empty when all is well); used by the tests."""
        problems = []
        unheld = self.adjusted.unheld_runs if self.adjusted is not None else set()
        shrunk = self.adjusted.shrunk if self.adjusted is not None else set()
        for ws in self.workers.values():
            expected: dict[str, float] = dict.fromkeys(ws.total, 0)
            for run_id, ts in ws.processing.items():
                if run_id in unheld:
                    continue
                for name, amount in ts.shape:
                    expected[name] = expected.get(name, 0) + amount
            for name, amount in holding(ws).items():  # placement groups' bundles and claims
                expected[name] = expected.get(name, 0) + amount
            for name, total in ws.total.items():
                used = ws.used.get(name, 0)
                if used > total + 1e-9 and ws not in shrunk:
                    problems.append(f"{ws.name}: {name} used {used} > total {total}")
                if abs(used - expected.get(name, 0)) > 1e-9:
                    problems.append(
                        f"{ws.name}: {name} used {used} != sum of running demands "
                        f"{expected.get(name, 0)}"
                    )
                held = ws.held.get(name, 0)
                if abs(ws.free[name] - (total - used - held)) > 1e-9:
                    problems.append(
                        f"{ws.name}: {name} free {ws.free[name]} != total - used - held"
                    )
            problems.extend(_reservation_problems(ws, self))
            if (ws.paused or ws.closing) and (ws.slots or ws in self.with_slots):
                problems.append(f"{ws.name}: paused or closing, yet given work ({ws.slots} slots)")
            if len(ws.processing) > 2 * ws.max_slots and not ws.retiring:
                problems.append(f"{ws.name}: {len(ws.processing)} runs > 2 x {ws.slots} slots")
            priorities = {run.priority for run in ws.processing.values()}
            if len(ws.processing) > ws.max_slots and len(priorities) < 2:
                problems.append(
                    f"{ws.name}: {len(ws.processing)} runs of one priority > {ws.slots} slots"
                )
        reserved = {ts.key for ts in self.tasks.values() if ts.reserved_on is not None}
        if reserved != {ts.key for ts in self.reserved.values()}:
            problems.append(f"tasks reserved {sorted(reserved)} != the workers' reservations")
        idle = {ws for ws in self.with_slots if not ws.processing}
        if idle != set(self.idle):
            problems.append(
                f"idle workers {sorted(map(repr, self.idle))} != {sorted(map(repr, idle))}"
            )
        for ts in self.tasks.values():
            if ts.state == "processing" and (
                ts.processing_on is None or ts.run_id not in ts.processing_on.processing
            ):
                problems.append(f"task {ts.key} processing without a run")
            if ts.state == "memory" and not ts.who_has:
                problems.append(f"task {ts.key} in memory nowhere")
        if self.groups is not None:
            problems.extend(self.groups.problems())
        if self.settings.tenants is not None:
            problems.extend(self.settings.tenants.problems(self.workers.values()))
        problems.extend(self.small_results.problems())
        return problems + retirement_problems(self)


class Settings:
    """The scheduler's settings read off the hot path (from the configuration)."""

    __slots__ = (
        "allowed_failures",
        "bandwidth",
        "groups",
        "locality_bytes",
        "no_worker_timeout",
        "prefetch",
        "prefetch_max",
        "retire_timeout",
        "tenants",
    )

    def __init__(self) -> None:
        self.groups: PlacementGroups | None = None  # (not a setting: see SchedulerState.groups)
        # Tenants sharing the cluster (tenants.py; see SchedulerState.use_tenants): None
        # when none is declared, so that the hot path pays one check for them.
        self.tenants: TenantShares | None = None
        self.prefetch = int(config.get("scheduler.worker-prefetch"))
        self.prefetch_max = int(config.get("scheduler.worker-prefetch-max"))
        self.locality_bytes = float(config.get("scheduler.locality-bytes"))
        self.bandwidth = float(config.get("scheduler.bandwidth"))
        if self.locality_bytes < 0:
            raise ValueError(
                f"scheduler.locality-bytes must be 0 or more, got {self.locality_bytes}"
            )
        if self.bandwidth <= 0:
            raise ValueError(f"scheduler.bandwidth must be more than 0, got {self.bandwidth}")
        self.allowed_failures = int(config.get("scheduler.allowed-failures"))
        self.retire_timeout = float(config.get("scheduler.retire-timeout"))
        timeout = config.get("scheduler.no-worker-timeout")
        self.no_worker_timeout: float | None = None if timeout is None else float(timeout)


def _reservation_problems(ws: WorkerState, state: SchedulerState) -> list[str]:
    """A worker's reservation: held exactly for a queued task reserved on it, its whole
    demand (no more), and ``free`` below zero only by units of that demand still in use."""
    ts = ws.reserved_for
    if ts is None:
        problems = [f"{ws.name}: holds {ws.held} with no reservation"] if ws.held else []
        negative = {name: amount for name, amount in ws.free.items() if amount < -1e-9}
        if negative and (state.adjusted is None or ws not in state.adjusted.shrunk):
            problems.append(f"{ws.name}: free {negative} below zero with no reservation")
        return problems
    problems = []
    if ts.reserved_on is not ws or state.reserved.get(ws) is not ts:
        problems.append(f"{ws.name}: reservation for {ts.key} not recorded both ways")
    if ts.state != "queued":
        problems.append(f"{ws.name}: reserved for {ts.key}, which is {ts.state}")
    demand = dict(ts.shape)
    if ws.held != demand:
        problems.append(f"{ws.name}: holds {ws.held} for {ts.key}, whose demand is {demand}")
    return problems


def _current_run(ts: TaskState, ws: WorkerState | None, run_id: int) -> bool:
    """Whether a worker's report is about the run ``ts`` waits for (not a stale one: one
    cancelled, or from before a reassignment)."""
    return ts.processing_on is ws and ts.run_id == run_id


def _runs_ahead(ts: TaskState, ws: WorkerState) -> int:
    """How many runs on ``ws`` are at least as urgent as ``ts``, when ``ts`` may join them
    beyond the worker's slots (some of its runs wait for a thread, fewer than ``slots`` of
    them are as urgent, and it holds less than twice its slots in all); else -1."""
    processing = ws.processing
    if len(processing) <= ws.nthreads or len(processing) >= 2 * ws.slots:
        return -1
    priority = ts.priority
    ahead = 0
    for run in processing.values():
        if run.priority >= priority:
            ahead += 1
    return ahead if ahead < ws.slots else -1


def _name(member: Any) -> str:
    """A client (its id) or a worker (its address) as messages name it."""
    return member.address if isinstance(member, WorkerState) else str(member)
