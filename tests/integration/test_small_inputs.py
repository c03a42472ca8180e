"""Small inputs travel with the task that takes them, on real processes: a task taking
hundreds of small results made on other workers runs without fetching any of them (the
scheduler sends them along), so no worker ends up holding a copy of them."""

from __future__ import annotations

from typing import Any

from apportion import Client, LocalCluster, wait


def load(i: int) -> int:
    return i


def total(*xs: int) -> int:
    return sum(xs)


def holders(keys: list[str], dask_scheduler: Any) -> dict[str, list[str]]:
    """On the scheduler: the workers holding each key."""
    tasks = dask_scheduler.state.tasks
    return {key: sorted(ws.name for ws in tasks[key].who_has) for key in keys}


def test_a_task_on_many_small_inputs_made_elsewhere_fetches_none_of_them() -> None:
    workers = [
        {"name": "a", "resources": {"A": 1}},
        {"name": "b", "resources": {"B": 1}},
        {"name": "sum", "resources": {"S": 1}},
    ]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        client.wait_for_workers(3, timeout=60)
        inputs = [client.submit(load, i, resources={"A": 1}, pure=False) for i in range(300)]
        inputs += [client.submit(load, i, resources={"B": 1}, pure=False) for i in range(300)]
        wait(inputs, timeout=60)
        result = client.submit(total, *inputs, resources={"S": 1}, pure=False)
        assert result.result(timeout=60) == 2 * sum(range(300))
        held = client.run_on_scheduler(holders, [f.key for f in inputs])
        copies = {key: names for key, names in held.items() if len(names) != 1}
        assert copies == {}, f"{len(copies)} inputs were fetched: {list(copies.items())[:3]}"
        assert client.check_invariants() == []
