"""Large results between workers of one host through shared memory (apportion/shared_memory.py),
on real processes: which path a transfer took (each worker's counters), that the bytes
are right, that a peer elsewhere (another pid namespace, as another pod) or a cluster
with it turned off gets them over TCP, and that no segment outlives its result: after
release, client close, cluster close, and SIGKILL of the worker that made it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from apportion import Client, LocalCluster, config, shared_memory
from apportion.auth import TOKEN_ENV
from apportion.data import copy_to_every_worker
from tests.conftest import wait_until

TWO_WORKERS = [{"name": "a", "resources": {"A": 1}}, {"name": "b", "resources": {"B": 1}}]
N = 3_000_000  # 24 MB of float64: above shared_memory.SHARED_MIN_BYTES
SEGMENT_NAME = "memfd:apportion-result"


def counters() -> dict[str, int]:
    return dict(shared_memory.counters)


def counts(client: Client, cluster: LocalCluster) -> dict[str, dict[str, int]]:
    """Each worker's counters, by name."""
    names = {info["address"]: info["name"] for info in client.scheduler_info()["workers"].values()}
    return {names[address]: c for address, c in client.run(counters).items()}


def segments(pid: int) -> set[int]:
    """The inodes of the shared-memory results a process holds open or mapped."""
    inodes: set[int] = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if SEGMENT_NAME in os.readlink(f"/proc/{pid}/fd/{fd}"):
                    inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
            except OSError:
                continue
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                if SEGMENT_NAME in line:
                    inodes.add(int(line.split()[4]))
    except OSError:  # gone, or not ours
        pass
    return inodes


