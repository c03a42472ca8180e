"""Graceful scale-down: retiring workers without losing results (no I/O).

A mix-in of ``SchedulerState``. A retiring worker gets no new work; its runs finish, and
every result still needed whose only copies are on retiring workers is copied to a
worker staying in service (``acquire-data``). The requester then gets a ``retire-reply``:
``retired`` (safe to stop) and ``kept`` (back in service, with the reason), at the latest
after ``scheduler.retire-timeout``.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Hashable
from typing import Any

from apportion.scheduler.model import Retirement, TaskState, WorkerState

logger = logging.getLogger("apportion.scheduler")

Message = dict[str, Any]


class RetirementMixin:
    # Provided by SchedulerState (declared here so that the compiled build knows them).
    workers: dict[str, WorkerState]
    tasks: dict[str, TaskState]
    idle: dict[WorkerState, None]
    with_slots: dict[WorkerState, None]
    clock: Callable[[], float]

    def send(self, dest: str, message: Message) -> None:
        raise NotImplementedError

    def _with(self, members: frozenset[Any], item: Hashable) -> frozenset[Any]:
        raise NotImplementedError

    def _needed(self, ts: TaskState) -> bool:
        raise NotImplementedError

    def _fill(self, ws: WorkerState) -> None:
        raise NotImplementedError

    def _init_retirements(self, retire_timeout: float) -> None:
        self.retire_timeout = retire_timeout
        self.retirements: list[Retirement] = []
        # Workers a retirement waits for -> their results being copied off right now.
        self.awaiting: dict[WorkerState, set[TaskState]] = {}
        # Results being copied off retiring workers -> the worker receiving the copy.
        self.copying: dict[TaskState, WorkerState] = {}

    def retire_workers(
        self, requester: str, reply_id: Any, names: list[str], count: int | None = None
    ) -> list[str]:
        """Start retiring up to ``count`` (default: all) of the named workers.

        Idle workers go first, then those running and holding the least. The chosen ones
        get no new work; their runs finish, and each result still needed that only retiring
        workers hold is copied to a worker staying in service. ``requester`` then gets a
        ``retire-reply`` with ``retired`` (names safe to stop) and ``kept`` (name -> why
        it stays in service), at the latest after ``scheduler.retire-timeout``.
        Returns the chosen names; raises ValueError, changing nothing, for unknown names.
        """
        by_name = {ws.name: ws for ws in self.workers.values()}
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
            self.with_slots.pop(ws, None)
            self.idle.pop(ws, None)
            self.awaiting.setdefault(ws, set())
        self.retirements.append(
            Retirement(requester, reply_id, chosen, self.clock() + self.retire_timeout)
        )
        if chosen:
            logger.info("retiring workers %s", [ws.name for ws in chosen])
        # Copy early, while runs still finish; settling waits for take_outbox.
        for ws in chosen:
            self._copy_stranded(ws)
        return [ws.name for ws in chosen]

    def handle_data_acquired(self, address: str, msg: Message) -> None:
        """A worker holds a copy of a result now, as asked by ``acquire-data``."""
        ws = self.workers.get(address)
        if ws is None:
            return
        ts = self.tasks.get(msg["key"])
        if ts is not None and self.copying.get(ts) is ws:
            self._forget_copy(ts)
        if ts is None or ts.state != "memory":
            # Released or lost meanwhile: the copy serves nothing.
            if ts is None or ts.processing_on is not ws:
                self.send(address, {"op": "free-keys", "keys": [msg["key"]]})
            return
        ts.who_has = self._with(ts.who_has, ws)
        ws.has_what.add(ts)
        if msg.get("replica"):
            return  # fetched as a task's input: its clients know a holder in service already
        # Clients fetch from the first holder they know of: tell them of the new one.
        update = {"op": "who-has", "key": ts.key, "who_has": in_service_first(ts.who_has)}
        for client in ts.who_wants:
            self.send(client, update)

    def handle_acquire_failed(self, address: str, msg: Message) -> None:
        """A copy off retiring workers failed: those holders stay in service."""
        ws = self.workers.get(address)
        ts = self.tasks.get(msg["key"])
        if ws is None or ts is None or self.copying.get(ts) is not ws:
            return  # a copy no longer wanted
        self._forget_copy(ts)
        reason = f"copying result {ts.key!r} to {ws.name} failed: {msg.get('reason')}"
        for holder in ts.who_has:
            if holder in self.awaiting:
                self._keep(holder, reason)

    def _stranded(self, ws: WorkerState) -> list[TaskState]:
        """Results on ``ws`` still needed whose every copy is on a retiring worker."""
        return [
            ts
            for ts in ws.has_what
            if ts.state == "memory"
            and self._needed(ts)
            and all(holder.retiring for holder in ts.who_has)
        ]

    def _copy_stranded(self, ws: WorkerState) -> None:
        """Copy what only retiring workers hold off ``ws``; keep ``ws`` if no one can take it."""
        stranded = self._stranded(ws)
        todo = sorted((ts for ts in stranded if ts not in self.copying), key=lambda t: t.key)
        self.awaiting[ws].update(ts for ts in stranded if ts in self.copying)
        if not todo:
            return
        targets = [w for w in self.workers.values() if not w.retiring]
        if not targets:
            self._keep(
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
            self.copying[ts] = target
            for holder in ts.who_has:
                if holder in self.awaiting:
                    self.awaiting[holder].add(ts)
            self.send(
                target.address,
                {"op": "acquire-data", "key": ts.key, "who_has": [h.address for h in ts.who_has]},
            )
            heapq.heappush(heap, (held + ts.nbytes, name, target))

    def _forget_copy(self, ts: TaskState) -> None:
        """The copy of ``ts`` is over (done, failed, or no longer wanted)."""
        self.copying.pop(ts, None)
        for keys in self.awaiting.values():
            keys.discard(ts)

    def _advance_retirements(self) -> None:
        """Settle each waiting worker that runs nothing and has no copy in flight."""
        for ws in [w for w, keys in self.awaiting.items() if not keys and not w.processing]:
            self._copy_stranded(ws)  # what became stranded since (a holder left, a run ended)
            if ws in self.awaiting and not self.awaiting[ws]:
                self._settle(ws, None)
                logger.info("worker %s retired: nothing on it is needed only there", ws.name)
        for retirement in [r for r in self.retirements if not r.waiting]:
            self.retirements.remove(retirement)
            self.send(
                retirement.requester,
                {
                    "op": "retire-reply",
                    "id": retirement.reply_id,
                    "retired": retirement.retired,
                    "kept": retirement.kept,
                },
            )

    def _keep(self, ws: WorkerState, reason: str) -> None:
        """Give up retiring ``ws``: it is back in service, and its requests say why."""
        self._settle(ws, reason)
        ws.retiring = False
        ws.slots = 0 if ws.paused else ws.max_slots  # paused for memory: not yet
        if len(ws.processing) < ws.slots:
            self.with_slots[ws] = None
        if not ws.processing and ws.slots:
            self.idle[ws] = None
        logger.warning("worker %s stays in service: %s", ws.name, reason)
        self._fill(ws)

    def _settle(self, ws: WorkerState, kept_because: str | None) -> None:
        """Stop waiting for ``ws``: it is retired, or kept for the reason given."""
        self.awaiting.pop(ws, None)
        for retirement in self.retirements:
            if ws in retirement.waiting:
                del retirement.waiting[ws]
                if kept_because is None:
                    retirement.retired.append(ws.name)
                else:
                    retirement.kept[ws.name] = kept_because

    def _retirement_lost(self, ws: WorkerState, reason: str) -> None:
        """``ws`` left: copies it was receiving are redone elsewhere; a retirement of it ends."""
        for ts in [t for t, target in self.copying.items() if target is ws]:
            self._forget_copy(ts)  # its holders wait again, and copy anew in take_outbox
        if ws in self.awaiting:
            self._settle(ws, f"left while retiring ({reason}); results not copied are recomputed")

    def _expire_retirements(self, now: float) -> None:
        """Workers a retirement still waits for at its deadline stay in service."""
        for retirement in [r for r in self.retirements if r.deadline <= now]:
            within = f"{self.retire_timeout:g}s (scheduler.retire-timeout)"
            for ws in list(retirement.waiting):
                if ws.processing:
                    why = f"still running {_plural(len(ws.processing), 'task')} after {within}"
                else:
                    copies = _plural(len(self.awaiting[ws]), "result")
                    why = f"could not copy {copies} still needed to another worker within {within}"
                self._keep(ws, why)

    def _retirement_problems(self) -> list[str]:
        problems = []
        for ws in self.workers.values():
            if ws.retiring and (ws.slots or ws in self.with_slots):
                problems.append(f"{ws.name}: retiring yet open for work")
            elif not ws.retiring and not ws.paused and ws.slots != ws.max_slots:
                problems.append(f"{ws.name}: in service with {ws.slots} of {ws.max_slots} slots")
        waited = {ws for r in self.retirements for ws in r.waiting}
        if waited != set(self.awaiting):
            problems.append(f"retirements wait for {waited}, copies for {set(self.awaiting)}")
        for ws, keys in self.awaiting.items():
            if not ws.retiring or self.workers.get(ws.address) is not ws:
                problems.append(f"{ws.name}: awaited but not a connected retiring worker")
            for ts in keys:
                if ts not in self.copying or ts not in ws.has_what:
                    problems.append(f"{ws.name} waits for a copy of {ts.key} not in flight")
        for ts, target in self.copying.items():
            if ts.state != "memory" or self.tasks.get(ts.key) is not ts:
                problems.append(f"copying {ts.key}, which is {ts.state}")
            if self.workers.get(target.address) is not target or target in ts.who_has:
                problems.append(f"copying {ts.key} to {target.name}, gone or holding it")
        return problems


def bytes_held(ws: WorkerState) -> int:
    return sum(ts.nbytes for ts in ws.has_what)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def in_service_first(holders: frozenset[WorkerState]) -> list[str]:
    """Holder addresses, those not retiring first (clients fetch from the first)."""
    return [ws.address for ws in sorted(holders, key=lambda ws: (ws.retiring, ws.address))]
