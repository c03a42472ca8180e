"""Graceful retirement in the state machine: results copied off first, idle reporting."""

from __future__ import annotations

import pytest

from tests.unit.sim import FakeClock, Sim, task


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.add_client("c")
    return s


def computed_on(sim: Sim, address: str, *keys: str, nbytes: int = 8) -> None:
    """Run ``keys`` on the only worker present, so their results live there."""
    for key in keys:
        sim.submit(key)
        assert sim.run_of(key)[0] == address
        sim.finish(key, nbytes=nbytes)


def holders(sim: Sim, key: str) -> set[str]:
    return {ws.address for ws in sim.state.tasks[key].who_has}


def copies(sim: Sim) -> list[tuple[str, str, list[str]]]:
    return [(address, m["key"], sorted(m["who_has"])) for address, m in sim.acquires]


def retiring_a_holding_x(sim: Sim, *others: str) -> str:
    """Worker a computes x, the ``others`` join, a is retired: returns where x is copied."""
    sim.add_worker("a")
    computed_on(sim, "a", "x")
    for name in others:
        sim.add_worker(name)
    sim.retire("a")
    return copies(sim)[-1][0] if copies(sim) else ""


# ------------------------------------------------------------------ what goes where
def test_needed_results_only_on_the_retiring_worker_go_to_the_target_holding_fewest_bytes(
    sim: Sim,
) -> None:
    sim.add_worker("a")
    computed_on(sim, "a", "x", "y")
    sim.add_worker("b", {"B": 1})
    sim.submit("z", resources={"B": 1})  # only b can run it: b holds 1000 bytes
    sim.finish("z", nbytes=1000)
    sim.add_worker("d")
    assert sim.retire("a") == ["a"]
    assert sorted(copies(sim)) == [("d", "x", ["a"]), ("d", "y", ["a"])]
    assert sim.retire_reply() is None, "answered before the copies landed"
    sim.acquired("d", "x")
    assert sim.retire_reply() is None
    sim.acquired("d", "y")
    assert sim.retire_reply() == {"retired": ["a"], "kept": {}}
    assert holders(sim, "x") == holders(sim, "y") == {"a", "d"}
    # The client fetches from the first holder it knows: the one staying in service.
    assert sim.client_messages("who-has")[-1] == {
        "op": "who-has",
        "key": "y",
        "who_has": ["d", "a"],
    }


def test_a_result_held_by_a_worker_staying_in_service_is_not_copied(sim: Sim) -> None:
    retiring_a_holding_x(sim, "b")
    sim.acquired("b", "x")
    assert sim.retire_reply() == {"retired": ["a"], "kept": {}}
    sim.acquires.clear()
    sim.retire("a", requester="again")  # a retiring worker asked for again: nothing to do
    assert sim.acquires == []
    assert sim.retire_reply("again") == {"retired": ["a"], "kept": {}}


def test_released_results_are_not_copied(sim: Sim) -> None:
    sim.add_worker("a")
    computed_on(sim, "a", "x", "y")
    sim.release("y")
    sim.add_worker("b")
    sim.retire("a")
    assert copies(sim) == [("b", "x", ["a"])]


def test_an_idle_worker_holding_nothing_needed_is_retired_at_once(sim: Sim) -> None:
    sim.add_worker("a")
    sim.add_worker("b")
    assert sim.retire("a", "b", count=1) == ["a"]
    assert sim.retire_reply() == {"retired": ["a"], "kept": {}}
    assert sim.state.info()["workers"]["a"]["retiring"]
    assert sim.state.info()["workers"]["a"]["retired"]


def test_a_result_copied_to_a_worker_that_is_then_retired_is_copied_again(sim: Sim) -> None:
    target = retiring_a_holding_x(sim, "b", "d")
    other = ({"b", "d"} - {target}).pop()
    sim.acquired(target, "x")
    sim.retire(target, requester="second")
    assert copies(sim)[-1] == (other, "x", sorted(["a", target]))
    sim.acquired(other, "x")
    assert sim.retire_reply("second") == {"retired": [target], "kept": {}}


