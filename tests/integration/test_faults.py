"""Faults on real processes: kill storms, vanishing clients, scheduler restarts, bad tasks."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from apportion import (
    Client,
    InputLoadError,
    KilledWorkerError,
    LocalCluster,
    SchedulerConnectionError,
    config,
)
from tests.conftest import wait_until
from tests.integration.tasks import hold, inc, made_here, maker_pid

APPORTION = [sys.executable, "-m", "apportion"]


def logged_double(i: int, log: str) -> int:
    """Double ``i``, logging the run's start and end so overlapping runs can be found."""
    import time

    pid = os.getpid()
    with open(log, "a") as handle:
        handle.write(f"start {i} {pid} {time.monotonic()}\n")
    time.sleep(0.002)  # the workload
    with open(log, "a") as handle:
        handle.write(f"end {i} {pid} {time.monotonic()}\n")
    return 2 * i


def _runs(log: Path) -> dict[int, list[tuple[int, float, float | None]]]:
    """Per task: (pid, start, end or None if the run never finished)."""
    open_runs: dict[tuple[int, int], float] = {}
    runs: dict[int, list[tuple[int, float, float | None]]] = {}
    for line in log.read_text().splitlines():
        kind, i, pid, moment = line.split()
        key = (int(i), int(pid))
        if kind == "start":
            open_runs[key] = float(moment)
        else:
            runs.setdefault(int(i), []).append((int(pid), open_runs.pop(key), float(moment)))
    for (i, pid), start in open_runs.items():
        runs.setdefault(i, []).append((pid, start, None))
    return runs


def _assert_no_run_overlapped_itself(log: Path, killed_pids: set[int]) -> None:
    """No task ran twice at once in processes that survived (runs in killed ones ended
    with them, unlogged)."""
    for i, task_runs in _runs(log).items():
        survivors = [r for r in task_runs if r[0] not in killed_pids]
        for a in survivors:
            for b in survivors:
                if a is not b:
                    assert a[2] is not None and b[2] is not None
                    assert a[2] <= b[1] or b[2] <= a[1], f"task {i} ran twice at once"


def _gpu_in_use(client: Client) -> float:
    return sum(
        w["used_resources"].get("GPU", 0) for w in client.scheduler_info()["workers"].values()
    )


