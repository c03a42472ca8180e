"""Functions the integration tests run on workers (pickled by value, see conftest)."""

from __future__ import annotations

import os
import time

from apportion import get_worker


def hold(seconds: float, tag: object = None) -> dict:
    """Occupy a thread for a while and report where and when that happened."""
    start = time.monotonic()
    time.sleep(seconds)  # the workload itself
    worker = get_worker()
    assert worker.task is not None
    return {
        "tag": tag,
        "worker": worker.name,
        "pid": os.getpid(),
        "start": start,
        "end": time.monotonic(),
        "resources": dict(worker.task.resources),
        "units": dict(worker.task.units),
    }


def inc(x: int) -> int:
    return x + 1


def double(x: int) -> int:
    return 2 * x


def peak_concurrency(records: list[dict], key: str = "worker") -> dict[object, int]:
    """Most records overlapping in time, per value of ``key`` (ends sort before starts)."""
    events: dict[object, list[tuple[float, int]]] = {}
    for record in records:
        events.setdefault(record[key], []).extend([(record["start"], 1), (record["end"], -1)])
    peaks = {}
    for group, changes in events.items():
        level = peak = 0
        for _, delta in sorted(changes):
            level += delta
            peak = max(peak, level)
        peaks[group] = peak
    return peaks


def peak_use(records: list[dict], resource: str) -> dict[str, float]:
    """Largest amount of ``resource`` held at once by overlapping records, per worker."""
    events: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        amount = record["resources"].get(resource, 0)
        if amount:
            events.setdefault(record["worker"], []).extend(
                [(record["start"], amount), (record["end"], -amount)]
            )
    peaks = {}
    for worker, changes in events.items():
        level = peak = 0.0
        for _, delta in sorted(changes):
            level += delta
            peak = max(peak, level)
        peaks[worker] = peak
    return peaks
