"""Placement groups (gangs): bundles of resources reserved on workers all at once, or not at all.

A group is a list of bundles (each a demand, such as ``{"GPU": 1}``) and a strategy saying
how they may share workers (``plan_bundles``, pure):

- ``strict_pack``: every bundle on one worker;
- ``pack``: as few workers as possible;
- ``spread``: as many workers as possible;
- ``strict_spread``: each bundle on a different worker (else the group waits).

Accounting. A placed bundle's demand is booked on its worker as a run's would be (``used``
up, ``free`` down): other tasks see those units taken. Tasks submitted into a bundle have a
``BundleShape``: a shape with no pairs of its own (so the worker's books never count them
twice) that names the bundle and the demand the task takes out of it. They start on the
bundle's worker when the bundle has room left (the demands of its runs there add up to at
most its own) and the worker a free slot.

Waiting groups. A group that cannot be placed on what is free now waits, pending, in the
order groups were made. The oldest pending group that could ever be placed *claims* the
workers it would need (the plan missing the fewest units): every unit of its demand that
comes free on them is booked for it, as a reservation holds units for a multi-unit task, so
a stream of small tasks cannot starve it. Only the oldest claims, so two groups never hold
halves of each other's workers (no deadlock); a younger group that fits what is free now is
placed at once (what the oldest claimed is not free). Once every claim is whole, the claimed
units become the bundles, in one step: until then the group holds no bundle.

Worker loss. The bundles of a lost worker are placed again; the group is pending meanwhile
(its other bundles stay where they are, with the tasks running in them); tasks that were
running on the lost worker are rerun in their bundle as it is placed again.

Removal. Tasks still queued in a removed group fail; a bundle is given back once the runs
in it are over (they are not interrupted).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from apportion.errors import NoValidWorkerError
from apportion.resources import TOLERANCE, Resources, Shape, fits, format_resources

if TYPE_CHECKING:
    from apportion.scheduler.model import TaskState, WorkerState


class GroupsHost(Protocol):
    """What placement groups ask of the scheduler's state (state.py), besides StateView's."""

    workers: dict[str, WorkerState]

    def send(self, dest: str, message: dict[str, Any]) -> None: ...

    def offer_slots(self, ws: WorkerState) -> None: ...

    def fail(self, ts: TaskState, exc: BaseException) -> None: ...

    def queue_aside(self, ts: TaskState, reason: str) -> None: ...

    def start_in_bundle(self, ts: TaskState, ws: WorkerState, demand: dict[str, float]) -> None: ...


STRATEGIES = ("pack", "spread", "strict_pack", "strict_spread")


# ------------------------------------------------------------------ the pure plan
def plan_bundles(
    bundles: Sequence[Resources],
    strategy: str,
    capacity: dict[Any, Resources],
    fixed: dict[int, Any] | None = None,
    missing: dict[Any, Resources] | None = None,
) -> list[Any] | None:
    """A worker for each bundle (in ``capacity``'s keys), or None if the strategy allows none.

    ``capacity``: what each worker offers to the group. ``fixed``: bundles placed already
    (index -> worker, their units not in ``capacity``). ``missing``: per worker, the units
    of ``capacity`` still in use (to be waited for); workers missing fewer are preferred.
    Greedy, largest bundles first: exact for bundles of one size (the usual gang).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; one of {list(STRATEGIES)}")
    fixed = dict(fixed or {})
    missing = missing or {}
    left = {worker: dict(offer) for worker, offer in capacity.items()}

    def shortfall(worker: Any) -> float:
        return sum(missing.get(worker, {}).values())

    # Preferred first: fewest units still to wait for, then the most on offer.
    order = sorted(left, key=lambda w: (shortfall(w), -sum(left[w].values())))
    todo = sorted(
        (i for i in range(len(bundles)) if i not in fixed), key=lambda i: -sum(bundles[i].values())
    )
    if strategy == "strict_pack":
        used = set(fixed.values())
        if len(used) > 1:
            return None
        total: Resources = {}
        for i in todo:
            for name, amount in bundles[i].items():
                total[name] = total.get(name, 0) + amount
        candidates = list(used) if used else order
        for worker in candidates:
            if worker in left and _covers(left[worker], total):
                return [fixed.get(i, worker) for i in range(len(bundles))]
        return None
    chosen = dict(fixed)
    for i in todo:
        demand = bundles[i]
        counts: dict[Any, int] = {}
        for worker in chosen.values():
            counts[worker] = counts.get(worker, 0) + 1
        fitting = [w for w in order if _covers(left[w], demand)]
        if strategy == "strict_spread":
            fitting = [w for w in fitting if w not in counts]
        elif strategy == "pack":
            fitting.sort(key=lambda w: -counts.get(w, 0))  # stable: preference kept within
        else:  # spread
            fitting.sort(key=lambda w: counts.get(w, 0))
        if not fitting:
            return None
        worker = fitting[0]
        chosen[i] = worker
        for name, amount in demand.items():
            left[worker][name] = left[worker].get(name, 0) - amount
    return [chosen[i] for i in range(len(bundles))]


def _covers(offer: Resources, demand: Resources) -> bool:
    return all(offer.get(name, 0) + TOLERANCE >= amount for name, amount in demand.items())


def explain_unplaceable(
    bundles: Sequence[Resources], strategy: str, workers: Iterable[WorkerState]
) -> str:
    """Why no set of the live workers could ever host the group (their totals)."""
    workers = list(workers)
    wanted = ", ".join(format_resources(b) for b in bundles)
    if not workers:
        return f"no workers are connected; the group ({wanted}) waits for workers that can host it"
    largest = max((format_resources(ws.total) for ws in workers), key=len)
    return (
        f"no set of the {len(workers)} connected workers can host the bundles [{wanted}] "
        f"with strategy {strategy!r} (a worker offers at most {largest}); the group waits "
        "for workers that can host it"
    )


# -------------------------------------------------------------------- records
class BundleShape(tuple[tuple[str, float], ...]):
    """The shape of a task in a bundle: no pairs of its own (the bundle's units are booked
    on its worker already), the bundle, and the demand the task takes out of it."""

    bundle: Bundle
    demand: Resources
    _hash: int

    def __new__(cls, bundle: Bundle, demand: Resources) -> BundleShape:
        self = super().__new__(cls, ())
        self.bundle = bundle
        self.demand = demand
        self._hash = hash((id(bundle), tuple(sorted(demand.items()))))
        return self

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is BundleShape
            and other.bundle is self.bundle
            and other.demand == self.demand
        )

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"<bundle {self.bundle.index} of {self.bundle.group.id}: {self.demand}>"


