"""Workers with a memory limit, on real processes: results larger than the limit spill to
disk and are read back, the processes stay under their limit, a worker past its terminate
threshold is restarted and what it ran is recomputed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from apportion import Client, LocalCluster, WorkerPausedWarning, config, wait
from apportion.errors import KilledWorkerError
from apportion.memory_limit import available_memory

MIB = 1024**2
LIMIT = 400 * MIB
CHUNK = 16 * MIB
APPORTION = [sys.executable, "-m", "apportion"]
CHUNKS = 40  # 640 MiB of results on two workers limited to 400 MiB each


def chunk(i: int) -> Any:
    return np.full(CHUNK, i % 251, dtype=np.uint8)


def peak_rss() -> int:
    """This process's peak resident memory (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def wait_for(condition: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)  # polling a condition, with a deadline
    raise AssertionError(f"not true after {timeout}s: {condition}")


def spilled(client: Client) -> int:
    workers = client.scheduler_info()["workers"].values()
    return sum(w["memory"].get("spilled_total", 0) for w in workers)


def test_results_larger_than_the_limit_spill_and_read_back(tmp_path: Path) -> None:
    settings = {"worker.memory-limit": LIMIT, "worker.memory.spill-directory": str(tmp_path)}
    with config.set(settings), LocalCluster(n_workers=2, threads_per_worker=1) as cluster:
        with Client(cluster) as client:
            chunks = [client.submit(chunk, i) for i in range(CHUNKS)]
            wait(chunks, timeout=120)
            sums = [f.result(timeout=120) for f in [client.submit(np.sum, c) for c in chunks]]
            assert sums == [CHUNK * (i % 251) for i in range(CHUNKS)]
            # Read back twice: still there, still right.
            np.testing.assert_array_equal(chunks[0].result(timeout=60), chunk(0))
            assert wait_for(lambda: spilled(client) > 0)
            info = client.scheduler_info()["workers"]
            for worker in info.values():
                assert worker["memory"]["limit"] == LIMIT
                assert worker["status"] == "running"
            peaks = client.run(peak_rss)
            for address, peak in peaks.items():
                assert peak < LIMIT * 1.1, f"{address} peaked at {peak / MIB:.0f} MiB"
            assert client.check_invariants() == []
            root = tmp_path / "apportion-spill"
            assert any(directory.iterdir() for directory in root.iterdir())
    # Each worker removes its spill directory when it stops.
    assert list(root.iterdir()) == []


def hog(nbytes: int) -> int:
    held = np.ones(nbytes, dtype=np.uint8)
    time.sleep(30)  # the memory monitor ends this process well before
    return int(held[0])


def test_a_worker_past_terminate_is_restarted_and_the_task_fails_as_on_worker_loss(
    tmp_path: Path,
) -> None:
    settings = {
        "worker.memory-limit": "200MiB",
        "worker.memory.spill-directory": str(tmp_path),
        "scheduler.allowed-failures": 0,
    }
    with config.set(settings), LocalCluster(n_workers=1, threads_per_worker=1) as cluster:
        with Client(cluster) as client:
            before = set(client.scheduler_info()["workers"])
            with pytest.raises(KilledWorkerError):
                client.submit(hog, 300 * MIB).result(timeout=120)
            # The supervisor started a fresh worker, which runs tasks.
            wait_for(lambda: set(client.scheduler_info()["workers"]) - before)
            assert client.submit(sum, [1, 2]).result(timeout=60) == 3


@pytest.mark.parametrize(
    ("flag", "expected"),
    [(["--memory-limit", "1GiB"], 2**30), ([], "auto"), (["--memory-limit", "0"], None)],
)
def test_nworkers_share_the_machine_and_each_gets_the_limit_given(
    flag: list[str], expected: int | str | None
) -> None:
    with LocalCluster(workers=[]) as cluster:
        command = [*APPORTION, "worker", cluster.scheduler_address]
        environment = {**os.environ, "APPORTION_TOKEN": cluster.token}
        workers = subprocess.Popen(
            [*command, "--nworkers", "2", "--name", "m", *flag],
            env=environment,
            stdin=subprocess.DEVNULL,
        )
        try:
            with Client(cluster) as client:
                client.wait_for_workers(2, timeout=60)
                limits = [w["memory_limit"] for w in client.scheduler_info()["workers"].values()]
        finally:
            workers.send_signal(signal.SIGTERM)
            workers.wait(timeout=30)
    if expected == "auto":
        expected = available_memory() // 2
    assert limits == [expected, expected]


