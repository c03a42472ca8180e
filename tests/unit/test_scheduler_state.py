"""The scheduler's state machine, driven without I/O through ``Sim`` (tests/unit/sim.py)."""

from __future__ import annotations

import pytest
from apportion.scheduler.model import TRANSITIONS

from apportion.build_info import scheduler_compiled
from apportion.errors import KilledWorkerError, NoValidWorkerError
from tests.unit.sim import FakeClock, Sim, task


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.add_client("c")
    return s


# ----------------------------------------------------------------- placement by totals
@pytest.mark.parametrize(
    ("workers", "demand", "expected"),
    [
        ({"small": {"GPU": 1}, "big": {"GPU": 4}}, {"GPU": 2}, "big"),
        ({"small": {"GPU": 1}, "big": {"GPU": 4}}, {"GPU": 4}, "big"),
        ({"cpu": {}, "gpu": {"GPU": 1}}, {"GPU": 1}, "gpu"),
        ({"a": {"A": 2}, "b": {"A": 2, "B": 1}}, {"A": 1, "B": 1}, "b"),
        ({"mem": {"MEMORY": 100e9}, "tiny": {"MEMORY": 1e9}}, {"MEMORY": 50e9}, "mem"),
        ({"frac": {"CPU": 0.5}, "one": {"CPU": 1}}, {"CPU": 0.75}, "one"),
    ],
)
def test_task_goes_only_to_a_worker_whose_totals_cover_its_demand(
    sim: Sim, workers: dict, demand: dict, expected: str
) -> None:
    for address, resources in workers.items():
        sim.add_worker(address, resources, nthreads=4)
    sim.submit("t", resources=demand)
    assert sim.computed_keys(expected) == ["t"]
    assert sim.computed_keys() == ["t"]
    assert sim.used(expected) == {**dict.fromkeys(workers[expected], 0), **demand}


def test_task_without_demand_runs_on_any_worker(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 1})
    sim.submit("t")
    assert sim.computed_keys("w") == ["t"]
    assert sim.used("w") == {"GPU": 0}


def test_compute_message_carries_run_id_demand_and_dependency_holders(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2})
    sim.submit("a")
    sim.finish("a", nbytes=100)
    sim.submit("b", deps=["a"], resources={"GPU": 1}, priority=3)
    address, msg = sim.computes[-1]
    assert address == "w"
    assert msg["key"] == "b"
    assert isinstance(msg["run_id"], int)
    assert msg["resources"] == {"GPU": 1}
    assert msg["deps"] == {"a": ["w"]}
    assert msg["priority"] == 3
    assert msg["func"] == b"func-b"


def test_run_ids_are_unique_across_workers_and_reruns(sim: Sim) -> None:
    sim.add_worker("w1")
    sim.add_worker("w2")
    sim.submit_many([task(f"t{i}", retries=1) for i in range(4)])
    for key in ["t0", "t1"]:
        sim.err(key)
    run_ids = [m["run_id"] for _, m in sim.computes]
    assert len(run_ids) == len(set(run_ids)) == 6


# ------------------------------------------------------------ free resources and slots
def test_two_resource_demand_runs_one_at_a_time_on_a_worker_with_one_unit_of_b(sim: Sim) -> None:
    sim.add_worker("w", {"A": 2, "B": 1}, nthreads=8)
    sim.submit_many([task(f"t{i}", resources={"A": 1, "B": 1}) for i in range(4)])
    for i in range(4):
        assert sim.outstanding() == [f"t{i}"]
        assert sim.used("w") == {"A": 1, "B": 1}
        sim.finish(f"t{i}")
    assert sim.outstanding() == []
    assert sim.used("w") == {"A": 0, "B": 0}
    assert set(sim.states().values()) == {"memory"}


@pytest.mark.parametrize(
    ("total", "demand", "nthreads", "concurrent"),
    [
        ({"GPU": 2}, {"GPU": 1}, 8, 2),
        ({"GPU": 4}, {"GPU": 3}, 8, 1),
        ({"GPU": 8}, {"GPU": 1}, 2, 3),  # slots = nthreads + prefetch (1)
        ({"MEMORY": 100e9}, {"MEMORY": 30e9}, 8, 3),
        ({"process": 1}, {"process": 1}, 4, 1),
        ({"CPU": 1}, {"CPU": 0.5}, 4, 2),
        ({"CPU": 1}, {"CPU": 0.25}, 4, 4),
    ],
)
def test_worker_runs_only_what_its_free_resources_and_slots_allow(
    sim: Sim, total: dict, demand: dict, nthreads: int, concurrent: int
) -> None:
    sim.add_worker("w", total, nthreads=nthreads)
    sim.submit_many([task(f"t{i}", resources=demand) for i in range(10)])
    done = 0
    while done < 10:
        running = sim.outstanding()
        assert len(running) == min(concurrent, 10 - done)
        sim.finish(running[0])
        done += 1
    assert all(v == 0 for v in sim.used("w").values())


def test_fractional_demands_that_sum_exactly_to_the_total_all_run_at_once(sim: Sim) -> None:
    sim.add_worker("w", {"CPU": 1}, nthreads=20)
    sim.submit_many([task(f"t{i}", resources={"CPU": 0.05}) for i in range(20)])
    assert len(sim.outstanding()) == 20


