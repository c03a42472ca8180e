"""The worker's state machine (worker/state.py), driven without processes, threads or sockets
(``Node``, tests/unit/worker_node.py, plays the worker's edge and checks its books)."""

from __future__ import annotations

import pickle
from typing import get_args

import pytest
from apportion.worker.state import TRANSITIONS, Execute, InvalidTransition, TaskStatus

from apportion.serialize import dumps_exception, loads_exception, loads_value
from tests.unit.worker_node import Node
from tests.unit.worker_node import run_id_of as _run_id


# ---------------------------------------------------------------------------- runs
def test_a_task_without_inputs_runs_at_once_and_its_result_is_held_and_reported() -> None:
    node = Node()
    node.compute("a")
    assert node.started == ["a"]
    node.finish("a", value=42)
    (finished,) = node.ops("task-finished")
    assert finished["key"] == "a" and finished["run_id"] == _run_id("a")
    assert loads_value(finished["data"]) == 42  # small: travels with the report
    assert node.state.data == {"a": 42}
    assert node.state.tasks == {}


def test_a_large_result_stays_here_and_only_its_size_is_reported() -> None:
    node = Node(inline=10)
    node.compute("big")
    node.finish("big", value="x" * 1000)
    (finished,) = node.ops("task-finished")
    assert "data" not in finished and finished["nbytes"] > 1000
    assert node.state.data["big"] == "x" * 1000


def test_an_error_is_reported_and_nothing_is_held() -> None:
    node = Node()
    node.compute("bad")
    node.err("bad")
    (erred,) = node.ops("task-erred")
    assert isinstance(loads_value(erred["exception"]), ValueError)
    assert "bad failed" in erred["traceback"]
    assert node.state.data == {}


def test_tasks_beyond_the_threads_wait_and_the_most_urgent_starts_next() -> None:
    node = Node(nthreads=1)
    node.compute("first")
    node.compute("low", priority=0)
    node.compute("high", priority=5)
    node.compute("mid", priority=2)
    assert node.started == ["first"]
    instructions = node.finish("first")
    # The finishing thread's instructions start the next task first (it runs it itself).
    assert isinstance(instructions[0], Execute) and instructions[0].task.key == "high"
    node.finish("high")
    node.finish("mid")
    assert node.started == ["first", "high", "mid", "low"]


def test_equal_priorities_start_in_arrival_order() -> None:
    node = Node(nthreads=1)
    for key in ["a", "b", "c", "d"]:
        node.compute(key)
    for key in ["a", "b", "c"]:
        node.finish(key)
    assert node.started == ["a", "b", "c", "d"]


def test_clients_are_told_directly_only_when_the_worker_goes_idle() -> None:
    node = Node(nthreads=1)
    node.compute("a", notify=["client-1"])
    node.compute("b", notify=["client-1"])
    node.finish("a")
    assert node.told == []  # b starts at once: busy workers leave it to the scheduler
    node.finish("b")
    ((clients, message),) = node.told
    assert clients == ["client-1"] and message["key"] == "b"
    assert message is node.ops("task-finished")[-1]  # the edge names who it told in it
    node.compute("c", notify=["client-1"])
    node.finish("c", busy=True)  # more work already on its way to a thread
    assert len(node.told) == 1


# ----------------------------------------------------------------- resources
def test_a_task_starts_only_when_its_resources_are_free_whatever_the_threads() -> None:
    node = Node(nthreads=4, resources={"GPU": 2})
    node.compute("g1", resources={"GPU": 1})
    node.compute("g2", resources={"GPU": 2})
    node.compute("g3", resources={"GPU": 1})
    node.compute("cpu")
    # g2 does not fit while g1 holds a GPU; g3 and cpu, behind it, do.
    assert node.started == ["g1", "g3", "cpu"]
    node.finish("g1")
    assert node.started == ["g1", "g3", "cpu"]
    node.finish("g3")
    assert node.started[-1] == "g2"
    assert node.running["g2"].units == {"GPU": [0, 1]}


