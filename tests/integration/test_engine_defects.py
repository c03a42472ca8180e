"""Scheduling defects found from outside, each on real processes on loopback."""

from __future__ import annotations

import gc
import os
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

from apportion import Client, LocalCluster, SchedulerConnectionError, config
from tests.conftest import wait_until
from tests.integration.tasks import hold, inc


def fail(x: int) -> int:
    raise ValueError(f"no good: {x}")


def task_count(client: Client) -> int:
    return sum(client.scheduler_info()["tasks"].values())


@pytest.fixture(scope="module")
def one_worker() -> Iterator[Client]:
    with LocalCluster(n_workers=1, threads_per_worker=2) as cluster, Client(cluster) as client:
        yield client


# ------------------------------------------------- a raised result releases its future
def test_a_future_whose_result_raised_is_released_when_dropped(one_worker: Client) -> None:
    client = one_worker
    wait_until(lambda: task_count(client) == 0, what="no tasks left from earlier tests")
    future = client.submit(fail, 1)
    for _ in range(2):  # raised twice: neither raise may keep it alive
        with pytest.raises(ValueError, match="no good: 1"):
            future.result(timeout=30)
    cancelled = client.submit(hold, 30, pure=False)
    cancelled.cancel()
    with pytest.raises(Exception, match="cancelled"):
        cancelled.result(timeout=30)
    assert task_count(client) >= 1
    del future, cancelled
    wait_until(lambda: task_count(client) == 0, what="the raised futures' tasks released")


def test_each_raise_is_a_fresh_exception_with_the_remote_traceback(one_worker: Client) -> None:
    future = one_worker.submit(fail, 2)
    errors = []
    for _ in range(2):
        try:
            future.result(timeout=30)
        except ValueError as exc:
            errors.append(exc)
    assert errors[0] is not errors[1]
    assert "fail" in str(errors[1].__cause__)
    assert any("in fail" in frame for frame in traceback.format_tb(future.traceback()))


# ------------------------------------------------------------- self and duplicate deps
def test_a_task_depending_on_itself_is_refused_at_submit(one_worker: Client) -> None:
    client = one_worker
    first = client.submit(hold, 30, key="loop", pure=False)
    first.cancel()
    wait_until(first.cancelled, what="the first 'loop' cancelled")
    with pytest.raises(ValueError, match="'loop' would depend on itself"):
        client.submit(inc, first, key="loop")
    # Nothing was sent: the key is free for a proper task.
    del first
    assert client.submit(inc, 1, key="loop").result(timeout=30) == 2


def test_a_dependency_passed_twice_counts_once(one_worker: Client) -> None:
    client = one_worker
    x = client.submit(inc, 10)
    assert client.submit(lambda a, b: a + b, x, x).result(timeout=30) == 22
    assert client.submit(sum, [x, x, x]).result(timeout=30) == 33


# ----------------------------------------------------- submissions larger than a frame
def test_a_map_larger_than_a_frame_is_split_and_only_a_huge_argument_fails() -> None:
    limit = 2_000_000
    with config.set({"comm.max-frame-bytes": limit}):
        with LocalCluster(n_workers=1) as cluster, Client(cluster) as client:
            pieces = [os.urandom(100_000) for _ in range(50)]  # 5 MB in all
            futures = client.map(len, pieces)
            assert client.gather(futures) == [100_000] * 50
            with pytest.raises(ValueError) as refused:
                client.map(len, [b"small", b"x" * 3_000_000])
            text = str(refused.value)
            assert "3,000,0" in text and f"{limit - 4096:,}" in text
            assert "comm.max-frame-bytes" in text
            # The connection survived both.
            assert client.submit(inc, 1).result(timeout=30) == 2


# ----------------------------------------- results not fetched when the scheduler is lost
def big_result(size: int) -> bytes:
    return b"r" * size


def test_an_unfetched_result_stays_fetchable_from_its_worker_when_the_scheduler_is_gone() -> None:
    with config.set({"client.reconnect-timeout": 1.0}):
        cluster = LocalCluster(n_workers=1)
        client = Client(cluster)
        try:
            small = client.submit(big_result, 100)
            large = client.submit(big_result, 200_000)  # above worker.inline-result-bytes
            assert small.exception(timeout=30) is None and large.exception(timeout=30) is None
            pending = client.submit(hold, 60, pure=False)
            cluster.kill_scheduler()
            with pytest.raises(SchedulerConnectionError, match="no scheduler answered"):
                pending.result(timeout=30)
            assert small.result() == b"r" * 100  # travelled with its completion
            # Workers keep their results without a scheduler: fetched from the holder.
            assert large.result(timeout=30) == b"r" * 200_000
        finally:
            client.close()
            cluster.close()


