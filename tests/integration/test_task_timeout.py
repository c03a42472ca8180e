"""A per-task timeout: a run past it fails with ``TaskTimeoutError``, and its worker process
is replaced, so that what the hung run held is free again (a thread cannot be stopped)."""

from __future__ import annotations

import os

import dask
import pytest

from apportion import Client, LocalCluster, TaskTimeoutError, annotate
from tests.conftest import wait_until
from tests.integration.tasks import hangs_on_first_attempt, inc, never_returns


def _gpus_in_use(client: Client) -> float:
    return sum(
        w["used_resources"].get("GPU", 0) for w in client.scheduler_info()["workers"].values()
    )


@pytest.fixture(scope="module")
def client() -> Client:
    with (
        LocalCluster(workers=[{"name": "gpu", "resources": {"GPU": 1}}]) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(1, timeout=60)
        yield client


def test_a_run_past_its_timeout_fails_and_its_worker_is_replaced(client: Client) -> None:
    (before,) = client.run(os.getpid).values()
    hung = client.submit(never_returns, resources={"GPU": 1}, task_timeout=1)
    with pytest.raises(TaskTimeoutError, match=r"ran past its timeout of 1 s on worker gpu"):
        hung.result(timeout=120)
    # The GPU the hung run held is free for the next task: the worker was replaced.
    assert client.submit(inc, 1, resources={"GPU": 1}).result(timeout=120) == 2
    client.wait_for_workers(1, timeout=60)
    (after,) = client.run(os.getpid).values()
    assert after != before
    wait_until(lambda: _gpus_in_use(client) == 0, what="the GPU given back")
    assert client.check_invariants() == []


@pytest.mark.filterwarnings("ignore::apportion.NoWorkerWarning")  # the worker restarts
def test_a_timed_out_run_is_retried_while_retries_are_left(client: Client) -> None:
    future = client.submit(hangs_on_first_attempt, task_timeout=1, retries=1, pure=False)
    assert future.result(timeout=120) == 2  # the second attempt returned


def test_a_run_within_its_timeout_is_untouched(client: Client) -> None:
    (before,) = client.run(os.getpid).values()
    assert client.submit(inc, 41, task_timeout=60).result(timeout=60) == 42
    assert client.run(os.getpid) == {next(iter(client.run(os.getpid))): before}


def test_annotate_sets_the_timeout_of_submitted_tasks_and_dask_collections(
    client: Client,
) -> None:
    with annotate(timeout=1):
        hung = client.submit(never_returns, pure=False)
    with pytest.raises(TaskTimeoutError):
        hung.result(timeout=120)
    with annotate(timeout=1):
        hung_delayed = dask.delayed(never_returns, pure=False)()
    with pytest.raises(TaskTimeoutError):
        client.compute(hung_delayed).result(timeout=120)
    client.wait_for_workers(1, timeout=60)


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "5", True])
def test_a_timeout_that_is_not_a_positive_number_is_refused(client: Client, bad: object) -> None:
    with pytest.raises(ValueError, match="a task timeout is a number of seconds > 0"):
        client.submit(inc, 1, task_timeout=bad)
    with pytest.raises(ValueError, match="a task timeout is a number of seconds > 0"):
        with annotate(timeout=bad):
            pass
