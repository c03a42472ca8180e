"""Start the local cluster by hand: `python -m tests.k8s up` (from the repository root).

Prints the kubeconfig and keeps the cluster running until Ctrl-C, then tears it down.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from . import paths
from .controlplane import Cluster


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def up(workdir: Path | None, pods: str | None) -> int:
    # SIGTERM behaves like Ctrl-C, also while the cluster is still starting.
    signal.signal(signal.SIGTERM, _interrupt)
    print("starting etcd, kube-apiserver, controller-manager, scheduler, test kubelet...")
    try:
        cluster = Cluster.start(workdir, pods)
    except (paths.BinariesMissing, paths.ImageMissing, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    with cluster:
        version = paths.versions()["KUBE_VERSION"]
        print(f"API server:  {cluster.server}")
        print(f"nodes:       {', '.join(cluster.node_names)}")
        if cluster.pods == "containers":
            print(f"pods:        podman containers; the apportion image is {cluster.image}")
        else:
            print("pods:        local processes of this Python environment (images ignored)")
        print(f"work dir:    {cluster.workdir} (component logs in logs/, pod logs in pods/)")
        print(f"kubeconfig:  {cluster.kubeconfig}")
        print(f"\n    export KUBECONFIG={cluster.kubeconfig}")
        print(f"    export PATH={cluster.bin_dir}:$PATH   # kubectl {version}, helm\n")
        print("Ctrl-C stops the cluster.", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("\nstopping...", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.k8s")
    sub = parser.add_subparsers(dest="command", required=True)
    up_cmd = sub.add_parser("up", help="start the local cluster until Ctrl-C")
    up_cmd.add_argument("--workdir", type=Path, help="keep state here (default: a temp dir)")
    up_cmd.add_argument(
        "--pods",
        choices=paths.POD_MODES,
        help=f"run pods as podman containers or as local processes (default: ${paths.PODS_ENV}, "
        "else containers)",
    )
    sub.add_parser("bin-dir", help="print the folder of the built binaries")
    args = parser.parse_args(argv)
    if args.command == "bin-dir":
        print(paths.bin_dir())
        return 0
    return up(args.workdir, args.pods)


if __name__ == "__main__":
    sys.exit(main())
