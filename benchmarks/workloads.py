"""Workload definitions shared by every system adapter.

Task functions live here (a real module, importable by every worker process because
``benchmarks.run`` puts the repository root on ``PYTHONPATH``) so each system pickles them
by reference, the same way on all three systems.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from benchmarks import dask_workloads

# ----------------------------------------------------------------------------- task functions


def inc(x: int) -> int:
    return x + 1


def load(i: int) -> int:
    return i


def process(x: int) -> int:
    return 2 * x


def aggregate(*xs: int) -> int:
    return sum(xs)


def occupy(seconds: float) -> float:
    """Hold a thread (and the task's resources) for ``seconds``; return when it started
    (wall clock: comparable between the processes of one machine)."""
    start = time.time()
    time.sleep(seconds)
    return start


def make_array(nbytes: int) -> Any:
    import numpy as np

    return np.ones(nbytes // 8)


def array_nbytes(array: Any) -> int:
    return int(array.nbytes)


def array_sum(array: Any) -> float:
    return float(array.sum())


def peak_rss_mb(_: Any = None) -> float:
    """The peak resident memory of the process running this (MB): VmHWM, which starts
    afresh with the program (getrusage's maxrss carries the parent's over an exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1e3  # kB
    return float("nan")


def process_id(_: Any = None) -> int:
    """The id of the process running this (a task's worker)."""
    import os

    return os.getpid()


def array_nbytes_and_process(array: Any) -> tuple[int, int]:
    import os

    return int(array.nbytes), os.getpid()


def _descendants() -> list[int]:
    """This process's descendants (the local cluster's processes), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            parents.setdefault(parent, []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU seconds each process has used so far, all its threads (also ended ones) in
    user and kernel mode: its process CPU clock (Linux's clock id for a pid: ``~pid << 3
    | 2``), read from outside it, so no task runs there to ask. Processes that cannot be
    read are left out."""
    seconds = {}
    for pid in pids:
        try:
            seconds[pid] = time.clock_gettime(((~pid) << 3) | 2)
        except OSError:
            continue
    return seconds


def fetch_seconds_here() -> float:
    """In an apportion worker process: the seconds its fetches over TCP took so far, from
    each request to its reply (worker/transfers.py)."""
    from apportion.worker.transfers import fetch_counters

    return float(fetch_counters()["fetch_seconds"])


def share_memory_here(on: bool) -> None:
    """In an apportion worker process: hand large results to peers of this host through
    shared memory, or not."""
    from apportion import shared_memory

    shared_memory.switch(on)


# ----------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    tiny: int = 10_000
    seed_loads: int = 2_000
    seed_gpu2_every: int = 10  # 200 of the 2,000 process tasks need GPU=2
    chain: int = 2_000
    latency: int = 200
    sched_tasks: int = 100_000
    sched_workers: int = 1_000
    dask_chunks: int = 10_000  # the array reduction's chunks
    dask_gpu_chunks: int = 1_000  # the annotated map_blocks' chunks
    dask_partitions: int = 100  # the groupby's partitions (a day of data each)
    stream_seconds: float = 10.0  # how long the GPU=1 stream is submitted for
    data_mb: tuple[int, ...] = (1, 10, 100, 400)  # the data workload's array sizes
    tls_mb: tuple[int, ...] = (100,)  # the data_tls workload's (each one of data_mb too)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            tiny=2_000,
            seed_loads=500,
            chain=500,
            latency=100,
            sched_tasks=20_000,
            sched_workers=200,
            dask_chunks=2_000,
            dask_gpu_chunks=200,
            dask_partitions=20,
            stream_seconds=3.0,
            data_mb=(1, 10),
            tls_mb=(10,),
        )


# The seed pipeline's cluster: one thread per worker, resources as in the issue.
SEED_WORKERS: list[dict[str, Any]] = [
    {"name": "gpu-a", "nthreads": 1, "resources": {"GPU": 2}},
    {"name": "gpu-b", "nthreads": 1, "resources": {"GPU": 2}},
    {"name": "bigmem", "nthreads": 1, "resources": {"MEMORY": 100e9}},
    {"name": "plain", "nthreads": 1, "resources": {}},
]
N_WORKERS = 4


class Session(Protocol):
    """What a system adapter offers the workloads: a connected client on a running cluster."""

    def submit(
        self, func: Callable[..., Any], *args: Any, resources: dict[str, float] | None = None
    ) -> Any: ...

    def map(
        self,
        func: Callable[..., Any],
        xs: Sequence[Any],
        resources: dict[str, float] | None = None,
    ) -> list[Any]: ...

    def gather(self, futures: list[Any]) -> list[Any]: ...

    def result(self, future: Any) -> Any: ...

    def compute(self, *collections: Any) -> tuple: ...


# ----------------------------------------------------------------------------- workloads
# Each returns a dict of metrics and checks its answer, so a fast wrong result cannot pass.


def tiny(session: Session, sizes: Sizes) -> dict[str, float]:
    n = sizes.tiny
    start = time.perf_counter()
    results = session.gather(session.map(inc, range(n)))
    elapsed = time.perf_counter() - start
    assert sum(results) == n * (n + 1) // 2, "tiny: wrong answer"
    return {"tiny_tasks_per_s": n / elapsed}


def seed(session: Session, sizes: Sizes) -> dict[str, float]:
    n = sizes.seed_loads
    start = time.perf_counter()
    loaded = session.map(load, range(n))
    processed = [
        session.submit(process, d, resources={"GPU": 2 if i % sizes.seed_gpu2_every == 0 else 1})
        for i, d in enumerate(loaded)
    ]
    final = session.submit(aggregate, *processed, resources={"MEMORY": 70e9})
    total = session.result(final)
    elapsed = time.perf_counter() - start
    assert total == n * (n - 1), "seed: wrong answer"
    return {"seed_tasks_per_s": (2 * n + 1) / elapsed}


STREAM_TASK_S = 0.05
STREAM_BIG = 5  # GPU=2 tasks, submitted 1 s into the stream


def stream(session: Session, sizes: Sizes) -> dict[str, float]:
    """A steady stream of GPU=1 tasks (50 ms each), submitted a tenth faster than the seed
    cluster's GPU workers run them (one thread each: two at a time), so some always wait,
    and 5 GPU=2 tasks submitted 1 s in: how long the GPU=2 tasks wait to start (median),
    and the stream's throughput (at most 40 tasks/s)."""
    threads = sum(w["nthreads"] for w in SEED_WORKERS if "GPU" in w["resources"])
    interval = STREAM_TASK_S / threads / 1.1
    n = int(sizes.stream_seconds / interval)
    futures, big = [], []
    big_submitted = 0.0
    start = time.perf_counter()
    for i in range(n):
        due = start + i * interval
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        futures.append(session.submit(occupy, STREAM_TASK_S, resources={"GPU": 1}))
        if not big and due - start >= 1.0:
            big_submitted = time.time()
            big = [
                session.submit(occupy, STREAM_TASK_S, resources={"GPU": 2})
                for _ in range(STREAM_BIG)
            ]
    started = session.gather(futures)
    elapsed = time.perf_counter() - start
    big_started = session.gather(big)
    assert len(started) == n and len(big_started) == STREAM_BIG, "stream: results missing"
    return {
        "stream_big_start_delay_s": statistics.median(t - big_submitted for t in big_started),
        "stream_tasks_per_s": n / elapsed,
    }


def _worker_to_worker(
    session: Session, nbytes: int
) -> tuple[Any, float, float, float, float | None]:
    """An array made on bigmem (untimed), summed there (the task's own pass over it,
    timed apart), then taken by a task on a GPU worker that only reads its size (the
    transfer, timed without a pass over the array): the array's future, the sum, the
    seconds of the row and of the sum, and the seconds of the transfer alone as the
    receiving worker timed it (its request to the holder, the reply read; None for a
    system whose workers do not say)."""
    array = session.submit(make_array, nbytes, resources={"MEMORY": 1})
    # Made (and only then timed): a task on the same worker reads its size.
    assert session.result(session.submit(array_nbytes, array, resources={"MEMORY": 1}))
    start = time.perf_counter()
    total = session.result(session.submit(array_sum, array, resources={"MEMORY": 1}))
    summed = time.perf_counter() - start
    fetch_seconds = getattr(session, "fetch_seconds", None)
    fetched_before = fetch_seconds() if fetch_seconds is not None else 0.0
    start = time.perf_counter()
    got = session.result(session.submit(array_nbytes, array, resources={"GPU": 1}))
    seconds = time.perf_counter() - start
    assert got == nbytes, "data: wrong answer"
    transfer = fetch_seconds() - fetched_before if fetch_seconds is not None else None
    return array, total, seconds, summed, transfer or None


def data(session: Session, sizes: Sizes) -> dict[str, float]:
    """numpy arrays of each size on the seed cluster: made on bigmem, taken by a task on a
    GPU worker (worker to worker), gathered by the client, and sent by the client as an
    argument (MB/s; each includes one small task's round trip, and no pass over the array:
    the receiving task reads its size; the time of a sum over it, where it is, is a row of
    its own; worker to worker also as the receiving worker timed the transfer alone, where
    the system says: ``session.fetch_seconds``); then the peak resident memory of the
    sending worker, the client and a receiving worker (MB, over all sizes).

    Worker to worker and gather are measured over the network path (TCP; a system that
    can turn its shared memory off, ``session.share_memory``, does so for them) and, for
    systems whose processes of one host share memory, through that ("shared memory"
    rows: apportion with sharing on; Ray, whose object store always is). A gathered
    array from shared memory is a mapping, not yet read: those rows time the hand-over."""
    import numpy as np

    share = getattr(session, "share_memory", None)
    always_shared = getattr(session, "SHARES_MEMORY", False)
    metrics: dict[str, float] = {}
    # Untimed: connections between the workers and to the client are opened first, those
    # of each GPU worker too (one task per GPU worker at once: one task alone warmed one of
    # them, and the first timed transfer to the other opened its connection), and each
    # worker runs the functions it runs timed once (a function's first run costs its
    # unpickling, 2 ms in a first repetition once).
    gpu_workers = sum("GPU" in w["resources"] for w in SEED_WORKERS)
    warm = session.submit(make_array, 1_000_000, resources={"MEMORY": 1})
    session.result(session.submit(array_sum, warm, resources={"MEMORY": 1}))
    session.gather(
        [session.submit(array_nbytes, warm, resources={"GPU": 1}) for _ in range(gpu_workers)]
    )
    # (2 MB: an argument of 1 MiB or more goes from the client straight to a worker, over
    # a connection of its own, opened here rather than in the first timed submit.)
    session.gather(
        [
            session.submit(array_nbytes, np.ones(250_000), resources={"GPU": 1})
            for _ in range(gpu_workers)
        ]
    )
    session.result(warm)
    del warm
    for mb in sizes.data_mb:
        nbytes = mb * 1_000_000
        if share is not None:
            share(False)
        array, total, seconds, summed, transfer = _worker_to_worker(session, nbytes)
        metrics[f"data_{mb}mb_worker_to_worker_mb_per_s"] = mb / seconds
        if transfer:
            metrics[f"data_{mb}mb_worker_to_worker_transfer_mb_per_s"] = mb / transfer
        metrics[f"data_{mb}mb_task_pass_ms"] = summed * 1e3
        start = time.perf_counter()
        gathered = session.result(array)
        metrics[f"data_{mb}mb_gather_mb_per_s"] = mb / (time.perf_counter() - start)
        assert gathered.nbytes == nbytes, "data: wrong answer"
        del array, gathered  # one payload alive at a time, for the peak memory figures
        if share is not None:
            share(True)
        if share is not None or always_shared:
            array, shared_total, seconds, *_ = _worker_to_worker(session, nbytes)
            metrics[f"data_{mb}mb_worker_to_worker_shared_mb_per_s"] = mb / seconds
            assert shared_total == total, "data: wrong answer"
            start = time.perf_counter()
            gathered = session.result(array)
            metrics[f"data_{mb}mb_gather_shared_mb_per_s"] = mb / (time.perf_counter() - start)
            assert gathered.nbytes == nbytes, "data: wrong answer"
            del array, gathered
        local = np.ones(nbytes // 8)
        start = time.perf_counter()
        sent = session.result(session.submit(array_nbytes, local, resources={"GPU": 1}))
        metrics[f"data_{mb}mb_submit_mb_per_s"] = mb / (time.perf_counter() - start)
        assert total == nbytes // 8 and sent == nbytes, "data: wrong answer"
        del local
    metrics["data_peak_rss_sender_mb"] = session.result(
        session.submit(peak_rss_mb, resources={"MEMORY": 1})
    )
    metrics["data_peak_rss_receiver_mb"] = session.result(
        session.submit(peak_rss_mb, resources={"GPU": 1})
    )
    metrics["data_peak_rss_client_mb"] = peak_rss_mb()
    return metrics


def data_tls(session: Session, sizes: Sizes) -> dict[str, float]:
    """The data workload's worker to worker and gather rows on a cluster whose every
    connection is mutual TLS (the same certificates for every system; shared memory off),
    each with the CPU time the sending and the receiving process spent on it (ms per 100
    MB: what bounds TLS on a machine whose cores are shared, where the MB/s swing with
    the load), then the sending worker's peak resident memory (MB). Read against the TCP
    rows of the same run: child.py adds each row's percentage of its TCP figure."""
    share = getattr(session, "share_memory", None)
    if share is not None:
        share(False)
    metrics: dict[str, float] = {}
    warm = session.submit(make_array, 1_000_000, resources={"MEMORY": 1})
    session.result(session.submit(array_sum, warm, resources={"GPU": 1}))
    session.result(warm)
    del warm
    for mb in sizes.tls_mb:
        nbytes = mb * 1_000_000
        array = session.submit(make_array, nbytes, resources={"MEMORY": 1})
        holder = session.result(session.submit(process_id, array, resources={"MEMORY": 1}))
        before = cpu_seconds(_descendants())
        start = time.perf_counter()
        got, receiver = session.result(
            session.submit(array_nbytes_and_process, array, resources={"GPU": 1})
        )
        seconds = time.perf_counter() - start
        after = cpu_seconds([holder, receiver])
        assert got == nbytes, "data_tls: wrong answer"
        metrics[f"data_{mb}mb_tls_worker_to_worker_mb_per_s"] = mb / seconds
        per_100mb = 1e3 * 100 / mb  # CPU ms per 100 MB moved
        if holder != receiver and {holder, receiver} <= before.keys() & after.keys():
            metrics[f"data_{mb}mb_tls_worker_to_worker_cpu_ms_sender"] = per_100mb * (
                after[holder] - before[holder]
            )
            metrics[f"data_{mb}mb_tls_worker_to_worker_cpu_ms_receiver"] = per_100mb * (
                after[receiver] - before[receiver]
            )
        before = cpu_seconds([holder])
        client_before = time.process_time()
        start = time.perf_counter()
        gathered = session.result(array)
        metrics[f"data_{mb}mb_tls_gather_mb_per_s"] = mb / (time.perf_counter() - start)
        client_cpu = time.process_time() - client_before
        after = cpu_seconds([holder])
        if holder != os.getpid() and holder in before.keys() & after.keys():
            metrics[f"data_{mb}mb_tls_gather_cpu_ms_sender"] = per_100mb * (
                after[holder] - before[holder]
            )
            metrics[f"data_{mb}mb_tls_gather_cpu_ms_client"] = per_100mb * client_cpu
        assert gathered.nbytes == nbytes, "data_tls: wrong answer"
        del array, gathered
    metrics["data_tls_peak_rss_sender_mb"] = session.result(
        session.submit(peak_rss_mb, resources={"MEMORY": 1})
    )
    return metrics


def tls_share_of_tcp(metrics: dict[str, float], sizes: Sizes) -> dict[str, float]:
    """Each TLS row as a percentage of the same row over TCP in the same run."""
    shares = {}
    for mb in sizes.tls_mb:
        for what in ("worker_to_worker", "gather"):
            tls = metrics.get(f"data_{mb}mb_tls_{what}_mb_per_s")
            tcp = metrics.get(f"data_{mb}mb_{what}_mb_per_s")
            if tls and tcp:
                shares[f"data_{mb}mb_tls_{what}_pct_of_tcp"] = 100 * tls / tcp
    return shares


def chain(session: Session, sizes: Sizes) -> dict[str, float]:
    n = sizes.chain
    start = time.perf_counter()
    x = session.submit(inc, 0)
    for _ in range(n - 1):
        x = session.submit(inc, x)
    value = session.result(x)
    elapsed = time.perf_counter() - start
    assert value == n, "chain: wrong answer"
    return {"chain_steps_per_s": n / elapsed}


def latency(session: Session, sizes: Sizes) -> dict[str, float]:
    times = []
    for i in range(sizes.latency):
        start = time.perf_counter()
        value = session.result(session.submit(inc, i))
        times.append(time.perf_counter() - start)
        assert value == i + 1, "latency: wrong answer"
    times.sort()
    return {
        "latency_p50_ms": 1e3 * statistics.median(times),
        "latency_p99_ms": 1e3 * times[min(len(times) - 1, round(0.99 * (len(times) - 1)))],
    }


def warm_up(session: Session) -> None:
    """Import the functions on every worker and open connections before anything is timed."""
    session.gather(session.map(inc, range(200)))
    x = session.submit(inc, 0)
    for _ in range(20):
        x = session.submit(inc, x)
    session.result(x)


HOMOGENEOUS: dict[str, Callable[[Session, Sizes], dict[str, float]]] = {
    "tiny": tiny,
    "chain": chain,
    "latency": latency,
    "dask_array": dask_workloads.dask_array,
    "dask_groupby": dask_workloads.dask_groupby,
    "dask_programs": dask_workloads.dask_programs,
}
# On the seed pipeline's cluster (workers with resources).
SEED_CLUSTER: dict[str, Callable[[Session, Sizes], dict[str, float]]] = {
    "seed": seed,
    "data": data,
    "dask_gpu": dask_workloads.dask_gpu,
}
# Dask collections: only on systems whose session computes them (see FuturesSession).
DASK_WORKLOADS = ("dask_array", "dask_gpu", "dask_groupby", "dask_programs")
CLUSTER_WORKLOADS = (
    "tiny", "seed", "chain", "latency", "stream", "data", "data_tls", *DASK_WORKLOADS
)  # fmt: skip
ALL_WORKLOADS = (*CLUSTER_WORKLOADS, "cold_start", "scheduler")


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    higher_is_better: bool
    target: float | None  # the target for apportion


METRICS: list[Metric] = [
    Metric("tiny_tasks_per_s", "tiny (inc via map, gather)", "tasks/s", True, 5_000),
    Metric("seed_tasks_per_s", "seed pipeline", "tasks/s", True, 3_000),
    Metric("stream_big_start_delay_s", "GPU=2 start delay in a GPU=1 stream", "s", False, 0.3),
    Metric("stream_tasks_per_s", "GPU=1 stream throughput", "tasks/s", True, None),
    Metric("chain_steps_per_s", "chain", "steps/s", True, 2_000),
    Metric("latency_p50_ms", "latency p50", "ms", False, 0.5),
    Metric("latency_p99_ms", "latency p99", "ms", False, 2.0),
    Metric("cold_start_s", "cold start (process start to 4 workers)", "s", False, 1.0),
    Metric("cold_start_in_process_s", "cold start, cluster+client only", "s", False, None),
    Metric("dask_array_reduction_s", "dask array: sum of 10,000 chunks", "s", False, None),
    Metric("dask_gpu_map_blocks_s", "dask array: GPU-annotated map_blocks", "s", False, None),
    Metric("dask_groupby_agg_s", "dask dataframe: groupby().agg()", "s", False, None),
    Metric("dask_program_array_s", "dask program: array.ipynb", "s", False, None),
    Metric("dask_program_dataframe_s", "dask program: dataframe groupby", "s", False, None),
    Metric("dask_program_futures_s", "dask program: futures quickstart", "s", False, None),
    Metric("dask_program_delayed_s", "dask program: delayed tree", "s", False, None),
    *(
        Metric(f"data_{mb}mb_{what}_mb_per_s", f"{mb} MB array: {label}", "MB/s", True, None)
        for mb in Sizes().data_mb
        for what, label in (
            ("worker_to_worker", "worker to worker"),
            ("worker_to_worker_transfer", "worker to worker, the transfer alone"),
            ("worker_to_worker_shared", "worker to worker, shared memory"),
            ("gather", "client gather"),
            ("gather_shared", "client gather, shared memory"),
            ("submit", "client submit as argument"),
        )
    ),
    *(
        Metric(
            f"data_{mb}mb_task_pass_ms",
            f"{mb} MB array: a sum over it where it is",
            "ms",
            False,
            None,
        )
        for mb in Sizes().data_mb
    ),
    *(
        metric
        for mb in sorted({*Sizes().tls_mb, *Sizes.quick().tls_mb})
        for what, label in (("worker_to_worker", "worker to worker"), ("gather", "client gather"))
        for metric in (
            Metric(
                f"data_{mb}mb_tls_{what}_mb_per_s", f"{mb} MB over TLS: {label}", "MB/s", True, None
            ),
            Metric(
                f"data_{mb}mb_tls_{what}_pct_of_tcp",
                f"{mb} MB over TLS: {label}, of TCP",
                "%",
                True,
                50 if mb >= 100 else None,  # (smaller transfers: round trips, not bytes)
            ),
        )
    ),
    *(
        Metric(
            f"data_{mb}mb_tls_{what}_cpu_ms_{side}", f"{mb} MB over TLS: {label}", "ms", False, None
        )
        for mb in sorted({*Sizes().tls_mb, *Sizes.quick().tls_mb})
        for what, side, label in (
            ("worker_to_worker", "sender", "worker to worker, sender's CPU per 100 MB"),
            ("worker_to_worker", "receiver", "worker to worker, receiver's CPU per 100 MB"),
            ("gather", "sender", "client gather, sender's CPU per 100 MB"),
            ("gather", "client", "client gather, client's CPU per 100 MB"),
        )
    ),
    Metric("data_peak_rss_sender_mb", "data: peak RSS, sending worker", "MB", False, None),
    Metric("data_peak_rss_receiver_mb", "data: peak RSS, a receiving worker", "MB", False, None),
    Metric("data_peak_rss_client_mb", "data: peak RSS, client", "MB", False, None),
    Metric(
        "data_tls_peak_rss_sender_mb", "data over TLS: peak RSS, sending worker", "MB", False, None
    ),
    Metric("sched_placements_per_s", "scheduler-only placements", "placements/s", True, 200_000),
    Metric(
        "sched_bytes_per_pending_task", "scheduler-only memory per pending task", "B", False, None
    ),
]
