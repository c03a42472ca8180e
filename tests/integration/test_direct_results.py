"""Workers tell connected clients of results themselves; the scheduler tells only the rest."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from apportion import Client, LocalCluster, config
from apportion.protocol import Message
from apportion.serialize import dumps_value
from tests.conftest import wait_until
from tests.integration.tasks import inc


def _count_results(client: Client) -> dict[str, int]:
    """Count task-finished messages by path: from the scheduler, and pushed by workers."""
    counts = {"scheduler": 0, "direct": 0}
    lock = threading.Lock()
    on_message, on_push = client.session.handler("task-finished"), client.session.workers.on_push
    assert on_message is not None and on_push is not None

    def from_scheduler(message: Message) -> None:
        with lock:
            counts["scheduler"] += 1
        on_message(message)

    def from_worker(message: Message) -> None:
        with lock:
            counts["direct"] += 1
        on_push(message)

    client.session.on("task-finished", from_scheduler)
    client.session.workers.on_push = from_worker
    return counts


@pytest.fixture(scope="module")
def one_worker() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster:
        yield cluster


def test_once_connected_a_worker_tells_the_client_and_the_scheduler_does_not(
    one_worker: LocalCluster,
) -> None:
    with Client(one_worker) as client:
        assert client.submit(inc, 0, pure=False).result(timeout=30) == 1
        worker = next(iter(client.scheduler_info()["workers"]))
        # The first result came through the scheduler; the client connects to its holder.
        wait_until(
            lambda: worker in client.session.workers._comms, timeout=30, what="worker connection"
        )
        counts = _count_results(client)
        results = [client.submit(inc, i, pure=False).result(timeout=30) for i in range(20)]
        assert results == [i + 1 for i in range(20)]
        assert counts == {"scheduler": 0, "direct": 20}
        assert client.check_invariants() == []


def test_without_direct_results_the_client_never_connects_to_workers(
    one_worker: LocalCluster,
) -> None:
    with config.set({"client.direct-results": False}), Client(one_worker) as client:
        counts = _count_results(client)
        futures = [client.submit(inc, i, pure=False) for i in range(20)]
        assert client.gather(futures) == [i + 1 for i in range(20)]
        assert counts == {"scheduler": 20, "direct": 0}
        assert client.session.workers._comms == {}


def test_a_late_direct_result_does_not_override_what_the_scheduler_said(
    one_worker: LocalCluster,
) -> None:
    with Client(one_worker) as client:
        future = client.submit(_fail, pure=False)
        with pytest.raises(ValueError):
            future.result(timeout=30)
        worker = next(iter(client.scheduler_info()["workers"]))
        client.session.workers.on_push(
            {
                "op": "task-finished",
                "key": future.key,
                "who_has": [worker],
                "nbytes": 1,
                "data": dumps_value(1),
            }
        )
        assert future.status == "error"
        with pytest.raises(ValueError, match="no good"):
            future.result(timeout=30)


def _fail() -> None:
    raise ValueError("no good")


def test_after_its_worker_restarts_the_client_connects_again_and_is_told_directly() -> None:
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
        assert client.submit(inc, 0, pure=False).result(timeout=30) == 1
        (old,) = client.scheduler_info()["workers"]
        wait_until(
            lambda: old in client.session.workers._comms, timeout=30, what="worker connection"
        )
        cluster.kill_worker(next(iter(cluster.workers)), restart=True)
        wait_until(
            lambda: old not in client.session.direct_workers, timeout=30, what="the connection loss"
        )
        wait_until(
            lambda: list(client.scheduler_info()["workers"]) not in ([], [old]),
            timeout=60,
            what="the restarted worker",
        )
        (new,) = client.scheduler_info()["workers"]
        assert client.submit(inc, 1, pure=False).result(timeout=30) == 2
        wait_until(
            lambda: new in client.session.workers._comms, timeout=30, what="the new connection"
        )
        counts = _count_results(client)
        assert client.submit(inc, 2, pure=False).result(timeout=30) == 3
        assert counts == {"scheduler": 0, "direct": 1}