def test_info_counts_only_tasks_still_queued(sim: Sim) -> None:
    """The autoscaler sizes groups from these counts: a cancelled task must not count."""
    sim.add_worker("w", {"GPU": 1}, nthreads=4)
    sim.submit_many([task(k, resources={"GPU": 1}) for k in "abcd"])
    assert sim.state.info()["queued"] == [{"resources": {"GPU": 1}, "tasks": 3}]
    sim.cancel("b", "c")  # their heap entries stay until popped
    assert sim.state.info()["queued"] == [{"resources": {"GPU": 1}, "tasks": 1}]
    sim.cancel("d")
    assert sim.state.info()["queued"] == []


def test_queued_task_starts_when_resources_free_up_and_is_reported_in_info(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 1}, nthreads=4)
    sim.submit_many([task("a", resources={"GPU": 1}), task("b", resources={"GPU": 1})])
    assert sim.states() == {"a": "processing", "b": "queued"}
    assert sim.state.info()["queued"] == [{"resources": {"GPU": 1}, "tasks": 1}]
    sim.finish("a")
    assert sim.states() == {"a": "memory", "b": "processing"}


def test_a_small_task_is_not_blocked_behind_a_large_one_that_does_not_fit_now(sim: Sim) -> None:
    # The large demand holds the worker it reserved (see test_scheduler_reservations.py),
    # not the others: a smaller task starts on a worker the large one could never use.
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    sim.add_worker("w1", {"GPU": 1}, nthreads=4)
    sim.submit("a", resources={"GPU": 2})
    sim.submit("big", resources={"GPU": 2})
    sim.submit("small", resources={"GPU": 1})
    assert sim.outstanding() == ["a", "small"]
    assert sim.states()["big"] == "queued"


# ----------------------------------------------- resources released exactly once
def test_resources_released_once_when_the_run_finishes(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2})
    sim.submit("t", resources={"GPU": 2})
    assert sim.used("w") == {"GPU": 2}
    run = sim.run_of("t")
    sim.finish("t")
    assert sim.used("w") == {"GPU": 0}
    # A duplicate report of the same run changes nothing.
    sim.state.handle_task_finished(run[0], {"run_id": run[1], "nbytes": 8})
    sim.state.handle_task_erred(run[0], {"run_id": run[1], "exception": b"", "traceback": ""})
    sim.state.handle_task_released(run[0], {"run_id": run[1]})
    sim.step()
    assert sim.used("w") == {"GPU": 0}
    assert sim.states() == {"t": "memory"}


def test_resources_released_once_when_the_run_errs(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2})
    sim.submit("t", resources={"GPU": 1})
    run = sim.run_of("t")
    sim.err("t")
    assert sim.used("w") == {"GPU": 0}
    sim.state.handle_task_erred(run[0], {"run_id": run[1], "exception": b"", "traceback": ""})
    sim.step()
    assert sim.used("w") == {"GPU": 0}
    assert sim.states() == {"t": "erred"}


def test_cancelled_run_keeps_resources_until_the_worker_confirms(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 1}, nthreads=2)
    sim.submit("t", resources={"GPU": 1})
    sim.submit("next", resources={"GPU": 1})
    run = sim.run_of("t")
    sim.cancel("t")
    assert sim.cancels == {"w": [run[1]]}
    assert sim.client_ops("t") == ["task-cancelled"]
    assert "t" not in sim.state.tasks
    # The worker has not confirmed: the GPU is still taken and "next" must wait.
    assert sim.used("w") == {"GPU": 1}
    assert sim.states() == {"next": "queued"}
    sim.released("t", run=run)
    assert sim.used("w") == {"GPU": 1}
    assert sim.outstanding() == ["next"]
    # A late duplicate confirmation does not free the GPU "next" now holds.
    sim.state.handle_task_released(run[0], {"run_id": run[1]})
    sim.step()
    assert sim.used("w") == {"GPU": 1}


def test_cancelled_run_that_finishes_anyway_frees_its_result_and_resources(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 1})
    sim.submit("t", resources={"GPU": 1})
    run = sim.run_of("t")
    sim.cancel("t")
    sim.finish("t", run=run)
    assert sim.used("w") == {"GPU": 0}
    assert sim.freed == {"w": ["t"]}
    assert sim.client_ops("t") == ["task-cancelled"]


def test_cancel_also_cancels_dependents_still_to_run(sim: Sim) -> None:
    sim.add_worker("w")
    sim.submit("a")
    sim.submit("b", deps=["a"])
    sim.submit("c", deps=["b"])
    sim.cancel("a")
    assert sorted(m["key"] for m in sim.client_messages("task-cancelled")) == ["a", "b", "c"]
    sim.released("a")
    assert sim.state.tasks == {}
    assert sim.used("w") == {}


def test_worker_removal_releases_its_resources_and_reschedules_its_runs(sim: Sim) -> None:
    sim.add_worker("w1", {"GPU": 2}, nthreads=2)
    sim.submit_many([task("a", resources={"GPU": 1}), task("b", resources={"GPU": 1})])
    assert sim.computed_keys("w1") == ["a", "b"]
    sim.add_worker("w2", {"GPU": 1}, nthreads=2)
    sim.remove_worker("w1")
    assert "w1" not in sim.state.workers
    assert sim.outstanding() == ["a"]
    assert sim.states() == {"a": "processing", "b": "queued"}
    assert sim.used("w2") == {"GPU": 1}
    # A late report from the dead worker changes nothing.
    old_run = next(m["run_id"] for a, m in sim.computes if a == "w1" and m["key"] == "a")
    sim.state.handle_task_finished("w1", {"run_id": old_run, "nbytes": 1})
    sim.step()
    assert sim.states() == {"a": "processing", "b": "queued"}
    # The rerun is the key's second attempt, and says so to its worker and in its story.
    rerun = [m for a, m in sim.computes if a == "w2" and m["key"] == "a"]
    assert rerun[-1]["attempt"] == 2 and "attempt" not in sim.computes[0][1]
    reasons = [change["reason"] for change in sim.state.story("a")]
    assert reasons.count("sent to a worker (attempt 1)") == 1, reasons
    assert reasons.count("sent to a worker (attempt 2)") == 1, reasons
    sim.finish("a")
    sim.finish("b")
    assert sim.states() == {"a": "memory", "b": "memory"}
    assert sim.used("w2") == {"GPU": 0}


