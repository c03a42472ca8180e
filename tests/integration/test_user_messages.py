"""What a user reads: errors, warnings and log lines say each thing once, and truly."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import warnings

import pytest

from apportion import Client, LocalCluster, NoValidWorkerError, config
from apportion.client import NoWorkerWarning
from tests.conftest import wait_until

APPORTION = [sys.executable, "-m", "apportion"]


def test_no_valid_worker_error_says_the_task_failed_not_that_it_waits() -> None:
    with config.set({"scheduler.no-worker-timeout": 0.2}):
        with LocalCluster(n_workers=1) as cluster, Client(cluster) as client:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", NoWorkerWarning)
                future = client.submit(sum, [1], resources={"GPU": 1})
                with pytest.raises(NoValidWorkerError) as failed:
                    future.result(timeout=60)
    text = str(failed.value)
    assert "GPU=1" in text and "no live worker has GPU=1" in text
    assert "waits" not in text, text


def test_the_no_worker_warning_comes_once_and_filtering_it_silences_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with LocalCluster(n_workers=1) as cluster, Client(cluster) as client:
        with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", NoWorkerWarning)
            future = client.submit(sum, [1], resources={"GPU": 1})
            wait_until(lambda: caught, what="the warning")
            future.cancel()
    assert len([w for w in caught if issubclass(w.category, NoWorkerWarning)]) == 1
    assert not [r for r in caplog.records if "GPU=1" in r.getMessage()], "logged a second time"


def _connected_line(args: list[str], cluster: LocalCluster) -> str:
    worker = subprocess.Popen(
        [*APPORTION, "worker", cluster.scheduler_address, *args],
        env={"APPORTION_TOKEN": cluster.token, "PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stderr is not None
        for line in worker.stderr:
            if "connected to" in line:
                return line
        raise AssertionError("no 'connected' line")
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_the_worker_connected_line_reads_well_without_resources_or_name() -> None:
    with LocalCluster(workers=[]) as cluster:
        line = _connected_line(["--nthreads", "1"], cluster)
        assert " with - " not in line and "no resources" in line, line
        assert "1 thread" in line and "1 threads" not in line, line
        # Named by its address: the address is not said twice.
        assert len(re.findall(r"tcp://127\.0\.0\.1:\d+", line)) == 2, line
        line = _connected_line(["--name", "gpu-a", "--resources", "GPU=2"], cluster)
        assert re.search(r"worker gpu-a at tcp://\S+ connected to tcp://\S+ with GPU=2", line), line


def test_local_cluster_repr_lists_only_running_workers() -> None:
    with LocalCluster(workers=[{"name": "a"}, {"name": "b", "resources": {"GPU": 1}}]) as cluster:
        assert "a(-)" in repr(cluster) and "b(GPU=1)" in repr(cluster)
        cluster.kill_worker("a")
        assert "a(" not in repr(cluster) and "b(GPU=1)" in repr(cluster)


def test_token_file_help_says_where_the_token_comes_from() -> None:
    from click.testing import CliRunner

    from apportion.auth import default_token_file
    from apportion.cli import main

    def help_of(command: str) -> str:
        text = CliRunner().invoke(main, [command, "--help"], terminal_width=1000).output
        (line,) = [x for x in text.splitlines() if x.strip().startswith("--token-file")]
        return " ".join(line.split())

    worker = help_of("worker")
    scheduler = help_of("scheduler")
    for text in (worker, scheduler):
        assert "$APPORTION_TOKEN" in text and str(default_token_file()) in text, text
    assert "created with a new random token" in scheduler and "if missing" in scheduler
    assert "never created" in worker


def test_a_planned_kill_is_not_warned_about_but_a_crash_is(
    capfd: pytest.CaptureFixture[str],
) -> None:
    import os
    import signal

    workers = [{"name": "planned"}, {"name": "crashed"}, {"name": "stays"}]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:

        def names() -> set[str]:
            return {w["name"] for w in client.scheduler_info()["workers"].values()}

        cluster.kill_worker("planned")
        wait_until(lambda: "planned" not in names(), what="planned gone")
        os.kill(cluster.workers["crashed"].pid, signal.SIGKILL)
        wait_until(lambda: "crashed" not in names(), what="crashed gone")
        cluster.workers["crashed"].supervised = False
    warnings_logged = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
    assert not [line for line in warnings_logged if "planned" in line], warnings_logged
    assert [line for line in warnings_logged if "worker crashed" in line], warnings_logged