def test_a_memory_limit_that_means_nothing_is_refused_naming_it() -> None:
    done = subprocess.run(
        [*APPORTION, "worker", "tcp://127.0.0.1:1", "--memory-limit", "lots"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--memory-limit" in done.stderr and "'lots'" in done.stderr


def hold_ballast(nbytes: int) -> int:
    """Hold ``nbytes`` of memory no result accounts for (spilling cannot free it)."""
    import builtins

    builtins.apportion_test_ballast = np.ones(nbytes, dtype=np.uint8)  # type: ignore[attr-defined]
    return nbytes


def drop_ballast() -> None:
    import builtins

    builtins.__dict__.pop("apportion_test_ballast", None)


def test_the_client_is_warned_once_each_time_a_worker_pauses(tmp_path: Path) -> None:
    settings = {
        "worker.memory-limit": "1GiB",
        "worker.memory.pause": 0.3,  # about 300 MiB: a fresh worker is well below
        "worker.memory.terminate": False,
        "worker.memory.spill-directory": str(tmp_path),
    }
    with (
        config.set(settings),
        LocalCluster(n_workers=1, threads_per_worker=1) as cluster,
        Client(cluster) as client,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        (name,) = [w["name"] for w in client.scheduler_info()["workers"].values()]

        def pauses() -> list[str]:
            return [str(w.message) for w in caught if w.category is WorkerPausedWarning]

        for episode in (1, 2):
            client.run(hold_ballast, 400 * MIB)
            wait_for(lambda n=episode: len(pauses()) == n)
            client.run(drop_ballast)
            wait_for(lambda: _status(client) == "running")
        assert len(pauses()) == 2
        assert f"worker {name} " in pauses()[0] and "MiB of its 1.00 GiB limit" in pauses()[0]


def _status(client: Client) -> str:
    (worker,) = client.scheduler_info()["workers"].values()
    return str(worker["status"])


def hold_ballast_in(pid: int, nbytes: int) -> int:
    """``hold_ballast`` in the worker process ``pid`` only."""
    return hold_ballast(nbytes) if os.getpid() == pid else 0


def test_work_goes_past_a_worker_at_its_spilling_level_while_another_can_take_it(
    tmp_path: Path,
) -> None:
    settings = {
        "worker.memory-limit": "1GiB",
        "worker.memory.target": 0.3,  # about 300 MiB: a fresh worker is well below
        "worker.memory.spill": 0.3,
        "worker.memory.pause": False,
        "worker.memory.terminate": False,
        "worker.memory.spill-directory": str(tmp_path),
    }
    with (
        config.set(settings),
        LocalCluster(n_workers=2, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        full_address, full_pid = sorted(pids.items())[0]
        client.run(hold_ballast_in, full_pid, 400 * MIB)

        def memory_of(address: str) -> dict[str, Any]:
            return dict(client.scheduler_info()["workers"][address]["memory"])

        wait_for(lambda: memory_of(full_address).get("nearly_full"))
        # The full worker ran last, so it would be the first idle worker offered.
        client.submit(os.getpid, pure=False, workers=[full_address]).result(timeout=60)
        # One at a time: the other worker is free for each, so none goes to the full one.
        ran_in = {client.submit(os.getpid, pure=False).result(timeout=60) for _ in range(10)}
        assert ran_in == {pids[a] for a in pids if a != full_address}

        client.run(drop_ballast)
        wait_for(lambda: memory_of(full_address).get("nearly_full") is False)
        # With room again it takes work as before: the most recently idle worker first.
        futures = [client.submit(os.getpid, pure=False) for _ in range(20)]
        assert full_pid in set(client.gather(futures))
