"""Reservations: a queued demand with resources holds a worker's units as they come free,
so a stream of smaller demands cannot starve it (driven through ``Sim``, no I/O)."""

from __future__ import annotations

import pytest

from tests.unit.sim import Sim


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.add_client("c")
    return s


def reserved(sim: Sim) -> dict[str, str]:
    """Worker address -> key of the task it is reserved for."""
    return {ws.address: ts.key for ws, ts in sim.state.reserved.items()}


def set_aside(sim: Sim, address: str) -> dict[str, float]:
    """The units a worker's reservation keeps from other tasks now: those of its demand
    that no run uses (the rest of the demand is still in use, counted below zero in free)."""
    ws = sim.state.workers[address]
    return {name: min(held, ws.total[name] - ws.used[name]) for name, held in ws.held.items()}


def test_a_large_demand_reserves_a_worker_and_smaller_ones_do_not_take_its_units(
    sim: Sim,
) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    sim.submit("one", resources={"GPU": 1})
    sim.submit("two", resources={"GPU": 1})
    sim.submit("big", resources={"GPU": 2})
    assert reserved(sim) == {"w": "big"}
    sim.finish("one")
    # The unit that came free is held for "big": a new one-unit task waits...
    assert sim.state.workers["w"].held == {"GPU": 2}  # its whole demand
    assert set_aside(sim, "w") == {"GPU": 1}
    assert sim.state.workers["w"].free == {"GPU": -1}  # a unit of it still in use
    sim.submit("three", resources={"GPU": 1})
    assert sim.states()["three"] == "queued"
    assert sim.outstanding() == ["two"]
    # ...and "big" starts as soon as its second unit comes free, before "three".
    sim.finish("two")
    assert sim.outstanding() == ["big"]
    assert sim.states()["three"] == "queued"
    # Its reservation ended; "three" reserves nothing (no demand is smaller than one
    # unit: nothing can take its place) and takes the units as they come free.
    assert reserved(sim) == {}
    sim.finish("big")
    assert sim.outstanding() == ["three"]
    assert reserved(sim) == {}


def test_tasks_without_resources_still_use_a_reserved_worker(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=2)
    sim.submit("one", resources={"GPU": 1})
    sim.submit("big", resources={"GPU": 2})
    sim.submit("plain")
    assert sim.outstanding() == ["one", "plain"]
    assert reserved(sim) == {"w": "big"}


def test_the_reserved_task_is_first_for_a_slot_once_its_units_are_held(sim: Sim) -> None:
    # One slot in all (nthreads 1, no prefetch): the reservation waits for the slot too.
    sim = Sim({"scheduler.worker-prefetch": 0})
    sim.add_client("c")
    sim.add_worker("w", {"GPU": 2}, nthreads=1)
    sim.submit("plain")
    sim.submit("big", resources={"GPU": 2})
    sim.submit("small", resources={"GPU": 1})  # a smaller demand: "big" reserves
    assert reserved(sim) == {"w": "big"}
    assert sim.state.workers["w"].held == {"GPU": 2}
    sim.submit("plain2")
    sim.finish("plain")
    assert sim.outstanding() == ["big"]


def test_the_reservation_goes_to_the_worker_missing_the_fewest_units(sim: Sim) -> None:
    sim.add_worker("a", {"GPU": 2}, nthreads=4)
    sim.add_worker("b", {"GPU": 2}, nthreads=4)
    sim.submit_many([{"key": k, "func": b"", "args": b"", "resources": {"GPU": 1}} for k in "pqr"])
    # One worker runs two of them, the other one (one unit free).
    full, half = sorted("ab", key=lambda address: -len(sim.computed_keys(address)))
    assert sim.used(full) == {"GPU": 2} and sim.used(half) == {"GPU": 1}
    sim.submit("big", resources={"GPU": 2})
    assert reserved(sim) == {half: "big"}
    assert set_aside(sim, half) == {"GPU": 1}
    assert sim.state.workers[half].free == {"GPU": -1}


