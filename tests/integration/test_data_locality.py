"""Large inputs stay where they are, on real processes: a task whose input is large runs on
the worker holding it, even when another worker stands idle, and that worker's copies of
inputs it fetched are dropped once no task there needs them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from apportion import Client, LocalCluster, config, get_worker, wait
from tests.conftest import wait_until

MIB = 2**20
CHUNK = 2 * MIB


def make_chunk(i: int) -> tuple[str, bytes]:
    """A large input that knows where it was made."""
    return get_worker().name, bytes([i % 251]) * CHUNK


def where(chunk: tuple[str, bytes], seconds: float) -> tuple[str, str]:
    """Where the chunk was made, and where this task on it runs."""
    time.sleep(seconds)  # the workload itself
    return chunk[0], get_worker().name


def joined(first: tuple[str, bytes], second: tuple[str, bytes]) -> int:
    return len(first[1]) + len(second[1])


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    # 2 MiB is large here; the wait for the holder is long enough (20 s) that nothing
    # moves however slow the machine is.
    settings = {"scheduler.locality-bytes": MIB, "scheduler.bandwidth": 1e5}
    with (
        config.set(settings),
        LocalCluster(n_workers=2, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        yield client


def test_every_task_on_a_large_input_runs_on_its_inputs_worker(client: Client) -> None:
    names = sorted(w["name"] for w in client.scheduler_info()["workers"].values())
    assert len(names) == 2
    # Twice as many chunks on one worker as on the other: the other runs out of its own
    # work first and stands idle while the first still has chunks to sum.
    placed = [names[0]] * 12 + [names[1]] * 6
    chunks = [client.submit(make_chunk, i, workers=[name]) for i, name in enumerate(placed)]
    wait(chunks, timeout=60)
    pairs = client.gather([client.submit(where, chunk, 0.05) for chunk in chunks])
    assert [made for made, _ in pairs] == placed
    moved = [(made, ran) for made, ran in pairs if made != ran]
    assert moved == [], f"{len(moved)} of {len(pairs)} tasks ran away from their input"
    assert client.check_invariants() == []


def test_small_inputs_still_spread_over_idle_workers(client: Client) -> None:
    small = client.submit(lambda: (get_worker().name, b"x"), pure=False)
    wait([small], timeout=60)
    pairs = client.gather([client.submit(where, small, 0.3, pure=False) for _ in range(2)])
    assert {ran for _, ran in pairs} == {w["name"] for w in _workers(client)}


def test_a_fetched_input_is_dropped_once_no_task_there_needs_it(client: Client) -> None:
    names = sorted(w["name"] for w in _workers(client))
    first = client.submit(make_chunk, 1, workers=[names[0]], pure=False)
    second = client.submit(make_chunk, 2, workers=[names[1]], pure=False)
    wait([first, second], timeout=60)
    each_its_own = {names[0]: 1, names[1]: 1}
    wait_until(lambda: _held(client) == each_its_own, timeout=30, what="one chunk on each")
    # Runs on one of them, fetching the other's chunk.
    assert client.submit(joined, first, second, pure=False).result(timeout=60) == 2 * CHUNK
    # The copy is dropped: each worker holds its own chunk again (and a tiny result).
    wait_until(
        lambda: _held(client) == each_its_own,
        timeout=30,
        what="the fetched chunk dropped",
    )
    assert client.check_invariants() == []


def _workers(client: Client) -> list[dict[str, Any]]:
    return list(client.scheduler_info()["workers"].values())


def _held(client: Client) -> dict[str, int]:
    """Chunks' worth of results each worker holds, as the scheduler knows them."""
    return {w["name"]: w["nbytes"] // CHUNK for w in _workers(client)}
