"""Seceded runs on the scheduler's state machine (scheduler/secession.py), without I/O."""

from __future__ import annotations

from apportion.scheduler.secession import Secession

from apportion.errors import ResourceDeadlockError
from apportion.serialize import loads_exception
from tests.unit.sim import Sim, task


def setup(resources: dict[str, float], nthreads: int = 1) -> tuple[Sim, Secession]:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("w", resources, nthreads=nthreads)
    return sim, Secession(sim.state)


def test_a_seceded_run_frees_its_slot_but_keeps_its_resources() -> None:
    sim, sec = setup({"GPU": 1}, nthreads=1)
    sim.submit_many([task("parent", resources={"GPU": 1}), task("p2"), task("a"), task("b")])
    assert sim.outstanding() == ["p2", "parent"]  # 1 thread + 1 prefetched
    sec.secede("w", sim.run_of("parent")[1], release=False)
    sim.step()
    assert sim.outstanding() == ["a", "p2", "parent"]  # one slot more
    assert sim.used("w") == {"GPU": 1}


def test_released_resources_go_to_others_and_come_back_before_queued_tasks() -> None:
    sim, sec = setup({"GPU": 1}, nthreads=4)
    sim.submit("parent", resources={"GPU": 1})
    run = sim.run_of("parent")[1]
    sec.secede("w", run, release=True)
    sim.step()
    assert sim.used("w") == {"GPU": 0}
    sim.submit_many([task("child", resources={"GPU": 1}), task("other", resources={"GPU": 1})])
    assert "child" in sim.outstanding() and sim.used("w") == {"GPU": 1}
    sec.reacquire("w", run)
    sim.step()
    assert not [m for _, m in sim.computes if m["key"] == "other"]
    sim.finish("child")  # the GPU comes free: the parent has it back, not "other"
    assert sim.state.adjusted is not None and sim.state.adjusted.unheld_runs == set()
    assert sim.reacquired == [("w", run)]
    assert sim.used("w") == {"GPU": 1}
    assert sim.outstanding() == ["parent"]
    sec.rejoin("w", run)
    sec.run_ended("w", run)
    sim.finish("parent")
    assert sim.outstanding() == ["other"]


def test_a_subtask_needing_the_units_its_seceded_parent_keeps_fails_as_a_deadlock() -> None:
    sim, sec = setup({"GPU": 1}, nthreads=2)
    sim.submit("parent", resources={"GPU": 1})
    sec.secede("w", sim.run_of("parent")[1], release=False)
    sim.submit("child", resources={"GPU": 1})
    sec.spawned("parent", ["child"])
    sim.step()
    assert sim.states()["child"] == "erred"
    (erred,) = [m for m in sim.client_messages("task-erred") if m["key"] == "child"]
    error = loads_exception(erred["exception"], "")
    assert isinstance(error, ResourceDeadlockError)
    assert error.key == "child" and error.holders == ["parent"]


def test_a_subtask_that_fits_beside_its_parent_is_no_deadlock() -> None:
    sim, sec = setup({"GPU": 2}, nthreads=2)
    sim.submit_many([task("parent", resources={"GPU": 1}), task("busy", resources={"GPU": 1})])
    sec.secede("w", sim.run_of("parent")[1], release=False)
    sim.submit("child", resources={"GPU": 1})
    sec.spawned("parent", ["child"])
    sim.step()
    assert sim.states()["child"] == "queued"  # waits for "busy", which will end
    sim.finish("busy")
    assert "child" in sim.outstanding()
