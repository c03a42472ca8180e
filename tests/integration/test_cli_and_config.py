"""Workers started from the command line, resources from config and environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from apportion import Client, LocalCluster, config
from tests.conftest import wait_until
from tests.integration.tasks import hold, peak_concurrency

APPORTION = [sys.executable, "-m", "apportion"]


@pytest.fixture
def scheduler_only() -> Iterator[LocalCluster]:
    with LocalCluster(workers=[]) as cluster:
        yield cluster


def _start(args: list[str], cluster: LocalCluster, **env: str) -> subprocess.Popen:
    environment = {**os.environ, "APPORTION_TOKEN": cluster.token, **env}
    return subprocess.Popen([*APPORTION, *args], env=environment, stdin=subprocess.DEVNULL)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_process_pattern_runs_at_most_one_task_per_worker_process(
    scheduler_only: LocalCluster,
) -> None:
    # apportion worker ADDR --nworkers 3 --nthreads 2 --resources "process=1"
    workers = _start(
        [
            "worker",
            scheduler_only.scheduler_address,
            "--nworkers",
            "3",
            "--nthreads",
            "2",
            "--resources",
            "process=1",
            "--name",
            "proc",
        ],
        scheduler_only,
    )
    try:
        with Client(scheduler_only) as client:
            client.wait_for_workers(3, timeout=60)
            info = client.scheduler_info()["workers"].values()
            assert sorted(w["name"] for w in info) == ["proc-0", "proc-1", "proc-2"]
            assert all(w["resources"] == {"process": 1} and w["nthreads"] == 2 for w in info)
            records = client.gather(
                client.map(hold, [0.05] * 15, range(15), resources={"process": 1})
            )
            per_process = peak_concurrency(records, key="pid")
            assert set(per_process.values()) == {1}, "one task at a time in each process"
            assert len(per_process) == 3
            assert (
                max(peak_concurrency([{**r, "all": 0} for r in records], key="all").values()) <= 3
            )
    finally:
        _stop(workers)


def test_worker_resources_from_environment_and_explicit_flags_win(
    scheduler_only: LocalCluster,
) -> None:
    from_env = _start(
        ["worker", scheduler_only.scheduler_address, "--name", "env"],
        scheduler_only,
        APPORTION_WORKER__RESOURCES__GPU="2",
    )
    flag_wins = _start(
        [
            "worker",
            scheduler_only.scheduler_address,
            "--name",
            "flag",
            "--resources",
            "GPU=1,MEMORY=100e9",
        ],
        scheduler_only,
        APPORTION_WORKER__RESOURCES__GPU="2",
    )
    try:
        with Client(scheduler_only) as client:
            client.wait_for_workers(2, timeout=60)
            by_name = {
                w["name"]: w["resources"] for w in client.scheduler_info()["workers"].values()
            }
            assert by_name == {"env": {"GPU": 2}, "flag": {"GPU": 1, "MEMORY": 100e9}}
    finally:
        _stop(from_env)
        _stop(flag_wins)


def test_config_set_in_the_starting_process_applies_to_local_workers() -> None:
    with config.set({"worker.resources.GPU": 2}):
        cluster = LocalCluster(n_workers=1)
    with cluster, Client(cluster) as client:
        (info,) = client.scheduler_info()["workers"].values()
        assert info["resources"] == {"GPU": 2}
    with config.set({"worker.resources.GPU": 2}):
        cluster = LocalCluster(n_workers=1, resources={"GPU": 1})
    with cluster, Client(cluster) as client:
        (info,) = client.scheduler_info()["workers"].values()
        assert info["resources"] == {"GPU": 1}, "explicit arguments win over config"


@pytest.mark.parametrize("spec", ["GPU", "GPU=abc", "=2", "GPU=-1"])
def test_malformed_resource_spec_is_a_clear_cli_error(spec: str) -> None:
    result = subprocess.run(
        [*APPORTION, "worker", "tcp://127.0.0.1:1", "--resources", spec],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--resources" in result.stderr
    assert spec.split("=")[0] in result.stderr or "malformed" in result.stderr


def test_module_and_console_script_both_work() -> None:
    for command in (APPORTION, [os.path.join(os.path.dirname(sys.executable), "apportion")]):
        result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0
        assert "scheduler" in result.stdout and "worker" in result.stdout


def test_standalone_scheduler_serves_a_client_with_a_token(tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    scheduler = subprocess.Popen(
        [
            *APPORTION,
            "scheduler",
            "--port",
            "0",
            "--token-file",
            str(token_file),
            "--ready-fd",
            "1",
        ],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        pass_fds=(1,),
    )
    try:
        import json

        address = json.loads(scheduler.stdout.readline())["address"]
        with pytest.raises(ConnectionRefusedError, match="authentication failed"):
            Client(address, token="wrong")
        with Client(address, token="s3cret") as client:
            assert client.scheduler_info()["workers"] == {}
    finally:
        _stop(scheduler)
    wait_until(lambda: scheduler.poll() is not None, what="scheduler exit")


def test_scheduler_http_status_reports_health_and_workers() -> None:
    import json
    import urllib.request

    with LocalCluster(workers=[{"name": "g", "resources": {"GPU": 2}}], http_port=0) as cluster:
        base = f"http://127.0.0.1:{cluster.http_port}"
        with urllib.request.urlopen(f"{base}/health", timeout=10) as response:
            assert response.read() == b"ok"
        request = urllib.request.Request(
            f"{base}/api/v1/info", headers={"Authorization": f"Bearer {cluster.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            info = json.loads(response.read())
        assert info["address"] == cluster.scheduler_address
        (worker,) = info["workers"].values()
        assert (worker["name"], worker["resources"], worker["used_resources"]) == (
            "g",
            {"GPU": 2},
            {"GPU": 0},
        )


def test_retire_endpoint_picks_idle_workers_of_the_named_set_and_needs_the_token() -> None:
    import json
    import urllib.error
    import urllib.request

    from tests.integration.tasks import hold

    workers = [{"name": n, "resources": {"GPU": 1}} for n in ("g0", "g1", "g2")]
    with LocalCluster(workers=workers, http_port=0) as cluster, Client(cluster) as client:
        busy = client.submit(hold, 2.0, "busy", resources={"GPU": 1}, pure=False)
        wait_until(
            lambda: any(w["processing"] for w in client.scheduler_info()["workers"].values()),
            what="running",
        )
        running_on = next(
            w["name"] for w in client.scheduler_info()["workers"].values() if w["processing"]
        )
        url = f"http://127.0.0.1:{cluster.http_port}/api/v1/retire"
        body = json.dumps({"workers": ["g0", "g1", "g2"], "count": 2}).encode()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, body, method="POST"), timeout=10)
        assert refused.value.code == 401
        request = urllib.request.Request(
            url, body, method="POST", headers={"Authorization": f"Bearer {cluster.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            retired = json.loads(response.read())["retired"]
        assert len(retired) == 2 and running_on not in retired
        info = {w["name"]: w for w in client.scheduler_info()["workers"].values()}
        assert all(info[name]["retiring"] for name in retired)
        records = client.gather(client.map(hold, [0.01] * 6, range(6), resources={"GPU": 1}))
        assert {r["worker"] for r in records} == {running_on}, "retiring workers get no work"
        assert busy.result(timeout=30)["worker"] == running_on
