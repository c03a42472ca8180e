"""One pod's life on the test kubelet: its containers (podman containers or local processes,
see runtime.py), its probes, its reported status, and its termination."""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .. import procs
from ..api import ApiError, Client, pod_path
from .nodes import NODE_IP, now
from .podspec import Mount, container_command, container_env, probe_ok, secret_mounts
from .runtime import ImageMissing, Launch, Runtime, Started
from .serviceaccount import TokenVolume

log = logging.getLogger("kubelet.pod")

Obj = dict[str, Any]

TICK_S = 0.2
MAX_BACKOFF_S = 10.0
REMOVE_RETRY_S = 120.0  # how long a deleted pod's object removal is retried


class Context(Protocol):
    """What a runner needs from the kubelet around it."""

    client: Client
    pods_dir: Path
    runtime: Runtime

    def base_env(self, pod: Obj) -> dict[str, str]: ...
    def token_volume(self, pod: Obj, folder: Path) -> TokenVolume | None: ...
    def hosts_content(self, pod: Obj, pod_ip: str) -> str: ...
    def finished(self, runner: PodRunner) -> None: ...


@dataclass
class Probe:
    spec: Obj | None
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0

    def arm(self, started: float) -> None:
        if self.spec:
            self.next_at = started + float(self.spec.get("initialDelaySeconds", 0))
        self.successes = self.failures = 0

    def due(self) -> bool:
        return self.spec is not None and time.monotonic() >= self.next_at

    def observe(self, ok: bool) -> bool | None:
        """Records one attempt: True/False once the success/failure threshold is reached."""
        assert self.spec is not None
        self.next_at = time.monotonic() + float(self.spec.get("periodSeconds", 10))
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            return True if self.successes >= int(self.spec.get("successThreshold", 1)) else None
        self.failures, self.successes = self.failures + 1, 0
        return False if self.failures >= int(self.spec.get("failureThreshold", 3)) else None


@dataclass
class Container:
    spec: Obj
    init: bool = False
    started: Started | None = None
    name_in_runtime: str = ""  # the current start's container name
    started_mono: float = 0.0
    restarts: int = 0
    restart_at: float = 0.0  # monotonic time of the next (re)start; 0 = now
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    ready: bool = False
    done: bool = False  # terminated for good (no restart coming)
    probe: Probe = field(default_factory=lambda: Probe(None))  # readiness
    liveness: Probe = field(default_factory=lambda: Probe(None))
    mounts: list[Mount] = field(default_factory=list)  # its Secret volumes

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.started.proc if self.started is not None else None


