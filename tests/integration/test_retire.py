"""Graceful scale-down with real processes: results are copied off a worker before it goes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from apportion import Client, LocalCluster, NoValidWorkerError, config
from tests.conftest import wait_until
from tests.integration.tasks import inc, unique_result, wait_for_file

# "a" alone can run tasks needing A, so results land there; "b" is where copies go.
TWO_WORKERS = [{"name": "a", "resources": {"A": 1}}, {"name": "b"}]
# Larger than worker.inline-result-bytes: the client has to fetch it from a worker.
BIG = 200_000


def _workers(client: Client) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in client.scheduler_info()["workers"].values()}


def _executions(log: Path) -> list[str]:
    return log.read_text().split()


def _retire_over_http(
    cluster: LocalCluster, body: dict[str, Any], token: str | None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.http_port}/api/v1/retire",
        json.dumps(body).encode(),
        headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_result_only_on_a_retired_worker_survives_killing_it_and_is_not_recomputed(
    tmp_path: Path,
) -> None:
    log = tmp_path / "executions"
    with LocalCluster(workers=TWO_WORKERS) as cluster, Client(cluster) as client:
        future = client.submit(unique_result, str(log), BIG, resources={"A": 1}, pure=False)
        wait_until(future.done, what="result in memory on a")
        assert client.retire_workers(["a"], close_workers=False) == {"retired": ["a"], "kept": {}}
        workers = _workers(client)
        assert workers["a"]["retiring"] and workers["b"]["nbytes"] >= BIG
        cluster.kill_worker("a")
        wait_until(lambda: list(_workers(client)) == ["b"], what="a gone")
        tag, payload = future.result(timeout=30)
        assert _executions(log) == [tag] and len(payload) == BIG
        # A task using it on the remaining worker finds it there too.
        assert client.submit(len, future).result(timeout=30) == 2
        assert _executions(log) == [tag], "not recomputed"
        assert client.check_invariants() == []


def test_retire_over_http_needs_the_token_names_unknown_workers_and_moves_data(
    tmp_path: Path,
) -> None:
    log = tmp_path / "executions"
    with (
        LocalCluster(workers=TWO_WORKERS, http_port=0) as cluster,
        Client(cluster) as client,
    ):
        future = client.submit(unique_result, str(log), BIG, resources={"A": 1}, pure=False)
        wait_until(future.done, what="result in memory on a")
        status, answer = _retire_over_http(cluster, {"names": ["a"]}, token=None)
        assert status == 401 and "a valid bearer token is required" in answer["error"]
        status, answer = _retire_over_http(cluster, {"names": ["a", "zz"]}, cluster.token)
        assert status == 400 and "['zz']" in answer["error"]
        status, answer = _retire_over_http(cluster, {"names": ["a"], "count": -1}, cluster.token)
        assert status == 400 and "'count'" in answer["error"]
        assert not _workers(client)["a"]["retiring"], "refused requests change nothing"
        status, answer = _retire_over_http(
            cluster, {"names": ["a", "b"], "count": 1}, cluster.token
        )
        # b runs nothing and holds nothing, so it goes first, at once.
        assert (status, answer) == (200, {"retired": ["b"], "kept": {}})
        status, answer = _retire_over_http(cluster, {"names": ["a"]}, cluster.token)
        assert (status, answer) == (
            200,
            {
                "retired": [],
                "kept": {"a": "holds 1 result still needed and no other worker can take them"},
            },
        )
        assert not _workers(client)["a"]["retiring"]
        assert future.result(timeout=30)[0] == _executions(log)[0]
        assert client.check_invariants() == []


def test_idle_seconds_grow_while_idle_and_are_none_while_a_task_runs(tmp_path: Path) -> None:
    go = tmp_path / "go"
    with LocalCluster(workers=[{"name": "w"}]) as cluster, Client(cluster) as client:
        first = wait_until(lambda: _workers(client)["w"]["idle_seconds"], what="idle time > 0")
        wait_until(lambda: _workers(client)["w"]["idle_seconds"] > first, what="idle time grows")
        blocked = client.submit(wait_for_file, str(go), pure=False)
        wait_until(lambda: _workers(client)["w"]["processing"] == 1, what="task running")
        assert _workers(client)["w"]["idle_seconds"] is None
        go.touch()
        blocked.result(timeout=30)
        wait_until(
            lambda: _workers(client)["w"]["idle_seconds"] is not None, what="idle again after it"
        )


def test_the_only_worker_holding_needed_data_is_kept_in_service(tmp_path: Path) -> None:
    log = tmp_path / "executions"
    with LocalCluster(workers=[{"name": "solo"}]) as cluster, Client(cluster) as client:
        future = client.submit(unique_result, str(log), BIG, pure=False)
        wait_until(future.done, what="result in memory")
        assert client.retire_workers(["solo"]) == {
            "retired": [],
            "kept": {"solo": "holds 1 result still needed and no other worker can take them"},
        }
        assert not _workers(client)["solo"]["retiring"]
        assert client.submit(inc, 1).result(timeout=30) == 2, "still in service"
        assert future.result(timeout=30)[0] == _executions(log)[0]
        with pytest.raises(ValueError, match=r"\['ghost'\]"):
            client.retire_workers(["solo", "ghost"])
        assert client.check_invariants() == []


def test_a_retired_worker_closes_and_is_not_restarted_unless_asked_to_stay() -> None:
    workers = [{"name": n, "resources": {"A": 1}} for n in ("a", "b", "c")]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        future = client.submit(len, b"x" * 10, resources={"A": 1}, pure=False)
        assert future.result(timeout=30) == 10
        retired = client.retire_workers(["a", "b"], count=1)["retired"]
        (name,) = retired
        process = cluster.workers[name].process
        assert process.wait(timeout=30) == 0, "a retired worker exits, on purpose"
        wait_until(lambda: name not in _workers(client), what="the retired worker gone")
        stays = client.retire_workers(["c"], close_workers=False)["retired"]
        assert stays == ["c"]
        assert _workers(client)["c"]["retiring"]
        assert cluster.workers["c"].process.poll() is None
        # The nanny leaves the closed worker alone; the cluster lists only what runs.
        assert cluster.workers[name].process is process
        assert f"{name}(" not in repr(cluster) and "c(" in repr(cluster)
        assert client.check_invariants() == []


def test_a_task_only_a_retired_worker_still_connected_could_run_fails_after_the_timeout() -> None:
    """Not queued for ever for a worker that takes no work: it fails after the no-worker
    timeout, saying the worker is retired (the warning is tested on the state machine)."""
    with config.set({"scheduler.no-worker-timeout": 1}):
        cluster = LocalCluster(workers=TWO_WORKERS)
    with cluster, Client(cluster) as client:
        assert client.retire_workers(["a"], close_workers=False) == {"retired": ["a"], "kept": {}}
        assert _workers(client)["a"]["retired"]
        strict = client.submit(inc, 1, workers=["a"])
        with pytest.raises(NoValidWorkerError, match=r"\('a'\) are retired"):
            strict.result(timeout=30)
        # Work any worker may run goes on on the one in service.
        assert client.submit(inc, 1).result(timeout=30) == 2
        assert client.check_invariants() == []
