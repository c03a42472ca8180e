"""A new scheduler rebuilt from workers' reports and clients' re-registrations.

The decisions (scheduler/recovery.py) are tested as pure functions; their effects on
``SchedulerState`` through ``Sim``, which checks the resource accounting after every step
against its own ledger of the runs each worker has not reported over.
"""

from __future__ import annotations

from typing import Any

import pytest
from apportion.scheduler.recovery import (
    RECOVERING,
    ReportedRun,
    WorkerReport,
    decide_held,
    decide_run,
    parse_report,
)
from apportion.scheduler.restrictions import is_restricted
from apportion.scheduler.secession import Secession

from apportion.protocol import ProtocolError
from tests.unit.sim import FakeClock, Sim, task

WAIT = 5.0


class RecoverySim(Sim):
    """A scheduler just started, to which workers of the previous one come back."""

    def __init__(self, secession: bool = False) -> None:
        self.fake = FakeClock()
        super().__init__({"scheduler.recovery-wait": WAIT}, self.fake)
        # The scheduler's books on seceded runs, when a test needs them (as the server has).
        self.secession = Secession(self.state) if secession else None
        self.add_client("c")

    def rejoin(
        self,
        address: str,
        resources: dict[str, float] | None = None,
        nthreads: int = 2,
        held: list[str] | dict[str, int] = (),  # type: ignore[assignment]
        running: list[dict[str, Any]] = (),  # type: ignore[assignment]
        erred: list[dict[str, Any]] = (),  # type: ignore[assignment]
    ) -> None:
        """A worker registers with what it kept: its runs go on, so the fake worker knows
        them as outstanding (each holding its resources)."""
        self.worker_addresses.add(address)
        self.runs[address] = {
            run["run_id"]: {"key": run["key"], "resources": run.get("resources", {})}
            for run in running
        }
        sizes = held if isinstance(held, dict) else dict.fromkeys(held, 0)
        report = parse_report(
            {"op": "recover", "held": sizes, "running": list(running), "erred": list(erred)}
        )
        adopted = self.secession.adopt if self.secession is not None else None
        self.state.add_worker(
            address, address, nthreads, dict(resources or {}), report=report, adopted=adopted
        )
        self.step()

    def resubmit(self, *specs: dict[str, Any], client: str = "c") -> None:
        self.state.handle_submit(client, list(specs), recover=True)
        self.step()

    def end_wait(self) -> None:
        self.fake.now += WAIT
        self.state.check_timeouts()
        self.step()


def run(key: str, run_id: int, cancelled: bool = False, **resources: float) -> dict[str, Any]:
    return {"key": key, "run_id": run_id, "resources": resources, "cancelled": cancelled}


# ------------------------------------------------------------------- pure decisions
@pytest.mark.parametrize(
    ("known", "recovering", "action"),
    [
        (None, True, "keep-unclaimed"),
        (None, False, "drop"),
        ("memory", True, "add-holder"),
        ("erred", True, "drop"),
        ("released", True, "adopt-result"),
        ("queued", False, "adopt-result"),
        ("processing", True, "adopt-result"),
    ],
)
def test_a_held_result_is_adopted_unless_known_as_failed_or_unwanted(
    known: str | None, recovering: bool, action: str
) -> None:
    assert decide_held("k", known, recovering).action == action


def test_a_held_result_of_a_superseded_attempt_is_dropped_while_a_newer_one_runs() -> None:
    dropped = decide_held("k", "processing", False, attempt=1, current=2)
    assert dropped.action == "drop" and dropped.conflict is not None
    assert "superseded by attempt 2" in dropped.conflict
    # The current attempt's own result, a result a scheduler was told of, or no run now:
    # the result is taken.
    assert decide_held("k", "processing", False, attempt=2, current=2).action == "adopt-result"
    assert decide_held("k", "processing", False, attempt=None, current=2).action == ("adopt-result")
    assert decide_held("k", "queued", False, attempt=1, current=2).action == "adopt-result"


GPU = (("GPU", 1.0),)