class PodRunner(threading.Thread):
    def __init__(self, ctx: Context, pod: Obj, pod_ip: str) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.ctx = ctx
        self.pod = pod
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.pod_ip = pod_ip
        self.dir = ctx.pods_dir / self.namespace / self.pod_name / self.uid
        self.hosts = self.dir / "hosts"
        self.token: TokenVolume | None = None  # the service-account folder, if any
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.removed = False  # the pod object is gone from the API
        self.shutdown = False  # the kubelet itself is stopping
        self.start_time = now()
        self.reported: Obj | None = None
        self.transitions: dict[str, tuple[str, str]] = {}  # condition -> (status, since)
        spec = pod["spec"]
        self.restart_policy: str = spec.get("restartPolicy", "Always")
        self.init_containers = [Container(c, init=True) for c in spec.get("initContainers", [])]
        self.containers = [
            Container(
                c, probe=Probe(c.get("readinessProbe")), liveness=Probe(c.get("livenessProbe"))
            )
            for c in spec.get("containers", [])
        ]

    # ----- called from the watch thread -----------------------------------------------------

    def update(self, pod: Obj) -> None:
        with self.lock:
            self.pod = pod
        self.wake.set()

    def remove(self) -> None:
        self.removed = True
        self.wake.set()

    def stop_now(self) -> None:
        self.shutdown = True
        self.wake.set()

    # ----- the pod's life -------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._live()
        except Exception:
            # A slow API server or podman (a timeout under load) must not leave a pod that
            # is being deleted stuck Terminating: stop what runs, then still let it go.
            log.exception("pod %s/%s: runner failed", self.namespace, self.pod_name)
            self._kill_all(0.0)
            if self.pod["metadata"].get("deletionTimestamp") and not self.removed:
                self._remove_object()
        finally:
            if self.token is not None:
                self.token.remove()
            self.ctx.finished(self)

    def _live(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hosts.write_text(self.ctx.hosts_content(self.pod, self.pod_ip))
        self.token = self._token_volume()
        self._report()
        while True:
            if self.shutdown or self.removed:
                self._kill_all(2.0 if self.shutdown else 0.0)
                return
            deleting = self.pod["metadata"].get("deletionTimestamp")
            if deleting:
                self._terminate_gracefully()
                return
            if self.token is not None:
                self.token.ensure()  # renews the token when due
            self._step()
            self._report()
            self.wake.wait(TICK_S)
            self.wake.clear()

    def _token_volume(self) -> TokenVolume | None:
        """Decides whether the pod gets a service-account folder (reading its
        ServiceAccount may fail for a while: retried until the pod goes)."""
        while not (self.shutdown or self.removed or self.pod["metadata"].get("deletionTimestamp")):
            try:
                return self.ctx.token_volume(self.pod, self.dir / "serviceaccount")
            except ApiError as err:
                log.warning("pod %s/%s: %s", self.namespace, self.pod_name, err)
            self.wake.wait(2.0)
            self.wake.clear()
        return None

    @property
    def _token_dir(self) -> Path | None:
        return self.token.folder if self.token is not None else None

    def _step(self) -> None:
        """Advances init containers (one at a time, in order), then the app containers.
        A failed init container that will not be retried fails the pod: nothing else runs."""
        if any(c.done and _exit_code(c) for c in self.init_containers):
            return
        pending_init = [c for c in self.init_containers if not c.done]
        if pending_init:
            self._tend(pending_init[0])
            return
        for container in self.containers:
            self._tend(container)
            self._probe(container)

    def _tend(self, c: Container) -> None:
        """Starts, reaps and restarts one container according to the restart policy."""
        if c.done:
            return
        if c.proc is None:
            if time.monotonic() >= c.restart_at:
                self._start(c)
            return
        code = c.proc.poll()
        if code is None:
            return
        if self.ctx.runtime.failed_to_start(code):
            # Like RunContainerError: the container never ran (the runtime's own failure,
            # e.g. a storage lock under load): no exit to report, try again shortly.
            self._reaped(c, code)
            c.state = {"waiting": {"reason": "RunContainerError", "message": f"exit {code}"}}
            c.restart_at = time.monotonic() + 2.0
            return
        self._reaped(c, code)
        restart = self.restart_policy == "Always" and not c.init
        restart = restart or (self.restart_policy != "Never" and code != 0)
        if restart:
            c.restarts += 1
            c.restart_at = time.monotonic() + min(MAX_BACKOFF_S, 0.5 * 2 ** min(c.restarts, 5))
            c.last_state, c.state = c.state, {"waiting": {"reason": "CrashLoopBackOff"}}
        else:
            c.done = True

    def _start(self, c: Container) -> None:
        with self.lock:
            pod = self.pod
        pod = {**pod, "status": {**pod.get("status", {}), **self._addresses()}}
        if self.token is not None and not self.token.ensure():
            # Like a volume that cannot be set up yet: the container waits.
            c.state = {"waiting": {"reason": "ContainerCreating", "message": self.token.error()}}
            c.restart_at = time.monotonic() + 1.0
            return
        runtime = self.ctx.runtime
        try:
            env = container_env(pod, c.spec, self.ctx.base_env(pod), self.ctx.client)
            command, args = container_command(c.spec, env)
            c.mounts = secret_mounts(pod, c.spec, self.dir, self.ctx.client)
            self._warn_unmounted(c)
            launch = Launch(
                pod=pod,
                spec=c.spec,
                name=f"k8s_{c.name}_{self.pod_name}_{self.namespace}_{self.uid[:8]}_{c.restarts}",
                command=command,
                args=args,
                env=env,
                hosts=self.hosts,
                token_dir=self._token_dir,
                pod_dir=self.dir,
                log=self.dir / f"{c.name}.log",
                mounts=c.mounts,
            )
            c.name_in_runtime = launch.name
            c.started = runtime.start(launch)
        except ImageMissing as err:
            # Like ErrImageNeverPull: the image may still be built; look again soon.
            c.state = {"waiting": {"reason": "ErrImageNeverPull", "message": str(err)}}
            c.restart_at = time.monotonic() + 5.0
            return
        except (ValueError, KeyError, ApiError) as err:
            # Like CreateContainerConfigError: keep waiting, retry later.
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(err)}}
            c.restart_at = time.monotonic() + 2.0
            return
        except subprocess.SubprocessError as err:  # the runtime did not answer in time
            c.state = {"waiting": {"reason": "RunContainerError", "message": str(err)}}
            c.restart_at = time.monotonic() + 2.0
            return
        except OSError as err:
            c.state = {
                "terminated": {
                    "exitCode": 127,
                    "reason": "StartError",
                    "message": str(err),
                    "finishedAt": now(),
                }
            }
            c.done = True
            return
        (self.dir / f"{c.name}.pid").write_text(str(c.started.proc.pid))
        c.started_mono = time.monotonic()
        c.state = {"running": {"startedAt": now()}}
        c.probe.arm(c.started_mono)
        c.liveness.arm(c.started_mono)
        c.ready = c.probe.spec is None
        log.info(
            "pod %s/%s: started %s (%s) as pid %d: %s",
            self.namespace,
            self.pod_name,
            c.name,
            runtime.mode,
            c.started.proc.pid,
            [*command, *args],
        )

    def _warn_unmounted(self, c: Container) -> None:
        """Logs, once per container, the volume mounts its runtime does not provide."""
        provided = {"kube-api-access-"}  # the injected service-account token
        provided |= {
            v["name"]
            for v in self.pod["spec"].get("volumes", [])
            if "secret" in v or "configMap" in v
        }
        if self.ctx.runtime.mode == "containers":
            provided |= {v["name"] for v in self.pod["spec"].get("volumes", []) if "emptyDir" in v}
        ignored = [
            m["mountPath"]
            for m in c.spec.get("volumeMounts", [])
            if m["name"] not in provided and not m["name"].startswith("kube-api-access-")
        ]
        if ignored and c.restarts == 0:
            log.warning(
                "pod %s/%s: %s: volumes not mounted by the test kubelet (%s): %s",
                self.namespace,
                self.pod_name,
                c.name,
                self.ctx.runtime.mode,
                ", ".join(ignored),
            )

    def _reaped(self, c: Container, code: int) -> None:
        started = c.state.get("running", {}).get("startedAt", now())
        terminated: Obj = {"startedAt": started, "finishedAt": now()}
        if code < 0:  # killed by a signal: report it as a shell would
            terminated.update(exitCode=128 - code, signal=-code, reason="Error")
        else:
            terminated.update(exitCode=code, reason="Completed" if code == 0 else "Error")
        c.state = {"terminated": terminated}
        c.started = None
        c.ready = False
        try:
            self.ctx.runtime.remove(c.name_in_runtime)
        except (OSError, subprocess.SubprocessError) as err:  # podman slow under load
            log.warning("pod %s/%s: removing %s: %s", self.namespace, self.pod_name, c.name, err)
        (self.dir / f"{c.name}.pid").unlink(missing_ok=True)
        log.info("pod %s/%s: %s exited with %d", self.namespace, self.pod_name, c.name, code)

    def _probe(self, c: Container) -> None:
        """Readiness sets the container's ready flag; a failed liveness probe kills the
        container, which then restarts (or not) by the restart policy."""
        for probe in (c.probe, c.liveness):
            if c.proc is None or not probe.due():
                continue
            assert probe.spec is not None
            with self.lock:
                pod = self.pod
            runtime = self.ctx.runtime
            env = container_env(pod, c.spec, self.ctx.base_env(pod), self.ctx.client)
            exec_argv = runtime.exec_argv(c.name_in_runtime, self.hosts, self._token_dir, c.mounts)
            verdict = probe.observe(
                probe_ok(
                    probe.spec,
                    c.spec,
                    self.pod_ip,
                    exec_argv,
                    env,
                    str(self.dir),
                    exec_env=runtime.exec_env(env),
                    exec_timeout=runtime.exec_timeout(float(probe.spec.get("timeoutSeconds", 1))),
                )
            )
            if probe is c.probe and verdict is not None:
                c.ready = verdict
            elif probe is c.liveness and verdict is False:
                log.info(
                    "pod %s/%s: %s failed its liveness probe; killing it",
                    self.namespace,
                    self.pod_name,
                    c.name,
                )
                self.ctx.runtime.signal(c.name_in_runtime, c.proc, signal.SIGKILL)

    # ----- termination ----------------------------------------------------------------------

    def _kill_all(self, grace: float) -> None:
        """SIGTERM every running process group, SIGKILL whatever outlives grace seconds."""
        running = [
            (c, c.proc) for c in [*self.init_containers, *self.containers] if c.proc is not None
        ]
        for c, proc in running:
            self._signal(c, proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for _, p in running):
            time.sleep(0.05)
        for c, proc in running:
            if proc.poll() is None:
                self._signal(c, proc, signal.SIGKILL)
            procs.signal_group(proc.pid, signal.SIGKILL)  # whatever the process left behind
            self._reaped(c, proc.wait())
            c.done = True

    def _signal(self, c: Container, proc: subprocess.Popen[bytes], sig: int) -> None:
        """Signals a container; a runtime that fails or hangs (podman under load) falls back
        to signalling the process group it started, so termination always goes on."""
        try:
            self.ctx.runtime.signal(c.name_in_runtime, proc, sig)
        except (OSError, subprocess.SubprocessError) as err:
            log.warning(
                "pod %s/%s: %s: signal %d: %s", self.namespace, self.pod_name, c.name, sig, err
            )
            procs.signal_group(proc.pid, sig)

    def _terminate_gracefully(self) -> None:
        with self.lock:
            meta, spec = self.pod["metadata"], self.pod["spec"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        self._kill_all(float(grace))
        for c in self.containers:
            if "terminated" not in c.state:
                c.state = {
                    "terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now()}
                }
            c.done = True
        self._report()
        self._remove_object()

    def _remove_object(self) -> None:
        """The kubelet's last word: removes the pod object now that nothing runs any more,
        retrying while the API server fails or is slow to answer."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}
        deadline = time.monotonic() + REMOVE_RETRY_S
        delay = 0.2
        while True:
            try:
                self.ctx.client.delete(pod_path(self.namespace, self.pod_name), body)
                return
            except ApiError as err:
                if err.status in (404, 409):  # gone, or a new pod of the same name: ours is gone
                    return
                failure: Exception = err
            except OSError as err:  # a timeout or a refused connection
                failure = err
            if self.shutdown or time.monotonic() > deadline:
                raise failure
            log.warning(
                "pod %s/%s: removing the object: %s; retrying",
                self.namespace,
                self.pod_name,
                failure,
            )
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    # ----- status ---------------------------------------------------------------------------

    def _addresses(self) -> Obj:
        return {
            "hostIP": NODE_IP,
            "hostIPs": [{"ip": NODE_IP}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
        }

    def _phase(self) -> str:
        if any(c.done and _exit_code(c) for c in self.init_containers):
            return "Failed"
        if any(not c.done for c in self.init_containers):
            return "Pending"
        if all(c.done for c in self.containers):
            return "Failed" if any(_exit_code(c) for c in self.containers) else "Succeeded"
        if any("running" in c.state or c.restarts or c.done for c in self.containers):
            return "Running"
        return "Pending"

    def _condition(self, kind: str, ok: bool) -> Obj:
        """A pod condition whose lastTransitionTime moves only when its status does."""
        status = "True" if ok else "False"
        previous = self.transitions.get(kind)
        if previous is None or previous[0] != status:
            self.transitions[kind] = previous = (status, now())
        return {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": previous[1],
        }

    def _status(self) -> Obj:
        initialized = all(c.done and not _exit_code(c) for c in self.init_containers)
        ready = initialized and all(c.ready for c in self.containers)
        condition = self._condition
        return {
            "phase": self._phase(),
            "startTime": self.start_time,
            **self._addresses(),
            "conditions": [
                condition("PodReadyToStartContainers", True),
                condition("Initialized", initialized),
                condition("Ready", ready),
                condition("ContainersReady", ready),
                condition("PodScheduled", True),
            ],
            "initContainerStatuses": [_container_status(c) for c in self.init_containers],
            "containerStatuses": [_container_status(c) for c in self.containers],
        }

    def _report(self) -> None:
        status = self._status()
        if status == self.reported:
            return
        try:
            self.ctx.client.merge_patch(
                f"{pod_path(self.namespace, self.pod_name)}/status", {"status": status}
            )
            self.reported = status
        except ApiError as err:
            if err.status == 404:
                self.removed = True
            else:
                log.warning(
                    "pod %s/%s: status update failed: %s", self.namespace, self.pod_name, err
                )
        except OSError as err:  # a slow API server: the next tick reports again
            log.warning("pod %s/%s: status update failed: %s", self.namespace, self.pod_name, err)

    @property
    def running_pids(self) -> list[int]:
        return [c.proc.pid for c in [*self.init_containers, *self.containers] if c.proc]


def _exit_code(c: Container) -> int:
    return int(c.state.get("terminated", {}).get("exitCode", 0))


def _container_status(c: Container) -> Obj:
    return {
        "name": c.name,
        "image": c.spec.get("image", ""),
        "imageID": c.started.image_id if c.started else "",
        "containerID": c.started.container_id() if c.started else "",
        "ready": c.ready,
        "started": c.proc is not None,
        "restartCount": c.restarts,
        "state": c.state,
        "lastState": c.last_state,
    }
