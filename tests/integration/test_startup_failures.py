"""A server that cannot start says why in one line and exits non-zero; supervisors restart
crashes only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from apportion import Client, LocalCluster
from apportion.process import EXIT_STARTUP_FAILED
from tests.conftest import wait_until

APPORTION = [sys.executable, "-m", "apportion"]


def _run(args: list[str], timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*APPORTION, *args],
        env={**os.environ, "APPORTION_LOG_LEVEL": "WARNING", **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _reason(result: subprocess.CompletedProcess[str], role: str) -> str:
    """The one line saying why ``apportion ROLE`` did not start."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("apportion ")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"apportion {role}: "), lines
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(workers=[]) as cluster:
        yield cluster


def test_scheduler_port_in_use_exits_non_zero_naming_the_port(busy_port: int) -> None:
    result = _run(["scheduler", "--port", str(busy_port), "--no-auth"])
    assert result.returncode == EXIT_STARTUP_FAILED
    reason = _reason(result, "scheduler")
    assert f"cannot listen on port {busy_port}" in reason and "(--port)" in reason
    assert "in use" in reason


def test_http_port_in_use_exits_non_zero_naming_the_flag(busy_port: int) -> None:
    result = _run(["scheduler", "--port", "0", "--http-port", str(busy_port), "--no-auth"])
    assert result.returncode == EXIT_STARTUP_FAILED
    reason = _reason(result, "scheduler")
    assert f"port {busy_port}" in reason and "(--http-port)" in reason


def test_a_worker_refused_for_a_wrong_token_exits_non_zero_saying_so(
    cluster: LocalCluster,
) -> None:
    result = _run(["worker", cluster.scheduler_address], APPORTION_TOKEN="wrong")
    assert result.returncode == EXIT_STARTUP_FAILED
    assert "authentication failed: a wrong token" in _reason(result, "worker")


def test_a_worker_that_gives_up_waiting_for_a_scheduler_exits_non_zero(busy_port: int) -> None:
    result = _run(
        ["worker", f"tcp://127.0.0.1:{busy_port}", "--no-auth"],
        APPORTION_WORKER__CONNECT_TIMEOUT="1",
    )
    assert result.returncode == EXIT_STARTUP_FAILED
    assert f"no scheduler at tcp://127.0.0.1:{busy_port} after 1s" in _reason(result, "worker")


def test_nworkers_stops_with_the_reason_when_its_workers_cannot_start(
    cluster: LocalCluster,
) -> None:
    result = _run(
        ["worker", cluster.scheduler_address, "--nworkers", "2"],
        timeout=120,
        APPORTION_TOKEN="wrong",
    )
    assert result.returncode == EXIT_STARTUP_FAILED
    assert "restarting" not in result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("apportion worker: stopping")]
    assert "cannot start" in line and "authentication failed: a wrong token" in line


def _child_pids(parent: int) -> list[int]:
    with open(f"/proc/{parent}/task/{parent}/children") as children:
        return [int(pid) for pid in children.read().split()]


def test_nworkers_restarts_a_crashed_worker_but_not_one_stopped_on_purpose(
    cluster: LocalCluster,
) -> None:
    supervisor = subprocess.Popen(
        [*APPORTION, "worker", cluster.scheduler_address, "--nworkers", "2", "--name", "sup"],
        env={**os.environ, "APPORTION_TOKEN": cluster.token},
        stdin=subprocess.DEVNULL,
    )
    try:
        with Client(cluster) as client:

            def names() -> set[str]:
                return {w["name"] for w in client.scheduler_info()["workers"].values()}

            wait_until(lambda: names() == {"sup-0", "sup-1"}, what="two workers")
            pids = {w["name"]: w["pid"] for w in client.scheduler_info()["workers"].values()}
            os.kill(pids["sup-0"], signal.SIGKILL)  # a crash: restarted
            wait_until(
                lambda: (
                    {
                        w["pid"]
                        for w in client.scheduler_info()["workers"].values()
                        if w["name"] == "sup-0"
                    }
                    - {pids["sup-0"]}
                ),
                what="sup-0 restarted",
            )
            os.kill(pids["sup-1"], signal.SIGTERM)  # stopped on purpose: not restarted
            wait_until(lambda: names() == {"sup-0"}, what="sup-1 gone")
            wait_until(lambda: len(_child_pids(supervisor.pid)) == 1, what="one child left")
            assert supervisor.poll() is None
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=30)


def test_local_cluster_reports_why_its_scheduler_could_not_start(busy_port: int) -> None:
    with pytest.raises(RuntimeError, match=rf"scheduler could not start: .*:{busy_port}.* in use"):
        LocalCluster(workers=[], scheduler_port=busy_port)


def test_local_cluster_processes_log_warnings_only_by_default(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with LocalCluster(n_workers=1) as cluster, Client(cluster) as client:
        assert client.submit(sum, [1, 2]).result(timeout=30) == 3
    err = capfd.readouterr().err
    assert " INFO " not in err, err


def test_a_worker_that_gives_up_on_a_lost_scheduler_exits_non_zero_saying_so() -> None:
    cluster = LocalCluster(workers=[])
    try:
        worker = subprocess.Popen(
            [*APPORTION, "worker", cluster.scheduler_address],
            env={
                **os.environ,
                "APPORTION_TOKEN": cluster.token,
                "APPORTION_LOG_LEVEL": "WARNING",
                "APPORTION_WORKER__CONNECT_TIMEOUT": "1",
            },
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        with Client(cluster) as client:
            wait_until(lambda: client.scheduler_info()["workers"], what="the worker")
    finally:
        cluster.close()  # the scheduler goes away for good
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 1, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("apportion worker: ")]
    assert len(lines) == 1 and "stopped: no scheduler at" in lines[0], stderr
