"""Killing worker processes: work is rescheduled, lost results recomputed, nothing leaks."""

from __future__ import annotations

from apportion import Client, LocalCluster
from tests.conftest import wait_until
from tests.integration.tasks import double, hold, inc

THREE_GPU_WORKERS = [{"name": f"gpu-{i}", "resources": {"GPU": 1}} for i in range(3)]


def _busy_workers(client: Client) -> set[str]:
    return {
        w["name"]
        for w in client.scheduler_info()["workers"].values()
        if w["used_resources"].get("GPU")
    }


def test_tasks_running_on_a_killed_worker_are_rescheduled_on_fitting_workers() -> None:
    with LocalCluster(workers=THREE_GPU_WORKERS) as cluster, Client(cluster) as client:
        futures = client.map(hold, [0.3] * 9, range(9), resources={"GPU": 1})
        wait_until(lambda: len(_busy_workers(client)) == 3, what="all workers busy")
        cluster.kill_worker("gpu-1")
        records = client.gather(futures)
        assert sorted(r["tag"] for r in records) == list(range(9))
        assert all(r["worker"] in {"gpu-0", "gpu-2"} or r["end"] for r in records)
        wait_until(lambda: not _busy_workers(client), what="resources released")
        assert len(client.scheduler_info()["workers"]) == 2
        assert client.check_invariants() == []


def test_results_that_lived_only_on_a_killed_worker_are_recomputed_from_lineage() -> None:
    with LocalCluster(workers=THREE_GPU_WORKERS) as cluster, Client(cluster) as client:
        first = client.map(inc, range(30))
        assert client.gather(first) == list(range(1, 31))
        holders = {
            name
            for name, info in ((w["name"], w) for w in client.scheduler_info()["workers"].values())
            if info["in_memory"]
        }
        victim = sorted(holders)[0]
        cluster.kill_worker(victim)
        second = client.map(double, first, resources={"GPU": 1})
        assert client.gather(second) == [2 * (i + 1) for i in range(30)]
        assert client.check_invariants() == []


def test_a_dependency_chain_survives_losing_a_worker_midway() -> None:
    with LocalCluster(workers=THREE_GPU_WORKERS) as cluster, Client(cluster) as client:
        chain = [client.submit(inc, 0)]
        for _ in range(40):
            chain.append(client.submit(inc, chain[-1]))
        assert chain[20].result(timeout=30) == 21
        cluster.kill_worker("gpu-0")
        tail = client.submit(double, chain[-1], resources={"GPU": 1})
        assert tail.result(timeout=60) == 82
