"""A ResourceJob's life, as a pure state machine.

``decide(job, seen, now)`` takes the job (its spec, status and labels), what the operator
observed of its world (the ResourceCluster it runs on, its submitter pods, the entrypoint's
last lines, its Kueue Workload) and the time, and returns what to do (``Action``s, carried
out by ``job_handlers.py``) and the job's new status. Nothing here reads or writes the API.

Phases::

    Pending -> Starting -> Running -> Succeeded
                  ^          |  \\-> Failed   (BackoffLimitExceeded, DeadlineExceeded, ...)
                  \\-- retry -/
    Suspended / Queued   (spec.suspend; Queued while a Kueue Workload waits for admission)

One attempt: the cluster (made for the job as ResourceCluster ``<job>``, or the selected
one) until its scheduler runs, then the submitter pod ``<job>-<attempt>``, whose exit code
decides: 0 Succeeded; otherwise another attempt while ``backoffLimit`` allows (with a fresh
cluster when the job made it), else Failed. Every change of phase is one Event.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GROUP = "apportion.dev"
VERSION = "v1alpha1"
JOB_KIND = "ResourceJob"
JOB_PLURAL = "resourcejobs"
LABEL_JOB = "apportion.dev/job"
LABEL_COMPONENT = "apportion.dev/component"
LABEL_ATTEMPT = "apportion.dev/job-attempt"
SUBMITTER = "submitter"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Where an admitted job keeps the pod-set details Kueue admitted it with (node selectors and
# tolerations per pod set), so that the cluster made after admission carries them.
ADMITTED_ANNOTATION = "apportion.dev/admitted-pod-sets"

FINISHED = ("Succeeded", "Failed")
ACTIVE_CLUSTER_PHASES = ("Running", "Scaling", "Degraded")
LOG_TAIL_LINES = 20

Obj = Mapping[str, Any]


# ----- actions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateCluster:
    """Make the job's ResourceCluster for this attempt (with Kueue's pod-set details)."""

    attempt: int


@dataclass(frozen=True)
class DeleteCluster:
    name: str


@dataclass(frozen=True)
class CreateSubmitter:
    attempt: int
    cluster: str


@dataclass(frozen=True)
class DeletePod:
    name: str


@dataclass(frozen=True)
class DeleteJob:
    pass


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class CreateWorkload:
    pass


@dataclass(frozen=True)
class SetSuspend:
    """Kueue's side of the contract: suspend the job (``suspend``), or resume it admitted
    with ``pod_sets`` (pod set -> {nodeSelector, tolerations})."""

    suspend: bool
    pod_sets: dict[str, Any] | None = None


@dataclass(frozen=True)
class FinishWorkload:
    """The job ended: the Workload's Finished condition releases its quota."""

    reason: str
    message: str


@dataclass(frozen=True)
class ReleaseWorkload:
    """An evicted job stopped: the Workload's quota reservation is cleared, so that Kueue
    queues it again."""

    message: str


Action = (
    CreateCluster
    | DeleteCluster
    | CreateSubmitter
    | DeletePod
    | DeleteJob
    | Event
    | CreateWorkload
    | SetSuspend
    | FinishWorkload
    | ReleaseWorkload
)


# ----- inputs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    name: str
    namespace: str
    uid: str
    spec: dict[str, Any]
    status: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, body: Obj) -> Job:
        meta = body["metadata"]
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta.get("uid", ""),
            spec=dict(body.get("spec") or {}),
            status=dict(body.get("status") or {}),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
        )

    @property
    def makes_cluster(self) -> bool:
        return "cluster" in self.spec

    @property
    def cluster_name(self) -> str:
        if self.makes_cluster:
            return self.name
        return str((self.spec.get("clusterSelector") or {}).get("name") or "")

    @property
    def queue(self) -> str | None:
        return self.labels.get(QUEUE_LABEL) or None

    @property
    def backoff_limit(self) -> int:
        return int(self.spec.get("backoffLimit") or 0)

    @property
    def shutdown_after_finish(self) -> bool:
        return bool(self.spec.get("shutdownAfterFinish", True))


@dataclass(frozen=True)
class Seen:
    """What the operator observed this round."""

    cluster: Obj | None = None  # the ResourceCluster named cluster_name, if it exists
    pods: tuple[Obj, ...] = ()  # the job's submitter pods
    log_tail: str | None = None  # last lines of the current submitter pod, when read
    workload: Obj | None = None  # the job's Kueue Workload (jobs with a queue label)
    # pod set -> {nodeSelector, tolerations}, from the ResourceFlavors Kueue admitted the
    # Workload with (the handler reads them); None when not admitted.
    admitted_pod_sets: dict[str, Any] | None = None


