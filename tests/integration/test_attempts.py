"""Each run of a task has an attempt number, visible inside the task and in its story; a
superseded run (its worker froze, the task ran again elsewhere) cannot replace the result
of the run that took its place."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from apportion import Client, LocalCluster, config
from tests.conftest import wait_until
from tests.integration.tasks import logged_attempt

QUICK_REMOVAL = {"scheduler.worker-timeout": 3.0, "worker.heartbeat-interval": 0.5}


def _attempts(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_run_superseded_while_its_worker_was_frozen_is_numbered_and_its_end_ignored(
    tmp_path: Path,
) -> None:
    log, gate = tmp_path / "attempts", tmp_path / "gate"
    workers = [{"name": "a1", "resources": {"A": 1}}, {"name": "a2", "resources": {"A": 1}}]
    with (
        config.set(QUICK_REMOVAL),
        LocalCluster(workers=workers) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2, timeout=60)
        address = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        pid = client.run(os.getpid)[address["a1"]]
        future = client.submit(
            logged_attempt,
            str(log),
            str(gate),
            key="fenced",
            resources={"A": 1},
            workers=[address["a1"]],
            allow_other_workers=True,
        )
        wait_until(lambda: _attempts(log) == ["fenced 1"], what="the first run started")
        os.kill(pid, signal.SIGSTOP)
        try:
            # a1 is removed for its silence; the task runs again on a2.
            wait_until(
                lambda: _attempts(log) == ["fenced 1", "fenced 2"], timeout=60, what="a rerun"
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        # a1 comes back, its run of attempt 1 still under way: that run is superseded.
        client.wait_for_workers(2, timeout=60)
        gate.touch()
        assert future.result(timeout=60) == 2
        reasons = [change["reason"] for change in client.story("fenced")]
        assert "sent to a worker (attempt 1)" in reasons, reasons
        assert "sent to a worker (attempt 2)" in reasons, reasons
        # Both runs ended (a1's too), and the result is still the second's.
        wait_until(
            lambda: all(w["processing"] == 0 for w in client.scheduler_info()["workers"].values()),
            what="both runs ended",
        )
        assert client.gather(future) == 2
        assert client.check_invariants() == []
