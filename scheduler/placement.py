"""Pure placement decisions: which worker gets a ready task, and why none can.

Rule: a task needing demand D may go to worker W only if ``total(W) >= D`` and
is assigned only when ``free(W) >= D`` and W has a free slot. Among those,
prefer the worker holding most bytes of the task's dependencies, else an idle
one (the scheduler offers the most recently idle first), else the least loaded one.
Data locality wins only where it saves more than it costs: a holder whose threads are
all busy (it would take the task into a prefetch slot, to wait there) is preferred to an
idle worker only for dependencies of ``LOCALITY_BYTES`` or more; smaller ones move.

Large inputs stay where they are (``locality_holder``): a task whose inputs on one worker
add up to ``scheduler.locality-bytes`` or more runs there. With no free slot there it
waits for one in that worker's own queue (``LocalQueues``), for at most as long as moving
those bytes would take (``bytes / scheduler.bandwidth``, Dask's transfer-cost estimate);
past that it may also go to any worker with nothing of its own to do. Without durations,
the wait is how the holder's occupancy is measured against the cost of the transfer.

Reservations: a task with resources that cannot start anywhere reserves one worker
(``pick_reservation``), so smaller demands cannot keep refilling the units it waits for.
Only demands that something smaller could starve reserve (``reserving_shapes``).

They are kept lazily, so that they cost little per placement. The reserved task's whole
demand is held from the start (``held``, taken out of ``free``, which goes below zero by
the units of it still in use): ``free`` then changes as on any worker when runs start and
end, and nothing is let go and held again. What the reservation allows is worked out only
when a task asks to start on the worker (``ReadyQueues.pop_for``): a task outranking the
holder may take held units (it fits what no run uses), the holder starts once none of its
units is in use, any other task must fit ``free``. A reservation passed on to a task of the
same demand keeps its held units as they are; a newly queued task that outranks no holder
(``ReadyQueues.outranks_no_holder``) looks only at unreserved workers.
"""

from __future__ import annotations

import bisect
import heapq
import math
import operator
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from apportion.scheduler.restrictions import (
    RestrictedShape,
    explain_restricted,
    is_restricted,
    suits,
)

from apportion.resources import TOLERANCE, Shape, fits, format_resources

if TYPE_CHECKING:
    from apportion.scheduler.model import TaskState, WorkerState


# Dependency bytes worth waiting for a busy holder rather than moving them to a worker
# that can start at once: below this, copying them (shared memory on one host, some
# milliseconds a megabyte over a network) costs less than the queue behind a running task.
# The default of scheduler.locality-bytes.
LOCALITY_BYTES = 16 * 2**20


def can_start(ws: WorkerState, shape: Shape) -> bool:
    return len(ws.processing) < ws.slots and fits(shape, ws.free)


def locality_holder(
    ts: TaskState, fitting: set[WorkerState], threshold: float
) -> tuple[WorkerState, int] | None:
    """The worker ``ts`` should run on because it holds ``threshold`` bytes or more of
    its inputs (the one holding most, among those that can take it: fitting its demand and
    taking work), with those bytes; None when no worker holds that much, or none that
    holds that much can take it."""
    total = 0
    for dep in ts.dependencies:
        total += dep.nbytes
    if total < threshold:  # the usual case, decided without counting per worker
        return None
    held: dict[WorkerState, int] = {}
    for dep in ts.dependencies:
        for holder in dep.who_has:
            held[holder] = held.get(holder, 0) + dep.nbytes
    best: WorkerState | None = None
    best_bytes = 0
    for holder, nbytes in held.items():
        if (
            nbytes >= threshold
            and holder.slots > 0  # paused for memory or retiring: it takes no work
            and holder in fitting
            and (
                best is None
                or nbytes > best_bytes
                or (nbytes == best_bytes and len(holder.processing) < len(best.processing))
            )
        ):
            best, best_bytes = holder, nbytes
    return None if best is None else (best, best_bytes)


