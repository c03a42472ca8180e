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
