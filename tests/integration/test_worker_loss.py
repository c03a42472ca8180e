"""Killing worker processes: work is rescheduled, lost results recomputed, nothing leaks."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from apportion import Client, LocalCluster, config, wait
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


QUICK_REMOVAL = {"scheduler.worker-timeout": 3.0, "worker.heartbeat-interval": 0.5}


@contextlib.contextmanager
def _frozen_a1_after(
    prepare: Callable[[Client, dict[str, str]], Any], *others: dict[str, Any]
) -> Iterator[tuple[Client, Any]]:
    """A cluster of workers a1, a2 (resource A) and ``others``, removed after 3 s of
    silence; ``prepare(client, address_by_name)`` runs first, then a1 is frozen
    (SIGSTOP: its kernel still acknowledges every byte, as a cut-off host's connections
    stay open) while the body runs. Yields the client and what ``prepare`` returned."""
    workers = [{"name": "a1", "resources": {"A": 1}}, {"name": "a2", "resources": {"A": 1}}]
    workers.extend(others)
    with (
        config.set(QUICK_REMOVAL),
        LocalCluster(workers=workers) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(len(workers), timeout=60)
        address = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        pid = client.run(os.getpid)[address["a1"]]
        prepared = prepare(client, address)
        os.kill(pid, signal.SIGSTOP)
        try:
            yield client, prepared
            names = {w["name"] for w in client.scheduler_info()["workers"].values()}
            assert "a1" not in names
        finally:
            os.kill(pid, signal.SIGCONT)
        assert client.check_invariants() == []


def test_a_fetch_from_a_worker_that_froze_ends_when_the_scheduler_removes_it() -> None:
    """A frozen worker never answers a fetch already under way; once the scheduler
    removes it for its silence, the fetch ends and its input is made again."""

    def prepare(client: Client, address: dict[str, str]) -> Any:
        on_a1 = {"resources": {"A": 1}, "workers": [address["a1"]]}
        # b has fetched from a1 before: its connection to a1 is open (the case that hung).
        warm = client.submit(bytes, 200_001, **on_a1)
        assert client.submit(len, warm, resources={"B": 1}).result(timeout=30) == 200_001
        made = client.submit(bytes, 200_000, **on_a1, allow_other_workers=True)
        made.result(timeout=30)
        return made

    with _frozen_a1_after(prepare, {"name": "b", "resources": {"B": 1}}) as (client, made):
        taken = client.submit(len, made, resources={"B": 1})
        assert taken.result(timeout=60) == 200_000


def test_a_client_fetching_from_a_worker_that_froze_gets_the_result_made_again() -> None:
    def prepare(client: Client, address: dict[str, str]) -> Any:
        on_a1 = {"resources": {"A": 1}, "workers": [address["a1"]], "allow_other_workers": True}
        # The client has fetched from a1 before: its connection to a1 is open.
        assert len(client.submit(bytes, 300_001, **on_a1).result(timeout=30)) == 300_001
        made = client.submit(bytes, 300_000, **on_a1)
        wait([made], timeout=30)  # made, not fetched
        return made

    with _frozen_a1_after(prepare) as (_, made):
        assert made.result(timeout=60) == bytes(300_000)


def test_result_with_a_timeout_gives_up_on_a_fetch_that_does_not_end() -> None:
    with (
        config.set({"scheduler.worker-timeout": 300.0}),
        LocalCluster(workers=[{"name": "a"}]) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(1, timeout=60)
        (pid,) = client.run(os.getpid).values()
        assert len(client.submit(bytes, 300_001).result(timeout=30)) == 300_001  # connected
        made = client.submit(bytes, 300_000)
        wait([made], timeout=30)  # made, not fetched
        os.kill(pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            with pytest.raises(TimeoutError, match="was not fetched in time"):
                made.result(timeout=1)
            assert time.monotonic() - began < 20
        finally:
            os.kill(pid, signal.SIGCONT)
        assert made.result(timeout=30) == bytes(300_000)
