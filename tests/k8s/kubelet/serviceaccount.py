"""Service-account credentials for pods, as the real kubelet projects them.

For a pod that automounts its token, the kubelet asks the TokenRequest API for a token of the
pod's ServiceAccount bound to the pod object, writes `token`, `ca.crt` and `namespace` into
a per-pod folder, and each container process sees that folder read-only at
/var/run/secrets/kubernetes.io/serviceaccount (a bind mount in the pod's private mount
namespace; see runtime.py). The token is renewed at 80% of its lifetime, like the
kubelet does, by replacing the file atomically inside the mounted folder.

The API server itself is reached through KUBERNETES_SERVICE_HOST/PORT (its real address) or,
where the kubelet could bind port 443 on a loopback address of its own, through
https://kubernetes.default.svc, which each pod's /etc/hosts maps to a TCP forwarder
(ApiForwarder) in front of the API server.
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ..api import ApiError, Client

log = logging.getLogger("kubelet.serviceaccount")

Obj = dict[str, Any]

MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
# What the kubelet asks for (the API server may extend it for bound tokens); renewed at 80%.
TOKEN_TTL_S = 3600
REFRESH_FRACTION = 0.8
RETRY_S = 5.0
# The ServiceAccount admission plugin's name for the projected token volume it injects.
INJECTED_VOLUME_PREFIX = "kube-api-access-"


def service_account_name(pod: Obj) -> str:
    spec = pod["spec"]
    return spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"


def _own_mount(mount: Obj) -> bool:
    """Whether a container's volume mount at MOUNT_PATH is the injected token volume, which
    this module provides, rather than something the spec mounts there itself."""
    return os.path.normpath(mount.get("mountPath", "")) == MOUNT_PATH and not mount.get(
        "name", ""
    ).startswith(INJECTED_VOLUME_PREFIX)


def wants_token(pod: Obj, client: Client) -> bool:
    """automountServiceAccountToken from the pod spec, else from the ServiceAccount, default
    true; and no container mounts a volume of its own at MOUNT_PATH."""
    spec = pod["spec"]
    automount = spec.get("automountServiceAccountToken")
    if automount is None:
        namespace = pod["metadata"]["namespace"]
        account = client.get_or_none(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account_name(pod)}"
        )
        automount = (account or {}).get("automountServiceAccountToken")
    if automount is False:
        return False
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    return not any(_own_mount(m) for c in containers for m in c.get("volumeMounts", []))


def prepare_mount_point() -> bool:
    """Creates MOUNT_PATH on the host when missing (it stays empty: only pods' private mount
    namespaces cover it). False where it cannot exist (not root and absent)."""
    try:
        Path(MOUNT_PATH).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log.warning("cannot create %s (%s): pods get no service-account token", MOUNT_PATH, err)
        return False
    return True


class TokenVolume:
    """One pod's service-account folder: token (renewed), ca.crt and namespace."""

    def __init__(self, client: Client, pod: Obj, folder: Path, ca: Path) -> None:
        self.client = client
        meta = pod["metadata"]
        self.namespace: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.pod_uid: str = meta["uid"]
        self.account = service_account_name(pod)
        self.folder = folder
        self.ca = ca
        self.refresh_at: float | None = None  # monotonic; None until the first token
        self.retry_at = 0.0

    @property
    def ready(self) -> bool:
        return self.refresh_at is not None

    def _request_token(self) -> tuple[str, float]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": TOKEN_TTL_S,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": self.pod_name,
                    "uid": self.pod_uid,
                },
            },
        }
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{self.account}/token"
        status = self.client.create(path, body)["status"]
        expires = datetime.datetime.fromisoformat(
            status["expirationTimestamp"].replace("Z", "+00:00")
        )
        lifetime = (expires - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
        return status["token"], max(lifetime, 60.0)

    def _write(self, name: str, content: str) -> None:
        """Atomically, within the folder: the mounted directory sees the rename."""
        tmp = self.folder / f".{name}.tmp"
        tmp.write_text(content)
        tmp.chmod(0o644)
        tmp.replace(self.folder / name)

    def ensure(self) -> bool:
        """Writes the folder with a fresh token when due (first time or at 80% of the
        token's life). False while no token could be had yet (the pod waits)."""
        now = time.monotonic()
        if (self.refresh_at is not None and now < self.refresh_at) or now < self.retry_at:
            return self.ready
        try:
            token, lifetime = self._request_token()
        except (ApiError, OSError, KeyError, ValueError) as err:
            log.warning(
                "pod %s/%s: token for ServiceAccount %s: %s",
                self.namespace,
                self.pod_name,
                self.account,
                err,
            )
            self.retry_at = now + RETRY_S
            return self.ready
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o755)
        if self.refresh_at is None:
            self._write("ca.crt", self.ca.read_text())
            self._write("namespace", self.namespace)
        self._write("token", token)
        self.refresh_at = now + REFRESH_FRACTION * lifetime
        log.info(
            "pod %s/%s: token for ServiceAccount %s written (valid %d s)",
            self.namespace,
            self.pod_name,
            self.account,
            lifetime,
        )
        return True

    def error(self) -> str:
        return f"no token for ServiceAccount {self.namespace}/{self.account} yet"

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class ApiForwarder:
    """A TCP forwarder listen_ip:443 -> 127.0.0.1:api_port, so that
    https://kubernetes.default.svc (port 443) reaches the API server. TLS passes through;
    the API server's certificate is valid for the kubernetes.* names."""

    def __init__(self, listen_ip: str, api_port: int, port: int = 443) -> None:
        self.listen_ip = listen_ip
        self.api_port = api_port
        self.port = port
        self.sock: socket.socket | None = None

    def start(self) -> bool:
        try:
            sock = socket.create_server((self.listen_ip, self.port), backlog=128)
        except OSError as err:
            log.warning(
                "cannot listen on %s:%d (%s): https://kubernetes.default.svc will not reach "
                "the API server; pods must use KUBERNETES_SERVICE_HOST/PORT",
                self.listen_ip,
                self.port,
                err,
            )
            return False
        self.sock = sock
        threading.Thread(target=self._accept, name="api-forwarder", daemon=True).start()
        return True

    def _accept(self) -> None:
        assert self.sock is not None
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.api_port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        client.close()
        upstream.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copies source to sink until EOF, then half-closes sink; on an error both directions
    are shut down so that the other pump ends too."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