def test_a_retiring_worker_finishes_its_runs_and_their_results_are_copied(sim: Sim) -> None:
    sim.add_worker("a")
    sim.submit("x")
    sim.add_worker("b")
    sim.retire("a")
    assert sim.retire_reply() is None and copies(sim) == []
    sim.submit("later")
    assert sim.run_of("later")[0] == "b", "a retiring worker gets no new work"
    sim.finish("x")
    assert copies(sim) == [("b", "x", ["a"])]
    sim.acquired("b", "x")
    assert sim.retire_reply() == {"retired": ["a"], "kept": {}}


# ------------------------------------------------------------------------- races
def test_a_result_released_mid_copy_no_longer_holds_the_retirement_back(sim: Sim) -> None:
    retiring_a_holding_x(sim, "b")
    sim.release("x")
    assert sim.retire_reply() == {"retired": ["a"], "kept": {}}
    sim.acquired("b", "x")  # the copy lands after all: b is told to drop it
    assert sim.freed["b"] == ["x"]
    assert "x" not in sim.state.tasks


def test_retiring_worker_dying_mid_copy_is_reported_and_its_result_recomputed(sim: Sim) -> None:
    retiring_a_holding_x(sim, "b")
    sim.remove_worker("a")
    reply = sim.retire_reply()
    assert reply is not None and reply["retired"] == []
    assert "left while retiring" in reply["kept"]["a"]
    assert sim.run_of("x")[0] == "b", "recomputed from lineage"
    sim.acquire_failed("b", "x")  # the copy's late answer changes nothing
    sim.finish("x")
    assert holders(sim, "x") == {"b"}


def test_copy_target_dying_mid_copy_sends_the_copy_elsewhere(sim: Sim) -> None:
    target = retiring_a_holding_x(sim, "b", "d")
    sim.remove_worker(target)
    other = ({"b", "d"} - {target}).pop()
    assert copies(sim)[-1] == (other, "x", ["a"])
    sim.acquired(other, "x")
    assert sim.retire_reply() == {"retired": ["a"], "kept": {}}


def test_a_copy_holder_leaving_after_the_retirement_starts_no_new_copy(sim: Sim) -> None:
    target = retiring_a_holding_x(sim, "b", "d")
    sim.acquired(target, "x")
    sim.retire("a", requester="again")
    assert sim.retire_reply("again") == {"retired": ["a"], "kept": {}}
    sim.remove_worker(target)  # x is now only on a, which is retired already: not copied
    assert len(copies(sim)) == 1


# -------------------------------------------------------------------- kept workers
def test_without_a_worker_to_take_the_data_the_worker_is_kept_in_service(sim: Sim) -> None:
    sim.add_worker("a")
    computed_on(sim, "a", "x", "y", "z")
    sim.retire("a")
    assert sim.retire_reply() == {
        "retired": [],
        "kept": {"a": "holds 3 results still needed and no other worker can take them"},
    }
    ws = sim.state.workers["a"]
    assert not ws.retiring and ws.slots == ws.max_slots
    sim.submit("next")
    assert sim.run_of("next")[0] == "a", "back in service"


def test_of_two_retiring_workers_the_one_holding_data_stays_and_takes_the_other(
    sim: Sim,
) -> None:
    sim.add_worker("a")
    computed_on(sim, "a", "x")
    sim.add_worker("b")
    sim.retire("a", "b")
    assert sim.retire_reply() == {
        "retired": ["b"],
        "kept": {"a": "holds 1 result still needed and no other worker can take them"},
    }
    assert copies(sim) == []


def test_a_failed_copy_keeps_the_holder_in_service_with_the_reason(sim: Sim) -> None:
    retiring_a_holding_x(sim, "b")
    sim.acquire_failed("b", "x", "connection refused")
    assert sim.retire_reply() == {
        "retired": [],
        "kept": {"a": "copying result 'x' to b failed: connection refused"},
    }
    assert not sim.state.workers["a"].retiring


