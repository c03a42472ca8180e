"""Running a server as a process: standard streams, logging, signals, readiness, parent
watch, exit codes.

Exit codes, for whoever restarts us (``apportion worker --nworkers``, LocalCluster, a
container runtime): 0 when stopped or finished on purpose, ``EXIT_STARTUP_FAILED`` when
the server could not start (a port in use, a refused token, no scheduler in time: a
restart would fail the same way), 1 for anything else (a crash: worth a restart).

A launcher that passes ``--ready-fd`` learns more than the exit code: the pipe carries one
JSON line when the server is up (or why it could not start) and, on a stop the server
made itself (a signal, a retirement), a second line ``{"stopped": reason}`` just before it
exits. An exit without that line was not the server's doing (a task called
``os._exit(0)``, say), whatever its code.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from tornado.ioloop import PeriodicCallback

from apportion import aio, config
from apportion.aio import background

# LocalCluster sets this so its children exit if it dies without cleaning up.
PARENT_PID_ENV = "APPORTION_INTERNAL_PARENT_PID"

EXIT_CRASHED = 1
EXIT_STARTUP_FAILED = 2

logger = logging.getLogger("apportion")


def setup_logging(level: str | None = None) -> None:
    """Log to stderr at ``level`` (default: the setting ``logging.level``, else INFO).
    Records of INFO and above are still made when stderr shows less, because the process
    keeps its recent lines for ``client.get_*_logs()`` (apportion/logs.py)."""
    name = str(level or config.get("logging.level") or "INFO").upper()
    shown = logging.getLevelName(name)
    if not isinstance(shown, int):
        raise ValueError(f"unknown log level {name!r}: use DEBUG, INFO, WARNING or ERROR")
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(shown)
    console.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(console)
    root.setLevel(min(shown, logging.INFO))


def keep_standard_streams_open() -> None:
    """Point any closed standard descriptor (0, 1, 2) at /dev/null, and give Python a
    stream for it.

    A process started with one of them closed would otherwise hand that number to the
    next file or socket it opens: a log line would go to a peer's socket, and the event
    loop (libuv) aborts on a socket numbered 2 or below. Called before anything is opened.
    """
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:  # the lowest free number: fd itself, unless a lower one is free
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:  # the interpreter started without it
            setattr(sys, name, open(fd, mode, closefd=False))


def announce_ready(ready_fd: int | None, details: dict[str, Any]) -> None:
    """Tell a launching process we are up (or why not): one JSON line on an inherited pipe.

    The pipe stays open to carry the stop notice (``announce_stopped``); it is kept from
    the processes that tasks start, so that a launcher reading it to its end is not held
    up by them. A standard descriptor (``--ready-fd 1``) is written to only.
    """
    if ready_fd is None:
        return
    try:
        os.write(ready_fd, (json.dumps(details) + "\n").encode())
        if ready_fd > 2:
            os.set_inheritable(ready_fd, False)
    except OSError:
        pass  # the launcher stopped listening; we run on regardless


def announce_stopped(ready_fd: int | None, reason: str) -> None:
    """Tell the launcher, just before exiting, that this stop is the server's own doing.
    Never on a standard descriptor: that is the user's output."""
    if ready_fd is None or ready_fd <= 2:
        return
    try:
        os.write(ready_fd, (json.dumps({"stopped": reason}) + "\n").encode())
    except OSError:
        pass  # the launcher closed its end after reading the first line


def read_announcements(fd: int) -> list[dict[str, Any]]:
    """Every JSON line a child wrote on the pipe ``fd`` (closed here), read to its end:
    its readiness first, then its stop notice if it stopped on purpose; [] when it wrote
    nothing. Blocks until the child closes the pipe (it exits)."""
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    announcements = []
    for line in b"".join(chunks).splitlines():
        try:
            details = json.loads(line)
        except ValueError:
            continue
        if isinstance(details, dict):
            announcements.append(details)
    return announcements


def startup_failure(exc: BaseException) -> str:
    """One line saying why a server could not start."""
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return f"{exc.strerror or exc}: another process uses that port; choose another one"
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def said_it_stopped(announcements: list[dict[str, Any]]) -> bool:
    """Whether a child's announcements (``read_announcements``) include its stop notice."""
    return any("stopped" in said for said in announcements)


def after_exit(returncode: int, stopped_on_purpose: bool = True) -> str:
    """What a supervisor does when a server process exits: ``"done"`` (it stopped on
    purpose), ``"stop"`` (it cannot start: restarting would fail the same way, so give up
    and say why) or ``"restart"`` (it crashed or was killed: restart, with back-off).

    ``stopped_on_purpose``: whether the server said so before exiting (its stop notice);
    a supervisor that reads the notice passes it, and then an exit code of 0 without the
    notice (a task called ``os._exit(0)``) is a crash like any other.
    """
    if returncode == 0 and stopped_on_purpose:
        return "done"
    if returncode == EXIT_STARTUP_FAILED:
        return "stop"
    return "restart"


def serve(
    start: Callable[[], Awaitable[Any]],
    stop: Callable[[str], Coroutine[Any, Any, None]],
    finished: Callable[[], Awaitable[Any]],
    ready: Callable[[Any], dict[str, Any]],
    ready_fd: int | None = None,
    role: str = "server",
) -> None:
    """Start a server, announce it, run until signalled or finished, stop, exit.

    A start that fails prints ``apportion ROLE: cannot start: REASON`` on stderr, tells the
    launcher the reason on ``ready_fd`` and exits with ``EXIT_STARTUP_FAILED``. When
    ``finished`` returns a string, the server failed after starting: it is printed the same
    way and the exit code is ``EXIT_CRASHED`` (worth a restart).
    """
    code = 0

    async def main() -> None:
        nonlocal code
        # Signals are taken from before the server listens: one that comes while it starts
        # (a launcher that saw the port open and stops it at once) stops it cleanly once it
        # has started, instead of killing it half-started.
        loop = asyncio.get_running_loop()
        early: list[str] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _note_signal, early, sig)
        try:
            server = await start()
        except Exception as exc:
            reason = startup_failure(exc)
            logger.debug("%s failed to start", role, exc_info=True)
            print(f"apportion {role}: cannot start: {reason}", file=sys.stderr)
            announce_ready(ready_fd, {"error": reason})
            code = EXIT_STARTUP_FAILED
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _stop_on_signal, stop, sig)
        if early:
            background(stop(early[0]))
        parent = os.environ.get(PARENT_PID_ENV)
        if parent:
            watch = PeriodicCallback(lambda: _exit_if_orphaned(int(parent), stop), 500)
            watch.start()
        announce_ready(ready_fd, ready(server))
        failure = await finished()
        if isinstance(failure, str):  # it stopped on its own, failing
            print(f"apportion {role}: stopped: {failure}", file=sys.stderr)
            code = EXIT_CRASHED

    try:
        aio.run(main())
    except BaseException:
        traceback.print_exc()
        code = EXIT_CRASHED
    finally:
        if code == 0:
            announce_stopped(ready_fd, "stopped")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        # Task threads cannot be interrupted; do not wait for them at exit.
        os._exit(code)


def _note_signal(early: list[str], sig: int) -> None:
    early.append(_received(sig))


def _received(sig: int) -> str:
    return f"received {signal.Signals(sig).name}"


def _stop_on_signal(stop: Callable[[str], Coroutine[Any, Any, None]], sig: int) -> None:
    background(stop(_received(sig)))


def _exit_if_orphaned(parent: int, stop: Callable[[str], Coroutine[Any, Any, None]]) -> None:
    if os.getppid() != parent:
        background(stop("the process that started us is gone"))
