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
