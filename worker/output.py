"""What a task printed, and when it ran, for the report of its run.

``install()`` puts a stand-in for ``sys.stdout`` and ``sys.stderr``: what a task thread
writes while it captures (``begin`` ... ``end``) is sent to the client that submitted
the task, which prints it (once: not also on the worker's terminal, which for a
``LocalCluster`` is the user's): with each heartbeat while the task runs, and the rest
with its result. Everything else goes to the real streams. Warnings go through
``sys.stderr`` too. The worker's own logging writes to the stream it was set up with
and is never sent.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

# Text a run may send back; beyond it the rest is cut with a note.
MAX_OUTPUT_CHARS = 64 * 1024

_local = threading.local()
_install_lock = threading.Lock()


class Capture:
    """What one run printed and has not sent yet, as ``[[stream, text], ...]``.

    Written by the task thread; taken by the loop's heartbeat (a long run's output is
    sent as it goes) and by the run's end, under ``lock``, so that what was taken first
    is also sent first."""

    __slots__ = ("chunks", "lock")

    def __init__(self) -> None:
        self.chunks: list[list[str]] = []
        self.lock = threading.Lock()

    def add(self, stream: str, text: str) -> None:
        with self.lock:
            chunks = self.chunks
            if chunks and chunks[-1][0] == stream:
                chunks[-1][1] += text
            else:
                chunks.append([stream, text])

    def take(self) -> list[list[str]]:
        """The output not taken yet, cut to ``MAX_OUTPUT_CHARS`` (call under ``lock``)."""
        chunks, self.chunks = self.chunks, []
        size = 0
        for i, (_, text) in enumerate(chunks):
            size += len(text)
            if size > MAX_OUTPUT_CHARS:
                del chunks[i + 1 :]
                chunks[i][1] = text[: len(text) - (size - MAX_OUTPUT_CHARS)]
                chunks.append(["stderr", f"\n[output cut at {MAX_OUTPUT_CHARS:,} characters]\n"])
                break
        return chunks


class TaskStream:
    """Stands in for ``sys.stdout`` or ``sys.stderr`` (``name``)."""

    def __init__(self, name: str, original: TextIO) -> None:
        self.name = name
        self.original = original

    def write(self, text: str) -> int:
        capture: Capture | None = getattr(_local, "capture", None)
        if capture is None:
            return self.original.write(text)
        if text:
            capture.add(self.name, text)
        return len(text)

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.original, attribute)


def install() -> None:
    """Capture what task threads print from now on (streams already wrapped stay so)."""
    with _install_lock:
        if not isinstance(sys.stdout, TaskStream):
            sys.stdout = TaskStream("stdout", sys.stdout)
        if not isinstance(sys.stderr, TaskStream):
            sys.stderr = TaskStream("stderr", sys.stderr)


def begin(task: Any) -> float:
    """In a task thread, as its run starts: capture what it prints into ``task.output``
    (a ``Capture``). Returns the start time."""
    task.output = _local.capture = Capture()
    return time.time()


def end() -> list[list[str]]:
    """As the run ends: what it printed and was not sent yet, in order."""
    capture: Capture | None = getattr(_local, "capture", None)
    _local.capture = None
    if capture is None:
        return []
    with capture.lock:
        return capture.take()


def send_running_output(tasks: Iterable[Any], send: Callable[[dict[str, Any]], Any]) -> None:
    """For the heartbeat: send what running tasks printed since the last time, so that a
    long task's output reaches its client as it goes (``task-output`` messages)."""
    for task in list(tasks):
        capture = task.output
        if isinstance(capture, Capture) and capture.chunks:
            with capture.lock:  # the run's end waits: its rest goes after this
                chunks = capture.take()
                if chunks:
                    send({"op": "task-output", "run_id": task.run_id, "output": chunks})


def units_held(tasks: Iterable[Any]) -> dict[str, Any]:
    """For the heartbeat: ``{"units": [[run_id, {"GPU": [1]}], ...]}`` for the running
    tasks holding numbered units (the dashboard shows who holds which); empty if none.
    A run holds units from its start to its end, except while seceded with its resources
    released (then it has none); a cancelled one is not shown."""
    held = [[t.run_id, t.units] for t in list(tasks) if t.units and not t.cancelled]
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