@pytest.mark.parametrize(
    ("known", "recovering", "cancelled", "known_shape", "action", "conflict"),
    [
        (None, True, False, None, "adopt-unclaimed", False),
        (None, False, False, None, "stale", True),
        ("released", True, False, GPU, "adopt-run", False),
        ("queued", True, False, GPU, "adopt-run", False),
        ("processing", True, False, GPU, "stale", True),  # another worker reported first
        ("memory", True, False, GPU, "stale", True),
        ("released", True, False, (("GPU", 2.0),), "stale", True),  # another demand
        ("released", True, True, GPU, "stale", False),  # cancelled before the restart
    ],
)
def test_a_reported_run_is_adopted_only_when_nothing_else_has_the_key(
    known: str | None,
    recovering: bool,
    cancelled: bool,
    known_shape: Any,
    action: str,
    conflict: bool,
) -> None:
    reported = ReportedRun("k", 3, GPU, cancelled)
    decision = decide_run("k", known, recovering, reported, known_shape, "w0")
    assert decision.action == action
    assert (decision.conflict is not None) == conflict


def test_a_report_is_parsed_and_a_malformed_one_is_refused_with_the_reason() -> None:
    report = parse_report(
        {"op": "recover", "held": {"a": 10}, "running": [run("b", 4, GPU=1)] * 1, "erred": []}
    )
    assert report == WorkerReport({"a": 10}, [ReportedRun("b", 4, (("GPU", 1),), False)])
    with pytest.raises(ProtocolError, match="must send 'recover' first"):
        parse_report({"op": "heartbeat"})
    with pytest.raises(ProtocolError, match="'held': a map of keys to their sizes"):
        parse_report({"op": "recover", "held": ["a"], "running": []})
    with pytest.raises(ProtocolError, match="malformed run"):
        parse_report({"op": "recover", "held": {}, "running": [{"key": "b", "run_id": "x"}]})
    with pytest.raises(ProtocolError, match="malformed run"):
        parse_report({"op": "recover", "held": {}, "running": [run("b", 1, GPU=-1)]})
    with pytest.raises(ProtocolError, match="malformed error"):
        parse_report({"op": "recover", "held": {}, "running": [], "erred": [{"key": "b"}]})


# ------------------------------------------------------------- rebuilding the state
def test_held_results_and_runs_are_booked_exactly_and_not_computed_again() -> None:
    sim = RecoverySim()
    sim.rejoin("w1", {"GPU": 2}, held=["load-1", "load-2"], running=[run("gpu-1", 41, GPU=2)])
    assert sim.used("w1") == {"GPU": 2}
    # The client comes back: the results it wants are there, the run goes on.
    sim.resubmit(
        task("load-1"),
        task("load-2"),
        task("gpu-1", ["load-1"], {"GPU": 2}),
        task("gpu-2", ["load-2"], {"GPU": 2}),
    )
    assert sim.client_ops("load-1") == ["task-finished"]
    assert sim.computes == []  # gpu-2 waits for the end of the recovery wait
    sim.end_wait()
    assert sim.computed_keys() == []  # no GPU free on w1: gpu-1 still holds both
    sim.finish("gpu-1", run=("w1", 41))
    assert sim.client_ops("gpu-1") == ["task-finished"]
    assert sim.computed_keys() == ["gpu-2"]  # nothing held or running ran again
    _, message = sim.computes[0]
    assert message["run_id"] > 41  # no clash with the runs the worker reported
    sim.finish("gpu-2")
    assert sim.states() == {k: "memory" for k in ("load-1", "load-2", "gpu-1", "gpu-2")}


def test_a_worker_coming_back_before_the_wait_ends_claims_a_re_registered_task() -> None:
    sim = RecoverySim()
    sim.rejoin("w1")
    sim.resubmit(task("a"), task("b"))
    assert sim.computes == []
    sim.rejoin("w2", held=["a"], running=[run("b", 9)])
    sim.end_wait()
    assert sim.computes == []
    assert sim.states() == {"a": "memory", "b": "processing"}
    sim.finish("b", run=("w2", 9))
    assert sim.client_ops("b") == ["task-finished"]


