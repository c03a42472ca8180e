"""Fixtures: real scheduler and worker processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import cloudpickle
import pytest

from apportion import Client, LocalCluster
from tests.integration import tasks

# Workers import nothing from the test tree: ship these functions by value.
cloudpickle.register_pickle_by_value(tasks)

SEED_WORKERS = [
    {"name": "gpu-a", "nthreads": 4, "resources": {"GPU": 2}},
    {"name": "gpu-b", "nthreads": 4, "resources": {"GPU": 2}},
    {"name": "bigmem", "nthreads": 2, "resources": {"MEMORY": 100e9}},
]


@pytest.fixture(scope="module")
def seed_cluster() -> Iterator[LocalCluster]:
    """The resources guide's cluster: two workers with GPU=2, one with MEMORY=100e9."""
    with LocalCluster(workers=SEED_WORKERS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(seed_cluster: LocalCluster) -> Iterator[Client]:
    with Client(seed_cluster) as client:
        yield client


@pytest.fixture
def idle_client(client: Client) -> Iterator[Client]:
    """The seed cluster's client; checks afterwards that accounting is back to zero."""
    yield client
    assert_back_to_idle(client)


def assert_back_to_idle(client: Client, runs_too: bool = False) -> None:
    """Wait until every worker's used resources are back to zero (and, with ``runs_too``,
    it runs nothing), then check the scheduler's accounting."""
    from tests.conftest import wait_until

    wait_until(
        lambda: all(
            not any(w["used_resources"].values()) and (not runs_too or w["processing"] == 0)
            for w in client.scheduler_info()["workers"].values()
        ),
        timeout=30,
        what="used resources back to zero",
    )
    assert client.check_invariants() == []