def pick_worker(
    ts: TaskState,
    fitting: set[WorkerState],
    with_slots: Iterable[WorkerState],
    idle: Iterable[WorkerState] = (),
    floor: float = 0.0,
    locality_bytes: float = LOCALITY_BYTES,
) -> WorkerState | None:
    """Choose a worker that can start ``ts`` now, or None if every fitting worker is full.

    ``idle`` (optional) lists the workers of ``with_slots`` running nothing; they are tried
    first, in the order given. ``floor`` is a lower bound on the load of the others: the
    scan stops at the first worker reaching it, so a busy cluster is not scanned whole for
    every task. ``locality_bytes``: see the module's docstring.
    """
    if ts.dependencies:
        best: WorkerState | None = None
        best_bytes = -1
        scores: dict[WorkerState, int] = {}
        for dep in ts.dependencies:
            for holder in dep.who_has:
                scores[holder] = scores.get(holder, 0) + max(dep.nbytes, 1)
        for holder, held in scores.items():
            if held > best_bytes and holder in fitting and can_start(holder, ts.shape):
                best, best_bytes = holder, held
        if best is not None and (
            best_bytes >= locality_bytes
            or (len(best.processing) < best.nthreads and not best.nearly_full)
        ):
            return best
        # The holder would only queue it, or its memory is at its spilling level: a worker
        # that can start it now is better, and the holder stays in the running below (least
        # loaded) if there is none.
    # A worker whose memory is at its spilling level is chosen only when no other can start
    # the task: its results would go to disk (or it would soon pause).
    full: WorkerState | None = None
    for ws in idle:
        if ws in fitting and fits(ts.shape, ws.free):
            if not ws.nearly_full:
                return ws
            full = full or ws
    best = None
    best_load = float("inf")
    for ws in with_slots:
        if ws in fitting and fits(ts.shape, ws.free):
            if ws.nearly_full:
                full = full or ws
                continue
            load = len(ws.processing) / ws.nthreads
            if load < best_load:
                best, best_load = ws, load
                if load <= floor:
                    break
    return best or full


def outranks(ts: TaskState, other: TaskState) -> bool:
    """Whether ``ts`` comes before ``other``: higher priority, then earlier submission."""
    if ts.priority != other.priority:
        return ts.priority > other.priority
    return ts.seq < other.seq


def fairly_first(fair: Fairness, ts: TaskState, other: TaskState, strictly: bool = False) -> bool:
    """Whether ``ts`` comes before ``other`` with tenants: its tenant's rank is lower, or
    the same and it outranks ``other``; ``strictly``: of another tenant, only a lower rank
    (a reservation's holder keeps its units against tenants as far below their share)."""
    rank, other_rank = fair.rank(ts.shape), fair.rank(other.shape)
    if rank != other_rank:
        return rank < other_rank
    if strictly and fair.tenant(ts.shape) != fair.tenant(other.shape):
        return False
    return outranks(ts, other)


def fits_unused(shape: Shape, ws: WorkerState) -> bool:
    """Whether ``shape`` fits what no run on ``ws`` uses (its free units and those held)."""
    total, used = ws.total, ws.used
    for name, amount in shape:
        if total.get(name, 0) - used.get(name, 0) + TOLERANCE < amount:
            return False
    return True


def reserving_shapes(shapes: Iterable[Shape]) -> set[Shape]:
    """The demand shapes whose queued tasks reserve a worker.

    A demand for the smallest amount of one resource alone, among all ``shapes``, is left
    out: every unit of that resource that comes free fits it, so no smaller demand can
    keep taking its place (tasks take free units in priority order, then submission).
    Every other demand with resources could be starved without a reservation.
    """
    shapes = list(shapes)
    smallest: dict[str, float] = {}
    for shape in shapes:
        for name, amount in shape:
            if amount < smallest.get(name, math.inf):
                smallest[name] = amount
    return {
        shape
        for shape in shapes
        if shape and not (len(shape) == 1 and shape[0][1] <= smallest[shape[0][0]])
    }


