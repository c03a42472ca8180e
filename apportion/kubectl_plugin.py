"""``kubectl apportion``: ResourceClusters and ResourceJobs from the command line.

Installed with the ``kubernetes`` extra as the console script ``kubectl-apportion``, which
kubectl finds on PATH (``kubectl apportion get``). Every command takes ``-n/--namespace``
(default: the kubeconfig context's, else ``default``), ``--kubeconfig`` and ``--context``::

    kubectl apportion get [clusters|jobs|all] [NAME] [-o table|json|yaml]
    kubectl apportion create cluster NAME --group gpu:2:GPU=2 --group cpu:0-4 [--wait]
    kubectl apportion scale CLUSTER GROUP N
    kubectl apportion delete [cluster/|job/]NAME
    kubectl apportion job submit (--cluster-spec FILE | --cluster NAME) [--working-dir DIR] \\
        -- python script.py
    kubectl apportion logs [cluster/|job/]NAME [--workers|--all] [--tail N] [-f]
    kubectl apportion dashboard NAME [--port P] [--no-browser]
    kubectl apportion status [cluster/|job/]NAME

What is built and shown is decided in ``kubectl_objects.py`` (pure); this module talks to
the API server and turns its refusals into sentences (a missing CRD, RBAC, an unknown name).
"""

from __future__ import annotations

import datetime
import json
import sys
import time
import uuid
import webbrowser
from base64 import b64decode
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from apportion import kubectl_objects as objects
from apportion.kubectl_objects import CLUSTERS, JOBS, KINDS

OUTPUTS = click.Choice(["table", "json", "yaml"])
FINISHED = ("Succeeded", "Failed")


class PluginError(click.ClickException):
    """A failure said in one sentence (exit status 1), never a traceback."""


# ----- the Kubernetes edge ----------------------------------------------------------------


