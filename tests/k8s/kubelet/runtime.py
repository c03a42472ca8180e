"""How the test kubelet runs a container: as a podman container of the pod's image (the
default), or as a local process ignoring the image (fast, for inner-loop development).

Both hand back a `subprocess.Popen` the runner waits on: the process itself, or the attached
`podman run` client, which exits with the container's exit code and writes its output to the
container's log file. Pods share the host's network namespace either way (pod IPs are
loopback addresses), so Services and probes work alike in both.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Protocol

from .. import procs
from .podspec import Mount
from .serviceaccount import MOUNT_PATH

NO_MOUNTS: list[Mount] = []

log = logging.getLogger("kubelet.runtime")

Obj = dict[str, Any]

# The label on every container the test kubelet starts: the pods folder of its cluster, so a
# cluster's stop() finds (and removes) exactly its own containers, also after a kubelet crash.
POD_DIR_LABEL = "dev.apportion.test-kubelet.pods-dir"
CONTAINERS_CONF = Path(__file__).resolve().parent.parent / "image" / "containers.conf"
# Starting `podman exec` takes about a second on a busy machine: an exec probe gets at least
# this long, or a loaded host would fail healthy containers' probes.
MIN_EXEC_PROBE_TIMEOUT_S = 10.0
PODMAN_TIMEOUT_S = 60.0
# `podman run`'s exit code when podman itself failed (the container never ran); 126 and 127
# (the command could not be run) are reported as the container's exit, as a shell would.
PODMAN_RUN_ERROR = 125


class ImageMissing(RuntimeError):
    """The pod's image is not in the node's local storage (the test kubelet never pulls)."""


@dataclass(frozen=True)
class Launch:
    """One container start: everything the runtime needs, resolved by the runner."""

    pod: Obj
    spec: Obj  # the container's spec
    name: str  # unique per start: podman's container name
    command: list[str]  # command, $(VAR)-expanded; empty: the image's entrypoint
    args: list[str]
    env: dict[str, str]  # what the spec gives (and the kubelet's service variables)
    hosts: Path  # the pod's /etc/hosts
    token_dir: Path | None  # the service-account folder, when the pod gets one
    pod_dir: Path
    log: Path
    mounts: list[Mount] = field(default_factory=list)  # Secret volumes, read-only


@dataclass
class Started:
    """A started container: the process to wait on and what its status reports."""

    proc: subprocess.Popen[bytes]
    image_id: str = ""
    id_file: Path | None = None  # podman's --cidfile

    def container_id(self) -> str:
        if self.id_file is None:
            return f"process://{self.proc.pid}"
        try:
            return f"podman://{self.id_file.read_text().strip()}"
        except OSError:
            return ""  # not created yet


class Runtime(Protocol):
    mode: str

    def start(self, launch: Launch) -> Started: ...
    def signal(self, name: str, proc: subprocess.Popen[bytes], sig: int) -> None: ...
    def remove(self, name: str) -> None: ...
    def exec_argv(
        self, name: str, hosts: Path, token_dir: Path | None, mounts: list[Mount] = ...
    ) -> list[str]: ...
    def exec_env(self, pod_env: dict[str, str]) -> dict[str, str]: ...
    def exec_timeout(self, seconds: float) -> float: ...
    def failed_to_start(self, exit_code: int) -> bool: ...


# ----- Kubernetes quantities and security contexts (pure) ------------------------------------

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    **{suffix: Decimal(10) ** (3 * n) for n, suffix in enumerate("kMGTPE", 1)},
    **{f"{suffix}i": Decimal(2) ** (10 * n) for n, suffix in enumerate("KMGTPE", 1)},
}
_QUANTITY = re.compile(r"([0-9.eE+-]+?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")


def quantity(value: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("500m", "256Mi", "1e9", 2) as a number."""
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2) or ""]
    except InvalidOperation:
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from None


def security(pod: Obj, container: Obj) -> Obj:
    """The effective security context: the container's fields over the pod's."""
    merged = dict(pod["spec"].get("securityContext") or {})
    merged.update(container.get("securityContext") or {})
    return merged


