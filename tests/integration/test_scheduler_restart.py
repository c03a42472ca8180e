"""A scheduler restart loses no work: real processes, the scheduler SIGKILLed and started
again on the same port (LocalCluster.restart_scheduler)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from apportion import Client, LocalCluster, config
from tests.conftest import wait_until
from tests.integration.conftest import SEED_WORKERS
from tests.integration.tasks import (
    GATED,
    logged,
    peak_use,
    pipeline_aggregate,
    pipeline_load,
    pipeline_process,
)


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


def started(log: Path, prefix: str = "") -> Counter[str]:
    """Executions per key (each logs one 'start KEY' line)."""
    if not log.exists():
        return Counter()
    return Counter(
        line.split()[1]
        for line in log.read_text().splitlines()
        if line.startswith("start ") and line.split()[1].startswith(prefix)
    )


def peak_gpus(log: Path) -> dict[object, float]:
    """Most GPUs held at once on each worker, from every GPU execution logged."""
    records = []
    for line in log.read_text().splitlines():
        if line.startswith("gpu "):
            _, _, worker, start, end, gpus = line.split()
            records.append(
                {
                    "worker": worker,
                    "start": float(start),
                    "end": float(end),
                    "resources": {"GPU": float(gpus)},
                }
            )
    return peak_use(records, "GPU")


N = 2000


def test_the_seed_pipeline_survives_scheduler_kills_during_each_stage(tmp_path: Path) -> None:
    log, gates = tmp_path / "executions", tmp_path / "gates"
    gates.mkdir()
    # Wide enough for every worker to be back before re-registered tasks may start here.
    with config.set({"scheduler.recovery-wait": 5.0}):
        cluster = LocalCluster(workers=SEED_WORKERS)
    try:
        with Client(cluster) as client:
            args = (str(log), str(gates))
            loads = client.map(pipeline_load, *([a] * N for a in args), range(N))
            processed = [
                client.submit(
                    pipeline_process, *args, i, load, resources={"GPU": 2 if i % 10 == 0 else 1}
                )
                for i, load in enumerate(loads)
            ]
            total = client.submit(pipeline_aggregate, *args, processed, resources={"MEMORY": 70e9})

            # 1. During the loads: the first GATED done and held, gated ones running.
            wait_until(
                lambda: len(started(log, "load-")) > GATED, timeout=120, what="gated loads running"
            )
            wait_until(lambda: sum(f.done() for f in loads) >= GATED, timeout=120, what="loads")
            cluster.restart_scheduler()
            (gates / "loads").touch()
            # 2. During the GPU stage: gated GPU tasks running, holding GPUs.
            wait_until(
                lambda: len(started(log, "process-")) > GATED, timeout=120, what="gated GPU tasks"
            )
            cluster.restart_scheduler()
            (gates / "gpu").touch()
            # 3. During the aggregate, which holds MEMORY=70e9 on bigmem.
            wait_until(lambda: started(log)["aggregate"] == 1, timeout=180, what="the aggregate")
            cluster.restart_scheduler()
            (gates / "aggregate").touch()

            expected = sum(sum(float(i + k) ** 2 for k in range(10)) for i in range(N))
            assert total.result(timeout=180) == pytest.approx(expected)
            assert [f.result() for f in loads[:3]] == [
                [float(i + k) for k in range(10)] for i in range(3)
            ]
            assert processed[7].result() == sum(float(7 + k) ** 2 for k in range(10))
            wait_until(
                lambda: all(
                    not any(w["used_resources"].values())
                    for w in client.scheduler_info()["workers"].values()
                ),
                what="every resource given back",
            )
            assert client.check_invariants() == []
        executed = started(log)
        assert len(executed) == 2 * N + 1
        ran_again = {key: n for key, n in executed.items() if n > 1}
        assert ran_again == {}
        assert max(peak_gpus(log).values()) <= 2
    finally:
        cluster.close()


def test_the_documented_restart_example_works_as_pasted(tmp_path: Path) -> None:
    page = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    section = page[page.index("- **The scheduler restarts**") :]
    block = section[section.index("```python") + len("```python") : section.index("  ```\n")]
    script = tmp_path / "example.py"
    script.write_text(textwrap.dedent(block))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "328350"


def test_a_dask_computation_pending_across_a_restart_completes_once(tmp_path: Path) -> None:
    import dask

    log, gate = tmp_path / "executions", tmp_path / "gate"
    with config.set({"scheduler.recovery-wait": 5.0}):
        cluster = LocalCluster(n_workers=1, threads_per_worker=2)
    try:
        with Client(cluster) as client:
            slow = dask.delayed(logged)(str(log), 5, str(gate))
            fast = dask.delayed(logged)(str(log), 7)
            total = client.compute(slow + fast)
            wait_until(lambda: executions(log) == {"5": 1, "7": 1}, what="both tasks ran")
            cluster.restart_scheduler()
            gate.touch()
            assert total.result(timeout=60) == 12
        assert executions(log) == {"5": 1, "7": 1}
    finally:
        cluster.close()
