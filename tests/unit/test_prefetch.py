"""How deep a worker's queue of runs beyond its threads grows: only while its runs are
short, never past what its resources allow, and without holding back urgent tasks."""

from __future__ import annotations

import pytest
from apportion.scheduler.prefetch import (
    QUEUED_SECONDS,
    mean_after,
    next_depth,
    wanted_depth,
)

from tests.unit.sim import Sim, task

SHORT = 20e-6  # a trivial task's run
LONG = 2.0


# ------------------------------------------------------------------ the decisions
def test_the_depth_stays_at_its_base_until_a_run_time_is_known() -> None:
    assert wanted_depth(None, nthreads=4, base=1, most=64) == 1


def test_short_runs_deepen_the_queue_up_to_the_limit_per_thread() -> None:
    assert wanted_depth(SHORT, nthreads=1, base=1, most=64) == 64
    assert wanted_depth(SHORT, nthreads=4, base=1, most=64) == 256
    assert wanted_depth(0.0, nthreads=2, base=1, most=8) == 16  # too short to measure


def test_a_few_milliseconds_of_work_wait_per_thread() -> None:
    mean = QUEUED_SECONDS / 10
    assert wanted_depth(mean, nthreads=1, base=1, most=64) == 10
    assert wanted_depth(mean, nthreads=3, base=1, most=64) == 30


def test_long_runs_keep_the_base_depth() -> None:
    assert wanted_depth(LONG, nthreads=8, base=1, most=64) == 1
    assert wanted_depth(LONG, nthreads=8, base=0, most=64) == 0


def test_a_limit_at_or_below_the_base_turns_growth_off() -> None:
    assert wanted_depth(SHORT, nthreads=1, base=2, most=0) == 2
    assert wanted_depth(SHORT, nthreads=1, base=2, most=2) == 2


def test_one_long_run_among_short_ones_brings_the_depth_back_down_at_once() -> None:
    mean = None
    for _ in range(100):
        mean = mean_after(mean, SHORT)
    assert mean == pytest.approx(SHORT)
    assert wanted_depth(mean, 1, 1, 64) == 64
    mean = mean_after(mean, LONG)
    assert wanted_depth(mean, 1, 1, 64) == 1


def test_shrinking_waits_for_the_runs_already_sent() -> None:
    assert next_depth(64, 1, open_slots=0) == 64  # all its slots taken: none given up yet
    assert next_depth(64, 1, open_slots=5) == 59
    assert next_depth(64, 1, open_slots=100) == 1
    assert next_depth(64, 1, open_slots=-3) == 64  # urgent runs beyond its slots
    assert next_depth(1, 64, open_slots=0) == 64  # growing needs no room


# ------------------------------------------------------------- the scheduler's use
def submit_n(sim: Sim, n: int, prefix: str = "t", **kw: object) -> None:
    sim.submit_many([task(f"{prefix}{i}", **kw) for i in range(n)])  # type: ignore[arg-type]


def finish_all(sim: Sim, address: str, seconds: float) -> None:
    for msg in list(sim.runs[address].values()):
        sim.finish(msg["key"], seconds=seconds)


def deepened(n: int = 100, most: int = 16) -> Sim:
    """One worker (a thread) sent ``n`` tasks, its first runs reported short."""
    sim = Sim({"scheduler.worker-prefetch": 1, "scheduler.worker-prefetch-max": most})
    sim.add_client("c")
    sim.add_worker("w", nthreads=1)
    submit_n(sim, n)
    finish_all(sim, "w", SHORT)
    return sim


def test_a_worker_running_short_tasks_is_sent_more_of_them_at_once() -> None:
    sim = Sim({"scheduler.worker-prefetch": 1, "scheduler.worker-prefetch-max": 16})
    sim.add_client("c")
    sim.add_worker("w", nthreads=1)
    submit_n(sim, 100)
    assert len(sim.runs["w"]) == 2  # a thread and one prefetched, until runs are measured
    finish_all(sim, "w", SHORT)
    assert len(sim.runs["w"]) == 1 + 16
    ws = sim.state.workers["w"]
    assert (ws.depth, ws.max_slots, ws.slots) == (16, 17, 17)


