"""The placement shortcuts (idle workers first, early stop at the load floor, one-pass
ready-queue pops) choose exactly what the plain scans choose."""

from __future__ import annotations

import random

from apportion.scheduler.model import TaskState, WorkerState
from apportion.scheduler.placement import ReadyQueues, pick_worker
from apportion.scheduler.state import SchedulerState

from apportion.resources import fits, to_shape

DEMANDS = [{}, {"GPU": 1}, {"GPU": 2}, {"MEMORY": 70}]
OFFERS = [{"GPU": 2}, {"GPU": 2}, {"MEMORY": 100}, {}]


def test_pick_worker_with_idle_and_floor_matches_a_full_scan() -> None:
    rng = random.Random(7)
    for _ in range(300):
        workers = []
        for i in range(rng.randint(1, 12)):
            nthreads = rng.randint(1, 3)
            ws = WorkerState(f"w{i}", f"w{i}", nthreads, rng.choice(OFFERS), prefetch=1)
            for run_id in range(rng.randint(0, ws.slots - 1)):
                ws.processing[run_id] = None  # type: ignore[assignment]
            for name in ws.free:
                ws.free[name] = rng.choice([0, 1, ws.total[name]])
            if not ws.processing:
                ws.free = dict(ws.total)
            workers.append(ws)
        rng.shuffle(workers)
        ts = TaskState("t", b"", b"", to_shape(rng.choice(DEMANDS)), 0, 0, 0)
        fitting = {ws for ws in workers if fits(ts.shape, ws.total)}
        idle = [ws for ws in workers if not ws.processing]
        floor = 1 / max(ws.nthreads for ws in workers)
        chosen = pick_worker(ts, fitting, workers, idle, floor)
        expected = pick_worker(ts, fitting, workers)
        if expected is None:
            assert chosen is None
        else:
            assert chosen is not None
            load = len(chosen.processing) / chosen.nthreads
            assert load == len(expected.processing) / expected.nthreads
            assert chosen in fitting and fits(ts.shape, chosen.free)


def test_pop_for_skips_stale_entries_and_drops_emptied_buckets() -> None:
    queues = ReadyQueues()
    ws = WorkerState("w", "w", 1, {"GPU": 2}, prefetch=0)
    tasks = []
    for seq, demand in enumerate([{"GPU": 1}, {}, {"GPU": 2}, {}]):
        ts = TaskState(f"t{seq}", b"", b"", to_shape(demand), 0, 0, seq)
        ts.state = "queued"
        ws.fitting_shapes.add(ts.shape)
        queues.push(ts)
        tasks.append(ts)
    tasks[0].state = "released"  # left the queue another way
    assert queues.pop_for(ws) is tasks[1]
    assert queues.pop_for(ws) is tasks[2]
    assert to_shape({"GPU": 1}) not in queues.by_shape
    assert queues.pop_for(ws) is tasks[3]
    assert queues.pop_for(ws) is None
    assert not queues.by_shape


def test_shared_sets_are_replaced_not_mutated() -> None:
    state = SchedulerState()
    state.add_client("a")
    state.add_client("b")
    state.add_worker("w1", "w1", 1, {})
    state.handle_submit("a", [{"key": "x", "func": b"", "args": b""}])
    state.handle_submit("b", [{"key": "y", "func": b"", "args": b""}])
    state.handle_submit("b", [{"key": "x", "func": b"", "args": b""}])
    x, y = state.tasks["x"], state.tasks["y"]
    assert x.who_wants == {"a", "b"}
    assert y.who_wants == {"b"}  # the shared {"b"} was not changed by x's new wanter
    state.handle_release("a", ["x"])
    assert x.who_wants == {"b"} and y.who_wants == {"b"}
    assert not state.check_invariants()
