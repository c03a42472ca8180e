"""SSHCluster's decisions (apportion/ssh.py), without SSH: options per host, the command
lines run on the hosts, where new workers go, and what a failure says."""

from __future__ import annotations

import shlex

import pytest

from apportion.ssh import (
    dashboard_port,
    explain_start_failure,
    least_loaded,
    per_host,
    remote_command,
    scheduler_arguments,
    worker_arguments,
)


def test_options_are_one_for_all_hosts_or_one_per_host() -> None:
    assert per_host({"a": 1}, ["x", "y"], "worker_options") == [{"a": 1}, {"a": 1}]
    assert per_host([{}, {"a": 1}], ["x", "y"], "worker_options") == [{}, {"a": 1}]
    with pytest.raises(ValueError, match="list of 1, but there are 2 hosts"):
        per_host([{}], ["x", "y"], "worker_options")
    with pytest.raises(TypeError, match="remote_python must be a str"):
        per_host(3, ["x"], "remote_python", str)


def test_worker_arguments_carry_the_hosts_resources_and_no_token() -> None:
    args = worker_arguments(
        "tcp://s:1", "gpu-0", {"nthreads": 4, "resources": "GPU=2", "memory_limit": "4GB"}
    )
    assert args == [
        *("worker", "tcp://s:1", "--name", "gpu-0", "--nthreads", "4"),
        *("--resources", "GPU=2", "--memory-limit", "4GB"),
    ]
    command = remote_command("/opt/py 3/bin/python", args)
    assert shlex.split(command)[:3] == ["/opt/py 3/bin/python", "-m", "apportion.ssh_remote"]
    assert "token" not in command.lower()


def test_the_scheduler_listens_everywhere_with_dasks_dashboard_port_preferred() -> None:
    assert dashboard_port({}) == (8787, True)
    assert dashboard_port({"dashboard_address": ":0"}) == (0, False)
    assert dashboard_port({"dashboard_address": None}) == (None, False)
    assert dashboard_port({"http_port": 9000}) == (9000, False)
    with pytest.raises(ValueError, match="names no port"):
        dashboard_port({"dashboard_address": "host"})
    assert scheduler_arguments({"port": 8786}, 8787) == [
        *("scheduler", "--host", "", "--port", "8786", "--http-port", "8787")
    ]


def test_new_workers_go_to_the_host_with_fewest() -> None:
    assert least_loaded([2, 1, 1]) == 1
    assert least_loaded([0, 0]) == 0


@pytest.mark.parametrize(
    ("code", "output", "said"),
    [
        (127, ["bash: /nowhere/python3: No such file or directory"], "there is no Python at"),
        (1, ["/usr/bin/python3: No module named apportion"], "apportion is not installed for"),
        (
            1,
            ["/usr/bin/python3: No module named apportion.ssh_remote"],
            "older than this one",
        ),
        (1, ["boom"], "exited with code 1 before it was ready"),
    ],
)
def test_a_server_that_cannot_start_is_explained(code: int, output: list[str], said: str) -> None:
    message = explain_start_failure("h1", "worker", "/usr/bin/python3", code, output)
    assert message.startswith(("h1:", "the worker on h1")) and said in message
