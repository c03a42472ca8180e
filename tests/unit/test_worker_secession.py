"""Seceded runs on the worker's state machine (worker/state.py): ``secede``, ``rejoin`` and
the scheduler's ``reacquired`` as events, answered with instructions, with no threads or
sockets (``Node``, tests/unit/worker_node.py, plays the task threads)."""

from __future__ import annotations

import pytest
from apportion.worker.output import units_held
from apportion.worker.state import Resume, Send

from tests.unit.worker_node import Node


def test_a_seceded_run_gives_its_thread_to_the_next_ready_task_and_keeps_its_resources() -> None:
    node = Node(nthreads=1, resources={"GPU": 1})
    node.compute("parent", resources={"GPU": 1})
    node.compute("gpu-child", resources={"GPU": 1}, priority=5)
    node.compute("child")
    assert node.started == ["parent"]
    node.secede("parent")
    assert node.ops("secede") == [
        {"op": "secede", "key": "parent", "run_id": node.running["parent"].run_id, "release": False}
    ]
    # Its thread went to the next task that fits: the GPU is still the parent's.
    assert node.started == ["parent", "child"]
    assert node.running["parent"].units == {"GPU": [0]}
    node.finish("child")
    assert node.started == ["parent", "child"]  # a thread is free, the GPU is not


def test_a_run_seceding_with_its_resources_lends_them_until_the_scheduler_grants_them_back() -> (
    None
):
    node = Node(nthreads=1, resources={"GPU": 1})
    node.compute("parent", resources={"GPU": 1})
    node.compute("gpu-child", resources={"GPU": 1})
    node.secede("parent", release=True)
    assert node.ops("secede")[0]["release"] is True
    assert node.started == ["parent", "gpu-child"]
    assert node.running["gpu-child"].units == {"GPU": [0]}
    instructions = node.rejoin("parent")
    run_id = node.running["parent"].run_id
    assert instructions == [Send({"op": "reacquire", "key": "parent", "run_id": run_id})]
    node.compute("later")
    node.reacquired("parent")  # granted by the scheduler; here the child still holds it
    assert node.resumed == [] and node.started == ["parent", "gpu-child"]
    node.finish("gpu-child")
    # The parent takes the thread and the GPU before the ready task.
    assert node.resumed == ["parent"] and node.started == ["parent", "gpu-child"]
    assert node.ops("rejoin") == [{"op": "rejoin", "key": "parent", "run_id": run_id}]
    assert node.running["parent"].units == {"GPU": [0]}
    node.finish("parent")
    assert node.started[-1] == "later"


def test_a_rejoining_run_takes_the_next_free_thread_before_any_ready_task() -> None:
    node = Node(nthreads=1)
    node.compute("parent")
    node.secede("parent")
    node.compute("child")
    node.compute("urgent", priority=9)
    assert node.started == ["parent", "child"]
    assert node.rejoin("parent") == []  # waits for a thread
    node.finish("child")
    assert node.resumed == ["parent"] and node.started == ["parent", "child"]
    node.finish("parent")
    assert node.started == ["parent", "child", "urgent"]


def test_a_run_rejoining_while_a_thread_is_free_resumes_at_once() -> None:
    node = Node(nthreads=2)
    node.compute("parent")
    node.secede("parent")
    instructions = node.rejoin("parent")
    task = node.running["parent"]
    # (Instructions are named tuples: equal contents compare equal whatever the type.)
    assert [type(i) for i in instructions] == [Send, Resume]
    assert instructions == [
        Send({"op": "rejoin", "key": "parent", "run_id": task.run_id}),
        Resume(task),
    ]
    assert node.state.running == 1 and task.status == "running"


def test_rejoin_of_a_run_that_has_its_thread_answers_resume_at_once() -> None:
    node = Node()
    node.compute("a")
    task = node.running["a"]
    (resume,) = node.rejoin("a")
    assert type(resume) is Resume and resume.task is task
    assert node.sent == [] and node.state.running == 1


def test_seceding_twice_changes_nothing() -> None:
    node = Node(nthreads=1, resources={"GPU": 1})
    node.compute("a", resources={"GPU": 1})
    node.secede("a", release=True)
    assert node.secede("a") == [] and node.secede("a", release=True) == []
    assert len(node.ops("secede")) == 1 and node.state.running == 0


