"""set_resources, run_on_scheduler, upload_file, Reschedule and the task stream, on real
processes."""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator

import cloudpickle
import pytest

from apportion import Client, LocalCluster, Reschedule, get_task_stream, get_worker
from tests.conftest import wait_until
from tests.integration.conftest import assert_back_to_idle
from tests.integration.tasks import hold, inc, peak_use, wait_for_file

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(
        workers=[
            {"name": "gpu-a", "nthreads": 4, "resources": {"GPU": 2}},
            {"name": "cpu", "nthreads": 2},
        ]
    ) as cluster:
        yield cluster


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster) as client:
        yield client
        client.set_resources("gpu-a", {"GPU": 2})
        assert_back_to_idle(client)


def gpu_of(info: dict) -> float:
    (gpu,) = [w for w in info["workers"].values() if w["name"] == "gpu-a"]
    return float(gpu["resources"].get("GPU", 0))


def test_set_resources_new_placements_follow_the_new_amounts(client: Client) -> None:
    assert client.set_resources("gpu-a", {"GPU": 1}) == {"GPU": 1}
    assert gpu_of(client.scheduler_info()) == 1
    records = client.gather(client.map(hold, [0.05] * 6, range(6), resources={"GPU": 1}))
    assert peak_use(records, "GPU") == {"gpu-a": 1}
    assert {tuple(r["units"]["GPU"]) for r in records} == {(0,)}  # GPU #1 out of service
    # The worker process took the new amount too.
    assert {"GPU": 1} in client.run(lambda: get_worker().resources).values()


def test_a_task_needing_more_than_the_new_amount_waits_until_it_is_given_back(
    client: Client,
) -> None:
    client.set_resources("gpu-a", {"GPU": 0})
    future = client.submit(inc, 1, resources={"GPU": 1}, pure=False)
    wait_until(lambda: client.scheduler_info()["no_worker"], timeout=30, what="no-worker")
    client.set_resources("gpu-a", {"GPU": 2})
    assert future.result(timeout=30) == 2


def test_running_tasks_keep_their_resources_when_the_amount_shrinks(client: Client) -> None:
    path = os.path.join(tempfile.mkdtemp(), "go")
    running = client.submit(wait_for_file, path, resources={"GPU": 2}, pure=False)
    wait_until(
        lambda: client.scheduler_info()["tasks"].get("processing"), timeout=30, what="running"
    )
    client.set_resources("gpu-a", {"GPU": 1})
    (gpu,) = [w for w in client.scheduler_info()["workers"].values() if w["name"] == "gpu-a"]
    assert gpu["used_resources"] == {"GPU": 2} and gpu["resources"] == {"GPU": 1}
    assert client.check_invariants() == []
    later = client.submit(inc, 5, resources={"GPU": 1}, pure=False)
    open(path, "w").close()
    assert running.result(timeout=30) == path
    assert later.result(timeout=30) == 6


def test_set_resources_refuses_an_unknown_worker_or_bad_amounts(client: Client) -> None:
    with pytest.raises(
        ValueError, match=r"no worker named 'gpu-z' \(connected: \['cpu', 'gpu-a'\]\)"
    ):
        client.set_resources("gpu-z", {"GPU": 1})
    with pytest.raises(ValueError, match="must be zero or more"):
        client.set_resources("gpu-a", {"GPU": -1})


def test_run_on_scheduler(client: Client) -> None:
    def count_workers(dask_scheduler: object) -> int:
        return len(dask_scheduler.state.workers)  # type: ignore[attr-defined]

    assert client.run_on_scheduler(count_workers) == 2
    assert client.run_on_scheduler(pow, 2, 5) == 32
    with pytest.raises(ZeroDivisionError):
        client.run_on_scheduler(divmod, 1, 0)


def use_module(name: str) -> object:
    import importlib

    return importlib.import_module(name).answer()


