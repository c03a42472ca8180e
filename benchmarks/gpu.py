"""The seed pipeline with real CUDA kernels, on a machine with an NVIDIA GPU.

    python -m benchmarks.gpu [--loads 2000] [--reps 3] [--mb 100]

Runs the kernels of ``tests/gpu/kernels.py`` (CuPy, else PyTorch): on a local cluster of
one worker holding every GPU of the machine (one thread per GPU) and one with
``MEMORY=100e9``, ``--loads`` ``load`` tasks, as many ``process`` tasks needing ``GPU=1``
(every tenth ``GPU=2`` where there are two), and one ``aggregate`` needing
``MEMORY=70e9``. Printed: the device, tasks per second for each repetition after one
warm-up run (the first CUDA call in a process pays for its context), the same kernels
called in a plain loop in one process (no scheduler) beside, and the time to pass a
``--mb`` MB device array from one GPU task to another (through host memory: it pickles to
host bytes and is made again on the receiving device). Needs no Dask or Ray.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time

import cloudpickle

from apportion import Client, LocalCluster
from tests.gpu import kernels

cloudpickle.register_pickle_by_value(kernels)


def _gpu_names() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def _pipeline(client: Client, loads: int, n_gpus: int) -> float:
    start = time.perf_counter()
    loaded = client.map(kernels.load, range(loads))
    processed = [
        client.submit(
            kernels.process, d, resources={"GPU": 2 if n_gpus >= 2 and i % 10 == 0 else 1}
        )
        for i, d in enumerate(loaded)
    ]
    final = client.submit(kernels.aggregate, *processed, resources={"MEMORY": 70e9})
    runs = final.result(timeout=600)
    assert len(runs) == loads
    return (2 * loads + 1) / (time.perf_counter() - start)


def _plain_loop(loads: int) -> float:
    """The same kernels called one after another in this process: what the GPU work
    costs without any scheduler."""
    kernels.process_here(kernels.load(0))  # CUDA context and kernel compilation
    start = time.perf_counter()
    for i in range(loads):
        kernels.process_here(kernels.load(i))
    return (2 * loads + 1) / (time.perf_counter() - start)


def _pass_ms(mb: int) -> float:
    """Milliseconds from submitting a task that makes an ``mb`` MB device array on one
    worker to a task on another worker having it on its device (both workers on unit 0
    where the machine has one GPU). Best of three after one warm-up."""
    workers = [{"name": name, "resources": {"GPU": 1}} for name in ("gpu-a", "gpu-b")]
    n, times = mb * 1_000_000 // 8, []
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        for _ in range(4):
            start = time.perf_counter()
            made = client.submit(
                kernels.make_filled, n, 7.0, resources={"GPU": 1}, workers=["gpu-a"], pure=False
            )
            taken = client.submit(
                kernels.take_on_device, made, resources={"GPU": 1}, workers=["gpu-b"]
            )
            assert taken.result(timeout=300)["first"] == 7.0
            times.append(time.perf_counter() - start)
            client.cancel([made, taken])
    return min(times[1:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--loads", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    gpus = _gpu_names()
    if not gpus or kernels.library() is None:
        raise SystemExit("benchmarks.gpu needs an NVIDIA GPU and CuPy or PyTorch with CUDA")
    n_gpus = len(gpus)
    print(f"device: {n_gpus} x {gpus[0]}; kernels through {kernels.library()}")
    workers = [
        {"name": "gpu", "nthreads": n_gpus, "resources": {"GPU": n_gpus}},
        {"name": "bigmem", "nthreads": 2, "resources": {"MEMORY": 100e9}},
    ]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        _pipeline(client, 50, n_gpus)  # warm-up
        rates = [_pipeline(client, args.loads, n_gpus) for _ in range(args.reps)]
        print(
            f"seed pipeline, {2 * args.loads + 1} tasks: "
            + ", ".join(f"{r:,.0f}" for r in rates)
            + " tasks/s"
        )
    print(
        f"{args.mb} MB device array, one worker's GPU task to another's: {_pass_ms(args.mb):.1f} ms"
    )
    print(f"plain loop in one process: {_plain_loop(args.loads):,.0f} tasks/s")


if __name__ == "__main__":
    main()
