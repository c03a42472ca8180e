"""SSHCluster: a scheduler and workers on other machines, started over SSH, as Dask's.

>>> cluster = SSHCluster(
...     ["sched-host", "gpu-host", "cpu-host"],
...     connect_options={"username": "me"},
...     worker_options=[{"resources": {"GPU": 2}}, {"nthreads": 8}],
... )
>>> client = Client(cluster)

The first host runs the scheduler, each other host a worker (``n_workers`` in its options:
more). Every host needs Python with apportion installed (``remote_python``: which
Python; by default this one's path). The cluster's token travels on each SSH channel's
standard input, never on a command line (apportion/ssh_remote.py runs on the host and
reads it); a server stops when its channel closes, so closing the cluster, or losing the
connection, stops them all. Needs the ``ssh`` extra (``pip install 'apportion[ssh]'``).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import re
import shlex
import sys
import threading
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from apportion.aio import background
from apportion.auth import generate_token
from apportion.cluster_base import Cluster
from apportion.errors import ApportionError
from apportion.protocol.comm import format_address, parse_address
from apportion.resources import format_resources, parse_spec, validate

logger = logging.getLogger("apportion.ssh")

T = TypeVar("T")

WORKER_OPTIONS = ("nthreads", "n_workers", "resources", "memory_limit", "host", "contact_host")
SCHEDULER_OPTIONS = ("port", "dashboard_address", "http_port", "host")
# Dask's scheduler serves its dashboard here; a scheduler that finds it taken takes any.
DASHBOARD_PORT = 8787
# Lines of a remote server's output kept, for the error when it fails to start.
KEPT_LINES = 200


class SSHClusterError(ApportionError, RuntimeError):
    """A host could not be reached, refused us, or could not start its server: the
    message names the host and what to do."""


# ------------------------------------------------------------------ pure decisions
def per_host(value: Any, hosts: list[str], what: str, kind: type = dict) -> list[Any]:
    """One ``what`` for each of ``hosts``: a single value for all of them, or a list of
    one per host."""
    if isinstance(value, list):
        if len(value) != len(hosts):
            raise ValueError(
                f"{what} is a list of {len(value)}, but there are {len(hosts)} hosts for it "
                f"({', '.join(hosts)}): give one per host, or one {kind.__name__} for all"
            )
        values = value
    else:
        values = [value] * len(hosts)
    for item in values:
        if not isinstance(item, kind):
            raise TypeError(
                f"{what} must be a {kind.__name__} (or a list, one per host), not {item!r}"
            )
    return list(values)


def check_options(options: dict[str, Any], known: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{what} has unknown keys {unknown}; it takes {', '.join(known)}")


def worker_resources(options: dict[str, Any]) -> dict[str, float]:
    """A worker's ``resources`` option: a dict, or a text such as "GPU=2,MEMORY=100e9"."""
    resources = options.get("resources") or {}
    if isinstance(resources, str):
        resources = parse_spec(resources)
    return validate(dict(resources), what="capacity")


def worker_count(options: dict[str, Any]) -> int:
    count = options.get("n_workers", 1)
    if type(count) is not int or count < 0:
        raise ValueError(f"n_workers must be a whole number >= 0, got {count!r}")
    return count


def scheduler_arguments(options: dict[str, Any], dashboard_port: int | None) -> list[str]:
    """``apportion scheduler``'s arguments: every interface of its host (workers and
    clients reach it by the host's name), the port asked for (any free one by default)."""
    args = ["scheduler", "--host", str(options.get("host", "")), "--port"]
    args.append(str(options.get("port", 0)))
    if dashboard_port is not None:
        args += ["--http-port", str(dashboard_port)]
    return args


