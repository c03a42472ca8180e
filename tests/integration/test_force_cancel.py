"""Cancelling a task that never returns: ``force=True`` replaces the worker process running
it, so its resources are free again, where a plain cancel leaves them booked until the
task's thread ends."""

from __future__ import annotations

import os

from apportion import Client, LocalCluster
from tests.conftest import wait_until
from tests.integration.tasks import inc, never_returns


def _gpus_in_use(client: Client) -> float:
    return sum(
        w["used_resources"].get("GPU", 0) for w in client.scheduler_info()["workers"].values()
    )


def test_a_forced_cancel_replaces_the_worker_and_frees_what_the_hung_task_held() -> None:
    with (
        LocalCluster(workers=[{"name": "gpu", "resources": {"GPU": 1}}]) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(1, timeout=60)
        (before,) = client.run(os.getpid).values()
        hung = client.submit(never_returns, resources={"GPU": 1})
        wait_until(lambda: _gpus_in_use(client) == 1, what="the hung task holds the GPU")
        client.cancel([hung], force=True)
        # The GPU is free for the next task: the worker was replaced.
        assert client.submit(inc, 1, resources={"GPU": 1}).result(timeout=120) == 2
        assert hung.cancelled()
        client.wait_for_workers(1, timeout=60)
        (after,) = client.run(os.getpid).values()
        assert after != before
        wait_until(lambda: _gpus_in_use(client) == 0, what="the GPU given back")
        assert client.check_invariants() == []
