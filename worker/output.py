"""What a task printed, and when it ran, for the report of its run.

``install()`` puts a stand-in for ``sys.stdout`` and ``sys.stderr``: what a task thread
writes while it captures (``begin`` ... ``end``) is kept for the client that submitted
the task, which prints it (once: not also on the worker's terminal, which for a
``LocalCluster`` is the user's); everything else goes to the real streams. Warnings go
through ``sys.stderr`` too. The worker's own logging writes to the stream it was set up
with and is never sent.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable
from typing import Any, TextIO

# Text a run may send back; beyond it the rest is cut with a note.
MAX_OUTPUT_CHARS = 64 * 1024

_local = threading.local()
_installed = False
_install_lock = threading.Lock()


class TaskStream:
    """Stands in for ``sys.stdout`` or ``sys.stderr`` (``name``)."""

    def __init__(self, name: str, original: TextIO) -> None:
        self.name = name
        self.original = original

    def write(self, text: str) -> int:
        captured: list[list[str]] | None = getattr(_local, "captured", None)
        if captured is None:
            return self.original.write(text)
        if captured and captured[-1][0] == self.name:
            captured[-1][1] += text
        elif text:
            captured.append([self.name, text])
        return len(text)

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.original, attribute)


def install() -> None:
    """Capture what task threads print from now on (once per process)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        sys.stdout = TaskStream("stdout", sys.stdout)  # type: ignore[assignment]
        sys.stderr = TaskStream("stderr", sys.stderr)  # type: ignore[assignment]
        _installed = True


def begin() -> float:
    """In a task thread, as its run starts: capture what it prints. Returns the start time."""
    _local.captured = []
    return time.time()


def end() -> list[list[str]]:
    """As the run ends: ``[[stream, text], ...]`` it printed, in order, cut to
    ``MAX_OUTPUT_CHARS``."""
    captured: list[list[str]] = getattr(_local, "captured", None) or []
    _local.captured = None
    size = 0
    for i, (_, text) in enumerate(captured):
        size += len(text)
        if size > MAX_OUTPUT_CHARS:
            del captured[i + 1 :]
            captured[i][1] = text[: len(text) - (size - MAX_OUTPUT_CHARS)]
            captured.append(["stderr", f"\n[output cut at {MAX_OUTPUT_CHARS:,} characters]\n"])
            break
    return captured


def units_held(tasks: Iterable[Any]) -> dict[str, Any]:
    """For the heartbeat: ``{"units": [[run_id, {"GPU": [1]}], ...]}`` for the running
    tasks holding numbered units (the dashboard shows who holds which); empty if none."""
    held = [[t.run_id, t.units] for t in list(tasks) if t.state == "running" and t.units]
    return {"units": held} if held else {}


def add_run_report(
    message: dict[str, Any],
    start: float,
    stop: float,
    units: dict[str, list[int]],
    fetched: int,
    output: list[list[str]] | None,
) -> dict[str, Any]:
    """Add what the scheduler records of a run (dashboard, metrics, the client's output)
    to its ``task-finished`` or ``task-erred`` message."""
    message["start"] = start
    message["stop"] = stop
    if units:
        message["units"] = units
    if fetched:
        message["fetched"] = fetched
    if output:
        message["output"] = output
    return message