def pick_reservation(ts: TaskState, fitting: Iterable[WorkerState]) -> WorkerState | None:
    """The worker to reserve for ``ts``, which fits no worker's free resources now.

    Durations are unknown, so "soonest" is estimated by what is missing: the worker with
    the fewest units of the demand still taken, then the fewest runs. A worker reserved for
    a task that ``ts`` outranks may be taken over; one reserved for a more urgent task, or
    taking no work (retiring), is never chosen.
    """
    best: WorkerState | None = None
    best_missing = 0.0
    best_runs = 0
    shape = ts.shape
    for ws in fitting:
        if ws.slots == 0:
            continue
        holder = ws.reserved_for
        if holder is not None and (  # not outranks(ts, holder), inlined: most workers are
            ts.priority < holder.priority  # reserved under load
            if ts.priority != holder.priority
            else ts.seq >= holder.seq
        ):
            continue
        # The units of its demand in use there (held ones, for a task being displaced,
        # would come free for ``ts``).
        missing = 0.0
        total, used = ws.total, ws.used
        for name, amount in shape:
            spare = total[name] - used[name]
            if spare < amount:
                missing += amount - spare
        if (
            best is None
            or missing < best_missing
            or (missing == best_missing and len(ws.processing) < best_runs)
        ):
            best, best_missing, best_runs = ws, missing, len(ws.processing)
    return best


def explain_no_worker(shape: Shape, workers: Iterable[WorkerState], waiting: bool = True) -> str:
    """Say why no live worker could ever run a demand, naming the largest offers (and,
    while ``waiting``, that the task waits for one), and the retired workers that would
    have run it."""
    workers = list(workers)
    retired = sorted(ws.name for ws in workers if ws.retired and suits(shape, ws))
    if retired:
        why = (
            f"the only workers that could run it ({', '.join(map(repr, retired))}) are "
            "retired: a worker retired with close_workers=False stays connected but takes "
            "no new work"
        )
        return f"{why}; the task waits until a worker that fits joins" if waiting else why
    return _explain_in_service(shape, [ws for ws in workers if not ws.retired], waiting)


def _explain_in_service(shape: Shape, workers: list[WorkerState], waiting: bool) -> str:
    if isinstance(shape, RestrictedShape) and not shape.loose:
        return explain_restricted(shape, workers, waiting)
    demand = format_resources(dict(shape))
    if not workers:
        if not waiting:
            return "no workers are connected"
        if not shape:
            return "no workers are connected; tasks wait until one joins"
        return f"no workers are connected; the demand {demand} waits for one that has it"
    parts = []
    for name, amount in shape:
        largest = max((ws.total.get(name, 0) for ws in workers), default=0)
        if largest < amount:
            offered = f"the most any worker has is {largest}" if largest else "no worker has any"
            parts.append(f"{name}={amount} needed, {offered}")
    why = f"no live worker has {demand} ({'; '.join(parts)})"
    return f"{why}; the task waits until a worker with these resources joins" if waiting else why


