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


# ------------------------------------------------------------- pushed ahead
def gpu_worker_and_inputs(n: int, nbytes: int = MIB) -> Sim:
    """A worker "a" of one GPU, and ``n`` results x0.. of ``nbytes`` on worker "b"."""
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("a", {"GPU": 1})
    sim.add_worker("b", {"MEMORY": 1})
    sim.submit_many([task(f"x{i}", resources={"MEMORY": 1}) for i in range(n)])
    for i in range(n):
        sim.finish(f"x{i}", nbytes=nbytes)
    return sim


def pushed_keys(sim: Sim) -> list[str]:
    return [message["key"] for _, message in sim.pushes]


def test_the_inputs_of_the_next_tasks_are_pushed_while_the_one_before_runs() -> None:
    sim = gpu_worker_and_inputs(4)
    sim.submit_many([task(f"y{i}", [f"x{i}"], resources={"GPU": 1}) for i in range(4)])
    assert pushed_keys(sim) == ["x0"]  # with y0; the others queued behind it
    sim.finish("y0")
    assert sim.computes[-1][1]["key"] == "y1"
    # y1's input as it goes, and the next two tasks' inputs ahead of them.
    assert pushed_keys(sim) == ["x0", "x1", "x2", "x3"]
    assert {address for address, _ in sim.pushes} == {"b"}
    assert {message["to"] for _, message in sim.pushes} == {"a"}


def test_a_task_whose_input_was_pushed_ahead_awaits_that_push_and_no_second_is_sent() -> None:
    sim = gpu_worker_and_inputs(4)
    sim.submit_many([task(f"y{i}", [f"x{i}"], resources={"GPU": 1}) for i in range(4)])
    sim.finish("y0")  # x2 and x3 pushed ahead
    sim.state.handle_data_acquired("a", {"key": "x2", "replica": True})  # x2 came
    sim.step()
    sim.finish("y1")
    (address, compute) = sim.computes[-1]
    assert address == "a" and compute["key"] == "y2"
    assert "pushed" not in compute  # held there already
    sim.finish("y2")
    (address, compute) = sim.computes[-1]
    assert address == "a" and compute["key"] == "y3"
    assert compute["pushed"] == {"x3": MIB}  # still on its way: awaited, from its pusher
    assert compute["deps"]["x3"][0] == "b"
    assert pushed_keys(sim).count("x3") == 1


def test_a_copy_pushed_ahead_is_kept_while_its_task_is_next_there() -> None:
    sim = gpu_worker_and_inputs(3)
    sim.submit_many([task(f"y{i}", [f"x{i}"], resources={"GPU": 1}) for i in range(3)])
    sim.finish("y0")  # x2 pushed ahead
    sim.state.handle_data_acquired("a", {"key": "x2", "replica": True})
    sim.step()
    sim.finish("y1")  # copies no task there needs are dropped as a run ends
    assert "x2" not in sim.freed.get("a", [])
    assert sim.computes[-1][1]["key"] == "y2"
    sim.finish("y2")
    assert "x2" in sim.freed["a"]  # needed by none there now, and b holds it too


def test_small_inputs_and_paused_workers_get_nothing_ahead() -> None:
    sim = gpu_worker_and_inputs(3, nbytes=MIB // 2)
    sim.submit_many([task(f"y{i}", [f"x{i}"], resources={"GPU": 1}) for i in range(3)])
    sim.finish("y0")
    assert pushed_keys(sim) == ["x0", "x1"]  # each with its task only
    sim = gpu_worker_and_inputs(3)
    sim.submit_many([task(f"y{i}", [f"x{i}"], resources={"GPU": 1}) for i in range(3)])
    sim.state.workers["a"].nearly_full = True  # past its spilling level
    sim.finish("y0")
    assert pushed_keys(sim) == ["x0", "x1"]


def test_tasks_cancelled_in_the_queue_while_another_runs_leave_placement_sound() -> None:
    # Looking ahead in a queue whose tasks all went (cancelled) emptied it; the next
    # placement then failed on it (KeyError), and the scheduler closed the worker.
    sim = gpu_worker_and_inputs(4)
    sim.submit_many([task(f"y{i}", [f"x{i}"], resources={"GPU": 1}) for i in range(4)])
    sim.cancel("y2", "y3")
    sim.finish("y0")  # y1 goes, looking ahead at the cancelled ones: none is live
    sim.submit_many([task("z", ["x0"], resources={"GPU": 1})])
    sim.finish("y1")
    assert sim.computes[-1][1]["key"] == "z"


def test_a_push_ahead_that_never_came_is_sent_again_not_awaited() -> None:
    sim = gpu_worker_and_inputs(4)
    sim.submit_many([task(f"y{i}", [f"x{i}"], resources={"GPU": 1}) for i in range(4)])
    sim.finish("y0")  # x2 and x3 pushed ahead; neither arrives
    assert pushed_keys(sim).count("x2") == 1
    sim.clock.now += 10  # type: ignore[attr-defined]
    sim.finish("y1")
    (_, compute) = sim.computes[-1]
    assert compute["key"] == "y2" and compute["pushed"] == {"x2": MIB}
    assert pushed_keys(sim).count("x2") == 2  # told again, not left to the worker's wait


def test_an_input_the_next_tasks_share_with_the_running_one_is_not_pushed_again() -> None:
    # Every GPU task taking the same large input (a model's weights, say): pushed with the
    # first task; looking ahead must not push it a second time while it travels.
    sim = gpu_worker_and_inputs(1, nbytes=8 * MIB)
    sim.submit_many([task("z", resources={"GPU": 1})])  # the GPU busy: the rest queue
    sim.submit_many([task(f"y{i}", ["x0"], resources={"GPU": 1}) for i in range(4)])
    sim.finish("z")
    assert sim.computes[-1][1]["key"] == "y0"
    assert pushed_keys(sim) == ["x0"]
