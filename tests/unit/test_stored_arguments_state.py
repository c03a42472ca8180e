"""A stored argument's task moved to another worker after its holder was lost, on the
pure state machine (scheduler/stored_arguments.py)."""

from __future__ import annotations

from apportion.scheduler.stored_arguments import restore_argument

from tests.unit.sim import Sim, task


def _on(key: str, worker: str, **kw: object) -> dict:
    spec = task(key, **kw)
    spec["workers"] = [worker]
    return spec


def test_a_waiting_argument_task_moves_to_its_new_holder_and_its_dependent_follows() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("a")
    sim.add_worker("b")
    sim.submit_many([_on("arg", "a"), task("use", deps=["arg"])])
    sim.finish("arg")
    sim.remove_worker("a")  # the value is lost with its only holder
    assert sim.states()["arg"] == "no-worker"
    assert not restore_argument(sim.state, "someone-else", _on("arg", "b"))
    assert restore_argument(sim.state, "c", _on("arg", "b"))
    sim.step()
    assert sim.computed_keys("b") == ["arg"]
    sim.finish("arg")
    assert sim.computed_keys("b") == ["arg", "use"]
    sim.assert_consistent()
    assert sim.state.check_invariants() == []


def test_a_task_that_no_longer_waits_for_a_worker_is_left_as_it_is() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("a")
    sim.add_worker("b")
    sim.submit_many([_on("arg", "a")])
    assert sim.states()["arg"] == "processing"
    assert not restore_argument(sim.state, "c", _on("arg", "b"))
    assert not restore_argument(sim.state, "c", _on("unknown", "b"))
    assert sim.computed_keys("b") == []