# ----------------------------------------------------------------------- no-worker
def test_unmeetable_demand_waits_in_no_worker_with_a_notice_naming_the_demand(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2})
    sim.submit_many([task("t1", resources={"GPU": 8}), task("t2", resources={"GPU": 8})])
    assert sim.states() == {"t1": "no-worker", "t2": "no-worker"}
    (notice,) = sim.client_messages("no-worker")
    assert notice["keys"] == ["t1", "t2"]
    assert notice["resources"] == {"GPU": 8}
    assert "GPU=8" in notice["why"]
    assert "2" in notice["why"]  # the most any worker has
    (entry,) = sim.state.info()["no_worker"]
    assert entry["resources"] == {"GPU": 8}
    assert entry["tasks"] == 2
    assert "GPU=8" in entry["why"]
    assert sim.computes == []


def test_no_worker_notice_when_no_workers_are_connected(sim: Sim) -> None:
    sim.submit("t", resources={"license": 1})
    (notice,) = sim.client_messages("no-worker")
    assert "no workers are connected" in notice["why"]
    assert "license=1" in notice["why"]


def test_no_worker_task_is_assigned_as_soon_as_a_fitting_worker_joins(sim: Sim) -> None:
    sim.add_worker("small", {"GPU": 2})
    sim.submit("t", resources={"GPU": 8})
    sim.add_worker("other", {"MEMORY": 1e9})
    assert sim.states() == {"t": "no-worker"}
    sim.add_worker("big", {"GPU": 8})
    assert sim.computed_keys("big") == ["t"]
    assert sim.state.info()["no_worker"] == []
    sim.finish("t")
    assert sim.states() == {"t": "memory"}


def test_second_client_submitting_a_no_worker_key_gets_the_notice_too(sim: Sim) -> None:
    sim.add_client("d")
    sim.submit("t", resources={"GPU": 1})
    sim.submit("t", resources={"GPU": 1}, client="d")
    assert [m["keys"] for m in sim.client_messages("no-worker", "d")] == [["t"]]


@pytest.mark.parametrize("timeout", [5, 0.5])
def test_no_worker_timeout_fails_the_task_with_no_valid_worker_error(timeout: float) -> None:
    sim = Sim({"scheduler.no-worker-timeout": timeout})
    sim.add_client("c")
    sim.add_worker("w", {"GPU": 2})
    sim.submit("t", resources={"GPU": 8})
    sim.submit("after", deps=["t"])
    assert sim.state.next_deadline() == timeout
    sim.clock.now = timeout * 0.99
    sim.state.check_timeouts()
    sim.step()
    assert sim.states()["t"] == "no-worker"
    sim.clock.now = timeout
    sim.state.check_timeouts()
    sim.step()
    assert sim.states() == {"t": "erred", "after": "erred"}
    error = sim.error_of("t")
    assert isinstance(error, NoValidWorkerError)
    assert "GPU=8" in str(error)
    assert "'t'" in str(error)
    assert isinstance(sim.error_of("after"), NoValidWorkerError)
    assert sim.state.info()["no_worker"] == []
    assert sim.state.next_deadline() is None


def test_without_a_no_worker_timeout_tasks_wait_forever(sim: Sim) -> None:
    sim.submit("t", resources={"GPU": 8})
    sim.clock.now = 1e9
    sim.state.check_timeouts()
    sim.step()
    assert sim.states() == {"t": "no-worker"}
    assert sim.state.next_deadline() is None


def test_task_leaving_no_worker_before_the_deadline_is_not_failed() -> None:
    sim = Sim({"scheduler.no-worker-timeout": 5})
    sim.add_client("c")
    sim.submit("t", resources={"GPU": 1})
    sim.clock.now = 4
    sim.add_worker("w", {"GPU": 1})
    sim.clock.now = 100
    sim.state.check_timeouts()
    sim.step()
    assert sim.states() == {"t": "processing"}


def test_queued_tasks_go_to_no_worker_when_the_last_fitting_worker_leaves() -> None:
    sim = Sim({"scheduler.no-worker-timeout": 5})
    sim.add_client("c")
    sim.add_worker("gpu", {"GPU": 1})
    sim.submit_many([task(f"t{i}", resources={"GPU": 1}) for i in range(3)])
    assert sim.states() == {"t0": "processing", "t1": "queued", "t2": "queued"}
    sim.remove_worker("gpu")
    assert sim.states() == {"t0": "no-worker", "t1": "no-worker", "t2": "no-worker"}
    sim.clock.now = 10
    sim.state.check_timeouts()
    sim.step()
    assert set(sim.states().values()) == {"erred"}


