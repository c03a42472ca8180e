"""Data in and out without a task of the user's: what ``Client.scatter`` is made of, and
``fire_and_forget``."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import Any

from apportion.futures import Future, collect_futures, wait
from apportion.serialize import dumps_value, large_pickle, tokenize
from apportion.session import Session

logger = logging.getLogger("apportion.client")


def identity(value: Any) -> Any:
    """The task of a scattered value: the value travels as its argument."""
    return value


# How long ``scatter(..., broadcast=True)`` waits for every worker to hold a copy.
BROADCAST_TIMEOUT = 60.0


def scatter_keys(data: Any) -> tuple[list[Any], list[str]]:
    """The values to scatter (a list's or a dict's items, else the one value) and their
    keys: a hash of each value, so that scattering equal data twice gives the same key."""
    if isinstance(data, dict):
        values = list(data.values())
    elif isinstance(data, (list, tuple)):
        values = list(data)
    else:
        values = [data]
    payloads = [dumps_value(v) for v in values]
    return values, [
        f"{type(v).__name__}-{tokenize(p, large=large_pickle(p))}"
        for v, p in zip(values, payloads, strict=True)
    ]


def shaped_like(data: Any, futures: list[Future]) -> Any:
    """The futures of scattered ``data`` in its shape: a list gives a list, a dict a dict
    (same keys), else one future."""
    if isinstance(data, dict):
        return dict(zip(data, futures, strict=True))
    if isinstance(data, (list, tuple)):
        return type(data)(futures)
    return futures[0]


def copy_to_every_worker(session: Session, futures: list[Future], timeout: float) -> None:
    """Return once every worker in service holds each future's value (the scheduler's
    word: workers report a copy once it is stored)."""
    deadline = time.monotonic() + timeout
    wait(futures, timeout)
    for future in futures:
        future.result()  # a value that failed to arrive raises here, not as a missing copy
    keys = [f.key for f in futures]
    while True:
        # A worker may tell this client of a result before the scheduler hears of it
        # (``pending``); copies land a fetch later (``lacking``): ask until none is missing.
        reply = session.request({"op": "replicate", "keys": keys})
        if not reply["pending"] and not reply["lacking"]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"scatter(broadcast=True): after {timeout:.0f} s, {reply['lacking']} "
                f"copies are still missing and {len(reply['pending'])} value(s) not yet held "
                "by the scheduler: are some workers short of memory, or unable to reach "
                "the worker holding the data?"
            )
        time.sleep(0.02)


class _Held:
    """Futures kept alive until their tasks are done."""

    def __init__(self) -> None:
        self._futures: dict[int, Future] = {}
        self._lock = threading.Lock()

    def add(self, future: Future) -> None:
        with self._lock:
            self._futures[id(future)] = future
        future.add_done_callback(self._done)

    def _done(self, future: Future) -> None:
        with self._lock:
            self._futures.pop(id(future), None)
        if future.status == "error":
            # Nobody waits for it: this log line is the only place its failure shows.
            where = traceback.format_tb(future.traceback()) if future.traceback() else []
            logger.error(
                "fire-and-forget task %s failed: %r\n%s",
                future.key,
                future.exception(),
                "".join(where).rstrip(),
            )


_held = _Held()


def fire_and_forget(futures: Any) -> None:
    """Let tasks run to completion even when their futures are dropped (a future, or a
    list/dict/nesting of them). The client keeps each until its task is done, then
    releases the result; closing the client still cancels what is left."""
    for future in collect_futures(futures):
        _held.add(future)
