"""Functions the Dask collection tests run on workers: each records where it ran."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apportion import get_worker


def recorded(log: Path, name: str, func: Callable[[Any], Any], seconds: float = 0.0):
    """``func``, recording each call made on a worker (name, resources, start, end) in
    ``log``. Calls outside a worker (Dask calls dataframe functions on empty metadata
    locally) are not recorded."""

    def run(block: Any) -> Any:
        start = time.monotonic()
        try:
            worker = get_worker()
        except ValueError:
            return func(block)
        time.sleep(seconds)  # long enough for tasks to overlap
        out = func(block)
        assert worker.task is not None
        line = json.dumps(
            {
                "name": name,
                "worker": worker.name,
                "resources": worker.task.resources,
                "start": start,
                "end": time.monotonic(),
                "pid": os.getpid(),
            }
        )
        with open(log, "a") as file:  # one short append: whole lines, even concurrently
            file.write(line + "\n")
        return out

    run.__name__ = name
    return run


def records(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def add_one(x: Any) -> Any:
    return x + 1


def double(x: Any) -> Any:
    return x * 2


def total(xs: list) -> Any:
    return sum(xs)


def touch(path: str) -> str:
    time.sleep(0.2)
    Path(path).write_text("done")
    return path


def record_dask_tasks(log: str) -> None:
    """In a worker process (through ``client.run``): append, for every Dask task run from
    now on, the functions it ran, the worker and the resources granted to ``log``. Run it
    before the worker runs its first Dask graph: workers keep the functions they loaded."""
    from apportion import dask_client

    original = dask_client.run_node
    if getattr(original, "recording", False):
        return

    def run_node(chunk: list, index: int, *values: Any) -> Any:
        out = original(chunk, index, *values)
        task = get_worker().task
        assert task is not None
        line = json.dumps(
            {
                "functions": sorted(functions_inside(chunk[index][0])),
                "worker": get_worker().name,
                "resources": task.resources,
            }
        )
        with open(log, "a") as file:
            file.write(line + "\n")
        return out

    run_node.recording = True  # type: ignore[attr-defined]
    dask_client.run_node = run_node


def functions_inside(node: Any) -> set[str]:
    """The names of the functions a (possibly fused) Dask task calls; ``"data"`` for data
    embedded in the graph (a partition of ``from_pandas``), nothing for an alias."""
    from dask._task_spec import Alias, DataNode, Task, _execute_subgraph

    if isinstance(node, Task) and node.func is _execute_subgraph:
        return set().union(*(functions_inside(inner) for inner in node.args[0].values()))
    if isinstance(node, Task):
        return {getattr(node.func, "__name__", type(node.func).__name__)}
    if isinstance(node, DataNode):
        return {"data"}
    assert isinstance(node, Alias), node
    return set()


class Counter:
    """The counter of dask.distributed's actors page."""

    n = 0

    def increment(self) -> int:
        self.n += 1
        return self.n
