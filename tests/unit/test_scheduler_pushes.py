"""A task's input held on another worker is pushed there by its holder as the task is
sent (scheduler/pushes.py): the ``compute`` names it, one holder is told, and nothing is
pushed twice or where it is not needed."""

from __future__ import annotations

from tests.unit.sim import Sim, task

MIB = 2**20


def holder_and_other(nbytes: int = MIB) -> tuple[Sim, str, str]:
    """Two workers, one result ``x`` of ``nbytes`` on one of them (the holder)."""
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("a", {"GPU": 1})
    sim.add_worker("b", {"MEMORY": 1})
    sim.submit_many([task("x", resources={"MEMORY": 1})])
    sim.finish("x", nbytes=nbytes)
    return sim, "b", "a"


def test_the_holder_is_told_to_push_an_input_as_its_task_goes_to_another_worker() -> None:
    sim, holder, other = holder_and_other()
    sim.submit_many([task("y", ["x"], resources={"GPU": 1})])
    (address, compute) = sim.computes[-1]
    assert address == other
    assert compute["pushed"] == {"x": MIB}
    assert compute["deps"]["x"][0] == holder  # the pusher is named first
    assert sim.pushes == [(holder, {"op": "push-data", "key": "x", "to": other})]


def test_an_input_already_on_its_way_for_another_run_there_is_pushed_once() -> None:
    sim, _, other = holder_and_other()
    sim.state.workers[other].nthreads = 2
    sim.submit_many([task(f"y{i}", ["x"], resources={"GPU": 0.5}) for i in range(2)])
    assert [address for address, _ in sim.computes[-2:]] == [other, other]
    assert [("pushed" in compute) for _, compute in sim.computes[-2:]] == [True, False]
    assert len(sim.pushes) == 1


def test_an_input_held_by_the_tasks_worker_is_not_pushed() -> None:
    sim, holder, _ = holder_and_other()
    sim.submit_many([task("y", ["x"], resources={"MEMORY": 1})])
    (address, compute) = sim.computes[-1]
    assert address == holder and "pushed" not in compute and sim.pushes == []


def test_a_small_input_sent_with_the_task_is_not_pushed() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("a", {"GPU": 1})
    sim.add_worker("b", {"MEMORY": 1})
    sim.submit_many([task("x", resources={"MEMORY": 1})])
    sim.finish("x", data=b"small")
    sim.submit_many([task("y", ["x"], resources={"GPU": 1})])
    (_, compute) = sim.computes[-1]
    assert "x" in compute["inline"] and "pushed" not in compute and sim.pushes == []


def test_the_receivers_host_goes_with_the_push_for_a_shared_memory_answer() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.worker_addresses.update({"a", "b"})
    for address, resources in (("a", {"GPU": 1}), ("b", {"MEMORY": 1})):
        sim.runs[address] = {}
        sim.state.add_worker(address, address, 1, resources, info={"shared_host": "h1"})
    sim.step()
    sim.submit_many([task("x", resources={"MEMORY": 1})])
    sim.finish("x", nbytes=MIB)
    sim.submit_many([task("y", ["x"], resources={"GPU": 1})])
    assert sim.pushes == [("b", {"op": "push-data", "key": "x", "to": "a", "host": "h1"})]


def test_a_holder_leaving_service_is_not_the_pusher_where_another_holds_the_input() -> None:
    from apportion.scheduler.model import TaskState, WorkerState
    from apportion.scheduler.pushes import inputs_to_push

    workers = {name: WorkerState(name, name, 1, {}, 1) for name in ("a", "b", "c")}
    workers["b"].retiring = True
    x = TaskState("x", b"", b"", (), 0, 0, 1)
    x.nbytes = MIB
    x.who_has = frozenset({workers["b"], workers["c"]})
    y = TaskState("y", b"", b"", (), 0, 0, 2)
    y.dependencies = {x}
    shared = ["b", "c"]  # as the scheduler's cache of names hands it out
    deps = {"x": shared}
    assert inputs_to_push(y, workers["a"], deps, None, workers) == {"x": MIB}
    assert deps["x"] == ["c", "b"] and shared == ["b", "c"]  # a new list; the cache intact
    # With every holder leaving, the first still pushes (it holds the value until it goes).
    workers["c"].closing = True
    deps = {"x": ["b", "c"]}
    assert inputs_to_push(y, workers["a"], deps, None, workers) == {"x": MIB}
    assert deps["x"] == ["b", "c"]