def test_upload_file_reaches_every_worker_also_ones_that_join_later(
    client: Client, cluster: LocalCluster
) -> None:
    name = f"uploaded_{uuid.uuid4().hex[:8]}"
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write("def answer():\n    return 42\n")
    placed = client.upload_file(path)
    assert len(placed) == 2
    assert (
        client.gather(client.map(use_module, [name] * 4, workers=["cpu"], pure=False)) == [42] * 4
    )
    with open(path, "w") as f:
        f.write(textwrap.dedent("def answer():\n    return 43\n"))
    client.upload_file(path)  # a new version replaces the imported one
    assert client.submit(use_module, name, workers=["gpu-a"], pure=False).result(30) == 43
    cluster.start_workers([{"name": "late", "nthreads": 1}])
    client.wait_for_workers(3, timeout=60)
    assert client.submit(use_module, name, workers=["late"], pure=False).result(30) == 43


def reschedule_once(flag: str) -> str:
    if not os.path.exists(flag):
        open(flag, "w").close()
        raise Reschedule()
    return get_worker().name


def test_reschedule_places_the_task_again_and_releases_its_resources_once(
    client: Client,
) -> None:
    flag = os.path.join(tempfile.mkdtemp(), "flag")
    future = client.submit(reschedule_once, flag, resources={"GPU": 1}, pure=False)
    assert future.result(timeout=30) == "gpu-a"
    assert client.check_invariants() == []


def test_task_stream_records_the_runs_of_a_block(client: Client) -> None:
    with get_task_stream(client) as stream:
        client.gather(client.map(inc, range(5), pure=False))
    assert len(stream.data) == 5
    assert {run["state"] for run in stream.data} == {"memory"}
    assert all(run["stop"] >= run["start"] > 0 for run in stream.data)
    assert all(run["key"].startswith("inc-") for run in stream.data)
    assert len(client.get_task_stream()) >= 5


def test_performance_report_writes_the_task_stream_and_resource_use(client: Client) -> None:
    from apportion import performance_report

    path = os.path.join(tempfile.mkdtemp(), "report.html")
    go = os.path.join(tempfile.mkdtemp(), "go")
    with performance_report(path, client=client, interval=0.02) as report:
        futures = client.map(wait_for_file, [go] * 4, resources={"GPU": 1}, pure=False)
        # Both GPUs in use until the report has seen it.
        wait_until(
            lambda: any(
                seen.get("gpu-a", {}).get("used", {}).get("GPU") == 2 for _, seen in report.samples
            ),
            timeout=30,
            what="a sample with both GPUs in use",
        )
        open(go, "w").close()
        client.gather(futures)
    with open(path, encoding="utf-8") as f:
        html = f.read()
    assert html.startswith("<!doctype html>")
    assert "Task stream (4 runs" in html
    assert html.count("<rect ") == 4
    assert "wait_for_file" in html
    assert "GPU in use" in html and "gpu-a: of 2" in html
    assert "<td>gpu-a</td><td>GPU</td><td>2</td>" in html  # the peak


def test_restart_forgets_every_task_tells_waiting_clients_and_restarts_the_workers(
    client: Client, cluster: LocalCluster
) -> None:
    from apportion import CancelledError

    path = os.path.join(tempfile.mkdtemp(), "never")
    stuck = client.submit(wait_for_file, path, resources={"GPU": 1}, pure=False)
    done = client.submit(inc, 1, pure=False)
    assert done.result(timeout=30) == 2
    before = dict(cluster.worker_pids)
    assert client.restart(timeout=60) is client
    with pytest.raises(CancelledError, match="restarted"):
        stuck.result(timeout=10)
    assert done.cancelled()
    after = cluster.worker_pids
    assert set(after) == set(before) and all(after[n] != before[n] for n in before)
    info = client.scheduler_info()
    assert info["tasks"] == {}
    assert {w["name"] for w in info["workers"].values()} == set(before)
    assert client.submit(inc, 2, pure=False).result(timeout=30) == 3
