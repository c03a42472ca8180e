"""Tasks that submit tasks, on real processes: worker_client / secede / rejoin, with
resources (what a seceded task holds, the deadlock it can cause) and cancellation."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator

import cloudpickle
import pytest

from apportion import (
    CancelledError,
    Client,
    LocalCluster,
    ResourceDeadlockError,
    get_client,
    get_worker,
    rejoin,
    secede,
    worker_client,
)
from tests.conftest import wait_until
from tests.integration.conftest import assert_back_to_idle

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def tree(depth: int, fanout: int) -> int:
    """Count the leaves of a tree of tasks, each level submitted by the one above."""
    if depth == 0:
        return 1
    with worker_client() as client:
        children = [client.submit(tree, depth - 1, fanout, pure=False) for _ in range(fanout)]
        return sum(client.gather(children))


def gpu_parent(release: bool) -> dict:
    """A GPU task that waits for a GPU subtask."""
    before = dict(get_worker().task.units)  # type: ignore[union-attr]
    with worker_client(release_resources=release) as client:
        child = client.submit(gpu_child, resources={"GPU": 1}, pure=False).result()
    after = dict(get_worker().task.units)  # type: ignore[union-attr]
    return {"before": before, "child": child, "after": after}


def gpu_child() -> dict:
    return dict(get_worker().task.units)  # type: ignore[union-attr]


def wait_for(path: str) -> str:
    while not os.path.exists(path):  # the task's own work: until the test says so
        import time

        time.sleep(0.01)
    return path


def parent_waiting_on(path: str) -> str:
    with worker_client() as client:
        return str(client.submit(wait_for, path, pure=False).result())


def manual_secede() -> int:
    client = get_client()
    future = client.submit(sum, [1, 2, 3])
    secede()
    value = int(future.result())
    rejoin()
    return value


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(
        workers=[
            {"name": "cpu-1", "nthreads": 1},
            {"name": "cpu-2", "nthreads": 1},
            {"name": "gpu", "nthreads": 2, "resources": {"GPU": 1}},
        ]
    ) as cluster:
        yield cluster


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster) as client:
        yield client
        assert_back_to_idle(client, runs_too=True)


def test_a_task_tree_three_levels_deep_runs_on_single_thread_workers(client: Client) -> None:
    # 1 + 3 + 9 + 27 tasks on four threads in all: only seceded parents make room.
    assert client.submit(tree, 3, 3, pure=False).result(timeout=120) == 27


def test_secede_and_rejoin_by_hand(client: Client) -> None:
    assert client.submit(manual_secede, pure=False).result(timeout=60) == 6


def test_gpu_task_waiting_for_a_gpu_subtask_fails_with_a_clear_error_instead_of_hanging(
    client: Client,
) -> None:
    # The only GPU is the parent's, kept while it waits: the subtask could never run.
    future = client.submit(gpu_parent, False, resources={"GPU": 1}, pure=False)
    with pytest.raises(ResourceDeadlockError) as caught:
        future.result(timeout=60)
    message = str(caught.value)
    assert "needs GPU=1" in message and "worker(s) ['gpu']" in message
    assert "gpu_parent" in message and "release_resources=True" in message


def test_releasing_the_gpu_while_waiting_lets_the_subtask_have_it(client: Client) -> None:
    record = client.submit(gpu_parent, True, resources={"GPU": 1}, pure=False).result(60)
    assert record == {"before": {"GPU": [0]}, "child": {"GPU": [0]}, "after": {"GPU": [0]}}


def test_cancelling_a_waiting_parent_cancels_its_subtasks_and_frees_everything(
    client: Client,
) -> None:
    path = os.path.join(tempfile.mkdtemp(), "never")
    parent = client.submit(parent_waiting_on, path, pure=False)
    wait_until(
        lambda: client.scheduler_info()["tasks"].get("processing", 0) == 2,
        timeout=30,
        what="parent and child running",
    )
    parent.cancel()
    with pytest.raises(CancelledError):
        parent.result(timeout=30)
    # The subtask, wanted only by the parent's client, is cancelled with it.
    wait_until(lambda: not client.scheduler_info()["tasks"], timeout=30, what="both forgotten")
    # The child still sleeps in its thread (threads cannot be interrupted); let it end.
    open(path, "w").close()