def test_a_long_run_stops_new_sends_until_the_queue_is_back_at_its_base() -> None:
    sim = deepened()
    sent = len(sim.computes)
    first, *rest = sim.runs["w"].values()
    sim.finish(first["key"], seconds=LONG)
    ws = sim.state.workers["w"]
    assert len(sim.computes) == sent  # nothing new while 16 runs wait there
    assert ws.max_slots == len(ws.processing) == 16  # shrinking as its runs end
    for msg in rest[:-2]:
        sim.finish(msg["key"], seconds=LONG)
    assert len(sim.computes) == sent
    assert (ws.depth, len(ws.processing)) == (1, 2)  # back at its base, its slots full
    sim.finish(rest[-2]["key"], seconds=LONG)
    assert len(sim.computes) == sent + 1  # one at a time again: its thread and one waiting
    assert len(ws.processing) == 2


def test_tasks_needing_resources_go_only_where_they_are_free_however_deep() -> None:
    sim = Sim({"scheduler.worker-prefetch": 1, "scheduler.worker-prefetch-max": 64})
    sim.add_client("c")
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    submit_n(sim, 50, resources={"GPU": 1})
    for _ in range(20):
        assert len(sim.runs["w"]) == 2  # two GPUs: two runs, however short
        finish_all(sim, "w", SHORT)
    assert sim.state.workers["w"].depth == 64 * 4


def test_an_urgent_task_is_not_held_behind_a_deep_queue() -> None:
    sim = deepened()
    assert len(sim.runs["w"]) == 17
    sim.submit("urgent", priority=5)
    # Sent beyond the slots: the worker starts the most urgent run it holds next.
    assert sim.computed_keys("w")[-1] == "urgent"


def test_a_lost_workers_queue_runs_elsewhere() -> None:
    sim = Sim({"scheduler.worker-prefetch": 1, "scheduler.worker-prefetch-max": 16})
    sim.add_client("c")
    sim.add_worker("a", nthreads=1)
    submit_n(sim, 60)
    finish_all(sim, "a", SHORT)
    queued = sorted(msg["key"] for msg in sim.runs["a"].values())
    assert len(queued) == 17
    sim.remove_worker("a")
    sim.add_worker("b", nthreads=1)
    while sim.runs["b"]:
        finish_all(sim, "b", SHORT)
    assert set(queued) <= set(sim.computed_keys("b"))  # run again there
    assert set(sim.states().values()) == {"memory"}


def test_a_paused_worker_takes_no_work_whatever_its_depth() -> None:
    sim = Sim({"scheduler.worker-prefetch": 1, "scheduler.worker-prefetch-max": 16})
    sim.add_client("c")
    sim.add_worker("w", nthreads=1)
    submit_n(sim, 100)
    sim.state.handle_worker_status("w", {"op": "worker-status", "status": "paused"})
    sim.step()
    finish_all(sim, "w", SHORT)  # the runs it had end; deeper, but paused
    ws = sim.state.workers["w"]
    assert (ws.slots, len(ws.processing)) == (0, 0)
    assert ws.max_slots > 2
    sim.state.handle_worker_status("w", {"op": "worker-status", "status": "running"})
    sim.step()
    assert len(sim.runs["w"]) == ws.max_slots


def test_growth_can_be_turned_off() -> None:
    sim = Sim({"scheduler.worker-prefetch": 1, "scheduler.worker-prefetch-max": 0})
    sim.add_client("c")
    sim.add_worker("w", nthreads=1)
    submit_n(sim, 50)
    for _ in range(10):
        finish_all(sim, "w", SHORT)
        assert len(sim.runs["w"]) == 2