def segments_anywhere(inodes: set[int]) -> set[int]:
    """Which of ``inodes`` any process on this machine still holds (freed otherwise)."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found |= segments(int(entry)) & inodes
    return found


def cluster_segments(cluster: LocalCluster) -> set[int]:
    return {i for pid in cluster.worker_pids.values() for i in segments(pid)}


def shm_entries() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if "apportion" in name}


def introduce(client: Client, names: list[str] = ["a", "b"]) -> None:  # noqa: B006
    """The client, on the workers' host, gathers a result from each: from then on they
    write large results to shared memory (nobody on their host had asked before)."""
    for name in names:
        assert client.submit(np.ones, 20_000, workers=[name], pure=False).result(timeout=60)[0]


def scribble(x: np.ndarray) -> float:
    """A task writing to its input: changes its own copy only."""
    x[:] = -1.0
    return float(x.sum())


def mapped_from_shared_memory(x: np.ndarray) -> bool:
    """Whether the array this task got lies in a shared-memory result."""
    address = np.asarray(x).__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            if SEGMENT_NAME in line:
                start, end = (int(part, 16) for part in line.split()[0].split("-"))
                if start <= address < end:
                    return True
    return False


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(workers=TWO_WORKERS) as cluster:
        yield cluster


def test_a_large_result_moves_between_workers_of_one_host_through_shared_memory(
    cluster: LocalCluster,
) -> None:
    with Client(cluster) as client:
        introduce(client)
        before = counts(client, cluster)
        made = client.submit(np.arange, N, dtype="f8", resources={"A": 1})
        total = client.submit(np.sum, made, resources={"B": 1})
        assert total.result(timeout=60) == pytest.approx(N * (N - 1) / 2)
        after = counts(client, cluster)
        assert after["a"].get("exported", 0) == before["a"].get("exported", 0) + 1
        assert after["a"].get("served", 0) == before["a"].get("served", 0) + 1
        assert after["b"].get("mapped", 0) == before["b"].get("mapped", 0) + 1
        assert after["b"].get("fallbacks", 0) == before["b"].get("fallbacks", 0)
        # The input b's task got is a view of the shared memory, not a copy.
        on_b = client.submit(mapped_from_shared_memory, made, resources={"B": 1})
        assert on_b.result(timeout=60) is True
        # Copy-on-write: a task writing to its input on b leaves a's result unchanged.
        assert client.submit(scribble, made, resources={"B": 1}).result(timeout=60) == -N
        again = client.submit(np.sum, made, resources={"A": 1})
        assert again.result(timeout=60) == pytest.approx(N * (N - 1) / 2)
        np.testing.assert_array_equal(made.result(timeout=60), np.arange(N, dtype="f8"))
        assert client.check_invariants() == []


def test_a_worker_nobody_on_its_host_asked_keeps_its_results_private() -> None:
    """As a worker alone in its Kubernetes pod: nothing to share with, no copy made."""
    with LocalCluster(workers=TWO_WORKERS) as cluster, Client(cluster) as client:
        made = client.submit(np.arange, N, dtype="f8", resources={"A": 1})
        assert client.submit(np.size, made, resources={"A": 1}).result(timeout=60) == N
        assert not counts(client, cluster)["a"] and not cluster_segments(cluster)
        # b's fetch is the first request from a's host: this one goes over TCP...
        assert client.submit(np.size, made, resources={"B": 1}).result(timeout=60) == N
        assert counts(client, cluster) == {"a": {}, "b": {}}
        # ...and the next large result is shared.
        again = client.submit(np.arange, N, dtype="f8", resources={"A": 1}, pure=False)
        assert client.submit(np.sum, again, resources={"B": 1}).result(timeout=60) > 0
        found = counts(client, cluster)
        assert found["a"] == {"exported": 1, "served": 1} and found["b"] == {"mapped": 1}


def test_small_results_keep_going_over_tcp(cluster: LocalCluster) -> None:
    with Client(cluster) as client:
        before = counts(client, cluster)
        made = client.submit(np.arange, 1_000, dtype="f8", resources={"A": 1})
        total = client.submit(np.sum, made, resources={"B": 1})
        assert total.result(timeout=60) == pytest.approx(999 * 1000 / 2)
        assert counts(client, cluster) == before


def test_segments_are_freed_when_results_are_released_and_when_the_client_closes(
    cluster: LocalCluster,
) -> None:
    with Client(cluster) as client:
        introduce(client)
        wait_until(lambda: not cluster_segments(cluster), what="no segment held before")
        made = client.submit(np.arange, N, dtype="f8", resources={"A": 1})
        total = client.submit(np.sum, made, resources={"B": 1})
        assert total.result(timeout=60) == pytest.approx(N * (N - 1) / 2)
        held = cluster_segments(cluster)
        assert len(held) == 1  # one segment, held by both workers
        assert segments(cluster.worker_pids["a"]) == segments(cluster.worker_pids["b"])
        del made, total
        wait_until(lambda: not segments_anywhere(held), what="released segment freed")
        kept = client.submit(np.ones, N, resources={"A": 1})
        assert client.submit(np.sum, kept, resources={"B": 1}).result(timeout=60) == N
        held = cluster_segments(cluster)
        assert held
    # The client closed with its future still held: its results are released.
    wait_until(lambda: not segments_anywhere(held), what="segment freed after client close")


def test_a_client_on_the_same_host_maps_what_it_gathers(cluster: LocalCluster) -> None:
    with Client(cluster) as client:
        introduce(client)
        mapped = shared_memory.counters["mapped"]
        made = client.submit(np.arange, N, dtype="f8", resources={"A": 1})
        gathered = made.result(timeout=60)
        assert shared_memory.counters["mapped"] == mapped + 1
        np.testing.assert_array_equal(gathered, np.arange(N, dtype="f8"))
        assert mapped_from_shared_memory(gathered)
        gathered[0] = 7.0  # the client's own copy (copy-on-write)...
        assert client.submit(np.sum, made, resources={"A": 1}).result(timeout=60) == pytest.approx(
            N * (N - 1) / 2
        )  # ...the worker's is unchanged
        held = segments(os.getpid())
        assert len(held) == 1
        del made  # released on the cluster: the client's array stays whole
        wait_until(lambda: not cluster_segments(cluster), what="released on the workers")
        assert gathered[1:].sum() == pytest.approx(N * (N - 1) / 2)
        del gathered
        assert not segments_anywhere(held)


def test_no_segment_outlives_its_cluster() -> None:
    names = shm_entries()
    with LocalCluster(workers=TWO_WORKERS) as cluster, Client(cluster) as client:
        introduce(client)
        made = client.submit(np.arange, N, dtype="f8", resources={"A": 1})
        assert client.submit(np.sum, made, resources={"B": 1}).result(timeout=60) > 0
        held = cluster_segments(cluster)
        assert held
    assert not segments_anywhere(held)
    assert shm_entries() == names  # nothing named in /dev/shm, ever


def test_after_sigkill_of_the_maker_its_segment_is_gone_and_the_result_is_recomputed() -> None:
    workers = [{"name": "a"}, {"name": "b"}]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        introduce(client, ["a"])
        made = client.submit(np.arange, N, dtype="f8", workers=["a"], allow_other_workers=True)
        assert client.submit(np.size, made, workers=["a"]).result(timeout=60) == N
        maker = cluster.worker_pids["a"]
        held = segments(maker)
        assert len(held) == 1
        cluster.kill_worker("a")
        assert not segments_anywhere(held)
        total = client.submit(np.sum, made)
        assert total.result(timeout=60) == pytest.approx(N * (N - 1) / 2)
        assert client.check_invariants() == []


def test_a_mapped_copy_stays_valid_after_sigkill_of_the_maker_and_is_freed_on_release() -> None:
    with LocalCluster(workers=TWO_WORKERS) as cluster, Client(cluster) as client:
        introduce(client)
        made = client.submit(np.arange, N, dtype="f8", resources={"A": 1})
        # A copy kept on purpose (as scatter(broadcast=True) makes them): one fetched only
        # as a task's input is dropped once the task is done.
        copy_to_every_worker(client.session, [made], timeout=60)
        assert client.submit(np.sum, made, resources={"B": 1}).result(timeout=60) > 0
        held = segments(cluster.worker_pids["a"])
        assert held and held == segments(cluster.worker_pids["b"])
        cluster.kill_worker("a")
        # b's replica is b's own mapping of the same memory: still whole.
        again = client.submit(np.sum, made, resources={"B": 1})
        assert again.result(timeout=60) == pytest.approx(N * (N - 1) / 2)
        np.testing.assert_array_equal(made.result(timeout=60), np.arange(N, dtype="f8"))
        del made, again
        wait_until(lambda: not segments_anywhere(held), what="replica's segment freed")


def test_with_shared_memory_turned_off_results_go_over_tcp() -> None:
    with (
        config.set({"worker.shared-memory": False}),
        LocalCluster(workers=TWO_WORKERS) as cluster,
        Client(cluster) as client,
    ):
        introduce(client)
        made = client.submit(np.arange, N, dtype="f8", resources={"A": 1})
        total = client.submit(np.sum, made, resources={"B": 1})
        assert total.result(timeout=60) == pytest.approx(N * (N - 1) / 2)
        assert all(not c for c in counts(client, cluster).values())
        assert not cluster_segments(cluster)


def _own_pid_namespace() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-Urpf", "--mount-proc", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _own_pid_namespace(), reason="cannot create a pid namespace here")
def test_a_worker_in_another_pid_namespace_gets_the_bytes_over_tcp(tmp_path: Path) -> None:
    """As a pod of the same node: same kernel, not the same processes in /proc."""
    with LocalCluster(workers=TWO_WORKERS[:1]) as cluster, Client(cluster) as client:
        log = (tmp_path / "worker.log").open("w")
        worker = subprocess.Popen(
            [
                *("unshare", "-Urpf", "--mount-proc", "--kill-child"),
                *(sys.executable, "-m", "apportion", "worker", cluster.scheduler_address),
                *("--name", "elsewhere", "--resources", "B=1"),
            ],
            env={**os.environ, TOKEN_ENV: cluster.token},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            client.wait_for_workers(2, timeout=60)
            introduce(client, ["a"])  # a shares from now on (the client is on its host)
            made = client.submit(np.arange, N, dtype="f8", resources={"A": 1})
            total = client.submit(np.sum, made, resources={"B": 1})
            assert total.result(timeout=60) == pytest.approx(N * (N - 1) / 2)
            found = counts(client, cluster)
            assert found["a"].get("exported") == 1  # in shared memory on a...
            assert not found["a"].get("served")  # ...but not offered to b
            assert not found["elsewhere"]
        finally:
            worker.kill()  # and the worker with it (--kill-child)
            worker.wait(timeout=30)
            log.close()