# ------------------------------------------------------------------ worker loss
def test_worker_loss_recomputes_lost_results_from_lineage(sim: Sim) -> None:
    sim.add_worker("w1")
    sim.submit("a")
    sim.submit("b", deps=["a"])
    sim.submit("c", deps=["b"])
    sim.release("a", "b")  # the client holds only c
    sim.finish("a")
    sim.finish("b")
    assert sim.states() == {"a": "released", "b": "memory", "c": "processing"}
    sim.add_worker("w2")
    sim.remove_worker("w1")
    # b lived only on w1: a, then b, then c are computed again on w2.
    assert sim.outstanding() == ["a"]
    sim.finish("a")
    assert sim.outstanding() == ["b"]
    sim.finish("b")
    assert sim.outstanding() == ["c"]
    sim.finish("c")
    assert sim.computed_keys("w2") == ["a", "b", "c"]
    assert sim.states()["c"] == "memory"
    # c was running on w1, which may have told the client of its result before dying.
    assert sim.client_ops("c") == ["task-lost", "task-finished"]


def test_worker_loss_does_not_recompute_results_held_elsewhere(sim: Sim) -> None:
    sim.add_worker("holder", {"B": 1})
    sim.add_worker("doomed", {"A": 2}, nthreads=2)
    sim.submit("x", resources={"B": 1})
    sim.finish("x")
    sim.submit("y", deps=["x"], resources={"A": 1})
    sim.submit("z", resources={"A": 1})
    assert sim.computed_keys("doomed") == ["y", "z"]
    sim.finish("z")
    sim.add_worker("rescue", {"A": 1})
    sim.remove_worker("doomed")
    assert sim.computed_keys() == ["x", "y", "z", "y"]
    assert sim.computes[-1] == ("rescue", sim.computes[-1][1])
    assert sim.computes[-1][1]["deps"] == {"x": ["holder"]}
    # z was only on the dead worker and is wanted: the client hears it is lost, and it reruns.
    assert sim.client_ops("z") == ["task-finished", "task-lost"]
    sim.finish("y")
    assert sim.computed_keys("rescue") == ["y", "z"]
    sim.finish("z")
    assert sim.states() == {"x": "memory", "y": "memory", "z": "memory"}


def test_a_run_lost_with_its_worker_is_lost_to_its_clients_before_the_worker_is_named(
    sim: Sim,
) -> None:
    """A worker tells waiting clients of a result itself, maybe before the scheduler hears
    of it; if it is lost then, a client fetching that result from it must learn the result
    is gone (and wait for it to be made again), not only that the worker left."""
    sim.add_worker("w1", {"A": 1})
    sim.add_worker("w2", {"A": 1})
    sim.submit("x", resources={"A": 1})
    (holder,) = [w for w, _ in sim.computes]
    sim.remove_worker(holder)  # x was running there, as far as the scheduler knows
    ops = [m["op"] for m in sim.to_clients["c"] if m.get("key") in ("x", None)]
    assert ops.index("task-lost") < ops.index("worker-left")


def test_a_worker_lost_is_named_to_every_worker_and_client_after_its_results(sim: Sim) -> None:
    """A lost worker may be silent, not gone: fetches from it must end. A worker that
    left as it was told to (retired) is named to nobody."""
    sim.add_worker("w1", {"A": 1})
    sim.add_worker("w2")
    sim.add_worker("w3")
    sim.submit("x", resources={"A": 1})
    sim.finish("x")
    sim.remove_worker("w1")
    assert sim.left == {"w2": ["w1"], "w3": ["w1"]}
    ops = [m["op"] for m in sim.to_clients["c"]]
    assert ops.index("task-lost") < ops.index("worker-left")  # lost, then its fetches end
    assert sim.client_messages("worker-left") == [{"op": "worker-left", "address": "w1"}]
    sim.remove_worker("w3", expected=True)
    assert sim.left == {"w2": ["w1"], "w3": ["w1"]}


def test_dependent_queued_behind_a_lost_result_waits_for_its_recomputation(sim: Sim) -> None:
    sim.add_worker("w1", {"G": 1})
    sim.submit("a", resources={"G": 1})
    sim.finish("a")
    sim.submit("blocker", resources={"G": 1})
    sim.submit("b", deps=["a"], resources={"G": 1})
    assert sim.states()["b"] == "queued"
    sim.remove_worker("w1")
    assert sim.states() == {"a": "no-worker", "blocker": "no-worker", "b": "waiting"}
    sim.add_worker("w2", {"G": 1})
    sim.finish("blocker")
    sim.finish("a")
    sim.finish("b")
    assert sim.computed_keys("w2") == ["blocker", "a", "b"]
    assert set(sim.states().values()) == {"memory"}


@pytest.mark.parametrize("allowed", [0, 1, 3])
def test_task_on_more_than_allowed_failures_dead_workers_errs_killed_worker(
    allowed: int,
) -> None:
    sim = Sim({"scheduler.allowed-failures": allowed})
    sim.add_client("c")
    for death in range(allowed + 1):
        sim.add_worker(f"w{death}")
        assert sim.states() == {"t": "processing"} or death == 0
        if death == 0:
            sim.submit("t")
        sim.remove_worker(f"w{death}")
    assert sim.states() == {"t": "erred"}
    error = sim.error_of("t")
    assert isinstance(error, KilledWorkerError)
    assert "'t'" in str(error)
    assert str(allowed + 1) in str(error)


