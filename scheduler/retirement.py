"""Graceful scale-down: retiring workers without losing results (no I/O).

Functions over ``SchedulerState``, through ``RetirementHost`` (what they use of it). A
retiring worker gets no new work; its runs finish, and every result still needed whose only
copies are on retiring workers is copied to a worker staying in service (``acquire-data``).
The requester then gets a ``retire-reply``: ``retired`` (safe to stop) and ``kept`` (back in
service, with the reason), at the latest after ``scheduler.retire-timeout``.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from apportion.scheduler.model import Retirement, TaskState, WorkerState

logger = logging.getLogger("apportion.scheduler")

Message = dict[str, Any]


class RetirementHost(Protocol):
    """What retiring workers takes of ``SchedulerState``: its records, and four of its
    methods. The state holds the retirement records as its own attributes (its hot path
    reads them); only the functions of this module change them."""

    workers: dict[str, WorkerState]
    tasks: dict[str, TaskState]
    idle: dict[WorkerState, None]
    with_slots: dict[WorkerState, None]
    clock: Callable[[], float]
    retirements: list[Retirement]
    # Workers a retirement waits for -> their results being copied off right now.
    awaiting: dict[WorkerState, set[TaskState]]
    # Results being copied off retiring workers -> the worker receiving the copy.
    copying: dict[TaskState, WorkerState]

    @property
    def retire_timeout(self) -> float: ...

    def send(self, dest: str, message: Message) -> None: ...

    def _with(self, members: frozenset[Any], item: Hashable) -> frozenset[Any]: ...

    def _needed(self, ts: TaskState) -> bool: ...

    def _fill(self, ws: WorkerState) -> None: ...

    def refit(self, ws: WorkerState, why: str) -> None: ...


def start_retiring(
    state: RetirementHost, requester: str, reply_id: Any, names: list[str], count: int | None = None
) -> list[str]:
    """Start retiring up to ``count`` (default: all) of the named workers.

    Idle workers go first, then those running and holding the least. The chosen ones
    get no new work; their runs finish, and each result still needed that only retiring
    workers hold is copied to a worker staying in service. ``requester`` then gets a
    ``retire-reply`` with ``retired`` (names safe to stop) and ``kept`` (name -> why
    it stays in service), at the latest after ``scheduler.retire-timeout``.
    Returns the chosen names; raises ValueError, changing nothing, for unknown names.
    """
    by_name = {ws.name: ws for ws in state.workers.values()}
    unknown = sorted({n for n in names if n not in by_name})
    if unknown:
        raise ValueError(f"cannot retire {unknown}: no connected worker has these names")
    candidates = sorted(
        {by_name[n] for n in names},
        key=lambda ws: (
            ws.retiring is False,
            len(ws.processing),
            bytes_held(ws),
            ws.name,
        ),
    )
    chosen = candidates if count is None else candidates[: max(0, count)]
    for ws in chosen:
        ws.retiring = True
        ws.slots = 0
        state.with_slots.pop(ws, None)
        state.idle.pop(ws, None)
        state.awaiting.setdefault(ws, set())
    state.retirements.append(
        Retirement(requester, reply_id, chosen, state.clock() + state.retire_timeout)
    )
    if chosen:
        logger.info("retiring workers %s", [ws.name for ws in chosen])
    # Copy early, while runs still finish; settling waits for take_outbox.
    for ws in chosen:
        _copy_stranded(state, ws)
    return [ws.name for ws in chosen]


def data_acquired(state: RetirementHost, address: str, msg: Message) -> None:
    """A worker holds a copy of a result now, as asked by ``acquire-data``."""
    ws = state.workers.get(address)
    if ws is None:
        return
    ts = state.tasks.get(msg["key"])
    if ts is not None and state.copying.get(ts) is ws:
        forget_copy(state, ts)
    if ts is None or ts.state != "memory":
        # Released or lost meanwhile: the copy serves nothing.
        if ts is None or ts.processing_on is not ws:
            state.send(address, {"op": "free-keys", "keys": [msg["key"]]})
        return
    ts.who_has = state._with(ts.who_has, ws)
    ws.has_what.add(ts)
    if msg.get("replica"):
        return  # fetched as a task's input: its clients know a holder in service already
    # Clients fetch from the first holder they know of: tell them of the new one.
    update = {"op": "who-has", "key": ts.key, "who_has": in_service_first(ts.who_has)}
    for client in ts.who_wants:
        state.send(client, update)


def acquire_failed(state: RetirementHost, address: str, msg: Message) -> None:
    """A copy off retiring workers failed: those holders stay in service."""
    ws = state.workers.get(address)
    ts = state.tasks.get(msg["key"])
    if ws is None or ts is None or state.copying.get(ts) is not ws:
        return  # a copy no longer wanted
    forget_copy(state, ts)
    reason = f"copying result {ts.key!r} to {ws.name} failed: {msg.get('reason')}"
    for holder in ts.who_has:
        if holder in state.awaiting:
            _keep(state, holder, reason)


def _stranded(state: RetirementHost, ws: WorkerState) -> list[TaskState]:
    """Results on ``ws`` still needed whose every copy is on a retiring worker."""
    return [
        ts
        for ts in ws.has_what
        if ts.state == "memory"
        and state._needed(ts)
        and all(holder.retiring for holder in ts.who_has)
    ]


def _copy_stranded(state: RetirementHost, ws: WorkerState) -> None:
    """Copy what only retiring workers hold off ``ws``; keep ``ws`` if no one can take it."""
    stranded = _stranded(state, ws)
    todo = sorted((ts for ts in stranded if ts not in state.copying), key=lambda t: t.key)
    state.awaiting[ws].update(ts for ts in stranded if ts in state.copying)
    if not todo:
        return
    targets = [w for w in state.workers.values() if not w.retiring]
    if not targets:
        _keep(
            state,
            ws,
            f"holds {_plural(len(stranded), 'result')} still needed "
            "and no other worker can take them",
        )
        return
    # The least loaded target (fewest bytes held) takes each result in turn.
    heap = [(bytes_held(w), w.name, w) for w in targets]
    heapq.heapify(heap)
    for ts in todo:
        held, name, target = heapq.heappop(heap)
        state.copying[ts] = target
        for holder in ts.who_has:
            if holder in state.awaiting:
                state.awaiting[holder].add(ts)
        state.send(
            target.address,
            {"op": "acquire-data", "key": ts.key, "who_has": [h.address for h in ts.who_has]},
        )
        heapq.heappush(heap, (held + ts.nbytes, name, target))


def forget_copy(state: RetirementHost, ts: TaskState) -> None:
    """The copy of ``ts`` is over (done, failed, or no longer wanted)."""
    state.copying.pop(ts, None)
    for keys in state.awaiting.values():
        keys.discard(ts)


def advance_retirements(state: RetirementHost) -> None:
    """Settle each waiting worker that runs nothing and has no copy in flight."""
    for ws in [w for w, keys in state.awaiting.items() if not keys and not w.processing]:
        _copy_stranded(state, ws)  # what became stranded since (a holder left, a run ended)
        if ws in state.awaiting and not state.awaiting[ws]:
            _settle(state, ws, None)
            logger.info("worker %s retired: nothing on it is needed only there", ws.name)
    for retirement in [r for r in state.retirements if not r.waiting]:
        state.retirements.remove(retirement)
        state.send(
            retirement.requester,
            {
                "op": "retire-reply",
                "id": retirement.reply_id,
                "retired": retirement.retired,
                "kept": retirement.kept,
            },
        )


def _keep(state: RetirementHost, ws: WorkerState, reason: str) -> None:
    """Give up retiring ``ws``: it is back in service, and its requests say why."""
    _settle(state, ws, reason)
    ws.retiring = False
    ws.slots = 0 if ws.paused or ws.closing else ws.max_slots  # paused or closing: not yet
    if len(ws.processing) < ws.slots:
        state.with_slots[ws] = None
    if not ws.processing and ws.slots:
        state.idle[ws] = None
    logger.warning("worker %s stays in service: %s", ws.name, reason)
    state._fill(ws)


def _settle(state: RetirementHost, ws: WorkerState, kept_because: str | None) -> None:
    """Stop waiting for ``ws``: it is retired, or kept for the reason given."""
    state.awaiting.pop(ws, None)
    for retirement in state.retirements:
        if ws in retirement.waiting:
            del retirement.waiting[ws]
            if kept_because is None:
                retirement.retired.append(ws.name)
            else:
                retirement.kept[ws.name] = kept_because
    if kept_because is None and state.workers.get(ws.address) is ws:
        # Retired for good, though it may stay connected (not closed by the request): what
        # only it could run waits in no-worker, its clients told, instead of queued for a
        # slot that never opens. (While retiring it might still be kept: not before.)
        ws.retired = True
        state.refit(ws, f"its only fitting worker {ws.name} retired")


def retirement_lost(state: RetirementHost, ws: WorkerState, reason: str) -> None:
    """``ws`` left: copies it was receiving are redone elsewhere; a retirement of it ends."""
    for ts in [t for t, target in state.copying.items() if target is ws]:
        forget_copy(state, ts)  # its holders wait again, and copy anew in take_outbox
    if ws in state.awaiting:
        _settle(state, ws, f"left while retiring ({reason}); results not copied are recomputed")


def expire_retirements(state: RetirementHost, now: float) -> None:
    """Workers a retirement still waits for at its deadline stay in service."""
    for retirement in [r for r in state.retirements if r.deadline <= now]:
        within = f"{state.retire_timeout:g}s (scheduler.retire-timeout)"
        for ws in list(retirement.waiting):
            if ws.processing:
                why = f"still running {_plural(len(ws.processing), 'task')} after {within}"
            else:
                copies = _plural(len(state.awaiting[ws]), "result")
                why = f"could not copy {copies} still needed to another worker within {within}"
            _keep(state, ws, why)


def retirement_problems(state: RetirementHost) -> list[str]:
    problems = []
    for ws in state.workers.values():
        if ws.retiring and (ws.slots or ws in state.with_slots):
            problems.append(f"{ws.name}: retiring yet open for work")
        elif not (ws.retiring or ws.paused or ws.closing) and ws.slots != ws.max_slots:
            problems.append(f"{ws.name}: in service with {ws.slots} of {ws.max_slots} slots")
    waited = {ws for r in state.retirements for ws in r.waiting}
    if waited != set(state.awaiting):
        problems.append(f"retirements wait for {waited}, copies for {set(state.awaiting)}")
    for ws, keys in state.awaiting.items():
        if not ws.retiring or state.workers.get(ws.address) is not ws:
            problems.append(f"{ws.name}: awaited but not a connected retiring worker")
        for ts in keys:
            if ts not in state.copying or ts not in ws.has_what:
                problems.append(f"{ws.name} waits for a copy of {ts.key} not in flight")
    for ts, target in state.copying.items():
        if ts.state != "memory" or state.tasks.get(ts.key) is not ts:
            problems.append(f"copying {ts.key}, which is {ts.state}")
        if state.workers.get(target.address) is not target or target in ts.who_has:
            problems.append(f"copying {ts.key} to {target.name}, gone or holding it")
    return problems


def bytes_held(ws: WorkerState) -> int:
    return sum(ts.nbytes for ts in ws.has_what)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def in_service_first(holders: frozenset[WorkerState]) -> list[str]:
    """Holder addresses, those not retiring first (clients fetch from the first)."""
    return [ws.address for ws in sorted(holders, key=lambda ws: (ws.retiring, ws.address))]
