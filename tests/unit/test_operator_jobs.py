"""apportion.operator.jobs: a ResourceJob's state machine, and what it makes
(job_manifests), without a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
from apportion.operator import job_manifests as made
from apportion.operator.jobs import (
    ADMITTED_ANNOTATION,
    LABEL_ATTEMPT,
    QUEUE_LABEL,
    CreateCluster,
    CreateSubmitter,
    CreateWorkload,
    DeleteCluster,
    DeleteJob,
    DeletePod,
    Event,
    FinishWorkload,
    Job,
    ReleaseWorkload,
    Seen,
    SetSuspend,
    decide,
    format_duration,
    parse_stamp,
    stamp,
    tail,
)
from apportion.operator.spec import Defaults

T0 = 1_700_000_000.0
UID = "job-uid"
CLUSTER_SPEC = {"workerGroups": [{"name": "gpu", "replicas": 2, "resources": {"GPU": 2}}]}


def job(
    status: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> Job:
    spec.setdefault("entrypoint", ["python", "run.py"])
    if "clusterSelector" not in spec:
        spec.setdefault("cluster", CLUSTER_SPEC)
    return Job("train", "ns", UID, spec, status or {}, labels or {}, annotations or {})


def cluster(
    phase: str = "Running",
    owner: str | None = UID,
    attempt: int | None = 1,
    deleting: bool = False,
    name: str = "train",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "labels": {}}
    if owner:
        meta["ownerReferences"] = [{"uid": owner}]
    if attempt is not None:
        meta["labels"][LABEL_ATTEMPT] = str(attempt)
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"scheduler": {"httpPort": 9001}},
        "status": {
            "phase": phase,
            "image": "apportion:test",
            "workerGroups": [
                {
                    "name": "gpu",
                    "currentReplicas": 2,
                    "resources": {"GPU": 2},
                    "usedResources": {"GPU": 3},
                }
            ],
        },
    }


def pod(attempt: int, phase: str, code: int | None = None, deleting: bool = False) -> Any:
    state = {"terminated": {"exitCode": code}} if code is not None else {"running": {}}
    meta: dict[str, Any] = {"name": f"train-{attempt}"}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": "submitter", "state": state}],
        },
    }


def running(attempts: int = 1, **extra: Any) -> dict[str, Any]:
    return {"phase": "Running", "reason": "Running", "attempts": attempts, "startTime": stamp(T0)}


def events(actions: list[Any]) -> list[tuple[str, str]]:
    return [(a.type, a.reason) for a in actions if isinstance(a, Event)]


# ----- a made cluster, start to end -------------------------------------------------------


def test_a_new_job_makes_its_cluster_first() -> None:
    d = decide(job(), Seen(), T0)
    assert CreateCluster(1) in d.actions
    assert d.status["phase"] == "Starting"
    assert d.status["attempts"] == 1
    assert d.status["startTime"] == stamp(T0)
    assert d.status["clusterName"] == "train"
    assert events(d.actions) == [("Normal", "ClusterStarting")]


def test_the_submitter_waits_for_a_running_cluster() -> None:
    status = {"phase": "Starting", "reason": "ClusterStarting", "attempts": 1}
    d = decide(job(status), Seen(cluster=cluster(phase="Pending")), T0)
    assert not [a for a in d.actions if not isinstance(a, Event)]
    assert d.status["phase"] == "Starting"
    d = decide(job(status), Seen(cluster=cluster()), T0)
    assert CreateSubmitter(1, "train") in d.actions
    assert d.status["submitterPod"] == "train-1"
    assert d.status["dashboard"] == "http://train-scheduler.ns.svc:9001"


def test_a_running_entrypoint_is_running_with_the_cluster_s_gpus_and_peak() -> None:
    status = {"phase": "Starting", "reason": "SubmitterStarting", "attempts": 1}
    d = decide(job(status), Seen(cluster=cluster(), pods=(pod(1, "Running"),)), T0 + 5)
    assert d.status["phase"] == "Running"
    assert d.status["gpus"] == "4"
    assert d.status["peakResources"] == {"GPU": 3.0}
    assert events(d.actions) == [("Normal", "Running")]
    # The peak is kept when the cluster uses less later.
    d = decide(job({**d.status}), Seen(cluster=cluster(), pods=(pod(1, "Running"),)), T0 + 6)
    assert d.status["peakResources"] == {"GPU": 3.0}
    assert not events(d.actions)  # no transition, no Event


def test_success_removes_the_made_cluster_and_keeps_the_pod_for_its_logs() -> None:
    seen = Seen(cluster=cluster(), pods=(pod(1, "Succeeded", 0),), log_tail="done\n")
    d = decide(job(running()), seen, T0 + 65)
    assert d.status["phase"] == "Succeeded"
    assert d.status["exitCode"] == 0
    assert d.status["reason"] == "Completed"
    assert d.status["completionTime"] == stamp(T0 + 65)
    assert d.status["duration"] == "1m5s"
    assert d.status["logTail"] == "done\n"
    assert DeleteCluster("train") in d.actions
    assert not [a for a in d.actions if isinstance(a, DeletePod)]


def test_shutdown_after_finish_false_keeps_the_cluster() -> None:
    seen = Seen(cluster=cluster(), pods=(pod(1, "Succeeded", 0),))
    d = decide(job(running(), shutdownAfterFinish=False), seen, T0)
    assert d.status["phase"] == "Succeeded"
    assert not [a for a in d.actions if isinstance(a, DeleteCluster)]


def test_a_failed_attempt_is_retried_on_a_fresh_cluster() -> None:
    seen = Seen(cluster=cluster(), pods=(pod(1, "Failed", 3),))
    d = decide(job(running(), backoffLimit=2), seen, T0)
    assert d.status["phase"] == "Starting"
    assert d.status["attempts"] == 2
    assert d.status["exitCode"] == 3
    assert d.status["reason"] == "Retrying"
    assert DeleteCluster("train") in d.actions
    assert events(d.actions) == [("Warning", "Retrying")]
    # The next round: the last attempt's cluster is still there (going): wait for it.
    d2 = decide(job(d.status, backoffLimit=2), Seen(cluster=cluster(deleting=True)), T0 + 1)
    assert not [a for a in d2.actions if not isinstance(a, Event)]
    # Then a fresh cluster, labelled with the new attempt.
    d3 = decide(job(d2.status, backoffLimit=2), Seen(pods=seen.pods), T0 + 2)
    assert CreateCluster(2) in d3.actions


def test_a_cluster_of_an_earlier_attempt_is_removed_first() -> None:
    status = {"phase": "Starting", "reason": "Retrying", "attempts": 2}
    d = decide(job(status, backoffLimit=1), Seen(cluster=cluster(attempt=1)), T0)
    assert d.actions[0] == DeleteCluster("train")
    assert not [a for a in d.actions if isinstance(a, (CreateCluster, CreateSubmitter))]


def test_the_last_failure_fails_the_job_with_its_exit_code() -> None:
    seen = Seen(cluster=cluster(attempt=3), pods=(pod(3, "Failed", 7),))
    d = decide(job(running(attempts=3), backoffLimit=2), seen, T0)
    assert d.status["phase"] == "Failed"
    assert d.status["reason"] == "BackoffLimitExceeded"
    assert d.status["exitCode"] == 7
    assert d.status["message"] == "the entrypoint failed with exit code 7 after 3 attempts"
    assert events(d.actions) == [("Warning", "BackoffLimitExceeded")]
    assert DeleteCluster("train") in d.actions


def test_past_its_deadline_the_entrypoint_is_stopped() -> None:
    seen = Seen(cluster=cluster(), pods=(pod(1, "Running"),))
    d = decide(job(running(), activeDeadlineSeconds=30), seen, T0 + 29)
    assert d.status["phase"] == "Running"
    d = decide(job(running(), activeDeadlineSeconds=30), seen, T0 + 30)
    assert d.status["phase"] == "Failed"
    assert d.status["reason"] == "DeadlineExceeded"
    assert DeletePod("train-1") in d.actions
    assert DeleteCluster("train") in d.actions


def test_a_finished_job_is_deleted_after_its_ttl() -> None:
    done = {"phase": "Succeeded", "reason": "Completed", "completionTime": stamp(T0)}
    assert DeleteJob() not in decide(job(done, ttlSecondsAfterFinished=60), Seen(), T0 + 59).actions
    assert DeleteJob() in decide(job(done, ttlSecondsAfterFinished=60), Seen(), T0 + 60).actions
    assert DeleteJob() not in decide(job(done), Seen(), T0 + 10_000).actions


def test_a_finished_job_removes_what_it_still_holds_and_stays_finished() -> None:
    done = {"phase": "Failed", "reason": "DeadlineExceeded", "completionTime": stamp(T0)}
    seen = Seen(cluster=cluster(), pods=(pod(1, "Running"),))
    d = decide(job(done), seen, T0 + 1)
    assert d.status["phase"] == "Failed"
    assert set(d.actions) >= {DeletePod("train-1"), DeleteCluster("train")}
    assert not events(d.actions)


def test_a_cluster_the_job_did_not_make_is_never_touched() -> None:
    d = decide(job(), Seen(cluster=cluster(owner="someone-else")), T0)
    assert d.status["phase"] == "Failed"
    assert d.status["reason"] == "ClusterConflict"
    assert not [a for a in d.actions if isinstance(a, DeleteCluster)]


# ----- a selected cluster -----------------------------------------------------------------


def test_a_selected_cluster_gets_a_submitter_and_is_kept() -> None:
    selected = job(clusterSelector={"name": "shared"})
    shared = cluster(owner=None, attempt=None, name="shared")
    d = decide(selected, Seen(cluster=shared), T0)
    assert CreateSubmitter(1, "shared") in d.actions
    assert d.status["clusterName"] == "shared"
    assert d.status["gpus"] == ""
    done = decide(
        job(d.status, clusterSelector={"name": "shared"}),
        Seen(cluster=shared, pods=(pod(1, "Failed", 1),)),
        T0 + 1,
    )
    assert done.status["phase"] == "Failed"
    assert not [a for a in done.actions if isinstance(a, DeleteCluster)]


def test_a_missing_selected_cluster_fails_the_job_saying_so() -> None:
    d = decide(job(clusterSelector={"name": "shared"}), Seen(), T0)
    assert d.status["phase"] == "Failed"
    assert d.status["reason"] == "ClusterNotFound"
    assert d.status["message"] == "no ResourceCluster shared in namespace ns"


# ----- suspend and Kueue ------------------------------------------------------------------


def test_a_suspended_job_makes_nothing_and_stops_what_runs() -> None:
    d = decide(job(suspend=True), Seen(), T0)
    assert d.status["phase"] == "Suspended"
    assert [a for a in d.actions if not isinstance(a, Event)] == []
    seen = Seen(cluster=cluster(), pods=(pod(1, "Running"),))
    d = decide(job(running(), suspend=True), seen, T0)
    assert set(d.actions) >= {DeletePod("train-1"), DeleteCluster("train")}
    assert d.status["phase"] == "Suspended"


def test_a_resumed_job_waits_for_its_stopped_pod_then_runs_again() -> None:
    status = {"phase": "Suspended", "reason": "Suspended", "attempts": 1, "startTime": stamp(T0)}
    seen = Seen(cluster=cluster(), pods=(pod(1, "Failed", 143, deleting=True),))
    d = decide(job(status), seen, T0)
    assert d.status["phase"] == "Starting"
    assert d.status["attempts"] == 1  # a stopped run is not a failed attempt
    assert not [a for a in d.actions if not isinstance(a, Event)]
    d = decide(job(d.status), Seen(cluster=cluster()), T0 + 1)
    assert CreateSubmitter(1, "train") in d.actions


QUEUED = {QUEUE_LABEL: "team-a"}


def workload(*conditions: tuple[str, str, str], admission: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {"type": t, "status": s, "reason": t, "message": m} for t, s, m in conditions
        ]
    }
    if admission:
        status["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [{"name": "gpu", "flavors": {"nvidia.com/gpu": "gpus"}}],
        }
    return {"metadata": {"name": "resourcejob-train", "namespace": "ns"}, "status": status}


def test_a_queued_job_makes_its_workload_and_is_suspended() -> None:
    d = decide(job(labels=QUEUED), Seen(), T0)
    assert CreateWorkload() in d.actions
    assert SetSuspend(True) in d.actions
    assert d.status["phase"] == "Queued"
    assert d.status["workload"] == "resourcejob-train"
    assert not [a for a in d.actions if isinstance(a, CreateCluster)]


def test_a_queued_job_says_kueue_s_reason() -> None:
    why = "couldn't assign flavors to pod set gpu: insufficient quota for nvidia.com/gpu"
    seen = Seen(workload=workload(("QuotaReserved", "False", why)))
    d = decide(job(labels=QUEUED, suspend=True), seen, T0)
    assert d.status["phase"] == "Queued"
    assert d.status["message"] == why
    assert [a for a in d.actions if not isinstance(a, Event)] == []


def test_admission_resumes_the_job_with_the_admitted_pod_sets() -> None:
    admitted = workload(("QuotaReserved", "True", ""), ("Admitted", "True", ""), admission=True)
    pod_sets = {"gpu": {"nodeSelector": {"pool": "a100"}}}
    seen = Seen(workload=admitted, admitted_pod_sets=pod_sets)
    d = decide(job({"phase": "Queued"}, labels=QUEUED, suspend=True), seen, T0)
    assert SetSuspend(False, pod_sets) in d.actions
    assert d.status["phase"] == "Starting"
    assert d.status["reason"] == "Admitted"
    # Resumed (suspend false): the cluster is made.
    d = decide(job(d.status, labels=QUEUED), seen, T0 + 1)
    assert CreateCluster(1) in d.actions


def test_an_evicted_job_frees_its_pods_then_its_quota() -> None:
    evicted = workload(
        ("QuotaReserved", "True", ""),
        ("Admitted", "True", ""),
        ("Evicted", "True", "Preempted to accommodate a higher priority Workload"),
        admission=True,
    )
    seen = Seen(cluster=cluster(), pods=(pod(1, "Running"),), workload=evicted)
    d = decide(job(running(), labels=QUEUED), seen, T0)
    assert SetSuspend(True) in d.actions
    assert set(d.actions) >= {DeletePod("train-1"), DeleteCluster("train")}
    assert not [a for a in d.actions if isinstance(a, ReleaseWorkload)]  # pods still there
    assert d.status["phase"] == "Queued"
    d = decide(job(d.status, labels=QUEUED, suspend=True), Seen(workload=evicted), T0 + 1)
    assert [a for a in d.actions if isinstance(a, ReleaseWorkload)]
    # Released (no admission, no reservation): not released again every round.
    released = workload(
        ("QuotaReserved", "False", "evicted"),
        ("Evicted", "True", "The workload is deactivated"),
    )
    d = decide(job(d.status, labels=QUEUED, suspend=True), Seen(workload=released), T0 + 2)
    assert not [a for a in d.actions if not isinstance(a, Event)]
    assert d.status["phase"] == "Queued"
    assert d.status["message"] == "The workload is deactivated"


def test_the_end_of_a_queued_job_finishes_its_workload() -> None:
    admitted = workload(("Admitted", "True", ""), admission=True)
    seen = Seen(cluster=cluster(), pods=(pod(1, "Succeeded", 0),), workload=admitted)
    d = decide(job(running(), labels=QUEUED), seen, T0)
    assert FinishWorkload("Completed", "the entrypoint exited 0 (attempt 1)") in d.actions


# ----- helpers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"), [(5, "5s"), (65, "1m5s"), (3700, "1h1m"), (90000, "1d1h"), (-3, "0s")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_a_running_job_s_duration_moves_in_steps() -> None:
    seen = Seen(cluster=cluster(), pods=(pod(1, "Running"),))
    durations = [decide(job(running()), seen, T0 + t).status["duration"] for t in (3, 9, 14, 725)]
    assert durations == ["0s", "0s", "10s", "12m0s"]


def test_stamps_round_trip() -> None:
    assert parse_stamp(stamp(T0)) == T0
    assert parse_stamp("not a time") is None


def test_tail_keeps_the_last_lines() -> None:
    text = "".join(f"line {i}\n" for i in range(50))
    assert tail(text, 3) == "line 47\nline 48\nline 49"


# ----- what a job makes -------------------------------------------------------------------


def test_the_made_cluster_is_owned_by_the_job_and_placed_where_kueue_admitted_it() -> None:
    pod_sets = {
        "gpu": {"nodeSelector": {"pool": "a100"}, "tolerations": [{"key": "gpu"}]},
        "scheduler": {"nodeSelector": {"pool": "cpu"}},
    }
    admitted = job(annotations={ADMITTED_ANNOTATION: json.dumps(pod_sets)})
    manifest = made.cluster_manifest(admitted, 2)
    assert manifest["metadata"]["name"] == "train"
    assert manifest["metadata"]["labels"][LABEL_ATTEMPT] == "2"
    (owner,) = manifest["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("ResourceJob", UID, True)
    (group,) = manifest["spec"]["workerGroups"]
    assert group["template"]["spec"] == {
        "nodeSelector": {"pool": "a100"},
        "tolerations": [{"key": "gpu"}],
    }
    assert manifest["spec"]["scheduler"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert CLUSTER_SPEC["workerGroups"][0].get("template") is None  # the job's spec untouched


def test_the_submitter_connects_with_no_arguments() -> None:
    the_job = job(workingDir={"configMap": "code"})
    body = cluster()
    pod_manifest = made.submitter_pod(the_job, body, 1, Defaults())
    meta, spec = pod_manifest["metadata"], pod_manifest["spec"]
    assert meta["name"] == "train-1"
    assert meta["labels"]["apportion.dev/job"] == "train"
    assert meta["labels"]["apportion.dev/component"] == "submitter"
    assert spec["restartPolicy"] == "Never"
    (container,) = spec["containers"]
    assert container["command"] == ["python", "run.py"]
    assert container["image"] == "apportion:test"  # the cluster's
    assert container["workingDir"] == "/workdir"
    env = {e["name"]: e for e in container["env"]}
    assert env["APPORTION_CLIENT__SCHEDULER_ADDRESS"]["value"] == (
        "tcp://train-scheduler.ns.svc:8786"
    )
    assert env["APPORTION_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "train-token",
        "key": "token",
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["workdir"]["configMap"] == {"name": "code"}


def test_the_submitter_of_a_tls_cluster_gets_its_certificate() -> None:
    body = cluster()
    body["spec"]["tls"] = {"enabled": True}
    pod_manifest = made.submitter_pod(job(), body, 1, Defaults())
    (container,) = pod_manifest["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["APPORTION_CLIENT__SCHEDULER_ADDRESS"].startswith("tls://")
    assert env["APPORTION_COMM__TLS__CA_FILE"]
    assert any(
        v.get("secret", {}).get("secretName") == "train-tls"
        for v in pod_manifest["spec"]["volumes"]
    )


def test_the_template_s_image_and_extras_win() -> None:
    template = {
        "metadata": {"labels": {"team": "a"}},
        "spec": {
            "containers": [
                {"name": "submitter", "image": "mine:1", "env": [{"name": "X", "value": "1"}]}
            ]
        },
    }
    pod_manifest = made.submitter_pod(job(template=template), cluster(), 1, Defaults())
    (container,) = pod_manifest["spec"]["containers"]
    assert container["image"] == "mine:1"
    assert {"name": "X", "value": "1"} in container["env"]
    assert pod_manifest["metadata"]["labels"]["team"] == "a"


def test_the_workload_counts_each_group_the_scheduler_and_the_submitter() -> None:
    manifest = made.workload_manifest(job(labels=QUEUED), Defaults())
    assert manifest["metadata"]["name"] == "resourcejob-train"
    assert manifest["spec"]["queueName"] == "team-a"
    sets = {s["name"]: s for s in manifest["spec"]["podSets"]}
    assert set(sets) == {"scheduler", "gpu", "submitter"}
    assert sets["gpu"]["count"] == 2
    (worker,) = sets["gpu"]["template"]["spec"]["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] in ("2", 2)


def test_admitted_details_come_from_the_flavors() -> None:
    admitted = workload(("Admitted", "True", ""), admission=True)
    flavors = {"gpus": {"nodeLabels": {"pool": "a100"}, "tolerations": [{"key": "gpu"}]}}
    assert made.admitted_details(admitted, flavors) == {
        "gpu": {"nodeSelector": {"pool": "a100"}, "tolerations": [{"key": "gpu"}]}
    }
