"""What this process's workers fetched from their peers over TCP: how many results, their
bytes, and the seconds from each request to its reply being read.

Those seconds are the transfer as the receiving worker sees it: the holder's answer and
the bytes on the wire, without the task's round trip around it (the client's submit, the
scheduler's placement, the run, the report), which a task taking a fetched input also
pays. Results mapped from shared memory are not counted here (see
apportion/shared_memory.py for those). Read with ``client.run(fetch_counters)``.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_counters = {"fetched": 0, "fetched_bytes": 0, "fetch_seconds": 0.0}


def count_fetch(nbytes: int, seconds: float) -> None:
    """One result of ``nbytes`` received over TCP, ``seconds`` after it was asked for."""
    with _lock:
        _counters["fetched"] += 1
        _counters["fetched_bytes"] += nbytes
        _counters["fetch_seconds"] += seconds


def fetch_counters() -> dict[str, float]:
    """This process's fetches over TCP so far (a copy)."""
    with _lock:
        return dict(_counters)
