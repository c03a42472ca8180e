"""apportion on a real NVIDIA GPU: the seed pipeline with CUDA kernels, each task on the
device of the unit it was granted; a child process seeing exactly its units through
CUDA_VISIBLE_DEVICES; a device array passed between tasks (through host memory: a device
array pickles to host bytes and is made again on the receiving device)."""

from __future__ import annotations

import itertools
import time

from apportion import Client, LocalCluster
from tests.gpu import kernels


def _cluster(n_gpus: int) -> LocalCluster:
    return LocalCluster(
        workers=[
            {"name": "gpu", "nthreads": n_gpus, "resources": {"GPU": n_gpus}},
            {"name": "bigmem", "nthreads": 2, "resources": {"MEMORY": 100e9}},
        ]
    )


def test_the_seed_pipeline_runs_each_kernel_on_its_granted_unit(gpus: list[str]) -> None:
    n_gpus, loads = len(gpus), 200
    with _cluster(n_gpus) as cluster, Client(cluster) as client:
        start = time.perf_counter()
        loaded = client.map(kernels.load, range(loads))
        processed = [
            client.submit(
                kernels.process,
                d,
                resources={"GPU": 2 if n_gpus >= 2 and i % 10 == 0 else 1},
            )
            for i, d in enumerate(loaded)
        ]
        final = client.submit(kernels.aggregate, *processed, resources={"MEMORY": 70e9})
        runs = final.result(timeout=600)
        elapsed = time.perf_counter() - start
    n = kernels.N
    for i, run in enumerate(runs):
        # sum((k + i) ** 2 for k in range(n)), in closed form
        expected = (n - 1) * n * (2 * n - 1) / 6 + i * n * (n - 1) + n * i * i
        assert abs(run["sum"] - expected) <= 1e-9 * expected
        assert run["device"] == run["units"][0]
    # No unit ever ran two kernels at once.
    for unit in range(n_gpus):
        spans = sorted((r["start"], r["end"]) for r in runs if unit in r["units"])
        assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans))
    print(f"seed pipeline on {n_gpus} x {gpus[0]}: {(2 * loads + 1) / elapsed:,.0f} tasks/s")


def test_a_child_process_sees_exactly_its_tasks_units(gpus: list[str]) -> None:
    with _cluster(len(gpus)) as cluster, Client(cluster) as client:
        seen = client.submit(kernels.child_sees, resources={"GPU": 1}).result(timeout=300)
    assert seen["count"] == 1
    assert seen["ids"] == seen["mine"]


def test_a_device_array_passes_between_tasks_through_host_memory(gpus: list[str]) -> None:
    with _cluster(len(gpus)) as cluster, Client(cluster) as client:
        made = client.submit(kernels.make_on_device, 7.0, resources={"GPU": 1})
        taken = client.submit(kernels.take_on_device, made, resources={"GPU": 1})
        result = taken.result(timeout=300)
        back = made.result(timeout=300)  # the client makes it again on its own device
    assert result["device"] == result["unit"]
    assert result["first"] == 7.0
    assert float(kernels.to_host(back)[0]) == 7.0