def user_option(context: Obj, image_user: str) -> str | None:
    """podman's --user for a security context, given the image's USER. Raises ValueError
    where runAsNonRoot cannot hold (as the kubelet's CreateContainerConfigError)."""
    uid = context.get("runAsUser")
    gid = context.get("runAsGroup")
    image_uid = image_user.split(":", 1)[0]
    if context.get("runAsNonRoot"):
        effective = str(uid) if uid is not None else image_uid
        if not effective.isdigit():
            raise ValueError(
                f"container has runAsNonRoot and image has non-numeric user ({image_user!r}), "
                "cannot verify user is non-root"
            )
        if int(effective) == 0:
            raise ValueError("container has runAsNonRoot and image will run as root")
    if uid is None and gid is None:
        return None
    user = str(uid) if uid is not None else (image_uid or "0")
    return f"{user}:{gid}" if gid is not None else user


def _mounts(launch: Launch) -> list[str]:
    """-v options: /etc/hosts, the token folder, and the pod's emptyDir volumes."""
    options = ["-v", f"{launch.hosts}:/etc/hosts:ro"]
    if launch.token_dir is not None:
        options += ["-v", f"{launch.token_dir}:{MOUNT_PATH}:ro"]
    empty_dirs = {v["name"] for v in launch.pod["spec"].get("volumes", []) if "emptyDir" in v}
    for mount in launch.spec.get("volumeMounts", []):
        if mount["name"] not in empty_dirs:
            continue  # the token volume (above); other kinds are not provided
        source = launch.pod_dir / "volumes" / mount["name"] / mount.get("subPath", "")
        mode = ":ro" if mount.get("readOnly") else ""
        options += ["-v", f"{source}:{mount['mountPath']}{mode}"]
    for folder, path in launch.mounts:
        options += ["-v", f"{folder}:{path}:ro"]
    return options


def podman_run_argv(
    launch: Launch, image_user: str, labels: dict[str, str], id_file: Path
) -> list[str]:
    """`podman run` for one container start: the pod's command, args and env, the security
    context's user and restrictions, resource limits, /etc/hosts, token and emptyDirs."""
    spec, pod = launch.spec, launch.pod
    argv = ["podman", "run", "--rm", "--replace", "--name", launch.name, "--network=host"]
    argv += ["--cidfile", str(id_file)]
    argv += ["--pull=never", "--log-driver=none", "--init=false"]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    argv += ["--hostname", pod["spec"].get("hostname") or pod["metadata"]["name"]]
    context = security(pod, spec)
    user = user_option(context, image_user)
    if user is not None:
        argv += ["--user", user]
    for group in context.get("supplementalGroups", []):
        argv += ["--group-add", str(group)]
    if context.get("readOnlyRootFilesystem"):
        argv.append("--read-only")
    if context.get("allowPrivilegeEscalation") is False:
        argv += ["--security-opt", "no-new-privileges"]
    if context.get("privileged"):
        argv.append("--privileged")
    capabilities = context.get("capabilities") or {}
    argv += [f"--cap-drop={c}" for c in capabilities.get("drop", [])]
    argv += [f"--cap-add={c}" for c in capabilities.get("add", [])]
    limits = (spec.get("resources") or {}).get("limits") or {}
    if "cpu" in limits:
        argv.append(f"--cpus={quantity(limits['cpu'])}")
    if "memory" in limits:
        argv.append(f"--memory={int(quantity(limits['memory']))}b")
    argv += _mounts(launch)
    for name, value in launch.env.items():
        argv += ["--env", f"{name}={value}"]
    if spec.get("workingDir"):
        argv += ["--workdir", spec["workingDir"]]
    if launch.command:
        argv += ["--entrypoint", json.dumps(launch.command)]
    return [*argv, spec["image"], *launch.args]


# ----- the runtimes ------------------------------------------------------------------------


