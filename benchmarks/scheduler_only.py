"""Scheduler-only benchmark: apportion's pure SchedulerState, in-process, no execution.

1,000 single-thread workers (GPU=2, GPU=2, MEMORY=100e9, plain, repeating) and 100,000
tasks with mixed demands. Every compute message is answered at once with task-finished,
so the number counts every placement, not only the first free slots.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from benchmarks.memory import retained_bytes
from benchmarks.workloads import SEED_WORKERS, Sizes

DEMANDS: list[dict[str, float]] = [
    {},
    {},
    {},
    {},
    {},
    {"GPU": 1},
    {"GPU": 1},
    {"GPU": 1},
    {"GPU": 2},
    {"MEMORY": 70e9},
]


def _state(n_workers: int) -> Any:
    from apportion.scheduler.state import SchedulerState

    state = SchedulerState()
    state.add_client("c")
    for i in range(n_workers):
        spec = SEED_WORKERS[i % len(SEED_WORKERS)]
        state.add_worker(f"tcp://127.0.{i // 250}.{i % 250}:9000", f"w{i}", 1, spec["resources"])
    state.take_outbox()
    return state


def _specs(n_tasks: int) -> list[dict[str, Any]]:
    return [
        {
            "key": f"t-{i}",
            "func": b"f",
            "args": b"a",
            "deps": [],
            "resources": DEMANDS[i % len(DEMANDS)],
        }
        for i in range(n_tasks)
    ]


def _place_all(state: Any, specs: list[dict[str, Any]]) -> int:
    """Submit everything, then play the workers: answer every compute message at once with
    task-finished, until no more come. Returns how many were placed.

    The answers cost as little as the harness can make them (one reused message, no lists),
    so that what is measured is the scheduler's work."""
    state.handle_submit("c", specs)
    finished = state.handle_task_finished
    reply: dict[str, Any] = {"run_id": 0, "nbytes": 8}  # the scheduler keeps none of it
    placed = 0
    while placed < len(specs):
        before = placed
        for dest, messages in state.take_outbox().items():
            if dest == "c":
                continue
            for message in messages:
                if message["op"] == "compute":
                    reply["run_id"] = message["run_id"]
                    finished(dest, reply)
                    placed += 1
        if placed == before:
            break  # nothing more can be placed: a bug, reported by the caller's check
    return placed


def run_apportion(sizes: Sizes) -> dict[str, float]:
    from apportion.scheduler.server import tune_garbage_collector

    n = sizes.sched_tasks
    # Throughput, with the collector set as the scheduler process sets it.
    state, specs = _state(sizes.sched_workers), _specs(n)
    gc.collect()
    thresholds = gc.get_threshold()
    tune_garbage_collector()
    start = time.perf_counter()
    placed = _place_all(state, specs)
    elapsed = time.perf_counter() - start
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    assert placed == n, f"scheduler-only: placed {placed} of {n}"
    # Memory per pending task: submit everything, keep the initial placements in flight.
    state, specs = _state(sizes.sched_workers), _specs(n)

    def submit_all() -> None:
        state.handle_submit("c", specs)
        state.take_outbox()

    return {
        "sched_placements_per_s": n / elapsed,
        "sched_bytes_per_pending_task": retained_bytes(submit_all) / n,
    }