def dashboard_port(options: dict[str, Any]) -> tuple[int | None, bool]:
    """The scheduler's HTTP port from Dask's ``dashboard_address`` (":8787", None: none)
    or ``http_port``, and whether it is only preferred (Dask's default, 8787)."""
    if "http_port" in options:
        return options["http_port"], False
    if "dashboard_address" not in options:
        return DASHBOARD_PORT, True
    address = options["dashboard_address"]
    if address is None:
        return None, False
    _, _, port = str(address).rpartition(":")
    if not port.isdigit():
        raise ValueError(
            f"dashboard_address {address!r} names no port: write ':8787', ':0' (any free "
            "port) or None (no dashboard)"
        )
    return int(port), False


def worker_arguments(scheduler: str, name: str, options: dict[str, Any]) -> list[str]:
    """``apportion worker``'s arguments for one worker of a host with these options."""
    args = ["worker", scheduler, "--name", name]
    if options.get("nthreads") is not None:
        args += ["--nthreads", str(options["nthreads"])]
    resources = worker_resources(options)
    if resources:
        args += ["--resources", ",".join(f"{k}={v!r}" for k, v in resources.items())]
    if options.get("memory_limit") is not None:
        args += ["--memory-limit", str(options["memory_limit"])]
    for option in ("host", "contact_host"):
        if options.get(option):
            args += [f"--{option.replace('_', '-')}", str(options[option])]
    return args


def remote_command(python: str, args: list[str]) -> str:
    """The command line run on a host (no secret in it: ``ps`` shows it to everyone)."""
    return shlex.join([python, "-m", "apportion.ssh_remote", *args])


def least_loaded(counts: list[int]) -> int:
    """The worker host (its index) that gets the next worker: the one with fewest, the
    first of those."""
    return min(range(len(counts)), key=lambda i: (counts[i], i))


def explain_connect_failure(host: str, port: int, username: str, exc: BaseException) -> str:
    """Why SSH to ``host`` failed, and what to do, in one sentence."""
    import asyncssh

    if isinstance(exc, asyncssh.PermissionDenied):
        return (
            f"{host} refused SSH authentication for user {username!r}: put your public key "
            f"in its ~/.ssh/authorized_keys (ssh-copy-id {username}@{host}), or give "
            "connect_options={'username': ..., 'client_keys': [...]}"
        )
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return (
            f"the SSH host key of {host} is not trusted ({exc.reason}): connect once with "
            f"ssh {host} to check and accept it, or give connect_options={{'known_hosts': FILE}}"
        )
    if isinstance(exc, (OSError, asyncio.TimeoutError)):
        code = getattr(exc, "errno", None)
        why = os.strerror(code) if code else str(exc) or type(exc).__name__
        return (
            f"cannot reach {host} over SSH (port {port}): {why}; check the host name, "
            "that sshd runs there and that the port is open to you"
        )
    reason = getattr(exc, "reason", None) or str(exc)
    return f"SSH to {host} failed: {reason}"


def explain_start_failure(
    host: str, role: str, python: str, code: int | None, output: list[str]
) -> str:
    """Why the ``role`` on ``host`` stopped before it was ready, and what to do."""
    text = "\n".join(output)
    no_such_file = "No such file or directory" in text and "Traceback" not in text
    if code == 127 or (python in text and no_such_file):
        return (
            f"{host}: there is no Python at {python!r}: install Python and apportion there, "
            "or give remote_python= the path of one that has them"
        )
    missing = re.search(r"No module named '?([\w.]+)", text)
    if missing and missing.group(1) == "apportion.ssh_remote":
        return (
            f"{host}: the apportion installed for {python} is older than this one and cannot "
            "be started over SSH: install the same version there"
        )
    if missing:
        return (
            f"{host}: apportion is not installed for {python} (no module {missing.group(1)!r}): "
            "pip install apportion there (the same version as here), or give remote_python= "
            "a Python that has it"
        )
    last = "\n  ".join(output[-15:]) or "(no output)"
    return f"the {role} on {host} exited with code {code} before it was ready; output:\n  {last}"


