"""Processes started with a standard stream closed, handed one as their ready pipe, or
ended by a task: they run, stop and are supervised as any other."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from apportion import Client, LocalCluster
from tests.conftest import wait_until

APPORTION = [sys.executable, "-m", "apportion"]


def _closing(*fds: int) -> Callable[[], None]:
    """A preexec_fn: the child starts with these descriptors closed."""

    def close() -> None:
        for fd in fds:
            os.close(fd)

    return close


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(workers=[]) as cluster:
        yield cluster


def _stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return process.wait(timeout=30)


def _worker_names(client: Client) -> list[str]:
    return sorted(w["name"] for w in client.scheduler_info()["workers"].values())


def test_a_worker_started_with_stderr_closed_works_and_stops_cleanly(
    cluster: LocalCluster,
) -> None:
    worker = subprocess.Popen(
        [*APPORTION, "worker", cluster.scheduler_address, "--name", "no-stderr"],
        env={**os.environ, "APPORTION_TOKEN": cluster.token},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        preexec_fn=_closing(2),
    )
    try:
        with Client(cluster) as client:
            wait_until(lambda: _worker_names(client) == ["no-stderr"], what="the worker")
            assert client.submit(sum, [1, 2]).result(timeout=30) == 3
    finally:
        code = _stop(worker)
    assert code == 0  # a deliberate stop, not an abort (134) or a signal (-6)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_a_scheduler_with_every_standard_stream_closed_stops_cleanly_on_sigterm() -> None:
    port = _free_port()
    scheduler = subprocess.Popen(
        [*APPORTION, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-auth"],
        preexec_fn=_closing(0, 1, 2),
    )
    try:
        wait_until(lambda: _accepts(port) or scheduler.poll() is not None, what="listening")
        assert scheduler.poll() is None
    finally:
        code = _stop(scheduler)
    assert code == 0


def test_a_pool_started_with_stderr_closed_runs_all_its_workers(cluster: LocalCluster) -> None:
    pool = subprocess.Popen(
        [*APPORTION, "worker", cluster.scheduler_address, "--nworkers", "2", "--name", "quiet"],
        env={**os.environ, "APPORTION_TOKEN": cluster.token},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        preexec_fn=_closing(2),
    )
    try:
        with Client(cluster) as client:
            wait_until(lambda: _worker_names(client) == ["quiet-0", "quiet-1"], what="both workers")
    finally:
        code = _stop(pool)
    assert code == 0


def test_a_scheduler_whose_ready_fd_is_stdout_closes_the_connections_it_refuses() -> None:
    scheduler = subprocess.Popen(
        [*APPORTION, "scheduler", "--port", "0", "--no-auth", "--ready-fd", "1"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env={**os.environ, "APPORTION_LOG_LEVEL": "WARNING"},
    )
    try:
        assert scheduler.stdout is not None
        address = json.loads(scheduler.stdout.readline())["address"]
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=15) as peer:
            # A frame length far over the limit: the scheduler refuses and closes.
            peer.sendall(b"\xff" * 16)
            received = b""
            while chunk := peer.recv(65536):  # a timeout here: the connection stayed open
                received += chunk
        assert b"stopping" not in received  # the scheduler's output is not the peer's
    finally:
        code = _stop(scheduler)
    assert code == 0


def test_a_pool_restarts_a_worker_whose_task_exits_the_process_with_code_0(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    pool = subprocess.Popen(
        [*APPORTION, "worker", cluster.scheduler_address, "--nworkers", "2", "--name", "pool"],
        env={**os.environ, "APPORTION_TOKEN": cluster.token, "APPORTION_LOG_LEVEL": "ERROR"},
        stdin=subprocess.DEVNULL,
    )
    marker = tmp_path / "exited-once"

    def exit_once(path: str) -> str:
        if not os.path.exists(path):
            open(path, "w").close()
            os._exit(0)
        return "ran"

    try:
        with Client(cluster) as client:
            wait_until(lambda: _worker_names(client) == ["pool-0", "pool-1"], what="the pool")
            pids = {w["pid"] for w in client.scheduler_info()["workers"].values()}
            assert client.submit(exit_once, str(marker)).result(timeout=60) == "ran"
            assert marker.exists()

            def restarted() -> bool:
                workers = client.scheduler_info()["workers"].values()
                return len(workers) == 2 and bool({w["pid"] for w in workers} - pids)

            wait_until(restarted, timeout=60, what="the exited worker restarted")
            assert _worker_names(client) == ["pool-0", "pool-1"]
    finally:
        code = _stop(pool)
    assert code == 0


def test_a_local_cluster_restarts_a_worker_whose_task_exits_the_process_with_code_0(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "exited-once"

    def exit_once(path: str) -> str:
        if not os.path.exists(path):
            open(path, "w").close()
            os._exit(0)
        return "ran"

    with LocalCluster(workers=[{"name": "only"}]) as cluster, Client(cluster) as client:
        assert client.submit(exit_once, str(marker)).result(timeout=60) == "ran"
        assert marker.exists()
        assert cluster.workers["only"].restarts == 1
