"""Chaos: scheduler kills and worker kills interleaved while a GPU workload runs; every
result comes back right within a bounded time, and no worker ever runs more GPU work at
once than it declared."""

from __future__ import annotations

import random
from pathlib import Path

from apportion import Client, LocalCluster, config
from tests.conftest import wait_until
from tests.integration.tasks import gpu_step, inc
from tests.integration.test_scheduler_restart import peak_gpus

N = 300
# Each event waits for this many more GPU steps to end after the previous one, so that
# the kills land all along the run, whatever the speed of the machine.
PROGRESS = 25


def gpu_steps_done(log: Path) -> int:
    return log.read_text().count("gpu step-") if log.exists() else 0


def test_scheduler_and_worker_kills_interleaved_lose_no_result(tmp_path: Path) -> None:
    log = tmp_path / "executions"
    rng = random.Random(19)
    with config.set({"scheduler.recovery-wait": 3.0}):
        cluster = LocalCluster(n_workers=3, threads_per_worker=2, resources={"GPU": 1})
    events: list[str] = []
    try:
        with Client(cluster) as client:
            values = client.map(inc, range(N))
            doubled = [
                client.submit(gpu_step, str(log), i, value, 0.05, resources={"GPU": 1})
                for i, value in enumerate(values)
            ]
            sums = [client.submit(sum, doubled[j : j + 30]) for j in range(0, N, 30)]
            total = client.submit(sum, sums)

            for event in ("scheduler", "worker", "both", "worker", "scheduler", "both"):
                reached = gpu_steps_done(log) + PROGRESS
                wait_until(
                    lambda reached=reached: gpu_steps_done(log) >= reached or total.done(),
                    timeout=120,
                    what=f"{PROGRESS} more GPU steps before the {event} kill",
                )
                if total.done():
                    break
                victim = rng.choice(sorted(cluster.workers))
                if event == "scheduler":
                    cluster.restart_scheduler()
                elif event == "worker":
                    cluster.kill_worker(victim, restart=True)
                else:  # a worker dies while there is no scheduler
                    cluster.kill_scheduler()
                    cluster.kill_worker(victim, restart=True)
                    cluster.restart_scheduler(kill=False)
                events.append(event)

            assert total.result(timeout=180) == 2 * sum(range(1, N + 1))
            assert client.gather(doubled[:5]) == [2, 4, 6, 8, 10]
            wait_until(
                lambda: (
                    len(client.scheduler_info()["workers"]) == 3
                    and all(
                        not any(w["used_resources"].values())
                        for w in client.scheduler_info()["workers"].values()
                    )
                ),
                timeout=60,
                what="all workers back and every resource given back",
            )
            assert client.check_invariants() == []
        assert events[:3] == ["scheduler", "worker", "both"]  # the kills did land mid-run
        assert max(peak_gpus(log).values()) <= 1
    finally:
        cluster.close()