def test_whole_units_are_granted_and_given_back() -> None:
    node = Node(nthreads=2, resources={"GPU": 2})
    node.compute("a", resources={"GPU": 1})
    node.compute("b", resources={"GPU": 1})
    assert node.running["a"].units == {"GPU": [0]}
    assert node.running["b"].units == {"GPU": [1]}
    node.finish("a")
    node.compute("c", resources={"GPU": 1})
    assert node.running["c"].units == {"GPU": [0]}


def test_a_demand_beyond_what_the_worker_declared_errs_at_once() -> None:
    node = Node(resources={"GPU": 1})
    node.compute("huge", resources={"GPU": 2})
    (erred,) = node.ops("task-erred")
    assert "needs GPU=2" in str(loads_value(erred["exception"]))
    assert node.started == [] and node.state.tasks == {}


def test_set_resources_raises_the_totals_and_starts_what_fits_now() -> None:
    node = Node(nthreads=2, resources={"GPU": 1})
    node.compute("a", resources={"GPU": 1})
    node.compute("b", resources={"GPU": 1})
    assert node.started == ["a"]
    node.set_resources({"GPU": 2})
    assert node.started == ["a", "b"] and node.running["b"].units == {"GPU": [1]}
    assert node.state.resources == {"GPU": 2}
    assert node.state.story("b")[-1][1:4] == ("ready", "running", "set-resources")


def test_set_resources_lowering_the_totals_keeps_the_runs_and_holds_back_new_ones() -> None:
    node = Node(nthreads=4, resources={"GPU": 2})
    node.compute("a", resources={"GPU": 1})
    node.compute("b", resources={"GPU": 1})
    node.set_resources({"GPU": 1})
    node.compute("c", resources={"GPU": 1})
    node.finish("a")
    assert node.started == ["a", "b"]  # one GPU of one still taken by b
    node.finish("b")
    assert node.started == ["a", "b", "c"] and node.running["c"].units == {"GPU": [0]}
    node.compute("too-big", resources={"GPU": 2})  # beyond the new total: errs at once
    (erred,) = node.ops("task-erred")
    assert "needs GPU=2" in str(loads_value(erred["exception"]))


# --------------------------------------------------------------------- fetches
def test_inputs_held_elsewhere_are_fetched_once_and_reported_as_copies() -> None:
    node = Node(nthreads=2)
    node.compute("y", deps={"x": ["peer"]})
    node.compute("z", deps={"x": ["peer"]})
    assert [(f.key, f.holders) for f in node.fetches] == [("x", ["peer"])]
    assert node.started == []
    node.fetched("x", 7)
    assert node.started == ["y", "z"]
    assert node.ops("data-acquired") == [{"op": "data-acquired", "key": "x", "replica": True}]
    assert node.state.data["x"] == 7


def test_an_input_held_here_needs_no_fetch() -> None:
    node = Node()
    node.compute("x")
    node.finish("x", value=3)
    node.compute("y", deps={"x": ["w"]})
    assert node.fetches == [] and node.started == ["x", "y"]


def test_inputs_sent_with_a_task_are_not_fetched_and_go_once_no_task_needs_them() -> None:
    node = Node(nthreads=1)
    node.compute("blocker")
    node.compute("y", deps={"x": ["peer"], "far": ["peer"]}, inputs={"x": 7})
    node.compute("z", deps={"x": ["peer"]})  # x is here already: nothing more is fetched
    assert [f.key for f in node.fetches] == ["far"]
    assert node.state.data["x"] == 7 and node.state.nbytes["x"] == len(pickle.dumps(7))
    assert node.ops("data-acquired") == []  # the scheduler does not count this copy...
    node.finish("blocker")
    node.fetched("far", 1)
    node.finish("z")  # (it started first: y waited for far)
    assert "x" in node.state.data  # (y still needs it)
    node.finish("y")
    assert "x" not in node.state.data  # ...so it goes once no task here needs it
    assert node.state.registration_report()["held"].keys() == {"blocker", "far", "y", "z"}


def test_an_input_sent_with_a_task_while_it_is_being_fetched_waits_for_the_fetch() -> None:
    node = Node()
    node.compute("y", deps={"x": ["peer"]})
    node.compute("z", deps={"x": ["peer"]}, inputs={"x": 7})
    assert [f.key for f in node.fetches] == ["x"] and node.started == []
    node.fetched("x", 7)
    assert node.started == ["y"]
    node.finish("y")
    node.finish("z")
    assert node.state.data["x"] == 7  # fetched, so counted by the scheduler: kept


