"""LocalCluster: a scheduler and worker processes on this machine."""

from __future__ import annotations

import atexit
import enum
import json
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from apportion import config
from apportion.auth import TOKEN_ENV, generate_token
from apportion.backoff import RestartBackoff
from apportion.cluster_base import Cluster
from apportion.memory_limit import parse_memory_limit
from apportion.process import (
    PARENT_PID_ENV,
    after_exit,
    read_announcements,
    said_it_stopped,
)
from apportion.protocol.comm import parse_address
from apportion.protocol.frames import PROTOCOL_VERSION, ProtocolError, decode, encode
from apportion.protocol.reader import FrameReader
from apportion.resources import format_resources, validate

logger = logging.getLogger("apportion.local")


@dataclass
class WorkerProcess:
    name: str
    process: subprocess.Popen
    args: list[str]
    resources: dict[str, float] = field(default_factory=dict)
    address: str = ""
    restarts: int = 0
    # False for workers killed or closed on purpose, which must stay dead.
    supervised: bool = True
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    restart_at: float | None = None
    # Our end of its ready pipe, kept after the ready line: a worker that stops on purpose
    # says so there before exiting (see apportion/process.py).
    notices: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid


class _Default(enum.Enum):
    """An argument not given (None means "none" for some of them)."""

    VALUE = 0


DEFAULT = _Default.VALUE
# Where Dask's LocalCluster serves its dashboard, and so ours (a free port when taken).
DASHBOARD_PORT = 8787
WORKER_FIELDS = ("name", "nthreads", "resources", "memory_limit")


def usable_cpus() -> int:
    """The cores this process may run on (its affinity, as containers and taskset set it)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_shape(
    cpus: int, n_workers: int | None, threads_per_worker: int | None
) -> tuple[int, int]:
    """``(workers, threads each)`` over every core, as Dask chooses: up to 4 cores one
    worker each, else about sqrt(cores) workers; a given count sets the other."""
    if n_workers is None and threads_per_worker is None:
        if cpus <= 4:
            return cpus, 1
        workers = min(f for f in range(1, cpus + 1) if cpus % f == 0 and f * f >= cpus)
        return workers, cpus // workers
    if n_workers is None:
        assert threads_per_worker is not None
        return max(1, cpus // threads_per_worker), threads_per_worker
    if threads_per_worker is None:
        return n_workers, max(1, cpus // max(n_workers, 1))
    return n_workers, threads_per_worker


def dashboard_port(
    dashboard_address: str | int | _Default | None,
    http_port: int | _Default | None,
    host: str,
) -> tuple[int | None, bool]:
    """The HTTP port to ask the scheduler for, and whether it is only preferred (Dask's
    default, 8787: any free port when it is taken). None: no dashboard."""
    if http_port is not DEFAULT and dashboard_address is not DEFAULT:
        raise ValueError("give dashboard_address (Dask's spelling) or http_port, not both")
    if http_port is not DEFAULT:
        return http_port, False
    if dashboard_address is DEFAULT:
        return DASHBOARD_PORT, True
    if dashboard_address is None:
        return None, False
    if isinstance(dashboard_address, int) and not isinstance(dashboard_address, bool):
        return dashboard_address, False
    if not isinstance(dashboard_address, str):
        raise TypeError(
            f"dashboard_address must be ':PORT' or 'HOST:PORT' (or None), not {dashboard_address!r}"
        )
    where, _, port = dashboard_address.rpartition(":")
    if not port.isdigit():
        raise ValueError(
            f"dashboard_address {dashboard_address!r} names no port: write ':8787', "
            "':0' (any free port) or None (no dashboard)"
        )
    if where and where.strip("[]") not in (host, "localhost" if host == "127.0.0.1" else host):
        raise ValueError(
            f"dashboard_address {dashboard_address!r}: the dashboard is served on the "
            f"scheduler's interface, host={host!r}; give host= to change both"
        )
    return int(port), False


def port_is_free(host: str, port: int) -> bool:
    """Whether this process could listen on ``host:port`` now (as the scheduler will)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def worker_memory_argument(memory_limit: Any, nworkers: int = 1) -> str:
    """What ``apportion worker --memory-limit`` is given for LocalCluster's
    ``memory_limit``, in bytes ("0": no limit, as Dask's 0); None: the setting
    ``worker.memory-limit``. ``"auto"`` (the setting's default) shares the machine's (or the
    container's) memory among the ``nworkers`` workers, as Dask's does: each worker is a
    process of its own, whose own "auto" would take it all."""
    if isinstance(memory_limit, bool) or not isinstance(
        memory_limit, (int, float, str, type(None))
    ):
        raise TypeError(f"memory_limit must be bytes or a text such as '4GB', not {memory_limit!r}")
    if isinstance(memory_limit, (int, float)) and memory_limit < 0:
        raise ValueError(f"memory_limit must be >= 0, got {memory_limit!r}")
    value = config.get("worker.memory-limit") if memory_limit is None else memory_limit
    return str(parse_memory_limit(value, nworkers=nworkers) or 0)


