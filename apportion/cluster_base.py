"""``Cluster``: what every cluster answers, as Dask's ``Cluster`` does.

``LocalCluster`` (apportion/local.py) and ``KubeCluster`` (apportion/kubernetes.py) derive
from it: ``scale(n)``, ``adapt(minimum, maximum)``, ``get_logs()``, ``dashboard_link``
(a string, "" when the scheduler serves no dashboard), ``scheduler_address``,
``scheduler_info``, ``scheduler`` (a view of the scheduler for introspection), ``close()``,
``with`` blocks, and the text and HTML reprs. The cluster's own questions to its scheduler
go over one connection of its own, opened when first needed and closed with the cluster.

``adapt`` sizes a cluster from the work waiting for it: ``adaptive_target`` decides (a
pure function of what the scheduler reports), an ``Adaptive`` thread asks and scales.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from apportion.cluster_ops import run_on_workers
from apportion.logs import line_count, recent_lines
from apportion.reprs import cluster_html, cluster_text, dashboard_link, summarise
from apportion.session import Session

logger = logging.getLogger("apportion.cluster")

# How long a repr waits for the scheduler before showing what it knows without it.
REPR_TIMEOUT = 2.0


@dataclass(frozen=True)
class WorkerView:
    """One worker as the scheduler sees it (``cluster.scheduler.workers[address]``)."""

    name: str
    address: str
    nthreads: int
    resources: dict[str, float]
    memory_limit: int | None


class SchedulerView:
    """The scheduler of a cluster, for introspection: it runs in a process of its own,
    so each attribute is read from it when asked."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster

    @property
    def address(self) -> str:
        return self._cluster.scheduler_address

    @property
    def workers(self) -> dict[str, WorkerView]:
        """The connected workers, by address."""
        return {
            address: WorkerView(
                name=str(w.get("name")),
                address=address,
                nthreads=int(w.get("nthreads") or 0),
                resources=dict(w.get("resources") or {}),
                memory_limit=w.get("memory_limit"),
            )
            for address, w in self._cluster.scheduler_info["workers"].items()
        }

    @property
    def tasks(self) -> dict[str, int]:
        """How many tasks are in each state."""
        return dict(self._cluster.scheduler_info.get("tasks") or {})

    @property
    def clients(self) -> int:
        return int(self._cluster.scheduler_info.get("clients") or 0)

    def __repr__(self) -> str:
        return f"<Scheduler {self.address}>"


class Cluster(ABC):
    """A scheduler and its workers, started and sized from Python."""

    token: str | None = None
    _closed = False
    _connection: Session | None = None
    _adaptive: Adaptive | None = None

    # ------------------------------------------------------ what each cluster says
    @property
    @abstractmethod
    def scheduler_address(self) -> str:
        """Where a Client connects."""

    @abstractmethod
    def _scale_to(self, n: int) -> None:
        """Run ``n`` workers: start more, or retire some (idle ones first)."""

    @abstractmethod
    def get_logs(self) -> dict[str, str]:
        """The recent log of the scheduler and of each worker, by name."""

    @abstractmethod
    def _http_port(self) -> int | None:
        """The port of the scheduler's dashboard as seen from here; None: none served."""

    @abstractmethod
    def _shut_down(self) -> None:
        """Stop the scheduler and the workers (after the cluster's connection is closed)."""

    # ------------------------------------------------------------- shared by all
    @property
    def dashboard_link(self) -> str:
        """The dashboard, signed in with the cluster's token; "" when none is served."""
        return dashboard_link(self.scheduler_address, self._http_port(), self.token) or ""

    def _session(self, timeout: float = 10.0) -> Session:
        """The cluster's own connection to its scheduler (opened on first use)."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        if self._connection is None or self._connection.closed:
            session = Session(self.scheduler_address, self.token, self)
            session.connect(timeout)
            self._connection = session
        return self._connection

    def _request(self, message: dict[str, Any], timeout: float | None = 60.0) -> dict[str, Any]:
        session = self._session(10.0 if timeout is None else min(timeout, 10.0))
        reply = dict(session.request(message, timeout=timeout))
        if "error" in reply:
            raise ValueError(reply["error"])
        return reply

    def _info(self, timeout: float | None = 60.0) -> dict[str, Any]:
        reply = self._request({"op": "info"}, timeout)
        for field in ("op", "id"):
            reply.pop(field, None)
        return reply

    @property
    def scheduler_info(self) -> dict[str, Any]:
        """What the scheduler reports now: workers (name, nthreads, resources, memory
        limit, ...), task counts, waiting demands, its HTTP port."""
        return self._info()

    @property
    def scheduler(self) -> SchedulerView:
        return SchedulerView(self)

    def _retire(self, names: list[str], count: int) -> list[str]:
        """Retire ``count`` of the named workers (idle ones first; their results move to
        workers staying) and let them exit; the names retired."""
        request = {"op": "retire", "names": names, "count": count, "close": True}
        return list(self._request(request, timeout=None)["retired"])

    def _wait_for_workers(self, n: int, timeout: float) -> None:
        """Return once the scheduler counts ``n`` workers in service, as scale promises
        (a worker is ready a moment before the scheduler has registered it)."""
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            workers = self._info()["workers"].values()
            if sum(1 for w in workers if not w.get("retiring")) == n:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler did not see {n} workers within {timeout}s")
            time.sleep(delay)  # polling the scheduler, backing off
            delay = min(delay * 2, 0.25)

    def _server_logs(self, n: int | None, names: dict[str, str]) -> dict[str, str]:
        """The last ``n`` log lines (None: all kept) of the scheduler (``"Scheduler"``) and
        of each worker, by its name in ``names`` (by address), else by its address."""
        count = line_count(n)
        logs = {"Scheduler": "\n".join(self._request({"op": "logs", "n": count})["lines"])}
        session = self._session()
        lines = run_on_workers(session, session.functions.dumps(recent_lines), (count,))
        for address, kept in sorted(lines.items()):
            logs[names.get(address, address)] = "\n".join(kept)
        return logs

    def scale(self, n: int) -> None:
        """Run ``n`` workers (adapting stops: the size is yours again)."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"scale takes a number of workers >= 0, got {n!r}")
        self._stop_adapting()
        self._scale_to(n)

    def adapt(
        self, minimum: int = 0, maximum: int | float = math.inf, interval: float = 1.0
    ) -> Adaptive | None:
        """Size the cluster from its work, between ``minimum`` and ``maximum`` workers,
        until ``scale`` is called or the cluster closes."""
        self._stop_adapting()
        self._adaptive = Adaptive(self, minimum, maximum, interval)
        return self._adaptive

    def _stop_adapting(self) -> None:
        if self._adaptive is not None:
            self._adaptive.stop()
            self._adaptive = None

    def close(self) -> None:
        """Stop adapting, close the cluster's connection, stop the scheduler and workers."""
        if self._closed:
            return
        self._stop_adapting()
        if self._connection is not None:
            self._connection.close()
        self._shut_down()
        self._closed = True

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------------- reprs
    def _reported_workers(self) -> dict[str, dict[str, Any]] | None:
        """The workers the scheduler reports, or None when it does not answer soon."""
        try:
            return dict(self._info(timeout=REPR_TIMEOUT)["workers"])
        except Exception:  # a repr shows what it can; the cause shows on real calls
            return None

    def _link_for_repr(self) -> str:
        try:
            return self.dashboard_link
        except Exception:
            return ""

    def _address_for_repr(self) -> str:
        try:
            return self.scheduler_address
        except Exception:
            return "?"

    def _running_for_repr(self) -> str:
        """What a cluster knows of its workers without asking (LocalCluster: its
        processes running); "" when nothing."""
        return ""

    def __repr__(self) -> str:
        workers = None if self._closed else self._reported_workers()
        summary = None if workers is None else summarise(workers)
        link = "" if self._closed else self._link_for_repr()
        text = cluster_text(type(self).__name__, self._address_for_repr(), summary, link)
        running = self._running_for_repr()
        return f"{text[:-1]}; running: {running})" if running else text

    def _repr_html_(self) -> str:
        workers = None if self._closed else self._reported_workers()
        return cluster_html(
            type(self).__name__, self._address_for_repr(), workers, self._link_for_repr()
        )


