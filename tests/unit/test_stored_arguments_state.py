"""A stored argument's task moved to another worker after its holder was lost, on the
pure state machine (scheduler/stored_arguments.py)."""

from __future__ import annotations

from apportion.scheduler.stored_arguments import restore_argument

from tests.unit.sim import Sim, task


def _client_and(*workers: str) -> Sim:
    """A client "c" and the named workers."""
    sim = Sim()
    sim.add_client("c")
    for name in workers:
        sim.add_worker(name)
    return sim


def _on(key: str, worker: str, **kw: object) -> dict:
    spec = task(key, **kw)
    spec["workers"] = [worker]
    return spec


def test_a_waiting_argument_task_moves_to_its_new_holder_and_its_dependent_follows() -> None:
    sim = _client_and("a", "b")
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
    sim = _client_and("a", "b")
    sim.submit_many([_on("arg", "a")])
    assert sim.states()["arg"] == "processing"
    assert not restore_argument(sim.state, "c", _on("arg", "b"))
    assert not restore_argument(sim.state, "c", _on("unknown", "b"))
    assert sim.computed_keys("b") == []


def _stored_on(key: str, worker: str, nbytes: int = 2**20) -> dict:
    spec = _on(key, worker)
    spec["stored"] = nbytes
    return spec


def test_a_stored_argument_is_held_at_once_and_its_task_sent_after_it_in_one_batch() -> None:
    sim = _client_and("a", "b")
    sim.state.handle_submit("c", [_stored_on("arg", "a"), task("use", deps=["arg"])])
    out = sim.step()
    # The worker hears to hold the value before the task taking it: one frame, no run.
    assert [m["op"] for m in out["a"]] == ["adopt-stored", "compute"]
    assert out["a"][0] == {"op": "adopt-stored", "key": "arg", "nbytes": 2**20}
    assert sim.states()["arg"] == "memory" and sim.computed_keys("a") == ["use"]
    assert "task-finished" in sim.client_ops("arg")
    sim.finish("use")
    assert sim.states()["use"] == "memory"


def test_a_stored_argument_whose_worker_is_gone_runs_as_a_task() -> None:
    sim = _client_and("a")
    sim.submit_many([_stored_on("arg", "gone")])
    assert sim.adopted == {} and sim.states() == {"arg": "no-worker"}


def test_a_stored_argument_given_back_after_a_scheduler_restart_is_placed_as_a_task() -> None:
    sim = _client_and("a")
    sim.state.handle_submit("c", [_stored_on("arg", "a")], recover=True)
    sim.step()
    assert sim.adopted == {} and sim.computed_keys("a") == ["arg"]


def test_a_stored_argument_names_its_one_worker() -> None:
    from apportion.scheduler.validation import check_submit

    from apportion.protocol import ProtocolError

    check_submit({"tasks": [_stored_on("arg", "a")]})
    for bad in ({**_stored_on("arg", "a"), "workers": ["a", "b"]}, {**task("x"), "stored": 8}):
        try:
            check_submit({"tasks": [bad]})
        except ProtocolError as exc:
            assert "'stored' must be a size in bytes" in str(exc)
        else:
            raise AssertionError(f"accepted {bad}")
