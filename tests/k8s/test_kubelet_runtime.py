"""What the test kubelet asks podman for, from a pod spec (pure; no podman needed)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from .kubelet.runtime import Launch, podman_run_argv, quantity, user_option
from .kubelet.serviceaccount import MOUNT_PATH


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        (2, Decimal(2)),
        ("256Mi", Decimal(256 * 2**20)),
        ("1Gi", Decimal(2**30)),
        ("100e9", Decimal("100e9")),
        ("1.5G", Decimal("1.5e9")),
        ("128k", Decimal(128_000)),
    ],
)
def test_quantities(text: str | int, value: Decimal) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["", "lots", "5Zi", "1..2"])
def test_bad_quantities_are_named(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        quantity(text)


def test_user_from_the_security_context_or_the_image() -> None:
    assert user_option({}, "10001") is None  # the image's USER stands
    assert user_option({"runAsUser": 10001, "runAsGroup": 10001}, "0") == "10001:10001"
    assert user_option({"runAsUser": 0}, "10001") == "0"
    assert user_option({"runAsGroup": 5}, "10001:10001") == "10001:5"
    assert user_option({"runAsNonRoot": True}, "10001:10001") is None


@pytest.mark.parametrize(
    ("context", "image_user", "message"),
    [
        ({"runAsNonRoot": True}, "0", "image will run as root"),
        ({"runAsNonRoot": True}, "", "image will run as root"),
        ({"runAsNonRoot": True, "runAsUser": 0}, "10001", "image will run as root"),
        ({"runAsNonRoot": True}, "apportion", "non-numeric user"),
    ],
)
def test_run_as_non_root_is_enforced(
    context: dict[str, Any], image_user: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        user_option(context, image_user or "0")


def launch(tmp_path: Path, pod_spec: dict[str, Any], container: dict[str, Any]) -> Launch:
    spec = {"name": "main", "image": "localhost/apportion:test", **container}
    pod = {
        "metadata": {"name": "op-1", "namespace": "ns"},
        "spec": {**pod_spec, "containers": [spec]},
    }
    return Launch(
        pod=pod,
        spec=spec,
        name="k8s_main_op-1_ns_abc_0",
        command=["apportion", "operator"],
        args=["--namespace", "ns"],
        env={"APPORTION_TOKEN": "s3cret\nline", "KUBERNETES_SERVICE_PORT": "6443"},
        hosts=tmp_path / "hosts",
        token_dir=tmp_path / "serviceaccount",
        pod_dir=tmp_path,
        log=tmp_path / "main.log",
    )


def options(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def test_the_charts_operator_pod_as_podman_run(tmp_path: Path) -> None:
    """The Helm chart's operator container: its user, restrictions, limits, token, env."""
    pod_spec = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001},
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    container = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "kube-api-access-x", "mountPath": MOUNT_PATH, "readOnly": True},
        ],
    }
    start = launch(tmp_path, pod_spec, container)
    argv = podman_run_argv(start, "10001:10001", {"k": "v"}, tmp_path / "main.cid")
    assert argv[:2] == ["podman", "run"]
    assert options(argv, "--name") == ["k8s_main_op-1_ns_abc_0"]
    assert options(argv, "--user") == ["10001:10001"]
    assert "--read-only" in argv and "--cap-drop=ALL" in argv and "--network=host" in argv
    assert options(argv, "--security-opt") == ["no-new-privileges"]
    assert "--cpus=0.500" in argv and f"--memory={256 * 2**20}b" in argv
    assert options(argv, "-v") == [
        f"{tmp_path / 'hosts'}:/etc/hosts:ro",
        f"{tmp_path / 'serviceaccount'}:{MOUNT_PATH}:ro",
        f"{tmp_path / 'volumes' / 'tmp'}:/tmp",
    ]
    assert options(argv, "--env") == [
        "APPORTION_TOKEN=s3cret\nline",
        "KUBERNETES_SERVICE_PORT=6443",
    ]
    assert options(argv, "--label") == ["k=v"]
    assert options(argv, "--hostname") == ["op-1"]
    assert json.loads(options(argv, "--entrypoint")[0]) == ["apportion", "operator"]
    assert argv[-3:] == ["localhost/apportion:test", "--namespace", "ns"]


def test_without_a_command_the_images_entrypoint_runs(tmp_path: Path) -> None:
    start = launch(tmp_path, {}, {})
    start = Launch(**{**start.__dict__, "command": [], "args": [], "token_dir": None})
    argv = podman_run_argv(start, "10001", {}, tmp_path / "main.cid")
    assert "--entrypoint" not in argv and "--user" not in argv
    assert argv[-1] == "localhost/apportion:test"
    assert options(argv, "-v") == [f"{tmp_path / 'hosts'}:/etc/hosts:ro"]


def test_run_as_non_root_refuses_a_root_image(tmp_path: Path) -> None:
    start = launch(tmp_path, {"securityContext": {"runAsNonRoot": True}}, {})
    with pytest.raises(ValueError, match="runAsNonRoot"):
        podman_run_argv(start, "0", {}, tmp_path / "main.cid")
