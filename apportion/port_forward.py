"""Reach an in-cluster scheduler from this machine: a local port carried to its pod.

``KubeCluster(..., port_forward=True)`` and ``apportion dashboard NAME`` listen on
127.0.0.1; each connection accepted there is carried to the scheduler pod's port by a
stream of its own through the Kubernetes API (what ``kubectl port-forward`` does). The
``kubernetes`` library's port-forward is used rather than a ``kubectl port-forward``
child process: it needs no kubectl on the user's machine, it authenticates exactly as the
``KubeCluster`` does (the same kubeconfig argument, or in-cluster credentials), and there
is no second process to supervise. The scheduler pod is looked up for every connection,
so forwarding follows a scheduler pod that was replaced.

What is decided here is kept apart from the sockets: ``scheduler_pod`` picks the pod to
dial, ``Forwarder`` only accepts and relays bytes, and how a connection reaches the pod
(``Dial``) is a function the caller passes (``through_api``, by default).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any, Protocol

logger = logging.getLogger("apportion.port_forward")

BUFFER = 64 * 1024


class Stream(Protocol):
    """What a dial returns: a connected socket, or the kubernetes library's socket-like."""

    def sendall(self, data: bytes, /) -> Any: ...
    def recv(self, size: int, /) -> bytes: ...
    def close(self) -> None: ...


# Opens a new connection to the target port (called once per accepted connection).
Dial = Callable[[], Stream]


class PortForwardError(ConnectionError):
    """The scheduler pod could not be found or reached."""


def scheduler_pod(pods: list[Any], name: str) -> str:
    """The name of the scheduler pod to dial among ``pods`` (the cluster's scheduler
    pods): a running one not being deleted."""
    for pod in pods:
        if pod.metadata.deletion_timestamp is None and pod.status.phase == "Running":
            return str(pod.metadata.name)
    phases = [f"{p.metadata.name}: {p.status.phase}" for p in pods] or ["none"]
    raise PortForwardError(
        f"no running scheduler pod for cluster {name!r} (scheduler pods: {', '.join(phases)}); "
        "check 'kubectl get resourcecluster' and the operator's events"
    )


def current_scheduler_pod(core: Any, namespace: str, name: str) -> str:
    """The name of the scheduler pod of cluster ``name`` serving now."""
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=scheduler"
    return scheduler_pod(core.list_namespaced_pod(namespace, label_selector=selector).items, name)


def through_api(core: Any, namespace: str, name: str, port: int) -> Dial:
    """Dial ``port`` of the current scheduler pod of cluster ``name`` through the API."""
    from kubernetes.stream import portforward

    def dial() -> Stream:
        pod = current_scheduler_pod(core, namespace, name)
        forward = portforward(
            core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port)
        )
        stream: Stream = forward.socket(port)
        return stream

    return dial


class Forwarder:
    """Listen on ``host:local_port`` (0: any free port) and relay each connection to a
    stream from ``dial``, in both directions, until either side closes."""

    def __init__(self, dial: Dial, local_port: int = 0, host: str = "127.0.0.1") -> None:
        self._dial = dial
        try:
            self._listener = socket.create_server((host, local_port))
        except OSError as exc:
            raise PortForwardError(
                f"cannot listen on {host}:{local_port} ({exc.strerror}): choose another "
                "local port, or 0 for any free one"
            ) from None
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="port-forward", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                local, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(local,), daemon=True).start()

    def _serve(self, local: socket.socket) -> None:
        try:
            remote = self._dial()
        except Exception as exc:  # any failure to reach the pod ends this one connection
            logger.warning("port-forward: cannot reach the scheduler pod: %s", exc)
            local.close()
            return
        done = threading.Event()
        threading.Thread(target=_pipe, args=(remote, local, done), daemon=True).start()
        _pipe(local, remote, done)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pipe(source: Stream, sink: Stream, done: threading.Event) -> None:
    """Copy ``source`` to ``sink`` until one ends; then close both (the other direction's
    copy ends with them)."""
    try:
        while not done.is_set():
            data = source.recv(BUFFER)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        done.set()
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.close()


def cluster_ports(resource: dict[str, Any]) -> dict[str, int]:
    """The scheduler's ports of a ResourceCluster (its object, as the API returns it):
    ``{"scheduler": 8786, "dashboard": 8787}`` unless its spec says otherwise."""
    from apportion.protocol.comm import parse_address

    spec = (resource.get("spec") or {}).get("scheduler") or {}
    address = (resource.get("status") or {}).get("schedulerAddress")
    scheduler = parse_address(address)[1] if address else int(spec.get("port", 8786))
    return {"scheduler": scheduler, "dashboard": int(spec.get("httpPort", 8787))}


def forward_cluster(
    core: Any,
    resource: dict[str, Any],
    local_ports: dict[str, int] | None = None,
    dial: Callable[[Any, str, str, int], Dial] = through_api,
) -> dict[str, Forwarder]:
    """Forward the scheduler's ports of a ResourceCluster to 127.0.0.1, by role
    (``local_ports``: which local port each role takes; any free one otherwise)."""
    name, namespace = resource["metadata"]["name"], resource["metadata"]["namespace"]
    forwards: dict[str, Forwarder] = {}
    try:
        for role, port in cluster_ports(resource).items():
            local = (local_ports or {}).get(role, 0)
            forwards[role] = Forwarder(dial(core, namespace, name, port), local)
    except BaseException:
        for forward in forwards.values():
            forward.close()
        raise
    return forwards
