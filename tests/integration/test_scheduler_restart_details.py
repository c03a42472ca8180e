"""A scheduler restart with tasks that submit tasks, large results, errors and no-worker
demands under way: real processes, the scheduler SIGKILLed and started again on the same
port (LocalCluster.restart_scheduler)."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from apportion import (
    Client,
    Event,
    Future,
    LocalCluster,
    Lock,
    ResourceDeadlockError,
    Semaphore,
    Variable,
    config,
    get_worker,
    worker_client,
)
from apportion.client import NoWorkerWarning
from tests.conftest import wait_until
from tests.integration.conftest import assert_back_to_idle

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def touch(path: str) -> None:
    with open(path, "a"):
        pass


def wait_for(path: str) -> None:
    import time

    while not os.path.exists(path):  # the task's own work: until the test says so
        time.sleep(0.01)


def log_run(folder: str, name: str) -> None:
    with open(os.path.join(folder, "runs"), "a") as f:
        f.write(name + "\n")


def runs(folder: Path) -> list[str]:
    path = folder / "runs"
    return path.read_text().split() if path.exists() else []


def releasing_parent(folder: str) -> dict:
    """A GPU task that gives its GPU back while it waits, then asks for it again."""
    log_run(folder, "parent")
    with worker_client(release_resources=True) as client:
        touch(os.path.join(folder, "seceded"))
        child = client.submit(log_run, folder, "child", pure=False).result()
        wait_for(os.path.join(folder, "rejoin"))
        touch(os.path.join(folder, "rejoining"))
    return {"child": child, "units": dict(get_worker().task.units)}


def gated_gpu_task(folder: str) -> str:
    log_run(folder, "blocker")
    wait_for(os.path.join(folder, "blocker-gate"))
    return "blocker"


def keeping_parent(folder: str) -> str:
    """A GPU task that keeps its GPU while it waits for a GPU subtask (a deadlock)."""
    with worker_client() as client:
        touch(os.path.join(folder, "seceded"))
        wait_for(os.path.join(folder, "submit"))
        return str(client.submit(log_run, folder, "child", resources={"GPU": 1}).result())


def gpu_info(client: Client) -> float:
    return sum(
        w["used_resources"].get("GPU", 0) for w in client.scheduler_info()["workers"].values()
    )


@pytest.fixture
def gpu_cluster() -> Iterator[LocalCluster]:
    with config.set({"scheduler.recovery-wait": 2.0}):
        cluster = LocalCluster(workers=[{"name": "gpu", "nthreads": 2, "resources": {"GPU": 1}}])
    yield cluster
    cluster.close()


def seceded_gpu_parent(client: Client, parent: Callable[[str], Any], folder: Path) -> Future:
    """Submit ``parent`` (GPU=1); return its future once it has seceded."""
    future = client.submit(parent, str(folder), resources={"GPU": 1})
    wait_until(lambda: (folder / "seceded").exists(), what="the parent seceded")
    return future


def test_a_task_waiting_to_rejoin_for_its_released_gpu_gets_it_from_the_new_scheduler(
    gpu_cluster: LocalCluster, tmp_path: Path
) -> None:
    folder = str(tmp_path)
    with Client(gpu_cluster) as client:
        parent = seceded_gpu_parent(client, releasing_parent, tmp_path)
        # Its GPU goes to another task meanwhile; the parent then asks for it back.
        blocker = client.submit(gated_gpu_task, folder, resources={"GPU": 1})
        wait_until(lambda: "blocker" in runs(tmp_path), what="the blocker holds the GPU")
        touch(folder + "/rejoin")
        wait_until(lambda: (tmp_path / "rejoining").exists(), what="the parent rejoining")
        gpu_cluster.restart_scheduler()
        client.wait_for_workers(1, timeout=60)
        assert gpu_info(client) == 1  # the blocker's GPU; the parent holds none
        assert client.check_invariants() == []
        touch(folder + "/blocker-gate")
        assert blocker.result(timeout=60) == "blocker"
        # The new scheduler grants the parent its GPU back: it was waiting for the old one.
        assert parent.result(timeout=60) == {"child": None, "units": {"GPU": [0]}}
        assert_back_to_idle(client, runs_too=True)
    assert sorted(runs(tmp_path)) == ["blocker", "child", "parent"]


def test_a_subtask_submitted_during_the_outage_is_known_by_its_parent(
    gpu_cluster: LocalCluster, tmp_path: Path
) -> None:
    folder = str(tmp_path)
    with Client(gpu_cluster) as client:
        parent = seceded_gpu_parent(client, keeping_parent, tmp_path)
        gpu_cluster.kill_scheduler()
        touch(folder + "/submit")  # its GPU subtask could only ever run on its own GPU
        gpu_cluster.restart_scheduler(kill=False)
        with pytest.raises(ResourceDeadlockError) as caught:
            parent.result(timeout=60)
        assert caught.value.holders == [parent.key]
        assert_back_to_idle(client, runs_too=True)
    assert runs(tmp_path) == []


def big(n: int) -> bytes:
    return bytes(n)


def where(small: bytes, large: bytes) -> str:
    return get_worker().name


def test_after_a_restart_a_task_goes_where_its_largest_input_is(tmp_path: Path) -> None:
    with config.set({"scheduler.recovery-wait": 5.0}):
        cluster = LocalCluster(workers=[{"name": "a"}, {"name": "b"}])
    try:
        with Client(cluster) as client:
            small = client.submit(big, 10, workers=["a"])
            large = client.submit(big, 5_000_000, workers=["b"])
            client.gather([small, large])
            cluster.restart_scheduler()
            client.wait_for_workers(2, timeout=60)
            wait_until(
                lambda: client.scheduler_info()["tasks"].get("memory") == 2,
                what="both results adopted",
            )
            # First input on a, the 5 MB one on b: it runs where the bytes are.
            assert client.submit(where, small, large).result(timeout=60) == "b"
    finally:
        cluster.close()


def failing(folder: str) -> None:
    import time

    from apportion.worker import secession

    log_run(folder, "failing")
    wait_for(os.path.join(folder, "fail"))
    worker, task = secession.running()
    while worker.state.epoch == task.epoch:  # until its worker saw the scheduler go
        time.sleep(0.01)
    raise ValueError("failed while no scheduler listened")


def test_a_task_failing_while_no_scheduler_listens_is_not_run_again(
    gpu_cluster: LocalCluster, tmp_path: Path
) -> None:
    folder = str(tmp_path)
    with Client(gpu_cluster) as client:
        future = client.submit(failing, folder)
        wait_until(lambda: runs(tmp_path) == ["failing"], what="the task started")
        gpu_cluster.kill_scheduler()
        touch(folder + "/fail")
        gpu_cluster.restart_scheduler(kill=False)
        with pytest.raises(ValueError, match="failed while no scheduler listened"):
            future.result(timeout=60)
    assert runs(tmp_path) == ["failing"]


def test_no_no_worker_warning_while_the_workers_come_back(tmp_path: Path) -> None:
    with config.set({"scheduler.recovery-wait": 60.0}):
        cluster = LocalCluster(workers=[{"name": "cpu"}])
    try:
        cluster.restart_scheduler()
        with warnings.catch_warnings(record=True) as caught, Client(cluster) as client:
            warnings.simplefilter("always")
            # Submitted normally during the recovery wait: its worker is not back yet.
            future = client.submit(log_run, str(tmp_path), "tpu", resources={"TPU": 1})
            cluster.start_workers([{"name": "tpu", "nthreads": 1, "resources": {"TPU": 1}}])
            future.result(timeout=60)
        assert [w for w in caught if issubclass(w.category, NoWorkerWarning)] == []
    finally:
        cluster.close()


def test_leases_and_set_events_are_given_back_to_the_new_scheduler(
    gpu_cluster: LocalCluster,
) -> None:
    with Client(gpu_cluster) as holder, Client(gpu_cluster) as other:
        lock, sem = Lock("restart-lock", client=holder), Semaphore(2, "restart-sem", client=holder)
        assert lock.acquire() and sem.acquire() and sem.acquire()
        Event("restart-event", client=holder).set()
        Variable("restart-variable", client=holder).set(1)
        gpu_cluster.restart_scheduler()
        holder.wait_for_workers(1, timeout=60)
        other.wait_for_workers(1, timeout=60)
        # Still held by the holder: nobody else gets them.
        assert not Lock("restart-lock", client=other).acquire(blocking=False)
        assert not Semaphore(2, "restart-sem", client=other).acquire(blocking=False)
        assert Event("restart-event", client=other).is_set()
        with pytest.raises(TimeoutError):  # variables start empty (README)
            Variable("restart-variable", client=other).get(timeout=0.1)
        lock.release()
        sem.release()
        assert Lock("restart-lock", client=other).acquire(blocking=False)
        assert Semaphore(2, "restart-sem", client=other).acquire(blocking=False)


def test_a_restricted_run_on_a_worker_set_below_it_is_adopted_exactly(tmp_path: Path) -> None:
    folder = str(tmp_path)
    with config.set({"scheduler.recovery-wait": 2.0}):
        cluster = LocalCluster(
            workers=[{"name": "a", "resources": {"GPU": 1}}, {"name": "b", "resources": {"GPU": 1}}]
        )
    try:
        with Client(cluster) as client:
            future = client.submit(gated_gpu_task, folder, resources={"GPU": 1}, workers=["b"])
            wait_until(lambda: runs(tmp_path) == ["blocker"], what="the task running on b")
            assert client.set_resources("b", {"GPU": 0}) == {"GPU": 0}  # taken out of service
            cluster.restart_scheduler()
            client.wait_for_workers(2, timeout=60)
            wait_until(
                lambda: client.scheduler_info()["tasks"].get("processing") == 1,
                what="the run adopted",
            )
            info = {w["name"]: w for w in client.scheduler_info()["workers"].values()}
            assert info["b"]["resources"] == {"GPU": 0}  # its amounts as set
            assert info["b"]["used_resources"] == {"GPU": 1}  # the run keeps its unit
            assert client.check_invariants() == []
            touch(folder + "/blocker-gate")
            assert future.result(timeout=60) == "blocker"
            assert_back_to_idle(client, runs_too=True)
        assert runs(tmp_path) == ["blocker"]  # adopted, not cancelled and run again
    finally:
        cluster.close()
