"""Large submitted arguments go from the client straight to a worker, not through the
scheduler (the decisions; the client carries them out).

A task argument pickling to ``client.store-argument-bytes`` or more is put on a worker
that could run the task (it has the task's resources, and is one of its ``workers=``)
as data of its own key, a hash of its bytes. A small task of that key, restricted to
that worker, turns it into a result there (worker/stored.py), and the submitted task
depends on it like on any future: the scheduler sees only keys. The argument is freed
with the task's future (the task's state holds the argument's future).

A stored argument lives on one worker, so the client keeps the value (a reference to what
it was given, not a copy) until every task that took it is done. Should that worker be
lost first, the scheduler finds no worker for the argument's key and says so; the client
then puts the value on another worker that could run the task and has the scheduler take
the key from there (scheduler/stored_arguments.py), or, with none connected, lets the
value travel with the key's task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from apportion.serialize import Payload, dumps_data

# Where an argument sits: its index among the positional arguments, or its keyword.
Position = int | str


def large_arguments(
    args: tuple, kwargs: dict, threshold: int, future_type: type
) -> list[tuple[Position, Any, Payload]]:
    """The arguments pickling to ``threshold`` bytes or more, with their pickles. Those
    holding futures stay with the task (their futures must stay its dependencies)."""
    found: list[tuple[Position, Any, Payload]] = []
    positions: list[tuple[Position, Any]] = [*enumerate(args), *kwargs.items()]
    for position, value in positions:
        if isinstance(value, future_type) or _holds(value, future_type):
            continue
        try:
            payload = dumps_data(value)
        except Exception:
            continue  # the task's own pickling reports it
        if len(payload) >= threshold:
            found.append((position, value, payload))
    return found


def _holds(value: Any, future_type: type) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, future_type):
            return True
        if isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return False


def replace(args: tuple, kwargs: dict, by: dict[Position, Any]) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with the arguments at these positions replaced."""
    new_args = tuple(by.get(i, value) for i, value in enumerate(args))
    new_kwargs = {name: by.get(name, value) for name, value in kwargs.items()}
    return new_args, new_kwargs


def choose_holder(
    workers: dict[str, dict[str, Any]], demand: dict[str, float], options: dict[str, Any]
) -> str | None:
    """The address of the worker to hold a task's large argument: one that could run the
    task (its totals cover ``demand``, it is not retiring, and it is among ``workers=``
    unless other workers are allowed, preferred if they are), the least busy of them.
    None when no connected worker could."""
    named = set(options.get("workers") or ())
    strict = bool(named) and not options.get("allow_other_workers")
    candidates = []
    for address, info in workers.items():
        if info.get("retiring"):
            continue
        totals = info.get("resources") or {}
        if any(totals.get(name, 0) < amount for name, amount in demand.items()):
            continue
        listed = address in named or info.get("name") in named
        if strict and not listed:
            continue
        rank = (not listed, info.get("processing", 0), info.get("nbytes", 0), address)
        candidates.append((rank, address))
    return min(candidates)[1] if candidates else None


# The client's view of the workers, for choosing where large arguments go (WorkerView):
# older than this, it is described again in the background (the choice at hand uses it
# as it is); older than the second, the choice waits for a new description.
VIEW_FRESH_S = 0.1
VIEW_STALE_S = 2.0


class WorkerView:
    """The workers as the scheduler last described them (its ``info``), for choosing the
    holder of each large argument without a round trip to the scheduler for each: that
    round trip (and the scheduler's pass over all its tasks to answer it) was a tenth to
    a fifth of a 1 MiB argument's submit. Each choice adds the argument's bytes to its
    holder here, as the scheduler's next description would, so that the next choice
    weighs it; a holder that could not be reached is left out until the next description.
    Not thread-safe: the client holds its lock."""

    def __init__(self) -> None:
        self.workers: dict[str, dict[str, Any]] = {}
        self.described_at = -math.inf
        self.refreshing = False

    def due(self, now: float) -> str:
        """What to do before choosing at ``now``: "wait" for a new description (none yet,
        or too old), "refresh" it in the background, or "" (fresh)."""
        age = now - self.described_at
        if age > VIEW_STALE_S:
            return "wait"
        return "refresh" if age > VIEW_FRESH_S and not self.refreshing else ""

    def describe(self, workers: dict[str, dict[str, Any]], at: float) -> None:
        """A new description of the workers, asked for at ``at``."""
        if at >= self.described_at:
            self.workers, self.described_at = workers, at

    def chose(self, address: str, nbytes: int) -> None:
        info = self.workers[address] = dict(self.workers[address])
        info["nbytes"] = info.get("nbytes", 0) + nbytes

    def unreachable(self, address: str) -> None:
        self.workers = {a: info for a, info in self.workers.items() if a != address}


@dataclass
class KeptArgument:
    """A stored argument the client keeps while tasks that took it are not done."""

    value: Any
    demand: dict[str, float]  # the resources of the task it was chosen for
    options: dict[str, Any]  # that task's ``workers=`` restriction, if any
    takers: set[str] = field(default_factory=set)  # keys of the tasks not done yet


def argument_value(value: Any) -> Any:
    """The task of a stored argument that no worker holds any more and that travels with
    its task instead (no connected worker could run the tasks that took it)."""
    return value