class Bundle:
    __slots__ = ("demand", "group", "index", "queue", "worker")

    def __init__(self, group: Group, index: int, demand: Resources) -> None:
        self.group = group
        self.index = index
        self.demand = demand
        self.worker: WorkerState | None = None
        # Its tasks waiting to start, in order (a dict as an ordered set; stale entries,
        # tasks no longer queued, are dropped as they are met).
        self.queue: dict[TaskState, None] = {}


class Group:
    __slots__ = (
        "bundles",
        "claims",
        "id",
        "owner",
        "removed",
        "state",
        "strategy",
        "turn",
        "waiters",
        "waiting_since",
        "was_ready",
    )

    def __init__(self, group_id: str, owner: str, bundles: list[Resources], strategy: str) -> None:
        self.id = group_id
        self.owner = owner
        self.strategy = strategy
        self.bundles = [Bundle(self, i, demand) for i, demand in enumerate(bundles)]
        self.state = "pending"  # or "ready"
        self.removed = False
        self.was_ready = False
        # While it is the oldest pending group: per claimed worker, the units it needs
        # there and the units booked for it so far.
        self.claims: dict[WorkerState, tuple[Resources, Resources]] = {}
        # Clients waiting for it to be ready: (client, request id).
        self.waiters: list[tuple[str, Any]] = []
        # Since when a client waits for it (pending), for scheduler.no-worker-timeout.
        self.waiting_since: float | None = None
        self.turn = 0  # the next bundle for a task that names none

    def demands(self) -> list[Resources]:
        return [bundle.demand for bundle in self.bundles]


