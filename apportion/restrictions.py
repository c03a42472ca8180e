"""The client's side of placement by worker: checking ``workers=`` /
``allow_other_workers=`` (the scheduler's rule is in scheduler/restrictions.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def worker_restriction(workers: str | Iterable[str], allow_other_workers: Any) -> dict[str, Any]:
    """The task fields for ``workers=`` (one name or address, or several) and
    ``allow_other_workers=``; raises a clear error for anything else."""
    if isinstance(workers, str):
        workers = [workers]
    try:
        listed = list(workers)
    except TypeError:
        raise TypeError(
            f"workers must be a worker name or address, or a list of them, got {workers!r}"
        ) from None
    bad = [w for w in listed if not isinstance(w, str) or not w]
    if bad:
        raise TypeError(
            f"workers must name workers by name or address (non-empty strings), got {bad!r} "
            f"in {listed!r}"
        )
    if not isinstance(allow_other_workers, bool):
        raise TypeError(f"allow_other_workers must be True or False, got {allow_other_workers!r}")
    if not listed:
        if allow_other_workers:
            return {}
        raise ValueError(
            "workers=[] allows no worker at all: name at least one, or leave workers out"
        )
    fields: dict[str, Any] = {"workers": sorted(set(listed))}
    if allow_other_workers:
        fields["allow_other_workers"] = True
    return fields