def test_what_no_client_claims_is_released_when_the_wait_ends() -> None:
    sim = RecoverySim()
    sim.rejoin("w1", {"GPU": 1}, held=["orphan"], running=[run("lonely", 5, GPU=1)])
    assert sim.state.tasks["orphan"].who_wants == frozenset({RECOVERING})
    sim.end_wait()
    assert sim.freed.get("w1") == ["orphan"]
    assert sim.cancels.get("w1") == [5]
    assert sim.used("w1") == {"GPU": 1}  # until the worker confirms the run stopped
    sim.released("lonely", run=("w1", 5))
    assert sim.used("w1") == {"GPU": 0} and sim.states() == {}


def test_after_the_wait_an_unknown_held_result_is_dropped_and_an_unknown_run_cancelled() -> None:
    sim = RecoverySim()
    sim.end_wait()
    sim.rejoin("late", {"GPU": 1}, held=["old"], running=[run("old-run", 3, GPU=1)])
    assert sim.freed["late"] == ["old"] and sim.cancels["late"] == [3]
    assert sim.used("late") == {"GPU": 1} and sim.states() == {}
    sim.released("old-run", run=("late", 3))
    assert sim.used("late") == {"GPU": 0}


def test_two_workers_running_the_same_key_the_first_reported_keeps_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = RecoverySim()
    sim.rejoin("w1", {"GPU": 1}, running=[run("k", 7, GPU=1)])
    sim.rejoin("w2", {"GPU": 1}, running=[run("k", 8, GPU=1)])
    assert "already runs on w1, which reported first" in caplog.text
    assert sim.cancels == {"w2": [8]}
    assert sim.used("w1") == sim.used("w2") == {"GPU": 1}  # both threads hold a GPU
    sim.resubmit(task("k", resources={"GPU": 1}))
    sim.finish("k", run=("w2", 8))  # the cancelled run's result is not taken
    assert sim.client_ops("k") == [] and sim.freed.get("w2") == ["k"]
    sim.finish("k", run=("w1", 7))
    assert sim.client_ops("k") == ["task-finished"]


def test_a_held_result_beats_a_run_of_the_same_key_elsewhere() -> None:
    sim = RecoverySim()
    sim.rejoin("w1", running=[run("k", 7)])
    sim.rejoin("w2", held=["k"])
    assert sim.cancels == {"w1": [7]}
    assert sim.state.tasks["k"].who_has == frozenset({sim.state.workers["w2"]})


def test_a_client_re_registering_a_key_as_another_task_keeps_the_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = RecoverySim()
    sim.resubmit(task("k"))
    other = {**task("k"), "func": b"something else"}
    sim.resubmit(other, client="d")
    assert "re-registered 'k' as a different task" in caplog.text
    assert sim.state.tasks["k"].func == b"func-k"


def test_a_held_result_whose_holder_dies_before_any_client_claims_it_is_forgotten() -> None:
    sim = RecoverySim()
    sim.rejoin("w1", held=["x"])
    sim.remove_worker("w1")
    assert sim.states() == {} and sim.computes == []
    # A client re-registering it afterwards has it computed from its lineage.
    sim.rejoin("w2")
    sim.resubmit(task("x"))
    sim.end_wait()
    assert sim.computed_keys() == ["x"]


def test_a_reported_run_of_a_re_registered_queued_task_takes_its_place() -> None:
    sim = RecoverySim()
    sim.end_wait()
    sim.rejoin("w1", {"GPU": 1}, nthreads=1)
    sim.submit("busy", resources={"GPU": 1})
    sim.submit("k", resources={"GPU": 1})  # queued behind busy, reserving w1
    sim.rejoin("w2", {"GPU": 1}, running=[run("k", 99, GPU=1)])
    assert sim.states()["k"] == "processing"
    sim.finish("busy")
    assert sim.computed_keys() == ["busy"]  # k was not started again
    sim.finish("k", run=("w2", 99))
    assert sim.states() == {"busy": "memory", "k": "memory"}


def test_a_result_kept_only_as_lineage_is_not_dropped_before_its_dependent_is_under_way() -> None:
    sim = RecoverySim()
    sim.rejoin("w1", held=["dep"])
    sim.resubmit(task("dep"), task("out", ["dep"]))
    sim.state.release_after_recovery("c", ["dep"])  # the client holds no future of dep
    sim.step()
    assert sim.freed == {}
    sim.end_wait()
    assert sim.computed_keys() == ["out"]  # dep, held all along, is not computed again
    sim.finish("out")
    assert sim.freed == {"w1": ["dep"]}  # no longer needed once out is in memory


