"""client.set_resources on the scheduler's state machine (scheduler/worker_resources.py)."""

from __future__ import annotations

from apportion.scheduler.worker_resources import set_resources

from tests.unit.sim import Sim, task


def test_new_amounts_rule_new_placements_and_runs_keep_theirs() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    sim.submit_many([task(f"t{i}", resources={"GPU": 1}) for i in range(4)])
    assert sim.outstanding() == ["t0", "t1"]
    set_resources(sim.state, sim.state.workers["w"], {"GPU": 1})
    sim.step()  # invariants hold although 2 units are used of 1
    assert sim.resized == [("w", {"GPU": 1})]
    assert sim.used("w") == {"GPU": 2}
    sim.finish("t0")
    assert sim.outstanding() == ["t1"]  # still one over: nothing starts
    sim.finish("t1")
    assert sim.outstanding() == ["t2"]


def test_a_demand_no_worker_fits_any_longer_waits_in_no_worker_until_it_does() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("w", {"GPU": 2}, nthreads=2)
    sim.submit_many([task("first", resources={"GPU": 2}), task("big", resources={"GPU": 2})])
    assert sim.states()["big"] == "queued"
    ws = sim.state.workers["w"]
    set_resources(sim.state, ws, {"GPU": 1})
    sim.step()
    assert sim.states()["big"] == "no-worker"
    set_resources(sim.state, ws, {"GPU": 2, "FPGA": 1})
    sim.step()
    assert sim.states()["big"] == "queued"
    sim.finish("first")
    assert sim.outstanding() == ["big"]


def test_a_shrunk_worker_is_exempt_from_the_over_total_check_only_while_its_runs_last() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("w", {"GPU": 2}, nthreads=4)
    sim.submit_many([task(f"t{i}", resources={"GPU": 1}) for i in range(2)])
    sim.add_worker("v", {"GPU": 2}, nthreads=4)
    sim.submit_many([task("u", resources={"GPU": 2})])
    w, v = sim.state.workers["w"], sim.state.workers["v"]
    assert sorted(ts.key for ts in w.processing.values()) == ["t0", "t1"]
    assert [ts.key for ts in v.processing.values()] == ["u"]
    set_resources(sim.state, w, {"GPU": 1})
    set_resources(sim.state, v, {"GPU": 1})
    sim.step()
    assert sim.state.check_invariants() == []  # over their totals while those runs last
    sim.finish("t0")
    sim.finish("t1")
    w.used["GPU"] = 2.0  # a bookkeeping error now: nothing runs there
    problems = sim.state.check_invariants()
    # (The compiled build prints the total as 1.0.)
    assert any(p.startswith("w: GPU used 2.0 > total 1") for p in problems), problems
    w.used["GPU"] = 0.0
    sim.remove_worker("v")  # still running u: no longer kept for the check's sake
    adjusted = sim.state.adjusted
    assert adjusted is not None and adjusted.shrunk == set()