# ------------------------------------------------------------------------ the edge
@dataclass
class RemoteServer:
    """One ``apportion scheduler`` or ``worker`` on a host, through its SSH channel."""

    host: str
    host_index: int  # in the cluster's hosts
    role: str
    name: str
    process: Any  # asyncssh.SSHClientProcess
    output: deque[str] = field(default_factory=lambda: deque(maxlen=KEPT_LINES))
    ready: dict[str, Any] = field(default_factory=dict)
    exit_status: int | None = None
    stopping: bool = False
    drains: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.exit_status is None


class LoopThread:
    """An asyncio loop on a thread of its own, for asyncssh; the cluster's methods run
    coroutines on it and wait for their results."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="apportion-ssh")
        self._thread.daemon = True
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class SSHCluster(Cluster):
    """A scheduler on ``hosts[0]`` and workers on the other hosts, over SSH.

    ``connect_options``: asyncssh.connect's keywords (``username``, ``port``,
    ``client_keys``, ``known_hosts``, ...), one dict for all hosts or a list, one per host.
    ``worker_options``: for the worker hosts, one dict for all or a list of one per worker
    host: ``nthreads``, ``n_workers`` (workers on that host, default 1), ``resources``
    (``{"GPU": 2}`` or "GPU=2"), ``memory_limit``, ``host`` (interface to listen on),
    ``contact_host``. ``scheduler_options``: ``port`` (default: any free one),
    ``dashboard_address`` (":8787" by default, any free port when taken; None: none) or
    ``http_port``, ``host`` (interface; default every one). ``remote_python``: the Python
    to run on the hosts, one for all or a list (default: the path of this one).
    """

    def __init__(
        self,
        hosts: list[str],
        connect_options: dict[str, Any] | list[dict[str, Any]] | None = None,
        worker_options: dict[str, Any] | list[dict[str, Any]] | None = None,
        scheduler_options: dict[str, Any] | None = None,
        remote_python: str | list[str] | None = None,
        token: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        try:
            import asyncssh  # noqa: F401  (a clear error now, not on a thread later)
        except ImportError:
            raise ImportError("SSHCluster needs asyncssh: pip install 'apportion[ssh]'") from None
        if isinstance(hosts, str) or not hosts or len(hosts) < 2:
            raise ValueError(
                f"SSHCluster takes a list of at least two hosts, got {hosts!r}: the first runs "
                "the scheduler, the others workers (name a host twice to run a worker beside "
                "the scheduler: ['a', 'a', 'b'])"
            )
        self.hosts = [str(h) for h in hosts]
        self._connect_options = per_host(connect_options or {}, self.hosts, "connect_options")
        self._pythons = per_host(remote_python or sys.executable, self.hosts, "remote_python", str)
        worker_hosts = self.hosts[1:]
        self._worker_options = per_host(worker_options or {}, worker_hosts, "worker_options")
        for options in self._worker_options:
            check_options(options, WORKER_OPTIONS, "worker_options")
            worker_resources(options)
            worker_count(options)
        self._scheduler_options = dict(scheduler_options or {})
        check_options(self._scheduler_options, SCHEDULER_OPTIONS, "scheduler_options")
        self._dashboard = dashboard_port(self._scheduler_options)
        self.timeout = timeout
        self.token: str = token or generate_token()
        self._connections: list[Any] = [None] * len(self.hosts)
        self.workers: dict[str, RemoteServer] = {}
        self._scheduler: RemoteServer | None = None
        self._address = ""
        self.http_port: int | None = None
        self._next_index = 0
        self._lock = threading.RLock()
        self._loop = LoopThread()
        try:
            self._start_scheduler()
            counts = [worker_count(options) for options in self._worker_options]
            self._start_workers([i for i, count in enumerate(counts) for _ in range(count)])
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)

    # ------------------------------------------------------------ the interface
    @property
    def scheduler_address(self) -> str:
        return self._address

    def _http_port(self) -> int | None:
        return self.http_port

    def _scale_to(self, n: int) -> None:
        with self._lock:
            running = [w.name for w in self.workers.values() if w.running and not w.stopping]
            if n > len(running):
                counts = [0] * len(self._worker_options)
                for worker in self.workers.values():
                    if worker.running and not worker.stopping:
                        counts[worker.host_index - 1] += 1
                chosen = []
                for _ in range(n - len(running)):
                    index = least_loaded(counts)
                    counts[index] += 1
                    chosen.append(index)
                self._start_workers(chosen)
            elif n < len(running):
                retired = self._retire(running, len(running) - n)
                for name in retired:
                    self.workers[name].stopping = True
                self._loop.run(self._wait_for_exit([self.workers[n] for n in retired]))
                for name in retired:
                    self.workers.pop(name, None)
        self._wait_for_workers(n, self.timeout)

    def get_logs(self, n: int | None = None) -> dict[str, str]:
        """The last ``n`` log lines (default: all kept) of the scheduler (``"Scheduler"``)
        and of each worker (by name), each as one text."""
        names = {w.ready.get("address", ""): name for name, w in self.workers.items()}
        return self._server_logs(n, names)

    def _running_for_repr(self) -> str:
        return ", ".join(
            f"{w.name}({format_resources(worker_resources(self._options_of(w)))})"
            for w in list(getattr(self, "workers", {}).values())
            if w.running
        )

    def _options_of(self, worker: RemoteServer) -> dict[str, Any]:
        return dict(self._worker_options[worker.host_index - 1])

    def __enter__(self) -> SSHCluster:
        return self

    # --------------------------------------------------------------- starting
    def _start_scheduler(self) -> None:
        port, preferred = self._dashboard
        try:
            server = self._loop.run(self._launch(0, "scheduler", "scheduler", port))
        except SSHClusterError as exc:
            if not (preferred and "in use" in str(exc)):
                raise
            logger.info("port %s is taken on %s: dashboard on a free one", port, self.hosts[0])
            server = self._loop.run(self._launch(0, "scheduler", "scheduler", 0))
        self._scheduler = server
        _, port_now = parse_address(server.ready["address"])
        # Clients and workers reach the scheduler by the name we reached its host by.
        self._address = format_address(self._ssh_host(0), port_now)
        self.http_port = server.ready.get("http_port")

    def _start_workers(self, host_indices: list[int]) -> None:
        """Start one worker on each worker host listed (0: ``hosts[1]``), and wait for all."""
        launches = []
        for index in host_indices:
            host_index = index + 1
            name = f"{self._ssh_host(host_index)}-{self._next_index}"
            self._next_index += 1
            launches.append(self._launch(host_index, "worker", name, None))
        if not launches:
            return

        async def all_of() -> list[RemoteServer | BaseException]:
            return list(await asyncio.gather(*launches, return_exceptions=True))

        outcomes = self._loop.run(all_of())
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        for outcome in outcomes:
            if isinstance(outcome, RemoteServer):
                self.workers[outcome.name] = outcome
        if failures:
            raise failures[0]

    def _ssh_host(self, index: int) -> str:
        """The host name as SSH reaches it (an address without a user or port)."""
        host = self.hosts[index].rpartition("@")[2]
        return host.strip("[]")

    async def _ssh_connection(self, index: int) -> Any:
        import asyncssh

        if self._connections[index] is not None:
            return self._connections[index]
        options = {"connect_timeout": self.timeout, **self._connect_options[index]}
        user, _, host = self.hosts[index].rpartition("@")
        if user:
            options.setdefault("username", user)
        port = int(options.get("port", 22))
        try:
            connection = await asyncssh.connect(host, **options)
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
            username = str(options.get("username") or _local_user())
            raise SSHClusterError(explain_connect_failure(host, port, username, exc)) from None
        self._connections[index] = connection
        return connection

    async def _launch(
        self, index: int, role: str, name: str, http_port: int | None
    ) -> RemoteServer:
        """Start ``role`` on ``hosts[index]``, hand it the token, wait until it is ready."""
        connection = await self._ssh_connection(index)
        if role == "scheduler":
            args = scheduler_arguments(self._scheduler_options, http_port)
        else:
            args = worker_arguments(self._address, name, self._worker_options[index - 1])
        python = self._pythons[index]
        process = await connection.create_process(
            remote_command(python, args), encoding="utf-8", errors="replace"
        )
        server = RemoteServer(self.hosts[index], index, role, name, process)
        process.stdin.write(self.token + "\n")
        server.drains.append(asyncio.ensure_future(self._drain(server, process.stderr)))
        try:
            details = await asyncio.wait_for(self._readiness(server), self.timeout)
        except asyncio.TimeoutError:
            process.stdin.write_eof()
            raise SSHClusterError(
                f"the {role} on {self._ssh_host(index)} did not start within {self.timeout}s; "
                "its output:\n  " + "\n  ".join(list(server.output)[-15:])
            ) from None
        if details is None or "error" in details:
            await self._finish(server)
            if details is not None:
                raise SSHClusterError(
                    f"the {role} on {self._ssh_host(index)} could not start: {details['error']}"
                )
            raise SSHClusterError(
                explain_start_failure(
                    self._ssh_host(index), role, python, server.exit_status, list(server.output)
                )
            )
        server.ready = details
        server.drains.append(asyncio.ensure_future(self._drain(server, process.stdout)))
        background(self._watch(server))
        return server

    async def _readiness(self, server: RemoteServer) -> dict[str, Any] | None:
        """The server's readiness line (JSON on its standard output); None when its
        output ended first (it exited)."""
        while line := await server.process.stdout.readline():
            server.output.append(line.rstrip("\n"))
            try:
                details = json.loads(line)
            except ValueError:
                continue
            if isinstance(details, dict) and ("address" in details or "error" in details):
                return details
        return None

    @staticmethod
    async def _drain(server: RemoteServer, stream: Any) -> None:
        """Keep reading a server's output (an unread channel would stall it), keeping
        its last lines."""
        while line := await stream.readline():
            server.output.append(line.rstrip("\n"))

    async def _finish(self, server: RemoteServer) -> None:
        """Wait for the server's channel to close, and for its output to be read."""
        completed = await server.process.wait(check=False)
        server.exit_status = completed.exit_status
        if server.exit_status is None and completed.exit_signal:
            server.exit_status = 128
        await asyncio.gather(*server.drains, return_exceptions=True)

    async def _watch(self, server: RemoteServer) -> None:
        await self._finish(server)
        if not server.stopping and not self._closed:
            logger.warning(
                "the %s %s on %s exited with code %s; its last output:\n  %s",
                server.role,
                server.name,
                server.host,
                server.exit_status,
                "\n  ".join(list(server.output)[-15:]),
            )

    # --------------------------------------------------------------- stopping
    async def _wait_for_exit(self, servers: list[RemoteServer]) -> None:
        async def one(server: RemoteServer) -> None:
            try:
                await asyncio.wait_for(server.process.wait(check=False), self.timeout)
            except asyncio.TimeoutError:
                server.process.close()  # its launcher stops it when the channel closes

        await asyncio.gather(*(one(s) for s in servers))

    async def _stop(self, servers: list[RemoteServer]) -> None:
        """End each server's standard input: its launcher stops it; wait for them."""
        for server in servers:
            server.stopping = True
            if server.running:
                try:
                    server.process.stdin.write_eof()
                except Exception:  # the channel is closed already
                    pass
        await self._wait_for_exit(servers)

    async def _stop_all(self) -> None:
        await self._stop([w for w in self.workers.values()])
        if self._scheduler is not None:
            await self._stop([self._scheduler])
        for connection in self._connections:
            if connection is not None:
                connection.close()
                await connection.wait_closed()

    def _shut_down(self) -> None:
        atexit.unregister(self.close)
        loop = getattr(self, "_loop", None)
        if loop is None:
            return
        try:
            loop.run(self._stop_all(), timeout=2 * self.timeout + 10)
        except Exception as exc:
            logger.warning("stopping the SSH cluster: %s", exc)
        loop.stop()

    def _address_for_repr(self) -> str:
        return self._address or "?"


def _local_user() -> str:
    import getpass

    return getpass.getuser()
