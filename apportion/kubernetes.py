"""KubeCluster: a ResourceCluster on Kubernetes, from Python.

>>> cluster = KubeCluster("pipeline", worker_groups=[
...     {"name": "gpu", "replicas": 2, "resources": {"GPU": 2}},
...     {"name": "highmem", "replicas": 1, "resources": {"MEMORY": 100e9}}])
>>> client = Client(cluster)
>>> cluster.scale(3, group="gpu")
>>> cluster.close()   # deletes the ResourceCluster and everything it owns

Needs the operator running in the cluster (``helm install apportion charts/apportion``)
and the ``kubernetes`` extra (``pip install 'apportion[kubernetes]'``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from base64 import b64decode
from collections.abc import Callable, Iterator
from typing import Any

from apportion import config
from apportion.cluster_base import Cluster
from apportion.port_forward import Forwarder, PortForwardError, cluster_ports, forward_cluster
from apportion.protocol.comm import parse_address

GROUP, VERSION, PLURAL = "apportion.dev", "v1alpha1", "resourceclusters"


class KubeClusterError(RuntimeError):
    """The Kubernetes API refused what KubeCluster asked, said plainly (no header dumps)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _api_message(exc: Any) -> str:
    """The API server's own sentence from an ApiException's JSON body."""
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(getattr(exc, "reason", exc))


@contextlib.contextmanager
def _explained(what: str, name: str, namespace: str) -> Iterator[None]:
    """Turn the kubernetes client's ApiException into a KubeClusterError naming the cause
    and what to do."""
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as exc:
        message = _api_message(exc)
        where = f"ResourceCluster {namespace}/{name}"
        if exc.status == 409 and what == "create":
            hint = (
                f"{where} already exists: attach to it with "
                f"KubeCluster.from_name({name!r}, {namespace!r})"
            )
        elif exc.status == 404 and "the server could not find the requested resource" in message:
            hint = (
                "the ResourceCluster CRD is not installed in this Kubernetes cluster: "
                "helm install apportion charts/apportion"
            )
        elif exc.status == 404:
            hint = f"{where} does not exist ({message})"
        elif exc.status == 403:
            hint = f"not allowed to {what} {where}: {message}"
        else:
            hint = f"cannot {what} {where}: {message}"
        raise KubeClusterError(hint, exc.status) from None


def _apis(kubeconfig: str | None) -> tuple[Any, Any]:
    try:
        from kubernetes import client, config
    except ImportError:
        raise ImportError("KubeCluster needs: pip install 'apportion[kubernetes]'") from None
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    return client.CustomObjectsApi(), client.CoreV1Api()


