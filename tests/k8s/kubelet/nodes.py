"""The fake nodes: their shape, registration, and the heartbeats that keep them Ready."""

from __future__ import annotations

import logging
import platform
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..api import ApiError, Client

log = logging.getLogger("kubelet.nodes")

LEASE_NS = "kube-node-lease"
LEASE_SECONDS = 40
HEARTBEAT_S = 10.0
NODE_IP = "127.0.0.1"


@dataclass(frozen=True)
class NodeShape:
    capacity: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)


# Shaped like the seed's cluster: two machines with two GPUs each, one with 100 GB of RAM.
NODES: dict[str, NodeShape] = {
    "gpu-node-1": NodeShape(
        {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"},
        {"apportion.dev/node-type": "gpu", "nvidia.com/gpu.present": "true"},
    ),
    "gpu-node-2": NodeShape(
        {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"},
        {"apportion.dev/node-type": "gpu", "nvidia.com/gpu.present": "true"},
    ),
    "highmem-node": NodeShape(
        {"cpu": "16", "memory": "100Gi"},
        {"apportion.dev/node-type": "highmem"},
    ),
}


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _status(shape: NodeShape, kubelet_port: int, kube_version: str, since: str) -> dict:
    capacity = {"pods": "110", "ephemeral-storage": "100Gi", **shape.capacity}
    stamp = now()
    conditions = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ]
    return {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": "process kubelet",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": since,
            }
            for kind, status, reason in conditions
        ],
        "addresses": [{"type": "InternalIP", "address": NODE_IP}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "machineID": "apportion-test",
            "systemUUID": "apportion-test",
            "bootID": "apportion-test",
            "kernelVersion": platform.release(),
            "osImage": "apportion process kubelet",
            "containerRuntimeVersion": "process://1.0",
            "kubeletVersion": kube_version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


class NodeKeeper:
    """Registers the nodes, then renews their Leases and Ready condition every 10 s."""

    def __init__(self, client: Client, kubelet_port: int, kube_version: str) -> None:
        self.client = client
        self.port = kubelet_port
        self.version = kube_version
        self.stopping = threading.Event()
        self.since = now()

    def register(self) -> None:
        for name, shape in NODES.items():
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **shape.labels,
            }
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
            }
            try:
                self.client.create("/api/v1/nodes", node)
            except ApiError as err:
                if err.status != 409:
                    raise
            self._heartbeat(name, shape)
            log.info("registered node %s (%s)", name, shape.capacity)

    def _heartbeat(self, name: str, shape: NodeShape) -> None:
        status = _status(shape, self.port, self.version, self.since)
        self.client.strategic_patch(f"/api/v1/nodes/{name}/status", {"status": status})
        self._renew_lease(name)

    def _renew_lease(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases"
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": now_micro(),
        }
        try:
            self.client.merge_patch(f"{path}/{name}", {"spec": spec})
        except ApiError as err:
            if err.status != 404:
                raise
            lease = {"metadata": {"name": name, "namespace": LEASE_NS}, "spec": spec}
            self.client.create(path, lease)

    def run(self) -> None:
        """Heartbeat loop for a background thread; errors are logged and retried."""
        while not self.stopping.wait(HEARTBEAT_S):
            for name, shape in NODES.items():
                try:
                    self._heartbeat(name, shape)
                except Exception:
                    log.exception("heartbeat for %s failed", name)