# --------------------------------------- seceded runs, restrictions, resources set lower
def test_a_seceded_run_that_released_its_resources_and_asks_them_back_gets_them() -> None:
    sim = RecoverySim(secession=True)
    parent = run("parent", 5, GPU=1)
    parent.update(seceded=True, released=True, reacquiring=True)
    # The GPU went to another run meanwhile; the parent waits in rejoin() for it.
    sim.rejoin("w1", {"GPU": 1}, nthreads=1, running=[parent, run("other", 6, GPU=1)])
    assert sim.used("w1") == {"GPU": 1}  # other's only: the parent holds none
    assert sim.reacquired == []
    assert sim.state.workers["w1"].slots == sim.state.workers["w1"].max_slots
    sim.resubmit(task("parent", resources={"GPU": 1}), task("other", resources={"GPU": 1}))
    sim.resubmit(task("next", resources={"GPU": 1}))
    sim.end_wait()
    assert sim.secession is not None
    sim.secession.run_ended("w1", 6)
    sim.finish("other", run=("w1", 6))  # the GPU comes free: the parent first, not "next"
    assert sim.reacquired == [("w1", 5)] and sim.used("w1") == {"GPU": 1}
    assert "next" not in sim.computed_keys()
    sim.secession.run_ended("w1", 5)
    sim.finish("parent", run=("w1", 5))
    assert sim.computed_keys() == ["next"]


def test_a_seceded_run_that_kept_its_resources_gives_its_worker_a_slot_more() -> None:
    sim = RecoverySim(secession=True)
    parent = run("parent", 5, GPU=1)
    parent.update(seceded=True)
    sim.rejoin("w1", {"GPU": 1}, nthreads=1, running=[parent])
    ws = sim.state.workers["w1"]
    assert sim.used("w1") == {"GPU": 1}
    assert ws.max_slots == 1 + sim.state.settings.prefetch + 1
    assert sim.secession is not None and 5 in sim.secession.runs


def test_a_subtask_re_registered_with_its_parent_is_checked_for_the_deadlock() -> None:
    sim = RecoverySim(secession=True)
    parent = run("parent", 5, GPU=1)
    parent.update(seceded=True)
    sim.rejoin("w1", {"GPU": 1}, nthreads=2, running=[parent])
    sim.resubmit(task("parent", resources={"GPU": 1}))
    child = {**task("child", resources={"GPU": 1}), "parent": "parent"}
    sim.resubmit(child, client="worker-client")
    assert sim.secession is not None
    sim.secession.respawned([child])
    assert sim.secession.descendants(["parent"]) == ["child"]  # cancelling it reaches child
    sim.end_wait()
    sim.secession.recovered()
    sim.step()
    assert sim.states()["child"] == "erred"
    assert type(sim.error_of("child", client="worker-client")).__name__ == "ResourceDeadlockError"


def test_a_run_restricted_to_some_workers_is_adopted_and_keeps_its_restriction() -> None:
    sim = RecoverySim()
    spec = {**task("k", resources={"GPU": 1}), "workers": ["w1"]}
    sim.resubmit(spec)  # the client came back first
    sim.rejoin("w1", {"GPU": 1}, running=[run("k", 7, GPU=1)])
    assert sim.cancels == {} and sim.states()["k"] == "processing"
    assert is_restricted(sim.state.tasks["k"].shape)
    # A placeholder claimed later gets the restriction too.
    sim.rejoin("w2", {"GPU": 1}, running=[run("j", 8, GPU=1)])
    sim.resubmit({**task("j", resources={"GPU": 1}), "workers": ["w2"]})
    assert sim.cancels == {} and is_restricted(sim.state.tasks["j"].shape)


