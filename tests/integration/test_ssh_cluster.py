"""SSHCluster and ``apportion ssh`` against a real OpenSSH server (tests/integration/sshd.py):
127.0.0.1 and localhost are two "hosts" of the same sshd, so the scheduler and every
worker are started over SSH, as on separate machines."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import psutil
import pytest

from apportion import Client, annotate, get_worker
from apportion.ssh import SSHCluster, SSHClusterError
from tests.conftest import wait_until
from tests.integration.cluster_contract import check_cluster_interface
from tests.integration.sshd import Sshd, free_port, running_sshd, sshd_missing
from tests.integration.test_readme_commands import blocks, section
from tests.integration.test_readme_examples import DASK_PAGE

pytestmark = pytest.mark.skipif(sshd_missing() is not None, reason=str(sshd_missing()))

# The hosts' workers run in the SSH user's home, where this test's modules cannot be
# imported: its task functions travel by value, as a script's do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


def started_over_ssh(sshd: Sshd) -> list[psutil.Process]:
    """Every Python process under the test's sshd: launchers and servers."""
    children = psutil.Process(sshd.pid).children(recursive=True)
    return [p for p in children if "python" in " ".join(_cmdline(p))]


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return list(process.cmdline())
    except psutil.Error:
        return []


def all_gone(processes: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)


# The seed's pipeline (README): loading anywhere, processing on GPUs, aggregating on the
# worker with plenty of memory.
def load(filename: str) -> list[int]:
    return list(range(len(filename)))


def process(rows: list[int]) -> tuple[int, str]:
    return sum(rows), get_worker().name


def aggregate(results: list[tuple[int, str]]) -> tuple[int, str]:
    return sum(total for total, _ in results), get_worker().name


def test_ssh_cluster_runs_the_seed_pipeline_and_stops_every_remote_process(sshd: Sshd) -> None:
    cluster = SSHCluster(
        ["127.0.0.1", "localhost", "127.0.0.1"],
        connect_options=sshd.connect_options(),
        worker_options=[
            {"nthreads": 2, "resources": {"GPU": 2}},
            {"resources": "MEMORY=100e9"},
        ],
        scheduler_options={"dashboard_address": ":0"},
    )
    with cluster:
        remote = started_over_ssh(sshd)
        assert len(remote) == 6, [_cmdline(p) for p in remote]  # 3 launchers, 3 servers
        # The token travelled over the channels: no command line shows it.
        listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert "ssh_remote" in listing and cluster.token not in listing
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        names = sorted(cluster.workers)
        assert names == ["127.0.0.1-1", "localhost-0"]
        with Client(cluster) as client:
            files = ["a.csv", "bb.csv", "ccc.csv", "dddd.csv"]
            data = [client.submit(load, name) for name in files]
            processed = [client.submit(process, d, resources={"GPU": 1}) for d in data]
            final = client.submit(aggregate, processed, resources={"MEMORY": 70e9})
            assert final.result(timeout=60) == (74, "127.0.0.1-1")
            assert {where for _, where in client.gather(processed)} == {"localhost-0"}
            with annotate(resources={"GPU": 1}):
                again = client.map(process, data, pure=False)
            assert {where for _, where in client.gather(again)} == {"localhost-0"}
        logs = cluster.get_logs()
        assert sorted(logs) == ["127.0.0.1-1", "Scheduler", "localhost-0"]
        assert "127.0.0.1" in repr(cluster) and "GPU=2" in repr(cluster)
    assert wait_until(lambda: all_gone(remote), timeout=60), [_cmdline(p) for p in remote]


def test_ssh_cluster_answers_what_every_cluster_does(sshd: Sshd) -> None:
    with SSHCluster(
        ["127.0.0.1", "localhost"],
        connect_options=sshd.connect_options(),
        scheduler_options={"http_port": 0},
    ) as cluster:
        check_cluster_interface(cluster, scale_to=2)
        assert len(cluster.workers) == 2
        cluster.scale(1)
        assert len(cluster.scheduler.workers) == 1
        assert len(started_over_ssh(sshd)) == 4  # the retired worker's processes are gone


def test_a_worker_lost_with_its_connection_stops_itself(sshd: Sshd) -> None:
    with SSHCluster(
        ["127.0.0.1", "localhost"],
        connect_options=sshd.connect_options(),
        scheduler_options={"http_port": 0},
    ) as cluster:
        remote = started_over_ssh(sshd)
        launchers = [
            p for p in remote if "worker" in _cmdline(p) and "ssh_remote" in str(_cmdline(p))
        ]
        servers = [p for p in remote if p.ppid() in {launcher.pid for launcher in launchers}]
        assert len(launchers) == 1 and len(servers) == 1
        # As if the SSH connection dropped: the session's end of the channel is gone.
        sessions = [psutil.Process(launchers[0].ppid())]
        while "sshd" not in " ".join(_cmdline(sessions[-1])):
            sessions.append(psutil.Process(sessions[-1].ppid()))
        sessions[-1].kill()
        assert wait_until(lambda: all_gone(launchers + servers), timeout=60)
        assert wait_until(lambda: not cluster.scheduler.workers, timeout=60)


