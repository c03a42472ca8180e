"""The ``apportion`` command: scheduler, worker and demo."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import click

from apportion import config
from apportion.auth import connecting_token, default_token_file, scheduler_token
from apportion.backoff import RestartBackoff
from apportion.errors import ConfigError
from apportion.memory_limit import parse_memory_limit
from apportion.process import (
    EXIT_STARTUP_FAILED,
    after_exit,
    keep_standard_streams_open,
    read_announcements,
    said_it_stopped,
    serve,
    setup_logging,
)
from apportion.resources import parse_spec

logger = logging.getLogger("apportion.cli")


def _tls_options(func):
    """--tls-* flags shared by scheduler and worker; they set comm.tls.* configuration."""
    for flag, help_text in (
        ("--tls-key", "Private key of --tls-cert."),
        ("--tls-cert", "Certificate to serve (and present to servers) over TLS."),
        ("--tls-ca-file", "CA that peers' certificates must be signed by (mutual TLS)."),
    ):
        func = click.option(
            flag, type=click.Path(exists=True, dir_okay=False), default=None, help=help_text
        )(func)
    return func


def _token_options(what: str, default_file: str, no_auth: str):
    """--token-file and --no-auth, shared by scheduler and worker."""

    def decorate(func):
        func = click.option("--no-auth", is_flag=True, help=no_auth)(func)
        return click.option(
            "--token-file",
            type=click.Path(dir_okay=False),
            default=None,
            help=f"{what} Default: $APPORTION_TOKEN, else the file $APPORTION_TOKEN_FILE "
            f"names, else {default_token_file()} {default_file}.",
        )(func)

    return decorate


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Every page of the scheduler's HTTP port, for --help (scheduler/http_api.py and
# scheduler/dashboard_routes.py serve them).
HTTP_PAGES = (
    ("/dashboard", "the dashboard; /dashboard?token=... signs a browser in"),
    ("/dashboard/events", "the dashboard's updates, as server-sent events"),
    ("/dashboard/login", "the dashboard's sign-in form"),
    ("/health", "liveness, open to all"),
    ("/api/v1/info", "workers, resources and tasks as JSON"),
    ("/api/v1/story/KEY", "a task's changes of state"),
    ("/api/v1/retire", "POST: retire workers gracefully"),
    ("/api/v1/cluster-status", "POST: the operator's view of a ResourceCluster"),
    ("/metrics", "Prometheus metrics"),
)


def _log_level_option(func):
    """--log-level, shared by scheduler and worker (LocalCluster passes it to each)."""
    return click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default=None,
        help="Level of what this process prints (default: the setting logging.level, else INFO).",
    )(func)


def _apply_tls(cert: str | None, key: str | None, ca_file: str | None) -> None:
    if cert and not key:
        raise click.UsageError("--tls-cert needs --tls-key")
    values = {"comm.tls.cert-file": cert, "comm.tls.key-file": key, "comm.tls.ca-file": ca_file}
    config.set({k: v for k, v in values.items() if v})


@click.group()
@click.version_option(package_name="apportion")
def main() -> None:
    """Resource-aware distributed task scheduling."""
    keep_standard_streams_open()
    try:
        config.check()
    except ConfigError as exc:
        click.echo(f"apportion: {exc}", err=True)
        sys.exit(EXIT_STARTUP_FAILED)


@main.command()
def settings() -> None:
    """Print every configuration key with its type, default and meaning (Markdown)."""
    from apportion.config_schema import markdown_table

    click.echo(markdown_table())


@main.command()
@click.option(
    "--host",
    default="",
    help="Interface to listen on (default: all interfaces, so that other machines can "
    "connect; 127.0.0.1: this machine only). The log names the address to give others.",
)
@click.option("--port", default=8786, show_default=True, type=int)
@click.option(
    "--http-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve HTTP on this port (0: any free one; the log says which): "
    + "; ".join(f"{path} ({what})" for path, what in HTTP_PAGES)
    + ". All but /health need the token.",
)
@_token_options(
    "File holding the shared token; created with a new random token (mode 0600) if missing.",
    "(created if missing)",
    "Accept connections without a token.",
)
@_tls_options
@_log_level_option
@click.option("--ready-fd", type=int, default=None, hidden=True)
def scheduler(
    host: str,
    port: int,
    http_port: int | None,
    token_file: str | None,
    no_auth: bool,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca_file: str | None,
    log_level: str | None,
    ready_fd: int | None,
) -> None:
    """Run a scheduler. Authentication is on unless --no-auth (see --token-file)."""
    setup_logging(log_level)
    _apply_tls(tls_cert, tls_key, tls_ca_file)
    try:
        token = scheduler_token(token_file, no_auth)
    except (OSError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    from apportion.scheduler.server import Scheduler, tune_garbage_collector

    tune_garbage_collector()

    if http_port is None:
        http_port = config.get("scheduler.http-port")
    try:
        server = Scheduler(host, port, token=token, http_port=http_port)
    except ConfigError as exc:  # tenants declared wrong (scheduler.tenants)
        click.echo(f"apportion: {exc}", err=True)
        sys.exit(EXIT_STARTUP_FAILED)
    serve(
        start=server.start,
        stop=lambda reason: _stop_scheduler(server, reason),
        finished=server.stopped.wait,
        ready=lambda s: _scheduler_ready(s, token_file),
        ready_fd=ready_fd,
        role="scheduler",
    )


def _scheduler_ready(server: Any, token_file: str | None) -> dict[str, Any]:
    """What the scheduler tells its launcher once up; logs where its dashboard is."""
    if server.http_port is not None:
        from apportion.reprs import dashboard_link

        link = dashboard_link(server.address, server.http_port, None)
        where = "given by --token-file" if token_file else "in $APPORTION_TOKEN or its file"
        logger.info(
            "dashboard at %s (it asks for the cluster's token, %s; client.dashboard_link "
            "opens it signed in)",
            link,
            where if server.token else "none: --no-auth",
        )
    return {"address": server.address, "http_port": server.http_port}


async def _stop_scheduler(server: object, reason: str) -> None:
    logger.info("scheduler stopping: %s", reason)
    await server.close()  # type: ignore[attr-defined]


@main.command()
@click.argument("scheduler_address")
@click.option("--name", default=None, help="Unique worker name (default: its address).")
@click.option(
    "--nthreads",
    type=click.IntRange(min=1),
    default=None,
    help="Threads per worker process (at least 1; default: worker.nthreads, else 1).",
)
@click.option(
    "--nworkers",
    type=int,
    default=1,
    show_default=True,
    help="Worker processes to start; each gets the full --resources.",
)
@click.option(
    "--resources", default="", help='Resources of each worker, e.g. "GPU=2,MEMORY=100e9".'
)
@click.option("--host", default=None, help="Interface to listen on for peers.")
@click.option("--port", type=int, default=0, help="Port for peers (0: any free port).")
@click.option("--contact-host", default=None, help="Address others should reach this worker at.")
@click.option(
    "--memory-limit",
    default=None,
    help="Memory of each worker: bytes, '4GiB', '4GB', a fraction of the machine (0.5), "
    "'auto' (the machine's or container's memory divided among --nworkers) or 0 (no limit); "
    "default: worker.memory-limit ('auto'). Results are spilled to disk, and the worker "
    "paused and restarted, at fractions of it (docs/memory.md).",
)
@_token_options(
    "File holding the scheduler's token (never created here).",
    "if it exists",
    "Connect without a token.",
)
@_tls_options
@_log_level_option
@click.option("--ready-fd", type=int, default=None, hidden=True)
def worker(
    scheduler_address: str,
    name: str | None,
    nthreads: int | None,
    nworkers: int,
    resources: str,
    host: str | None,
    port: int,
    contact_host: str | None,
    memory_limit: str | None,
    token_file: str | None,
    no_auth: bool,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca_file: str | None,
    log_level: str | None,
    ready_fd: int | None,
) -> None:
    """Run worker process(es) connected to SCHEDULER_ADDRESS (tcp://HOST:PORT)."""
    try:
        declared = parse_spec(resources)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--resources") from None
    if nworkers < 1:
        raise click.BadParameter(f"must be at least 1, got {nworkers}", param_hint="--nworkers")
    try:
        limit = parse_memory_limit(
            config.get("worker.memory-limit") if memory_limit is None else memory_limit,
            nworkers,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--memory-limit") from None
    if nworkers > 1:
        _supervise(nworkers, name, log_level, limit)
        return
    setup_logging(log_level)
    _apply_tls(tls_cert, tls_key, tls_ca_file)
    try:
        token = connecting_token(token_file, no_auth)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    from apportion.worker.server import Worker

    server = Worker(
        scheduler_address,
        name=name,
        nthreads=nthreads,
        resources=declared,
        host=host,
        port=port,
        contact_host=contact_host,
        token=token,
        memory_limit=limit,
    )
    serve(
        start=server.start,
        stop=server.close,
        finished=lambda: _worker_failure(server),
        ready=lambda w: {"address": w.address, "name": w.name},
        ready_fd=ready_fd,
        role="worker",
    )


async def _worker_failure(server: Any) -> str | None:
    """Once the worker has finished: why it failed, or None when it stopped on purpose."""
    await server.finished.wait()
    return server.failure


def _supervise(
    nworkers: int, name: str | None, log_level: str | None, memory_limit: int | None = None
) -> None:
    """Run ``nworkers`` copies of this command, one worker each.

    A worker that crashes (or is killed) is restarted, with back-off while it keeps
    crashing; one that stops on purpose (it says so on its ready pipe before exiting: a
    signal, a retirement) is not, and an exit without that notice is a crash whatever its
    code (a task that called ``os._exit(0)``); one that cannot start (a wrong token, no
    scheduler in time) stops them all, with its reason, since the others would fail alike.
    """
    args = _without_option(sys.argv[1:], "--ready-fd")
    child_args = _without_option(_without_option(args, "--nworkers"), "--name")
    # Each child gets its share in bytes ("auto" was divided among them here).
    child_args = [*_without_option(child_args, "--memory-limit"), "--memory-limit"]
    child_args.append(str(memory_limit or 0))
    base = name or os.uname().nodename
    names = [f"{base}-{i}" for i in range(nworkers)]
    commands = [[sys.executable, "-m", "apportion", *child_args, "--name", n] for n in names]
    stopping = threading.Event()
    children: list[subprocess.Popen[bytes]] = []
    announcements: list[int] = []

    def launch(i: int) -> None:
        read_end, write_end = os.pipe()
        child = subprocess.Popen(
            [*commands[i], "--ready-fd", str(write_end)], pass_fds=(write_end,)
        )
        os.close(write_end)
        if i < len(children):  # the previous child's pipe was read and closed at its exit
            children[i], announcements[i] = child, read_end
        else:
            children.append(child)
            announcements.append(read_end)

    def forward(signum: int, _frame: object) -> None:
        stopping.set()
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    setup_logging(log_level)
    for i in range(nworkers):
        launch(i)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    backoffs = [RestartBackoff() for _ in children]
    restart_at: list[float | None] = [None] * nworkers
    running = set(range(nworkers))
    for backoff in backoffs:
        backoff.started(time.monotonic())
    while running and not stopping.wait(0.2):
        for i in sorted(running):
            child = children[i]
            if child.poll() is None or stopping.is_set():
                continue
            now = time.monotonic()
            if restart_at[i] is None:
                # It exited: its end of the pipe is closed, so this read returns.
                said = read_announcements(announcements[i])
                decision = after_exit(child.returncode, said_it_stopped(said))
                if decision == "done":
                    logger.info("worker %s stopped", names[i])
                    running.discard(i)
                    continue
                if decision == "stop":
                    reason = next((s["error"] for s in said if "error" in s), "see above")
                    forward(signal.SIGTERM, None)
                    for other in children:
                        other.wait()
                    click.echo(
                        f"apportion worker: stopping all {nworkers} workers: worker "
                        f"{names[i]} cannot start: {reason}",
                        err=True,
                    )
                    sys.exit(EXIT_STARTUP_FAILED)
                delay = backoffs[i].delay(now)
                restart_at[i] = now + delay
                logger.warning(
                    "worker %s exited with code %s%s; restarting it in %.1fs",
                    names[i],
                    child.returncode,
                    " without being asked to stop" if child.returncode == 0 else "",
                    delay,
                )
            if now >= (restart_at[i] or now):
                restart_at[i] = None
                backoffs[i].started(now)
                launch(i)
    sys.exit(max((child.wait() for child in children), default=0))


def _without_option(args: list[str], option: str) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


@main.command()
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Watch ResourceClusters in this namespace (repeatable).",
)
@click.option("--all-namespaces", is_flag=True, help="Watch every namespace.")
@click.option(
    "--liveness", default=None, help="Serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz."
)
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve the operator's Prometheus metrics at /metrics on this port.",
)
def operator(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    liveness: str | None,
    log_level: str,
    metrics_port: int | None,
) -> None:
    """Run the ResourceCluster operator (needs the 'kubernetes' extra)."""
    if bool(namespaces) == all_namespaces:
        raise click.UsageError("give --all-namespaces or at least one --namespace")
    try:
        import kopf

        import apportion.operator.handlers  # noqa: F401  (registers the handlers)
    except ImportError as exc:
        raise click.UsageError(
            f"the operator needs kopf and kubernetes: pip install 'apportion[kubernetes]' ({exc})"
        ) from None
    setup_logging(log_level)
    if metrics_port is not None:
        from apportion.operator.metrics import serve

        serve(metrics_port)
    kopf.run(
        standalone=True,
        clusterwide=all_namespaces,
        namespaces=list(namespaces),
        liveness_endpoint=liveness,
    )


