"""Exceptions users may catch.

Every error apportion raises on purpose derives from ``ApportionError``, so one
``except ApportionError`` catches them all; each also keeps the builtin base it always
had (``NoValidWorkerError`` is still a ``RuntimeError``). Attributes carry the facts a
program would branch on, so nobody has to parse the message.
"""

from __future__ import annotations

from concurrent.futures import CancelledError, TimeoutError

__all__ = [
    "ApportionError",
    "CancelledError",
    "ConfigError",
    "InvalidTransitionError",
    "KilledWorkerError",
    "NoValidWorkerError",
    "RemoteTraceback",
    "Reschedule",
    "ResourceDeadlockError",
    "SchedulerConnectionError",
    "StartupError",
    "TimeoutError",
]


class ApportionError(Exception):
    """The base of every error apportion raises on purpose."""


class RemoteTraceback(ApportionError):
    """Carries the traceback text of an exception raised on a worker (set as ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\nTraceback on the worker:\n{self.text}"


class InvalidTransitionError(ApportionError, RuntimeError):
    """A task was to change state along an edge the scheduler's table of transitions does
    not have: a bug in the scheduler, stopped before it corrupts the task's accounting.
    ``key`` is the task, ``start`` and ``finish`` the states of the refused change."""

    def __init__(self, key: str, start: str, finish: str) -> None:
        super().__init__(
            f"task {key!r} cannot go from {start!r} to {finish!r}: not a legal transition"
        )
        self.key = key
        self.start = start
        self.finish = finish


class NoValidWorkerError(ApportionError, RuntimeError):
    """No live worker could run a task's resource demand within the configured timeout."""


class KilledWorkerError(ApportionError, RuntimeError):
    """A task was running on too many workers that died; it is probably what kills them."""


class InputLoadError(ApportionError, RuntimeError):
    """A task's input arrived on the task's worker but did not load there (its message
    names the input, where it came from and the error loading it raised). The task fails
    at once: fetched again or recomputed, the input would not load any better."""


class ResourceDeadlockError(ApportionError, RuntimeError):
    """A subtask could only ever run on resources that the tasks waiting for it hold.

    ``key`` is the subtask, ``holders`` the keys of the waiting tasks holding them.
    """

    def __init__(self, message: str, key: str = "", holders: list[str] | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.holders = list(holders or [])

    def __reduce__(self) -> tuple:
        return (type(self), (str(self), self.key, self.holders))


class TaskTimeoutError(ApportionError, TimeoutError):
    """A task's run took longer than its timeout (``task_timeout=`` or
    ``annotate(timeout=...)``); its worker process was replaced to stop it."""


class Reschedule(ApportionError):
    """Raised by a task to be placed again (its run ends, its resources are released)."""


class SchedulerConnectionError(ApportionError, ConnectionError):
    """The client lost its connection to the scheduler."""


class FrameTooLargeError(ApportionError, ValueError):
    """A message is larger than the peer's ``comm.max-frame-bytes``: it was not sent."""


class ConfigError(ApportionError, ValueError):
    """A configuration key that does not exist, or a value of the wrong type.

    ``key`` is the key as given, ``suggestion`` the closest known key (or None),
    ``source`` where it came from (``config.set``, a file, an environment variable).
    """

    def __init__(
        self, message: str, key: str, suggestion: str | None = None, source: str = ""
    ) -> None:
        super().__init__(message)
        self.key = key
        self.suggestion = suggestion
        self.source = source


class StartupError(ApportionError, RuntimeError):
    """A server process could not start; ``permanent`` failures are not worth a restart
    (a port in use, a refused token), unlike a crash."""

    def __init__(self, message: str, permanent: bool = True) -> None:
        super().__init__(message)
        self.permanent = permanent