def test_a_copy_not_done_by_the_deadline_keeps_the_holder_in_service() -> None:
    clock = FakeClock()
    sim = Sim({"scheduler.retire-timeout": 5}, clock=clock)
    sim.add_client("c")
    retiring_a_holding_x(sim, "b")
    assert sim.state.next_deadline() == 5
    clock.now = 5
    sim.state.check_timeouts()
    sim.step()
    assert sim.retire_reply() == {
        "retired": [],
        "kept": {
            "a": "could not copy 1 result still needed to another worker within 5s "
            "(scheduler.retire-timeout)"
        },
    }
    assert sim.state.next_deadline() is None
    sim.acquired("b", "x")  # late, still a useful second copy
    assert holders(sim, "x") == {"a", "b"}


def test_a_worker_still_running_at_the_deadline_is_kept() -> None:
    clock = FakeClock()
    sim = Sim({"scheduler.retire-timeout": 5}, clock=clock)
    sim.add_client("c")
    sim.add_worker("a")
    sim.submit("x")
    sim.retire("a")
    clock.now = 6
    sim.state.check_timeouts()
    sim.step()
    reply = sim.retire_reply()
    assert reply is not None and reply["kept"] == {
        "a": "still running 1 task after 5s (scheduler.retire-timeout)"
    }


def test_unknown_names_are_refused_by_name_and_nothing_changes(sim: Sim) -> None:
    sim.add_worker("a")
    with pytest.raises(ValueError, match=r"\['ghost', 'nope'\]"):
        sim.retire("a", "nope", "ghost")
    assert not sim.state.workers["a"].retiring
    assert sim.state.retirements == []


# ------------------------------------------------------------ retired but still connected
def test_tasks_only_a_retired_worker_could_run_wait_in_no_worker_and_the_client_is_told(
    sim: Sim,
) -> None:
    """A worker retired without being closed stays connected and takes no work for good:
    what only it could run waits in no-worker (the client told why), not queued for ever."""
    sim.add_worker("a", {"A": 1})
    sim.add_worker("b")
    queued_before = task("queued-before", resources={"A": 1})
    sim.submit_many([task("busy", resources={"A": 1}), queued_before])
    sim.retire("a")
    assert sim.retire_reply() is None  # "busy" still runs there
    sim.finish("busy")
    sim.acquired("b", "busy")  # its result copied off
    assert sim.retire_reply() == {"retired": ["a"], "kept": {}}
    sim.submit_many([{**task("strict"), "workers": ["a"]}, task("by-demand", resources={"A": 1})])
    states = sim.states()
    assert [states[k] for k in ("queued-before", "strict", "by-demand")] == ["no-worker"] * 3
    notices = sim.client_messages("no-worker")
    assert sorted(k for m in notices for k in m["keys"]) == ["by-demand", "queued-before", "strict"]
    said = "the only workers that could run it ('a') are retired"
    assert all(said in m["why"] for m in notices), notices
    # Any worker that fits joining runs them, as for any task in no-worker.
    sim.add_worker("c", {"A": 1})
    assert sim.states()["queued-before"] == "processing"
    assert sim.state.check_invariants() == []


def test_a_worker_kept_in_service_keeps_its_queued_tasks() -> None:
    """While a retirement may still end with the worker kept, what only it can run stays
    queued for it (no notice); kept, the worker runs it."""
    clock = FakeClock()
    sim = Sim(clock=clock)
    sim.add_client("c")
    sim.add_worker("a", {"A": 1})
    sim.add_worker("b")
    sim.submit_many([task("busy", resources={"A": 1}), task("next", resources={"A": 1})])
    sim.retire("a")
    assert sim.states()["next"] == "queued"
    clock.now = sim.state.retire_timeout + 1
    sim.state.check_timeouts()
    sim.step()
    reply = sim.retire_reply()
    assert reply is not None and "a" in reply["kept"]
    sim.finish("busy")
    assert sim.states()["next"] == "processing"
    assert sim.client_messages("no-worker") == []