@dataclass
class Decision:
    actions: list[Action]
    status: dict[str, Any]


# ----- helpers ------------------------------------------------------------------------------


def stamp(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def parse_stamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        when = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def format_duration(seconds: float) -> str:
    """Like kubectl's: 45s, 3m12s, 2h5m, 3d4h."""
    whole = max(int(seconds), 0)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def submitter_name(job: Job, attempt: int) -> str:
    return f"{job.name}-{attempt}"


def workload_name(job: Job) -> str:
    return f"resourcejob-{job.name}"


def exit_code(pod: Obj) -> int | None:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if container.get("name") == SUBMITTER:
            terminated = (container.get("state") or {}).get("terminated")
            if terminated is not None and terminated.get("exitCode") is not None:
                return int(terminated["exitCode"])
    return None


def _condition(obj: Obj | None, kind: str) -> Obj:
    for found in ((obj or {}).get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return found
    return {}


def admitted(workload: Obj | None) -> bool:
    return (
        _condition(workload, "Admitted").get("status") == "True"
        and bool(((workload or {}).get("status") or {}).get("admission"))
        and _condition(workload, "Evicted").get("status") != "True"
    )


def evicted(workload: Obj | None) -> Obj:
    found = _condition(workload, "Evicted")
    return found if found.get("status") == "True" else {}


def _holds_quota(workload: Obj | None) -> bool:
    return bool(((workload or {}).get("status") or {}).get("admission")) or (
        _condition(workload, "QuotaReserved").get("status") == "True"
    )


def queued_why(workload: Obj | None) -> str:
    """Kueue's own words for why the Workload waits (its QuotaReserved condition)."""
    if workload is None:
        return "waiting for Kueue to see the Workload"
    found = _condition(workload, "QuotaReserved")
    if found.get("status") == "False" and found.get("message"):
        return str(found["message"])
    return "waiting for Kueue to admit the Workload"


def _cluster_ours(job: Job, cluster: Obj) -> bool:
    return any(
        ref.get("uid") == job.uid for ref in cluster["metadata"].get("ownerReferences") or []
    )


def _deleting(obj: Obj) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def _live_pods(seen: Seen) -> list[Obj]:
    """Submitter pods still running or about to (not terminated, not being deleted)."""
    return [
        p
        for p in seen.pods
        if (p.get("status") or {}).get("phase") not in FINISHED and not _deleting(p)
    ]


def _cluster_usage(cluster: Obj | None) -> tuple[dict[str, float], int]:
    """(declared resources its workers use now, GPUs its worker pods hold)."""
    used: dict[str, float] = {}
    gpus = 0.0
    for group in ((cluster or {}).get("status") or {}).get("workerGroups") or []:
        for name, amount in (group.get("usedResources") or {}).items():
            used[name] = used.get(name, 0.0) + float(amount)
        gpus += float((group.get("resources") or {}).get("GPU", 0)) * int(
            group.get("currentReplicas") or 0
        )
    return used, int(gpus)


def dashboard(cluster: Obj) -> str | None:
    spec = cluster.get("spec") or {}
    port = (spec.get("scheduler") or {}).get("httpPort") or 8787
    scheme = "https" if (spec.get("tls") or {}).get("enabled") else "http"
    name, namespace = cluster["metadata"]["name"], cluster["metadata"]["namespace"]
    return f"{scheme}://{name}-scheduler.{namespace}.svc:{port}"


# ----- the machine --------------------------------------------------------------------------


class _Round:
    """One decision: the actions and the status being built."""

    def __init__(self, job: Job, seen: Seen, now: float) -> None:
        self.job, self.seen, self.now = job, seen, now
        self.actions: list[Action] = []
        self.status: dict[str, Any] = dict(job.status)
        self.before = job.status.get("phase")

    def to(self, phase: str, reason: str, message: str, warning: bool = False) -> None:
        """Enter ``phase``: one Event when the phase or its reason changes."""
        changed = (self.status.get("phase"), self.status.get("reason")) != (phase, reason)
        self.status.update(phase=phase, reason=reason, message=message)
        if changed:
            self.status["lastTransitionTime"] = stamp(self.now)
            self.actions.append(Event("Warning" if warning else "Normal", reason, message))

    def stop_made_cluster(self) -> None:
        cluster = self.seen.cluster
        job = self.job
        if (
            job.makes_cluster
            and cluster is not None
            and not _deleting(cluster)
            and _cluster_ours(job, cluster)
        ):
            self.actions.append(DeleteCluster(cluster["metadata"]["name"]))

    def stop_submitters(self) -> None:
        for pod in _live_pods(self.seen):
            self.actions.append(DeletePod(pod["metadata"]["name"]))

    def finish(self, phase: str, reason: str, message: str, code: int | None = None) -> None:
        if code is not None:
            self.status["exitCode"] = code
        self.status["completionTime"] = stamp(self.now)
        self.to(phase, reason, message, warning=phase == "Failed")
        self.stop_submitters()
        if self.job.shutdown_after_finish:
            self.stop_made_cluster()
        if self.seen.workload is not None:
            self.actions.append(FinishWorkload(reason, message))


def decide(job: Job, seen: Seen, now: float) -> Decision:
    r = _Round(job, seen, now)
    _observe(r)
    if r.before in FINISHED:
        _finished(r)
    elif _kueue_gate(r) and not _suspended(r) and not _past_deadline(r):
        _attempt(r)
    _times(r)
    return Decision(r.actions, r.status)


def _observe(r: _Round) -> None:
    """What the status reports of the cluster whatever the phase: name, dashboard, GPUs
    and the peak of each resource its workers held; the entrypoint's last lines."""
    job, cluster = r.job, r.seen.cluster
    if job.cluster_name:
        r.status["clusterName"] = job.cluster_name
    if job.queue:
        r.status["workload"] = workload_name(job)
    if cluster is not None and not _deleting(cluster):
        r.status["dashboard"] = dashboard(cluster)
    used, gpus = _cluster_usage(cluster if cluster and _cluster_attempt_ok(r, cluster) else None)
    r.status["gpus"] = str(gpus) if job.makes_cluster else ""
    peak = dict(r.status.get("peakResources") or {})
    for name, amount in used.items():
        peak[name] = max(float(peak.get(name, 0.0)), amount)
    if peak:
        r.status["peakResources"] = peak
    if r.seen.log_tail is not None:
        r.status["logTail"] = r.seen.log_tail


def _cluster_attempt_ok(r: _Round, cluster: Obj) -> bool:
    if not r.job.makes_cluster:
        return True
    return _cluster_ours(r.job, cluster) and not _deleting(cluster)


def _finished(r: _Round) -> None:
    """A finished job: what it still holds goes, and the job itself after its TTL."""
    job = r.job
    r.stop_submitters()
    if job.shutdown_after_finish:
        r.stop_made_cluster()
    workload = r.seen.workload
    if workload is not None and _condition(workload, "Finished").get("status") != "True":
        r.actions.append(
            FinishWorkload(str(r.status.get("reason") or ""), str(r.status.get("message") or ""))
        )
    ttl = job.spec.get("ttlSecondsAfterFinished")
    done = parse_stamp(r.status.get("completionTime"))
    if ttl is not None and done is not None and r.now >= done + int(ttl):
        r.actions.append(DeleteJob())


def _kueue_gate(r: _Round) -> bool:
    """Kueue's contract for a job with a queue label: a Workload stands for it; the job
    runs only admitted (resumed with the admitted pod sets' node selectors and
    tolerations), is suspended otherwise (also when evicted), and its evicted Workload is
    released once nothing of it runs. False: stop this round here."""
    job, seen = r.job, r.seen
    if job.queue is None:
        return True
    if seen.workload is None:
        r.actions.append(CreateWorkload())
        if not job.spec.get("suspend"):
            r.actions.append(SetSuspend(True))
        _stop_everything(r)
        r.to("Queued", "WorkloadCreated", f"waiting in queue {job.queue}")
        return False
    suspended = bool(job.spec.get("suspend"))
    if admitted(seen.workload):
        if suspended:
            r.actions.append(SetSuspend(False, seen.admitted_pod_sets or {}))
            r.to("Starting", "Admitted", f"admitted by Kueue from queue {job.queue}")
            return False
        return True
    why = evicted(seen.workload)
    if not suspended:
        r.actions.append(SetSuspend(True))
    running = _stop_everything(r)
    if why:
        if not running and _holds_quota(seen.workload):
            r.actions.append(ReleaseWorkload(str(why.get("message") or "evicted")))
        r.to("Queued", str(why.get("reason") or "Evicted"), str(why.get("message") or "evicted"))
    else:
        r.to("Queued", "Queued", queued_why(seen.workload))
    return False


def _stop_everything(r: _Round) -> bool:
    """Free every pod of the job (its made cluster and submitters); True while any is still
    there."""
    r.stop_submitters()
    r.stop_made_cluster()
    cluster = r.seen.cluster
    made = r.job.makes_cluster and cluster is not None and _cluster_ours(r.job, cluster)
    return bool(_live_pods(r.seen)) or made


def _suspended(r: _Round) -> bool:
    if not r.job.spec.get("suspend"):
        return False
    _stop_everything(r)
    r.to("Suspended", "Suspended", "spec.suspend is true: nothing of the job runs")
    return True


def _past_deadline(r: _Round) -> bool:
    deadline = r.job.spec.get("activeDeadlineSeconds")
    started = parse_stamp(r.status.get("startTime"))
    if deadline is None or started is None or r.now < started + int(deadline):
        return False
    r.finish(
        "Failed",
        "DeadlineExceeded",
        f"the job ran past its activeDeadlineSeconds ({int(deadline)} s): entrypoint stopped",
    )
    return True


def _attempt(r: _Round) -> None:
    job, seen, status = r.job, r.seen, r.status
    attempt = int(status.get("attempts") or 0)
    if attempt == 0:
        attempt = status["attempts"] = 1
        status.setdefault("startTime", stamp(r.now))
    cluster = seen.cluster
    if job.makes_cluster:
        if cluster is not None and not _cluster_ours(job, cluster):
            r.finish(
                "Failed",
                "ClusterConflict",
                f"a ResourceCluster {job.cluster_name} not made by this job exists",
            )
            return
        labels = (cluster or {}).get("metadata", {}).get("labels") or {}
        if cluster is not None and labels.get(LABEL_ATTEMPT) not in (None, str(attempt)):
            # The previous attempt's cluster: each attempt gets a fresh one.
            if not _deleting(cluster):
                r.actions.append(DeleteCluster(job.cluster_name))
            r.to("Starting", "ClusterStarting", f"attempt {attempt}: removing the last cluster")
            return
        if cluster is None:
            r.actions.append(CreateCluster(attempt))
            r.to("Starting", "ClusterStarting", f"attempt {attempt}: creating the cluster")
            return
    elif cluster is None or _deleting(cluster):
        r.finish(
            "Failed",
            "ClusterNotFound",
            f"no ResourceCluster {job.cluster_name} in namespace {job.namespace}",
        )
        return
    assert cluster is not None
    pod_name = submitter_name(job, attempt)
    pod = next((p for p in seen.pods if p["metadata"]["name"] == pod_name), None)
    status["submitterPod"] = pod_name
    if pod is None:
        if (cluster.get("status") or {}).get("phase") not in ACTIVE_CLUSTER_PHASES:
            r.to("Starting", "ClusterStarting", f"attempt {attempt}: waiting for the cluster")
            return
        r.actions.append(CreateSubmitter(attempt, job.cluster_name))
        r.to("Starting", "SubmitterStarting", f"attempt {attempt}: starting the entrypoint")
        return
    if _deleting(pod):  # stopped by a suspend: its run starts again once it is gone
        r.to("Starting", "SubmitterStarting", f"attempt {attempt}: the last run is stopping")
        return
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Succeeded":
        r.finish("Succeeded", "Completed", f"the entrypoint exited 0 (attempt {attempt})", 0)
    elif phase == "Failed":
        _attempt_failed(r, attempt, pod)
    elif phase == "Running":
        r.to("Running", "Running", f"attempt {attempt}: the entrypoint runs in pod {pod_name}")
    else:
        r.to("Starting", "SubmitterStarting", f"attempt {attempt}: starting the entrypoint")


def _attempt_failed(r: _Round, attempt: int, pod: Obj) -> None:
    job = r.job
    code = exit_code(pod)
    said = f"exit code {code}" if code is not None else "no exit code (the pod failed)"
    if code is not None:
        r.status["exitCode"] = code
    if attempt <= job.backoff_limit:
        r.status["attempts"] = attempt + 1
        if job.makes_cluster:
            r.stop_made_cluster()  # the next attempt gets a fresh cluster
        r.to(
            "Starting",
            "Retrying",
            f"attempt {attempt} failed with {said}; attempt {attempt + 1} of "
            f"{job.backoff_limit + 1}",
            warning=True,
        )
        return
    tries = "1 attempt" if attempt == 1 else f"{attempt} attempts"
    r.finish("Failed", "BackoffLimitExceeded", f"the entrypoint failed with {said} after {tries}")


def _times(r: _Round) -> None:
    started = parse_stamp(r.status.get("startTime"))
    if started is None:
        return
    ended = parse_stamp(r.status.get("completionTime"))
    if ended is not None:
        r.status["duration"] = format_duration(ended - started)
        return
    # While it runs, in steps (10 s, then whole minutes): a status write per step, not per
    # look.
    elapsed = r.now - started
    step = 10 if elapsed < 600 else 60
    r.status["duration"] = format_duration(elapsed - elapsed % step)


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log, each at most 400 characters."""
    kept = text.rstrip("\n").splitlines()[-lines:]
    return "\n".join(line[:400] for line in kept)