class _ShapeQueue:
    """Queued tasks of one demand shape: a FIFO lane per priority, in submission order.

    Nearly all tasks of a shape share one priority, so the usual push is an append and the
    usual pop a popleft of the most urgent lane (``top``): no comparisons, unlike a heap.
    A task that left the queue another way stays in its lane until it reaches the head
    (its state is no longer "queued" there); one queued again may sit in its lane twice,
    always at its own seq, so the first copy met is the one taken.
    """

    __slots__ = (
        "lanes",
        "order",
        "passed_index",
        "passed_lane",
        "passed_seq",
        "top",
        "top_priority",
    )

    def __init__(self, priority: int) -> None:
        self.top: deque[TaskState] = deque()
        self.top_priority = priority
        self.lanes: dict[int, deque[TaskState]] = {priority: self.top}
        self.order: list[int] = [-priority]  # heap of -priority: lanes, most urgent first
        # Where first_unreserved stopped: in lane ``passed_lane``, no entry up to seq
        # ``passed_seq`` is a candidate for a reservation (each holds one already, or left
        # the queue). Reset when that stops being true (see ReadyQueues.unreserved).
        self.passed_lane: deque[TaskState] | None = None
        self.passed_seq = 0
        # Where that was in the lane then: entries only leave its front (or the lane is
        # reset), so it is now at most there.
        self.passed_index = 0

    def lane(self, priority: int) -> deque[TaskState]:
        lane = self.lanes.get(priority)
        if lane is None:
            lane = self.lanes[priority] = deque()
            heapq.heappush(self.order, -priority)
            if priority > self.top_priority:
                self.top, self.top_priority = lane, priority
        return lane

    def head(self) -> TaskState | None:
        """The most urgent live task, dropping stale entries and emptied lanes on the way."""
        while True:
            lane = self.top
            while lane:
                if lane[0].state == "queued":
                    return lane[0]
                lane.popleft()
            del self.lanes[self.top_priority]
            heapq.heappop(self.order)
            if not self.order:
                return None
            self.top_priority = -self.order[0]
            self.top = self.lanes[self.top_priority]

    def first_unreserved(self) -> TaskState | None:
        """The most urgent live task holding no reservation (those that do are at the front,
        as reservations go in queue order, so few are passed over), or None if none is
        left. Stale entries at the head are dropped first: tasks started through their
        reservation leave the queue that way, and pop_for may not reach them soon."""
        if self.head() is None:
            return None
        # The reserved tasks at the front of the most urgent lane are passed over once, not
        # at every call: the scan resumes after the last entry it passed.
        top = self.top
        start = 0
        if self.passed_lane is top:
            # Usually a few entries left the front since: step back over them (cheap near
            # the front of a deque, unlike bisect's probes in its middle).
            passed_seq = self.passed_seq
            start = min(self.passed_index, len(top))
            steps = 0
            while start > 0 and top[start - 1].seq > passed_seq:
                start -= 1
                steps += 1
                if steps == 8:
                    start = bisect.bisect_right(top, passed_seq, key=_seq)
                    break
        passed = 0
        found: TaskState | None = None
        end = len(top)
        while start < end:
            ts = top[start]  # (not islice, which would walk the entries before start)
            if ts.state == "queued" and ts.reserved_on is None:
                found = ts
                break
            passed = ts.seq
            start += 1
        if passed:
            self.passed_lane, self.passed_seq = top, passed
        if self.passed_lane is top:
            self.passed_index = start
        if found is not None:
            return found
        for priority in sorted(self.lanes, reverse=True):
            if priority != self.top_priority:
                for ts in self.lanes[priority]:
                    if ts.state == "queued" and ts.reserved_on is None:
                        return ts
        return None

    def live(self) -> list[TaskState]:
        """Every live queued task once, most urgent first."""
        found: dict[TaskState, None] = {}
        for priority in sorted(self.lanes, reverse=True):
            found.update((ts, None) for ts in self.lanes[priority] if ts.state == "queued")
        return list(found)