@dataclass
class Kube:
    """The API calls the commands make, on one namespace."""

    custom: Any
    core: Any
    namespace: str

    def get(self, plural: str, name: str) -> dict[str, Any]:
        with explained(plural, "get", self.namespace, name):
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                objects.GROUP, objects.VERSION, self.namespace, plural, name
            )
        return found

    def items(self, plural: str) -> list[dict[str, Any]]:
        with explained(plural, "list", self.namespace):
            found = self.custom.list_namespaced_custom_object(
                objects.GROUP, objects.VERSION, self.namespace, plural
            )
        return sorted(found.get("items") or [], key=lambda o: o["metadata"]["name"])

    def create(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        with explained(plural, "create", self.namespace, name):
            made: dict[str, Any] = self.custom.create_namespaced_custom_object(
                objects.GROUP, objects.VERSION, self.namespace, plural, body
            )
        return made

    def patch(self, plural: str, name: str, body: dict[str, Any]) -> None:
        with explained(plural, "patch", self.namespace, name):
            self.custom.patch_namespaced_custom_object(
                objects.GROUP, objects.VERSION, self.namespace, plural, name, body
            )

    def delete(self, plural: str, name: str) -> None:
        with explained(plural, "delete", self.namespace, name):
            self.custom.delete_namespaced_custom_object(
                objects.GROUP, objects.VERSION, self.namespace, plural, name
            )

    def events(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        selector = f"involvedObject.uid={obj['metadata']['uid']}"
        with explained("events", "list", self.namespace):
            found = self.core.list_namespaced_event(self.namespace, field_selector=selector)
        return [self.core.api_client.sanitize_for_serialization(e) for e in found.items]

    def pods(self, selector: str) -> list[Any]:
        with explained("pods", "list", self.namespace):
            found = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        return sorted(found.items, key=lambda p: p.metadata.name)

    def log(self, pod: str, tail: int | None, follow: bool) -> Iterator[str]:
        with explained("pods/log", "get", self.namespace, pod):
            if not follow:
                text = self.core.read_namespaced_pod_log(pod, self.namespace, tail_lines=tail)
                yield from text.splitlines()
                return
            stream = self.core.read_namespaced_pod_log(
                pod, self.namespace, tail_lines=tail, follow=True, _preload_content=False
            )
            for line in stream.stream():
                yield line.decode(errors="replace").rstrip("\n")

    def create_configmap(self, body: dict[str, Any]) -> None:
        with explained("configmaps", "create", self.namespace, body["metadata"]["name"]):
            self.core.create_namespaced_config_map(self.namespace, body)

    def own_configmap(self, name: str, owner: dict[str, Any]) -> None:
        patch = {"metadata": {"ownerReferences": [objects.owned_by(owner)]}}
        with explained("configmaps", "patch", self.namespace, name):
            self.core.patch_namespaced_config_map(name, self.namespace, patch)

    def delete_configmap(self, name: str) -> None:
        with explained("configmaps", "delete", self.namespace, name):
            self.core.delete_namespaced_config_map(name, self.namespace)

    def token(self, cluster: str) -> str | None:
        """The cluster's token (None: authentication is off, no Secret)."""
        from kubernetes.client.exceptions import ApiException

        with explained("secrets", "get", self.namespace, f"{cluster}-token"):
            try:
                secret = self.core.read_namespaced_secret(f"{cluster}-token", self.namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
        return b64decode(secret.data["token"]).decode()


def _api_message(exc: Any) -> tuple[str, dict[str, Any]]:
    try:
        body = json.loads(exc.body or "{}")
    except (ValueError, TypeError):
        body = {}
    return str(body.get("message") or exc.reason), body.get("details") or {}


@contextmanager
def explained(plural: str, verb: str, namespace: str, name: str | None = None) -> Iterator[None]:
    """The API server's refusals as sentences that say what to do."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    kind = KINDS.get(plural, plural.rstrip("s").capitalize())
    try:
        yield
    except ApiException as exc:
        message, details = _api_message(exc)
        # An unknown object's 404 names it; an unknown resource type's names nothing.
        if exc.status == 404 and plural in KINDS and not details.get("name"):
            raise PluginError(crd_missing(plural)) from None
        if exc.status == 404:
            where = f"in namespace {namespace}"
            hint = " (kubectl apportion get lists them)" if plural in KINDS else ""
            raise PluginError(f"no {kind} {name!r} {where}{hint}") from None
        if exc.status in (401, 403):
            raise PluginError(
                f"no access: the API server refused to {verb} {plural} in namespace "
                f"{namespace} ({exc.status}: {message}); ask for a Role that grants it, or use "
                "--context/--kubeconfig for a user who has one"
            ) from None
        if exc.status == 409:
            raise PluginError(f"{kind} {name!r} in namespace {namespace}: {message}") from None
        raise PluginError(
            f"cannot {verb} {plural}: the API server answered {exc.status}: {message}"
        ) from None
    except HTTPError as exc:
        raise PluginError(f"cannot reach the Kubernetes API server: {exc}") from None


def crd_missing(plural: str) -> str:
    return (
        f"the {KINDS[plural]} custom resource is not installed in this cluster (no CRD "
        f"{plural}.{objects.GROUP}): install the operator's chart (helm install apportion "
        "charts/apportion) or apply its CRDs (kubectl apply -f crds/)"
    )


def connect(namespace: str | None, kubeconfig: str | None, context: str | None) -> Kube:
    try:
        from kubernetes import client, config
    except ImportError:
        raise PluginError(
            "the kubernetes client is missing: pip install 'apportion[kubernetes]'"
        ) from None
    configuration = client.Configuration()
    active: dict[str, Any] = {}
    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
        if context:
            active = next((c for c in contexts if c["name"] == context), {})
            if not active:
                names = ", ".join(c["name"] for c in contexts)
                raise PluginError(f"no context {context!r} in the kubeconfig; there are: {names}")
        config.load_kube_config(
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    except config.ConfigException as exc:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            raise PluginError(f"no Kubernetes configuration: {exc}") from None
    api = client.ApiClient(configuration)
    namespace = namespace or (active.get("context") or {}).get("namespace") or "default"
    return Kube(client.CustomObjectsApi(api), client.CoreV1Api(api), namespace)


# ----- shared options ---------------------------------------------------------------------


def _set_root(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """``-n`` and friends are accepted after any command: keep them where every command
    finds them."""
    if value is not None:
        ctx.meta[f"apportion.{param.name}"] = value
    return value


def connection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option(
                "-n", "--namespace", default=None, expose_value=False, callback=_set_root,
                help="Namespace (default: the context's, else default).",
            ),
            click.option(
                "--kubeconfig", default=None, expose_value=False, callback=_set_root,
                help="Path of the kubeconfig (default: $KUBECONFIG, ~/.kube/config).",
            ),
            click.option(
                "--context", default=None, expose_value=False, callback=_set_root,
                help="The kubeconfig context to use.",
            ),
        ]
    ):  # fmt: skip
        command = option(command)
    return command


def kube_of(ctx: click.Context) -> Kube:
    kube = ctx.meta.get("apportion.kube")
    if kube is None:
        kube = connect(
            ctx.meta.get("apportion.namespace"),
            ctx.meta.get("apportion.kubeconfig"),
            ctx.meta.get("apportion.context"),
        )
        ctx.meta["apportion.kube"] = kube
    return kube


def _names(plural: str) -> Callable[[click.Context, click.Parameter, str], list[Any]]:
    """Shell completion of the names of ResourceClusters (or ResourceJobs)."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        try:
            kube = kube_of(ctx)
            plurals = [plural] if plural else [CLUSTERS, JOBS]
            found: list[str] = []
            for each in plurals:
                prefix = "" if plural else ("job/" if each == JOBS else "")
                try:
                    found += [prefix + o["metadata"]["name"] for o in kube.items(each)]
                except PluginError:
                    continue
        except Exception:  # completion never fails the shell
            return []
        return [click.shell_completion.CompletionItem(n) for n in found if n.startswith(incomplete)]

    return complete


def typed_name(text: str, default: str = CLUSTERS) -> tuple[str, str]:
    """``job/NAME``, ``cluster/NAME`` (kubectl's TYPE/NAME, short names too) or ``NAME``."""
    kind, slash, name = text.partition("/")
    if not slash:
        return default, text
    plurals = {
        "cluster": CLUSTERS, "clusters": CLUSTERS, "rcluster": CLUSTERS,
        "resourcecluster": CLUSTERS, "resourceclusters": CLUSTERS,
        "job": JOBS, "jobs": JOBS, "rjob": JOBS, "resourcejob": JOBS, "resourcejobs": JOBS,
    }  # fmt: skip
    if kind.lower() not in plurals or not name:
        raise click.BadParameter(f"{text!r}: expected NAME, cluster/NAME or job/NAME")
    return plurals[kind.lower()], name


def emit(data: Any, output: str) -> None:
    if output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())


def table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A kubectl-style table: rich where the output is a terminal, plain columns otherwise
    (so that scripts and tests read every cell, unwrapped)."""
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        shown = Table(box=None, header_style="bold", pad_edge=False)
        for column in columns:
            shown.add_column(column, overflow="fold")
        for row in rows:
            shown.add_row(*row)
        Console().print(shown)
        return
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    for line in [columns, *rows]:
        click.echo("   ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


def as_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


# ----- the commands -----------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """kubectl apportion: ResourceClusters and ResourceJobs of the apportion operator."""


@main.command()
@click.argument(
    "kind",
    required=False,
    default="all",
    type=click.Choice(
        ["all", "clusters", "cluster", "rcluster", "jobs", "job", "rjob"], case_sensitive=False
    ),
)
@click.argument("name", required=False, shell_complete=_names(""))
@click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True)
@connection_options
@click.pass_context
def get(ctx: click.Context, kind: str, name: str | None, output: str) -> None:
    """Clusters and jobs with their phase, workers and resources used/total."""
    kube = kube_of(ctx)
    plurals = {"all": [CLUSTERS, JOBS], "jobs": [JOBS], "job": [JOBS], "rjob": [JOBS]}.get(
        kind.lower(), [CLUSTERS]
    )
    if name is not None:
        if kind.lower() == "all":
            raise click.BadParameter("name the kind too: get cluster NAME or get job NAME")
        obj = kube.get(plurals[0], name)
        if output != "table":
            emit(obj, output)
            return
        found = {plurals[0]: [obj]}
    else:
        found = {}
        for plural in plurals:
            try:
                found[plural] = kube.items(plural)
            except PluginError as exc:
                if kind.lower() != "all" or plural != JOBS or "not installed" not in str(exc):
                    raise
                found[plural] = []  # no ResourceJob CRD: clusters alone
        if output != "table":
            emit(as_list([o for plural in plurals for o in found[plural]]), output)
            return
    clusters = found.get(CLUSTERS)
    if clusters is None and found.get(JOBS):
        try:
            clusters = kube.items(CLUSTERS)
        except PluginError:
            clusters = []
    by_name = {c["metadata"]["name"]: c for c in clusters or []}
    moment = now()
    shown = False
    if CLUSTERS in found:
        if found[CLUSTERS]:
            table(
                objects.CLUSTER_COLUMNS, [objects.cluster_row(c, moment) for c in found[CLUSTERS]]
            )
            shown = True
    if found.get(JOBS):
        if shown:
            click.echo()
        rows = [objects.job_row(j, by_name, moment) for j in found[JOBS]]
        table(objects.JOB_COLUMNS, rows)
        shown = True
    if not shown:
        click.echo(f"No apportion resources found in {kube.namespace} namespace.", err=True)


@main.group()
def create() -> None:
    """Create a ResourceCluster."""


@create.command("cluster")
@click.argument("name")
@click.option(
    "--group", "groups", multiple=True, required=True, metavar="NAME:REPLICAS[:RESOURCES]",
    help=f"A worker group (repeat for more): {objects.GROUP_SYNTAX}.",
)  # fmt: skip
@click.option("--image", default=None, help="Image of the pods (default: the operator's).")
@click.option(
    "--idle-timeout", type=click.IntRange(min=1), default=None, metavar="SECONDS",
    help="End the cluster after this long with no client and no task.",
)  # fmt: skip
@click.option(
    "--idle-policy", type=click.Choice(["delete", "scaleToZero"]), default=None,
    help="What the idle timeout does (default delete).",
)  # fmt: skip
@click.option("--wait/--no-wait", default=False, help="Wait until every worker is connected.")
@click.option("--timeout", type=float, default=300, show_default=True, help="For --wait, seconds.")
@click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True)
@connection_options
@click.pass_context
def create_cluster(
    ctx: click.Context,
    name: str,
    groups: tuple[str, ...],
    image: str | None,
    idle_timeout: int | None,
    idle_policy: str | None,
    wait: bool,
    timeout: float,
    output: str,
) -> None:
    """Create the ResourceCluster NAME, e.g. --group gpu:2:GPU=2 --group cpu:0-4."""
    try:
        worker_groups = objects.groups_of(groups)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--group'") from None
    kube = kube_of(ctx)
    spec = objects.cluster_spec(worker_groups, image, idle_timeout, idle_policy)
    made = kube.create(CLUSTERS, objects.cluster_object(name, kube.namespace, spec))
    if wait:
        made = wait_for(kube, CLUSTERS, name, cluster_settled, "every worker connected", timeout)
    if output != "table":
        emit(made, output)
    else:
        click.echo(f"resourcecluster.apportion.dev/{name} created")


def cluster_settled(obj: dict[str, Any]) -> bool:
    """Running with the current spec; an invalid spec is an error, not something to wait for."""
    status: dict[str, Any] = obj.get("status") or {}
    valid: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Valid"), {}
    )
    if valid.get("status") == "False":
        name = obj["metadata"]["name"]
        raise PluginError(f"ResourceCluster {name} is invalid: {valid.get('message')}")
    generation = obj["metadata"].get("generation")
    return status.get("phase") == "Running" and status.get("observedGeneration") == generation


def wait_for(
    kube: Kube,
    plural: str,
    name: str,
    done: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    delay = 0.5
    while True:
        obj = kube.get(plural, name)
        if done(obj):
            return obj
        if time.monotonic() > deadline:
            status = obj.get("status") or {}
            raise PluginError(
                f"{KINDS[plural]} {name}: not {what} after {timeout:g} s (phase "
                f"{status.get('phase')}); kubectl apportion status {name} says why"
            )
        time.sleep(delay)  # polling the API server, backing off
        delay = min(delay * 1.5, 3.0)


@main.command()
@click.argument("target", shell_complete=_names(""))
@click.option("--wait/--no-wait", default=False, help="Wait until it is gone.")
@connection_options
@click.pass_context
def delete(ctx: click.Context, target: str, wait: bool) -> None:
    """Delete a cluster (NAME or cluster/NAME) or a job (job/NAME); what it owns goes too."""
    plural, name = typed_name(target)
    kube = kube_of(ctx)
    kube.delete(plural, name)
    if wait:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                kube.get(plural, name)
            except PluginError:
                break
            time.sleep(1)  # polling the API server until the object is gone
    click.echo(f"{KINDS[plural].lower()}.apportion.dev/{name} deleted")


@main.command()
@click.argument("cluster", shell_complete=_names(CLUSTERS))
@click.argument("group")
@click.argument("replicas", type=click.IntRange(min=0))
@connection_options
@click.pass_context
def scale(ctx: click.Context, cluster: str, group: str, replicas: int) -> None:
    """Fix the size of worker group GROUP of CLUSTER at REPLICAS (autoscaling off)."""
    kube = kube_of(ctx)
    found = kube.get(CLUSTERS, cluster)
    try:
        groups = objects.scaled_groups(found.get("spec") or {}, group, replicas)
    except ValueError as exc:
        raise PluginError(f"ResourceCluster {cluster}: {exc}") from None
    # A merge patch replaces the whole list; the resourceVersion makes a concurrent edit fail.
    kube.patch(
        CLUSTERS,
        cluster,
        {
            "metadata": {"resourceVersion": found["metadata"]["resourceVersion"]},
            "spec": {"workerGroups": groups},
        },
    )
    click.echo(f"resourcecluster.apportion.dev/{cluster} scaled: group {group} to {replicas}")


@main.group()
def job() -> None:
    """Submit a ResourceJob."""


@job.command("submit", context_settings={"allow_interspersed_args": False})
@click.option("--name", default=None, help="The ResourceJob's name (default: job-<random>).")
@click.option(
    "--cluster-spec", "cluster_spec_file", type=click.Path(exists=True, dir_okay=False),
    default=None, help="YAML of a ResourceCluster (or its spec) made for the job.",
)  # fmt: skip
@click.option(
    "--cluster", "cluster_name", default=None, shell_complete=_names(CLUSTERS),
    help="Submit to this running ResourceCluster instead.",
)  # fmt: skip
@click.option(
    "--working-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
    help="Upload this folder's files (a ConfigMap <job>-workdir, mounted at /workdir).",
)  # fmt: skip
@click.option("--backoff-limit", type=click.IntRange(min=0), default=None)
@click.option("--active-deadline", type=click.IntRange(min=1), default=None, metavar="SECONDS")
@click.option("--ttl-after-finished", type=click.IntRange(min=0), default=None, metavar="SECONDS")
@click.option(
    "--shutdown-after-finish/--keep-cluster", default=None,
    help="Delete the job's cluster when the entrypoint ends (the operator's default otherwise).",
)  # fmt: skip
@click.option("--queue", default=None, help="Kueue LocalQueue (label kueue.x-k8s.io/queue-name).")
@click.option("--wait/--no-wait", default=False, help="Wait until it finishes; exit 1 if Failed.")
@click.option("--timeout", type=float, default=3600, show_default=True, help="For --wait.")
@click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True)
@click.argument("entrypoint", nargs=-1, required=True)
@connection_options
@click.pass_context
def job_submit(
    ctx: click.Context,
    name: str | None,
    cluster_spec_file: str | None,
    cluster_name: str | None,
    working_dir: Path | None,
    backoff_limit: int | None,
    active_deadline: int | None,
    ttl_after_finished: int | None,
    shutdown_after_finish: bool | None,
    queue: str | None,
    wait: bool,
    timeout: float,
    output: str,
    entrypoint: tuple[str, ...],
) -> None:
    """Run ENTRYPOINT (after --) as a ResourceJob: kubectl apportion job submit
    --cluster-spec cluster.yaml --working-dir . -- python script.py"""
    name = name or f"job-{uuid.uuid4().hex[:6]}"
    spec = None
    if cluster_spec_file is not None:
        try:
            loaded = yaml.safe_load(Path(cluster_spec_file).read_text())
            spec = objects.spec_from_file(loaded, cluster_spec_file)
        except (yaml.YAMLError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="'--cluster-spec'") from None
    files = None
    if working_dir is not None:
        try:
            files = objects.workdir_files(working_dir)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--working-dir'") from None
    kube = kube_of(ctx)
    request = objects.JobRequest(
        name=name,
        namespace=kube.namespace,
        entrypoint=list(entrypoint),
        cluster=spec,
        cluster_name=cluster_name,
        workdir_configmap=objects.workdir_name(name) if files is not None else None,
        backoff_limit=backoff_limit,
        active_deadline=active_deadline,
        ttl_after_finished=ttl_after_finished,
        shutdown_after_finish=shutdown_after_finish,
        labels={"kueue.x-k8s.io/queue-name": queue} if queue else None,
    )
    try:
        body = objects.job_object(request)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if cluster_name is not None:
        kube.get(CLUSTERS, cluster_name)  # an unknown cluster is said now, not by the job
    if files is not None:
        # First the files, so that the job never starts without them; then owned by the job.
        kube.create_configmap(objects.workdir_configmap(name, kube.namespace, files))
    try:
        made = kube.create(JOBS, body)
    except PluginError:
        if files is not None:
            kube.delete_configmap(objects.workdir_name(name))
        raise
    if files is not None:
        kube.own_configmap(objects.workdir_name(name), made)
    if output != "table":
        emit(made, output)
    else:
        click.echo(f"resourcejob.apportion.dev/{name} created")
    if wait:
        finished = wait_for(
            kube,
            JOBS,
            name,
            lambda o: (o.get("status") or {}).get("phase") in FINISHED,
            "finished",
            timeout,
        )
        status = finished.get("status") or {}
        click.echo(f"resourcejob.apportion.dev/{name} {status.get('phase')}", err=True)
        if status.get("phase") == "Failed":
            raise PluginError("\n".join(objects.failure_story(finished, kube.events(finished))))


@main.command()
@click.argument("target", shell_complete=_names(""))
@click.option("--workers", is_flag=True, help="The workers' logs (default: the scheduler's).")
@click.option("--all", "every", is_flag=True, help="The scheduler's and every worker's logs.")
@click.option("--tail", type=int, default=None, help="Only the last lines of each.")
@click.option("-f", "--follow", is_flag=True, help="Follow (one pod only).")
@connection_options
@click.pass_context
def logs(
    ctx: click.Context, target: str, workers: bool, every: bool, tail: int | None, follow: bool
) -> None:
    """Logs of a cluster's scheduler (NAME), its workers (--workers), or a job's
    entrypoint (job/NAME; its last lines from the status once the pod is gone)."""
    plural, name = typed_name(target)
    kube = kube_of(ctx)
    if plural == JOBS:
        found = kube.get(JOBS, name)
        pods = kube.pods(f"{objects.JOB_LABEL}={name},{objects.COMPONENT_LABEL}=submitter")
        if not pods:
            tail_text = (found.get("status") or {}).get("logTail")
            if not tail_text:
                raise PluginError(f"ResourceJob {name}: no submitter pod and no log in its status")
            click.echo("(the submitter pod is gone: the last lines kept in the status)", err=True)
            click.echo(str(tail_text).rstrip("\n"))
            return
        newest: Any = max(pods, key=lambda p: p.metadata.creation_timestamp)
        for line in kube.log(newest.metadata.name, tail, follow):
            click.echo(line)
        return
    kube.get(CLUSTERS, name)  # an unknown cluster is said as such
    components = ["scheduler", "worker"] if every else ["worker"] if workers else ["scheduler"]
    selector = f"{objects.CLUSTER_LABEL}={name}"
    pods = [
        p
        for p in kube.pods(selector)
        if (p.metadata.labels or {}).get(objects.POD_COMPONENT) in components
    ]
    if not pods:
        raise PluginError(f"ResourceCluster {name} has no {' or '.join(components)} pod running")
    if follow and len(pods) > 1:
        raise click.UsageError(
            f"--follow takes one pod; these are {len(pods)}: drop --workers/--all"
        )
    for pod in pods:
        prefix = f"[{pod.metadata.name}] " if len(pods) > 1 else ""
        for line in kube.log(pod.metadata.name, tail, follow):
            click.echo(prefix + line)


@main.command()
@click.argument("cluster", shell_complete=_names(CLUSTERS))
@click.option("--port", type=int, default=0, help="Local port (default: any free one).")
@click.option("--browser/--no-browser", default=True, help="Open it in a browser.")
@connection_options
@click.pass_context
def dashboard(ctx: click.Context, cluster: str, port: int, browser: bool) -> None:
    """Forward CLUSTER's dashboard to this machine and open it, signed in, until Ctrl-C."""
    from apportion.port_forward import Forwarder, PortForwardError, cluster_ports, through_api
    from apportion.reprs import dashboard_link

    kube = kube_of(ctx)
    found = kube.get(CLUSTERS, cluster)
    http_port = cluster_ports(found)["dashboard"]
    token = kube.token(cluster)
    tls = str((found.get("status") or {}).get("schedulerAddress", "")).startswith("tls://")
    try:
        forward = Forwarder(through_api(kube.core, kube.namespace, cluster, http_port), port)
    except (PortForwardError, OSError) as exc:
        raise PluginError(f"cannot forward the dashboard of {cluster}: {exc}") from None
    with forward:
        address = f"{'tls' if tls else 'tcp'}://{forward.address}"
        link = dashboard_link(address, forward.port, token) or ""
        click.echo(f"dashboard of {cluster}: {link}")
        click.echo("(forwarding until Ctrl-C)", err=True)
        if browser:
            webbrowser.open(link)
        try:
            while True:
                time.sleep(3600)  # the forwarder's threads do the work
        except KeyboardInterrupt:
            pass


@main.command()
@click.argument("target", shell_complete=_names(""))
@click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True)
@connection_options
@click.pass_context
def status(ctx: click.Context, target: str, output: str) -> None:
    """Why a cluster (NAME) or job (job/NAME) is where it is: phase, the conditions that
    say something is wrong, Warning events, a job's exit code and last log lines."""
    plural, name = typed_name(target)
    kube = kube_of(ctx)
    found = kube.get(plural, name)
    events = kube.events(found)
    if output != "table":
        emit({"status": found.get("status") or {}, "events": events}, output)
        return
    for line in objects.failure_story(found, events):
        click.echo(line)


if __name__ == "__main__":
    main()
