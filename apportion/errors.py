"""Exceptions users may catch."""

from __future__ import annotations

from concurrent.futures import CancelledError, TimeoutError

__all__ = [
    "CancelledError",
    "KilledWorkerError",
    "NoValidWorkerError",
    "RemoteTraceback",
    "SchedulerConnectionError",
    "TimeoutError",
]


class RemoteTraceback(Exception):
    """Carries the traceback text of an exception raised on a worker (set as ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\nTraceback on the worker:\n{self.text}"


class NoValidWorkerError(RuntimeError):
    """No live worker could run a task's resource demand within the configured timeout."""


class KilledWorkerError(RuntimeError):
    """A task was running on too many workers that died; it is probably what kills them."""


class SchedulerConnectionError(ConnectionError):
    """The client lost its connection to the scheduler."""
