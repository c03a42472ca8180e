"""The pure decisions behind clusters: their default shape, the dashboard's port, what a
worker is told of its memory, how an adapting cluster sizes itself, when a waiting worker
logs, and the totals a repr shows."""

from __future__ import annotations

import pytest

from apportion.backoff import QuietRetries
from apportion.cluster_base import AdaptiveState, adaptive_target
from apportion.local import DEFAULT, dashboard_port, default_shape, worker_memory_argument
from apportion.memory_limit import available_memory
from apportion.reprs import Summary, cluster_text, format_bytes, summarise


@pytest.mark.parametrize(
    ("cpus", "n_workers", "threads", "shape"),
    [
        (1, None, None, (1, 1)),
        (2, None, None, (2, 1)),
        (4, None, None, (4, 1)),
        (6, None, None, (3, 2)),
        (8, None, None, (4, 2)),
        (12, None, None, (4, 3)),
        (16, None, None, (4, 4)),
        (7, None, None, (7, 1)),  # a prime: Dask's choice too
        (8, 2, None, (2, 4)),
        (8, None, 4, (2, 4)),
        (2, None, 4, (1, 4)),
        (2, 4, None, (4, 1)),
        (8, 3, 5, (3, 5)),
    ],
)
def test_the_default_shape_uses_every_core_as_dask_does(
    cpus: int, n_workers: int | None, threads: int | None, shape: tuple[int, int]
) -> None:
    assert default_shape(cpus, n_workers, threads) == shape


def test_the_dashboard_port_follows_dasks_dashboard_address() -> None:
    assert dashboard_port(DEFAULT, DEFAULT, "127.0.0.1") == (8787, True)
    assert dashboard_port(":0", DEFAULT, "127.0.0.1") == (0, False)
    assert dashboard_port("127.0.0.1:9000", DEFAULT, "127.0.0.1") == (9000, False)
    assert dashboard_port("localhost:9000", DEFAULT, "127.0.0.1") == (9000, False)
    assert dashboard_port(9001, DEFAULT, "127.0.0.1") == (9001, False)
    assert dashboard_port(None, DEFAULT, "127.0.0.1") == (None, False)
    assert dashboard_port(DEFAULT, None, "127.0.0.1") == (None, False)
    assert dashboard_port(DEFAULT, 0, "127.0.0.1") == (0, False)
    with pytest.raises(ValueError, match="not both"):
        dashboard_port(":0", 0, "127.0.0.1")
    with pytest.raises(ValueError, match="names no port"):
        dashboard_port("127.0.0.1", DEFAULT, "127.0.0.1")
    with pytest.raises(ValueError, match="give host="):
        dashboard_port("10.1.2.3:8787", DEFAULT, "127.0.0.1")


def test_memory_limits_reach_each_worker_in_bytes_auto_shared_among_them() -> None:
    machine = available_memory()
    assert int(worker_memory_argument("auto", nworkers=4)) == machine // 4
    assert worker_memory_argument(None, nworkers=2) == worker_memory_argument("auto", 2)
    assert worker_memory_argument(0) == "0"  # Dask's "no limit"
    assert worker_memory_argument(2**30) == str(2**30)
    assert worker_memory_argument(1.5e9) == "1500000000"
    assert worker_memory_argument(" 4GB ") == "4000000000"
    assert worker_memory_argument("4GiB") == str(4 * 2**30)
    with pytest.raises(ValueError, match=">= 0"):
        worker_memory_argument(-1)
    with pytest.raises(ValueError, match="lots"):
        worker_memory_argument("lots")
    with pytest.raises(TypeError):
        worker_memory_argument([1])


def _info(workers: list[tuple[int, int]], queued: int = 0, no_worker: int = 0) -> dict:
    return {
        "workers": {
            f"w{i}": {"nthreads": threads, "processing": processing}
            for i, (threads, processing) in enumerate(workers)
        },
        "tasks": {"queued": queued, "no-worker": no_worker},
    }


def test_an_adapting_cluster_grows_at_once_and_shrinks_only_after_patience() -> None:
    state = AdaptiveState()
    assert adaptive_target(_info([], no_worker=5), 0, 10, state) == 5
    assert adaptive_target(_info([(2, 2)], queued=5), 0, 3, state) == 3  # capped
    assert adaptive_target(_info([(2, 2)] * 4), 0, 10, state) == 4  # busy: as is
    idle = _info([(2, 0)] * 4)
    assert [adaptive_target(idle, 1, 10, state) for _ in range(4)] == [4, 4, 1, 4]
    assert adaptive_target(_info([(2, 0)] * 2), 3, 10, AdaptiveState()) == 3  # the minimum


def test_a_waiting_loop_logs_each_time_its_wait_has_doubled() -> None:
    reports = QuietRetries()
    times = [0.0, 0.05, 0.15, 0.35, 0.75, 1.55, 3.15, 5.15, 7.15, 9.15, 300.0]
    assert [t for t in times if reports.due(t)] == [0.0, 1.55, 3.15, 5.15, 9.15, 300.0]


def test_reprs_show_totals_as_dask_does() -> None:
    workers = {
        "a": {"nthreads": 2, "memory_limit": 2**30, "resources": {"GPU": 2}},
        "b": {"nthreads": 4, "memory_limit": None, "resources": {"GPU": 1, "MEMORY": 1e9}},
    }
    summary = summarise(workers)
    assert summary == Summary(2, 6, 2**30, {"GPU": 3, "MEMORY": 1e9})
    assert format_bytes(None) == "no limit" and format_bytes(1536 << 20) == "1.50 GiB"
    text = cluster_text("LocalCluster", "tcp://h:1", summary, "http://h:2/dashboard?token=x")
    assert text.startswith("LocalCluster('tcp://h:1', workers=2, threads=6, memory=1.00 GiB")
    assert text.endswith("dashboard=http://h:2/dashboard)") and "token" not in text
    assert "not answering" in cluster_text("LocalCluster", "tcp://h:1", None, "")
