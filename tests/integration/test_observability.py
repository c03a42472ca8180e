"""Metrics, dashboard access, logs and task output on real processes over loopback."""

from __future__ import annotations

import http.cookiejar
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from apportion import Client, LocalCluster, config
from tests.conftest import wait_until
from tests.integration.tasks import wait_for_file

WORKERS = [
    {"name": "gpu-a", "nthreads": 4, "resources": {"GPU": 2}},
    {"name": "cpu", "nthreads": 2, "resources": {"CPU-ONLY": 1}},
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(workers=WORKERS, http_port=0) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster) as client:
        yield client


def base(cluster: LocalCluster) -> str:
    return f"http://127.0.0.1:{cluster.http_port}"


def metrics(cluster: LocalCluster) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    request = urllib.request.Request(
        f"{base(cluster)}/metrics", headers={"Authorization": f"Bearer {cluster.token}"}
    )
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def gpu_used(cluster: LocalCluster, worker: str) -> float:
    key = ("apportion_worker_resource_used", (("resource", "GPU"), ("worker", worker)))
    return metrics(cluster).get(key, -1)


def post(url: str, body: bytes, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, body, headers, method="POST")
    try:
        return int(urllib.request.urlopen(request, timeout=10).status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_operators_cluster_status_shows_on_the_dashboard(
    cluster: LocalCluster, client: Client
) -> None:
    url = f"{base(cluster)}/api/v1/cluster-status"
    summary = {
        "name": "pipeline",
        "namespace": "ml",
        "phase": "Running",
        "workerGroups": [
            {
                "name": "gpu",
                "desiredReplicas": 2,
                "readyReplicas": 1,
                "connectedWorkers": 1,
                "resources": {"GPU": 2},
                "minReplicas": 0,
                "maxReplicas": 4,
                "lastScale": {
                    "time": "2026-11-24T08:00:00Z",
                    "from": 1,
                    "to": 2,
                    "reason": "3 tasks wait for GPU=1",
                },
            },
        ],
    }
    body = json.dumps(summary).encode()
    assert post(url, body, None) == 401
    assert post(url, body, "wrong") == 401
    assert post(url, b"[1, 2]", cluster.token) == 400
    assert post(url, b'{"name": "x", "workerGroups": 3}', cluster.token) == 400
    assert post(url, body, cluster.token) == 200
    bearer = urllib.request.Request(
        f"{base(cluster)}/dashboard", headers={"Authorization": f"Bearer {cluster.token}"}
    )
    page = urllib.request.urlopen(bearer, timeout=10).read().decode()
    assert "ResourceCluster ml/pipeline" in page and 'data-group="gpu"' in page
    assert "3 tasks wait for GPU=1" in page and "(0 to 4)" in page


def emit(text: str) -> str:
    import sys
    import warnings

    print(text)
    print(f"{text} on stderr", file=sys.stderr)
    warnings.warn(f"{text} warned", stacklevel=1)
    return text


def test_metrics_show_gpus_in_use_while_tasks_hold_them(
    cluster: LocalCluster, client: Client, tmp_path: Any
) -> None:
    gate = str(tmp_path / "go")
    held = client.map(wait_for_file, [gate] * 3, key="hold-gpu", pure=False, resources={"GPU": 1})
    wait_until(lambda: gpu_used(cluster, "gpu-a") == 2, what="GPU 2/2 in use on gpu-a")
    m = metrics(cluster)
    assert m[("apportion_worker_resource_total", (("resource", "GPU"), ("worker", "gpu-a")))] == 2
    assert m[("apportion_tasks", (("state", "processing"),))] == 2
    assert m[("apportion_waiting_tasks", (("reason", "queued"), ("resources", "GPU=1")))] == 1
    assert m[("apportion_connections", (("role", "worker"),))] == 2
    open(gate, "w").close()
    client.gather(held)
    wait_until(lambda: gpu_used(cluster, "gpu-a") == 0, what="GPUs released")
    m = metrics(cluster)
    count = ("apportion_task_duration_seconds_count", (("prefix", "hold-gpu"),))
    assert m[count] == 3
    assert client.check_invariants() == []


def test_metrics_count_dependencies_fetched_from_another_worker(
    cluster: LocalCluster, client: Client
) -> None:
    transfers = ("apportion_transfers_total", ())
    before = metrics(cluster)[transfers]
    # Larger than the results the scheduler hands on inline with a task (2 KiB): fetched.
    here = client.submit(bytes, 100_000, resources={"CPU-ONLY": 1})
    there = client.submit(len, here, resources={"GPU": 1})  # runs on gpu-a, fetches it
    assert there.result() == 100_000
    # The worker may tell this client before the scheduler hears of the run.
    wait_until(lambda: metrics(cluster)[transfers] == before + 1, what="one transfer counted")


def test_dashboard_needs_the_token_and_a_link_with_it_signs_in(
    cluster: LocalCluster, client: Client
) -> None:
    page = f"{base(cluster)}/dashboard"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(page, timeout=10)
    assert refused.value.code == 401
    assert "token" in refused.value.read().decode()
    with pytest.raises(urllib.error.HTTPError) as wrong:
        urllib.request.urlopen(f"{page}?token=not-it", timeout=10)
    assert wrong.value.code == 401

    link = client.dashboard_link
    assert link == cluster.dashboard_link and link.startswith(page + "?token=")
    browser = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    answer = browser.open(link, timeout=10)
    assert answer.geturl() == page  # the token left the address bar
    html = answer.read().decode()
    assert 'data-worker="gpu-a"' in html and 'data-worker="cpu"' in html
    stream = browser.open(f"{page}/events", timeout=10)
    assert stream.headers["Content-Type"] == "text/event-stream"
    first = stream.readline().decode()
    assert first.startswith("data: {") and '"workers"' in first
    stream.close()
    bearer = urllib.request.Request(page, headers={"Authorization": f"Bearer {cluster.token}"})
    assert urllib.request.urlopen(bearer, timeout=10).status == 200
    # The login form, as a person would use it.
    form = browser.open(f"{page}/login", data=f"token={cluster.token}".encode(), timeout=10)
    assert form.geturl() == page and form.status == 200


def test_task_output_reaches_the_client_prefixed_with_the_worker(
    client: Client, capfd: Any
) -> None:
    assert client.submit(emit, "hello-gpu", resources={"GPU": 1}).result() == "hello-gpu"

    def printed() -> tuple[str, str] | None:
        out, err = capfd.readouterr()
        printed.out += out  # type: ignore[attr-defined]
        printed.err += err  # type: ignore[attr-defined]
        # Both streams: the client writes them separately, so either may come last.
        return (
            "hello-gpu warned" in printed.err  # type: ignore[attr-defined]
            and "(gpu-a) hello-gpu\n" in printed.out  # type: ignore[attr-defined]
        )

    printed.out = printed.err = ""  # type: ignore[attr-defined]
    wait_until(printed, what="the task's output on the client")
    assert "(gpu-a) hello-gpu\n" in printed.out  # type: ignore[attr-defined]
    assert "(gpu-a) hello-gpu on stderr\n" in printed.err  # type: ignore[attr-defined]


def talk_then_wait(path: str) -> str:
    print("started, waiting for the go")
    wait_for_file(path)
    print("done")
    return path


def test_a_long_tasks_output_arrives_while_it_runs(
    client: Client, capfd: Any, tmp_path: Any
) -> None:
    gate = str(tmp_path / "go")
    future = client.submit(talk_then_wait, gate, resources={"GPU": 1})
    seen = ""

    def printed(text: str) -> bool:
        nonlocal seen
        seen += capfd.readouterr().out
        return text in seen

    # Sent with the worker's next heartbeat, while the task still waits.
    wait_until(lambda: printed("(gpu-a) started, waiting for the go\n"), what="the first line")
    assert not future.done() and "done" not in seen
    open(gate, "w").close()
    future.result()
    wait_until(lambda: printed("(gpu-a) done\n"), what="the last line")
    assert seen.count("started, waiting") == 1


def test_task_output_can_be_turned_off(client: Client, capfd: Any, tmp_path: Any) -> None:
    with config.set({"client.forward-output": False}):
        client.submit(emit, "quiet-please").result()
        # The scheduler sends a run's output as it hears of the run's end, before its
        # later answers on the same connection: once it answers that nothing runs, the
        # output has reached this client (and been dropped).
        wait_until(
            lambda: not client.scheduler_info()["tasks"].get("processing"),
            what="the scheduler to hear the run ended",
        )
    client.submit(emit, "loud-again").result()
    seen = ""

    def printed() -> bool:
        nonlocal seen
        seen += capfd.readouterr().out
        return "loud-again" in seen

    wait_until(printed, what="the second task's output")
    assert "quiet-please" not in seen


def test_logs_of_the_scheduler_and_each_worker(client: Client) -> None:
    scheduler = client.get_scheduler_logs()
    assert any("worker gpu-a joined" in line for line in scheduler)
    assert client.get_scheduler_logs(1) == scheduler[-1:] or len(scheduler) == 0
    workers = client.get_worker_logs()
    assert set(workers) == {"gpu-a", "cpu"}
    assert any("connected to" in line for line in workers["gpu-a"])
    assert client.get_worker_logs(0) == {"gpu-a": [], "cpu": []}
    for bad in (-1, 2.5, "10"):
        with pytest.raises(ValueError, match="whole number >= 0"):
            client.get_scheduler_logs(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="whole number >= 0"):
            client.get_worker_logs(bad)  # type: ignore[arg-type]
    assert client.get_scheduler_logs(1)  # the connection is still fine


def test_reprs_name_workers_resources_and_the_dashboard(
    cluster: LocalCluster, client: Client
) -> None:
    html = client._repr_html_()
    assert "gpu-a" in html and "GPU=2" in html and "/dashboard" in html
    assert "gpu-a" in cluster._repr_html_() and "/dashboard" in cluster._repr_html_()
    assert f":{cluster.http_port}/dashboard" in repr(cluster) and cluster.token not in repr(cluster)


def test_no_dashboard_means_no_dashboard_link() -> None:
    with LocalCluster(n_workers=1, dashboard_address=None) as plain, Client(plain) as client:
        assert client.dashboard_link is None
        assert plain.dashboard_link == ""


def test_metrics_need_the_token(cluster: LocalCluster) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base(cluster)}/metrics", timeout=10)
    assert refused.value.code == 401