def test_a_result_made_here_stays_though_a_copy_sent_with_a_task_was_to_go() -> None:
    node = Node(nthreads=2)
    node.compute("y", deps={"x": ["peer"]}, inputs={"x": 7})
    node.compute("x", run_id=99)  # the scheduler has it made here too (its holder died)
    node.finish("x", value=7)
    node.finish("y")
    assert node.state.data["x"] == 7  # reported held here: it stays
    node.apply(node.state.acquire("y", ["retiring"]))
    assert "y" in node.state.data


def test_a_result_made_here_again_after_the_scheduler_freed_its_copy_stays() -> None:
    node = Node(nthreads=2)
    node.compute("y", deps={"x": ["peer"]})
    node.fetched("x", 7)
    node.state.free_keys(["x"])  # y still needs it: it goes when y ends...
    node.compute("x", run_id=99)  # ...but the scheduler has x made here meanwhile
    node.finish("x", value=7)
    node.finish("y")
    assert node.state.data["x"] == 7  # reported held here: it stays


def test_a_copy_sent_with_a_task_is_kept_once_the_scheduler_asks_for_it() -> None:
    node = Node(nthreads=1)
    node.compute("y", deps={"x": ["peer"]}, inputs={"x": 7})
    node.apply(node.state.acquire("x", ["retiring"]))
    assert node.ops("data-acquired") == [{"op": "data-acquired", "key": "x"}]
    node.finish("y")
    assert node.state.data["x"] == 7


def test_a_failed_fetch_sends_the_task_back_as_missing_its_input() -> None:
    node = Node()
    node.compute("y", deps={"x": ["dead-peer"], "other": ["peer"]})
    node.fetch_failed("x")
    (missing,) = node.ops("missing-deps")
    assert missing == {
        "op": "missing-deps",
        "key": "y",
        "run_id": _run_id("y"),
        "missing": {"x": ["dead-peer"]},
    }
    assert node.state.tasks == {}
    node.fetched("other", 1)  # arrives anyway: kept as a copy, no task starts
    assert node.started == [] and node.state.data == {"other": 1}


def test_an_input_that_does_not_load_fails_the_tasks_waiting_for_it() -> None:
    node = Node()
    node.compute("y", deps={"x": ["peer"], "other": ["peer"]})
    node.compute("z", deps={"x": ["peer"]})
    node.state.acquire("x", ["peer"])
    error, text = dumps_exception(RuntimeError("x does not load here"))
    stale = node.state.fetch_unloadable("x", node.state.epoch - 1, error, text)
    assert stale == []  # from a scheduler before the last one: nothing of it is known
    node.apply(node.state.fetch_unloadable("x", node.state.epoch, error, text))
    erred = node.ops("task-erred")
    assert [(m["key"], m["run_id"]) for m in erred] == [("y", _run_id("y")), ("z", _run_id("z"))]
    assert all(m["exception"] == error and m["traceback"] == text for m in erred)
    assert node.ops("missing-deps") == []  # not fetched again, nor made again
    (refused,) = node.ops("acquire-failed")
    assert refused["key"] == "x"
    assert node.state.tasks == {} and list(node.state.fetching) == ["other"]
    node.fetched("other", 1)  # arrives anyway: kept as a copy, no task starts
    assert node.started == []


def test_a_freed_key_goes_only_once_no_task_here_needs_it() -> None:
    node = Node(nthreads=1)
    node.compute("blocker")
    node.compute("y", deps={"x": ["peer"]})
    node.fetched("x", 1)
    node.state.free_keys(["x"])  # the scheduler no longer keeps x; y still needs it
    assert node.state.data["x"] == 1
    node.finish("blocker")
    node.finish("y")
    assert "x" not in node.state.data and "y" in node.state.data
    node.state.free_keys(["y", "blocker", "unknown"])
    assert node.state.data == {}


