"""Event loops, and fire-and-forget coroutines that are neither garbage-collected early nor
fail silently."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from apportion import config

logger = logging.getLogger("apportion")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where installed (unless ``comm.event-loop`` says "asyncio"): its
    I/O and cross-thread wake-ups cost less, which is most of a round trip."""
    if config.get("comm.event-loop") == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run`` on a loop from new_event_loop."""
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


_running: set[asyncio.Future[Any]] = set()


def background(coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
    task = asyncio.ensure_future(coro)
    _running.add(task)
    task.add_done_callback(_finished)
    return task


def _finished(task: asyncio.Future[Any]) -> None:
    _running.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("background task failed", exc_info=task.exception())
