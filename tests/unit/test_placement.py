"""Pure placement helpers: ready queues, worker choice, and why no worker fits."""

from __future__ import annotations

import pytest
from apportion.scheduler.model import TaskState, WorkerState
from apportion.scheduler.placement import (
    LOCALITY_BYTES,
    LocalQueues,
    ReadyQueues,
    can_start,
    explain_no_worker,
    locality_holder,
    pick_worker,
)

from apportion.resources import to_shape


def worker(name: str, resources: dict | None = None, nthreads: int = 1) -> WorkerState:
    ws = WorkerState(name, name, nthreads, dict(resources or {}), prefetch=0)
    return ws


def queued(key: str, demand: dict | None = None, priority: int = 0, seq: int = 0) -> TaskState:
    ts = TaskState(key, b"", b"", to_shape(demand), priority, 0, seq)
    ts.state = "queued"
    return ts


@pytest.mark.parametrize(
    ("demand", "workers", "texts"),
    [
        ({"GPU": 8}, [], ["no workers are connected", "GPU=8"]),
        ({"GPU": 8}, [{"GPU": 2}, {"GPU": 4}], ["GPU=8", "the most any worker has is 4"]),
        ({"license": 1}, [{"GPU": 2}], ["license=1", "no worker has any"]),
        ({"GPU": 1, "MEMORY": 1e12}, [{"GPU": 2, "MEMORY": 1e9}], ["MEMORY", "needed"]),
    ],
)
def test_explain_no_worker_names_the_demand_and_the_largest_offer(
    demand: dict, workers: list[dict], texts: list[str]
) -> None:
    why = explain_no_worker(to_shape(demand), [worker(f"w{i}", r) for i, r in enumerate(workers)])
    for text in texts:
        assert text in why


def test_explanation_does_not_blame_resources_that_are_available() -> None:
    why = explain_no_worker(to_shape({"GPU": 1, "MEMORY": 1e12}), [worker("w", {"GPU": 2})])
    assert "GPU=1 needed" not in why


def test_ready_queue_pops_by_priority_then_submission_across_shapes() -> None:
    ws = worker("w", {"GPU": 2, "CPU": 2}, nthreads=8)
    queues = ReadyQueues()
    tasks = [
        queued("a", {"GPU": 1}, priority=0, seq=0),
        queued("b", {"CPU": 1}, priority=1, seq=1),
        queued("c", {"GPU": 1}, priority=1, seq=2),
        queued("d", None, priority=-1, seq=3),
    ]
    for ts in tasks:
        queues.push(ts)
        ws.fitting_shapes.add(ts.shape)
    order = []
    while (ts := queues.pop_for(ws)) is not None:
        order.append(ts.key)
        ts.state = "processing"
    assert order == ["b", "c", "a", "d"]


def test_a_worker_sees_queues_that_appear_after_it_last_asked() -> None:
    """Each worker's list of the queues it fits is cached: a shape queued for the first
    time, a shape the worker newly fits, and a queue emptied and filled again all count."""
    ws = worker("w", {"GPU": 2})
    queues = ReadyQueues()
    queues.push(queued("plain", seq=0))
    assert queues.pop_for(ws).key == "plain"  # type: ignore[union-attr]
    assert queues.pop_for(ws) is None  # the plain queue emptied and was dropped
    gpu = queued("gpu", {"GPU": 1}, seq=1)
    queues.push(gpu)
    assert queues.pop_for(ws) is None  # not yet among the shapes it fits
    ws.fitting_shapes.add(gpu.shape)
    assert queues.pop_for(ws) is gpu
    queues.push(queued("again", seq=2))
    assert queues.pop_for(ws).key == "again"  # type: ignore[union-attr]
    assert queues.pop_for(ws) is None
    assert queues.by_shape == {}  # emptied queues go once a pop finds them empty


def test_ready_queue_skips_shapes_the_worker_cannot_fit_now_or_ever() -> None:
    ws = worker("w", {"GPU": 1})
    queues = ReadyQueues()
    big = queued("big", {"GPU": 2}, priority=9)
    small = queued("small", {"GPU": 1})
    for ts in (big, small):
        queues.push(ts)
    ws.fitting_shapes.add(small.shape)
    assert queues.pop_for(ws) is small
    assert queues.pop_for(ws) is None


def test_ready_queue_drops_stale_entries_lazily() -> None:
    ws = worker("w", nthreads=4)
    queues = ReadyQueues()
    gone = queued("gone", seq=0)
    requeued = queued("again", seq=1)
    for ts in (gone, requeued):
        queues.push(ts)
        ws.fitting_shapes.add(ts.shape)
    gone.state = "released"  # left the queue another way
    queues.push(requeued)  # queued twice: only the newest entry is live
    assert queues.pop_for(ws) is requeued
    requeued.state = "processing"
    assert queues.pop_for(ws) is None
    assert queues.by_shape == {}