@main.command()
@click.argument("name")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--port", default=8787, show_default=True, help="Local port of the dashboard.")
@click.option("--scheduler-port", default=8786, show_default=True, help="Local port for clients.")
@click.option("--kubeconfig", default=None, help="Kubeconfig file (default: the usual lookup).")
def dashboard(
    name: str, namespace: str, port: int, scheduler_port: int, kubeconfig: str | None
) -> None:
    """Port-forward the dashboard (and scheduler) of ResourceCluster NAME to this machine."""
    from apportion.kubernetes import serve_cluster

    sys.exit(serve_cluster(name, namespace, port, scheduler_port, kubeconfig))


@main.command(name="ssh")
@click.argument("hosts", nargs=-1, required=True)
@click.option("--nthreads", type=click.IntRange(min=1), default=None, help="Threads per worker.")
@click.option(
    "--nworkers", type=click.IntRange(min=0), default=1, show_default=True, help="Workers per host."
)
@click.option("--resources", default="", help='Resources of each worker, e.g. "GPU=2".')
@click.option("--memory-limit", default=None, help="Memory of each worker (as apportion worker).")
@click.option("--scheduler-port", type=click.IntRange(0, 65535), default=8786, show_default=True)
@click.option(
    "--dashboard-port", type=click.IntRange(0, 65535), default=8787, show_default=True,
    help="The dashboard's port (0: any free one).",
)  # fmt: skip
@click.option("--ssh-username", default=None, help="User on the hosts (default: yours).")
@click.option("--ssh-port", type=int, default=22, show_default=True)
@click.option("--ssh-private-key", default=None, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--known-hosts", default=None, type=click.Path(exists=True, dir_okay=False),
    help="Host keys to trust (default: ~/.ssh/known_hosts).",
)  # fmt: skip
@click.option(
    "--remote-python", default=None, help="Python on the hosts (default: this one's path)."
)
@click.option(
    "--token-file", type=click.Path(dir_okay=False), default=None,
    help=f"The cluster's token (created if missing). Default: $APPORTION_TOKEN, else "
    f"{default_token_file()}, created if missing; clients read it from there.",
)  # fmt: skip
def ssh(
    hosts: tuple[str, ...],
    nthreads: int | None,
    nworkers: int,
    resources: str,
    memory_limit: str | None,
    scheduler_port: int,
    dashboard_port: int,
    ssh_username: str | None,
    ssh_port: int,
    ssh_private_key: str | None,
    known_hosts: str | None,
    remote_python: str | None,
    token_file: str | None,
) -> None:
    """A scheduler on the first of HOSTS and workers on the others, over SSH, until
    Ctrl-C. Every host needs Python with apportion installed."""
    from apportion.ssh import SSHCluster, SSHClusterError

    setup_logging("WARNING")
    try:
        declared = parse_spec(resources)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--resources") from None
    if len(hosts) < 2:
        raise click.UsageError("give at least two hosts: the first runs the scheduler")
    try:
        token = scheduler_token(token_file, no_auth=False)
    except (OSError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    connect: dict[str, Any] = {"port": ssh_port}
    if ssh_username:
        connect["username"] = ssh_username
    if ssh_private_key:
        connect["client_keys"] = [ssh_private_key]
    if known_hosts:
        connect["known_hosts"] = known_hosts
    worker_options: dict[str, Any] = {"nthreads": nthreads, "n_workers": nworkers}
    worker_options["resources"] = declared
    if memory_limit is not None:
        worker_options["memory_limit"] = memory_limit
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        cluster = SSHCluster(
            list(hosts),
            connect_options=connect,
            worker_options=worker_options,
            scheduler_options={"port": scheduler_port, "http_port": dashboard_port},
            remote_python=remote_python,
            token=token,
        )
    except (SSHClusterError, ValueError, TypeError, TimeoutError) as exc:
        click.echo(f"apportion ssh: {exc}", err=True)
        sys.exit(EXIT_STARTUP_FAILED)
    with cluster:
        address = cluster.scheduler_address
        click.echo(f"Scheduler at {address}")
        click.echo(f"Dashboard: {cluster.dashboard_link.split('?')[0]}")
        click.echo(f"Workers: {len(cluster.workers)} on {', '.join(hosts[1:])}")
        if token_file:
            told = f"in {token_file}; with APPORTION_TOKEN_FILE={token_file}, Client({address!r})"
        elif os.environ.get("APPORTION_TOKEN"):
            told = f"$APPORTION_TOKEN; with it set, Client({address!r})"
        else:
            told = f"in {default_token_file()}; Client({address!r})"
        click.echo(f"Token: {told} reads it. Ctrl-C stops them all.")
        stop.wait()
        click.echo("apportion ssh: stopping the workers and the scheduler", err=True)


@main.command()
@click.option("--items", default=400, show_default=True, help="Files to load and process.")
def demo(items: int) -> None:
    """The GPU pipeline example on a local cluster: where tasks ran, peak resource use."""
    from apportion.demo import run_demo

    sys.exit(run_demo(items))


if __name__ == "__main__":
    main()
