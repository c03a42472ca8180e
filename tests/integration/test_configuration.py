"""Configuration through LocalCluster and the command line: precedence and errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from apportion import Client, LocalCluster, NoValidWorkerError, config
from apportion.errors import ConfigError


def test_config_set_beats_the_environment_in_local_cluster_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The environment says wait (almost) forever; config.set, higher, says 0.5 s.
    monkeypatch.setenv("APPORTION_SCHEDULER__NO_WORKER_TIMEOUT", "3600")
    with config.set({}):  # on exit, this process's configuration is as it was
        config.refresh()
        config.set({"scheduler.no-worker-timeout": 0.5})
        with LocalCluster(n_workers=1) as cluster, Client(cluster) as client:
            future = client.submit(sum, [1], resources={"GPU": 1})
            with pytest.raises(NoValidWorkerError, match="GPU=1"):
                future.result(timeout=60)
    assert config.get("scheduler.no-worker-timeout") is None


def test_a_misspelt_environment_variable_stops_the_cli_with_the_closest_key() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "apportion", "scheduler", "--no-auth"],
        env={**os.environ, "APPORTION_SCHEDULER__NO_WORKER_TIMOUT": "5"},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "unknown configuration key 'scheduler.no-worker-timout'" in line
    assert "APPORTION_SCHEDULER__NO_WORKER_TIMOUT" in line
    assert "did you mean 'scheduler.no-worker-timeout'?" in line


def test_a_misspelt_key_fails_config_set() -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'scheduler\.allowed-failures'"):
        config.set({"scheduler.alowed-failures": 1})
