"""Placement groups on real processes: gangs of GPUs reserved at once (workers declare GPU=...
without devices), tasks in their bundles, a waiting gang not starved by small tasks, worker
loss, and the reason a group can never be placed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apportion import Client, LocalCluster, NoValidWorkerError, PlacementGroup, annotate, config
from tests.conftest import wait_until
from tests.integration.tasks import hold, peak_use

TWO_GPU_WORKERS = [{"name": f"gpu-{i}", "nthreads": 4, "resources": {"GPU": 2}} for i in range(2)]


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with LocalCluster(workers=TWO_GPU_WORKERS) as cluster, Client(cluster) as client:
        yield client


@pytest.fixture
def idle(client: Client) -> Iterator[Client]:
    yield client
    wait_until(lambda: not _gpus_in_use(client), what="every GPU given back")
    assert client.check_invariants() == []


def _gpus_in_use(client: Client) -> dict[str, float]:
    return {
        w["name"]: w["used_resources"]["GPU"]
        for w in client.scheduler_info()["workers"].values()
        if w["used_resources"].get("GPU")
    }


def _names(client: Client) -> dict[str, str]:
    return {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}


def test_a_gang_runs_each_rank_in_its_bundle_with_the_bundles_units(idle: Client) -> None:
    client = idle
    with client.placement_group([{"GPU": 2}] * 2, strategy="strict_spread") as pg:
        assert isinstance(pg, PlacementGroup)
        pg.ready(timeout=30)
        hosts = [_names(client)[address] for address in pg.workers]
        assert sorted(hosts) == ["gpu-0", "gpu-1"]
        futures = [
            client.submit(hold, 0.05, rank, placement_group=pg, bundle_index=rank)
            for rank in range(2)
        ]
        records = client.gather(futures)
        for rank, record in enumerate(records):
            assert record["worker"] == hosts[rank]
            assert record["units"] == {"GPU": [0, 1]}  # the whole bundle, numbered
        # Every GPU is in the gang: an ordinary GPU task waits for its removal.
        outside = client.submit(hold, 0.01, "outside", resources={"GPU": 1})
        assert _gpus_in_use(client) == {"gpu-0": 2, "gpu-1": 2}
        assert outside.status == "pending"
    assert client.gather(outside)["tag"] == "outside"


def test_tasks_sharing_a_bundle_never_use_more_than_it_holds(idle: Client) -> None:
    client = idle
    pg = client.placement_group([{"GPU": 2}], strategy="strict_pack").ready(timeout=30)
    with annotate(placement_group=pg, resources={"GPU": 1}):
        futures = client.map(hold, [0.05] * 8, range(8))
    records = client.gather(futures)
    assert max(peak_use(records, "GPU").values()) <= 2
    assert {r["worker"] for r in records} == {_names(client)[pg.workers[0]]}
    pg.remove()


def test_a_waiting_gang_is_not_starved_by_a_stream_of_small_tasks(idle: Client) -> None:
    client = idle
    small = client.map(hold, [0.05] * 60, range(60), resources={"GPU": 1}, pure=False)
    wait_until(lambda: len(_gpus_in_use(client)) == 2, what="the small tasks running")
    pg = client.placement_group([{"GPU": 2}] * 2, strategy="strict_spread")
    pg.ready(timeout=60)
    # The gang got every GPU while most small tasks still waited (no starvation), and
    # holds them whole (no half gang).
    assert sum(f.done() for f in small) < len(small)
    assert _gpus_in_use(client) == {"gpu-0": 2, "gpu-1": 2}
    pg.remove()
    client.gather(small)


def test_a_group_no_workers_could_ever_host_says_why(idle: Client) -> None:
    pg = idle.placement_group([{"GPU": 3}], strategy="pack")
    with pytest.raises(NoValidWorkerError, match="no set of the 2 connected workers"):
        pg.ready(timeout=0.5)
    pg.remove()


def test_a_lost_worker_s_bundle_is_placed_again_and_its_rank_runs_there() -> None:
    workers = [{"name": f"gpu-{i}", "resources": {"GPU": 1}} for i in range(3)]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        pg = client.placement_group([{"GPU": 1}] * 2, strategy="strict_spread").ready(30)
        lost = _names(client)[pg.workers[1]]
        cluster.kill_worker(lost)
        wait_until(lambda: len(client.scheduler_info()["workers"]) == 2, what="worker gone")
        pg.ready(timeout=30)
        names = _names(client)
        assert names[pg.workers[1]] not in (lost, names[pg.workers[0]])
        record = client.submit(hold, 0.01, 1, placement_group=pg, bundle_index=1).result(30)
        assert record["worker"] == names[pg.workers[1]]
        assert client.check_invariants() == []


def test_mistakes_are_refused_on_the_client_with_what_to_do(idle: Client) -> None:
    client = idle
    with pytest.raises(ValueError, match="strategy must be one of"):
        client.placement_group([{"GPU": 1}], strategy="scatter")
    with pytest.raises(ValueError, match="non-empty list"):
        client.placement_group({"GPU": 1})  # type: ignore[arg-type]
    with client.placement_group([{"GPU": 1}]) as pg:
        with pytest.raises(ValueError, match="bundle_index 1 out of range"):
            client.submit(hold, 0, placement_group=pg, bundle_index=1)
        with pytest.raises(ValueError, match="bundle_index needs a placement_group"):
            client.submit(hold, 0, bundle_index=0)
        info = client.scheduler_info()["placement_groups"][pg.id]
        assert info["strategy"] == "pack"


def test_ready_gives_up_on_a_group_no_worker_could_host_after_the_no_worker_timeout() -> None:
    workers = [{"name": "gpu-0", "nthreads": 1, "resources": {"GPU": 1}}]
    with (
        config.set({"scheduler.no-worker-timeout": 0.5}),
        LocalCluster(workers=workers) as cluster,
        Client(cluster) as client,
        client.placement_group([{"GPU": 1}] * 2, strategy="strict_spread") as pg,
        pytest.raises(NoValidWorkerError, match=r"waited 0.5s \(scheduler.no-worker-timeout\)"),
    ):
        pg.ready()  # no timeout of its own: the scheduler's applies
