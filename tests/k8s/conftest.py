"""Pytest fixtures for the local Kubernetes control plane.

`k8s_cluster` (session): a running Cluster (see controlplane.py): .kubeconfig, .server,
.pods ("containers" or "processes", from APPORTION_K8S_PODS), .image (what pods should run),
.node_names, .kubectl(...), .helm(...), .client (REST), .pod_node(name, ns),
.pod_log_path(name, ns) / .pod_log(name, ns), .wait_pod_phase(name, phases, ns), .env().
`k8s_namespace` (function): a fresh namespace, ready for pods, deleted afterwards.

Set APPORTION_SKIP_K8S=1 to skip every `k8s` test; without it, missing binaries (or, for
pods in containers, a missing image) fail the tests with the command that builds them.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

import pytest

from . import paths
from .controlplane import Cluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "k8s: needs the local Kubernetes control plane (tests/k8s)")


def _skip_k8s() -> bool:
    return os.environ.get("APPORTION_SKIP_K8S", "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _skip_k8s():
        return
    skip = pytest.mark.skip(reason="APPORTION_SKIP_K8S is set")
    for item in items:
        if "k8s" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if _skip_k8s():
        pytest.skip("APPORTION_SKIP_K8S is set")
    try:
        cluster = Cluster.start(tmp_path_factory.mktemp("k8s"))
    except (paths.BinariesMissing, paths.ImageMissing) as err:
        missing = str(err)
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def k8s_namespace(k8s_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:5]}"
    k8s_cluster.client.create("/api/v1/namespaces", {"metadata": {"name": name}})
    # The API server refuses pods until the namespace's default ServiceAccount exists.
    k8s_cluster.wait_for(
        lambda: k8s_cluster.client.get_or_none(
            f"/api/v1/namespaces/{name}/serviceaccounts/default"
        ),
        f"ServiceAccount {name}/default",
        timeout=60,
    )
    yield name
    k8s_cluster.client.delete(f"/api/v1/namespaces/{name}")
