"""Which silent workers to remove, when the silence may be the scheduler's own.

A worker is judged by the time since the scheduler last read a heartbeat from it. That
time is measured on the scheduler's clock, so a scheduler that was itself stopped (SIGSTOP,
a frozen VM, a loop blocked for seconds) finds every worker silent when it runs again,
while their heartbeats wait unread in its sockets. Two rules keep it from removing workers
for silence it caused (Kubernetes' node lifecycle controller has both: it ignores the time
it was not watching, and stops evicting when every node looks down at once):

1. A check that runs much later than its period (by half the timeout or more: a shorter
   stall cannot make a worker heard within a heartbeat look silent for the whole timeout)
   means the scheduler was stalled: it judges no one then (what arrived meanwhile is read
   first), and counts silence only from then.
2. When every worker (two or more) looks silent at the same check, the scheduler suspects
   itself rather than all of them, and waits one more timeout: workers that are really gone
   stay silent (or their connections end), and go then.

``Liveness`` is pure: the server's heartbeat check gives it the time and when each worker
was last heard, and removes the workers it names.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

# Seconds between heartbeat checks.
CHECK_PERIOD = 1.0
# A check late by this many periods at least, and by half the worker timeout, means the
# scheduler itself was stalled (shorter delays are a busy loop's: judged as usual, so that
# a scheduler often a little late still removes workers that are gone).
STALL_PERIODS = 2.0

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class Verdict(Generic[Key]):
    """The workers to remove now, and why none were, when that is worth a log line."""

    remove: list[Key] = field(default_factory=list)
    note: str | None = None


@dataclass
class Liveness:
    """The memory of the heartbeat checks; see the module's docstring."""

    period: float = CHECK_PERIOD
    # When the previous check ran (None: none yet).
    last_check: float | None = None
    # Silence is counted from here at the earliest: the end of the scheduler's last stall.
    counted_from: float = float("-inf")
    # While every worker looks silent: until when the scheduler suspects itself.
    suspect_self_until: float | None = None

    def check(self, now: float, timeout: float, last_seen: Mapping[Key, float]) -> Verdict[Key]:
        """The workers silent for more than ``timeout`` seconds at ``now``, given when each
        was last heard (``last_seen``), unless the silence may be the scheduler's own."""
        previous, self.last_check = self.last_check, now
        stall = max(STALL_PERIODS * self.period, timeout / 2)
        if previous is not None and now - previous > stall:
            self.counted_from = now
            self.suspect_self_until = None
            return Verdict(
                note=f"the scheduler itself did not run for {now - previous:.1f}s: no worker "
                "is judged for that time; silence counts from now"
            )
        counted_from = self.counted_from
        silent = [key for key, seen in last_seen.items() if now - max(seen, counted_from) > timeout]
        if len(silent) < 2 or len(silent) < len(last_seen):
            self.suspect_self_until = None
            return Verdict(silent)
        if self.suspect_self_until is None:
            self.suspect_self_until = now + timeout
            return Verdict(
                note=f"all {len(silent)} workers look silent for more than {timeout:g}s at "
                f"once: suspecting this scheduler (its network or its loop) and waiting "
                f"{timeout:g}s more before removing them"
            )
        if now < self.suspect_self_until:
            return Verdict()
        self.suspect_self_until = None
        return Verdict(silent)