class KubeCluster(Cluster):
    """Create (or attach to) a ResourceCluster and wait until its workers are connected.
    Answers what every cluster does (apportion/cluster_base.py), sizing through the
    operator: ``scale`` and ``adapt`` take the worker group (``group=``)."""

    def __init__(
        self,
        name: str,
        namespace: str = "default",
        worker_groups: list[dict[str, Any]] | None = None,
        image: str | None = None,
        resource_map: dict[str, str] | None = None,
        scheduler: dict[str, Any] | None = None,
        timeout: float = 300.0,
        kubeconfig: str | None = None,
        create: bool = True,
        tls: bool | str = False,
        port_forward: bool = False,
        tenants: list[dict[str, Any]] | None = None,
    ) -> None:
        """``tls``: True for mutual TLS with a certificate the operator makes, or the name
        of a Secret of yours (``ca.crt``, ``tls.crt``, ``tls.key``, e.g. cert-manager's).
        This process's clients then use the cluster's certificate (``comm.tls.*``).
        ``tenants``: teams sharing the cluster, as ``spec.tenants`` (docs/sharing.md)."""
        self.name = name
        self.namespace = namespace
        self.timeout = timeout
        # The comm.tls.* values before this cluster's, restored by close(); its files.
        self._tls_before: dict[str, Any] | None = None
        self._tls_folder = ""
        self._custom, self._core = _apis(kubeconfig)
        if create:
            spec: dict[str, Any] = {"workerGroups": [dict(g) for g in worker_groups or []]}
            if image:
                spec["image"] = image
            if resource_map:
                spec["resourceMap"] = resource_map
            if scheduler:
                spec["scheduler"] = scheduler
            if tenants:
                spec["tenants"] = tenants
            if tls:
                spec["tls"] = {"enabled": True}
                if isinstance(tls, str):
                    spec["tls"]["secretName"] = tls
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ResourceCluster",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            }
            with _explained("create", name, namespace):
                self._custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, body
                )
        self._address: str | None = None
        # The scheduler's ports on 127.0.0.1, through the Kubernetes API (port_forward.py).
        self._forwarded: dict[str, Forwarder] = {}
        self._scheme = "tcp"  # the scheduler's, also through a forwarded port
        try:
            self._wait(self._all_connected, "all workers connected")
            self.token = self._read_token()
            if str(self.status.get("schedulerAddress", "")).startswith("tls://"):
                self._scheme = "tls"
                self._use_tls()
            if port_forward:
                self.forward_ports()
                print(f"{self!r}: dashboard at {self.dashboard_link}")
        except BaseException:
            # A cluster this call created and could not start (an invalid spec, a timeout,
            # Ctrl-C) is deleted again, so that the same call can simply be made again.
            if create:
                with contextlib.suppress(Exception):  # the cause matters more than this
                    self.close()
            raise

    def forward_ports(self, local_ports: dict[str, int] | None = None) -> None:
        """Reach the scheduler (``"scheduler"``) and its dashboard (``"dashboard"``) from
        this machine on 127.0.0.1 (``local_ports``: the port for each; any free one)."""
        self._forwarded = forward_cluster(self._core, self.resource(), local_ports)

    @classmethod
    def from_name(cls, name: str, namespace: str = "default", **kwargs: Any) -> KubeCluster:
        """Attach to an existing ResourceCluster (created by kubectl, helm or another process)."""
        return cls(name, namespace, create=False, **kwargs)

    # ----------------------------------------------------------------- state
    def resource(self) -> dict[str, Any]:
        with _explained("read", self.name, self.namespace):
            found: dict[str, Any] = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
        return found

    @property
    def scheduler_address(self) -> str:
        """Where a Client connects: the Service name in-cluster; from outside, the IP of
        the scheduler pod serving now (looked up on each read: a restarted scheduler pod
        has a new IP, and the old one may still answer while it shuts down); with
        ``port_forward=True``, a port of this machine."""
        forwarded = self._forwarded.get("scheduler")
        self._address = (
            f"{self._scheme}://{forwarded.address}" if forwarded else self._reachable_address()
        )
        return self._address

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.resource().get("status") or {})

    def _all_connected(self) -> bool:
        found = self.resource()
        status = found.get("status") or {}
        if status.get("observedGeneration") != found["metadata"].get("generation"):
            return False
        valid: dict[str, Any] = next(
            (c for c in status.get("conditions", []) if c.get("type") == "Valid"), {}
        )
        if valid.get("status") == "False":
            raise ValueError(f"ResourceCluster {self.name} is invalid: {valid.get('message')}")
        groups = status.get("workerGroups") or []
        # Autoscaled groups (they report maxReplicas) come and go with the work: "Scaling"
        # is a settled cluster for them, and only fixed-size groups must be complete.
        return status.get("phase") in ("Running", "Scaling") and all(
            g["connectedWorkers"] == g["desiredReplicas"] == g["currentReplicas"]
            for g in groups
            if "maxReplicas" not in g
        )

    def _wait(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        delay = 0.2
        while not condition():
            if time.monotonic() > deadline:
                status = self.status
                raise TimeoutError(
                    f"ResourceCluster {self.namespace}/{self.name}: no '{what}' after "
                    f"{self.timeout:g}s (phase {status.get('phase')}, workers "
                    f"{status.get('workers')}, conditions {status.get('conditions')})"
                )
            time.sleep(delay)  # polling the API server, backing off
            delay = min(delay * 1.5, 2.0)

    def _read_token(self) -> str | None:
        from kubernetes.client.exceptions import ApiException

        try:
            secret = self._core.read_namespaced_secret(f"{self.name}-token", self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None  # auth disabled for this cluster
            raise KubeClusterError(
                f"cannot read the token Secret {self.namespace}/{self.name}-token: "
                f"{_api_message(exc)}",
                exc.status,
            ) from None
        return b64decode(secret.data["token"]).decode()

    def _use_tls(self) -> None:
        """Write the cluster's certificate where only this user can read it and point this
        process's comm.tls.* settings at it (undone by close())."""
        from kubernetes.client.exceptions import ApiException

        tls = self.resource()["spec"].get("tls") or {}
        name = tls.get("secretName") or f"{self.name}-tls"
        try:
            secret = self._core.read_namespaced_secret(name, self.namespace)
        except ApiException as exc:
            raise KubeClusterError(
                f"cannot read the TLS Secret {self.namespace}/{name} of {self.name}: "
                f"{_api_message(exc)}",
                exc.status,
            ) from None
        folder = tempfile.mkdtemp(prefix=f"apportion-tls-{self.name}-")  # mode 0700
        paths = {}
        for key in ("ca.crt", "tls.crt", "tls.key"):
            paths[key] = os.path.join(folder, key)
            with open(paths[key], "wb") as out:
                out.write(b64decode((secret.data or {}).get(key) or ""))
        self._tls_folder = folder
        settings = {
            "comm.tls.ca-file": paths["ca.crt"],
            "comm.tls.cert-file": paths["tls.crt"],
            "comm.tls.key-file": paths["tls.key"],
            # From outside the scheduler is reached by its pod's IP, which the certificate
            # does not name; the cluster's CA is checked all the same.
            "comm.tls.check-hostname": bool(os.environ.get("KUBERNETES_SERVICE_HOST")),
        }
        self._tls_before = {key: config.get(key, None) for key in settings}
        config.set(settings)

    def _reachable_address(self) -> str:
        """The Service name inside the cluster; from outside, the scheduler pod's IP."""
        service_address = str(self.status["schedulerAddress"])
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return service_address
        _, port = parse_address(service_address)
        scheme = service_address.split("://", 1)[0]
        selector = f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=scheduler"
        with _explained("list the scheduler pods of", self.name, self.namespace):
            pods = self._core.list_namespaced_pod(self.namespace, label_selector=selector).items
        for pod in pods:
            ip = pod.status.pod_ip
            if ip and not pod.metadata.deletion_timestamp and _can_connect(ip, port):
                return f"{scheme}://{ip}:{port}"
        raise ConnectionError(
            f"the scheduler of {self.name} is not reachable from here (pod IPs do not route "
            f"to this machine): run the client inside the cluster, or forward the port with "
            f"'kubectl -n {self.namespace} port-forward svc/{self.name}-scheduler {port}' and "
            f"connect Client('tcp://127.0.0.1:{port}', token=...)"
        )

    # ----------------------------------------------------------------- scaling
    def scale(self, n: int, group: str | None = None) -> None:
        """Fix a worker group's size (autoscaling off) and wait until exactly that many
        workers are connected."""
        if n < 0:
            raise ValueError(f"replicas must be >= 0, got {n}")
        self._stop_adapting()  # an adapt() of the base's, never started here: a no-op
        group = self._patch_group(group, {"replicas": n})
        self._wait(self._all_connected, f"{n} workers in group {group}")

    def _scale_to(self, n: int) -> None:
        self.scale(n)

    def adapt(  # type: ignore[override]  # the operator adapts: no interval here
        self,
        minimum: int = 0,
        maximum: int = 1,
        group: str | None = None,
        idle_timeout: int | None = None,
    ) -> None:
        """Let the operator size a worker group between ``minimum`` and ``maximum`` from
        the tasks waiting for its resources, retiring workers idle for ``idle_timeout``
        seconds (the operator's default when None)."""
        if not 0 <= minimum <= maximum:
            raise ValueError(f"need 0 <= minimum <= maximum, got {minimum} and {maximum}")
        bounds: dict[str, int] = {"minReplicas": minimum, "maxReplicas": maximum}
        if idle_timeout is not None:
            bounds["idleTimeoutSeconds"] = idle_timeout
        self._patch_group(group, bounds)

    def _patch_group(self, group: str | None, sizing: dict[str, int]) -> str:
        """Replace a group's sizing fields (replicas, or the autoscaling bounds); returns
        the group's name."""
        found = self.resource()
        groups = found["spec"].get("workerGroups") or []
        names = [g["name"] for g in groups]
        if group is None:
            if len(names) != 1:
                raise ValueError(f"this cluster has groups {names}: say which with group=")
            group = names[0]
        if group not in names:
            raise ValueError(f"no worker group {group!r}; groups are {names}")
        chosen = groups[names.index(group)]
        for key in ("replicas", "minReplicas", "maxReplicas", "idleTimeoutSeconds"):
            chosen.pop(key, None)
        chosen.update(sizing)
        # A merge patch replaces the whole list; resourceVersion makes a concurrent edit fail.
        with _explained("change", self.name, self.namespace):
            self._patch(groups, found["metadata"]["resourceVersion"])
        return group

    def _patch(self, groups: list[dict[str, Any]], resource_version: str) -> None:
        self._custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            self.name,
            {"metadata": {"resourceVersion": resource_version}, "spec": {"workerGroups": groups}},
        )

    # ------------------------------------------------------------ observability
    def get_logs(self, tail_lines: int | None = None) -> dict[str, str]:
        """The log of each of this cluster's pods (scheduler and workers), by pod name,
        through the Kubernetes API (``tail_lines``: only the last lines of each)."""
        selector = f"app.kubernetes.io/instance={self.name}"
        pods = self._core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return {
            pod.metadata.name: self._core.read_namespaced_pod_log(
                pod.metadata.name, self.namespace, tail_lines=tail_lines
            )
            for pod in sorted(pods, key=lambda p: p.metadata.name)
        }

    def _http_port(self) -> int | None:
        """The scheduler's dashboard port, forwarded to this machine or in the cluster."""
        forwarded = self._forwarded.get("dashboard")
        port = forwarded.port if forwarded else cluster_ports(self.resource())["dashboard"]
        return int(port) if port else None

    # --------------------------------------------------------------- lifecycle
    def _shut_down(self) -> None:
        """Delete the ResourceCluster; Kubernetes removes everything it owns."""
        from kubernetes.client.exceptions import ApiException

        for forward in self._forwarded.values():
            forward.close()
        try:
            self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
        except ApiException as exc:
            if exc.status != 404:
                with _explained("delete", self.name, self.namespace):
                    raise
        finally:
            if self._tls_before is not None:
                config.set(self._tls_before)
                self._tls_before = None
                shutil.rmtree(self._tls_folder, ignore_errors=True)

    def __enter__(self) -> KubeCluster:
        return self

    def _address_for_repr(self) -> str:
        """The address last looked up (a repr makes no API calls for it)."""
        return self._address or f"{self.namespace}/{self.name}"


def _can_connect(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def serve_cluster(
    name: str, namespace: str, port: int, scheduler_port: int, kubeconfig: str | None
) -> int:
    """``apportion dashboard NAME``: forward until interrupted; the exit status."""
    try:
        cluster = KubeCluster.from_name(name, namespace, kubeconfig=kubeconfig, timeout=60)
        cluster.forward_ports({"dashboard": port, "scheduler": scheduler_port})
    except (PortForwardError, ValueError, TimeoutError, RuntimeError) as exc:
        print(f"apportion dashboard: {exc}", file=sys.stderr)
        return 1
    print(f"dashboard: {cluster.dashboard_link}")
    print(f"scheduler: {cluster.scheduler_address} (Client(..., token=...) from this machine)")
    print("forwarding through the Kubernetes API; Ctrl-C to stop", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    return 0
