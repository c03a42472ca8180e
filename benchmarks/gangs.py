"""Gangs in a stream: 4-bundle ``strict_spread`` placement groups mixed with GPU=1 tasks.

Four workers with one GPU each (declared, no devices) run a stream of 20 ms GPU=1 tasks,
submitted a tenth faster than they can run them (some always wait). Every second a gang of
four GPU=1 bundles, one per worker, is made; it runs one 20 ms task per bundle and is
removed. Without gangs the four GPUs would never be free at once; with them, each gang
waits only for the runs under way on its workers to end (about one task), and no half gang
ever holds GPUs (the scheduler's accounting check, which covers groups, is taken after
each gang). Prints the gangs' wait from creation to ready (median and worst) and the
stream's throughput:

    .venv/bin/python -m benchmarks.gangs [--seconds 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

from apportion import Client, LocalCluster
from benchmarks.workloads import occupy

WORKERS = [{"name": f"gpu-{i}", "nthreads": 1, "resources": {"GPU": 1}} for i in range(4)]
TASK_S = 0.02


def run(seconds: float) -> dict[str, float]:
    with LocalCluster(workers=WORKERS) as cluster, Client(cluster) as client:
        interval = TASK_S / len(WORKERS) / 1.1
        stream, waits, problems = [], [], []
        start = time.perf_counter()
        next_gang = start + 1.0
        i = 0
        while time.perf_counter() - start < seconds:
            due = start + i * interval
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            stream.append(client.submit(occupy, TASK_S, resources={"GPU": 1}, pure=False))
            i += 1
            if time.perf_counter() >= next_gang:
                made = time.perf_counter()
                pg = client.placement_group([{"GPU": 1}] * 4, strategy="strict_spread")
                pg.ready(timeout=60)
                waits.append(time.perf_counter() - made)
                problems += client.check_invariants()
                ranks = [
                    client.submit(occupy, TASK_S, placement_group=pg, bundle_index=r, pure=False)
                    for r in range(4)
                ]
                client.gather(ranks)
                pg.remove()
                next_gang = time.perf_counter() + 1.0
        client.gather(stream)
        elapsed = time.perf_counter() - start
        assert not problems, problems
        return {
            "gangs": len(waits),
            "gang_wait_median_s": statistics.median(waits),
            "gang_wait_max_s": max(waits),
            "stream_tasks_per_s": len(stream) / elapsed,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    figures = run(parser.parse_args().seconds)
    for name, value in figures.items():
        print(f"{name:24} {value:.3f}")


if __name__ == "__main__":
    main()