def test_acquire_copies_a_result_for_a_retiring_peer_and_reports_it() -> None:
    node = Node()
    node.apply(node.state.acquire("x", ["retiring"]))
    node.fetched("x", 5)
    assert node.ops("data-acquired") == [{"op": "data-acquired", "key": "x", "replica": False}]
    node.apply(node.state.acquire("y", ["retiring"]))
    node.apply(node.state.fetch_failed("y", node.state.epoch, "no holder answered"))
    (failed,) = node.ops("acquire-failed")
    assert failed["key"] == "y" and "no holder" in failed["reason"]


# ---------------------------------------------------------------------- cancel
def test_cancelling_a_task_not_yet_running_releases_it_at_once() -> None:
    node = Node(nthreads=1)
    node.compute("running")
    node.compute("waiting")
    node.compute("fetching", deps={"x": ["peer"]})
    node.apply(node.state.cancel(_run_id("waiting")))
    node.apply(node.state.cancel(_run_id("fetching")))
    assert [m["key"] for m in node.ops("task-released")] == ["waiting", "fetching"]
    node.fetched("x")  # nothing waits for it any more
    node.finish("running")
    assert node.started == ["running"]


def test_a_cancelled_run_keeps_its_resources_until_it_ends_then_its_result_is_dropped() -> None:
    node = Node(nthreads=2, resources={"GPU": 1})
    node.compute("a", resources={"GPU": 1})
    node.apply(node.state.cancel(_run_id("a")))
    assert node.ops("task-released") == []
    node.compute("b", resources={"GPU": 1})
    assert node.started == ["a"]  # a still holds the GPU
    node.finish("a")
    assert [m["key"] for m in node.ops("task-released")] == ["a"]
    assert node.ops("task-finished") == [] and "a" not in node.state.data
    assert node.started == ["a", "b"]


def test_cancelling_an_unknown_run_does_nothing() -> None:
    node = Node()
    assert node.state.cancel(12345) == []


# ------------------------------------------------------ losing and resuming the scheduler
def test_after_the_scheduler_is_lost_results_and_runs_stay_and_unstarted_tasks_go() -> None:
    node = Node(nthreads=2, resources={"GPU": 1})
    node.compute("old", resources={"GPU": 1})
    node.compute("queued", resources={"GPU": 1})
    node.compute("fetching", deps={"x": ["peer"]})
    node.state.data["kept"] = 1
    node.state.scheduler_lost()
    assert node.state.data == {"kept": 1} and node.state.ready == []
    assert [t.key for t in node.state.tasks.values()] == ["old"]
    assert node.state.needed == {} and node.state.fetching == {}
    node.fetched("x", epoch=0)  # a fetch for the old scheduler: ignored
    assert "x" not in node.state.data
    # Ends before a new scheduler heard of it: the result is kept, nothing is reported.
    node.finish("old", value="old result")
    assert node.sent == [] and node.state.data["old"] == "old result"
    report = node.state.registration_report()
    old_size = len(pickle.dumps("old result"))
    assert report == {
        "op": "recover",
        "held": {"kept": 0, "old": old_size},
        "running": [],
        "erred": [],
        # The run's attempt: a newer one may run elsewhere by now (see decide_held).
        "attempts": {"old": 1},
    }


def test_a_run_knows_its_attempt_and_reports_it_to_a_new_scheduler() -> None:
    node = Node()
    node.compute("again", run_id=3, attempt=4)
    (task,) = node.state.tasks.values()
    assert task.attempt == 4
    node.state.scheduler_lost()
    (run,) = node.state.registration_report()["running"]
    assert run["attempt"] == 4


def test_a_new_scheduler_hears_of_runs_in_threads_with_their_resources_then_of_their_ends() -> None:
    node = Node(nthreads=2, resources={"GPU": 2})
    node.compute("gpu", run_id=7, resources={"GPU": 2})
    node.compute("plain", run_id=8)
    node.apply(node.state.cancel(8))  # cancelled while it runs: reported as such
    node.state.scheduler_lost()
    report = node.state.registration_report()
    assert report["held"] == {}
    assert report["running"] == [
        {"key": "gpu", "run_id": 7, "resources": {"GPU": 2}, "cancelled": False, "attempt": 1},
        {"key": "plain", "run_id": 8, "resources": {}, "cancelled": True, "attempt": 1},
    ]
    # Adopted by the new scheduler: its end is reported to it, under the same run id.
    node.finish("gpu", value=5)
    (finished,) = node.ops("task-finished")
    assert finished["key"] == "gpu" and finished["run_id"] == 7
    node.finish("plain")
    assert [m["run_id"] for m in node.ops("task-released")] == [8]
    # A new scheduler's task starts once the old run gave the GPUs back.
    node.compute("new", run_id=9, resources={"GPU": 2})
    assert node.started[-1] == "new"


