"""What every cluster answers (apportion/cluster_base.py), checked the same way for each:
``check_cluster_interface(cluster, scale_to)`` on a running cluster of one worker or more.

LocalCluster runs it in tests/integration/test_first_contact.py; a Kubernetes test can run
it on a KubeCluster (``scale_to`` a size its group may take)."""

from __future__ import annotations

from apportion.client import Client
from apportion.cluster_base import Cluster, WorkerView


def check_cluster_interface(cluster: Cluster, scale_to: int) -> None:
    assert isinstance(cluster, Cluster)
    address = cluster.scheduler_address
    assert address.startswith(("tcp://", "tls://"))
    link = cluster.dashboard_link
    assert isinstance(link, str) and "/dashboard" in link
    assert cluster.token is None or "token=" in link
    info = cluster.scheduler_info
    assert info["workers"], info
    workers = cluster.scheduler.workers
    assert all(isinstance(w, WorkerView) and w.nthreads >= 1 for w in workers.values())
    text = repr(cluster)
    assert text.startswith(type(cluster).__name__) and f"workers={len(workers)}" in text
    assert "threads=" in text and "memory=" in text
    assert cluster.token is None or cluster.token not in text
    assert "threads" in cluster._repr_html_()
    logs = cluster.get_logs()
    assert logs and all(isinstance(lines, str) for lines in logs.values())
    cluster.scale(scale_to)
    assert len(cluster.scheduler.workers) == scale_to
    with Client(cluster) as client:
        assert client.submit(sum, [1, 2]).result(timeout=60) == 3
