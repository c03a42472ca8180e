"""Pure placement decisions: which worker gets a ready task, and why none can.

Rule: a task needing demand D may go to worker W only if ``total(W) >= D`` and
is assigned only when ``free(W) >= D`` and W has a free slot. Among those,
prefer the worker holding most bytes of the task's dependencies, else an idle
one (the scheduler offers the most recently idle first), else the least loaded one.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING

from apportion.resources import Shape, fits, format_resources

if TYPE_CHECKING:
    from apportion.scheduler.model import TaskState, WorkerState


def can_start(ws: WorkerState, shape: Shape) -> bool:
    return len(ws.processing) < ws.slots and fits(shape, ws.free)


def pick_worker(
    ts: TaskState,
    fitting: set[WorkerState],
    with_slots: Iterable[WorkerState],
    idle: Iterable[WorkerState] = (),
    floor: float = 0.0,
) -> WorkerState | None:
    """Choose a worker that can start ``ts`` now, or None if every fitting worker is full.

    ``idle`` (optional) lists the workers of ``with_slots`` running nothing; they are tried
    first, in the order given. ``floor`` is a lower bound on the load of the others: the
    scan stops at the first worker reaching it, so a busy cluster is not scanned whole for
    every task.
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
        if best is not None:
            return best
    for ws in idle:
        if ws in fitting and fits(ts.shape, ws.free):
            return ws
    best = None
    best_load = float("inf")
    for ws in with_slots:
        if ws in fitting and fits(ts.shape, ws.free):
            load = len(ws.processing) / ws.nthreads
            if load < best_load:
                best, best_load = ws, load
                if load <= floor:
                    break
    return best


def explain_no_worker(shape: Shape, workers: Iterable[WorkerState]) -> str:
    """Say why no live worker could ever run a demand, naming the largest offers."""
    workers = list(workers)
    demand = format_resources(dict(shape))
    if not workers:
        if not shape:
            return "no workers are connected; tasks wait until one joins"
        return f"no workers are connected; the demand {demand} waits for one that has it"
    parts = []
    for name, amount in shape:
        largest = max((ws.total.get(name, 0) for ws in workers), default=0)
        if largest < amount:
            offered = f"the most any worker has is {largest}" if largest else "no worker has any"
            parts.append(f"{name}={amount} needed, {offered}")
    return (
        f"no live worker has {demand} ({'; '.join(parts)}); the task waits until a worker "
        "with these resources joins"
    )


def _live(entry: tuple[int, int, int, TaskState]) -> bool:
    """A heap entry still stands for its task: queued, and queued by this very push."""
    return entry[3].state == "queued" and entry[3].queue_token == entry[2]


class ReadyQueues:
    """Ready tasks bucketed by demand shape; each bucket ordered by (priority, submission)."""

    def __init__(self) -> None:
        self.by_shape: dict[Shape, list[tuple[int, int, int, TaskState]]] = {}
        self._tokens = 0

    def push(self, ts: TaskState) -> None:
        heap = self.by_shape.get(ts.shape)
        if heap is None:
            heap = self.by_shape[ts.shape] = []
        # The token tells a live entry from a stale one left by an earlier stay in the queue.
        self._tokens += 1
        ts.queue_token = self._tokens
        heapq.heappush(heap, (-ts.priority, ts.seq, self._tokens, ts))

    def __len__(self) -> int:
        return sum(len(h) for h in self.by_shape.values())

    def counts(self) -> dict[Shape, int]:
        """Live queued tasks per shape (heaps also hold stale entries until popped)."""
        found = {shape: sum(map(_live, heap)) for shape, heap in self.by_shape.items()}
        return {shape: n for shape, n in found.items() if n}

    def drain(self, shape: Shape) -> list[TaskState]:
        """Remove and return every live queued task of one shape, in queue order."""
        heap = self.by_shape.pop(shape, [])
        return [entry[3] for entry in sorted(heap) if _live(entry)]

    def pop_for(self, ws: WorkerState) -> TaskState | None:
        """Remove and return the most urgent queued task ``ws`` can start now."""
        best: tuple[int, int, int, TaskState] | None = None
        emptied: list[Shape] = []
        fitting, free = ws.fitting_shapes, ws.free
        for shape, heap in self.by_shape.items():
            if shape not in fitting or (shape and not fits(shape, free)):
                continue
            while heap and not _live(heap[0]):
                heapq.heappop(heap)  # lazily drop tasks that left the queue another way
            if not heap:
                emptied.append(shape)
            # Entries order by (-priority, seq, ...); seq is unique, so tasks never compare.
            elif best is None or heap[0] < best:
                best = heap[0]
        for shape in emptied:
            del self.by_shape[shape]
        if best is None:
            return None
        heapq.heappop(self.by_shape[best[3].shape])
        return best[3]
