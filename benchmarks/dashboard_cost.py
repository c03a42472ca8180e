"""What an open dashboard costs the scheduler: its CPU time per tiny task.

Runs 20,000 ``inc`` tasks on 4 single-thread workers, alternating three modes run after
run (no HTTP; HTTP, no page; a page open reading the pushed updates), and prints the
median scheduler CPU time per task (user + system, from /proc) and throughput:

    .venv/bin/python -m benchmarks.dashboard_cost [--runs 5] [--tasks 20000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import nullcontext

from apportion import Client, LocalCluster
from benchmarks.systems.apportion_ import _dashboard_open

MODES = ("no HTTP", "HTTP, no page", "dashboard open")


def inc(x: int) -> int:
    return x + 1


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(mode: str, tasks: int) -> tuple[float, float]:
    """(scheduler CPU µs per task, tasks per second) for one run in ``mode``."""
    http_port = None if mode == "no HTTP" else 0
    with LocalCluster(n_workers=4, threads_per_worker=1, http_port=http_port) as cluster:
        with Client(cluster) as client:
            client.wait_for_workers(4, timeout=60)
            client.gather(client.map(inc, range(100)))  # warm: imports, connections
            watching = _dashboard_open(cluster) if mode == "dashboard open" else nullcontext()
            with watching:
                pid = cluster._scheduler_process.pid
                cpu, start = _cpu_seconds(pid), time.perf_counter()
                client.gather(client.map(inc, range(100, 100 + tasks)))
                elapsed = time.perf_counter() - start
                cpu = _cpu_seconds(pid) - cpu
    return cpu / tasks * 1e6, tasks / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=20_000)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for _ in range(args.runs):
        for mode in MODES:  # alternating: the machine's load drifts between runs
            results[mode].append(one_run(mode, args.tasks))
    base = statistics.median(cpu for cpu, _ in results["no HTTP"])
    for mode in MODES:
        cpu = statistics.median(c for c, _ in results[mode])
        rate = statistics.median(r for _, r in results[mode])
        print(
            f"{mode:>15}: scheduler {cpu:6.1f} µs/task ({(cpu / base - 1) * 100:+5.1f}%), "
            f"{rate:7,.0f} tasks/s; runs {[round(c, 1) for c, _ in results[mode]]}"
        )


if __name__ == "__main__":
    main()