class WorkerGang:
    """What groups hold on one worker (its ``gang``): bundles placed, units claimed."""

    __slots__ = ("bundles", "claimed")

    def __init__(self) -> None:
        self.bundles: list[Bundle] = []
        self.claimed: dict[Group, Resources] = {}

    def holding(self) -> Resources:
        held: Resources = {}
        for bundle in self.bundles:
            for name, amount in bundle.demand.items():
                held[name] = held.get(name, 0) + amount
        for claimed in self.claimed.values():
            for name, amount in claimed.items():
                held[name] = held.get(name, 0) + amount
        return held


def bundle_in_use(bundle: Bundle) -> Resources:
    """What the runs in ``bundle`` take of it now (cancelled runs until they are over)."""
    in_use: Resources = {}
    ws = bundle.worker
    if ws is None:
        return in_use
    for ts in ws.processing.values():
        shape = ts.shape
        if type(shape) is BundleShape and shape.bundle is bundle:
            for name, amount in shape.demand.items():
                in_use[name] = in_use.get(name, 0) + amount
    return in_use


# ----------------------------------------------------------- the state's part
class PlacementGroups:
    """The placement groups of one scheduler state (made when the first group is)."""

    def __init__(self, state: GroupsHost) -> None:
        self.state = state
        self.groups: dict[str, Group] = {}

    # ------------------------------------------------------------ client requests
    def create(self, client: str, group_id: str, bundles: list[Resources], strategy: str) -> None:
        if group_id in self.groups:
            raise ValueError(f"a placement group {group_id!r} exists already")
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; one of {list(STRATEGIES)}")
        if not bundles:
            raise ValueError("a placement group needs at least one bundle")
        self.groups[group_id] = Group(group_id, client, bundles, strategy)
        self.place()

    def wait_ready(
        self, client: str, group_id: str, reply_id: Any, wait: bool, now: float = 0.0
    ) -> None:
        """Answer when the group is ready; at once when ``wait`` is false (its state)."""
        group = self.groups.get(group_id)
        if group is None:
            self.state.send(
                client, {"op": "reply", "id": reply_id, "error": f"no placement group {group_id!r}"}
            )
        elif group.state == "ready" or not wait:
            self.state.send(client, self._status(group, reply_id))
        else:
            group.waiters.append((client, reply_id))
            if group.waiting_since is None:
                group.waiting_since = now

    def next_deadline(self, timeout: float) -> float | None:
        """When ``expire_waits`` may next fail a wait (``timeout``: the no-worker timeout)."""
        return min(
            (
                g.waiting_since + timeout
                for g in self.groups.values()
                if g.waiters and g.waiting_since is not None
            ),
            default=None,
        )

    def expire_waits(self, now: float, timeout: float) -> None:
        """Fail the ``ready()`` waits of groups that have waited ``timeout`` seconds and
        that no set of the connected workers could host (scheduler.no-worker-timeout): as a
        task waiting that long for a worker that could run it fails. The group stays."""
        for group in self.groups.values():
            since = group.waiting_since
            if not group.waiters or since is None or now - since < timeout:
                continue
            why = self._status(group, None).get("why")
            if why is None:
                continue  # it could be placed: it waits for resources to come free
            error = (
                f"placement group {group.id!r} waited {timeout:g}s (scheduler.no-worker-timeout) "
                f"and {why}"
            )
            for client, reply_id in group.waiters:
                self.state.send(
                    client,
                    {"op": "reply", "id": reply_id, "error": error, "kind": "NoValidWorkerError"},
                )
            group.waiters.clear()
            group.waiting_since = None

    def _status(self, group: Group, reply_id: Any) -> dict[str, Any]:
        reply: dict[str, Any] = {"op": "reply", "id": reply_id, "state": group.state}
        if group.state == "ready":
            reply["workers"] = [b.worker.address for b in group.bundles if b.worker is not None]
        else:
            workers = [ws for ws in self.state.workers.values() if ws.slots]
            totals = {ws: dict(ws.total) for ws in workers}
            if plan_bundles(group.demands(), group.strategy, totals) is None:
                reply["why"] = explain_unplaceable(group.demands(), group.strategy, workers)
        return reply

    def remove(self, group_id: str) -> None:
        group = self.groups.pop(group_id, None)
        if group is None:
            return
        group.removed = True
        self._drop_claims(group)
        for bundle in group.bundles:
            stranded = [ts for ts in bundle.queue if ts.state == "queued"]
            bundle.queue.clear()
            for ts in stranded:
                self.state.fail(
                    ts, ValueError(f"placement group {group.id!r} was removed before it ran")
                )
            self._give_back_if_done(bundle)
        for client, reply_id in group.waiters:
            self.state.send(
                client,
                {"op": "reply", "id": reply_id, "error": f"placement group {group.id!r} removed"},
            )
        group.waiters.clear()
        self.place()

    def client_left(self, client: str) -> None:
        for group in [g for g in self.groups.values() if g.owner == client]:
            self.remove(group.id)

    def bundle_shape(self, group_id: str, index: int | None, demand: Resources) -> BundleShape:
        """The shape of a task submitted into a bundle (ValueError when it cannot be);
        with no ``index``, the bundle fitting its demand with the fewest tasks."""
        group = self.groups.get(group_id)
        if group is None:
            raise ValueError(f"no placement group {group_id!r} (removed?)")
        if index is None:
            index = _next_fitting(group, demand or group.bundles[0].demand)
        if not 0 <= index < len(group.bundles):
            raise ValueError(
                f"bundle_index {index} out of range: group {group_id!r} has "
                f"{len(group.bundles)} bundles"
            )
        bundle = group.bundles[index]
        demand = demand or bundle.demand  # no demand of its own: the whole bundle
        if not _covers(bundle.demand, demand):
            raise ValueError(
                f"the demand {format_resources(demand)} does not fit bundle {index} of "
                f"group {group_id!r} ({format_resources(bundle.demand)})"
            )
        return BundleShape(bundle, dict(demand))

    # ----------------------------------------------------------- state events
    def task_ready(self, ts: TaskState) -> None:
        """``ts`` (of a bundle) is ready to run: queued in its bundle, started if room."""
        shape = ts.shape
        assert type(shape) is BundleShape
        bundle = shape.bundle
        if bundle.group.removed:
            self.state.fail(ts, ValueError(f"placement group {bundle.group.id!r} was removed"))
            return
        self.state.queue_aside(ts, "waits for room in its placement group's bundle")
        bundle.queue[ts] = None
        if bundle.worker is not None:
            self._start(bundle)

    def worker_freed(self, ws: WorkerState) -> None:
        """Units or a slot came free on ``ws``, which groups hold or claim units of."""
        gang = ws.gang
        assert gang is not None
        for bundle in list(gang.bundles):
            if bundle.group.removed:
                self._give_back_if_done(bundle)
            elif bundle.queue:
                self._start(bundle)
        if gang.claimed:
            self.place()
        self._forget_if_empty(ws)

    def worker_joined(self) -> None:
        self.place()

    def worker_lost(self, ws: WorkerState) -> None:
        gang = ws.gang
        if gang is None:
            return
        for group in list(gang.claimed):
            self._drop_claims(group)
        for bundle in gang.bundles:
            bundle.worker = None
            group = bundle.group
            if group.state == "ready":
                group.state = "pending"
        gang.bundles.clear()
        ws.gang = None
        self.place()

    # ------------------------------------------------------------------ placing
    def place(self) -> None:
        """Place every pending group that fits what is free now, oldest first; the
        oldest that does not claims what it needs (see the module's notes)."""
        claimer: Group | None = None
        for group in list(self.groups.values()):
            if group.state != "pending":
                continue
            workers = [ws for ws in self.state.workers.values() if ws.slots]
            fixed = {b.index: b.worker for b in group.bundles if b.worker is not None}
            free = {ws: self._offer(ws, group) for ws in workers}
            plan = plan_bundles(group.demands(), group.strategy, free, fixed)
            if plan is not None:
                self._drop_claims(group)
                self._book(group, plan)
                continue
            if claimer is not None:
                continue
            # Could it ever be placed (what other groups hold aside)? Then it claims.
            capacity = {ws: self._capacity(ws, group) for ws in workers}
            missing = {ws: _minus(capacity[ws], free[ws]) for ws in workers}
            target = plan_bundles(group.demands(), group.strategy, capacity, fixed, missing)
            if target is None:
                self._drop_claims(group)
                continue
            claimer = group
            self._claim(group, target, fixed)
        for group in self.groups.values():
            if group is not claimer and group.claims:
                self._drop_claims(group)

    def _offer(self, ws: WorkerState, group: Group) -> Resources:
        """What ``ws`` has free for ``group`` now (free, and what it claimed there)."""
        offer = {name: max(0.0, amount) for name, amount in ws.free.items()}
        if ws.gang is not None:
            for name, amount in ws.gang.claimed.get(group, {}).items():
                offer[name] = offer.get(name, 0) + amount
        return offer

    def _capacity(self, ws: WorkerState, group: Group) -> Resources:
        """What ``ws`` could ever offer ``group``: its totals less other groups' bundles."""
        capacity = dict(ws.total)
        if ws.gang is not None:
            for bundle in ws.gang.bundles:
                for name, amount in bundle.demand.items():
                    capacity[name] = capacity.get(name, 0) - amount
        return capacity

    def _claim(self, group: Group, target: list[Any], fixed: dict[int, Any]) -> None:
        needs: dict[WorkerState, Resources] = {}
        for i, ws in enumerate(target):
            if i in fixed:
                continue
            need = needs.setdefault(ws, {})
            for name, amount in group.bundles[i].demand.items():
                need[name] = need.get(name, 0) + amount
        for ws in [w for w in group.claims if w not in needs]:
            self._unclaim(group, ws)
        complete = True
        for ws, need in needs.items():
            gang = ws.gang
            if gang is None:
                gang = ws.gang = WorkerGang()
            claimed = gang.claimed.setdefault(group, {})
            group.claims[ws] = (need, claimed)
            for name, amount in need.items():
                want = amount - claimed.get(name, 0)
                take = min(max(0.0, ws.free.get(name, 0)), want)
                if take > 0:
                    claimed[name] = claimed.get(name, 0) + take
                    ws.used[name] += take
                    ws.free[name] -= take
                if want - take > TOLERANCE:
                    complete = False
        if complete:  # every claim whole: the claimed units become the bundles
            self._drop_claims(group)
            self._book(group, target)

    def _unclaim(self, group: Group, ws: WorkerState) -> None:
        group.claims.pop(ws, None)
        gang = ws.gang
        if gang is None:
            return
        claimed = gang.claimed.pop(group, None)
        if claimed:
            self._give(ws, claimed)
        self._forget_if_empty(ws)

    def _drop_claims(self, group: Group) -> None:
        for ws in list(group.claims):
            self._unclaim(group, ws)

    def _book(self, group: Group, plan: list[Any]) -> None:
        """Place the group's unplaced bundles as ``plan`` says (all of them at once)."""
        for bundle, ws in zip(group.bundles, plan, strict=True):
            if bundle.worker is not None:
                continue
            bundle.worker = ws
            if ws.gang is None:
                ws.gang = WorkerGang()
            ws.gang.bundles.append(bundle)
            for name, amount in bundle.demand.items():
                ws.used[name] += amount
                ws.free[name] -= amount
        group.state = "ready"
        group.was_ready = True
        for client, reply_id in group.waiters:
            self.state.send(client, self._status(group, reply_id))
        group.waiters.clear()
        group.waiting_since = None
        for bundle in group.bundles:
            self._start(bundle)

    def _give(self, ws: WorkerState, units: Resources) -> None:
        used, free, total, held = ws.used, ws.free, ws.total, ws.held
        for name, amount in units.items():
            left = used[name] - amount
            used[name] = left = 0 if -1e-9 < left < 1e-9 else left
            free[name] = total[name] - left - held.get(name, 0)

    def _give_back_if_done(self, bundle: Bundle) -> None:
        """A removed group's bundle goes back to its worker once no run is in it."""
        ws = bundle.worker
        if ws is None or bundle_in_use(bundle):
            return
        bundle.worker = None
        if ws.gang is not None and bundle in ws.gang.bundles:
            ws.gang.bundles.remove(bundle)
            if ws.address in self.state.workers:
                self._give(ws, bundle.demand)
                self.state.offer_slots(ws)
            self._forget_if_empty(ws)

    def _forget_if_empty(self, ws: WorkerState) -> None:
        gang = ws.gang
        if gang is not None and not gang.bundles and not gang.claimed:
            ws.gang = None

    def _start(self, bundle: Bundle) -> None:
        """Start the bundle's queued tasks while it has room and its worker a slot."""
        ws = bundle.worker
        if ws is None:  # (a placed bundle's group was ready once: no half gang runs)
            return
        queue = bundle.queue
        room = _minus(bundle.demand, bundle_in_use(bundle))
        while queue and len(ws.processing) < ws.slots:
            ts = next(iter(queue))
            if ts.state != "queued":
                del queue[ts]
                continue
            shape = ts.shape
            assert type(shape) is BundleShape
            if not fits(tuple(shape.demand.items()), room):
                return
            del queue[ts]
            self.state.start_in_bundle(ts, ws, shape.demand)
            room = _minus(room, shape.demand)

    # --------------------------------------------------------------- introspection
    def info(self) -> dict[str, Any]:
        return {
            group.id: {
                "state": group.state,
                "strategy": group.strategy,
                "bundles": [
                    {
                        "resources": dict(b.demand),
                        "worker": None if b.worker is None else b.worker.name,
                        "queued": sum(ts.state == "queued" for ts in b.queue),
                    }
                    for b in group.bundles
                ],
            }
            for group in self.groups.values()
        }

    def problems(self) -> list[str]:
        """What would be wrong with the groups' books (empty when all is well)."""
        problems = []
        live = set(self.state.workers.values())
        for group in self.groups.values():
            placed = [b for b in group.bundles if b.worker is not None]
            if group.state == "ready" and len(placed) != len(group.bundles):
                problems.append(f"group {group.id}: ready with bundles unplaced")
            if group.state == "pending" and not group.was_ready and placed:
                problems.append(f"group {group.id}: holds bundles before it was ever ready")
            for bundle in placed:
                ws = bundle.worker
                assert ws is not None
                if ws not in live or ws.gang is None or bundle not in ws.gang.bundles:
                    problems.append(f"group {group.id}: bundle {bundle.index} on a lost worker")
                in_use = bundle_in_use(bundle)
                if not _covers(bundle.demand, in_use):
                    problems.append(
                        f"group {group.id}: bundle {bundle.index} runs {in_use} > {bundle.demand}"
                    )
            if group.state == "ready":
                hosts = [b.worker for b in group.bundles]
                if group.strategy == "strict_pack" and len(set(hosts)) != 1:
                    problems.append(f"group {group.id}: strict_pack on {len(set(hosts))} workers")
                if group.strategy == "strict_spread" and len(set(hosts)) != len(hosts):
                    problems.append(f"group {group.id}: strict_spread shares a worker")
        return problems


def _next_fitting(group: Group, demand: Resources) -> int:
    """The next bundle of ``group`` (in turn) covering ``demand``: tasks given no bundle
    are spread over those that fit (the first bundle if none does: the caller says why)."""
    n = len(group.bundles)
    for step in range(n):
        index = (group.turn + step) % n
        if _covers(group.bundles[index].demand, demand):
            group.turn = index + 1
            return index
    return 0


def _minus(a: Resources, b: Resources) -> Resources:
    return {name: a.get(name, 0) - b.get(name, 0) for name in a}


def group_error(why: str) -> NoValidWorkerError:
    return NoValidWorkerError(why)


__all__ = [
    "STRATEGIES",
    "BundleShape",
    "PlacementGroups",
    "WorkerGang",
    "explain_unplaceable",
    "plan_bundles",
]


def holding(ws: WorkerState) -> Resources:
    """What groups hold on ``ws`` (its bundles and claims), for the accounting check."""
    return ws.gang.holding() if ws.gang is not None else {}


def is_bundle(shape: Shape) -> bool:
    return type(shape) is BundleShape