def test_task_surviving_allowed_failures_still_finishes() -> None:
    sim = Sim({"scheduler.allowed-failures": 2})
    sim.add_client("c")
    sim.add_worker("w0")
    sim.submit("t")
    for i in range(2):
        sim.add_worker(f"w{i + 1}")
        sim.remove_worker(f"w{i}")
    sim.finish("t")
    assert sim.states() == {"t": "memory"}


def test_worker_shutting_down_gives_back_a_run_and_it_is_redone(sim: Sim) -> None:
    sim.add_worker("w1")
    sim.submit("t")
    sim.add_worker("w2")
    sim.released("t")  # not a cancel: the worker gave it back
    assert sim.states() == {"t": "processing"}
    sim.finish("t")
    assert sim.states() == {"t": "memory"}


# ------------------------------------------------------------ retries and errors
def test_failed_task_is_retried_then_errs_when_retries_run_out(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 1})
    sim.submit("t", resources={"GPU": 1}, retries=2)
    sim.err("t")
    sim.err("t")
    assert sim.states() == {"t": "processing"}
    assert sim.client_ops("t") == []
    sim.err("t", RuntimeError("third time"))
    assert sim.states() == {"t": "erred"}
    assert sim.computed_keys() == ["t", "t", "t"]
    error = sim.error_of("t")
    assert isinstance(error, RuntimeError)
    assert str(error) == "third time"
    assert sim.used("w") == {"GPU": 0}


def test_retry_that_succeeds_ends_in_memory(sim: Sim) -> None:
    sim.add_worker("w")
    sim.submit("t", retries=1)
    sim.err("t")
    sim.finish("t")
    assert sim.states() == {"t": "memory"}
    assert sim.client_ops("t") == ["task-finished"]


def test_erred_dependency_propagates_to_every_dependent(sim: Sim) -> None:
    sim.add_worker("w")
    sim.submit("a")
    sim.submit("b", deps=["a"])
    sim.submit("c", deps=["b"])
    sim.submit("d", deps=["a", "c"])
    sim.err("a", KeyError("root cause"))
    assert sim.states() == {"a": "erred", "b": "erred", "c": "erred", "d": "erred"}
    for key in "abcd":
        error = sim.error_of(key)
        assert isinstance(error, KeyError)
        assert "root cause" in str(error)


def test_submitting_onto_an_erred_dependency_errs_immediately(sim: Sim) -> None:
    sim.add_worker("w")
    sim.submit("a")
    sim.err("a")
    sim.submit("b", deps=["a"])
    assert sim.states() == {"a": "erred", "b": "erred"}
    assert sim.computed_keys() == ["a"]


def test_submit_with_an_unknown_dependency_errs_with_a_clear_message(sim: Sim) -> None:
    sim.submit("b", deps=["gone"])
    error = sim.error_of("b")
    assert isinstance(error, ValueError)
    assert "gone" in str(error)


def test_resubmitting_a_finished_key_reports_it_without_recomputing(sim: Sim) -> None:
    sim.add_client("d")
    sim.add_worker("w")
    sim.submit("t")
    sim.finish("t")
    sim.submit("t", client="d")
    assert sim.client_ops("t", "d") == ["task-finished"]
    assert sim.computed_keys() == ["t"]


# ------------------------------------------------------------------ release / forget
def test_releasing_unneeded_tasks_forgets_them(sim: Sim) -> None:
    sim.add_worker("w")
    sim.submit("a")
    sim.submit("b", deps=["a"])
    sim.finish("a")
    sim.finish("b")
    assert len(sim.state.tasks) == 2
    sim.release("b")
    assert sim.states() == {"a": "memory"}
    sim.release("a")
    assert sim.state.tasks == {}
    assert sim.state.workers["w"].has_what == set()


def test_releasing_a_result_tells_its_worker_to_free_it(sim: Sim) -> None:
    sim.add_worker("w")
    sim.submit("a")
    sim.finish("a")
    sim.release("a")
    assert sim.freed == {"w": ["a"]}


def test_intermediate_result_is_freed_once_its_dependents_are_in_memory(sim: Sim) -> None:
    sim.add_worker("w")
    sim.submit("a")
    sim.submit("b", deps=["a"])
    sim.release("a")  # the client holds only b
    sim.finish("a")
    sim.finish("b")
    assert sim.states() == {"a": "released", "b": "memory"}
    assert sim.freed == {"w": ["a"]}


@pytest.mark.skipif(
    scheduler_compiled(),
    reason="counts calls by replacing a method, which a compiled class does not allow",
)
def test_a_long_chain_released_as_it_runs_costs_the_same_at_every_step(sim: Sim) -> None:
    """Each step looks at a few tasks, not at the whole released past of the chain; the
    past is still forgotten once the last result is released."""
    sim.add_worker("w")
    n = 300
    sim.submit("k0")
    for i in range(1, n):
        sim.submit(f"k{i}", deps=[f"k{i - 1}"])
    sim.release(*(f"k{i}" for i in range(n - 1)))  # the client holds only the last
    needed = sim.state._needed
    visits = []

    def counting(ts: object) -> bool:
        visits[-1] += 1
        return needed(ts)  # type: ignore[arg-type]

    sim.state._needed = counting  # type: ignore[method-assign]
    for i in range(n):
        visits.append(0)
        sim.finish(f"k{i}")
    assert max(visits) <= 4, visits
    assert sim.states()[f"k{n - 1}"] == "memory"
    sim.release(f"k{n - 1}")
    assert sim.state.tasks == {}


