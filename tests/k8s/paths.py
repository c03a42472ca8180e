"""Where the harness finds its pinned versions and the binaries that build.sh produced."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
IMAGE_SCRIPT = HERE / "image" / "build.sh"
# How the test kubelet runs pods: "containers" (podman containers of the built image, the
# default) or "processes" (local processes of the test venv; faster, for the inner loop).
PODS_ENV = "APPORTION_K8S_PODS"
POD_MODES = ("containers", "processes")
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "helm",
)


def versions() -> dict[str, str]:
    """The KEY=value pairs of versions.env (shared with build.sh)."""
    return _pairs(HERE / "versions.env")


def tool_versions() -> dict[str, str]:
    """The KEY=value pairs of tools.env (shared with build.sh)."""
    return _pairs(HERE / "tools.env")


def _pairs(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def kube_score() -> Path:
    """The kube-score build.sh made, or BinariesMissing naming the script to run."""
    path = cache_root() / "tools" / f"kube-score-{tool_versions()['KUBE_SCORE_VERSION']}"
    if not os.access(path, os.X_OK):
        raise BinariesMissing(
            f"kube-score missing ({path}): build it with "
            f"`bash {BUILD_SCRIPT.relative_to(HERE.parent.parent)}`"
        )
    return path


def kueue() -> tuple[Path, Path]:
    """Kueue's manager and the folder of its CRDs, as build.sh made them, or BinariesMissing
    naming the script to run."""
    version = tool_versions()["KUEUE_VERSION"]
    path = cache_root() / "tools" / f"kueue-{version}"
    crds = cache_root() / "tools" / f"kueue-{version}-crds"
    if not os.access(path, os.X_OK) or not crds.is_dir():
        raise BinariesMissing(
            f"Kueue missing ({path}): build it with "
            f"`bash {BUILD_SCRIPT.relative_to(HERE.parent.parent)}`"
        )
    return path, crds


def cache_root() -> Path:
    if root := os.environ.get("APPORTION_K8S_CACHE"):
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "apportion" / "k8s"


def bin_dir() -> Path:
    return cache_root() / versions()["KUBE_VERSION"] / "bin"


class BinariesMissing(RuntimeError):
    pass


def require_binaries() -> Path:
    """The bin folder, or BinariesMissing naming the build script to run."""
    folder = bin_dir()
    missing = [name for name in BINARIES if not os.access(folder / name, os.X_OK)]
    if missing:
        raise BinariesMissing(
            f"Kubernetes test binaries missing from {folder}: {', '.join(missing)}. "
            f"Build them with `bash {BUILD_SCRIPT.relative_to(HERE.parent.parent)}` "
            "(several minutes the first time), or set APPORTION_SKIP_K8S=1 to skip these tests."
        )
    return folder


def missing_binaries_message() -> str | None:
    try:
        require_binaries()
    except BinariesMissing as err:
        return str(err)
    return None


def pods_mode() -> str:
    mode = os.environ.get(PODS_ENV) or "containers"
    if mode not in POD_MODES:
        raise ValueError(f"{PODS_ENV}={mode!r}: expected one of {', '.join(POD_MODES)}")
    return mode


class ImageMissing(RuntimeError):
    pass


def image_ref() -> str:
    """The reference of the image built from the current sources (`make image`), or
    ImageMissing saying what to run."""
    done = subprocess.run(
        ["bash", str(IMAGE_SCRIPT), "--check"], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise ImageMissing(
            f"{done.stderr.strip()} (or set {PODS_ENV}=processes to run pods as local "
            "processes, ignoring images)"
        )
    return done.stdout.strip().splitlines()[-1]
