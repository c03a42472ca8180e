"""Functions the integration tests run on workers (pickled by value, see conftest)."""

from __future__ import annotations

import os
import threading
import time

from apportion import get_worker
from apportion.demo import peak_overlap


def hold(seconds: float, tag: object = None) -> dict:
    """Occupy a thread for a while and report where and when that happened."""
    start = time.monotonic()
    time.sleep(seconds)  # the workload itself
    worker = get_worker()
    assert worker.task is not None
    return {
        "tag": tag,
        "worker": worker.name,
        "pid": os.getpid(),
        "start": start,
        "end": time.monotonic(),
        "resources": dict(worker.task.resources),
        "units": dict(worker.task.units),
    }


def inc(x: int) -> int:
    return x + 1


def double(x: int) -> int:
    return 2 * x


def peak_concurrency(records: list[dict], key: str = "worker") -> dict[object, float]:
    """Most records overlapping in time, per value of ``key``."""
    return peak_overlap((r[key], r["start"], r["end"], 1) for r in records)


def peak_use(records: list[dict], resource: str) -> dict[object, float]:
    """Largest amount of ``resource`` held at once by overlapping records, per worker."""
    return peak_overlap(
        (r["worker"], r["start"], r["end"], r["resources"][resource])
        for r in records
        if r["resources"].get(resource)
    )


def unique_result(log: str, size: int) -> tuple[str, bytes]:
    """A result no recomputation reproduces, logged once per execution."""
    import uuid

    tag = uuid.uuid4().hex
    with open(log, "a") as f:
        f.write(tag + "\n")
    return tag, bytes(size)


def wait_for_file(path: str) -> str:
    """Block until the test creates ``path`` (the task's own work, not test timing)."""
    while not os.path.exists(path):
        time.sleep(0.01)
    return path


def logged(log: str, value: object, gate: str | None = None) -> object:
    """Append this execution to ``log`` (one line per run), then, with ``gate``, block
    until the test creates that file; returns ``value``."""
    with open(log, "a") as f:
        f.write(f"{value}\n")
    if gate is not None:
        wait_for_file(gate)
    return value


# The seed pipeline for scheduler restarts: each execution is logged (start, and for GPU
# tasks when and where it held how many GPUs); from index GATED on, a stage blocks until
# the test creates its gate file, so that a restart lands while that stage runs.
GATED = 1000


def _log_line(log: str, line: str) -> None:
    with open(log, "a") as f:  # one short write in append mode: lines never interleave
        f.write(line + "\n")


def pipeline_load(log: str, gates: str, i: int) -> list[float]:
    _log_line(log, f"start load-{i}")
    if i >= GATED:
        wait_for_file(os.path.join(gates, "loads"))
    return [float(i + k) for k in range(10)]


def pipeline_process(log: str, gates: str, i: int, loaded: list[float]) -> float:
    start = time.monotonic()
    _log_line(log, f"start process-{i}")
    if i >= GATED:
        wait_for_file(os.path.join(gates, "gpu"))
    time.sleep(0.002)  # stands in for a kernel on the GPU
    worker = get_worker()
    assert worker.task is not None
    gpus = worker.task.resources.get("GPU", 0)
    _log_line(log, f"gpu process-{i} {worker.name} {start} {time.monotonic()} {gpus}")
    return sum(x * x for x in loaded)


def pipeline_aggregate(log: str, gates: str, processed: list[float]) -> float:
    _log_line(log, "start aggregate")
    wait_for_file(os.path.join(gates, "aggregate"))
    return sum(processed)


def gpu_step(log: str, i: int, value: int, seconds: float) -> int:
    """Hold the task's GPU for ``seconds``, log when and where (as pipeline_process does)."""
    start = time.monotonic()
    time.sleep(seconds)  # the workload itself
    worker = get_worker()
    assert worker.task is not None
    gpus = worker.task.resources.get("GPU", 0)
    _log_line(log, f"gpu step-{i} {worker.name} {start} {time.monotonic()} {gpus}")
    return 2 * value


class LoadsOnlyWhereMade:
    """A value that loads only in the process that made it (as one whose class's module
    only some workers have)."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def __setstate__(self, state: dict) -> None:
        if state["pid"] != os.getpid():
            raise RuntimeError("this value loads only in the process that made it")
        self.__dict__.update(state)


def made_here() -> LoadsOnlyWhereMade:
    return LoadsOnlyWhereMade()


def maker_pid(value: LoadsOnlyWhereMade) -> int:
    return value.pid


def logged_attempt(log: str, gate: str) -> int:
    """Append ``<key> <attempt>`` to ``log``, block until the file ``gate`` exists, and
    return this run's attempt number."""
    task = get_worker().task
    assert task is not None
    with open(log, "a") as f:
        f.write(f"{task.key} {task.attempt}\n")
    wait_for_file(gate)
    return task.attempt


def never_returns() -> None:
    """A task that never ends (a hung call, as a CUDA call that never returns)."""
    threading.Event().wait()


def hangs_on_first_attempt() -> int:
    """Never returns on its first run (a hung call); returns its attempt number after."""
    task = get_worker().task
    assert task is not None
    if task.attempt == 1:
        threading.Event().wait()
    return task.attempt