def test_kill_storm_loses_no_result_and_leaves_no_resource_held(tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    workers = [{"name": f"w{i}", "nthreads": 2, "resources": {"GPU": 2}} for i in range(4)]
    chooser = random.Random(7)
    killed_pids: set[int] = set()
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        futures = client.map(logged_double, range(2000), [str(log)] * 2000, resources={"GPU": 1})
        for round_ in range(5):
            target = 250 * (round_ + 1)
            wait_until(
                lambda t=target: sum(f.done() for f in futures) >= t,
                timeout=120,
                what=f"{target} tasks done",
            )
            # Only live workers: one just killed may still be waiting out its restart back-off.
            alive = [n for n, w in sorted(cluster.workers.items()) if w.process.poll() is None]
            victim = chooser.choice(alive)
            killed_pids.add(cluster.workers[victim].pid)
            cluster.kill_worker(victim, restart=True)
        assert client.gather(futures) == [2 * i for i in range(2000)]
        wait_until(lambda: _gpu_in_use(client) == 0, timeout=60, what="GPUs released")
        assert client.check_invariants() == []
        wait_until(
            lambda: sum(w.restarts for w in cluster.workers.values()) == 5,
            what="every killed worker restarted (with back-off)",
        )
    _assert_no_run_overlapped_itself(log, killed_pids)


def logged_block(i: int, log: str) -> object:
    """A 1 MiB result (``i % 251`` in every byte), its run logged as ``logged_double``'s."""
    import numpy as np

    logged_double(i, log)
    return np.full(2**20, i % 251, dtype=np.uint8)


def _spilled(client: Client) -> int:
    workers = client.scheduler_info()["workers"].values()
    return sum(w["memory"].get("spilled_total", 0) for w in workers)


def test_kill_storm_with_results_spilling_loses_nothing(tmp_path: Path) -> None:
    """The kill storm's guarantees hold while results go to disk and are read back."""
    import numpy as np

    log = tmp_path / "runs.log"
    spill = tmp_path / "spill"
    settings = {
        # A fresh worker uses about 100 MiB: its 600 results of 1 MiB (a quarter of 2,400)
        # cannot all stay in memory under this.
        "worker.memory-limit": "240MiB",
        "worker.memory.pause": False,  # spilling, not pausing, is what is tried here
        "worker.memory.terminate": False,
        "worker.memory.spill-directory": str(spill),
    }
    chooser = random.Random(11)
    killed_pids: set[int] = set()
    n = 2400
    with (
        config.set(settings),
        LocalCluster(n_workers=4, threads_per_worker=2) as cluster,
        Client(cluster) as client,
    ):
        blocks = client.map(logged_block, range(n), [str(log)] * n)
        sums = [client.submit(np.sum, block) for block in blocks]
        wait_until(lambda: _spilled(client) > 0, timeout=120, what="results spilled")
        for round_ in range(4):
            target = 400 * (round_ + 1)
            wait_until(
                lambda t=target: sum(f.done() for f in sums) >= t,
                timeout=180,
                what=f"{target} sums done",
            )
            alive = [
                name for name, w in sorted(cluster.workers.items()) if w.process.poll() is None
            ]
            victim = chooser.choice(alive)
            killed_pids.add(cluster.workers[victim].pid)
            cluster.kill_worker(victim, restart=True)
        assert client.gather(sums) == [2**20 * (i % 251) for i in range(n)]
        # Spilled blocks read back whole, on the client too.
        assert int(blocks[7].result(timeout=60)[0]) == 7
        assert client.check_invariants() == []
    _assert_no_run_overlapped_itself(log, killed_pids)
    # Killed workers' spill directories went with their successors' start, the rest on close.
    assert list((spill / "apportion-spill").iterdir()) == []


@pytest.mark.filterwarnings("ignore::apportion.NoWorkerWarning")  # all workers dead at once
def test_a_task_that_kills_its_worker_errs_after_bounded_attempts() -> None:
    def suicide() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    with LocalCluster(n_workers=2) as cluster, Client(cluster) as client:
        with pytest.raises(KilledWorkerError, match="probably what kills them"):
            client.submit(suicide).result(timeout=120)
        deaths = config.get("scheduler.allowed-failures") + 1
        wait_until(
            lambda: sum(w.restarts for w in cluster.workers.values()) == deaths,
            what=f"{deaths} workers restarted",
        )
        client.wait_for_workers(2, timeout=60)
        assert client.submit(inc, 1).result(timeout=30) == 2


CLIENT_THAT_VANISHES = """
import sys
from apportion import Client
from tests.integration.tasks import hold
client = Client(sys.argv[1])
futures = client.map(hold, [0.2] * 50, range(50), resources={"GPU": 1}, pure=False)
print("submitted", flush=True)
sys.stdin.read()
"""


def test_a_vanished_clients_tasks_are_released_and_others_unaffected(tmp_path: Path) -> None:
    with (
        LocalCluster(workers=[{"name": "gpu", "resources": {"GPU": 1}}]) as cluster,
        Client(cluster) as client,
    ):
        vanishing = subprocess.Popen(
            [sys.executable, "-c", CLIENT_THAT_VANISHES, cluster.scheduler_address],
            env={**os.environ, "APPORTION_TOKEN": cluster.token},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert vanishing.stdout.readline().strip() == "submitted"
            wait_until(
                lambda: sum(client.scheduler_info()["tasks"].values()) == 50,
                what="the other client's tasks known",
            )
            vanishing.kill()
            vanishing.wait(timeout=10)
        finally:
            if vanishing.poll() is None:
                vanishing.kill()
        wait_until(lambda: client.scheduler_info()["clients"] == 1, what="client dropped")
        mine = client.submit(hold, 0, "mine", resources={"GPU": 1})
        assert mine.result(timeout=30)["tag"] == "mine"
        wait_until(
            lambda: sum(client.scheduler_info()["tasks"].values()) <= 1,
            what="abandoned tasks released",
        )
        wait_until(lambda: _gpu_in_use(client) == 0, what="GPU released")
        assert client.check_invariants() == []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_scheduler(port: int, token: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [*APPORTION, "scheduler", "--port", str(port), "--ready-fd", "1"],
        env={**os.environ, "APPORTION_TOKEN": token},
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        pass_fds=(1,),
    )
    json.loads(process.stdout.readline())
    return process


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.terminate()
    for process in started:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_after_a_scheduler_restart_the_same_client_gets_its_pending_results(
    processes: list[subprocess.Popen],
) -> None:
    port, token = _free_port(), "restart-token"
    address = f"tcp://127.0.0.1:{port}"
    processes.append(_start_scheduler(port, token))
    for name in ("a", "b"):
        processes.append(
            subprocess.Popen(
                [*APPORTION, "worker", address, "--name", name],
                env={**os.environ, "APPORTION_TOKEN": token},
                stdin=subprocess.DEVNULL,
            )
        )
    with Client(address, token=token) as client:
        client.wait_for_workers(2, timeout=60)
        assert client.submit(inc, 1).result(timeout=30) == 2
        long_running = client.submit(hold, 3, "across", pure=False)
        wait_until(lambda: client.scheduler_info()["tasks"].get("processing") == 1)
        processes[0].kill()
        processes[0].wait(timeout=10)
        meanwhile = client.submit(inc, 41)  # accepted while no scheduler is there
        processes.append(_start_scheduler(port, token))
        assert meanwhile.result(timeout=60) == 42
        assert long_running.result(timeout=60)["tag"] == "across"
        client.wait_for_workers(2, timeout=60)
        assert client.check_invariants() == []


def test_a_client_whose_scheduler_stays_away_fails_its_futures_clearly(
    processes: list[subprocess.Popen],
) -> None:
    port, token = _free_port(), "restart-token"
    address = f"tcp://127.0.0.1:{port}"
    processes.append(_start_scheduler(port, token))
    with config.set({"client.reconnect-timeout": 1.0}), Client(address, token=token) as client:
        pending = client.submit(inc, 1)  # no worker: it stays pending
        processes[0].kill()
        processes[0].wait(timeout=10)
        with pytest.raises(
            SchedulerConnectionError,
            match=rf"scheduler {address} lost.*no scheduler answered at {address} for 1s "
            r"\(client.reconnect-timeout\)",
        ):
            pending.result(timeout=30)
        with pytest.raises(SchedulerConnectionError, match="no scheduler answered"):
            client.submit(inc, 2)


def test_a_result_too_large_for_a_frame_fails_clearly_and_so_does_a_huge_argument() -> None:
    with config.set({"comm.max-frame-bytes": 2_000_000}):
        cluster = LocalCluster(n_workers=1)
        client = Client(cluster)
        try:
            big = client.submit(os.urandom, 3_000_000)
            with pytest.raises(ValueError, match=r"more than comm\.max-frame-bytes allows"):
                big.result(timeout=30)
            with pytest.raises(ValueError, match="pass large data as the result of another"):
                client.submit(len, b"x" * 3_000_000)
            assert client.submit(inc, 1).result(timeout=30) == 2
        finally:
            client.close()
            cluster.close()


def test_a_result_that_does_not_load_where_it_is_needed_fails_the_task_that_takes_it() -> None:
    """Fetched again or made again, it would not load any better: the task taking it
    fails with the error loading it raised, instead of waiting while it is made again
    and again."""
    workers = [{"name": "a", "resources": {"A": 1}}, {"name": "b", "resources": {"B": 1}}]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        assert client.get_task_stream() == []  # (runs are recorded from here on)
        made = client.submit(made_here, resources={"A": 1})
        assert client.submit(maker_pid, made, resources={"A": 1}).result(timeout=30) > 0
        taken = client.submit(maker_pid, made, resources={"B": 1})
        with pytest.raises(InputLoadError, match="loads only in the process that made") as raised:
            taken.result(timeout=60)
        message = str(raised.value)
        assert f"the input {made.key!r}, fetched from tcp://" in message
        assert "are the modules it needs installed there?" in message
        assert "in __setstate__" in str(raised.value.__cause__)  # where loading it failed
        made_runs = [run for run in client.get_task_stream(0) if run["key"] == made.key]
        assert len(made_runs) == 1
        assert client.submit(inc, 1, resources={"B": 1}).result(timeout=30) == 2
        assert client.check_invariants() == []


def test_a_standalone_scheduler_creates_a_private_token_that_local_clients_find(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: list[subprocess.Popen]
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("APPORTION_TOKEN", raising=False)
    port = _free_port()
    scheduler = subprocess.Popen(
        [*APPORTION, "scheduler", "--port", str(port), "--ready-fd", "1"],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        pass_fds=(1,),
    )
    processes.append(scheduler)
    json.loads(scheduler.stdout.readline())
    token_file = tmp_path / "apportion" / "token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    with Client(f"tcp://127.0.0.1:{port}") as client:
        assert client.token == token_file.read_text().strip()
    with pytest.raises(ConnectionRefusedError, match="authentication failed"):
        Client(f"tcp://127.0.0.1:{port}", token="guess")