def test_freed_keys_still_needed_are_not_reported_as_held() -> None:
    node = Node()
    node.compute("t", deps={"d": ["peer"]})
    node.fetched("d")
    node.state.free_keys(["d"])  # doomed: goes once t ends
    node.state.scheduler_lost()
    assert node.state.registration_report()["held"] == {}


def test_an_error_while_no_scheduler_listens_is_kept_for_the_next_one_once() -> None:
    node = Node()
    node.compute("bad")
    node.state.scheduler_lost()
    node.err("bad")
    assert node.sent == [] and "bad" not in node.state.data
    (erred,) = node.state.registration_report()["erred"]
    assert erred["key"] == "bad" and "bad failed" in erred["traceback"]
    assert isinstance(loads_exception(erred["exception"], ""), ValueError)
    assert node.state.registration_report()["erred"] == []  # handed over


def test_a_new_scheduler_hears_the_sizes_of_results_computed_and_fetched() -> None:
    node = Node()
    node.compute("big")
    node.finish("big", value="x" * 5000)
    node.compute("t", deps={"d": ["peer"]})
    node.apply(node.state.fetched("d", "y", node.state.epoch, 1234))
    node.state.scheduler_lost()
    held = node.state.registration_report()["held"]
    assert held["big"] == len(pickle.dumps("x" * 5000)) and held["d"] == 1234


def test_a_seceded_run_is_reported_as_it_stands() -> None:
    node = Node(nthreads=2, resources={"GPU": 1})
    node.compute("kept", run_id=1)
    node.compute("gave", run_id=2, resources={"GPU": 1})
    node.secede("kept", release=False)
    node.secede("gave", release=True)
    node.rejoin("gave")
    # Asked the scheduler for its resources back (lost with it): not granted yet.
    assert node.ops("reacquire") == [{"op": "reacquire", "key": "gave", "run_id": 2}]
    assert node.resumed == []
    node.state.scheduler_lost()
    runs = {run["key"]: run for run in node.state.registration_report()["running"]}
    assert runs["kept"]["seceded"] and not runs["kept"]["released"]
    assert runs["gave"]["released"] and runs["gave"]["reacquiring"]
    node.reacquired("gave")  # the new scheduler grants them: a thread is free
    runs = {run["key"]: run for run in node.state.registration_report()["running"]}
    assert "seceded" not in runs["gave"]  # rejoined, its GPU its own again
    assert node.state.ledger.used["GPU"] == 1


# ------------------------------------------------------------ transitions and story
def test_every_status_change_is_one_the_table_allows_and_is_told_in_the_story() -> None:
    node = Node(nthreads=1, resources={"GPU": 1})
    node.compute("a", resources={"GPU": 1})
    node.compute("b", deps={"x": ["peer"]})
    node.fetched("x")
    node.secede("a", release=True)
    node.rejoin("a")
    node.reacquired("a")
    node.finish("b")
    node.finish("a")
    story = [entry[:4] for entry in node.state.story("a", "b")]
    assert story == [
        ("a", "new", "ready", "compute"),
        ("a", "ready", "running", "compute"),
        ("b", "new", "fetching", "compute"),
        ("b", "fetching", "ready", "fetched"),
        ("a", "running", "seceded-released", "secede"),
        ("b", "ready", "running", "secede"),  # in the thread a gave back
        ("a", "seceded-released", "reacquiring", "rejoin"),
        ("a", "reacquiring", "granted", "reacquired"),
        ("b", "running", "done", "free-run"),
        ("a", "granted", "running", "free-run"),  # once b gave the thread and the GPU back
        ("a", "running", "done", "free-run"),
    ]
    assert all((start, finish) in TRANSITIONS for _, start, finish, _ in story)
    times = [entry[4] for entry in node.state.story("a", "b")]
    assert times == sorted(times)


