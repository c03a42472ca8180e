"""A scheduler that was itself stalled (SIGSTOP, then SIGCONT) keeps its workers: the time
it did not run does not count as their silence, and no task runs twice.

The scheduler is stopped at the worst moment: as its heartbeat check begins (it sends
itself SIGSTOP there), so that on SIGCONT it judges before reading the heartbeats waiting
in its sockets, as a scheduler busy with a load does."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from apportion import Client, LocalCluster, config
from tests.conftest import wait_until
from tests.integration.tasks import logged

TIMEOUT = 2.0
QUICK_REMOVAL = {"scheduler.worker-timeout": TIMEOUT, "worker.heartbeat-interval": 0.25}


def executions(log: Path) -> Counter[str]:
    return Counter(log.read_text().split()) if log.exists() else Counter()


def _stop_as_the_heartbeat_check_begins(dask_scheduler: Any) -> None:
    """In the scheduler: have its next heartbeat check send the process SIGSTOP first."""
    periodic = next(
        p for p in dask_scheduler._periodic if p.callback == dask_scheduler._check_heartbeats
    )
    check = periodic.callback

    def stop_then_check() -> None:
        periodic.callback = check
        os.kill(os.getpid(), signal.SIGSTOP)
        check()

    periodic.callback = stop_then_check


def _state_of(pid: int) -> str:
    """The process's state letter from /proc (T: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_a_scheduler_stopped_for_longer_than_the_worker_timeout_removes_no_worker(
    tmp_path: Path,
) -> None:
    log, gate = tmp_path / "executions", tmp_path / "gate"
    workers = [{"name": f"w{i}", "resources": {"A": 1}} for i in range(2)]
    with (
        config.set(QUICK_REMOVAL),
        LocalCluster(workers=workers) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2, timeout=60)
        futures = [
            client.submit(
                logged, str(log), f"run-{i}", str(gate), key=f"run-{i}", resources={"A": 1}
            )
            for i in range(2)
        ]
        wait_until(lambda: executions(log) == {"run-0": 1, "run-1": 1}, what="both tasks run")
        pid = client.run_on_scheduler(os.getpid)
        client.run_on_scheduler(_stop_as_the_heartbeat_check_begins)
        try:
            wait_until(lambda: _state_of(pid) == "T", what="the scheduler stopped")
            time.sleep(4 * TIMEOUT)  # the stall itself, while the workers send heartbeats
        finally:
            os.kill(pid, signal.SIGCONT)
        # The window in which the scheduler would remove them: its checks after the stall,
        # and a whole timeout more.
        time.sleep(2 * TIMEOUT)
        gate.touch()
        assert client.gather(futures) == ["run-0", "run-1"]
        assert executions(log) == {"run-0": 1, "run-1": 1}
        assert sorted(w["name"] for w in client.scheduler_info()["workers"].values()) == [
            "w0",
            "w1",
        ]
        for key in ("run-0", "run-1"):
            reasons = [change["reason"] for change in client.story(key)]
            assert "its worker left" not in reasons, reasons
        assert client.check_invariants() == []
