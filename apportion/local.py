"""LocalCluster: a scheduler and worker processes on this machine."""

from __future__ import annotations

import atexit
import json
import logging
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
from apportion.process import (
    LOG_LEVEL_ENV,
    PARENT_PID_ENV,
    after_exit,
    read_announcements,
    said_it_stopped,
)
from apportion.protocol.comm import parse_address
from apportion.protocol.frames import PROTOCOL_VERSION, ProtocolError, decode, encode
from apportion.protocol.reader import FrameReader
from apportion.reprs import dashboard_link, summary_html
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


class LocalCluster:
    """A scheduler plus worker processes on this machine, with an auth token of its own.

    >>> LocalCluster(n_workers=2, threads_per_worker=1, resources={"GPU": 1})
    >>> LocalCluster(workers=[{"name": "gpu-a", "nthreads": 4, "resources": {"GPU": 2}},
    ...                       {"name": "bigmem", "resources": {"MEMORY": 100e9}}])

    Its processes log to this process's stderr at ``log_level`` (default: WARNING, or
    ``$APPORTION_LOG_LEVEL`` when set), so that a program's output is its own.
    """

    def __init__(
        self,
        n_workers: int | None = None,
        threads_per_worker: int = 1,
        resources: dict[str, float] | None = None,
        workers: list[dict[str, Any]] | None = None,
        host: str = "127.0.0.1",
        scheduler_port: int = 0,
        http_port: int | None = None,
        token: str | None = None,
        timeout: float = 60.0,
        log_level: str | None = None,
    ) -> None:
        if workers is not None and n_workers is not None:
            raise ValueError(
                "give either n_workers (identical workers) or workers (a list), not both"
            )
        self.host = host
        self.timeout = timeout
        self.token = token or generate_token()
        self.log_level = (log_level or os.environ.get(LOG_LEVEL_ENV) or "WARNING").upper()
        defaults = {**(config.get("worker.resources", {}) or {}), **(resources or {})}
        if workers is None:
            count = n_workers if n_workers is not None else min(4, os.cpu_count() or 1)
            workers = [
                {"nthreads": threads_per_worker, "resources": defaults} for _ in range(count)
            ]
        self._specs = [
            self._normalise(i, spec, defaults, threads_per_worker) for i, spec in enumerate(workers)
        ]
        self.workers: dict[str, WorkerProcess] = {}
        self._env = self._child_env()
        self._closed = False
        args = ["scheduler", "--host", host, "--port", str(scheduler_port)]
        if http_port is not None:
            args += ["--http-port", str(http_port)]
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
            ready = self._await_ready([("scheduler", launched)])
            self.scheduler_address: str = ready["scheduler"]["address"]
            self.http_port: int | None = ready["scheduler"].get("http_port")
            # A restarted scheduler listens where this one does: its ports, now chosen.
            port = str(parse_address(self.scheduler_address)[1])
            self._scheduler_args = ["scheduler", "--host", host, "--port", port]
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

    @staticmethod
    def _normalise(
        index: int, spec: dict[str, Any], defaults: dict[str, float], nthreads: int
    ) -> dict[str, Any]:
        unknown = set(spec) - {"name", "nthreads", "resources"}
        if unknown:
            raise ValueError(
                f"worker spec {spec!r} has unknown fields {sorted(unknown)}; "
                "use name, nthreads, resources"
            )
        return {
            "name": str(spec.get("name") or f"worker-{index}"),
            "nthreads": int(spec.get("nthreads") or nthreads),
            "resources": validate({**defaults, **(spec.get("resources") or {})}, what="capacity"),
        }

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[TOKEN_ENV] = self.token
        env[PARENT_PID_ENV] = str(os.getpid())
        env[LOG_LEVEL_ENV] = self.log_level
        # Settings made with apportion.config.set in this process apply to the workers too.
        env[config.INHERITED_ENV] = json.dumps(config.snapshot(), default=str)
        return env

    def _spawn(self, args: list[str]) -> tuple[subprocess.Popen, int]:
        read_end, write_end = os.pipe()
        process = subprocess.Popen(
            [sys.executable, "-m", "apportion", *args, "--ready-fd", str(write_end)],
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
        specs = [self._normalise(len(self.workers) + i, s, {}, 1) for i, s in enumerate(specs)]
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

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
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

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def dashboard_link(self) -> str | None:
        """The dashboard, signed in (only with ``http_port``: e.g. ``http_port=0``)."""
        return dashboard_link(self.scheduler_address, self.http_port, self.token)

    def _repr_html_(self) -> str:
        specs = {s["name"]: {"name": s["name"], **s} for s in self._specs}
        info = {"workers": specs, "clients": 0, "tasks": {}}
        return summary_html("LocalCluster", self.scheduler_address, self.dashboard_link, info)

    def __repr__(self) -> str:
        """The workers running now (not those killed or closed)."""
        parts = ", ".join(
            f"{w.name}({format_resources(w.resources)})"
            for w in list(getattr(self, "workers", {}).values())
            if w.process.poll() is None
        )
        port = getattr(self, "http_port", None)
        dashboard = f" dashboard: http://{self.host}:{port}/dashboard" if port else ""
        return (
            f"<LocalCluster {getattr(self, 'scheduler_address', '?')} workers: {parts}{dashboard}>"
        )


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
