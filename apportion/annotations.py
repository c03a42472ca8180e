"""``with annotate(resources=...)``: defaults for submit/map calls inside the block, and for
the Dask collections built in it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from apportion.resources import validate

KNOWN = ("resources", "priority", "retries", "timeout", "placement_group", "bundle_index")
# Those a Dask graph carries too (not the placement group: the client's own).
FORWARDED_TO_DASK = KNOWN[:4]

_current: ContextVar[dict[str, Any] | None] = ContextVar("apportion_annotations", default=None)


@contextmanager
def annotate(**annotations: Any) -> Iterator[None]:
    """Annotate every task submitted inside the block; explicit arguments still win.

    >>> with annotate(resources={"GPU": 1}):
    ...     futures = client.map(process, data)
    """
    unknown = sorted(set(annotations) - set(KNOWN))
    if unknown:
        raise TypeError(f"unknown annotation(s) {unknown}; supported: {list(KNOWN)}")
    if "resources" in annotations:
        validate(annotations["resources"])
    if "timeout" in annotations:
        check_timeout(annotations["timeout"])
    token = _current.set({**current(), **annotations})
    try:
        if "dask" in sys.modules:
            # Dask collections built in the block carry them too (see dask_graph).
            import dask

            forwarded = {k: v for k, v in annotations.items() if k in FORWARDED_TO_DASK}
            with dask.annotate(**forwarded):
                yield
        else:
            yield
    finally:
        _current.reset(token)


def current() -> dict[str, Any]:
    """The annotations in force: ours over Dask's (``dask.annotate``), where Dask is imported."""
    ours = _current.get() or {}
    dask = sys.modules.get("dask")
    theirs = dask.get_annotations() if dask is not None else None
    if not theirs:
        return ours
    return {**{k: v for k, v in theirs.items() if k in FORWARDED_TO_DASK}, **ours}


def check_timeout(timeout: Any) -> float | None:
    """A task's run timeout in seconds (None: none), or ValueError saying what is wrong."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ValueError(f"a task timeout is a number of seconds > 0, got {timeout!r}")
    if not 0 < timeout < float("inf"):
        raise ValueError(f"a task timeout is a number of seconds > 0, got {timeout!r}")
    return float(timeout)
