"""Running a server as a process: logging, signals, readiness, parent watch, exit codes.

Exit codes, for whoever restarts us (``apportion worker --nworkers``, LocalCluster, a
container runtime): 0 when stopped or finished on purpose, ``EXIT_STARTUP_FAILED`` when
the server could not start (a port in use, a refused token, no scheduler in time: a
restart would fail the same way), 1 for anything else (a crash: worth a restart).
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

from apportion import aio
from apportion.aio import background

# LocalCluster sets this so its children exit if it dies without cleaning up.
PARENT_PID_ENV = "APPORTION_INTERNAL_PARENT_PID"
LOG_LEVEL_ENV = "APPORTION_LOG_LEVEL"

EXIT_CRASHED = 1
EXIT_STARTUP_FAILED = 2

logger = logging.getLogger("apportion")


def setup_logging(level: str | None = None) -> None:
    """Log to stderr at ``level`` (default INFO, or $APPORTION_LOG_LEVEL). Records of INFO
    and above are still made when stderr shows less, because the process keeps its recent
    lines for ``client.get_*_logs()`` (apportion/logs.py)."""
    name = (level or os.environ.get(LOG_LEVEL_ENV, "INFO")).upper()
    shown = logging.getLevelName(name)
    if not isinstance(shown, int):
        raise ValueError(f"unknown log level {name!r}: use DEBUG, INFO, WARNING or ERROR")
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(shown)
    console.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(console)
    root.setLevel(min(shown, logging.INFO))


def announce_ready(ready_fd: int | None, details: dict[str, Any]) -> None:
    """Tell a launching process we are up (or why not): one JSON line on an inherited pipe."""
    if ready_fd is None:
        return
    try:
        os.write(ready_fd, (json.dumps(details) + "\n").encode())
        os.close(ready_fd)
    except OSError:
        pass  # the launcher stopped listening; we run on regardless


def read_announcement(fd: int) -> dict[str, Any]:
    """What a child wrote with announce_ready on the pipe ``fd`` (closed here), read to its
    end; {} when it wrote nothing (it died first). Blocks until the child closes the pipe."""
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        details = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {}
    return details if isinstance(details, dict) else {}


def startup_failure(exc: BaseException) -> str:
    """One line saying why a server could not start."""
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return f"{exc.strerror or exc}: another process uses that port; choose another one"
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def after_exit(returncode: int) -> str:
    """What a supervisor does when a server process exits: ``"done"`` (it stopped on
    purpose), ``"stop"`` (it cannot start: restarting would fail the same way, so give up
    and say why) or ``"restart"`` (it crashed or was killed: restart, with back-off)."""
    if returncode == 0:
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
        try:
            server = await start()
        except Exception as exc:
            reason = startup_failure(exc)
            logger.debug("%s failed to start", role, exc_info=True)
            print(f"apportion {role}: cannot start: {reason}", file=sys.stderr)
            announce_ready(ready_fd, {"error": reason})
            code = EXIT_STARTUP_FAILED
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _stop_on_signal, stop, sig)
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
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        # Task threads cannot be interrupted; do not wait for them at exit.
        os._exit(code)


def _stop_on_signal(stop: Callable[[str], Coroutine[Any, Any, None]], sig: int) -> None:
    background(stop(f"received {signal.Signals(sig).name}"))


def _exit_if_orphaned(parent: int, stop: Callable[[str], Coroutine[Any, Any, None]]) -> None:
    if os.getppid() != parent:
        background(stop("the process that started us is gone"))