def test_the_table_knows_only_the_statuses_a_task_can_have() -> None:
    statuses = set(get_args(TaskStatus))
    assert {status for pair in TRANSITIONS for status in pair} == statuses
    # A run ends only from a thread it holds or left; a task that never ran is dropped.
    assert {start for start, finish in TRANSITIONS if finish == "done"} == {
        "running",
        "seceded",
        "seceded-released",
    }
    assert ("ready", "done") not in TRANSITIONS and ("fetching", "running") not in TRANSITIONS


def test_freeing_a_run_twice_is_an_invalid_transition_and_changes_nothing() -> None:
    node = Node(nthreads=1, resources={"GPU": 1})
    node.compute("a", resources={"GPU": 1})
    task = node.running["a"]
    node.finish("a")
    with pytest.raises(InvalidTransition) as raised:
        node.state.free_run(task)
    assert (raised.value.key, raised.value.start, raised.value.finish) == ("a", "done", "done")
    assert [entry[2] for entry in raised.value.story] == ["ready", "running", "done"]
    assert node.state.running == 0 and node.state.ledger.used["GPU"] == 0
    assert node.state.check_invariants() == []


def test_freeing_a_task_that_never_ran_is_an_invalid_transition() -> None:
    node = Node(nthreads=1)
    node.compute("running")
    node.compute("waiting")
    waiting = node.state.ready[0]
    with pytest.raises(InvalidTransition, match="from 'ready' to 'done'"):
        node.state.free_run(waiting)


def test_a_cancel_of_a_run_in_its_thread_is_told_in_the_story_without_a_change() -> None:
    node = Node(nthreads=1)
    node.compute("a")
    node.apply(node.state.cancel(_run_id("a")))
    node.compute("b")
    node.apply(node.state.cancel(_run_id("b")))
    assert [entry[1:4] for entry in node.state.story("a")] == [
        ("new", "ready", "compute"),
        ("ready", "running", "compute"),
        ("running", "running", "cancel"),
    ]
    assert [entry[1:4] for entry in node.state.story("b")][-1] == ("ready", "dropped", "cancel")


def test_the_story_keeps_only_the_latest_changes() -> None:
    node = Node(nthreads=1, story_length=5)
    for key in ["a", "b", "c"]:
        node.compute(key)
        node.finish(key)
    assert node.state.story("a") == []
    assert [entry[2] for entry in node.state.story("b", "c")] == [
        "running",
        "done",
        "ready",
        "running",
        "done",
    ]


# ------------------------------------------------------------------ random walk
@pytest.mark.parametrize("seed", range(20))
def test_random_events_keep_the_books_straight(seed: int) -> None:
    import random

    rng = random.Random(seed)
    node = Node(nthreads=rng.randint(1, 3), resources={"GPU": 2, "MEM": 1.5})
    for step in range(300):
        roll = rng.random()
        if roll < 0.35:
            demand = rng.choice([{}, {"GPU": 1}, {"GPU": 2}, {"MEM": 0.5}, {"GPU": 1, "MEM": 1}])
            deps = {f"d{rng.randint(0, 4)}": ["peer"]} if rng.random() < 0.3 else {}
            inputs = dict.fromkeys(deps, "sent") if rng.random() < 0.5 else None
            node.compute(
                f"t{step}", resources=demand, deps=deps, priority=rng.randint(0, 3), inputs=inputs
            )
        elif roll < 0.6 and node.running:
            key = rng.choice(sorted(node.running))
            node.finish(key) if rng.random() < 0.8 else node.err(key)
        elif roll < 0.7 and node.state.fetching:
            key = rng.choice(sorted(node.state.fetching))
            node.fetched(key) if rng.random() < 0.8 else node.fetch_failed(key)
        elif roll < 0.8 and node.state.tasks:
            node.apply(node.state.cancel(rng.choice(sorted(node.state.tasks))))
        elif roll < 0.85 and node.state.data:
            node.state.free_keys([rng.choice(sorted(node.state.data))])
        elif roll < 0.87:
            node.state.scheduler_lost()
    # Drain: everything started ends; nothing is left holding resources.
    while node.running or node.state.fetching:
        for key in sorted(node.running):
            node.finish(key)
        for key in sorted(node.state.fetching):
            node.fetched(key)
    assert node.state.running == 0
    assert all(abs(used) < 1e-9 for used in node.state.ledger.used.values())
    assert node.state.ready == [] or all(
        not node.state.ledger.fits_now(t.shape) for t in node.state.ready
    )


