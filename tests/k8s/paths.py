"""Where the harness finds its pinned versions and the binaries that build.sh produced."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
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
    pairs = {}
    for line in (HERE / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


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
