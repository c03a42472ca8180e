"""The pods' /etc/hosts that the test kubelet writes (pure; no cluster needed)."""

from __future__ import annotations

from typing import Any

from .kubelet.dns import hosts_file, render_hosts, service_entries

Obj = dict[str, Any]


def pod(namespace: str, name: str, labels: dict[str, str], ip: str | None, ready: bool) -> Obj:
    return {
        "metadata": {"namespace": namespace, "name": name, "labels": labels},
        "spec": {},
        "status": {
            **({"podIP": ip} if ip else {}),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def service(namespace: str, name: str, selector: dict[str, str], **spec: Any) -> Obj:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"selector": selector, **spec},
    }


def test_a_service_name_resolves_to_its_first_ready_pod() -> None:
    pods = [
        pod("ml", "s-0", {"app": "s"}, "127.1.0.1", ready=False),
        pod("ml", "s-1", {"app": "s"}, "127.1.0.2", ready=True),
        pod("ml", "s-2", {"app": "s"}, "127.1.0.3", ready=True),
        pod("other", "x", {"app": "s"}, "127.1.0.4", ready=True),
    ]
    services = [service("ml", "sched", {"app": "s"}), service("ml", "none", {"app": "n"})]
    me = pod("ml", "w", {}, "127.1.0.9", ready=True)
    lines = hosts_file(me, "127.1.0.9", services, pods, "127.0.0.2").splitlines()
    assert "127.1.0.9\tw" in lines
    assert "127.1.0.2\tsched sched.ml sched.ml.svc sched.ml.svc.cluster.local" in lines
    assert not any("none" in line for line in lines), "no ready backing pod: no name"
    elsewhere = pod("other", "c", {}, "127.1.0.8", ready=True)
    lines = hosts_file(elsewhere, "127.1.0.8", services, pods).splitlines()
    assert "127.1.0.2\tsched.ml sched.ml.svc sched.ml.svc.cluster.local" in lines  # no short name


def test_headless_and_not_ready_addresses() -> None:
    backing = pod("ml", "db-0", {"app": "db"}, "127.1.0.5", ready=False)
    backing["spec"] = {"hostname": "db-0", "subdomain": "db"}
    services = [service("ml", "db", {"app": "db"}, publishNotReadyAddresses=True)]
    text = hosts_file(pod("ml", "w", {}, "127.1.0.9", True), "127.1.0.9", services, [backing])
    assert "127.1.0.5\tdb db.ml db.ml.svc db.ml.svc.cluster.local" in text
    assert "127.1.0.5\tdb-0.db.ml.svc.cluster.local" in text


def test_entries_computed_once_serve_every_pod() -> None:
    pods = [
        pod("ns", f"c{c}-{role}-{i}", {"c": str(c), "r": role}, f"127.1.{c}.{i}", ready=True)
        for c in range(50)
        for role, n in (("s", 1), ("w", 3))
        for i in range(n)
    ]
    services = [service("ns", f"c{c}-scheduler", {"c": str(c), "r": "s"}) for c in range(50)]
    entries = service_entries(services, pods)
    files = [render_hosts(p, p["status"]["podIP"], entries) for p in pods]
    assert len(entries) == 50
    assert all("127.1.49.0\tc49-scheduler" in text for text in files)
    assert files == [hosts_file(p, p["status"]["podIP"], services, pods) for p in pods]