# ------------------------------------------------------------- memory goes on release
def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_released_large_result_leaves_the_workers_memory() -> None:
    size = 200_000_000
    with LocalCluster(n_workers=1, threads_per_worker=2) as cluster, Client(cluster) as client:
        (before,) = client.run(rss_bytes).values()
        future = client.submit(big_result, size)
        assert len(future.result(timeout=60)) == size  # fetched: a pickled copy was made
        gc.collect()
        del future
        wait_until(lambda: task_count(client) == 0, what="the result released")
        wait_until(
            lambda: next(iter(client.run(rss_bytes).values())) < before + size // 4,
            timeout=30,
            what="the worker's memory back near where it started",
        )


# ------------------------------------------------------------- priority and prefetch
def wait_for_file(path: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)  # polling for a file the test creates
    return True


def logged(tag: str, log: str, gate: str | None = None) -> str:
    """Append ``tag`` to ``log`` when it starts; then wait for ``gate`` to exist, if given."""
    with open(log, "a") as handle:
        handle.write(tag + "\n")
    if gate is not None and not wait_for_file(gate):
        raise TimeoutError(f"gate {gate} never opened")
    return tag


def processing(client: Client) -> int:
    return sum(w["processing"] for w in client.scheduler_info()["workers"].values())


def test_an_urgent_task_runs_before_less_urgent_work_already_prefetched(tmp_path: Path) -> None:
    log, gate = str(tmp_path / "log"), str(tmp_path / "gate")
    with config.set({"scheduler.worker-prefetch": 1}):
        with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
            blocker = client.submit(logged, "blocker", log, gate)
            wait_until(lambda: os.path.exists(log), what="the blocker running")
            prefetched = client.submit(logged, "prefetched", log)
            wait_until(lambda: processing(client) == 2, what="the prefetch slot taken")
            urgent = client.submit(logged, "urgent", log, priority=10)
            # Known to the scheduler (which places a task as it learns of it).
            wait_until(lambda: task_count(client) == 3, what="the urgent task submitted")
            Path(gate).touch()
            client.gather([blocker, prefetched, urgent])
    assert Path(log).read_text().split() == ["blocker", "urgent", "prefetched"]


# ------------------------------------------------------------------------- replicas
def test_a_copy_fetched_for_a_task_survives_the_original_holder(tmp_path: Path) -> None:
    log, started, gate = str(tmp_path / "log"), str(tmp_path / "started"), str(tmp_path / "gate")
    workers = [
        {"name": "origin", "resources": {"ORIGIN": 1}},
        {"name": "user", "resources": {"USER": 1}},
    ]
    # A recomputation of x could never run (no other worker has ORIGIN): it would fail
    # after a second, and so would anything that still counted on it.
    with config.set({"scheduler.no-worker-timeout": 1}):
        with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
            x = client.submit(unique_blob, log, resources={"ORIGIN": 1})
            y = client.submit(
                len_after, x, started, gate, resources={"USER": 1}
            )  # fetches x from origin, then waits
            wait_until(lambda: os.path.exists(started), what="y running with its input")
            cluster.kill_worker("origin")
            wait_until(lambda: len(client.scheduler_info()["workers"]) == 1, what="origin gone")
            tag, blob = x.result(timeout=30)  # the copy on "user", not a recomputation
            assert len(blob) == 100_000
            assert Path(log).read_text().split() == [tag]
            Path(gate).touch()
            assert y.result(timeout=30) == 100_000
            assert client.check_invariants() == []


def unique_blob(log: str) -> tuple[str, bytes]:
    import uuid

    tag = uuid.uuid4().hex
    with open(log, "a") as handle:
        handle.write(tag + "\n")
    return tag, bytes(100_000)


def len_after(x: tuple[str, bytes], started: str, gate: str) -> int:
    Path(started).touch()
    if not wait_for_file(gate):
        raise TimeoutError(f"gate {gate} never opened")
    return len(x[1])
