"""Placement by worker: ``submit(..., workers=[...], allow_other_workers=...)``.

A restriction is part of a task's demand: a ``RestrictedShape`` is the demand's shape (the
same sorted pairs, so resource accounting reads it unchanged) that also names the workers
allowed to run it. The scheduler buckets, queues and reserves by shape, so tasks with a
restriction get all of that for free; only the rule for which workers *could ever* run a
shape (``placeable``) and the reason none can (``explain_restricted``) change.

- strict (the default): a task may run only on a listed worker (by name or address) whose
  total resources cover its demand, and starts there only when they are free. With none
  of the listed workers connected (or none large enough) it waits in no-worker, saying
  so, and runs as soon as one joins.
- ``allow_other_workers=True``: the listed workers are preferred: one of them gets the task
  when it can start it at once; otherwise any worker with the resources free does (no
  task ever idles waiting for a preferred worker).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from apportion.resources import Shape, fits, format_resources

if TYPE_CHECKING:
    from apportion.scheduler.model import TaskState, WorkerState


class RestrictedShape(tuple[tuple[str, float], ...]):
    """A demand shape plus the workers allowed (or preferred) to run it.

    Equal only to a shape with the same demand *and* the same restriction, so a restricted
    task never shares a queue or a fitting set with an unrestricted one. Still a tuple of
    the demand's pairs, so every loop over a shape's resources reads it as the plain shape.
    (Truthiness is the tuple's: a restriction with no resources is falsy, like the empty
    shape, and is never reserved for; see ``is_restricted``.)
    """

    workers: frozenset[str]
    loose: bool
    tenant: str  # the tenant whose task it is (tenants.py); "" with no tenants declared
    _hash: int

    def __new__(
        cls, shape: Shape, workers: Iterable[str], loose: bool, tenant: str = ""
    ) -> RestrictedShape:
        self = super().__new__(cls, shape)
        self.workers = frozenset(workers)
        self.loose = loose
        self.tenant = tenant
        self._hash = hash((tuple(shape), self.workers, loose, tenant))
        return self

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is RestrictedShape
            and tuple.__eq__(self, other)
            and self.workers == other.workers
            and self.loose == other.loose
            and self.tenant == other.tenant
        )

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return self._hash

    def admits(self, ws: WorkerState) -> bool:
        return ws.name in self.workers or ws.address in self.workers

    def __repr__(self) -> str:
        kind = "preferring" if self.loose else "on"
        of = f" of {self.tenant}" if self.tenant else ""
        return f"<{format_resources(dict(self))} {kind} {sorted(self.workers)}{of}>"


def restrict(shape: Shape, workers: list[str], loose: bool) -> Shape:
    """The shape of a demand with ``workers`` (names or addresses) allowed, or preferred
    when ``loose``; the plain shape when no worker is named."""
    if not workers:
        return shape
    return RestrictedShape(shape, workers, loose)


def is_restricted(shape: Shape) -> bool:
    return type(shape) is RestrictedShape


def placeable(shape: Shape, ws: WorkerState) -> bool:
    """Whether ``ws`` could ever run a task of ``shape``: it is in service (not retired)
    and ``suits`` it."""
    return not ws.retired and suits(shape, ws)


def suits(shape: Shape, ws: WorkerState) -> bool:
    """Whether ``ws``'s totals cover the demand of ``shape`` and, for a strict
    restriction, it is one of the listed workers."""
    if not fits(shape, ws.total):
        return False
    if type(shape) is RestrictedShape and not shape.loose:
        return shape.admits(ws)
    return True


def preferred_worker(ts: TaskState, fitting: Iterable[WorkerState]) -> WorkerState | None:
    """For a task preferring some workers (``allow_other_workers=True``): the least loaded
    of them that can start it now, or None (then any worker may)."""
    shape = ts.shape
    if type(shape) is not RestrictedShape or not shape.loose or not shape.workers:
        return None
    best: WorkerState | None = None
    best_load = float("inf")
    for ws in fitting:
        if (
            shape.admits(ws)
            and len(ws.processing) < ws.slots
            and fits(shape, ws.free)
            and len(ws.processing) / ws.nthreads < best_load
        ):
            best, best_load = ws, len(ws.processing) / ws.nthreads
    return best


def explain_restricted(
    shape: RestrictedShape, workers: Iterable[WorkerState], waiting: bool
) -> str:
    """Why no live worker could ever run a task restricted to some workers."""
    listed = sorted(shape.workers)
    connected = [ws for ws in workers if shape.admits(ws)]
    if not connected:
        why = f"the task may run only on worker(s) {listed}, and none of them is connected"
    else:
        demand = format_resources(dict(shape))
        offers = "; ".join(f"{ws.name} has {format_resources(ws.total)}" for ws in connected)
        why = f"the task may run only on worker(s) {listed}, and none has {demand} ({offers})"
    return f"{why}; it waits until one joins" if waiting else why


def describe(shape: Shape) -> dict[str, Any]:
    """A shape as the scheduler reports it (``info()``): its resources, and its workers."""
    described: dict[str, Any] = {"resources": dict(shape)}
    if type(shape) is RestrictedShape:
        if shape.workers:
            described["workers"] = sorted(shape.workers)
            described["allow_other_workers"] = shape.loose
        if shape.tenant:
            described["tenant"] = shape.tenant
    return described
