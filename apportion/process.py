"""Running a server as a process: logging, signals, readiness and parent watch."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from tornado.ioloop import PeriodicCallback

from apportion import aio
from apportion.aio import background

# LocalCluster sets this so its children exit if it dies without cleaning up.
PARENT_PID_ENV = "APPORTION_INTERNAL_PARENT_PID"


def setup_logging(level: str | None = None) -> None:
    logging.basicConfig(
        level=(level or os.environ.get("APPORTION_LOG_LEVEL", "INFO")).upper(),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )


def announce_ready(ready_fd: int | None, details: dict[str, Any]) -> None:
    """Tell a launching process we are up: one JSON line on an inherited pipe."""
    if ready_fd is None:
        return
    try:
        os.write(ready_fd, (json.dumps(details) + "\n").encode())
        os.close(ready_fd)
    except OSError:
        pass  # the launcher stopped listening; we run on regardless


def serve(
    start: Callable[[], Awaitable[Any]],
    stop: Callable[[str], Awaitable[None]],
    finished: Callable[[], Awaitable[Any]],
    ready: Callable[[Any], dict[str, Any]],
    ready_fd: int | None = None,
) -> None:
    """Start a server, announce it, run until signalled or finished, stop, exit."""

    async def main() -> None:
        server = await start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(
                sig, lambda s=sig: background(stop(f"received {signal.Signals(s).name}"))
            )
        parent = os.environ.get(PARENT_PID_ENV)
        if parent:
            watch = PeriodicCallback(lambda: _exit_if_orphaned(int(parent), stop), 500)
            watch.start()
        announce_ready(ready_fd, ready(server))
        await finished()

    try:
        aio.run(main())
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        # Task threads cannot be interrupted; do not wait for them at exit.
        os._exit(0)


def _exit_if_orphaned(parent: int, stop: Callable[[str], Awaitable[None]]) -> None:
    if os.getppid() != parent:
        background(stop("the process that started us is gone"))