class PodmanRuntime:
    """Every container a podman container of the pod's image, never pulled."""

    mode = "containers"

    def __init__(self, pods_dir: Path) -> None:
        self.pods_dir = pods_dir
        self.env = podman_env()

    def _podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=PODMAN_TIMEOUT_S,
            check=check,
        )

    def _image(self, image: str) -> Obj:
        found = self._podman("image", "inspect", image, check=False)
        if found.returncode != 0:
            raise ImageMissing(
                f"image {image!r} is not present on the node and the test kubelet never pulls: "
                "build it with `make image`, or name an image `podman images` lists"
            )
        return json.loads(found.stdout)[0]

    def start(self, launch: Launch) -> Started:
        image = self._image(launch.spec["image"])
        image_user = image.get("Config", {}).get("User") or "0"
        for volume in launch.pod["spec"].get("volumes", []):
            if "emptyDir" in volume:
                folder = launch.pod_dir / "volumes" / volume["name"]
                folder.mkdir(parents=True, exist_ok=True)
                folder.chmod(0o777)  # as the kubelet makes them: writable by any UID
        id_file = launch.pod_dir / f"{launch.name}.cid"
        id_file.unlink(missing_ok=True)  # podman refuses to overwrite one
        labels = {POD_DIR_LABEL: str(self.pods_dir)}
        argv = podman_run_argv(launch, image_user, labels, id_file)
        proc = procs.start(argv, launch.log, env=self.env, cwd=launch.pod_dir)
        return Started(proc, str(image["Id"]), id_file)

    def signal(self, name: str, proc: subprocess.Popen[bytes], sig: int) -> None:
        done = self._podman("kill", "--signal", str(int(sig)), name, check=False)
        if done.returncode != 0 and sig == signal.SIGKILL:
            procs.signal_group(proc.pid, sig)  # no container (yet): stop the client itself

    def remove(self, name: str) -> None:
        self._podman("rm", "--force", "--ignore", "--time", "0", name, check=False)

    def exec_argv(
        self, name: str, hosts: Path, token_dir: Path | None, mounts: list[Mount] = NO_MOUNTS
    ) -> list[str]:
        return ["podman", "exec", name]

    def exec_env(self, pod_env: dict[str, str]) -> dict[str, str]:
        return self.env  # podman's own: the container keeps the environment it started with

    def exec_timeout(self, seconds: float) -> float:
        return max(seconds, MIN_EXEC_PROBE_TIMEOUT_S)

    def failed_to_start(self, exit_code: int) -> bool:
        return exit_code == PODMAN_RUN_ERROR


def podman_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def remove_containers(pods_dir: Path) -> None:
    """Removes every container a test kubelet started for the cluster of pods_dir."""
    if shutil.which("podman") is None:
        return

    def podman(*args: str) -> str:
        done = subprocess.run(
            ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=120
        )
        return done.stdout

    ids = podman("ps", "-aq", "--filter", f"label={POD_DIR_LABEL}={pods_dir}").split()
    if ids:
        podman("rm", "--force", "--ignore", "--time", "0", *ids)


class ProcessRuntime:
    """Every container a local process in the test venv, the image ignored. Each runs in a
    private mount namespace (where unshare works) so that the pod's hosts file and token
    folder cover /etc/hosts and the token path."""

    mode = "processes"

    def __init__(self, unshare: list[str] | None) -> None:
        self.unshare = unshare

    def exec_argv(
        self, name: str, hosts: Path, token_dir: Path | None, mounts: list[Mount] = NO_MOUNTS
    ) -> list[str]:
        if self.unshare is None:
            return []
        binds = [f"mount --bind {shlex.quote(str(hosts))} /etc/hosts"]
        if token_dir is not None:
            binds.append(f"mount --bind -o ro {shlex.quote(str(token_dir))} {MOUNT_PATH}")
        for folder, path in mounts:
            # The mount point must exist on the host (an empty folder, left in place).
            Path(path).mkdir(parents=True, exist_ok=True)
            binds.append(f"mount --bind -o ro {shlex.quote(str(folder))} {shlex.quote(path)}")
        # `exec` keeps the pod's command as the process whose PID we track.
        script = " && ".join([*binds, 'exec "$@"'])
        return ["unshare", *self.unshare, "--", "/bin/sh", "-c", script, "sh"]

    def start(self, launch: Launch) -> Started:
        argv = [*launch.command, *launch.args]
        if not argv:
            raise ValueError(
                f"container {launch.spec['name']!r} has no command; the process kubelet "
                "ignores images, so pod specs must give an explicit command"
            )
        cwd = launch.spec.get("workingDir")
        cwd = cwd if cwd and Path(cwd).is_dir() else str(launch.pod_dir)
        proc = procs.start(
            [*self.exec_argv(launch.name, launch.hosts, launch.token_dir, launch.mounts), *argv],
            launch.log,
            env=launch.env,
            cwd=Path(cwd),
        )
        return Started(proc)

    def signal(self, name: str, proc: subprocess.Popen[bytes], sig: int) -> None:
        procs.signal_group(proc.pid, sig)

    def remove(self, name: str) -> None:
        pass

    def exec_env(self, pod_env: dict[str, str]) -> dict[str, str]:
        return pod_env

    def exec_timeout(self, seconds: float) -> float:
        return seconds

    def failed_to_start(self, exit_code: int) -> bool:
        return False  # every exit code is the process's own
