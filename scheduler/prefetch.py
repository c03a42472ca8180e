"""How many runs a worker holds beyond its threads: deeper while its runs are short.

A worker is sent ``nthreads + depth`` runs at most. One run waiting beyond each thread
(``scheduler.worker-prefetch``) hides the round trip of a report and the next task; for
runs of a few microseconds that still costs a frame each way per run. So while a worker's
runs are short the depth grows, up to ``scheduler.worker-prefetch-max`` per thread, so
that about ``QUEUED_SECONDS`` of work waits per thread: the scheduler then answers a
frame of several reports with one frame of several tasks (what is ready at once is sent
at once, without any timer). One long run brings the depth straight back down.

What waits on a worker stays bounded by time, not count: a task placed later behind the
queue waits ``QUEUED_SECONDS`` at most for its turn there (a more urgent one does not
wait at all: the worker starts the most urgent run it holds, and the scheduler sends it
beyond the slots; see ``SchedulerState._outranked_worker``). Resources are unaffected:
the scheduler books a run's resources when it sends it, so a run needing resources is
only ever sent where they are free, whatever the depth.
"""

from __future__ import annotations

from typing import Protocol

from apportion.scheduler.model import WorkerState, resize_slots

# Seconds of work a thread's queued runs add up to, at the deepest (for runs of the mean
# run time): small next to any wait a person notices, long next to a round trip.
QUEUED_SECONDS = 0.005
# Weight of the newest run in a worker's mean run time: one run 10x the mean moves the
# mean near 2x, so one long run shrinks the depth at once, while tens of short ones are
# needed to grow it again.
SMOOTHING = 0.1


def mean_after(mean: float | None, seconds: float) -> float:
    """The mean run time after one more run of ``seconds`` (exponentially weighted)."""
    if mean is None:
        return seconds
    return mean + SMOOTHING * (seconds - mean)


def wanted_depth(mean: float | None, nthreads: int, base: int, most: int) -> int:
    """Runs to hold beyond ``nthreads`` threads, for runs of ``mean`` seconds (None: none
    measured yet): ``base`` at least, ``most`` per thread at most, and otherwise enough to
    keep ``QUEUED_SECONDS`` of work waiting for each thread."""
    limit = most * nthreads
    if mean is None or limit <= base:
        return base
    if mean <= 0.0:
        return limit
    return max(base, min(limit, int(nthreads * QUEUED_SECONDS / mean)))


def next_depth(depth: int, wanted: int, open_slots: int) -> int:
    """The depth to use now: ``wanted`` when deeper, or shallower by at most the worker's
    ``open_slots`` (slots not taken by runs): runs already sent stay counted, so a worker
    never holds more runs than its slots, and it takes no new ones until it has fewer."""
    if wanted >= depth:
        return wanted
    return max(wanted, depth - max(0, open_slots))


class SlotsHost(Protocol):
    """What adapting the depth needs of the scheduler's state."""

    with_slots: dict[WorkerState, None]


def note_run(
    state: SlotsHost, ws: WorkerState, seconds: float | None, base: int, most: int
) -> None:
    """A run of ``seconds`` (None: not reported) ended on ``ws``: update its mean run time
    and its depth (and its slots, unless it takes no work now: paused, closing or
    retiring)."""
    mean = ws.run_mean
    if seconds is not None:
        mean = ws.run_mean = mean_after(mean, seconds)
    depth = next_depth(
        ws.depth, wanted_depth(mean, ws.nthreads, base, most), ws.max_slots - len(ws.processing)
    )
    if depth == ws.depth:
        return
    _set_depth(state, ws, depth)


def hold_runs(state: SlotsHost, ws: WorkerState) -> None:
    """``ws`` holds more runs than its slots (the runs a previous scheduler sent it, back
    with it after a restart): its depth grows to count them, and shrinks as they end."""
    beyond = len(ws.processing) - ws.max_slots
    if beyond > 0:
        _set_depth(state, ws, ws.depth + beyond)


def _set_depth(state: SlotsHost, ws: WorkerState, depth: int) -> None:
    resize_slots(ws, depth - ws.depth, state.with_slots)
    ws.depth = depth
