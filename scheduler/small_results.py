"""Small results kept by the scheduler, to be sent along with the tasks that take them.

A worker's report of a finished task carries its pickled result when it is small (see
``worker.inline-result-bytes``), for the clients waiting for it. The scheduler keeps those
of ``MAX_RESULT_BYTES`` or less for a while, and puts them in the ``compute`` message of
each task that takes them as inputs (``inline``): the worker running that task then has
them at once, without a round trip to the worker holding them (a task of a thousand
small inputs otherwise waits for a thousand fetches). Ray inlines its small objects into
the tasks that take them the same way.

What is kept is bounded (``budget`` bytes, oldest dropped first), and an entry goes once
the result leaves memory, or once the one task taking it has been sent: it only saves
fetches, and a task whose input was not kept fetches it as before.

Pure: no I/O; the scheduler's state machine owns one instance.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Final

from apportion.scheduler.model import TaskState

# A result larger than this is fetched from its holder, as any large one.
MAX_RESULT_BYTES: Final = 2048
# What one ``compute`` message carries inline at most: the rest of its inputs are fetched.
MAX_MESSAGE_BYTES: Final = 2**20
# Kept at most, in all (each entry counted with ENTRY_OVERHEAD bytes on top of its own).
DEFAULT_BUDGET: Final = 16 * 2**20
# The memory of one entry besides the result's bytes: the bytes object, the dict slot and
# the ordered dict's link.
ENTRY_OVERHEAD: Final = 160


class SmallResults:
    """Pickled small results by task, oldest first, within a budget of bytes."""

    __slots__ = ("budget", "kept", "used")

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = budget
        # Ordered, dropping from the front: a plain dict would make each drop of the
        # oldest scan past every slot dropped before it (until the dict is rebuilt), so
        # that with a full budget of results each new one cost tens of microseconds.
        self.kept: OrderedDict[TaskState, bytes] = OrderedDict()
        self.used = 0

    def keep(self, ts: TaskState, data: object) -> None:
        """Keep ``ts``'s pickled result ``data`` (the bytes a worker reported), if small:
        the oldest kept results go to make room for it."""
        if type(data) is not bytes or len(data) > MAX_RESULT_BYTES or self.budget <= 0:
            return
        kept = self.kept
        old = kept.pop(ts, None)
        if old is not None:
            self.used -= len(old) + ENTRY_OVERHEAD
        kept[ts] = data
        self.used += len(data) + ENTRY_OVERHEAD
        while self.used > self.budget:
            self.used -= len(kept.popitem(last=False)[1]) + ENTRY_OVERHEAD

    def drop(self, ts: TaskState) -> None:
        """``ts``'s result left memory (released, lost): its bytes are no longer its result."""
        data = self.kept.pop(ts, None)
        if data is not None:
            self.used -= len(data) + ENTRY_OVERHEAD

    def for_task(self, dependencies: Iterable[TaskState]) -> dict[str, bytes]:
        """The kept results among a task's inputs, by key, for its ``compute`` message
        (at most ``MAX_MESSAGE_BYTES`` of them). An input that only this task takes is not
        kept any longer: its one task has it."""
        kept = self.kept
        inline: dict[str, bytes] = {}
        if not kept:
            return inline
        size = 0
        for dep in dependencies:
            data = kept.get(dep)
            if data is None:
                continue
            size += len(data)
            if size > MAX_MESSAGE_BYTES:
                break
            inline[dep.key] = data
            if len(dep.dependents) <= 1:
                del kept[dep]
                self.used -= len(data) + ENTRY_OVERHEAD
        return inline

    def problems(self) -> list[str]:
        """Books that do not add up, or a kept result that is not in memory (for tests)."""
        problems = []
        used = sum(len(data) + ENTRY_OVERHEAD for data in self.kept.values())
        if used != self.used:
            problems.append(f"small results: {self.used} bytes counted, {used} kept")
        for ts in self.kept:
            if ts.state != "memory":
                problems.append(f"small results: {ts.key} kept while {ts.state}")
        return problems
