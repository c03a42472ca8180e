"""kubectl apportion: its argument syntax, the objects it builds and what it prints, with
no Kubernetes (the commands against a real API server: tests/k8s/test_kubectl_plugin_e2e.py)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from apportion import kubectl_objects as objects
from apportion.kubectl_plugin import PluginError, explained, main, typed_name

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)


@pytest.mark.parametrize(
    ("text", "group"),
    [
        ("gpu:2:GPU=2", {"name": "gpu", "replicas": 2, "resources": {"GPU": 2}}),
        (
            "highmem:1:MEMORY=100e9,process=1",
            {"name": "highmem", "replicas": 1, "resources": {"MEMORY": 100e9, "process": 1}},
        ),
        ("cpu:3", {"name": "cpu", "replicas": 3}),
        (
            "burst:0-4:GPU=1",
            {"name": "burst", "minReplicas": 0, "maxReplicas": 4, "resources": {"GPU": 1}},
        ),
        ("idle:0", {"name": "idle", "replicas": 0}),
    ],
)
def test_group_syntax(text: str, group: dict[str, Any]) -> None:
    assert objects.parse_group(text) == group


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("gpu", "'gpu' is not a worker group: expected NAME:REPLICAS[:RESOURCES]"),
        ("gpu:2:GPU=2:x", "is not a worker group"),
        ("GPU:2", "the group name 'GPU' must be lowercase letters"),
        ("gpu:two", "the replicas 'two' must be a whole number or MIN-MAX"),
        ("gpu:4-1", "MIN-MAX needs 0 <= MIN <= MAX, not '4-1'"),
        ("gpu:-1", "must be a whole number or MIN-MAX"),
        ("gpu:2:GPU", "malformed resource 'GPU' in 'GPU': expected NAME=NUMBER"),
        ("gpu:2:GPU=many", "'many' is not a number"),
        ("gpu:2:GPU=-2", "amount must be zero or more"),
    ],
)
def test_group_syntax_errors_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        objects.parse_group(text)
    assert says in str(caught.value)
    assert text in str(caught.value)


def test_a_group_name_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="repeated: gpu"):
        objects.groups_of(["gpu:1", "gpu:2"])


def test_create_cluster_refuses_a_bad_group_before_contacting_kubernetes() -> None:
    result = CliRunner().invoke(
        main, ["create", "cluster", "c", "--group", "gpu:2:GPU", "--kubeconfig", "/nonexistent"]
    )
    assert result.exit_code == 2
    assert "Invalid value for '--group'" in result.output
    assert "expected NAME=NUMBER" in result.output


def test_job_submit_needs_a_cluster_and_an_entrypoint(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["job", "submit", "--kubeconfig", "/nonexistent"])
    assert result.exit_code == 2 and "Missing argument 'ENTRYPOINT...'" in result.output
    with pytest.raises(ValueError, match="either --cluster-spec FILE"):
        objects.job_object(objects.JobRequest("j", "ns", ["python", "x.py"]))


def test_a_missing_kubeconfig_is_said_plainly(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = CliRunner().invoke(main, ["get", "--kubeconfig", str(tmp_path / "none")])
    assert result.exit_code == 1
    assert "no Kubernetes configuration" in result.output
    assert "Traceback" not in result.output


def test_typed_names() -> None:
    assert typed_name("pipeline") == ("resourceclusters", "pipeline")
    assert typed_name("job/train") == ("resourcejobs", "train")
    assert typed_name("rcluster/p") == ("resourceclusters", "p")
    with pytest.raises(Exception, match="expected NAME, cluster/NAME or job/NAME"):
        typed_name("pod/x")


def test_job_object_follows_the_resourcejob_schema() -> None:
    request = objects.JobRequest(
        name="train",
        namespace="ml",
        entrypoint=["python", "train.py", "--epochs", "3"],
        cluster={"workerGroups": [{"name": "gpu", "replicas": 2, "resources": {"GPU": 2}}]},
        workdir_configmap="train-workdir",
        backoff_limit=2,
        active_deadline=600,
        shutdown_after_finish=True,
        labels={"kueue.x-k8s.io/queue-name": "team"},
    )
    assert objects.job_object(request) == {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceJob",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "labels": {"kueue.x-k8s.io/queue-name": "team"},
        },
        "spec": {
            "entrypoint": ["python", "train.py", "--epochs", "3"],
            "cluster": {"workerGroups": [{"name": "gpu", "replicas": 2, "resources": {"GPU": 2}}]},
            "workingDir": {"configMap": "train-workdir"},
            "backoffLimit": 2,
            "activeDeadlineSeconds": 600,
            "shutdownAfterFinish": True,
        },
    }
    selected = objects.job_object(objects.JobRequest("j", "ns", ["python"], cluster_name="p"))
    assert selected["spec"]["clusterSelector"] == {"name": "p"}


def test_a_cluster_spec_file_may_hold_the_object_or_its_spec() -> None:
    spec = {"workerGroups": []}
    assert (
        objects.spec_from_file({"kind": "ResourceCluster", "apiVersion": "x", "spec": spec}, "f")
        == spec
    )
    assert objects.spec_from_file(spec, "f") == spec
    with pytest.raises(ValueError, match="f holds a Pod, not a ResourceCluster"):
        objects.spec_from_file({"apiVersion": "v1", "kind": "Pod"}, "f")
    with pytest.raises(ValueError, match="must hold a ResourceCluster or its spec"):
        objects.spec_from_file(["x"], "f")


def test_working_dir_files_become_a_configmap(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text("print('hi')\n")
    (tmp_path / "blob.bin").write_bytes(b"\xff\x00")
    (tmp_path / "__pycache__").mkdir()
    files = objects.workdir_files(tmp_path)
    assert set(files) == {"script.py", "blob.bin"}
    configmap = objects.workdir_configmap("train", "ml", files)
    assert configmap["metadata"] == {
        "name": "train-workdir",
        "namespace": "ml",
        "labels": {"apportion.dev/job": "train"},
    }
    assert configmap["data"] == {"script.py": "print('hi')\n"}
    assert configmap["binaryData"] == {"blob.bin": "/wA="}


def test_working_dir_with_a_sub_folder_or_too_large_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    with pytest.raises(ValueError, match="pkg/ is a sub-folder"):
        objects.workdir_files(tmp_path)
    (tmp_path / "pkg").rmdir()
    (tmp_path / "big.txt").write_text("x" * (objects.WORKDIR_LIMIT + 1))
    with pytest.raises(ValueError, match="a ConfigMap holds at most"):
        objects.workdir_files(tmp_path)


def test_scaling_a_group_fixes_its_size() -> None:
    spec = {"workerGroups": [{"name": "gpu", "minReplicas": 0, "maxReplicas": 4}, {"name": "c"}]}
    assert objects.scaled_groups(spec, "gpu", 3) == [{"name": "gpu", "replicas": 3}, {"name": "c"}]
    with pytest.raises(ValueError, match="no worker group 'cpu'; the groups are gpu, c"):
        objects.scaled_groups(spec, "cpu", 1)


def test_rows_show_phase_workers_and_resources() -> None:
    cluster = {
        "metadata": {"name": "p", "creationTimestamp": "2026-01-01T11:57:00Z"},
        "status": {"phase": "Running", "workers": "3/3", "resourcesSummary": "GPU 1/4"},
    }
    assert objects.cluster_row(cluster, NOW) == ("p", "Running", "3/3", "GPU 1/4", "3m")
    job = {
        "metadata": {"name": "j", "creationTimestamp": "2026-01-01T10:00:00Z"},
        "spec": {},
        "status": {"phase": "Failed", "clusterName": "p", "attempts": 2, "exitCode": 3},
    }
    assert objects.job_row(job, {"p": cluster}, NOW) == (
        "j", "Failed", "p", "2", "3", "GPU 1/4", "2h",
    )  # fmt: skip
    assert objects.age("2026-01-01T11:59:30Z", NOW) == "30s"


def test_the_failure_story_names_the_causes() -> None:
    job = {
        "kind": "ResourceJob",
        "metadata": {"name": "j"},
        "status": {
            "phase": "Failed",
            "reason": "BackoffLimitExceeded",
            "message": "the entrypoint failed 3 times",
            "exitCode": 2,
            "logTail": "Traceback ...\nValueError: bad\n",
            "conditions": [{"type": "Ready", "status": "False", "reason": "X", "message": "y"}],
        },
    }
    events = [
        {
            "type": "Warning",
            "reason": "Old",
            "message": "first",
            "lastTimestamp": "2026-01-01T00:00:00Z",
        },
        {"type": "Normal", "reason": "Started", "message": "fine"},
        {
            "type": "Warning",
            "reason": "New",
            "message": "second",
            "count": 3,
            "lastTimestamp": "2026-01-02T00:00:00Z",
        },
    ]
    assert objects.failure_story(job, events) == [
        "ResourceJob j: phase Failed",
        "reason: BackoffLimitExceeded: the entrypoint failed 3 times",
        "entrypoint exit code: 2",
        "condition Ready=False (X): y",
        "event Old: first",
        "event New (x3): second",
        "last lines of the entrypoint's log:",
        "  Traceback ...",
        "  ValueError: bad",
    ]
    healthy = {"kind": "ResourceCluster", "metadata": {"name": "p"}, "status": {"phase": "Running"}}
    assert objects.failure_story(healthy, [])[-1].startswith("no failure recorded")


def api_error(status: int, body: dict[str, Any]) -> Exception:
    from kubernetes.client.exceptions import ApiException

    error = ApiException(status=status, reason="refused")
    error.body = json.dumps(body)
    return error


@pytest.mark.parametrize(
    ("status", "body", "name", "says"),
    [
        (
            404,
            {"message": "the server could not find the requested resource", "details": {}},
            "train",
            "the ResourceJob custom resource is not installed in this cluster",
        ),
        (
            404,
            {
                "message": 'x "train" not found',
                "details": {"name": "train", "kind": "resourcejobs"},
            },
            "train",
            "no ResourceJob 'train' in namespace ml (kubectl apportion get lists them)",
        ),
        (
            403,
            {"message": 'resourcejobs.apportion.dev is forbidden: User "u" cannot list'},
            None,
            "no access: the API server refused to get resourcejobs in namespace ml (403: ",
        ),
    ],
)
def test_api_refusals_are_said_as_sentences(
    status: int, body: dict[str, Any], name: str | None, says: str
) -> None:
    with pytest.raises(PluginError) as caught, explained("resourcejobs", "get", "ml", name):
        raise api_error(status, body)
    assert says in caught.value.message
