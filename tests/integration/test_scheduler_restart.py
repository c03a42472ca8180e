"""A scheduler restart loses no work: real processes, the scheduler SIGKILLed and started
again on the same port (LocalCluster.restart_scheduler)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from apportion import Client, LocalCluster, config
from tests.conftest import wait_until
from tests.integration.tasks import logged


def executions(log: Path) -> Counter[str]:
    return Counter(log.read_text().split()) if log.exists() else Counter()


def gpu_in_use(client: Client) -> float:
    return sum(
        w["used_resources"].get("GPU", 0) for w in client.scheduler_info()["workers"].values()
    )


def test_a_worker_keeps_its_results_and_runs_and_the_new_scheduler_books_them(
    tmp_path: Path,
) -> None:
    log, gate = tmp_path / "executions", tmp_path / "gate"
    # Long enough for the second client below to come back before the new scheduler gives
    # up on unclaimed results (a reconnecting client re-registers at once).
    with config.set({"scheduler.recovery-wait": 60.0}):
        cluster = LocalCluster(workers=[{"name": "gpu", "nthreads": 3, "resources": {"GPU": 2}}])
    try:
        first = Client(cluster)
        held = [first.submit(logged, str(log), f"held-{i}", key=f"held-{i}") for i in range(2)]
        assert first.gather(held) == ["held-0", "held-1"]
        running = first.submit(
            logged, str(log), "running", str(gate), key="running", resources={"GPU": 2}
        )
        wait_until(lambda: executions(log)["running"] == 1, what="the GPU task started")
        cluster.restart_scheduler()
        first.close()

        with Client(cluster) as second:
            second.wait_for_workers(1, timeout=60)
            # The run in the worker's thread keeps both GPUs booked on the new scheduler.
            assert gpu_in_use(second) == 2
            assert second.check_invariants() == []
            again = [
                second.submit(logged, str(log), f"held-{i}", key=f"held-{i}") for i in range(2)
            ]
            running = second.submit(
                logged, str(log), "running", str(gate), key="running", resources={"GPU": 2}
            )
            assert second.gather(again) == ["held-0", "held-1"]
            gate.touch()
            assert running.result(timeout=60) == "running"
            wait_until(lambda: gpu_in_use(second) == 0, what="the GPUs given back")
            assert second.check_invariants() == []
        assert executions(log) == {"held-0": 1, "held-1": 1, "running": 1}
    finally:
        cluster.close()
