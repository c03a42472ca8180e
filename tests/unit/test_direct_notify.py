"""Workers may tell waiting clients of a result themselves; the scheduler tells the rest."""

from __future__ import annotations

from tests.unit.sim import Sim


def _sim_with_two_clients_waiting() -> tuple[Sim, str, int]:
    sim = Sim()
    sim.add_client("c1")
    sim.add_client("c2")
    sim.add_worker("w", {})
    sim.submit("t", client="c1")
    sim.submit("t", client="c2")
    address, run_id = sim.run_of("t")
    return sim, address, run_id


def test_the_compute_message_names_the_clients_waiting_for_the_result() -> None:
    sim, _, _ = _sim_with_two_clients_waiting()
    assert sorted(sim.computes[-1][1]["notify"]) == ["c1"]  # c2 came after the placement
    sim.submit("u", client="c2")
    assert sim.computes[-1][1]["notify"] == ["c2"]


def test_the_scheduler_tells_only_the_clients_the_worker_did_not() -> None:
    sim, address, run_id = _sim_with_two_clients_waiting()
    del sim.runs[address][run_id]
    sim.state.handle_task_finished(address, {"run_id": run_id, "nbytes": 8, "notified": ["c1"]})
    sim.step()
    finished = {
        client: [m for m in messages if m["op"] == "task-finished"]
        for client, messages in sim.to_clients.items()
    }
    assert finished.get("c1", []) == []
    assert [m["key"] for m in finished["c2"]] == ["t"]
    assert sim.state.tasks["t"].state == "memory"


def test_a_backlogs_results_are_left_to_the_scheduler_while_more_tasks_wait() -> None:
    # A worker telling the client itself costs a frame per result on both ends; the
    # scheduler batches the results of a busy cluster for a client once per tick.
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("w", {})  # one thread, one prefetch slot: two runs at a time
    sim.submit_many([{"key": f"t{i}", "func": b"f", "args": b"a"} for i in range(4)])
    assert [message["key"] for _, message in sim.computes] == ["t0", "t1"]
    sim.finish("t0")
    sim.finish("t1")
    third, fourth = (message for _, message in sim.computes[2:])
    assert "notify" not in third  # t3 still waited when t2 was placed
    assert fourth["notify"] == ["c"]  # the last: nothing waits behind it


def test_a_result_other_tasks_take_is_told_by_the_scheduler_not_the_worker() -> None:
    """A pipeline's intermediate results: one frame from the scheduler tells the client of
    many, where each worker would send one frame per result."""
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("w", {"A": 1})
    sim.submit("blocker", resources={"A": 1})
    sim.submit("x", resources={"A": 1})  # queued behind blocker...
    sim.submit("y", deps=["x"])  # ...so that it has a dependent when placed
    sim.finish("blocker")
    (compute,) = [m for _, m in sim.computes if m["key"] == "x"]
    assert "notify" not in compute
    assert sim.computes[0][1]["notify"] == ["c"]  # (blocker: nothing takes it)