def test_seceding_without_resources_to_release_keeps_nothing_to_grant_back() -> None:
    node = Node(nthreads=1)
    node.compute("a")
    node.secede("a", release=True)
    assert node.ops("secede")[0]["release"] is False
    rejoin, resume = node.rejoin("a")  # no reacquire: a thread is free
    assert rejoin == Send({"op": "rejoin", "key": "a", "run_id": node.running["a"].run_id})
    assert type(resume) is Resume and resume.task is node.running["a"]


@pytest.mark.parametrize("release", [False, True])
def test_a_run_that_ends_seceded_gives_back_only_what_it_still_holds(release: bool) -> None:
    node = Node(nthreads=1, resources={"GPU": 2})
    node.compute("parent", resources={"GPU": 1})
    node.secede("parent", release=release)
    node.compute("child", resources={"GPU": 1})
    node.finish("parent")  # never rejoined (secede() without rejoin())
    assert node.state.running == 1 and node.state.ledger.used["GPU"] == 1
    node.finish("child")
    assert node.state.running == 0 and node.state.ledger.used["GPU"] == 0


def test_a_cancelled_seceded_run_is_reported_released_when_it_ends() -> None:
    node = Node(nthreads=1)
    node.compute("parent")
    node.secede("parent")
    node.apply(node.state.cancel(node.running["parent"].run_id))
    assert node.state.registration_report()["running"][0]["cancelled"] is True
    node.finish("parent")
    assert [m["key"] for m in node.ops("task-released")] == ["parent"]
    assert node.ops("task-finished") == []


def test_a_grant_for_a_run_not_asking_for_one_changes_nothing() -> None:
    node = Node(nthreads=1, resources={"GPU": 1})
    node.compute("a", resources={"GPU": 1})
    assert node.reacquired("a") == []
    node.secede("a", release=True)
    assert node.reacquired("a") == []  # granted before it asked: not taken
    assert node.state.ledger.used["GPU"] == 0
    assert node.state.reacquired(12345) == []


def test_the_books_stay_straight_through_random_secessions() -> None:
    import random

    resumed = 0
    for seed in range(10):
        rng = random.Random(seed)
        node = Node(nthreads=rng.randint(1, 3), resources={"GPU": 2, "MEM": 1.5})
        for step in range(300):
            roll = rng.random()
            free = sorted(k for k in node.running if k not in node.waiting)
            asked = sorted(k for k in node.running if node.running[k].status == "reacquiring")
            if roll < 0.3:
                demand = rng.choice([{}, {"GPU": 1}, {"GPU": 2}, {"MEM": 0.5}])
                node.compute(f"t{step}", resources=demand, priority=rng.randint(0, 3))
            elif roll < 0.5 and free:
                node.finish(rng.choice(free))
            elif roll < 0.65 and free:
                node.secede(rng.choice(free), release=rng.random() < 0.5)
            elif roll < 0.8 and free:
                node.rejoin(rng.choice(free))
            elif roll < 0.9 and asked:
                node.reacquired(rng.choice(asked))
            elif roll < 0.95 and node.state.tasks:
                node.apply(node.state.cancel(rng.choice(sorted(node.state.tasks))))
            elif roll < 0.97:
                # (Never below a demand: a run that lent its GPUs would wait forever.)
                node.set_resources({"GPU": rng.choice([2, 3]), "MEM": 1.5})
            else:
                node.state.scheduler_lost()
        # Drain: grants come, every run ends, nothing is left holding resources.
        while node.running:
            for key in sorted(node.running):
                if node.running[key].status == "reacquiring":
                    node.reacquired(key)
            for key in sorted(node.running):
                if key in node.running and key not in node.waiting:
                    node.finish(key)
        assert node.state.running == 0 and node.state.rejoining == []
        assert all(abs(used) < 1e-9 for used in node.state.ledger.used.values())
        resumed += len(node.resumed)
    assert resumed > 50  # the walk did rejoin runs


def test_the_heartbeat_names_the_units_a_seceded_run_still_holds() -> None:
    node = Node(nthreads=3, resources={"GPU": 3})
    for key in ["kept", "gave", "cancelled"]:
        node.compute(key, resources={"GPU": 1})
    node.secede("kept")
    node.secede("gave", release=True)
    node.apply(node.state.cancel(node.running["cancelled"].run_id))
    held = units_held(node.state.tasks.values())
    assert held == {"units": [[node.running["kept"].run_id, {"GPU": [0]}]]}