class LocalQueues:
    """Tasks waiting for a slot on the worker holding their large inputs.

    Each worker's queue (``WorkerState.local``) is a heap by priority, then submission;
    beside them, one heap of the deadlines after which a waiting task may also go
    elsewhere. Entries are dropped lazily: one whose task is no longer queued, or was
    placed since (a newer attempt), is stale. A task queued here twice (it left the queue
    and came back) is taken once: the first entry met places it, so the other is stale.
    """

    __slots__ = ("deadlines", "order")

    def __init__(self) -> None:
        # (deadline, order, task, the attempt it waits for, worker)
        self.deadlines: list[tuple[float, int, TaskState, int, WorkerState]] = []
        self.order = 0  # ties between equal keys: never compare tasks or workers

    def push(self, ts: TaskState, ws: WorkerState, deadline: float) -> None:
        self.order += 1
        heapq.heappush(ws.local, (-ts.priority, ts.seq, self.order, ts, ts.attempt))
        heapq.heappush(self.deadlines, (deadline, self.order, ts, ts.attempt, ws))

    def head(self, ws: WorkerState) -> TaskState | None:
        """The most urgent task waiting on ``ws`` (stale entries dropped on the way)."""
        local = ws.local
        while local:
            _, _, _, ts, attempt = local[0]
            if ts.state == "queued" and ts.attempt == attempt:
                return ts
            heapq.heappop(local)
        return None

    def pop(self, ws: WorkerState) -> TaskState | None:
        """Remove and return the head of ``ws``'s queue (see ``head``)."""
        ts = self.head(ws)
        if ts is not None:
            heapq.heappop(ws.local)
        return ts

    def take_all(self, ws: WorkerState) -> list[TaskState]:
        """Empty ``ws``'s queue (it can take no more work): its live tasks, most urgent
        first."""
        found: dict[TaskState, None] = {}
        for _, _, _, ts, attempt in sorted(ws.local):
            if ts.state == "queued" and ts.attempt == attempt:
                found[ts] = None
        ws.local = []
        return list(found)

    def next_deadline(self) -> float | None:
        deadlines = self.deadlines
        while deadlines:
            _, _, ts, attempt, _ = deadlines[0]
            if ts.state == "queued" and ts.attempt == attempt:
                return deadlines[0][0]
            heapq.heappop(deadlines)
        return None

    def expired(self, now: float) -> list[TaskState]:
        """The tasks whose wait ended by ``now``: they may go to any worker from now on
        (they stay in their holder's queue too, whichever takes them first)."""
        found: list[TaskState] = []
        deadlines = self.deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, ts, attempt, _ = heapq.heappop(deadlines)
            if ts.state == "queued" and ts.attempt == attempt:
                found.append(ts)
        return found


