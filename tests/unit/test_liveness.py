"""Liveness: silent workers go, unless the silence may be the scheduler's own."""

from __future__ import annotations

from scheduler.liveness import CHECK_PERIOD, Liveness

TIMEOUT = 30.0


def _checks(liveness: Liveness, start: float, end: float, seen: dict[str, float]) -> list:
    """Check once a period from ``start`` to ``end``; every verdict that removed someone."""
    removals = []
    now = start
    while now <= end:
        verdict = liveness.check(now, TIMEOUT, seen)
        if verdict.remove:
            removals.append((now, verdict.remove))
        now += CHECK_PERIOD
    return removals


def test_one_silent_worker_among_live_ones_goes_after_the_timeout() -> None:
    liveness = Liveness()
    seen = {"a": 0.0, "b": 0.0}
    for now in range(1, 40):
        seen["b"] = float(now)  # b keeps talking
        verdict = liveness.check(float(now), TIMEOUT, seen)
        if verdict.remove:
            assert verdict.remove == ["a"] and now == 31
            return
    raise AssertionError("the silent worker was never removed")


def test_after_a_stall_of_its_own_the_scheduler_judges_no_one_and_counts_from_then() -> None:
    liveness = Liveness()
    seen = {"a": 0.0, "b": 0.0, "c": 0.0}
    assert _checks(liveness, 0.0, 5.0, seen) == []
    # Stopped for 40 s: every heartbeat since waits unread in its sockets.
    verdict = liveness.check(45.0, TIMEOUT, seen)
    assert verdict.remove == [] and verdict.note is not None and "40.0s" in verdict.note
    # They are read now: nobody goes.
    seen = dict.fromkeys(seen, 45.5)
    assert _checks(liveness, 46.0, 70.0, seen) == []


def test_silence_is_counted_from_the_end_of_the_stall_for_a_worker_that_is_really_gone() -> None:
    liveness = Liveness()
    seen = {"gone": 0.0, "alive": 0.0}
    liveness.check(0.0, TIMEOUT, seen)
    liveness.check(45.0, TIMEOUT, seen)  # a stall: counting starts again at 45
    seen["alive"] = 45.5
    removals = []
    for now in range(46, 90):
        seen["alive"] = float(now)
        verdict = liveness.check(float(now), TIMEOUT, seen)
        if verdict.remove:
            removals.append((now, verdict.remove))
    assert removals[0] == (76, ["gone"])  # (the server removes it then)


def test_when_every_worker_looks_silent_at_once_the_scheduler_waits_one_more_timeout() -> None:
    liveness = Liveness()
    seen = {"a": 0.0, "b": 0.0}
    first_silent = 31.0
    notes = []
    removals = []
    now = 1.0
    while now < 100:
        verdict = liveness.check(now, TIMEOUT, seen)
        if verdict.note:
            notes.append((now, verdict.note))
        if verdict.remove:
            removals.append((now, sorted(verdict.remove)))
            break
        now += CHECK_PERIOD
    assert notes[0][0] == first_silent and "suspecting this scheduler" in notes[0][1]
    assert removals == [(first_silent + TIMEOUT, ["a", "b"])]


def test_the_suspicion_ends_when_any_worker_is_heard_again() -> None:
    liveness = Liveness()
    seen = {"a": 0.0, "b": 0.0}
    for now in range(1, 35):
        assert liveness.check(float(now), TIMEOUT, seen).remove == []
    seen["b"] = 35.0  # b was only slow: a, silent still, goes at once
    assert liveness.check(35.0, TIMEOUT, seen).remove == ["a"]


def test_a_single_worker_is_judged_by_the_timeout_alone() -> None:
    liveness = Liveness()
    seen = {"only": 0.0}
    assert next(now for now, _ in _checks(liveness, 1.0, 40.0, seen)) == 31.0


def test_a_check_a_few_seconds_late_is_a_busy_loop_not_a_stall() -> None:
    liveness = Liveness()
    seen = {"gone": 0.0, "alive": 0.0}
    removals = []
    now = 1.0
    while now < 60:
        seen["alive"] = now
        verdict = liveness.check(now, TIMEOUT, seen)
        assert verdict.note is None
        if verdict.remove:
            removals.append(now)
        now += 5.0  # every check 4 s late: still judged
    assert removals[0] == 31.0
