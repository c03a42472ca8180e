"""What a worker does about its memory: pure decisions, no I/O.

As a result is stored, ``spill_goal`` answers the level to spill results down to in the
background, and ``beyond_target`` how many bytes of them must be out before the next task
starts, by their sizes. Fed with the process's resident memory (RSS), the bytes of results it holds
in memory and whether it is paused, ``decide`` (the memory monitor's, every
``worker.memory.monitor-interval``) answers how many bytes of results to spill, whether to
pause or resume, and whether to terminate; the worker (worker/server.py) measures and
carries the answer out. The thresholds are fractions of the worker's memory limit, as in
Dask (``worker.memory.*``); each may be disabled (None):

- ``target``: results held in memory beyond this are spilled, least recently used first;
- ``spill``: once the process's memory passes this, results are spilled until it is back
  under ``target`` (memory the results do not account for counts too);
- ``pause``: the worker starts no new task until its memory is back under this;
- ``terminate``: the worker exits so that its supervisor restarts it (the scheduler
  recomputes what it held).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from apportion import config


class Thresholds(NamedTuple):
    """Fractions of the memory limit (None: that step is off)."""

    target: float | None = 0.6
    spill: float | None = 0.7
    pause: float | None = 0.8
    terminate: float | None = 0.95

    @classmethod
    def from_config(cls) -> Thresholds:
        return cls(*(_fraction(config.get(f"worker.memory.{name}"), name) for name in cls._fields))


def _fraction(value: Any, name: str) -> float | None:
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(
            f"worker.memory.{name} must be a fraction of the memory limit in (0, 1] or "
            f"false, got {value!r}"
        )
    return float(value)


class Decision(NamedTuple):
    """What to do now: spill this many bytes of results, be paused or not, terminate."""

    spill: int
    paused: bool
    terminate: bool


def decide(
    limit: int | None, rss: int, managed: int, paused: bool, thresholds: Thresholds
) -> Decision:
    """What a worker whose process uses ``rss`` bytes, ``managed`` of them its results in
    memory, does now under ``limit`` (None: nothing, ever)."""
    if not limit:
        return Decision(0, False, False)
    target, spill, pause, terminate = thresholds
    if terminate is not None and rss >= terminate * limit:
        return Decision(0, paused, True)
    # The level results are spilled down to: target, else the spill threshold itself.
    floor = target if target is not None else spill
    to_spill = 0
    if target is not None and managed > target * limit:
        to_spill = managed - int(target * limit)
    if spill is not None and floor is not None and rss >= spill * limit:
        to_spill = max(to_spill, rss - int(floor * limit))
    to_spill = min(to_spill, managed)  # only results can be spilled
    now_paused = pause is not None and rss >= pause * limit
    return Decision(to_spill, now_paused, False)


def beyond_target(target_bytes: int, managed: int) -> int:
    """Bytes of results to spill as one is stored: those held in memory beyond the target
    (``target_bytes``), judged by their sizes alone, as Dask's spill buffer does; the
    process's measure is the monitor's backstop (``decide``)."""
    return max(managed - target_bytes, 0)


def spill_goal(target_bytes: int, result_bytes: int) -> int:
    """The level a stored result's spilling brings the results in memory down to, in the
    background: the target less room for one more result of the same size (at most a
    quarter of the target), so that the next run fills that room while the older result
    is written, and a task thread waits only for results beyond the target itself."""
    return target_bytes - min(max(result_bytes, 0), target_bytes // 4)


def nearly_full(limit: int | None, rss: int, thresholds: Thresholds) -> bool:
    """Whether a process using ``rss`` bytes is at its spilling level (the lower of
    ``target`` and ``spill``; ``pause`` when both are off): new results there would go to
    disk, so the scheduler places work elsewhere while another worker can take it."""
    if not limit:
        return False
    levels = [level for level in (thresholds.target, thresholds.spill) if level is not None]
    level = min(levels) if levels else thresholds.pause
    return level is not None and rss >= level * limit


def process_memory() -> int:
    """This process's resident memory in bytes (Linux /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return resident_pages * os.sysconf("SC_PAGE_SIZE")