def test_release_of_a_waiting_chain_forgets_it_and_cancels_the_running_root(sim: Sim) -> None:
    sim.add_worker("w")
    sim.submit("a")
    sim.submit("b", deps=["a"])
    sim.release("a", "b")
    assert sim.state.tasks == {}
    assert len(sim.cancels["w"]) == 1
    sim.released("a")
    assert sim.used("w") == {}


def test_release_by_one_client_keeps_tasks_another_client_wants(sim: Sim) -> None:
    sim.add_client("d")
    sim.add_worker("w")
    sim.submit("t")
    sim.submit("t", client="d")
    sim.finish("t")
    sim.release("t")
    assert sim.states() == {"t": "memory"}
    sim.release("t", client="d")
    assert sim.state.tasks == {}


def test_removing_a_client_releases_what_only_it_wanted(sim: Sim) -> None:
    sim.add_client("d")
    sim.add_worker("w")
    sim.submit("mine")
    sim.submit("theirs", client="d")
    sim.finish("mine")
    sim.finish("theirs")
    sim.state.remove_client("d")
    sim.step()
    assert sim.states() == {"mine": "memory"}


def test_releasing_a_no_worker_task_removes_it_from_the_no_worker_report(sim: Sim) -> None:
    sim.submit("t", resources={"GPU": 1})
    sim.release("t")
    assert sim.state.tasks == {}
    assert sim.state.info()["no_worker"] == []


# ----------------------------------------------------------------------- priority
def test_queued_tasks_start_in_priority_order_then_submission_order() -> None:
    sim = Sim({"scheduler.worker-prefetch": 0})
    sim.add_client("c")
    sim.add_worker("w")
    sim.submit("blocker")
    for key, priority in [("low", 0), ("high", 10), ("mid", 5), ("mid2", 5), ("neg", -1)]:
        sim.submit(key, priority=priority)
    order = []
    while sim.outstanding():
        (key,) = sim.outstanding()
        order.append(key)
        sim.finish(key)
    assert order == ["blocker", "high", "mid", "mid2", "low", "neg"]


def test_priority_orders_queued_tasks_across_different_demands() -> None:
    sim = Sim({"scheduler.worker-prefetch": 0})
    sim.add_client("c")
    sim.add_worker("w", {"GPU": 1, "CPU": 1})
    sim.submit("blocker", resources={"GPU": 1, "CPU": 1})
    sim.submit("cpu-low", resources={"CPU": 1}, priority=1)
    sim.submit("gpu-high", resources={"GPU": 1}, priority=2)
    sim.finish("blocker")
    assert sim.outstanding() == ["gpu-high"]


def test_priority_orders_tasks_submitted_in_one_batch() -> None:
    sim = Sim({"scheduler.worker-prefetch": 0})
    sim.add_client("c")
    sim.add_worker("w")
    sim.submit_many([task("low", priority=0), task("high", priority=10)])
    assert sim.outstanding() == ["high"]


# ---------------------------------------------------------------- worker choice
@pytest.mark.parametrize(
    ("x1_bytes", "x2_bytes", "expected"),
    [(10, 1000, "x2"), (1000, 10, "x1"), (500, 499, "x1")],
)
def test_prefers_the_worker_holding_most_dependency_bytes(
    sim: Sim, x1_bytes: int, x2_bytes: int, expected: str
) -> None:
    sim.add_worker("w1", nthreads=4)
    sim.add_worker("w2", nthreads=4)
    sim.submit("x1")
    sim.submit("x2")
    holders = {key: sim.run_of(key)[0] for key in ("x1", "x2")}
    assert sorted(holders.values()) == ["w1", "w2"]
    sim.finish("x1", nbytes=x1_bytes)
    sim.finish("x2", nbytes=x2_bytes)
    sim.submit("y", deps=["x1", "x2"])
    assert sim.computes[-1][0] == holders[expected]


def test_dependency_holder_that_lacks_the_resources_is_not_chosen(sim: Sim) -> None:
    sim.add_worker("holder", nthreads=4)
    sim.add_worker("gpu", {"GPU": 1}, nthreads=4)
    sim.submit("x", resources={})
    sim.finish("x", nbytes=10**9)
    sim.submit("y", deps=["x"], resources={"GPU": 1})
    assert sim.computes[-1][0] == "gpu"


def test_without_dependencies_the_least_loaded_fitting_worker_is_chosen(sim: Sim) -> None:
    sim.add_worker("w1", nthreads=4)
    sim.add_worker("w2", nthreads=4)
    sim.submit_many([task(f"t{i}") for i in range(4)])
    assert len(sim.computed_keys("w1")) == len(sim.computed_keys("w2")) == 2


def test_the_most_recently_idle_worker_gets_the_next_task(sim: Sim) -> None:
    for name in ("w1", "w2", "w3"):
        sim.add_worker(name)
    sim.submit("a")
    warm = sim.run_of("a")[0]
    sim.finish("a")
    sim.submit("b")  # one at a time: the worker that just ran one, still awake
    assert sim.run_of("b")[0] == warm
    sim.submit("c")
    assert sim.run_of("c")[0] != warm


