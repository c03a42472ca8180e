"""Tenants on real processes: clients belong to the tenant whose token they presented,
freed GPUs go to tenants by weight while both wait, a quota is never exceeded, a tenant
arriving late gets its share as soon as runs end, and tenants declared wrong stop the
scheduler with a clear error (workers declare GPU=... without devices)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from apportion import Client, LocalCluster, QuotaWarning, config
from apportion.protocol import connect
from tests.conftest import wait_until
from tests.integration.tasks import hold, peak_concurrency

GPU_WORKERS = [{"name": f"gpu-{i}", "nthreads": 1, "resources": {"GPU": 1}} for i in range(4)]
TOKENS = {"big": "token-of-big", "small": "token-of-small", "capped": "token-of-capped"}


def write_token(folder: Path, name: str, token: str) -> str:
    path = folder / f"{name}.token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    folder = tmp_path_factory.mktemp("tokens")
    files = {name: write_token(folder, name, token) for name, token in TOKENS.items()}
    tenants = {
        "big": {"token-file": files["big"], "weight": 3},
        "small": {"token-file": files["small"]},
        "capped": {"token-file": files["capped"], "quota": {"GPU": 2}},
    }
    with (
        config.set({"scheduler.tenants": tenants, "scheduler.validate": True}),
        LocalCluster(workers=GPU_WORKERS, http_port=0) as cluster,
    ):
        yield cluster


def tenant_client(cluster: LocalCluster, tenant: str) -> Client:
    return Client(cluster.scheduler_address, token=TOKENS[tenant])


@pytest.fixture
def clients(cluster: LocalCluster) -> Iterator[dict[str, Client]]:
    made = {name: tenant_client(cluster, name) for name in TOKENS}
    made["default"] = Client(cluster)
    yield made
    observer = made["default"]
    wait_until(
        lambda: not any(t["used"] for t in observer.scheduler_info()["tenants"].values()),
        what="every tenant's GPUs given back",
    )
    assert observer.check_invariants() == []
    for client in made.values():
        client.close()


def used_gpus(client: Client) -> dict[str, float]:
    tenants = client.scheduler_info()["tenants"]
    return {name: t["used"].get("GPU", 0) for name, t in tenants.items() if t["used"]}


def test_a_client_belongs_to_the_tenant_whose_token_it_presented(
    clients: dict[str, Client],
) -> None:
    assert {name: c.tenant for name, c in clients.items()} == {
        "big": "big",
        "small": "small",
        "capped": "capped",
        "default": "default",
    }
    info = clients["default"].scheduler_info()["tenants"]
    assert info["big"]["weight"] == 3 and info["capped"]["quota"] == {"GPU": 2}
    # A tenant's client fetches a large result straight from the worker holding it.
    big = clients["small"].submit(bytes, 2**21, resources={"GPU": 1})
    assert len(big.result(timeout=60)) == 2**21


def test_only_the_token_says_the_tenant_and_a_tenants_token_is_for_clients_only(
    cluster: LocalCluster,
) -> None:
    async def hello(role: str, token: str, **info: str) -> str:
        comm, welcome = await connect(cluster.scheduler_address, role, token, info=info)
        comm.close()
        return str(welcome.get("tenant"))

    # A client of the cluster's token claiming a tenant is still the default tenant.
    claimed = asyncio.run(hello("client", cluster.token, client_id="spoof", tenant="big"))
    assert claimed == "default"
    with pytest.raises(ConnectionRefusedError, match="authentication failed"):
        asyncio.run(hello("worker", TOKENS["big"], name="intruder"))


def test_freed_gpus_go_to_tenants_by_weight_while_both_wait(clients: dict[str, Client]) -> None:
    """big (weight 3) and small (weight 1), both backlogged on 4 GPUs: every GPU that frees
    goes to the tenant furthest below its weighted share, so they hold 3 and 1."""
    big = [clients["big"].submit(hold, 0.2, "big", resources={"GPU": 1}, pure=False)]
    wait_until(lambda: used_gpus(clients["default"]).get("big"), what="big running")
    big += [
        clients["big"].submit(hold, 0.2, "big", resources={"GPU": 1}, pure=False) for _ in range(30)
    ]
    small = [
        clients["small"].submit(hold, 0.2, "small", resources={"GPU": 1}, pure=False)
        for _ in range(15)
    ]
    samples = []
    while not all(f.done() for f in small):
        info = clients["default"].scheduler_info()["tenants"]
        if info["big"]["waiting"] and info["small"]["waiting"] and info["small"]["used"]:
            samples.append((info["big"]["used"].get("GPU", 0), info["small"]["used"]["GPU"]))
        time.sleep(0.05)  # sampling the shares, not synchronising
    records = clients["big"].gather(big) + clients["small"].gather(small)
    assert len(samples) >= 5, samples
    assert sum(s == (3, 1) for s in samples) >= 0.9 * len(samples), samples
    # GPU time while both waited: from small's first start to its last start.
    window = (
        min(r["start"] for r in records if r["tag"] == "small"),
        max(r["start"] for r in records if r["tag"] == "small"),
    )
    held = {"big": 0.0, "small": 0.0}
    for r in records:
        held[r["tag"]] += max(0.0, min(r["end"], window[1]) - max(r["start"], window[0]))
    assert held["big"] / sum(held.values()) == pytest.approx(0.75, abs=0.1), held


def test_a_tenant_arriving_late_gets_its_share_as_soon_as_a_run_ends(
    clients: dict[str, Client],
) -> None:
    big = [
        clients["big"].submit(hold, 0.3, "big", resources={"GPU": 1}, pure=False) for _ in range(20)
    ]
    wait_until(lambda: used_gpus(clients["default"]).get("big") == 4, what="big on every GPU")
    arrived = time.monotonic()
    late = clients["small"].submit(hold, 0.05, "small", resources={"GPU": 1}, pure=False)
    record = late.result(timeout=60)
    # The first of big's runs to end (each holds 0.3 s) hands its GPU to small.
    assert record["start"] - arrived < 0.3 + 1.0
    clients["big"].gather(big)


def test_a_quota_is_never_exceeded_even_with_idle_gpus_and_shows_everywhere(
    cluster: LocalCluster, clients: dict[str, Client]
) -> None:
    # The warning comes on the client's own thread, maybe after the scheduler already says
    # so to another client: waited for, not just looked for when the block ends.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        capped = [
            clients["capped"].submit(hold, 0.3, "capped", resources={"GPU": 1}, pure=False)
            for _ in range(8)
        ]
        wait_until(
            lambda: clients["default"].scheduler_info()["tenants"]["capped"]["over_quota"],
            what="capped's tasks waiting over quota",
        )
        wait_until(
            lambda: any(issubclass(w.category, QuotaWarning) for w in caught),
            what="the capped client's QuotaWarning",
        )
    (warned,) = [w for w in caught if issubclass(w.category, QuotaWarning)]
    assert "tenant 'capped' wait: it holds its quota (GPU=2)" in str(warned.message)
    samples = scrape(cluster, "/metrics")
    assert "apportion_tenant_resource_quota" in samples and "apportion_tenant_share" in samples
    assert samples["apportion_tenant_resource_used"][("GPU", "capped")] == 2
    assert samples["apportion_tenant_waiting_tasks"][("over-quota", "capped")] > 0
    page = scrape(cluster, "/dashboard")
    assert "<h2>Tenants</h2>" in page and "capped" in page and "over-quota" in page
    records = clients["capped"].gather(capped)
    assert peak_concurrency(records, "tag") == {"capped": 2}  # 1 GPU each, 4 GPUs free
    assert clients["default"].check_invariants() == []  # also checked after every batch


def scrape(cluster: LocalCluster, path: str) -> Any:
    """The page at ``path`` (text); for /metrics, each family's samples by label values
    (in the order of the labels' names)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.http_port}{path}",
        headers={"Authorization": f"Bearer {cluster.token}"},
    )
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    if path != "/metrics":
        return text
    return {
        family.name: {
            tuple(v for _, v in sorted(s.labels.items())): s.value for s in family.samples
        }
        for family in text_string_to_metric_families(text)
    }


def test_tenants_declared_wrong_stop_the_scheduler_naming_the_setting(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "APPORTION_TOKEN": "the-cluster-token",
        "APPORTION_SCHEDULER__TENANTS__team__TOKEN_FILE": str(tmp_path / "missing"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "apportion", "scheduler", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "scheduler.tenants.team.token-file" in done.stderr
    assert "cannot read token file" in done.stderr