def test_runs_holding_more_than_a_worker_was_set_to_are_booked_as_they_are() -> None:
    sim = RecoverySim()
    # set_resources(w1, {"GPU": 1}) while two GPU runs held their units; then the restart.
    sim.rejoin("w1", {"GPU": 1}, running=[run("a", 1, GPU=1), run("b", 2, GPU=1)])
    assert sim.used("w1") == {"GPU": 2} and sim.state.check_invariants() == []
    sim.resubmit(task("a", resources={"GPU": 1}), task("b", resources={"GPU": 1}))
    sim.resubmit(task("c", resources={"GPU": 1}))
    sim.end_wait()
    sim.finish("a", run=("w1", 1))
    assert sim.computed_keys() == []  # still one GPU in use: none free of the one left
    sim.finish("b", run=("w1", 2))
    assert sim.computed_keys() == ["c"]


def test_held_results_keep_their_sizes_for_placement() -> None:
    sim = RecoverySim()
    sim.rejoin("small", held={"s": 10})
    sim.rejoin("big", held={"b": 10_000_000})
    sim.resubmit(task("s"), task("b"), task("out", ["s", "b"]))
    sim.end_wait()
    assert sim.state.tasks["b"].nbytes == 10_000_000
    assert sim.computed_keys("big") == ["out"]  # where the bytes are


def test_an_error_reported_by_a_worker_is_kept_not_computed_again() -> None:
    sim = RecoverySim()
    error = {"key": "bad", "exception": b"pickled", "traceback": "Traceback: boom"}
    sim.rejoin("w1", erred=[error])
    sim.resubmit(task("bad"), task("after", ["bad"]))
    sim.end_wait()
    assert sim.computes == []
    assert sim.states() == {"bad": "erred", "after": "erred"}
    (erred,) = [m for m in sim.client_messages("task-erred") if m["key"] == "bad"]
    assert erred["exception"] == b"pickled" and erred["traceback"] == "Traceback: boom"


def test_a_reported_error_of_a_task_with_retries_left_runs_it_again() -> None:
    sim = RecoverySim()
    sim.resubmit(task("flaky", retries=1))
    error = {"key": "flaky", "exception": b"pickled", "traceback": ""}
    sim.rejoin("w1")
    sim.rejoin("w2", erred=[error])
    sim.end_wait()
    assert sim.computed_keys() == ["flaky"]
    assert sim.state.tasks["flaky"].retries == 0


def test_no_worker_warnings_wait_for_the_end_of_the_recovery_wait() -> None:
    sim = RecoverySim()
    sim.submit("gpu-task", resources={"GPU": 1})  # a plain submission, no GPU worker back yet
    assert sim.client_messages("no-worker") == []
    sim.rejoin("w1", {"GPU": 1})  # back in time: no warning at all
    sim.end_wait()
    assert sim.client_messages("no-worker") == []
    sim.submit("tpu-task", resources={"TPU": 1})  # after the wait: warned at once
    assert [m["keys"] for m in sim.client_messages("no-worker")] == [["tpu-task"]]


def test_no_worker_warnings_held_back_are_sent_when_the_wait_ends() -> None:
    sim = RecoverySim()
    sim.submit("tpu-task", resources={"TPU": 1})
    assert sim.client_messages("no-worker") == []
    assert sim.state.next_deadline() == WAIT
    sim.end_wait()
    assert [m["keys"] for m in sim.client_messages("no-worker")] == [["tpu-task"]]


def test_a_worker_back_with_more_runs_than_its_slots_keeps_them_all_and_takes_no_more() -> None:
    # A worker the previous scheduler sent a deep queue of short runs (scheduler/prefetch.py).
    sim = RecoverySim()
    queued = [run(f"t{i}", 100 + i) for i in range(20)]
    sim.rejoin("w1", nthreads=1, running=queued)  # invariants checked: none broken
    sim.resubmit(*(task(r["key"]) for r in queued), task("later"))
    sim.end_wait()
    ws = sim.state.workers["w1"]
    assert len(ws.processing) == 20 and ws.max_slots == 20
    assert sim.computed_keys() == []  # nothing sent while its runs fill its slots
    for r in queued[:19]:
        sim.finish(r["key"], run=("w1", r["run_id"]))
    assert ws.max_slots == 1 + sim.state.settings.prefetch
    assert sim.computed_keys() == ["later"]