def _pop_all(queues: ReadyQueues, ws: WorkerState) -> list[str]:
    order = []
    while (ts := queues.pop_for(ws)) is not None:
        order.append(ts.key)
        ts.state = "processing"
    return order


def test_ready_queue_serves_a_more_urgent_lane_that_opens_later_first() -> None:
    ws = worker("w", nthreads=8)
    queues = ReadyQueues()
    tasks = [
        queued("low-1", priority=0, seq=0),
        queued("low-2", priority=0, seq=1),
        queued("high", priority=5, seq=2),  # opens a lane above the current top
        queued("lowest", priority=-3, seq=3),
        queued("high-2", priority=5, seq=4),
    ]
    for ts in tasks:
        queues.push(ts)
        ws.fitting_shapes.add(ts.shape)
    assert _pop_all(queues, ws) == ["high", "high-2", "low-1", "low-2", "lowest"]
    assert queues.by_shape == {}


def test_ready_queue_puts_a_requeued_task_back_at_its_submission_place() -> None:
    ws = worker("w", nthreads=8)
    queues = ReadyQueues()
    first, second, third = (queued(k, seq=i) for i, k in enumerate(["first", "second", "third"]))
    for ts in (first, second, third):
        queues.push(ts)
        ws.fitting_shapes.add(ts.shape)
    assert queues.pop_for(ws) is first
    first.state = "queued"  # its worker died: it goes back, ahead of newer tasks
    queues.push(first)
    assert _pop_all(queues, ws) == ["first", "second", "third"]


def test_ready_queue_counts_and_drains_a_task_queued_twice_once() -> None:
    queues = ReadyQueues()
    ts, other = queued("t", seq=0), queued("u", seq=1)
    queues.push(ts)
    queues.push(other)
    ts.state = "waiting"  # left the queue another way (a dependency was lost) ...
    ts.state = "queued"  # ... and came back before its old entry was reached
    queues.push(ts)
    assert queues.counts() == {to_shape(None): 2}
    assert queues.drain(to_shape(None)) == [ts, other]
    assert queues.by_shape == {}


def test_ready_queue_with_a_priority_per_task_pops_in_priority_order() -> None:
    ws = worker("w", nthreads=8)
    queues = ReadyQueues()
    priorities = [(i * 7919) % 101 - 50 for i in range(200)]  # 101 distinct, shuffled
    for seq, priority in enumerate(priorities):
        ts = queued(f"t{seq}", priority=priority, seq=seq)
        queues.push(ts)
        ws.fitting_shapes.add(ts.shape)
    expected = [f"t{seq}" for seq in sorted(range(200), key=lambda s: (-priorities[s], s))]
    assert _pop_all(queues, ws) == expected


@pytest.mark.parametrize(
    ("running", "total", "demand", "expected"),
    [
        (0, {"GPU": 1}, {"GPU": 1}, True),
        (1, {"GPU": 1}, {}, False),  # one thread, no prefetch: no free slot
        (0, {"GPU": 1}, {"GPU": 2}, False),
    ],
)
def test_can_start_needs_a_free_slot_and_free_resources(
    running: int, total: dict, demand: dict, expected: bool
) -> None:
    ws = worker("w", total)
    for i in range(running):
        ws.processing[i] = queued(f"r{i}")
    assert can_start(ws, to_shape(demand)) is expected


def test_pick_worker_prefers_least_loaded_fitting_worker() -> None:
    busy, idle, unfit = worker("busy", nthreads=2), worker("idle", nthreads=2), worker("x")
    busy.processing[1] = queued("r")
    ts = queued("t")
    assert pick_worker(ts, {busy, idle}, [busy, idle, unfit]) is idle
    assert pick_worker(ts, {busy}, [busy, idle]) is busy
    assert pick_worker(ts, set(), [busy, idle]) is None


def _holding(ts: TaskState, holder: WorkerState, nbytes: int) -> None:
    dep = queued(f"dep-of-{ts.key}")
    dep.nbytes = nbytes
    dep.who_has = frozenset({holder})
    ts.dependencies = [dep]


def test_an_idle_worker_beats_a_busy_holder_of_small_dependencies() -> None:
    # Every Dask task depends on its graph's chunk task: two independent tasks must not
    # queue on the one worker holding that small chunk while others stand idle.
    holder = WorkerState("holder", "holder", 1, {}, prefetch=1)
    holder.processing[1] = queued("running")
    idle = worker("idle")
    ts = queued("t")
    _holding(ts, holder, 1000)
    assert can_start(holder, ts.shape)  # it has a prefetch slot
    assert pick_worker(ts, {holder, idle}, [holder, idle], idle=[idle]) is idle
    assert pick_worker(ts, {holder, idle}, [holder, idle]) is idle


