"""Service names for pods without a cluster DNS: each pod sees its own /etc/hosts.

Service ClusterIPs do not route here (no kube-proxy), so a Service name resolves straight to
one ready backing pod's IP; the client must then connect to the *target* port, which means
Services only work where port == targetPort. Backing pods are found from the Service's
selector and the pods' Ready condition (Services without a selector are not supported).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

Obj = dict[str, Any]

CLUSTER_DOMAIN = "cluster.local"


def _ready(pod: Obj) -> bool:
    status = pod.get("status", {})
    if pod["metadata"].get("deletionTimestamp") or not status.get("podIP"):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def _selects(selector: dict[str, str], pod: Obj) -> bool:
    labels = pod["metadata"].get("labels", {})
    return all(labels.get(k) == v for k, v in selector.items())


def service_names(name: str, namespace: str, same_namespace: bool) -> list[str]:
    names = [
        f"{name}.{namespace}",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}",
    ]
    return [name, *names] if same_namespace else names


# The API server's in-cluster names (the `kubernetes` Service has no selector).
API_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
)


class ServiceEntry(NamedTuple):
    """A Service's addresses, the same for every pod (only the short name depends on it)."""

    namespace: str
    name: str
    ip: str  # the first ready backing pod's
    pod_lines: tuple[str, ...]  # headless-Service pod names


def service_entries(services: Iterable[Obj], pods: Iterable[Obj]) -> list[ServiceEntry]:
    """Every Service name that resolves, computed once for all the pods of the node (per pod
    it cost O(services x pods) for each pod: seconds per refresh at 200 pods)."""
    by_namespace: dict[str, list[Obj]] = {}
    for p in sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
        by_namespace.setdefault(p["metadata"]["namespace"], []).append(p)
    entries = []
    for svc in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
        svc_ns, svc_name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        selector = svc.get("spec", {}).get("selector")
        if not selector:
            continue
        include_unready = svc["spec"].get("publishNotReadyAddresses", False)
        backing = [
            p
            for p in by_namespace.get(svc_ns, ())
            if _selects(selector, p)
            and (_ready(p) or (include_unready and p.get("status", {}).get("podIP")))
        ]
        if not backing:
            continue
        # Headless-Service pod names (<hostname>.<subdomain>.<ns>.svc...), as for StatefulSets.
        pod_lines = tuple(
            f"{p['status']['podIP']}\t{p['spec']['hostname']}.{svc_name}.{svc_ns}.svc."
            f"{CLUSTER_DOMAIN}"
            for p in backing
            if p["spec"].get("subdomain") == svc_name and p["spec"].get("hostname")
        )
        entries.append(ServiceEntry(svc_ns, svc_name, backing[0]["status"]["podIP"], pod_lines))
    return entries


def render_hosts(
    pod: Obj, pod_ip: str, entries: Iterable[ServiceEntry], api_ip: str | None = None
) -> str:
    """The /etc/hosts content for pod: localhost, its own name, the API server's names
    (at api_ip, when given) and every Service name."""
    meta = pod["metadata"]
    namespace = meta["namespace"]
    hostname = pod["spec"].get("hostname") or meta["name"]
    lines = [
        "# Written by the apportion process kubelet; rewritten as Services change.",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{pod_ip}\t{hostname}",
    ]
    if api_ip:
        lines.append(f"{api_ip}\t{' '.join(API_NAMES)}")
    for entry in entries:
        names = service_names(entry.name, entry.namespace, entry.namespace == namespace)
        lines.append(f"{entry.ip}\t{' '.join(names)}")
        lines.extend(entry.pod_lines)
    return "\n".join(lines) + "\n"


def hosts_file(
    pod: Obj,
    pod_ip: str,
    services: Iterable[Obj],
    pods: Iterable[Obj],
    api_ip: str | None = None,
) -> str:
    """The /etc/hosts content for pod, from the Services and pods of the cluster."""
    return render_hosts(pod, pod_ip, service_entries(services, pods), api_ip)