# ----------------------------------------------------------------------- info
def test_info_reports_workers_resources_use_and_task_counts(sim: Sim) -> None:
    sim.add_worker("w", {"GPU": 2}, nthreads=2)
    sim.submit("a", resources={"GPU": 1})
    sim.submit("b", resources={"GPU": 8})
    info = sim.state.info()
    assert info["clients"] == 1
    assert info["tasks"] == {"processing": 1, "no-worker": 1}
    worker = info["workers"]["w"]
    assert worker["resources"] == {"GPU": 2}
    assert worker["used_resources"] == {"GPU": 1}
    assert worker["processing"] == 1
    assert worker["nthreads"] == 2


def test_info_reports_idle_seconds_and_bytes_held() -> None:
    clock = FakeClock(100.0)
    sim = Sim(clock=clock)
    sim.add_client("c")
    sim.add_worker("a")
    clock.now = 103.0
    assert sim.state.info()["workers"]["a"]["idle_seconds"] == 3.0
    sim.submit("x")
    assert sim.state.info()["workers"]["a"]["idle_seconds"] is None
    clock.now = 110.0
    sim.finish("x", nbytes=1234)
    clock.now = 112.5
    worker = sim.state.info()["workers"]["a"]
    assert (worker["idle_seconds"], worker["nbytes"]) == (2.5, 1234)


# ------------------------------------------------------------------- missing deps
def test_missing_dependency_is_recomputed_and_the_dependent_reruns(sim: Sim) -> None:
    sim.add_worker("w1", {"Y": 1})
    sim.add_worker("w2", {"X": 1})
    sim.submit("a", resources={"Y": 1})  # on w1
    sim.finish("a")
    sim.submit("b", deps=["a"], resources={"X": 1})
    address, run_id = sim.run_of("b")
    assert address == "w2"
    del sim.runs[address][run_id]
    sim.state.handle_missing_deps("w2", {"run_id": run_id, "missing": {"a": ["w1"]}})
    sim.step()
    assert sim.freed == {"w1": ["a"]}
    assert sim.client_ops("a") == ["task-finished", "task-lost"]
    assert sim.used("w2") == {"X": 0}
    sim.finish("a")
    sim.finish("b")
    assert sim.states() == {"a": "memory", "b": "memory"}


def test_missing_deps_report_for_a_cancelled_run_still_recomputes_a_wanted_dependency(
    sim: Sim,
) -> None:
    sim.add_worker("w1", {"Y": 1})
    sim.add_worker("w2", {"X": 1})
    sim.submit("a", resources={"Y": 1})  # on w1
    sim.finish("a")
    sim.submit("b", deps=["a"], resources={"X": 1})
    address, run_id = sim.run_of("b")
    sim.cancel("b")
    del sim.runs[address][run_id]
    sim.state.handle_missing_deps("w2", {"run_id": run_id, "missing": {"a": ["w1"]}})
    sim.step()
    assert sim.client_ops("a") == ["task-finished", "task-lost"]
    assert sim.states() == {"a": "processing"}


# ---------------------------------------------------------- urgency beyond the slots
def test_an_urgent_task_goes_to_a_worker_whose_prefetched_run_is_less_urgent() -> None:
    sim = Sim({"scheduler.worker-prefetch": 1})
    sim.add_client("c")
    sim.add_worker("w", nthreads=1)
    sim.submit("running")
    sim.submit("prefetched")
    assert sim.outstanding() == ["prefetched", "running"]  # both slots taken
    sim.submit("urgent", priority=5)
    # Sent too: the worker starts the most urgent of what it holds, so "urgent" runs next.
    assert sim.computed_keys("w") == ["running", "prefetched", "urgent"]
    sim.submit("as-urgent", priority=5)
    sim.submit("more-urgent", priority=9)
    assert sim.computed_keys("w")[3:] == ["as-urgent"]  # two at priority 5 fill both slots
    # It outranks those two as well, but a worker holds at most twice its slots.
    assert sim.states()["more-urgent"] == "queued"
    sim.finish("running")
    assert sim.computed_keys("w")[4:] == ["more-urgent"]
    sim.submit("ordinary")
    assert sim.states()["ordinary"] == "queued"


def test_without_prefetch_nothing_waits_on_a_worker_so_urgent_tasks_queue() -> None:
    sim = Sim({"scheduler.worker-prefetch": 0})
    sim.add_client("c")
    sim.add_worker("w", nthreads=1)
    sim.submit("running")
    sim.submit("urgent", priority=5)
    assert sim.states()["urgent"] == "queued"
    sim.finish("running")
    assert sim.outstanding() == ["urgent"]


# ------------------------------------------------------- self and duplicate dependencies
def test_a_task_depending_on_itself_errs_at_once_and_is_forgotten_on_release(sim: Sim) -> None:
    sim.add_worker("w")
    sim.submit("loop", deps=["loop"])
    assert sim.states() == {"loop": "erred"}
    assert "depends on itself" in str(sim.error_of("loop"))
    assert sim.computed_keys() == []
    sim.release("loop")
    assert sim.state.tasks == {}


def test_a_dependency_listed_twice_counts_once(sim: Sim) -> None:
    sim.add_worker("w")
    sim.submit("a")
    sim.submit("b", deps=["a", "a"])
    assert sim.states()["b"] == "waiting"
    sim.finish("a")
    assert sim.states()["b"] == "processing"
    assert sim.computes[-1][1]["deps"] == {"a": ["w"]}
    sim.finish("b")
    sim.release("a", "b")
    assert sim.state.tasks == {}


