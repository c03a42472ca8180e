"""Resource-constrained placement on real processes: the guarantees users rely on."""

from __future__ import annotations

import math

import pytest

from apportion import Client, LocalCluster, annotate
from tests.conftest import wait_until
from tests.integration.tasks import hold, inc, peak_concurrency, peak_use


def test_tasks_run_only_where_declared_resources_cover_the_demand(idle_client: Client) -> None:
    gpu = idle_client.map(hold, [0.001] * 40, range(40), resources={"GPU": 1})
    memory = idle_client.map(hold, [0.001] * 5, range(5), resources={"MEMORY": 70e9})
    gpu_workers = {r["worker"] for r in idle_client.gather(gpu)}
    memory_workers = {r["worker"] for r in idle_client.gather(memory)}
    assert gpu_workers <= {"gpu-a", "gpu-b"}
    assert memory_workers == {"bigmem"}


def test_gpu_tasks_never_exceed_declared_gpus_despite_spare_threads(idle_client: Client) -> None:
    # Each GPU worker has 4 threads but only 2 GPUs: at most 2 GPU=1 tasks at once.
    futures = idle_client.map(hold, [0.05] * 24, range(24), resources={"GPU": 1})
    records = idle_client.gather(futures)
    peaks = peak_use(records, "GPU")
    assert max(peaks.values()) <= 2
    assert max(peaks.values()) == 2, "GPU workers should run two GPU=1 tasks side by side"


def test_two_gpu_tasks_hold_the_whole_worker(idle_client: Client) -> None:
    futures = [
        idle_client.submit(hold, 0.03, i, resources={"GPU": 2 if i % 3 == 0 else 1})
        for i in range(18)
    ]
    records = idle_client.gather(futures)
    assert max(peak_use(records, "GPU").values()) <= 2
    for record in records:
        units = record["units"]["GPU"]
        assert len(units) == record["resources"]["GPU"]
        assert set(units) <= {0, 1}


def test_granted_gpu_units_never_overlap_on_one_worker(idle_client: Client) -> None:
    records = idle_client.gather(
        idle_client.map(hold, [0.02] * 16, range(16), resources={"GPU": 1})
    )
    for a in records:
        for b in records:
            overlap = a["start"] < b["end"] and b["start"] < a["end"]
            if a is not b and a["worker"] == b["worker"] and overlap:
                assert a["units"]["GPU"] != b["units"]["GPU"]


def test_multi_resource_demand_is_limited_by_its_scarcest_resource() -> None:
    # A=2 but B=1: tasks needing {A:1, B:1} run one at a time despite 4 threads.
    worker = {"name": "ab", "nthreads": 4, "resources": {"A": 2, "B": 1}}
    with LocalCluster(workers=[worker]) as cluster, Client(cluster) as client:
        records = client.gather(client.map(hold, [0.03] * 8, range(8), resources={"A": 1, "B": 1}))
        assert peak_concurrency(records) == {"ab": 1}
        plain = client.gather(client.map(hold, [0.05] * 8, range(8)))
        assert peak_concurrency(plain)["ab"] > 1, "unconstrained tasks use all threads"


def test_used_resources_are_exact_while_running_and_zero_when_idle(idle_client: Client) -> None:
    futures = idle_client.map(hold, [0.5] * 4, range(4), resources={"GPU": 1})

    def gpu_in_use() -> float:
        workers = idle_client.scheduler_info()["workers"].values()
        return sum(w["used_resources"].get("GPU", 0) for w in workers)

    wait_until(lambda: gpu_in_use() == 4, what="four GPUs in use")
    assert idle_client.check_invariants() == []
    idle_client.gather(futures)
    wait_until(lambda: gpu_in_use() == 0, what="GPUs released")


def test_annotate_applies_to_submit_and_map_and_explicit_arguments_win(
    idle_client: Client,
) -> None:
    with annotate(resources={"MEMORY": 70e9}):
        annotated = idle_client.submit(hold, 0, "annotated")
        mapped = idle_client.map(hold, [0, 0], ["m1", "m2"])
        explicit = idle_client.submit(hold, 0, "explicit", resources={"GPU": 1})
    assert idle_client.gather(annotated)["worker"] == "bigmem"
    assert {r["worker"] for r in idle_client.gather(mapped)} == {"bigmem"}
    assert idle_client.gather(explicit)["resources"] == {"GPU": 1}


@pytest.mark.parametrize(
    ("resources", "error", "words"),
    [
        ({"GPU": -1}, ValueError, "zero or more, got -1"),
        ({"GPU": math.nan}, ValueError, "finite"),
        ({"GPU": "two"}, TypeError, "must be a number"),
        ({"GPU": True}, TypeError, "must be a number"),
        ({"": 1}, ValueError, "invalid resource name"),
        ({3: 1}, TypeError, "must be a string"),
        (["GPU"], TypeError, "mapping"),
    ],
)
def test_invalid_demands_are_rejected_before_anything_is_sent(
    client: Client, resources: object, error: type[Exception], words: str
) -> None:
    before = client.scheduler_info()["tasks"]
    with pytest.raises(error, match=words):
        client.submit(inc, 1, resources=resources)
    with pytest.raises(error, match=words):
        client.map(inc, [1, 2], resources=resources)
    assert client.scheduler_info()["tasks"] == before