class ReadyQueues:
    """Ready tasks bucketed by demand shape; each bucket ordered by (priority, submission)."""

    def __init__(self) -> None:
        self.by_shape: dict[Shape, _ShapeQueue] = {}
        # Bumped whenever a shape's queue comes or goes: each worker's menu (the queues of
        # the shapes it fits, see pop_for) is rebuilt when it was made for another version.
        self.version = 0
        # The shapes whose queued tasks reserve a worker (see reserving_shapes), kept by
        # the scheduler's state.
        self.reserving: set[Shape] = set()
        # Bounds on every reservation's holder so far: the newest submission and the
        # lowest priority (see outranks_no_holder).
        self.newest_holder = 0
        self.lowest_holder: float = math.inf
        # With tenants declared (tenants.py): queues are per tenant and shape, and the
        # tenant of lowest rank goes first; None (no tenants): priority, then submission.
        self.fair: Fairness | None = None
        # Tasks waiting for the worker holding their large inputs (see locality_holder).
        self.local = LocalQueues()

    def held_for(self, ts: TaskState) -> None:
        """``ts`` holds a reservation now."""
        if ts.seq > self.newest_holder:
            self.newest_holder = ts.seq
        if ts.priority < self.lowest_holder:
            self.lowest_holder = float(ts.priority)

    def outranks_no_holder(self, ts: TaskState) -> bool:
        """Whether ``ts`` surely outranks no task holding a reservation (it is newer than
        all of them, and no more urgent than any): true of most newly queued tasks."""
        return ts.seq > self.newest_holder and ts.priority <= self.lowest_holder

    def push(self, ts: TaskState) -> None:
        queue = self.by_shape.get(ts.shape)
        if queue is None:
            queue = self.by_shape[ts.shape] = _ShapeQueue(ts.priority)
            self.version += 1
        lane = queue.top if ts.priority == queue.top_priority else queue.lane(ts.priority)
        if lane and lane[-1].seq < ts.seq:
            lane.append(ts)
        elif not lane:
            lane.append(ts)
            queue.passed_lane = None  # any seq may come: first_unreserved starts over
        else:  # back in the queue after newer tasks (a lost worker's run): keep seq order
            bisect.insort(lane, ts, key=_seq)
            if ts.seq <= queue.passed_seq:
                queue.passed_lane = None  # a candidate among the entries first_unreserved passed

    def unreserved(self, ts: TaskState) -> None:
        """``ts``, still queued, lost its reservation: a candidate for one again."""
        queue = self.by_shape.get(ts.shape)
        if queue is not None:
            queue.passed_lane = None

    def next_to_reserve(self, ws: WorkerState) -> TaskState | None:
        """The most urgent queued task of a reserving shape, not yet reserved, that ``ws``
        fits."""
        best: TaskState | None = None
        fitting, by_shape = ws.fitting_shapes, self.by_shape
        emptied = False
        fair = self.fair
        for shape in self.reserving:
            queue = by_shape.get(shape)
            if queue is not None and shape in fitting:
                ts = queue.first_unreserved()
                if ts is not None and (
                    best is None
                    or (outranks(ts, best) if fair is None else fairly_first(fair, ts, best))
                ):
                    best = ts
                emptied = emptied or not queue.order
        if emptied:
            self._drop_empty()
        return best

    def backlog(self, shape: Shape) -> bool:
        """Whether tasks of ``shape`` wait in its most urgent lane (a stale entry, one that
        left the queue another way, may count until it is reached)."""
        queue = self.by_shape.get(shape)
        return queue is not None and bool(queue.top)

    def next_of(self, shape: Shape, count: int) -> list[TaskState]:
        """The most urgent live queued tasks of ``shape``, ``count`` at most, in the order
        they would start (those of its most urgent lane only), left queued."""
        queue = self.by_shape.get(shape)
        if queue is None:
            return []
        if queue.head() is None:  # head() emptied it: forgotten, as pop_for does
            self._drop_empty()
            return []
        found: list[TaskState] = []
        for ts in queue.top:  # head() made its first entry live
            if ts.state == "queued":
                found.append(ts)
                if len(found) == count:
                    break
        return found

    def counts(self) -> dict[Shape, int]:
        """Live queued tasks per shape (lanes also hold stale entries until they are reached)."""
        found = {shape: len(queue.live()) for shape, queue in self.by_shape.items()}
        return {shape: n for shape, n in found.items() if n}

    def drain(self, shape: Shape) -> list[TaskState]:
        """Remove and return every live queued task of one shape, in queue order."""
        queue = self.by_shape.pop(shape, None)
        if queue is None:
            return []
        self.version += 1
        return queue.live()

    def pop_for(self, ws: WorkerState) -> TaskState | None:
        """Remove and return the most urgent queued task ``ws`` can start now.

        On a reserved worker, a task outranking its holder may take the units held for it,
        and the holder starts once all its units are held (see ``_lend``); any other task
        must fit the free units.
        """
        free, fitting = ws.free, ws.fitting_shapes
        # The queues of the shapes ws could ever run, cached per version of the queues and
        # size of its fitting shapes (which only grow).
        if ws.menu_version != self.version or ws.menu_size != len(fitting):
            self._make_menu(ws)
        holder = ws.reserved_for
        if holder is not None:
            lent = self._lend(ws, holder)
            if lent is not None:
                return lent
            if ws.menu_version != self.version:  # _lend dropped emptied queues
                self._make_menu(ws)
        if self.fair is not None:
            return self._pop_fair(ws, self.fair)
        best: TaskState | None = None
        best_queue: _ShapeQueue | None = None
        emptied = False
        menu: list[tuple[Shape, _ShapeQueue]] = ws.menu  # typed: native calls when compiled
        for shape, queue in menu:
            if shape and not fits(shape, free):
                continue
            ts = queue.head()
            if ts is None:
                emptied = True
            elif best is None or (
                ts.priority > best.priority if ts.priority != best.priority else ts.seq < best.seq
            ):
                best, best_queue = ts, queue
        if emptied:
            self._drop_empty()
        if best is None or best_queue is None:
            return None
        best_queue.top.popleft()
        return best

    def _pop_fair(self, ws: WorkerState, fair: Fairness) -> TaskState | None:
        """pop_for with tenants: the head of the queue of lowest rank (its tenant's), then
        of highest priority, then submitted first, among the queues that fit ``ws``."""
        free = ws.free
        best: TaskState | None = None
        best_queue: _ShapeQueue | None = None
        best_rank = math.inf
        emptied = False
        for shape, queue in ws.menu:
            if shape and not fits(shape, free):
                continue
            ts = queue.head()
            if ts is None:
                emptied = True
                continue
            rank = fair.rank(shape)
            if (
                best is None
                or rank < best_rank
                or (
                    rank == best_rank
                    and (
                        ts.priority > best.priority
                        if ts.priority != best.priority
                        else ts.seq < best.seq
                    )
                )
            ):
                best, best_queue, best_rank = ts, queue, rank
        if emptied:
            self._drop_empty()
        if best_queue is not None:  # (set with best)
            best_queue.top.popleft()
        return best

    def _make_menu(self, ws: WorkerState) -> None:
        fitting = ws.fitting_shapes
        # Every worker fits the empty demand (also when not in its fitting shapes), but not
        # an empty demand restricted to some workers.
        ws.menu = [
            (s, q)
            for s, q in self.by_shape.items()
            if s in fitting or (not s and not is_restricted(s))
        ]
        ws.menu_version, ws.menu_size = self.version, len(fitting)

    def _lend(self, ws: WorkerState, holder: TaskState) -> TaskState | None:
        """On ``ws``, reserved for ``holder``: the most urgent task fitting what no run uses
        (held units included) if it outranks the holder (taken out of its queue), else the
        holder if all its units are held (left in its queue, where its entry is stale once
        it runs), else None: then only tasks fitting the free units may start.

        Held units are lent this way, when a task asks for them, rather than let go and
        held again at every change of the worker's runs: the scan is the one a worker
        without a reservation makes, with one more comparison.
        """
        total, used = ws.total, ws.used
        best: TaskState | None = None
        best_queue: _ShapeQueue | None = None
        emptied = False
        fair = self.fair
        menu: list[tuple[Shape, _ShapeQueue]] = ws.menu  # typed: native calls when compiled
        for shape, queue in menu:
            for name, amount in shape:  # fits_unused(shape, ws), inlined
                if total[name] - used[name] + TOLERANCE < amount:
                    break
            else:
                ts = queue.head()
                if ts is None:
                    emptied = True
                elif best is None or (
                    (
                        ts.priority > best.priority
                        if ts.priority != best.priority
                        else ts.seq < best.seq
                    )
                    if fair is None
                    else fairly_first(fair, ts, best)
                ):
                    best, best_queue = ts, queue
        if emptied:
            self._drop_empty()
        if best is None or best_queue is None:
            return None  # nothing fits even the held units
        if best is not holder and (  # outranks(best, holder), inlined
            (
                best.priority > holder.priority
                if best.priority != holder.priority
                else best.seq < holder.seq
            )
            if fair is None
            else fairly_first(fair, best, holder, strictly=True)
        ):
            best_queue.top.popleft()
            return best
        if best is holder or fits_unused(holder.shape, ws):
            return holder
        return None

    def _drop_empty(self) -> None:
        """Forget the queues found empty (their shape's head() returned None)."""
        empty = [shape for shape, queue in self.by_shape.items() if not queue.order]
        for shape in empty:
            del self.by_shape[shape]
        self.version += 1


class Fairness(Protocol):
    """Which tenant's queue goes first (tenants.py): the lower rank."""

    def rank(self, shape: Shape) -> float: ...

    def tenant(self, shape: Shape) -> str: ...


# The key of a lane's order (a C function: bisect calls it at every step).
_seq = operator.attrgetter("seq")
