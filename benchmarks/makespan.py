"""The seed scenario's makespan against its lower bound.

A thousand tasks, a hundred of which need a GPU and ten of those two GPUs at once, on
two machines with two GPUs each and one with much memory (the seed's cluster, two
threads per worker). Every task sleeps (``occupy``), so the machine's cores are not what
is measured; the bound is what the declared resources allow:

    lower bound = max(GPU-seconds / GPUs, thread-seconds / threads)

and the makespan is the time from the first submit to the last result. Prints the
median of ``--runs`` runs (each on a fresh cluster):

    .venv/bin/python -m benchmarks.makespan [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from apportion import Client, LocalCluster
from benchmarks.workloads import occupy

WORKERS = [
    {"name": "gpu-a", "nthreads": 2, "resources": {"GPU": 2}},
    {"name": "gpu-b", "nthreads": 2, "resources": {"GPU": 2}},
    {"name": "bigmem", "nthreads": 2, "resources": {"MEMORY": 100e9}},
]
CPU_TASKS, GPU1_TASKS, GPU2_TASKS = 900, 90, 10
CPU_SECONDS, GPU_SECONDS = 0.01, 0.1


def lower_bound() -> float:
    gpus = sum(w["resources"].get("GPU", 0) for w in WORKERS)
    threads = sum(w["nthreads"] for w in WORKERS)
    gpu_seconds = (GPU1_TASKS + 2 * GPU2_TASKS) * GPU_SECONDS
    thread_seconds = CPU_TASKS * CPU_SECONDS + (GPU1_TASKS + GPU2_TASKS) * GPU_SECONDS
    return max(gpu_seconds / gpus, thread_seconds / threads)


def one_run() -> float:
    with LocalCluster(workers=WORKERS) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(WORKERS), timeout=60)
        client.gather(client.map(occupy, [0.0] * 12, pure=False))  # imports, connections
        start = time.perf_counter()
        # Interleaved as a pipeline produces them: GPU work spread through the stream.
        futures = []
        for i in range(CPU_TASKS + GPU1_TASKS + GPU2_TASKS):
            if i % 10 == 5:
                gpus = 2 if (i // 10) % 10 == 0 else 1
                futures.append(
                    client.submit(occupy, GPU_SECONDS, pure=False, resources={"GPU": gpus})
                )
            else:
                futures.append(client.submit(occupy, CPU_SECONDS, pure=False))
        client.gather(futures)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    bound = lower_bound()
    spans = [one_run() for _ in range(args.runs)]
    span = statistics.median(spans)
    print(
        f"makespan {span:.3f} s (median of {args.runs}: "
        f"{', '.join(f'{s:.3f}' for s in spans)}), lower bound {bound:.3f} s, "
        f"ratio {span / bound:.3f}"
    )


if __name__ == "__main__":
    main()