# ----------------------------------------------------------------- failures, said plainly
def test_an_unreachable_host_is_named_with_what_to_do(sshd: Sshd) -> None:
    options = {**sshd.connect_options(), "port": free_port()}
    with pytest.raises(SSHClusterError, match=r"cannot reach 127\.0\.0\.1 over SSH \(port \d+\)"):
        SSHCluster(["127.0.0.1", "localhost"], connect_options=options)


def test_a_refused_key_is_named_with_what_to_do(sshd: Sshd, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    options = {**sshd.connect_options(), "client_keys": [str(other)]}
    with pytest.raises(SSHClusterError, match=r"127\.0\.0\.1 refused SSH authentication for user"):
        SSHCluster(["127.0.0.1", "localhost"], connect_options=options)


def test_an_unknown_host_key_is_named_with_what_to_do(sshd: Sshd, tmp_path: Path) -> None:
    (tmp_path / "known_hosts").write_text("")
    options = {**sshd.connect_options(), "known_hosts": str(tmp_path / "known_hosts")}
    with pytest.raises(SSHClusterError, match=r"host key of 127\.0\.0\.1 is not trusted"):
        SSHCluster(["127.0.0.1", "localhost"], connect_options=options)


def test_a_host_without_the_python_given_is_named(sshd: Sshd) -> None:
    with pytest.raises(SSHClusterError, match=r"127\.0\.0\.1: there is no Python at '/nowhere/py"):
        SSHCluster(
            ["127.0.0.1", "localhost"],
            connect_options=sshd.connect_options(),
            remote_python="/nowhere/python3",
        )


def test_a_host_without_apportion_is_named(sshd: Sshd, tmp_path: Path) -> None:
    bare = tmp_path / "bare"  # a Python without apportion installed
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(SSHClusterError, match="localhost: apportion is not installed for"):
        SSHCluster(
            ["127.0.0.1", "localhost"],
            connect_options=sshd.connect_options(),
            remote_python=[sys.executable, str(bare / "bin" / "python")],
        )
    assert wait_until(lambda: not started_over_ssh(sshd), timeout=60)


# ------------------------------------------------------------------------ the command
def test_apportion_ssh_runs_a_cluster_until_interrupted(sshd: Sshd, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    command = [
        *(sys.executable, "-m", "apportion", "ssh", "127.0.0.1", "localhost", "localhost"),
        *("--resources", "GPU=1", "--nthreads", "2"),
        *("--scheduler-port", "0", "--dashboard-port", "0", "--token-file", str(token_file)),
        *("--ssh-port", str(sshd.port), "--ssh-private-key", str(sshd.user_key)),
        *("--known-hosts", str(sshd.known_hosts)),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPORTION_TOKEN")}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as cli:
        assert cli.stdout is not None
        lines = [cli.stdout.readline() for _ in range(4)]
        assert lines[0].startswith("Scheduler at tcp://127.0.0.1:"), (lines, cli.stderr.read())
        address = lines[0].split()[-1]
        assert "/dashboard" in lines[1] and "token" not in lines[1]
        assert f"APPORTION_TOKEN_FILE={token_file}" in lines[3]
        token = token_file.read_text().strip()
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        remote = started_over_ssh(sshd)
        with Client(address, token=token) as client:
            info = client.scheduler_info()["workers"]
            assert sorted(w["resources"].get("GPU") for w in info.values()) == [1, 1]
            assert client.submit(sum, [1, 2], resources={"GPU": 1}).result(timeout=60) == 3
        cli.send_signal(signal.SIGINT)
        assert cli.wait(timeout=120) == 0, cli.stderr.read()
    assert wait_until(lambda: all_gone(remote), timeout=60)


def test_apportion_ssh_says_why_it_cannot_start(sshd: Sshd, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "apportion", "ssh", "127.0.0.1", "localhost"),
            *("--ssh-port", str(free_port()), "--token-file", str(tmp_path / "token")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("apportion ssh: cannot reach 127.0.0.1 over SSH"), done.stderr
    assert "Connection refused" in last


# ------------------------------------------------------------------- the docs' example
def test_the_ssh_example_of_the_dask_page_runs_as_pasted(sshd: Sshd, tmp_path: Path) -> None:
    # A home of its own: ~/.ssh holds the test's key, the server's host key and the port
    # of "localhost", read as ssh reads them; the example itself is unchanged.
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(sshd.user_key, home / ".ssh" / "id_ed25519")
    shutil.copy(sshd.known_hosts, home / ".ssh" / "known_hosts")
    (home / ".ssh" / "config").write_text(f"Host localhost\n  Port {sshd.port}\n")
    (code,) = blocks(section("On machines you reach by SSH", DASK_PAGE), "python")
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "HOME": str(home)}
    env.pop("SSH_AUTH_SOCK", None)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["localhost-0", "['localhost-0', 'localhost-1']"]
