"""Large arrays between real processes: worker to worker, to the client, and as a
submitted argument (out-of-band buffers end to end), over TCP and over TLS."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from apportion import Client, LocalCluster, config
from tests.integration.test_tls import tls_settings

TWO_WORKERS = [{"name": "a", "resources": {"A": 1}}, {"name": "b", "resources": {"B": 1}}]
N = 3_000_000  # 24 MB of float64


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with LocalCluster(workers=TWO_WORKERS) as cluster, Client(cluster) as client:
        yield client


def check_large_data(client: Client) -> None:
    made = client.submit(np.arange, N, dtype="f8", resources={"A": 1})
    # Made on a, needed on b: the array moves worker to worker.
    total = client.submit(np.sum, made, resources={"B": 1})
    assert total.result(timeout=60) == pytest.approx(N * (N - 1) / 2)
    gathered = made.result(timeout=60)
    np.testing.assert_array_equal(gathered, np.arange(N, dtype="f8"))
    gathered[0] = 1.0  # a fetched array is the client's own, writable
    argument = np.random.default_rng(0).random(N)
    summed = client.submit(np.sum, argument, resources={"B": 1})
    assert summed.result(timeout=60) == pytest.approx(argument.sum())
    doubled = client.submit(np.multiply, argument, 2, resources={"A": 1})
    np.testing.assert_array_equal(doubled.result(timeout=60), argument * 2)


def test_large_arrays_move_between_workers_the_client_and_back(client: Client) -> None:
    check_large_data(client)
    assert client.check_invariants() == []


def test_large_arrays_move_over_tls(tmp_path: Path) -> None:
    tls = tls_settings(tmp_path)
    with config.set(tls), LocalCluster(workers=TWO_WORKERS) as cluster, Client(cluster) as client:
        assert cluster.scheduler_address.startswith("tls://")
        check_large_data(client)


def test_a_worker_times_each_fetch_over_tcp() -> None:
    """The receiving worker counts a fetched input's bytes and the time from its request
    to the reply: the transfer alone, without the task's round trip around it."""
    from apportion.worker.transfers import fetch_counters

    with (
        config.set({"worker.shared-memory": False}),
        LocalCluster(workers=TWO_WORKERS) as cluster,
        Client(cluster) as client,
    ):
        names = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        before = client.run(fetch_counters)
        made = client.submit(np.arange, N, dtype="f8", resources={"A": 1})
        start = time.perf_counter()
        total = client.submit(np.sum, made, resources={"B": 1})
        assert total.result(timeout=60) == pytest.approx(N * (N - 1) / 2)
        row = time.perf_counter() - start  # the made array's task and the transfer's
        after = client.run(fetch_counters)
        receiver, holder = names["b"], names["a"]
        assert after[holder] == before[holder]  # it only served
        assert after[receiver]["fetched"] - before[receiver]["fetched"] == 1
        assert after[receiver]["fetched_bytes"] - before[receiver]["fetched_bytes"] >= 8 * N
        seconds = after[receiver]["fetch_seconds"] - before[receiver]["fetch_seconds"]
        assert 0 < seconds < row
