"""Scheduler-only benchmark for dask.distributed: its SchedulerState, in-process.

The same 1,000 workers and mixed demands as ``scheduler_only`` (apportion), driven through
dask's transition engine without a server: tasks go released -> waiting -> processing/
queued, every compute-task message is answered with a transition to memory, and queued
tasks are let out as dask's ``stimulus_queue_slots_maybe_opened`` does. This leans on
dask internals (``_transitions``, ``_task_slots_available``), which may change between
releases; it is a fair count of state-machine work, not of dask's networking.
dask places tasks with resource restrictions by scanning the workers that hold each
resource, so its rate depends on the worker count; it is measured on at most 20,000 tasks.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from benchmarks.memory import retained_bytes
from benchmarks.scheduler_only import DEMANDS
from benchmarks.workloads import SEED_WORKERS, Sizes

MAX_TASKS = 20_000


def _state(n_workers: int) -> Any:
    from distributed.collections import HeapSet
    from distributed.core import Status
    from distributed.scheduler import ClientState, SchedulerState, WorkerState
    from sortedcontainers import SortedDict

    class State(SchedulerState):
        def log_event(self, *args: Any, **kwargs: Any) -> None:
            pass

    logging.getLogger("distributed").setLevel(logging.ERROR)
    state = State(
        aliases={},
        clients={},
        workers=SortedDict(),
        host_info={},
        resources={},
        tasks={},
        unrunnable={},
        queued=HeapSet(key=lambda ts: ts.priority),
        validate=False,
    )
    state.clients["c"] = ClientState("c")
    for i in range(n_workers):
        address = f"tcp://127.0.{i // 250}.{i % 250}:9000"
        ws = WorkerState(
            address=address,
            status=Status.running,
            pid=0,
            name=f"w{i}",
            nthreads=1,
            memory_limit=0,
            local_directory="",
            nanny=None,
            server_id=f"s{i}",
            scheduler=state,
        )
        state.workers[address] = ws
        state.running.add(ws)
        state.total_nthreads += 1
        ws.resources = dict(SEED_WORKERS[i % len(SEED_WORKERS)]["resources"])
        ws.used_resources = dict.fromkeys(ws.resources, 0)
        for name, amount in ws.resources.items():
            state.resources.setdefault(name, {})[address] = amount
        state.check_idle_saturated(ws)
    return state


def _submit(state: Any, n: int) -> dict[str, list[dict[str, Any]]]:
    client = state.clients["c"]
    recommendations = {}
    for i in range(n):
        ts = state.new_task(f"t-{i}", None, "released")
        demand = DEMANDS[i % len(DEMANDS)]
        if demand:
            ts.resource_restrictions = dict(demand)
        ts.who_wants = {client}
        client.wants_what.add(ts)
        ts.priority = (0, i)
        recommendations[ts.key] = "waiting"
    worker_msgs: dict[str, list[dict[str, Any]]] = {}
    state._transitions(recommendations, {}, worker_msgs, "submit")
    return worker_msgs


def _place_all(state: Any, n: int) -> int:
    from distributed.scheduler import _task_slots_available

    worker_msgs = _submit(state, n)
    placed = 0
    while True:
        finished = [
            (worker, m["key"], m["run_id"])
            for worker, messages in worker_msgs.items()
            for m in messages
            if m.get("op") == "compute-task"
        ]
        if not finished:
            return placed
        placed += len(finished)
        worker_msgs = {}
        for worker, key, run_id in finished:
            recs, _, msgs = state._transition(
                key, "memory", "done", worker=worker, run_id=run_id, metadata={}, nbytes=8,
                type=None, typename="int", startstops=[],
            )  # fmt: skip
            for address, more in msgs.items():
                worker_msgs.setdefault(address, []).extend(more)
            state._transitions(recs, {}, worker_msgs, "done")
            if state.queued:
                slots = sum(
                    _task_slots_available(ws, state.WORKER_SATURATION)
                    for ws in state.idle_task_count
                )
                for _ in range(slots):
                    if not state.queued:
                        break
                    key = state.queued.peek().key
                    state._transitions({key: "processing"}, {}, worker_msgs, "done")


def run_dask(sizes: Sizes) -> dict[str, float]:
    n = min(sizes.sched_tasks, MAX_TASKS)
    state = _state(sizes.sched_workers)
    gc.collect()
    start = time.perf_counter()
    placed = _place_all(state, n)
    elapsed = time.perf_counter() - start
    assert placed == n, f"dask scheduler-only: placed {placed} of {n}"
    state = _state(sizes.sched_workers)
    return {
        "sched_placements_per_s": n / elapsed,
        "sched_bytes_per_pending_task": retained_bytes(lambda: _submit(state, n)) / n,
        "sched_tasks_measured": n,
    }