IN_PROCESS_REFUSED = (
    "processes=False is not supported: apportion runs each worker in a process of its own "
    "(a worker's task threads, its resource ledger and its restart after a crash belong to "
    "that process, and the client side never imports the worker's code). "
    "LocalCluster(n_workers=1, threads_per_worker=N) is the nearest: one worker, N threads."
)


class LocalCluster(Cluster):
    """A scheduler plus worker processes on this machine, with an auth token of its own.

    >>> LocalCluster()                 # workers x threads over every core, as Dask's
    >>> LocalCluster(n_workers=2, threads_per_worker=1, resources={"GPU": 1})
    >>> LocalCluster(workers=[{"name": "gpu-a", "nthreads": 4, "resources": {"GPU": 2}},
    ...                       {"name": "bigmem", "resources": {"MEMORY": 100e9}}])

    Dask's arguments mean what they mean there: ``memory_limit`` (per worker: bytes, a
    text such as "4GB", a fraction of the machine, or "auto": the machine's memory shared
    among the workers; None: the setting ``worker.memory-limit``, "auto" by default; 0: no
    limit), ``dashboard_address`` (":8787" by default, a
    free port when that one is taken; None: no dashboard; ``http_port`` is the same as a
    number), ``processes`` (only True: see ``IN_PROCESS_REFUSED``), ``silence_logs``.

    Its processes log to this process's stderr at ``log_level`` (default: the setting
    ``logging.level``, else WARNING), so that a program's output is its own.
    """

    def __init__(
        self,
        n_workers: int | None = None,
        threads_per_worker: int | None = None,
        processes: bool | None = None,
        memory_limit: str | float | None = None,
        dashboard_address: str | int | _Default | None = DEFAULT,
        resources: dict[str, float] | None = None,
        workers: list[dict[str, Any]] | None = None,
        host: str | None = None,
        scheduler_port: int = 0,
        http_port: int | _Default | None = DEFAULT,
        token: str | None = None,
        timeout: float = 60.0,
        log_level: str | None = None,
        silence_logs: int | str | bool | None = None,
    ) -> None:
        if workers is not None and n_workers is not None:
            raise ValueError(
                "give either n_workers (identical workers) or workers (a list), not both"
            )
        if processes is False:
            raise ValueError(IN_PROCESS_REFUSED)
        for name, value in (("n_workers", n_workers), ("threads_per_worker", threads_per_worker)):
            least = 0 if name == "n_workers" else 1
            if value is not None and (type(value) is not int or value < least):
                raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")
        host = host or "127.0.0.1"
        self.host = host
        self.timeout = timeout
        self.token: str = token or generate_token()
        self.log_level = _log_level(log_level, silence_logs)
        self.memory_limit = memory_limit
        defaults = {**(config.get("worker.resources", {}) or {}), **(resources or {})}
        if workers is None:
            count, threads = default_shape(usable_cpus(), n_workers, threads_per_worker)
            self.threads_per_worker = threads
            workers = [{"nthreads": threads, "resources": defaults} for _ in range(count)]
        else:
            self.threads_per_worker = threads_per_worker or 1
        # What scale() starts more of: the shape of n_workers' workers, else the first given.
        first = workers[0] if workers else {}
        self._template_threads = int(first.get("nthreads") or self.threads_per_worker)
        self._template_resources = {**defaults, **(first.get("resources") or {})}
        self._specs = [
            self._normalise(i, spec, defaults, self.threads_per_worker, memory_limit, len(workers))
            for i, spec in enumerate(workers)
        ]
        self._next_index = len(self._specs)
        self.workers: dict[str, WorkerProcess] = {}
        self._env = self._child_env()
        port, preferred = dashboard_port(dashboard_address, http_port, host)
        if preferred and port is not None and not port_is_free(host, port):
            logger.info("port %d is in use: serving the dashboard on a free port", port)
            port = 0
        args = ["scheduler", "--host", host, "--port", str(scheduler_port)]
        if port is not None:
            args += ["--http-port", str(port)]
        launched = self._spawn(args)
        self._scheduler_process = launched[0]
        # Shared with the finalizer (which must not hold self): every process we started,
        # schedulers (one per restart) and workers.
        self._schedulers: list[subprocess.Popen] = [self._scheduler_process]
        self._children: dict[str, subprocess.Popen] = {}
        self._finalizer = weakref.finalize(self, _terminate, self._schedulers, self._children)
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        try:
            try:
                ready = self._await_ready([("scheduler", launched)])
            except RuntimeError:
                if not preferred:
                    raise
                # The preferred port was taken between our look and the scheduler's bind.
                launched = self._spawn([*args[:-1], "0"])
                self._scheduler_process = launched[0]
                self._schedulers.append(launched[0])
                ready = self._await_ready([("scheduler", launched)])
            self._address: str = ready["scheduler"]["address"]
            self.http_port: int | None = ready["scheduler"].get("http_port")
            # A restarted scheduler listens where this one does: its ports, now chosen.
            port_now = str(parse_address(self._address)[1])
            self._scheduler_args = ["scheduler", "--host", host, "--port", port_now]
            if self.http_port is not None:
                self._scheduler_args += ["--http-port", str(self.http_port)]
            self.start_workers(self._specs)
        except BaseException:
            self.close()
            raise
        self._supervisor = threading.Thread(
            target=self._supervise, name="apportion-nanny", daemon=True
        )
        self._supervisor.start()
        atexit.register(self.close)

    @property
    def scheduler_address(self) -> str:
        return self._address

    @staticmethod
    def _normalise(
        index: int,
        spec: dict[str, Any],
        defaults: dict[str, float],
        nthreads: int,
        memory_limit: Any = None,
        nworkers: int = 1,
    ) -> dict[str, Any]:
        unknown = set(spec) - set(WORKER_FIELDS)
        if unknown:
            raise ValueError(
                f"worker spec {spec!r} has unknown fields {sorted(unknown)}; "
                f"use {', '.join(WORKER_FIELDS)}"
            )
        threads = spec.get("nthreads") or nthreads
        if type(threads) is not int or threads < 1:
            raise ValueError(f"worker spec {spec!r}: nthreads must be a whole number >= 1")
        return {
            "name": str(spec.get("name") or f"worker-{index}"),
            "nthreads": threads,
            "resources": validate({**defaults, **(spec.get("resources") or {})}, what="capacity"),
            "memory_limit": worker_memory_argument(
                spec.get("memory_limit", memory_limit), nworkers
            ),
        }

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[TOKEN_ENV] = self.token
        env[PARENT_PID_ENV] = str(os.getpid())
        # Settings made with apportion.config.set in this process apply to the workers too.
        env[config.INHERITED_ENV] = json.dumps(config.snapshot(), default=str)
        return env

    def _spawn(self, args: list[str]) -> tuple[subprocess.Popen, int]:
        read_end, write_end = os.pipe()
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "apportion", *args),
                *("--log-level", self.log_level, "--ready-fd", str(write_end)),
            ],
            env=self._env,
            pass_fds=(write_end,),
            stdin=subprocess.DEVNULL,
        )
        os.close(write_end)
        return process, read_end

    def _await_ready(
        self,
        launched: list[tuple[str, tuple[subprocess.Popen, int]]],
        keep: dict[str, int] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Read each child's JSON readiness line, failing clearly if one dies or hangs.
        With ``keep``, the pipes of the children that are ready stay open, by name, for
        their stop notices; the others are closed."""
        pending = {fd: (name, proc) for name, (proc, fd) in launched}
        buffers: dict[int, bytes] = dict.fromkeys(pending, b"")
        ready: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + self.timeout
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted(name for name, _ in pending.values())
                    raise TimeoutError(f"{names} did not start within {self.timeout}s")
                readable, _, _ = select.select(list(pending), [], [], min(left, 0.5))
                for fd in readable:
                    chunk = os.read(fd, 65536)
                    name, proc = pending[fd]
                    if not chunk:
                        code = proc.wait(timeout=5)
                        raise RuntimeError(
                            f"{name} exited with code {code} before it was ready; its log is above"
                        )
                    buffers[fd] += chunk
                    if buffers[fd].endswith(b"\n"):
                        details = json.loads(buffers[fd])
                        del pending[fd]
                        if keep is None or "error" in details:
                            os.close(fd)
                        else:
                            keep[name] = fd
                        if "error" in details:
                            raise RuntimeError(f"{name} could not start: {details['error']}")
                        ready[name] = details
        finally:
            for fd in pending:
                os.close(fd)
        return ready

    # ------------------------------------------------------------------ workers
    def start_workers(self, specs: list[dict[str, Any]]) -> list[WorkerProcess]:
        """Start more workers (each ``{"name", "nthreads", "resources"}``) and wait for them."""
        total = len(self.workers) + len(specs)
        specs = [
            self._normalise(len(self.workers) + i, s, {}, 1, nworkers=total)
            for i, s in enumerate(specs)
        ]
        self._next_index = max(self._next_index, len(self.workers) + len(specs))
        clash = [s["name"] for s in specs if s["name"] in self.workers]
        if clash:
            raise ValueError(f"workers named {clash} already exist in this cluster")
        launched = []
        with self._lock:
            for spec in specs:
                args = [
                    "worker",
                    self.scheduler_address,
                    "--name",
                    spec["name"],
                    "--nthreads",
                    str(spec["nthreads"]),
                    "--host",
                    self.host,
                ]
                if spec["memory_limit"] is not None:
                    args += ["--memory-limit", spec["memory_limit"]]
                if spec["resources"]:
                    args += [
                        "--resources",
                        ",".join(f"{k}={v!r}" for k, v in spec["resources"].items()),
                    ]
                process, fd = self._spawn(args)
                launched.append((spec["name"], (process, fd)))
                self.workers[spec["name"]] = WorkerProcess(
                    spec["name"], process, args, spec["resources"]
                )
                self._children[spec["name"]] = process
        notices: dict[str, int] = {}
        ready = self._await_ready(launched, notices)
        for name, details in ready.items():
            self.workers[name].address = details["address"]
            self.workers[name].notices = notices[name]
        return [self.workers[name] for name, _ in launched]

    def kill_worker(self, name: str, restart: bool = False) -> None:
        """SIGKILL one worker process, as a crash would; ``restart`` lets the nanny revive it.

        The scheduler treats it as a crash (its tasks rerun elsewhere, its results are
        recomputed) but, told beforehand, logs it as planned rather than warning.
        """
        _tell_scheduler(self.scheduler_address, self.token, {"op": "expect-leave", "name": name})
        with self._lock:
            worker = self.workers[name] if restart else self.workers.pop(name)
            worker.supervised = restart
            worker.process.send_signal(signal.SIGKILL)
        worker.process.wait(timeout=10)

    # ---------------------------------------------------------------- scheduler
    def kill_scheduler(self) -> None:
        """SIGKILL the scheduler process, as a crash or an OOM kill would. Workers keep
        their results and runs and keep reconnecting; clients keep their futures pending
        and keep reconnecting (see ``restart_scheduler``)."""
        with self._lock:
            process = self._scheduler_process
            process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def restart_scheduler(self, kill: bool = True) -> None:
        """Start a new scheduler on the same address (killing the current one first, with
        ``kill``); it rebuilds its state from the workers' and clients' reports."""
        if kill and self._scheduler_process.poll() is None:
            self.kill_scheduler()
        with self._lock:
            launched = self._spawn(self._scheduler_args)
            self._scheduler_process = launched[0]
            self._schedulers.append(launched[0])
        self._await_ready([("scheduler", launched)])

    def _supervise(self) -> None:
        """Restart worker processes that die unexpectedly (as a nanny would)."""
        while not self._stopping.wait(0.1):
            with self._lock:
                dead = [
                    w
                    for w in self.workers.values()
                    if w.supervised and w.process.poll() is not None
                ]
            for worker in dead:
                if self._stopping.is_set():
                    return
                now = time.monotonic()
                if worker.restart_at is None:  # it exited since we last looked
                    decision = after_exit(worker.process.returncode, self._said_it_stopped(worker))
                else:  # decided at its exit; the back-off is under way
                    decision = "restart"
                if decision != "restart":
                    # Stopped on purpose (retired, say), or it cannot start: leave it be.
                    worker.supervised = False
                    log = logger.info if decision == "done" else logger.error
                    log(
                        "worker %s exited with code %s; not restarting it",
                        worker.name,
                        worker.process.returncode,
                    )
                    continue
                if worker.restart_at is None:
                    worker.restart_at = now + worker.backoff.delay(now)
                    logger.warning(
                        "worker %s exited with code %s; restarting it in %.1fs",
                        worker.name,
                        worker.process.returncode,
                        worker.restart_at - now,
                    )
                if now < worker.restart_at:
                    continue
                worker.restart_at = None
                worker.backoff.started(now)
                with self._lock:
                    process, fd = self._spawn(worker.args)
                    worker.process = process
                    worker.restarts += 1
                    self._children[worker.name] = process
                try:
                    notices: dict[str, int] = {}
                    worker.address = self._await_ready([(worker.name, (process, fd))], notices)[
                        worker.name
                    ]["address"]
                    worker.notices = notices[worker.name]
                except (RuntimeError, TimeoutError) as exc:
                    logger.error("restarting worker %s failed: %s", worker.name, exc)

    @property
    def worker_pids(self) -> dict[str, int]:
        return {name: w.pid for name, w in self.workers.items()}

    # ---------------------------------------------------------------- lifecycle
    @staticmethod
    def _said_it_stopped(worker: WorkerProcess) -> bool:
        """Whether a worker that exited said it stopped on purpose (read once: the pipe
        is closed after). An exit without saying so (a task that called ``os._exit(0)``)
        is a crash whatever its code."""
        if worker.notices is None:
            return True  # it never got as far as being ready: its exit code tells
        notices, worker.notices = worker.notices, None
        return said_it_stopped(read_announcements(notices))

    def _shut_down(self) -> None:
        atexit.unregister(self.close)
        self._stopping.set()
        with self._lock:
            self._finalizer()
            for worker in self.workers.values():
                if worker.notices is not None:
                    os.close(worker.notices)
                    worker.notices = None

    def __enter__(self) -> LocalCluster:
        return self

    def _http_port(self) -> int | None:
        return self.http_port

    # ------------------------------------------------------------------ sizing
    def scale(self, n: int | None = None, *, cores: int | None = None) -> None:
        """Run ``n`` workers (or enough for ``cores`` threads), like the first ones:
        new ones start and are waited for; surplus ones are retired (idle ones first,
        their results moved to workers that stay) and exit."""
        if (n is None) == (cores is None):
            raise TypeError("scale takes a number of workers, or cores=")
        if cores is not None:
            n = math.ceil(cores / self._template_threads)
        assert n is not None
        super().scale(n)

    def _scale_to(self, n: int) -> None:
        with self._lock:
            running = [w.name for w in self.workers.values() if w.supervised]
        if n > len(running):
            specs = []
            for _ in range(n - len(running)):
                specs.append(
                    {
                        "name": f"worker-{self._next_index}",
                        "nthreads": self._template_threads,
                        "resources": self._template_resources,
                    }
                )
                self._next_index += 1
            self.start_workers([{**spec, "memory_limit": self.memory_limit} for spec in specs])
        elif n < len(running):
            for name in self._retire(running, len(running) - n):
                self._forget(name)
        self._wait_for_workers(n, self.timeout)

    def _forget(self, name: str) -> None:
        """Let a retired worker's process exit and drop it from the cluster."""
        with self._lock:
            worker = self.workers.get(name)
            if worker is None:
                return
            worker.supervised = False
        try:
            worker.process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()
        with self._lock:
            self.workers.pop(name, None)
            self._children.pop(name, None)
            if worker.notices is not None:
                os.close(worker.notices)
                worker.notices = None

    # ----------------------------------------------------------- observability
    def get_logs(self, n: int | None = None) -> dict[str, str]:
        """The last ``n`` log lines (default: all kept) of the scheduler (``"Scheduler"``)
        and of each worker (by name), each as one text."""
        names = {w.address: name for name, w in self.workers.items()}
        return self._server_logs(n, names)

    def _running_for_repr(self) -> str:
        """The workers running now (not those killed, retired or closed)."""
        return ", ".join(
            f"{w.name}({format_resources(w.resources)})"
            for w in list(getattr(self, "workers", {}).values())
            if w.process.poll() is None
        )


def _log_level(log_level: str | None, silence_logs: int | str | bool | None) -> str:
    """The level LocalCluster's processes print at: ``log_level``, else Dask's
    ``silence_logs`` (a level; False: INFO), else ``logging.level``, else WARNING."""
    if log_level is None and silence_logs is not None:
        if silence_logs is False:
            log_level = "INFO"
        elif silence_logs is True:
            log_level = "WARNING"
        elif isinstance(silence_logs, int):
            log_level = logging.getLevelName(silence_logs)
        else:
            log_level = silence_logs
    level = str(log_level or config.get("logging.level") or "WARNING").upper()
    if not isinstance(logging.getLevelName(level), int):
        raise ValueError(f"unknown log level {level!r}: use DEBUG, INFO, WARNING or ERROR")
    return level


def _tell_scheduler(address: str, token: str, message: dict[str, Any]) -> None:
    """Send one message as a short-lived client and wait for its reply (best effort: a
    scheduler that cannot be reached this way just is not told)."""
    if not address.startswith("tcp://"):
        return  # TLS: not worth a handshake for a log line
    hello = {"op": "hello", "role": "client", "protocol": PROTOCOL_VERSION, "token": token}
    reader = FrameReader(1 << 20)
    try:
        with socket.create_connection(parse_address(address), timeout=10) as sock:
            sock.sendall(encode([hello]) + encode([{**message, "id": 1}]))
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                reader.feed(chunk)
                while reader.frames:
                    if any(m["op"].endswith("-reply") for m in decode(reader.pop())):
                        sock.sendall(encode([{"op": "close"}]))
                        return
    except (OSError, ProtocolError) as exc:
        logger.debug("could not tell the scheduler %r: %s", message, exc)


def _terminate(schedulers: list[subprocess.Popen], workers: dict[str, subprocess.Popen]) -> None:
    """Stop workers first (so they leave cleanly), then the scheduler; kill stragglers."""
    for group in (list(workers.values()), schedulers):
        for process in group:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 5
        for process in group:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