# ----------------------------------------------------------------------- replicas
def test_a_fetched_copy_is_a_holder_and_survives_the_original_holders_death(sim: Sim) -> None:
    sim.add_worker("origin", {"O": 1})
    sim.add_worker("user", {"U": 1})
    sim.submit("x", resources={"O": 1})
    sim.finish("x")
    sim.submit("y", deps=["x"], resources={"U": 1})
    sim.state.handle_data_acquired("user", {"key": "x", "replica": True})
    sim.step()
    assert sim.client_messages("who-has") == []  # its clients know a holder already
    assert {ws.address for ws in sim.state.tasks["x"].who_has} == {"origin", "user"}
    sim.remove_worker("origin")
    # Not lost: no recomputation; the client is told where the surviving copy is.
    assert sim.states() == {"x": "memory", "y": "processing"}
    assert sim.client_ops("x") == ["task-finished", "who-has"]
    assert sim.client_messages("who-has")[-1]["who_has"] == ["user"]
    sim.finish("y")
    sim.release("x", "y")
    assert sim.freed["user"] == ["x", "y"]


def test_a_copy_of_a_result_no_longer_kept_is_freed_on_arrival(sim: Sim) -> None:
    sim.add_worker("w1", {"A": 1})
    sim.add_worker("w2")
    sim.submit("x", resources={"A": 1})
    sim.finish("x")
    sim.release("x")
    sim.state.handle_data_acquired("w2", {"key": "x", "replica": True})
    sim.step()
    assert sim.freed["w2"] == ["x"]


def test_a_failed_recomputation_does_not_fail_a_run_already_under_way() -> None:
    sim = Sim({"scheduler.no-worker-timeout": 5})
    sim.add_client("c")
    sim.add_worker("origin", {"O": 1})
    sim.add_worker("user", {"U": 1})
    sim.submit("x", resources={"O": 1})
    sim.finish("x")
    sim.submit("y", deps=["x"], resources={"U": 1})
    sim.submit("z", deps=["x"], resources={"U": 1})  # waits for y's slot... and for x
    sim.release("x")
    sim.remove_worker("origin")  # y fetched x before (not yet reported): x looks lost
    assert sim.states()["x"] == "no-worker"
    sim.clock.now += 10  # type: ignore[attr-defined]
    sim.state.check_timeouts()
    sim.step()
    # x's recomputation failed: z, which still needs x, errs; y, under way, does not.
    assert sim.states()["x"] == "erred"
    assert sim.states()["z"] == "erred"
    assert sim.states()["y"] == "processing"
    sim.finish("y")
    assert sim.states()["y"] == "memory"
    assert sim.client_ops("y") == ["task-finished"]


def test_a_run_under_way_that_lacks_an_input_whose_recomputation_failed_errs_then(
    sim: Sim,
) -> None:
    sim.add_worker("origin", {"O": 1})
    sim.add_worker("user", {"U": 1})
    sim.submit("x", resources={"O": 1})
    sim.finish("x")
    sim.submit("y", deps=["x"], resources={"U": 1})
    address, run_id = sim.run_of("y")
    sim.add_worker("origin2", {"O": 1})
    sim.remove_worker("origin")
    sim.err("x", ValueError("not again"))
    assert sim.states()["y"] == "processing"
    del sim.runs[address][run_id]
    sim.state.handle_missing_deps(address, {"run_id": run_id, "missing": {"x": ["origin"]}})
    sim.step()
    assert sim.states()["y"] == "erred"
    assert "not again" in str(sim.error_of("y"))


# ------------------------------------------------------------------ transitions, story
def test_a_tasks_story_lists_its_changes_of_state_oldest_first(sim: Sim) -> None:
    sim.submit("t")
    sim.add_worker("w", {})
    sim.finish("t")
    story = sim.state.story("t")
    assert [(r["from"], r["to"]) for r in story] == [
        ("released", "no-worker"),
        ("no-worker", "released"),
        ("released", "processing"),
        ("processing", "memory"),
    ]
    assert all(r["reason"] and isinstance(r["time"], float) for r in story)
    assert [r["time"] for r in story] == sorted(r["time"] for r in story)
    assert sim.state.story("unknown") == []


def test_an_illegal_transition_is_refused_and_changes_nothing(sim: Sim) -> None:
    from apportion.errors import InvalidTransitionError

    sim.add_worker("w", {})
    sim.submit("t")
    sim.finish("t")
    ts = sim.state.tasks["t"]
    with pytest.raises(InvalidTransitionError) as caught:
        sim.state._set_state(ts, "processing", "a bug")
    assert (caught.value.key, caught.value.start, caught.value.finish) == (
        "t",
        "memory",
        "processing",
    )
    assert ts.state == "memory"
    assert not sim.state.check_invariants()


@pytest.mark.parametrize("old", sorted(TRANSITIONS))
def test_exactly_the_changes_in_the_table_are_accepted(old: str) -> None:
    """Every pair of states, so that no shortcut in _set_state lets an illegal one by."""
    from apportion.scheduler.model import TaskState
    from apportion.scheduler.state import SchedulerState

    from apportion.errors import InvalidTransitionError

    for new in sorted(TRANSITIONS):
        ts = TaskState("t", b"f", b"a", (), 0, 0, 1)
        ts.state = old  # type: ignore[assignment]
        if new in TRANSITIONS[old]:
            SchedulerState()._set_state(ts, new, "a test")  # type: ignore[arg-type]
            assert ts.state == new
        else:
            with pytest.raises(InvalidTransitionError):
                SchedulerState()._set_state(ts, new, "a test")  # type: ignore[arg-type]
            assert ts.state == old
