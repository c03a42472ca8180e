"""Demands no live worker can meet: visible, warned about, run when a worker fits."""

from __future__ import annotations

import pytest

from apportion import Client, LocalCluster, NoValidWorkerError, NoWorkerWarning, config
from tests.conftest import wait_until
from tests.integration.tasks import hold


def test_unmeetable_demand_waits_visibly_then_runs_when_a_fitting_worker_joins(
    recwarn: pytest.WarningsRecorder,
) -> None:
    small = [{"name": "small", "resources": {"GPU": 2}}]
    with LocalCluster(workers=small) as cluster, Client(cluster) as client:
        future = client.submit(hold, 0.01, "big", resources={"GPU": 8})

        waiting = wait_until(lambda: client.scheduler_info()["no_worker"], what="no-worker")
        assert waiting[0]["resources"] == {"GPU": 8}
        assert waiting[0]["tasks"] == 1
        assert "GPU=8 needed, the most any worker has is 2" in waiting[0]["why"]
        wait_until(
            lambda: any(
                issubclass(w.category, NoWorkerWarning) and "GPU=8" in str(w.message)
                for w in recwarn
            ),
            what="NoWorkerWarning",
        )
        assert not future.done()

        cluster.start_workers([{"name": "huge", "resources": {"GPU": 8}}])
        assert future.result(timeout=30)["worker"] == "huge"
        assert client.scheduler_info()["no_worker"] == []


@pytest.mark.filterwarnings("ignore::apportion.NoWorkerWarning")
def test_no_worker_timeout_fails_the_task_naming_the_demand() -> None:
    with config.set({"scheduler.no-worker-timeout": 0.5}):
        cluster = LocalCluster(workers=[{"name": "cpu"}])
    with cluster, Client(cluster) as client:
        future = client.submit(hold, 0, resources={"GPU": 1})
        with pytest.raises(NoValidWorkerError, match="GPU=1") as info:
            future.result(timeout=30)
        assert "no worker has any" in str(info.value)
        assert client.submit(hold, 0, "plain").result(timeout=30)["worker"] == "cpu"
