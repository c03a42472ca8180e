"""A Dask user's first contact, on real processes: ``Client()`` and Dask's cluster
arguments, a dashboard by default, sizing a cluster, reprs, quiet exits, clear refusals of
bad configuration and flags."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from apportion import Client, LocalCluster, config
from apportion.cluster_base import Cluster
from apportion.local import DASHBOARD_PORT, usable_cpus
from apportion.memory_limit import available_memory
from tests.conftest import wait_until
from tests.integration.cluster_contract import check_cluster_interface


@pytest.fixture(autouse=True)
def no_scheduler_address(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("APPORTION_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.delenv("APPORTION_CLIENT__SCHEDULER_ADDRESS", raising=False)
    config.refresh()
    yield
    config.refresh()


def _worker_shapes(client: Client) -> list[tuple[int, dict[str, float], object]]:
    workers = client.scheduler_info()["workers"].values()
    return sorted(((w["nthreads"], w["resources"], w["memory_limit"]) for w in workers), key=str)


def _script(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "program.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if "SCHEDULER_ADDRESS" not in k}
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


# ---------------------------------------------------------------- Client()
def test_client_with_no_address_starts_a_local_cluster_over_every_core() -> None:
    with Client() as client:
        cluster = client.cluster
        assert isinstance(cluster, LocalCluster)
        client.wait_for_workers(1, timeout=60)
        workers = client.scheduler_info()["workers"].values()
        assert sum(w["nthreads"] for w in workers) == usable_cpus()
        assert client.submit(sum, [1, 2]).result(timeout=60) == 3
        assert cluster.dashboard_link.startswith("http://127.0.0.1:")
        processes = [cluster._scheduler_process, *(w.process for w in cluster.workers.values())]
    for process in processes:  # closed with the client
        assert process.wait(timeout=30) is not None


def test_client_takes_local_cluster_arguments_as_dask_does() -> None:
    with Client(n_workers=2, threads_per_worker=1, resources={"GPU": 1}) as client:
        client.wait_for_workers(2, timeout=60)
        # Each worker's memory limit: the machine's shared between the two, as Dask's "auto".
        share = available_memory() // 2
        assert _worker_shapes(client) == [(1, {"GPU": 1}, share)] * 2
        process = client.cluster._scheduler_process
    assert process.wait(timeout=30) is not None


def test_client_refuses_cluster_arguments_beside_an_address() -> None:
    with pytest.raises(TypeError, match="n_workers"):
        Client("tcp://127.0.0.1:1", n_workers=2)


def test_local_cluster_takes_dasks_arguments() -> None:
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=True,
            memory_limit=2**30,
            dashboard_address=":0",
            resources={"GPU": 1},
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(1, timeout=60)
        assert _worker_shapes(client) == [(2, {"GPU": 1}, 2**30)]
        assert cluster.http_port not in (None, DASHBOARD_PORT)
        text = repr(client)
        assert "workers=1, threads=2, memory=1.00 GiB, resources=GPU=1" in text, text
        assert f":{cluster.http_port}/dashboard" in text and cluster.token not in text
        assert "threads <b>2</b>" in client._repr_html_()
        assert "memory <b>1.00 GiB</b>" in cluster._repr_html_()


def test_processes_false_is_refused_saying_why() -> None:
    with pytest.raises(ValueError, match="process of its own"):
        LocalCluster(processes=False)
    with pytest.raises(ValueError, match="n_workers must be a whole number"):
        LocalCluster(n_workers=-1)


# --------------------------------------------------------------- dashboard
def test_the_dashboard_is_served_by_default_on_8787_or_a_free_port() -> None:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", DASHBOARD_PORT))
        holder.listen()
    except OSError:
        pass  # another program holds it already: the same case
    try:
        with LocalCluster(n_workers=1) as cluster:
            assert cluster.http_port not in (None, DASHBOARD_PORT)
            link = cluster.dashboard_link
            assert link.startswith(f"http://127.0.0.1:{cluster.http_port}/dashboard?token=")
            health = f"http://127.0.0.1:{cluster.http_port}/health"
            assert urllib.request.urlopen(health, timeout=10).status == 200
    finally:
        holder.close()
    with LocalCluster(n_workers=1, dashboard_address=None) as cluster:
        assert cluster.http_port is None and cluster.dashboard_link == ""


def test_the_scheduler_logs_its_dashboard_and_help_lists_every_page() -> None:
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "apportion", "scheduler", "--host", "127.0.0.1"),
            *("--port", "0", "--http-port", "0", "--no-auth", "--log-level", "INFO"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            lines.append(line)
            if "dashboard at" in line or not line:
                break
        assert re.search(r"dashboard at http://127\.0\.0\.1:\d+/dashboard", lines[-1]), lines
    finally:
        process.terminate()
        process.wait(timeout=30)
    help_text = subprocess.run(
        [sys.executable, "-m", "apportion", "scheduler", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    served = set()
    for source in ("scheduler/http_api.py", "scheduler/dashboard_routes.py"):
        text = (Path(__file__).parents[2] / source).read_text()
        served |= set(re.findall(r'\(r"(/[^"]+)"', text))
    flat = "".join(help_text.split())  # click wraps lines, at hyphens too
    for page in served:
        assert page.replace("(.+)", "KEY") in flat, page


# ------------------------------------------------------------------ sizing
def test_local_cluster_answers_what_every_cluster_does() -> None:
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster:
        check_cluster_interface(cluster, scale_to=2)
        assert sorted(cluster.get_logs()) == ["Scheduler", "worker-0", "worker-1"]


def test_scale_starts_and_retires_workers() -> None:
    with LocalCluster(n_workers=1, threads_per_worker=1, resources={"GPU": 1}) as cluster:
        cluster.scale(3)
        assert len(cluster.scheduler.workers) == 3
        assert {w.resources["GPU"] for w in cluster.scheduler.workers.values()} == {1}
        processes = [w.process for w in cluster.workers.values()]
        cluster.scale(1)
        assert len(cluster.scheduler.workers) == 1 and len(cluster.workers) == 1
        assert sum(p.poll() is not None for p in processes) == 2  # retired ones exited
        cluster.scale(cores=2)
        assert len(cluster.scheduler.workers) == 2
        assert repr(cluster).count("(GPU=1)") == 2


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_adapt_grows_with_work_and_shrinks_when_idle() -> None:
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
        cluster.adapt(minimum=1, maximum=3, interval=0.2)
        futures = client.map(_sleep, [1.0 + i / 100 for i in range(12)])
        wait_until(
            lambda: len(client.scheduler_info()["workers"]) == 3, timeout=120, what="3 workers"
        )
        client.gather(futures)
        wait_until(lambda: len(cluster.workers) == 1, timeout=120, what="back to the minimum")
        cluster.scale(2)  # adapting stops: the size is the user's again
        assert len(cluster.scheduler.workers) == 2


# ----------------------------------------------------------- quiet at exit
def test_clients_left_open_are_quiet_at_exit(tmp_path: Path) -> None:
    done = _script(
        tmp_path,
        "from apportion import Client, LocalCluster\n"
        "cluster = LocalCluster(n_workers=1)\n"
        "client = Client(cluster)\n"
        "print(client.submit(sum, [1, 2]).result())\n"
        "own = Client(n_workers=1)\n"
        "print(own.submit(sum, [3, 4]).result())\n",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "7"]
    assert "lost" not in done.stderr and "reconnecting" not in done.stderr, done.stderr


# ------------------------------------------------- configuration and flags
@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("scheduler: [\n", "is not valid YAML at line 2"),
        ("- a\n- b\n", "must hold a mapping (key: value), not a list"),
        (None, "(named by $APPORTION_CONFIG) cannot be read: No such file"),
    ],
)
def test_a_bad_configuration_file_is_one_line_naming_it(
    tmp_path: Path, content: str | None, says: str
) -> None:
    path = tmp_path / "apportion.yaml"
    if content is not None:
        path.write_text(content)
    done = subprocess.run(
        [sys.executable, "-m", "apportion", "scheduler", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "APPORTION_CONFIG": str(path)},
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"apportion: configuration file {path}") and says in line, line


def test_nthreads_zero_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "apportion", "worker", "tcp://127.0.0.1:1", "--nthreads", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--nthreads" in done.stderr and "0 is not in the range x>=1" in done.stderr


def test_a_worker_waiting_for_its_scheduler_logs_ever_less_often() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = subprocess.run(
        [
            *(sys.executable, "-m", "apportion", "worker", f"tcp://127.0.0.1:{port}"),
            *("--no-auth", "--log-level", "INFO"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "APPORTION_WORKER__CONNECT_TIMEOUT": "6"},
    )
    assert done.returncode == 2, done.stderr
    waiting = [line for line in done.stderr.splitlines() if "waiting for scheduler" in line]
    # At 0, 1, 2 and 4 seconds (every attempt would be 8 lines in these 6 seconds).
    assert 2 <= len(waiting) <= 4, waiting


def test_local_cluster_hands_its_children_the_log_level_setting() -> None:
    with config.set({"logging.level": "error"}), LocalCluster(n_workers=1) as cluster:
        assert cluster.log_level == "ERROR"
        for process in [cluster._scheduler_process, cluster.workers["worker-0"].process]:
            argv = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
            assert argv[argv.index(b"--log-level") + 1] == b"ERROR"


def test_kube_cluster_is_a_cluster_with_nothing_left_to_implement() -> None:
    from apportion.kubernetes import KubeCluster

    assert issubclass(KubeCluster, Cluster) and not KubeCluster.__abstractmethods__
    assert issubclass(LocalCluster, Cluster) and not LocalCluster.__abstractmethods__
