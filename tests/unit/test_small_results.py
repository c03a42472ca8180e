"""Small results kept by the scheduler and sent along with the tasks that take them
(scheduler/small_results.py), driven through ``Sim`` (tests/unit/sim.py)."""

from __future__ import annotations

import time

import pytest
from apportion.scheduler.model import TaskState
from apportion.scheduler.small_results import (
    ENTRY_OVERHEAD,
    MAX_MESSAGE_BYTES,
    MAX_RESULT_BYTES,
    SmallResults,
)

from apportion.serialize import Pickled
from tests.unit.sim import Sim, task


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.add_client("c")
    s.add_worker("w1")
    s.add_worker("w2")
    return s


def _compute_of(sim: Sim, key: str) -> dict:
    (message,) = [m for _, m in sim.computes if m["key"] == key]
    return message


def test_a_small_input_goes_with_its_task_and_is_not_kept_after(sim: Sim) -> None:
    sim.submit("a")
    sim.submit("b", deps=["a"])
    sim.finish("a", data=b"result of a")
    message = _compute_of(sim, "b")
    assert message["inline"] == {"a": b"result of a"}
    assert list(message["deps"]) == ["a"]  # (its holders too, should the worker lack it)
    assert sim.state.small_results.kept == {}  # its one task has it
    assert sim.state.small_results.used == 0


def test_an_input_of_several_tasks_goes_with_each_until_it_leaves_memory(sim: Sim) -> None:
    sim.submit("a")
    sim.finish("a", data=b"A")
    sim.submit_many([task("b", deps=["a"]), task("c", deps=["a"])])
    assert _compute_of(sim, "b")["inline"] == {"a": b"A"}
    assert _compute_of(sim, "c")["inline"] == {"a": b"A"}
    assert list(sim.state.small_results.kept) == [sim.state.tasks["a"]]
    sim.finish("b")
    sim.finish("c")
    sim.release("a")
    assert sim.state.small_results.kept == {} and sim.state.small_results.used == 0


def test_a_lost_result_is_not_sent_along_again(sim: Sim) -> None:
    sim.submit_many([task("a"), task("b", deps=["a"]), task("c", deps=["a"])])
    sim.finish("a", data=b"A")
    holder = next(iter(sim.state.tasks["a"].who_has)).address
    sim.remove_worker(holder)  # a was only there: made again
    assert sim.state.small_results.kept == {}
    assert all("inline" not in m for a, m in sim.computes if a != holder and m["key"] == "a")


def test_results_too_large_or_out_of_band_are_fetched_as_before(sim: Sim) -> None:
    sim.submit("big")
    sim.finish("big", data=b"x" * (MAX_RESULT_BYTES + 1))
    sim.submit("b", deps=["big"])
    assert "inline" not in _compute_of(sim, "b")
    state = SmallResults()
    state.keep(sim.state.tasks["big"], Pickled(b"header", []))
    assert state.kept == {}


def test_the_oldest_results_go_first_beyond_the_budget(sim: Sim) -> None:
    sim.state.small_results.budget = 3 * (10 + ENTRY_OVERHEAD)
    sim.submit_many([task(f"t{i}") for i in range(5)])
    for i in range(5):
        sim.finish(f"t{i}", data=b"0123456789")
    kept = [ts.key for ts in sim.state.small_results.kept]
    assert kept == ["t2", "t3", "t4"]
    assert sim.state.small_results.used == 3 * (10 + ENTRY_OVERHEAD)


def _seconds_per_new_result(kept: int, new: int) -> float:
    """CPU seconds per result kept beyond a full budget of ``kept`` results."""
    data = b"0123456789"
    results = SmallResults(budget=kept * (len(data) + ENTRY_OVERHEAD))
    tasks = [TaskState(f"t{i}", b"", b"", (), 0, 0, i) for i in range(kept + new)]
    for ts in tasks[:kept]:
        results.keep(ts, data)
    start = time.process_time()
    for ts in tasks[kept:]:
        results.keep(ts, data)  # the oldest goes for each
    return (time.process_time() - start) / new


def test_dropping_the_oldest_costs_the_same_however_many_are_kept() -> None:
    # It cost time in proportion to the results kept (20 us each with 100,000 kept).
    few = min(_seconds_per_new_result(1_000, 100_000) for _ in range(2))
    many = min(_seconds_per_new_result(100_000, 100_000) for _ in range(2))
    assert many < 4 * few, (
        f"{many * 1e6:.2f} us per result with many kept, {few * 1e6:.2f} with few"
    )


def test_a_budget_of_zero_keeps_nothing(sim: Sim) -> None:
    sim.state.small_results.budget = 0
    sim.submit("a")
    sim.finish("a", data=b"A")
    sim.submit("b", deps=["a"])
    assert "inline" not in _compute_of(sim, "b")


def test_one_message_carries_a_bounded_amount_and_the_rest_is_fetched(sim: Sim) -> None:
    n = MAX_MESSAGE_BYTES // MAX_RESULT_BYTES + 5
    sim.state.small_results.budget = 2 * n * (MAX_RESULT_BYTES + ENTRY_OVERHEAD)
    sim.submit_many([task(f"in{i}") for i in range(n)])
    for i in range(n):
        sim.finish(f"in{i}", data=b"x" * MAX_RESULT_BYTES)
    sim.submit("sum", deps=[f"in{i}" for i in range(n)])
    message = _compute_of(sim, "sum")
    assert len(message["inline"]) == MAX_MESSAGE_BYTES // MAX_RESULT_BYTES
    assert len(message["deps"]) == n