# ------------------------------------------------------------------- adapting
@dataclass
class AdaptiveState:
    """What ``adaptive_target`` remembers between two looks: how many looks in a row
    wanted fewer workers (workers are retired only when that persists)."""

    low_looks: int = 0


def adaptive_target(
    info: dict[str, Any],
    minimum: int,
    maximum: int | float,
    state: AdaptiveState,
    patience: int = 3,
) -> int:
    """How many workers a cluster should have, from its scheduler's ``info``: enough
    threads for the tasks running and ready to run (more at once, when there is more
    work), fewer only after ``patience`` looks in a row wanted fewer, always within
    ``[minimum, maximum]``."""
    workers = [w for w in info["workers"].values() if not w.get("retiring")]
    current = len(workers)
    threads = max(1, min((int(w.get("nthreads") or 1) for w in workers), default=1))
    tasks = info.get("tasks") or {}
    wanted = sum(int(tasks.get(state_name, 0)) for state_name in ("queued", "no-worker"))
    wanted += sum(int(w.get("processing") or 0) for w in workers)
    needed = math.ceil(wanted / threads)
    target = int(max(minimum, min(maximum, needed)))
    if target >= current:
        state.low_looks = 0
        return target
    state.low_looks += 1
    if state.low_looks < patience:
        return current if current <= maximum else int(maximum)
    state.low_looks = 0
    return target


class Adaptive:
    """A thread that looks at the scheduler every ``interval`` seconds and scales the
    cluster to ``adaptive_target``'s answer."""

    def __init__(
        self, cluster: Cluster, minimum: int, maximum: int | float, interval: float
    ) -> None:
        if minimum < 0 or maximum < minimum:
            raise ValueError(f"need 0 <= minimum <= maximum, got {minimum} and {maximum}")
        self.cluster = cluster
        self.minimum = minimum
        self.maximum = maximum
        self.interval = interval
        self._state = AdaptiveState()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="apportion-adapt", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                info = self.cluster._info()
                target = adaptive_target(info, self.minimum, self.maximum, self._state)
                running = sum(1 for w in info["workers"].values() if not w.get("retiring"))
                if target != running and not self._stopping.is_set():
                    logger.info("adapting: %d workers -> %d", running, target)
                    self.cluster._scale_to(target)
            except Exception as exc:  # the cluster closing under us, or a scheduler restart
                if self._stopping.is_set():
                    return
                logger.warning("adapting the cluster failed: %s", exc)
            self._stopping.wait(self.interval)

    def stop(self) -> None:
        self._stopping.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def __repr__(self) -> str:
        return f"<Adaptive minimum={self.minimum} maximum={self.maximum}>"