def test_the_reservation_is_released_when_the_task_is_cancelled(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    sim.submit("one", resources={"GPU": 1})
    sim.submit("big", resources={"GPU": 2})
    assert sim.state.workers["w"].free == {"GPU": -1}
    sim.cancel("big")
    assert reserved(sim) == {}
    assert sim.state.workers["w"].held == {}
    assert sim.state.workers["w"].free == {"GPU": 1}
    sim.submit("two", resources={"GPU": 1})
    assert sim.outstanding() == ["one", "two"]


def test_a_cancelled_reservation_passes_to_the_next_queued_demand(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    sim.submit("one", resources={"GPU": 1})
    sim.submit("two", resources={"GPU": 1})
    sim.submit("big", resources={"GPU": 2})
    sim.submit("big2", resources={"GPU": 2})
    assert reserved(sim) == {"w": "big"}
    sim.cancel("big")
    assert reserved(sim) == {"w": "big2"}
    sim.finish("one")
    sim.finish("two")
    assert sim.outstanding() == ["big2"]


def test_the_reservation_moves_when_its_worker_leaves(sim: Sim) -> None:
    sim.add_worker("a", {"GPU": 2}, nthreads=4)
    sim.add_worker("b", {"GPU": 2}, nthreads=4)
    for key in ("p", "q", "r", "s"):
        sim.submit(key, resources={"GPU": 1})
    sim.submit("big", resources={"GPU": 2})
    (first,) = reserved(sim)
    sim.remove_worker(first)
    # "big" reserves the remaining worker; the lost worker's runs are queued again, ahead
    # of it (submitted before it), and take the units coming free there first.
    (second,) = {"a", "b"} - {first}
    assert reserved(sim) == {second: "big"}
    started = []
    while "big" not in sim.outstanding():
        key = sim.outstanding()[0]
        sim.finish(key)
        started.append(key)
    assert len(started) <= 4  # the four one-unit tasks submitted before it


def test_a_more_urgent_demand_takes_the_reservation_over(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    sim.submit("one", resources={"GPU": 1})
    sim.submit("two", resources={"GPU": 1})
    sim.submit("low", resources={"GPU": 2})
    sim.submit("high", resources={"GPU": 2}, priority=5)
    assert reserved(sim) == {"w": "high"}
    sim.finish("one")
    sim.finish("two")
    assert sim.outstanding() == ["high"]
    assert reserved(sim) == {"w": "low"}
    sim.finish("high")
    assert sim.outstanding() == ["low"]


def test_large_demands_of_one_priority_start_in_submission_order(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=8)
    sim.submit("one", resources={"GPU": 1})
    sim.submit("two", resources={"GPU": 1})
    for key in ("big1", "big2", "big3"):
        sim.submit(key, resources={"GPU": 2})
        sim.submit(key + "-small", resources={"GPU": 1})
    sim.finish("one")
    sim.finish("two")
    started = []
    while sim.outstanding():
        (key,) = sim.outstanding()
        started.append(key)
        sim.finish(key)
    assert [k for k in started if k.startswith("big") and "-" not in k] == [
        "big1",
        "big2",
        "big3",
    ]
    # A small task never jumps ahead of a large one submitted before it.
    for big in ("big1", "big2", "big3"):
        assert started.index(big) < started.index(big + "-small")


def test_a_steady_stream_of_one_unit_tasks_does_not_starve_a_two_unit_task(sim: Sim) -> None:
    for address in ("a", "b"):
        sim.add_worker(address, {"GPU": 2}, nthreads=4)
    n = 0

    def top_up() -> None:  # the stream: as one finishes, the next is submitted
        nonlocal n
        while len(sim.outstanding()) < 4 and n < 200:
            sim.submit(f"s{n}", resources={"GPU": 1})
            n += 1

    top_up()
    sim.submit("big", resources={"GPU": 2})
    finished_before_big = 0
    while "big" not in sim.outstanding():
        key = min(sim.outstanding(), key=lambda k: int(k[1:]))  # oldest first
        sim.finish(key)
        finished_before_big += 1
        top_up()
    # Without reservations it waits for the whole stream (200 tasks); with one, at most
    # for the four runs under way when it was submitted.
    assert finished_before_big <= 4


def test_the_smallest_demand_of_a_resource_reserves_nothing(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    for key in ("one", "two", "three"):
        sim.submit(key, resources={"GPU": 1})
    assert sim.states()["three"] == "queued"
    assert reserved(sim) == {}
    sim.finish("one")
    assert sim.outstanding() == ["three", "two"]


def test_a_newer_reservation_does_not_hold_back_an_older_small_task(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    sim.submit("one", resources={"GPU": 1})
    sim.submit("two", resources={"GPU": 1})
    sim.submit("three", resources={"GPU": 1})  # queued, reserving nothing
    sim.submit("big", resources={"GPU": 2})
    assert reserved(sim) == {"w": "big"}
    # The unit that comes free goes to "three", submitted before "big"...
    sim.finish("one")
    assert sim.outstanding() == ["three", "two"]
    assert set_aside(sim, "w") == {"GPU": 0}
    # ...and "big" holds the units after it.
    sim.submit("four", resources={"GPU": 1})
    sim.finish("two")
    assert set_aside(sim, "w") == {"GPU": 1}
    sim.finish("three")
    assert sim.outstanding() == ["big"]
    assert sim.states()["four"] == "queued"


def test_a_demand_reserves_once_a_smaller_one_of_its_resource_appears(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 4}, nthreads=4)
    for key in ("x", "y", "z"):
        sim.submit(key, resources={"GPU": 2})
    # Two units is the smallest demand so far: "z" waits without a reservation...
    assert sim.states()["z"] == "queued"
    assert reserved(sim) == {}
    # ...until one-unit tasks come, which could keep taking the units it needs.
    sim.submit("small", resources={"GPU": 1})
    assert reserved(sim) == {"w": "z"}
    sim.finish("x")
    assert sim.outstanding() == ["y", "z"]
    assert sim.states()["small"] == "queued"


def test_the_next_task_to_reserve_is_found_again_after_losing_its_reservation() -> None:
    # The search resumes after the reserved tasks it passed; a task passed over that is a
    # candidate again (its reservation taken over, or queued again) must still be found.
    from apportion.scheduler.model import TaskState, WorkerState
    from apportion.scheduler.placement import ReadyQueues

    from apportion.resources import to_shape

    shape = to_shape({"GPU": 2})
    queues = ReadyQueues()
    tasks = [TaskState(f"t{i}", b"", b"", shape, 0, 0, i + 1) for i in range(4)]
    for ts in tasks:
        ts.state = "queued"
        queues.push(ts)
    queue = queues.by_shape[shape]
    marker = WorkerState("tcp://w", "w", 1, {"GPU": 2}, 1)  # the worker reserved
    tasks[0].reserved_on = tasks[1].reserved_on = marker
    assert queue.first_unreserved() is tasks[2]
    tasks[2].reserved_on = marker
    assert queue.first_unreserved() is tasks[3]
    tasks[1].reserved_on = None
    queues.unreserved(tasks[1])
    assert queue.first_unreserved() is tasks[1]
    # A task that left the queue and comes back behind its seq is found too.
    tasks[1].reserved_on = marker
    tasks[3].reserved_on = marker
    assert queue.first_unreserved() is None
    tasks[0].state = "processing"
    assert queue.head() is tasks[1]  # the started task's entry is dropped
    again = TaskState("t0", b"", b"", shape, 0, 0, 1)
    again.state = "queued"
    queues.push(again)
    assert queue.first_unreserved() is again


def test_a_reservation_holds_the_whole_demand_while_runs_come_and_go(sim: Sim) -> None:
    # Held units are the task's whole demand from the start; free counts the units of it
    # still in use below zero, so nothing is held again as runs end (or start on lent units).
    sim.add_worker("w", {"GPU": 4}, nthreads=8)
    for key in ("one", "two", "three"):
        sim.submit(key, resources={"GPU": 1})
    sim.submit("big", resources={"GPU": 3})
    ws = sim.state.workers["w"]
    assert reserved(sim) == {"w": "big"}
    assert ws.held == {"GPU": 3} and ws.free == {"GPU": -2}
    sim.finish("one")
    assert ws.held == {"GPU": 3} and ws.free == {"GPU": -1}
    sim.submit("small", resources={"GPU": 1})  # newer than "big": it may not borrow
    assert sim.states()["small"] == "queued"
    sim.finish("two")  # none of its units in use: it starts
    assert sim.outstanding() == ["big", "three"]
    assert reserved(sim) == {} and ws.held == {} and ws.free == {"GPU": 0}
    sim.finish("three")
    assert sim.outstanding() == ["big", "small"]
    assert sim.state.check_invariants() == []


def test_a_more_urgent_small_task_borrows_the_held_units(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    sim.submit("one", resources={"GPU": 1})
    sim.submit("two", resources={"GPU": 1})
    sim.submit("big", resources={"GPU": 2})
    sim.submit("urgent", resources={"GPU": 1}, priority=5)  # outranks "big"
    assert sim.states()["urgent"] == "queued"
    sim.finish("one")
    # The unit that came free was held for "big", and lent to "urgent", which outranks it.
    assert sim.outstanding() == ["two", "urgent"]
    assert reserved(sim) == {"w": "big"}
    assert sim.state.workers["w"].free == {"GPU": -2}
    sim.finish("two")
    sim.finish("urgent")
    assert sim.outstanding() == ["big"]


def test_a_reservation_passed_to_the_same_demand_keeps_its_held_units(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    sim.submit("one", resources={"GPU": 1})
    sim.submit("big1", resources={"GPU": 2})
    sim.submit("big2", resources={"GPU": 2})
    ws = sim.state.workers["w"]
    assert reserved(sim) == {"w": "big1"}
    sim.cancel("big1")
    assert reserved(sim) == {"w": "big2"}
    assert ws.held == {"GPU": 2} and ws.free == {"GPU": -1}
    sim.submit("two", resources={"GPU": 1})
    sim.finish("one")
    assert sim.outstanding() == ["big2"]
    assert sim.states()["two"] == "queued"


def test_a_reservation_passed_to_another_demand_holds_that_demand(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 4}, nthreads=8)
    for key in ("one", "two", "three"):
        sim.submit(key, resources={"GPU": 1})
    sim.submit("big3", resources={"GPU": 3})
    sim.submit("big2", resources={"GPU": 2})
    ws = sim.state.workers["w"]
    assert reserved(sim) == {"w": "big3"} and ws.free == {"GPU": -2}
    sim.cancel("big3")
    assert reserved(sim) == {"w": "big2"}
    assert ws.held == {"GPU": 2} and ws.free == {"GPU": -1}
    sim.finish("one")
    assert sim.outstanding() == ["big2", "three", "two"]


def test_the_accounting_check_catches_a_reservation_holding_the_wrong_units(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    sim.submit("one", resources={"GPU": 1})
    sim.submit("big", resources={"GPU": 2})
    ws = sim.state.workers["w"]
    assert sim.state.check_invariants() == []
    ws.held["GPU"] = 1  # as much as is free, not the whole demand
    ws.free["GPU"] = 0
    assert any("whose demand is" in p for p in sim.state.check_invariants())
    ws.held["GPU"] = 2
    assert any("!= total - used - held" in p for p in sim.state.check_invariants())
    ws.free["GPU"] = -1
    assert sim.state.check_invariants() == []
    sim.cancel("big")
    ws.free["GPU"] = -1  # below zero with no reservation
    assert any("below zero" in p for p in sim.state.check_invariants())