# ------------------------------------------------------------------ pushes
def test_an_input_pushed_by_its_holder_is_awaited_not_asked_for() -> None:
    node = Node(nthreads=2)
    node.compute("y", deps={"x": ["holder", "other"]}, pushed={"x": 1_000_000})
    node.compute("z", deps={"x": ["holder", "other"]}, pushed={"x": 1_000_000})
    assert node.fetches == []
    assert [(a.key, a.pusher) for a in node.awaited] == [("x", "holder")]
    assert node.awaited[0].seconds > 5.0  # more for a large input
    node.apply(node.state.pushed("x", 7, 1_000_000))
    assert node.started == ["y", "z"]
    assert node.ops("data-acquired") == [{"op": "data-acquired", "key": "x", "replica": True}]
    # The same input once more (another holder's push, a fetch's late reply): dropped.
    assert node.apply(node.state.pushed("x", 8, 1_000_000)) == []
    assert node.state.data["x"] == 7


def test_an_input_pushed_before_its_task_arrives_is_held_as_a_copy_the_task_takes() -> None:
    node = Node()
    node.apply(node.state.pushed("x", 7, 10))
    assert node.ops("data-acquired") == [{"op": "data-acquired", "key": "x", "replica": True}]
    node.compute("y", deps={"x": ["holder"]}, pushed={"x": 10})
    assert node.fetches == [] and node.awaited == [] and node.started == ["y"]


def test_a_push_that_will_not_come_is_fetched_from_the_other_holders() -> None:
    node = Node()
    node.compute("y", deps={"x": ["holder", "other"]}, pushed={"x": 10})
    # Another peer's word counts for nothing: only the pusher's.
    assert node.apply(node.state.push_missed("x", "other")) == []
    node.apply(node.state.push_missed("x", "holder"))
    assert [(f.key, f.holders) for f in node.fetches] == [("x", ["other"])]
    node.fetched("x", 7)
    assert node.started == ["y"]


def test_a_push_from_a_holder_that_left_is_fetched_and_without_holders_fails_the_task() -> None:
    node = Node()
    node.compute("y", deps={"x": ["holder"]}, pushed={"x": 10})
    node.apply(node.state.pusher_left("holder"))
    assert [(f.key, f.holders) for f in node.fetches] == [("x", [])]
    node.fetch_failed("x")  # (what the edge reports for a fetch with no holder to ask)
    assert [m["key"] for m in node.ops("missing-deps")] == ["y"]


def test_a_late_push_is_fetched_from_every_holder_and_an_earlier_wait_ends_nothing() -> None:
    node = Node()
    node.compute("y", deps={"x": ["holder", "other"]}, pushed={"x": 10})
    (first,) = node.awaited
    node.apply(node.state.pushed("x", 7, 10))
    node.finish("y")
    node.state.free_keys(["x"])
    node.compute("z", deps={"x": ["holder", "other"]}, pushed={"x": 10})
    # The first wait runs out: it was for the push that came, not for this one.
    assert node.apply(node.state.push_missed("x", "holder", first.serial)) == []
    second = node.awaited[-1]
    node.apply(node.state.push_missed("x", "holder", second.serial))
    assert [(f.key, f.holders) for f in node.fetches] == [("x", ["other", "holder"])]
    # The push arrives after all: it serves the task; the fetch's reply will be dropped.
    node.apply(node.state.pushed("x", 7, 10))
    assert node.started == ["y", "z"]
    assert node.apply(node.state.fetched("x", 7, node.state.epoch)) == []


def test_a_stored_argument_adopted_here_is_held_and_serves_the_task_taking_it() -> None:
    node = Node()
    node.state.adopt("arg", b"value", 5)
    node.compute("use", deps={"arg": ["w"]})
    assert node.fetches == [] and node.started == ["use"] and node.sent == []
    assert node.state.registration_report()["held"] == {"arg": 5}
