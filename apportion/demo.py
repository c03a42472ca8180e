"""``apportion demo``: the GPU pipeline of the resources guide, on a local cluster.

Two workers with GPU=2 and one with MEMORY=100e9. Load many files, process each
on a GPU (every tenth needs both GPUs of a worker), aggregate everything with a
task that needs 70 GB of memory. Each task records where and when it ran, so
the demo can show the peak concurrent use of each resource on each worker.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from apportion import Client, LocalCluster, get_worker
from apportion.resources import format_resources

WORKERS: list[dict[str, Any]] = [
    {"name": "gpu-node-1", "nthreads": 4, "resources": {"GPU": 2}},
    {"name": "gpu-node-2", "nthreads": 4, "resources": {"GPU": 2}},
    {"name": "highmem", "nthreads": 2, "resources": {"MEMORY": 100e9}},
]


@dataclass(frozen=True)
class Record:
    kind: str
    worker: str
    start: float
    end: float
    resources: dict[str, float]
    units: dict[str, list[int]]


def _record(kind: str, start: float) -> Record:
    worker = get_worker()
    task = worker.task
    assert task is not None
    return Record(
        kind, worker.name, start, time.monotonic(), dict(task.resources), dict(task.units)
    )


def load(index: int) -> tuple[list[float], Record]:
    start = time.monotonic()
    data = [float(index + i) for i in range(100)]
    return data, _record("load", start)


def process(loaded: tuple[list[float], Record]) -> tuple[float, Record]:
    start = time.monotonic()
    data, _ = loaded
    time.sleep(0.005)  # stands in for a kernel on the GPU
    return sum(x * x for x in data), _record("process", start)


def aggregate(processed: list[tuple[float, Record]]) -> tuple[float, list[Record], Record]:
    start = time.monotonic()
    total = sum(value for value, _ in processed)
    return total, [record for _, record in processed], _record("aggregate", start)


def peak_overlap(intervals: Iterable[tuple[Hashable, float, float, float]]) -> dict[Any, float]:
    """Largest total amount held at once per group, from ``(group, start, end, amount)``.

    A sweep over start/end events; at equal times ends come first, so back-to-back
    intervals do not count as overlapping.
    """
    events: dict[Hashable, list[tuple[float, float]]] = defaultdict(list)
    for group, start, end, amount in intervals:
        events[group] += [(start, amount), (end, -amount)]
    peaks = {}
    for group, changes in events.items():
        level = peak = 0.0
        for _, delta in sorted(changes):
            level += delta
            peak = max(peak, level)
        peaks[group] = peak
    return peaks


def peak_use(records: list[Record]) -> dict[tuple[str, str], float]:
    """Largest amount of each resource in use at once on each worker."""
    return peak_overlap(
        ((r.worker, name), r.start, r.end, amount)
        for r in records
        for name, amount in r.resources.items()
    )


def run_demo(items: int = 400, console: Console | None = None) -> int:
    console = console or Console()
    began = time.monotonic()
    with LocalCluster(workers=WORKERS) as cluster, Client(cluster) as client:
        started = time.monotonic() - began
        console.print(
            f"[bold]Local cluster[/] at {cluster.scheduler_address} started in {started:.2f}s"
        )
        t0 = time.monotonic()
        data = [client.submit(load, i) for i in range(items)]
        processed = [
            client.submit(process, d, resources={"GPU": 2 if i % 10 == 0 else 1})
            for i, d in enumerate(data)
        ]
        final = client.submit(aggregate, processed, resources={"MEMORY": 70e9})
        total, process_records, aggregate_record = final.result()
        elapsed = time.monotonic() - t0
        load_records = [record for _, record in client.gather(data)]
        declared = {w["name"]: w["resources"] for w in WORKERS}
        used_after = {
            info["name"]: info["used_resources"]
            for info in client.scheduler_info()["workers"].values()
        }

    records = [*load_records, *process_records, aggregate_record]
    console.print(
        f"Ran {len(records)} tasks in {elapsed:.2f}s "
        f"({len(records) / elapsed:,.0f} tasks/s); aggregate = {total:.4g}\n"
    )
    console.print(_placement_table(records, declared))
    table, ok = _peak_table(records, declared, used_after)
    console.print(table)
    if ok:
        console.print("[green]No worker ever ran more than it declared.[/]")
        return 0
    console.print("[red]A resource limit was exceeded.[/]")
    return 1


def _placement_table(records: list[Record], declared: dict[str, dict[str, float]]) -> Table:
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for record in records:
        label = record.kind
        if record.kind == "process":
            label = f"process GPU={record.resources.get('GPU')}"
        counts[record.worker][label] += 1
    columns = ["load", "process GPU=1", "process GPU=2", "aggregate"]
    table = Table(title="Where tasks ran")
    table.add_column("worker")
    table.add_column("declared")
    for column in columns:
        table.add_column(column, justify="right")
    for worker, resources in declared.items():
        table.add_row(
            worker, format_resources(resources), *(str(counts[worker].get(c, 0)) for c in columns)
        )
    return table


def _peak_table(
    records: list[Record],
    declared: dict[str, dict[str, float]],
    used_after: dict[str, dict[str, float]],
) -> tuple[Table, bool]:
    peaks = peak_use(records)
    table = Table(title="Peak concurrent use (from task start/end times on the workers)")
    for column in ("worker", "resource", "declared", "peak in use", "in use after", "within"):
        table.add_column(column, justify="right" if column != "worker" else "left")
    ok = True
    for worker, resources in declared.items():
        for name, amount in resources.items():
            peak = peaks.get((worker, name), 0)
            after = used_after.get(worker, {}).get(name, 0)
            within = peak <= amount and after == 0
            ok &= within
            table.add_row(
                worker,
                name,
                format_resources({name: amount}).split("=")[1],
                format_resources({name: peak}).split("=")[1],
                f"{after:g}",
                "[green]yes[/]" if within else "[red]NO[/]",
            )
    return table, ok
