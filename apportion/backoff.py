"""When to restart a crashed process: at once the first time, then ever more slowly while it
keeps crashing soon after starting, so a process that cannot start does not spin."""

from __future__ import annotations


class RestartBackoff:
    def __init__(
        self,
        first: float = 0.0,
        initial: float = 0.5,
        maximum: float = 30.0,
        stable_after: float = 60.0,
    ) -> None:
        self.first = first
        self.initial = initial
        self.maximum = maximum
        self.stable_after = stable_after
        self._delay: float | None = None
        self._started_at: float | None = None

    def started(self, now: float) -> None:
        self._started_at = now

    def delay(self, now: float) -> float:
        """Seconds to wait before restarting a process that exited at ``now``."""
        lived = now - self._started_at if self._started_at is not None else 0.0
        if self._delay is None or lived >= self.stable_after:
            self._delay = self.first  # first crash, or it had been running fine: restart now
        else:
            self._delay = min(self.maximum, max(self.initial, self._delay * 2))
        return self._delay


class QuietRetries:
    """When to say that a retry loop is still waiting: on the first failure, then each
    time the wait has doubled (1 s, 2 s, 4 s, ...), so a wait of minutes logs a handful of
    lines, not one per attempt."""

    def __init__(self, first_report_after: float = 1.0) -> None:
        self._next: float | None = None
        self._step = first_report_after

    def due(self, waited: float) -> bool:
        """Whether to log now, ``waited`` seconds after the first failure."""
        if self._next is None:
            self._next = self._step
            return True
        if waited < self._next:
            return False
        while self._next <= waited:
            self._next *= 2
        return True
