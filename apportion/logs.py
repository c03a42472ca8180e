"""The recent log lines of this process, kept in memory for ``client.get_*_logs()``.

Each scheduler and worker process keeps its last lines in a ring buffer (a handler on
the ``apportion`` logger), so a user can read them from the client without a shell on
the machine or pod.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
from typing import Any, TextIO

from apportion import config

# Enough for the story of a worker's last minutes, small enough to ignore (about 200 KiB).
RECENT_LINES = 1000
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class RecentLines(logging.Handler):
    """A logging handler that keeps the last ``maxlen`` formatted lines."""

    def __init__(self, maxlen: int = RECENT_LINES) -> None:
        super().__init__(level=logging.NOTSET)
        self.lines: collections.deque[str] = collections.deque(maxlen=maxlen)
        self.setFormatter(logging.Formatter(FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:
            self.handleError(record)


logger = logging.getLogger("apportion.client")

_handler: RecentLines | None = None
_lock = threading.Lock()


def keep_recent_lines() -> RecentLines:
    """Start keeping this process's ``apportion`` log lines (once; later calls reuse it)."""
    global _handler
    with _lock:
        if _handler is None:
            _handler = RecentLines()
            logging.getLogger("apportion").addHandler(_handler)
        return _handler


def line_count(n: object) -> int | None:
    """A number of log lines asked for: None (all kept) or a whole number >= 0."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise ValueError(f"the number of log lines must be a whole number >= 0 or None, got {n!r}")
    return n


def recent_lines(n: int | None = None) -> list[str]:
    """This process's last ``n`` kept log lines (all kept lines when ``n`` is None), oldest
    first; empty if the process keeps none."""
    if _handler is None:
        return []
    lines = list(_handler.lines)
    return lines if n is None else lines[-n:] if n > 0 else []


def show_task_output(
    message: dict[str, Any], stdout: TextIO | None = None, stderr: TextIO | None = None
) -> None:
    """Print what a task printed on its worker (a ``task-output`` message), each line
    prefixed with the worker's name, to this process's stdout or stderr as the task
    wrote it. ``client.forward-output: false`` turns it off."""
    if not config.get("client.forward-output", True):
        return
    prefix = f"({message.get('worker', '?')}) "
    chunks = message.get("output")
    if not isinstance(chunks, list) or not all(
        isinstance(c, list) and len(c) == 2 and isinstance(c[1], str) for c in chunks
    ):
        # Printing is a courtesy: a malformed report must not break the client's link.
        logger.warning("ignoring malformed task output for %r: %.200r", message.get("key"), chunks)
        return
    for stream, text in chunks:
        out = (stderr or sys.stderr) if stream == "stderr" else (stdout or sys.stdout)
        lines = text.splitlines(keepends=True)
        out.write(
            "".join(
                prefix + line if line.endswith("\n") else prefix + line + "\n" for line in lines
            )
        )
        out.flush()
