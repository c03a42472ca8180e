"""Rebuilding a new scheduler from what workers report: pure decisions, no state.

A scheduler keeps nothing on disk. After a restart, each worker's first message says which
results it holds and which runs are in its threads (with the resources each holds), and
each client re-registers the tasks it still wants. This module reads a worker's report and
decides, for each reported result or run, what the scheduler does with it given what it
knows of that key already; ``scheduler/adoption.py`` carries the decisions out.

Conflicts are settled by one rule, the same whatever the order of arrival within a kind:
what the scheduler knows first stays, a later claim gives way (its run is cancelled, its
resources stay booked until it ends), and a held result beats a run (a result is never
computed twice when one exists).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from apportion.protocol import ProtocolError
from apportion.resources import Shape, to_shape, validate

# Unclaimed results and runs are wanted by this pseudo-client until the recovery wait ends
# (clients re-registering take them over); its name cannot clash with a client id.
RECOVERING = "(recovering)"


@dataclass(frozen=True)
class ReportedRun:
    key: str
    run_id: int
    shape: Shape
    cancelled: bool
    # Seceded (its thread given back): with its resources released, and asking for them
    # back (rejoin() waits for the scheduler's grant).
    seceded: bool = False
    released: bool = False
    reacquiring: bool = False
    attempt: int = 1


@dataclass(frozen=True)
class ReportedError:
    key: str
    exception: bytes
    traceback: str


@dataclass(frozen=True)
class WorkerReport:
    held: dict[str, int]  # key -> pickled size
    running: list[ReportedRun]
    erred: list[ReportedError] = field(default_factory=list)
    # The attempt of each held result whose run ended while no scheduler knew of it.
    attempts: dict[str, int] = field(default_factory=dict)


def parse_report(message: Any) -> WorkerReport:
    """A worker's ``recover`` message, checked; ProtocolError says what is wrong."""
    if not isinstance(message, dict) or message.get("op") != "recover":
        raise ProtocolError(
            f"a worker registering with 'report' must send 'recover' first, got {message!r:.200}"
        )
    held = message.get("held")
    if not isinstance(held, dict) or not all(
        isinstance(k, str) and type(n) is int for k, n in held.items()
    ):
        raise ProtocolError("'recover' needs 'held': a map of keys to their sizes in bytes")
    runs = message.get("running")
    if not isinstance(runs, list):
        raise ProtocolError("'recover' needs 'running': a list of runs")
    running = []
    for run in runs:
        try:
            key, run_id, attempt = run["key"], run["run_id"], run.get("attempt", 1)
            if not isinstance(key, str) or type(run_id) is not int or type(attempt) is not int:
                raise TypeError("key must be a string, run_id and attempt integers")
            shape = to_shape(validate(run.get("resources") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"'recover' has a malformed run {run!r:.200}: {exc}") from None
        running.append(
            ReportedRun(
                key,
                run_id,
                shape,
                bool(run.get("cancelled")),
                bool(run.get("seceded")),
                bool(run.get("released")),
                bool(run.get("reacquiring")),
                attempt,
            )
        )
    erred = []
    for error in message.get("erred") or ():
        try:
            key, exception = error["key"], error["exception"]
            traceback = error.get("traceback") or ""
            if not isinstance(key, str) or not isinstance(exception, bytes):
                raise TypeError("key must be a string and exception bytes")
            if not isinstance(traceback, str):
                raise TypeError("traceback must be a string")
        except (KeyError, TypeError) as exc:
            raise ProtocolError(f"'recover' has a malformed error {error!r:.200}: {exc}") from None
        erred.append(ReportedError(key, exception, traceback))
    attempts = message.get("attempts") or {}
    if not isinstance(attempts, dict) or not all(
        isinstance(k, str) and type(n) is int for k, n in attempts.items()
    ):
        raise ProtocolError("'recover' has 'attempts' that is not a map of keys to integers")
    return WorkerReport(held, running, erred, attempts)


# What the scheduler knows of a reported key: None (nothing), or the task's state.
Known = str | None

HeldAction = Literal["keep-unclaimed", "add-holder", "adopt-result", "drop"]
ErredAction = Literal["keep-unclaimed", "adopt-error", "drop"]
RunAction = Literal["adopt-unclaimed", "adopt-run", "stale"]


@dataclass(frozen=True)
class Decision:
    action: str
    # Set for a conflict: why a report gives way, for the log.
    conflict: str | None = None


def decide_held(
    key: str, known: Known, recovering: bool, attempt: int | None = None, current: int = 0
) -> Decision:
    """A worker holds the result of ``key``: of run ``attempt`` when that run ended while no
    scheduler knew of it (None: a result a scheduler had been told of); ``current``: the
    attempt of the key's run known here."""
    if known == "processing" and attempt is not None and attempt < current:
        return Decision(
            "drop",
            f"{key!r} was held from attempt {attempt}, superseded by attempt {current} "
            "running now; the older result is dropped",
        )
    if known is None:
        if recovering:
            return Decision("keep-unclaimed")  # for a client still to re-register it
        return Decision("drop")  # the wait is over: nobody wants it
    if known == "memory":
        return Decision("add-holder")
    if known == "erred":
        return Decision("drop", f"{key!r} is known as failed; the held result is dropped")
    # Released, waiting, queued, no-worker, or running elsewhere: the result exists, so
    # nothing runs it (a run elsewhere is cancelled).
    return Decision("adopt-result")


def decide_erred(key: str, known: Known, recovering: bool) -> Decision:
    """A run of ``key`` failed on a worker while no scheduler listened."""
    if known is None:
        if recovering:
            return Decision("keep-unclaimed")  # for a client still to re-register it
        return Decision("drop")
    if known in ("memory", "erred"):
        return Decision("drop", f"{key!r} is known as {known}; the error is dropped")
    if known == "processing":
        return Decision("drop", f"{key!r} runs again already; the error is dropped")
    return Decision("adopt-error")  # released, waiting, queued or no-worker


def decide_run(
    key: str,
    known: Known,
    recovering: bool,
    run: ReportedRun,
    known_shape: Shape | None,
    running_on: str | None,
) -> Decision:
    """A worker runs ``key`` (``run``); ``running_on`` names the worker already running it."""
    if run.cancelled:
        return Decision("stale")  # cancelled before the restart: it only holds resources
    if known is None:
        if recovering:
            return Decision("adopt-unclaimed")
        return Decision("stale", f"nobody wants {key!r} any more; its run is cancelled")
    # The demand's pairs only: a restriction to some workers is no other demand.
    if known_shape is not None and tuple(known_shape) != tuple(run.shape):
        return Decision(
            "stale",
            f"{key!r} is registered with resources {dict(known_shape)} but runs with "
            f"{dict(run.shape)}; the run is cancelled",
        )
    if known == "memory":
        return Decision("stale", f"{key!r} is already held; the run is cancelled")
    if known == "erred":
        return Decision("stale", f"{key!r} is known as failed; the run is cancelled")
    if known == "processing":
        return Decision(
            "stale", f"{key!r} already runs on {running_on}, which reported first; cancelled"
        )
    return Decision("adopt-run")  # released, waiting, queued or no-worker: it runs here
