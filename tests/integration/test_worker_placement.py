"""Placement by worker on real processes: ``workers=`` / ``allow_other_workers=``."""

from __future__ import annotations

import warnings

import pytest

from apportion import Client, NoWorkerWarning
from tests.conftest import wait_until
from tests.integration.tasks import hold, peak_use


def test_workers_restricts_tasks_to_the_listed_worker(idle_client: Client) -> None:
    futures = idle_client.map(hold, [0.01] * 12, range(12), workers=["gpu-b"])
    assert {r["worker"] for r in idle_client.gather(futures)} == {"gpu-b"}
    one = idle_client.submit(hold, 0.01, "one", workers="bigmem")
    assert one.result()["worker"] == "bigmem"


def test_workers_and_resources_combine_never_more_than_the_listed_worker_declared(
    idle_client: Client,
) -> None:
    # gpu-a has GPU=2 and 4 threads: the 10 tasks run there, two at a time, although
    # gpu-b's GPUs sit free.
    futures = idle_client.map(hold, [0.05] * 10, range(10), resources={"GPU": 1}, workers=["gpu-a"])
    records = idle_client.gather(futures)
    assert {r["worker"] for r in records} == {"gpu-a"}
    assert peak_use(records, "GPU") == {"gpu-a": 2}


def test_a_worker_address_works_as_well_as_its_name(idle_client: Client) -> None:
    address = next(
        a for a, w in idle_client.scheduler_info()["workers"].items() if w["name"] == "gpu-a"
    )
    future = idle_client.submit(hold, 0.01, "addr", workers=[address], pure=False)
    assert future.result()["worker"] == "gpu-a"


def test_allow_other_workers_runs_elsewhere_when_the_listed_worker_is_absent(
    idle_client: Client,
) -> None:
    future = idle_client.submit(
        hold, 0.01, "loose", workers=["no-such-worker"], allow_other_workers=True
    )
    assert future.result()["worker"] in {"gpu-a", "gpu-b", "bigmem"}


def test_restricted_to_an_absent_worker_the_task_waits_and_the_client_is_told(
    idle_client: Client,
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        future = idle_client.submit(hold, 0.01, "absent", workers=["gpu-z"], pure=False)
        wait_until(lambda: idle_client.scheduler_info()["no_worker"], timeout=30, what="no-worker")
        (waiting,) = idle_client.scheduler_info()["no_worker"]
        assert waiting["workers"] == ["gpu-z"]
        assert "none of them is connected" in waiting["why"]
        wait_until(
            lambda: any(issubclass(w.category, NoWorkerWarning) for w in caught),
            timeout=30,
            what="the client's warning",
        )
    future.cancel()
    assert future.status in ("pending", "cancelled")


@pytest.mark.parametrize(
    ("workers", "error"),
    [([], ValueError), ([3], TypeError), (5, TypeError), ([""], TypeError)],
)
def test_bad_workers_argument_is_refused_with_the_offending_value(
    idle_client: Client, workers: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="worker"):
        idle_client.submit(hold, 0.01, workers=workers)


def test_allow_other_workers_must_be_a_bool(idle_client: Client) -> None:
    with pytest.raises(TypeError, match="allow_other_workers must be True or False, got 'yes'"):
        idle_client.submit(hold, 0.01, workers=["gpu-a"], allow_other_workers="yes")
