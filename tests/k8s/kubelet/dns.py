"""Service names for pods without a cluster DNS: each pod sees its own /etc/hosts.

Service ClusterIPs do not route here (no kube-proxy), so a Service name resolves straight to
one ready backing pod's IP; the client must then connect to the *target* port, which means
Services only work where port == targetPort. Backing pods are found from the Service's
selector and the pods' Ready condition (Services without a selector are not supported).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

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


def hosts_file(
    pod: Obj,
    pod_ip: str,
    services: Iterable[Obj],
    pods: Iterable[Obj],
    api_ip: str | None = None,
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
    pods = sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    for svc in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
        svc_ns, svc_name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        selector = svc.get("spec", {}).get("selector")
        if not selector:
            continue
        include_unready = svc["spec"].get("publishNotReadyAddresses", False)
        backing = [
            p
            for p in pods
            if p["metadata"]["namespace"] == svc_ns
            and _selects(selector, p)
            and (_ready(p) or (include_unready and p.get("status", {}).get("podIP")))
        ]
        if not backing:
            continue
        names = service_names(svc_name, svc_ns, svc_ns == namespace)
        lines.append(f"{backing[0]['status']['podIP']}\t{' '.join(names)}")
        # Headless-Service pod names (<hostname>.<subdomain>.<ns>.svc...), as for StatefulSets.
        for p in backing:
            if p["spec"].get("subdomain") == svc_name and p["spec"].get("hostname"):
                fqdn = f"{p['spec']['hostname']}.{svc_name}.{svc_ns}.svc.{CLUSTER_DOMAIN}"
                lines.append(f"{p['status']['podIP']}\t{fqdn}")
    return "\n".join(lines) + "\n"