def test_a_holder_with_a_free_thread_or_large_dependencies_keeps_the_task() -> None:
    holder = WorkerState("holder", "holder", 2, {}, prefetch=1)
    holder.processing[1] = queued("running")
    idle = worker("idle")
    ts = queued("t")
    _holding(ts, holder, 1000)
    assert pick_worker(ts, {holder, idle}, [holder, idle], idle=[idle]) is holder
    holder.processing[2] = queued("running-too")  # both threads busy now
    _holding(ts, holder, LOCALITY_BYTES)
    assert pick_worker(ts, {holder, idle}, [holder, idle], idle=[idle]) is holder


def test_a_busy_holder_is_still_chosen_when_no_other_worker_fits() -> None:
    holder = WorkerState("holder", "holder", 1, {"GPU": 1}, prefetch=1)
    holder.processing[1] = queued("running")
    other = worker("other")
    ts = queued("t", {"GPU": 1})
    _holding(ts, holder, 1000)
    assert pick_worker(ts, {holder}, [holder, other], idle=[other]) is holder


def test_a_worker_at_its_spilling_level_is_chosen_only_when_no_other_fits() -> None:
    full, roomy = worker("full", nthreads=2), worker("roomy", nthreads=2)
    full.nearly_full = True
    roomy.processing[1] = queued("running")  # busier than the full one, still preferred
    ts = queued("t")
    assert pick_worker(ts, {full, roomy}, [full, roomy]) is roomy
    assert pick_worker(ts, {full, roomy}, [full, roomy], idle=[full]) is roomy
    assert pick_worker(ts, {full}, [full, roomy], idle=[full]) is full
    roomy.processing[2] = queued("running-too")  # its resources still fit: slots are
    assert pick_worker(ts, {full, roomy}, [full, roomy]) is roomy  # what with_slots says
    assert pick_worker(ts, {full, roomy}, [full]) is full  # roomy has no free slot


def test_a_full_holder_of_small_inputs_gives_the_task_up_not_one_of_large_inputs() -> None:
    holder, other = worker("holder", nthreads=2), worker("other", nthreads=2)
    holder.nearly_full = True
    ts = queued("t")
    _holding(ts, holder, 1000)
    assert pick_worker(ts, {holder, other}, [holder, other]) is other
    # Moving large inputs would add their copy to another worker's memory: they stay.
    _holding(ts, holder, LOCALITY_BYTES)
    assert pick_worker(ts, {holder, other}, [holder, other]) is holder


def _inputs(*held: tuple[int, WorkerState]) -> TaskState:
    """A task whose inputs are of these sizes, each on its worker."""
    ts = queued("t")
    ts.dependencies = [queued(f"input-{i}") for i in range(len(held))]
    for dep, (nbytes, holder) in zip(ts.dependencies, held, strict=True):
        dep.nbytes, dep.who_has = nbytes, frozenset({holder})
    return ts


def test_locality_holder_is_the_worker_holding_most_input_bytes_past_the_threshold() -> None:
    a, b = worker("a"), worker("b")
    ts = _inputs((10, a), (100, b))
    assert locality_holder(ts, {a, b}, 100) == (b, 100)
    assert locality_holder(ts, {a, b}, 101) is None  # 110 in all, but no worker has 101
    assert locality_holder(ts, {a, b}, 200) is None


def test_locality_holder_skips_a_worker_that_cannot_take_the_task() -> None:
    a, b = worker("a"), worker("b")
    ts = _inputs((200, a), (150, b))
    assert locality_holder(ts, {a, b}, 100) == (a, 200)
    a.slots = 0  # paused or retiring
    assert locality_holder(ts, {a, b}, 100) == (b, 150)
    assert locality_holder(ts, {a}, 100) is None  # b does not fit its demand


def test_local_queues_pop_by_priority_then_submission_and_drop_stale_entries() -> None:
    ws = worker("w")
    local = LocalQueues()
    first, urgent, gone = (
        queued("first", seq=1),
        queued("urgent", priority=1, seq=3),
        queued("gone", seq=0),
    )
    for ts in (first, urgent, gone):
        local.push(ts, ws, deadline=10.0)
    gone.state = "released"
    assert local.pop(ws) is urgent
    urgent.state = "processing"
    urgent.attempt += 1
    assert local.head(ws) is first
    local.push(first, ws, deadline=20.0)  # queued twice: taken once
    assert local.pop(ws) is first
    first.attempt += 1  # placed
    assert local.pop(ws) is None and ws.local == []
    assert local.next_deadline() is None


def test_local_queues_give_up_tasks_at_their_deadline() -> None:
    ws = worker("w")
    local = LocalQueues()
    soon, later = queued("soon", seq=1), queued("later", seq=2)
    local.push(soon, ws, deadline=1.0)
    local.push(later, ws, deadline=2.0)
    assert local.next_deadline() == 1.0
    assert local.expired(0.5) == []
    assert local.expired(1.0) == [soon]
    assert local.next_deadline() == 2.0
    assert local.head(ws) is soon  # still there too: its holder may take it first
    assert local.take_all(ws) == [soon, later] and ws.local == []
