"""Starts and stops the local control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and the test kubelet, all on 127.0.0.1 with free ports. The kubelet runs pods
as podman containers of their images (`image` is the one built from these sources) or, with
APPORTION_K8S_PODS=processes, as local processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from . import certs, paths, procs
from .api import Client, Credentials
from .kubelet.nodes import NODES
from .kubelet.runtime import remove_containers

STARTUP_TIMEOUT = 180.0

T = TypeVar("T")
Obj = dict[str, Any]
REPO_ROOT = paths.HERE.parent.parent


@dataclass
class Cluster:
    """A running cluster. Use start() / stop(), or `with Cluster.start() as cluster:`."""

    workdir: Path
    bin_dir: Path
    kubeconfig: Path
    server: str
    client: Client
    pods: str = "containers"  # how the kubelet runs pods: "containers" or "processes"
    image: str = "apportion:0.1.0"  # the apportion image pods should name
    node_names: tuple[str, ...] = tuple(NODES)
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _own_workdir: bool = False

    # ----- start / stop -------------------------------------------------------------------

    @classmethod
    def start(cls, workdir: Path | None = None, pods: str | None = None) -> Cluster:
        """pods: "containers" or "processes" (default: $APPORTION_K8S_PODS, else containers).
        Raises paths.BinariesMissing / paths.ImageMissing naming what to build."""
        bin_dir = paths.require_binaries()
        pods = pods or paths.pods_mode()
        # In processes mode the image is never run: any name does.
        image = paths.image_ref() if pods == "containers" else "apportion:0.1.0"
        own = workdir is None
        workdir = Path(tempfile.mkdtemp(prefix="apportion-k8s-")) if workdir is None else workdir
        workdir.mkdir(parents=True, exist_ok=True)
        pki = certs.make_pki(workdir / "pki")
        api_port = procs.free_port()
        server = f"https://127.0.0.1:{api_port}"
        kubeconfig = certs.write_kubeconfig(
            workdir / "admin.kubeconfig", server, pki.ca.cert, pki.admin, "admin"
        )
        cluster = cls(
            workdir=workdir,
            bin_dir=bin_dir,
            kubeconfig=kubeconfig,
            server=server,
            client=Client(Credentials.from_kubeconfig(kubeconfig)),
            pods=pods,
            image=image,
            _own_workdir=own,
        )
        try:
            cluster._boot(pki, api_port)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _boot(self, pki: certs.ClusterPki, api_port: int) -> None:
        etcd_url = self._start_etcd()
        self._start_apiserver(pki, api_port, etcd_url)
        self._start_controllers(pki)
        self._start_kubelet(pki)
        self.wait_nodes_ready()
        # Pods are refused until the namespace's `default` ServiceAccount exists.
        self.wait_for(
            lambda: self.client.get_or_none("/api/v1/namespaces/default/serviceaccounts/default"),
            "the default ServiceAccount",
        )

    def _spawn(self, name: str, argv: list[str | os.PathLike[str]]) -> None:
        # From the repository root, so `python -m tests.k8s.kubelet` imports wherever
        # pytest was started.
        proc = procs.start(argv, self.log_dir / f"{name}.log", cwd=REPO_ROOT)
        self._procs.append((name, proc))
        (self.workdir / "pids").mkdir(exist_ok=True)
        (self.workdir / "pids" / name).write_text(str(proc.pid))

    def _check_alive(self) -> None:
        for name, proc in self._procs:
            if proc.poll() is not None:
                tail = _tail(self.log_dir / f"{name}.log")
                raise RuntimeError(f"{name} exited with {proc.returncode}; log tail:\n{tail}")

    def _start_etcd(self) -> str:
        client_port, peer_port = procs.free_port(), procs.free_port()
        url = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                self.bin_dir / "etcd",
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                # Throw-away data: skip fsync, which dominates latency on slow disks.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            self._check_alive()
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                return json.load(response).get("health") == "true"

        self.wait_for(healthy, "etcd /health")
        return url

    def _start_apiserver(self, pki: certs.ClusterPki, port: int, etcd_url: str) -> None:
        self._spawn(
            "kube-apiserver",
            [
                self.bin_dir / "kube-apiserver",
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'pki'}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                # Set only so that components stop asking for the front-proxy CA bundle.
                f"--requestheader-client-ca-file={pki.ca.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                "--authorization-mode=Node,RBAC",
                f"--service-cluster-ip-range={certs.SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_public}",
                f"--service-account-signing-key-file={pki.sa_private}",
                f"--kubelet-client-certificate={pki.apiserver_kubelet_client.cert}",
                f"--kubelet-client-key={pki.apiserver_kubelet_client.key}",
                "--kubelet-preferred-address-types=InternalIP",
                # Endpoints may not hold loopback addresses, so the `kubernetes` Service
                # gets no endpoints; clients use the kubeconfig's URL instead.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
            ],
        )

        def ready() -> bool:
            self._check_alive()
            self.client.request("GET", "/readyz")
            return True

        self.wait_for(ready, "kube-apiserver /readyz")

    def _component_kubeconfig(self, pki: certs.ClusterPki, name: str, pair: certs.KeyPair) -> Path:
        path = self.workdir / f"{name}.kubeconfig"
        return certs.write_kubeconfig(path, self.server, pki.ca.cert, pair, name)

    def _start_controllers(self, pki: certs.ClusterPki) -> None:
        cm = self._component_kubeconfig(pki, "controller-manager", pki.controller_manager)
        self._spawn(
            "kube-controller-manager",
            [
                self.bin_dir / "kube-controller-manager",
                f"--kubeconfig={cm}",
                f"--authentication-kubeconfig={cm}",
                f"--authorization-kubeconfig={cm}",
                "--bind-address=127.0.0.1",
                f"--secure-port={procs.free_port()}",
                "--leader-elect=false",
                # One ServiceAccount per controller, bound to its bootstrap role (as kubeadm).
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_private}",
                f"--root-ca-file={pki.ca.cert}",
                # All default controllers: garbage collector, deployments, replicasets,
                # endpoints/endpointslices, service accounts, namespaces, node lifecycle...
                "--controllers=*",
            ],
        )
        sched = self._component_kubeconfig(pki, "scheduler", pki.scheduler)
        self._spawn(
            "kube-scheduler",
            [
                self.bin_dir / "kube-scheduler",
                f"--kubeconfig={sched}",
                f"--authentication-kubeconfig={sched}",
                f"--authorization-kubeconfig={sched}",
                "--bind-address=127.0.0.1",
                f"--secure-port={procs.free_port()}",
                "--leader-elect=false",
            ],
        )

    def _start_kubelet(self, pki: certs.ClusterPki) -> None:
        kubeconfig = self._component_kubeconfig(pki, "kubelet", pki.kubelet)
        self._spawn(
            "kubelet",
            [
                sys.executable,
                "-m",
                "tests.k8s.kubelet",
                f"--kubeconfig={kubeconfig}",
                f"--pods-dir={self.pods_dir}",
                f"--serving-cert={pki.kubelet_serving.cert}",
                f"--serving-key={pki.kubelet_serving.key}",
                f"--client-ca={pki.ca.cert}",
                f"--port={procs.free_port()}",
                f"--pods={self.pods}",
            ],
        )

    def stop(self) -> None:
        """Stops every process this cluster started, newest first, then any pod process
        a dead kubelet may have left behind (their PIDs are recorded under pods/) and any
        container (labelled with this cluster's pods folder)."""
        for _name, proc in reversed(self._procs):
            procs.stop(proc, grace=15.0)
        self._procs.clear()
        for pid_file in self.pods_dir.glob("*/*/*/*.pid"):
            try:
                procs.stop(int(pid_file.read_text()), grace=0.0)
            except ValueError:
                pass
        if self.pods == "containers":
            remove_containers(self.pods_dir)
        if self._own_workdir and not os.environ.get("APPORTION_K8S_KEEP"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----- helpers for tests and humans ---------------------------------------------------

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def pods_dir(self) -> Path:
        return self.workdir / "pods"

    def env(self) -> dict[str, str]:
        """os.environ with KUBECONFIG pointing here and the built binaries first on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def _run(
        self, tool: str, args: tuple[str, ...], check: bool, input: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.bin_dir / tool), *args],
            env=self.env(),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        return self._run("kubectl", args, check, input, timeout)

    def helm(
        self, *args: str, check: bool = True, timeout: float = 180.0
    ) -> subprocess.CompletedProcess[str]:
        return self._run("helm", args, check, None, timeout)

    def apply(self, *objects: Obj, namespace: str | None = None) -> None:
        """`kubectl apply` of manifests given as dicts (in namespace, when given)."""
        args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
        self.kubectl(*args, input=yaml.safe_dump_all(objects))

    def wait_crd_established(self, name: str, timeout: float = 60) -> None:
        """Until the CRD ``name`` is Established. Not `kubectl wait`: it fails outright
        while a new CRD has no conditions yet."""

        def established() -> bool:
            found = json.loads(self.kubectl("get", "crd", name, "-o", "json").stdout)
            conditions = (found.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        self.wait_for(established, f"{name} Established", timeout)

    def wait_for(
        self, condition: Callable[[], T | None], what: str, timeout: float = STARTUP_TIMEOUT
    ) -> T:
        """Polls condition until truthy (see procs.wait_for); no fixed sleeps in tests."""
        return procs.wait_for(condition, timeout, what)

    def diagnosis(self, namespace: str, lines: int = 15) -> str:
        """What a timed-out wait in namespace should show: its pods (phase, deletion, node),
        its last Events, the test kubelet's last lines about it and each pod's last log
        lines (the reason a pod never became ready is often only there)."""
        parts: list[str] = []
        try:
            pods = self.client.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
            events = self.client.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        except Exception as err:  # a diagnosis must never hide the failure it explains
            return f"(no diagnosis: {err})"
        for pod in pods:
            meta, status = pod["metadata"], pod.get("status", {})
            deleting = meta.get("deletionTimestamp")
            parts.append(
                f"pod {meta['name']}: {status.get('phase')} on {pod['spec'].get('nodeName')}"
                + (f", deleting since {deleting}" if deleting else "")
            )
            folder = self.pods_dir / namespace / meta["name"] / meta["uid"]
            for log_path in sorted(folder.glob("*.log")):
                parts += [
                    f"  {log_path.stem} | {line}" for line in _tail(log_path, lines).splitlines()
                ]
        events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        parts += [
            f"event {e.get('reason')} {e['involvedObject'].get('name')}: {e.get('message')}"
            for e in events[-lines:]
        ]
        kubelet_log = _tail(self.log_dir / "kubelet.log", 100_000).splitlines()
        kubelet_lines = [line for line in kubelet_log if f"{namespace}/" in line]
        parts += [f"kubelet | {line}" for line in kubelet_lines[-lines:]]
        return "\n".join(parts)

    def wait_nodes_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        def all_ready() -> bool:
            self._check_alive()
            items = self.client.get("/api/v1/nodes")["items"]
            ready = {n["metadata"]["name"] for n in items if _node_ready(n)}
            return ready >= set(self.node_names)

        procs.wait_for(all_ready, timeout, "nodes Ready")

    def get_pod(self, name: str, namespace: str = "default") -> Obj | None:
        return self.client.get_or_none(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def wait_pod(
        self,
        name: str,
        predicate: Callable[[Obj], object],
        what: str,
        namespace: str = "default",
        timeout: float = 120.0,
    ) -> Obj:
        """Waits until the pod exists and predicate(pod) is truthy; returns the pod."""

        def check() -> Obj | None:
            pod = self.get_pod(name, namespace)
            return pod if pod is not None and predicate(pod) else None

        return procs.wait_for(check, timeout, f"pod {namespace}/{name} {what}")

    def wait_pod_phase(
        self,
        name: str,
        phases: str | tuple[str, ...],
        namespace: str = "default",
        timeout: float = 120.0,
    ) -> Obj:
        wanted = (phases,) if isinstance(phases, str) else phases
        return self.wait_pod(
            name,
            lambda p: p.get("status", {}).get("phase") in wanted,
            f"in phase {'/'.join(wanted)}",
            namespace,
            timeout,
        )

    def pod_node(self, name: str, namespace: str = "default") -> str | None:
        pod = self.get_pod(name, namespace)
        return pod["spec"].get("nodeName") if pod else None

    def pod_log_path(
        self, name: str, namespace: str = "default", container: str | None = None
    ) -> Path:
        """The log file of a pod's container (the first container when None).

        Logs live under pods/<namespace>/<name>/<uid>/<container>.log; the current pod's
        uid is used, or, once the pod is gone, the most recent one.
        """
        folder = self.pods_dir / namespace / name
        pod = self.get_pod(name, namespace)
        if pod is not None:
            uid_dir = folder / pod["metadata"]["uid"]
            if container is None:
                container = pod["spec"]["containers"][0]["name"]
        else:
            dirs = sorted(folder.glob("*/"), key=lambda d: d.stat().st_mtime)
            if not dirs:
                raise FileNotFoundError(f"no logs for pod {namespace}/{name}")
            uid_dir = dirs[-1]
            if container is None:
                logs = sorted(uid_dir.glob("*.log"))
                container = logs[0].stem if logs else "main"
        return uid_dir / f"{container}.log"

    def pod_log(self, name: str, namespace: str = "default", container: str | None = None) -> str:
        path = self.pod_log_path(name, namespace, container)
        return path.read_text(errors="replace") if path.exists() else ""


def _node_ready(node: Obj) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node.get("status", {}).get("conditions", [])
    )


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
