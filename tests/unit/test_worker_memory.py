"""The worker's memory decisions (worker/memory.py) and its spill store (worker/spill.py)."""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from apportion.worker.memory import Decision, Thresholds, decide, process_memory
from apportion.worker.spill import (
    SpillBuffer,
    SpillWriter,
    new_spill_directory,
    remove_stale_directories,
    size_of,
)
from apportion.worker.state import WorkerState

from apportion import config

MIB = 1024**2
LIMIT = 1000 * MIB
DASK = Thresholds(0.6, 0.7, 0.8, 0.95)


def test_no_limit_means_nothing_is_ever_done() -> None:
    assert decide(None, 10**12, 10**12, False, DASK) == Decision(0, False, False)


def test_results_beyond_target_are_spilled_down_to_it() -> None:
    assert decide(LIMIT, 500 * MIB, 700 * MIB, False, DASK).spill == 700 * MIB - int(0.6 * LIMIT)


def test_process_memory_past_spill_spills_results_until_back_at_target() -> None:
    # 750 MiB in the process, 300 of them results: spill 150 to get to 600.
    decision = decide(LIMIT, 750 * MIB, 300 * MIB, False, DASK)
    assert decision.spill == 750 * MIB - int(0.6 * LIMIT)
    assert not decision.paused and not decision.terminate


def test_only_results_can_be_spilled() -> None:
    assert decide(LIMIT, 790 * MIB, 20 * MIB, False, DASK).spill == 20 * MIB


def test_pause_above_the_threshold_and_resume_below() -> None:
    assert decide(LIMIT, 810 * MIB, 0, False, DASK).paused
    assert decide(LIMIT, 810 * MIB, 0, True, DASK).paused
    assert not decide(LIMIT, 790 * MIB, 0, True, DASK).paused


def test_terminate_above_its_threshold() -> None:
    assert decide(LIMIT, 960 * MIB, 0, False, DASK).terminate


def test_each_threshold_can_be_off() -> None:
    off = Thresholds(None, None, None, None)
    assert decide(LIMIT, 2 * LIMIT, LIMIT, False, off) == Decision(0, False, False)
    # Without target, the spill threshold is also the level spilled down to.
    only_spill = Thresholds(None, 0.7, None, None)
    assert decide(LIMIT, 800 * MIB, 500 * MIB, False, only_spill).spill == 800 * MIB - int(
        0.7 * LIMIT
    )


def test_thresholds_come_from_the_configuration() -> None:
    assert Thresholds.from_config() == DASK
    with config.set({"worker.memory.pause": False, "worker.memory.target": 0.5}):
        assert Thresholds.from_config() == Thresholds(0.5, 0.7, None, 0.95)


def test_a_threshold_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(Exception, match=r"worker\.memory\.spill.*1\.5"):
        with config.set({"worker.memory.spill": 1.5}):
            Thresholds.from_config()


def test_process_memory_is_measured() -> None:
    assert process_memory() > 10 * MIB


# ------------------------------------------------------------------------- spilling
def test_least_recently_used_results_are_spilled_first(tmp_path: Path) -> None:
    store = SpillBuffer(tmp_path / "spill")
    for name in "abc":
        store[name] = np.full(MIB, ord(name), dtype=np.uint8)
    store["a"]  # used: now the most recent
    assert store.evict(MIB) == MIB
    assert list(store.slow) == ["b"]
    assert set(store) == {"a", "b", "c"} and len(store) == 3
    assert store.fast_bytes == 2 * MIB and store.spilled_bytes >= MIB


def test_a_spilled_result_reads_back_equal_and_is_evicted_again_without_a_write(
    tmp_path: Path,
) -> None:
    store = SpillBuffer(tmp_path / "spill")
    array = np.arange(MIB, dtype=np.float64)
    store["x"] = array
    store["small"] = {"a": [1, 2, 3]}
    store.evict(10**12)
    assert store.fast_bytes == 0 and len(list((tmp_path / "spill").iterdir())) == 2
    back = store["x"]
    np.testing.assert_array_equal(back, array)
    assert store["small"] == {"a": [1, 2, 3]}
    assert (store.spilled_count, store.unspilled_count) == (2, 2)
    # Read back, the files stay: evicting again writes nothing, and reads back the same.
    assert store.evict(10**12) == size_of(array) + size_of({"a": [1, 2, 3]})
    assert store.spilled_count == 2
    np.testing.assert_array_equal(store["x"], array)
    del store["x"], store["small"]
    assert list((tmp_path / "spill").iterdir()) == []


def test_large_buffers_go_out_of_band_not_inside_the_pickle(tmp_path: Path) -> None:
    store = SpillBuffer(tmp_path / "spill")
    store["x"] = np.zeros(4 * MIB, dtype=np.uint8)
    store.evict(1)
    spilled = store.slow["x"]
    assert spilled.buffers == (4 * MIB,) and spilled.pickle_bytes < 1024


def test_a_released_result_frees_its_file(tmp_path: Path) -> None:
    store = SpillBuffer(tmp_path / "spill")
    store["x"] = b"x" * MIB
    store.evict(1)
    del store["x"]
    assert "x" not in store and list((tmp_path / "spill").iterdir()) == []
    with pytest.raises(KeyError):
        del store["x"]


def test_a_result_that_does_not_pickle_stays_in_memory_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SpillBuffer(tmp_path / "spill")
    store["lock"] = threading.Lock()
    store["data"] = b"d" * 1000
    store.evict(10**9)
    store.evict(10**9)
    assert "lock" in store.fast and "data" in store.slow
    assert len([r for r in caplog.records if "cannot be spilled" in r.message]) == 1


def test_results_of_classes_made_at_run_time_spill_too(tmp_path: Path) -> None:
    class Point:  # not importable by name: only cloudpickle writes it
        def __init__(self, x: int) -> None:
            self.x = x

    store = SpillBuffer(tmp_path / "spill")
    store["p"] = Point(3)
    store.evict(10**9)
    assert "p" in store.slow and store["p"].x == 3


def test_close_removes_the_directory(tmp_path: Path) -> None:
    store = SpillBuffer(tmp_path / "spill")
    store["x"] = b"x" * 100
    store.evict(1)
    store.close()
    assert not (tmp_path / "spill").exists() and len(store) == 0


def test_directories_of_dead_workers_are_removed_at_start(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    root = tmp_path / "apportion-spill"
    stale = root / f"{int(dead.stdout)}-abcd"
    alive = root / f"{os.getpid()}-ef01"
    for directory in (stale, alive):
        directory.mkdir(parents=True)
        (directory / "0.pkl").write_bytes(b"x")
    mine = new_spill_directory(str(tmp_path))
    assert not stale.exists() and alive.exists()
    assert mine.parent == root and mine.name.startswith(f"{os.getpid()}-")
    assert remove_stale_directories(tmp_path / "absent") == []


def test_a_closing_worker_removes_the_directories_of_dead_workers_too(tmp_path: Path) -> None:
    # A worker killed last left its directory where no successor started before the
    # cluster closed (the kill storm with spilling saw one, once).
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    root = tmp_path / "apportion-spill"
    stale = root / f"{int(dead.stdout)}-abcd"
    stale.mkdir(parents=True)
    (stale / "0.pkl").write_bytes(b"x")
    store = SpillBuffer(root / f"{os.getpid()}-ef01")
    store.close()
    assert list(root.iterdir()) == []


def test_the_state_machine_holds_results_in_the_spill_store(tmp_path: Path) -> None:
    store = SpillBuffer(tmp_path / "spill")
    state = WorkerState(1, {}, "w", data=store)
    run = state.compute({"key": "k", "run_id": 1, "func": b"", "args": b""})
    (execute,) = run
    value = np.ones(1000)
    state.report_run(execute.task, True, value, pickle.dumps(value))
    state.free_run(execute.task)
    store.evict(10**9)
    assert "k" in state.data
    assert state.registration_report()["held"] == {"k": len(pickle.dumps(value))}
    state.free_keys(["k"])
    assert len(store) == 0 and not state.check_invariants()


def test_paused_no_ready_task_starts_until_resumed() -> None:
    state = WorkerState(1, {}, "w")
    assert [type(i).__name__ for i in state.memory_pressure(True)] == ["Send"]
    assert state.compute({"key": "k", "run_id": 1, "func": b"", "args": b""}) == []
    assert state.memory_pressure(True) == []  # no change, nothing to say
    resumed = state.memory_pressure(False)
    assert resumed[0].message == {"op": "worker-status", "status": "running"}  # type: ignore[union-attr]
    assert [type(i).__name__ for i in resumed[1:]] == ["Execute"]
    assert not state.check_invariants()


def test_a_pause_tells_the_scheduler_the_memory_that_decided_it() -> None:
    state = WorkerState(1, {}, "w")
    (send,) = state.memory_pressure(True, {"rss": 900, "limit": 1000})
    assert send.message == {  # type: ignore[union-attr]
        "op": "worker-status",
        "status": "paused",
        "memory": {"rss": 900, "limit": 1000},
    }


def test_a_spilled_result_freed_by_the_scheduler_is_not_read_back(tmp_path: Path) -> None:
    store = SpillBuffer(tmp_path / "spill")
    state = WorkerState(1, {}, "w", data=store)
    (execute,) = state.compute({"key": "k", "run_id": 1, "func": b"", "args": b""})
    state.report_run(execute.task, True, np.ones(1000), b"x" * 8000)
    state.free_run(execute.task)
    store.evict(10**9)
    state.free_keys(["k"])
    assert store.unspilled_count == 0 and len(store) == 0


def test_nearly_full_is_the_lower_spilling_level_reached() -> None:
    from apportion.worker.memory import nearly_full

    limit = 1000
    assert not nearly_full(limit, 599, Thresholds())
    assert nearly_full(limit, 600, Thresholds())  # target 0.6 is below spill 0.7
    assert not nearly_full(limit, 690, Thresholds(target=None))
    assert nearly_full(limit, 700, Thresholds(target=None))
    assert nearly_full(limit, 800, Thresholds(target=None, spill=None))  # pause then
    assert not nearly_full(limit, 999, Thresholds(None, None, None, 0.95))
    assert not nearly_full(None, 10**12, Thresholds())  # no limit: never


# ------------------------------------------------- what is written, and who waits for it
def _scan(store: SpillBuffer, keys: list[str], target: int) -> None:
    """A pass over every result, as tasks reading each do, with the worker's spill after
    each run (down to ``target``)."""
    for key in keys:
        store[key]
        if store.fast_bytes > target:
            store.evict(store.fast_bytes - target)


def test_passes_over_spilled_results_write_nothing_that_stayed_in_memory(
    tmp_path: Path,
) -> None:
    store = SpillBuffer(tmp_path / "spill")
    target = 3 * MIB
    keys = [f"chunk-{i}" for i in range(8)]
    for i, key in enumerate(keys):  # persisted: the last three stay in memory
        store[key] = np.full(MIB, i, dtype=np.uint8)
        if store.fast_bytes > target:
            store.evict(store.fast_bytes - target)
    assert (store.spilled_count, store.spilled_total) == (5, 5 * MIB)
    assert list(store.fast) == keys[5:]
    for _ in range(2):
        _scan(store, keys, target)
    # Each pass read back the five on disk, dropping the copies read before: the three
    # results that never left memory were not written out to make room.
    assert (store.spilled_count, store.spilled_total) == (5, 5 * MIB)
    assert store.unspilled_count == 10 and store.fast_bytes <= target
    assert set(keys[5:]) <= set(store.fast)
    for i, key in enumerate(keys):
        np.testing.assert_array_equal(store[key], np.full(MIB, i, dtype=np.uint8))


def test_a_read_back_beyond_the_target_drops_an_older_copy_at_once(tmp_path: Path) -> None:
    store = SpillBuffer(tmp_path / "spill", target=2 * MIB)
    for name in "abc":
        store[name] = np.full(MIB, ord(name), dtype=np.uint8)
    store.evict(10**9)
    store["a"], store["b"]
    assert store.fast_bytes == 2 * MIB
    store["c"]  # over the target: the copy of "a" (least recently used) goes, unwritten
    assert list(store.fast) == ["b", "c"] and store.fast_bytes == 2 * MIB
    assert store.spilled_count == 3 and "a" in store.slow
    # A result never written is not dropped there: that takes a write (evict's).
    store["d"] = np.zeros(MIB, dtype=np.uint8)
    assert list(store.fast) == ["c", "d"] and store.spilled_count == 3


def _fifo_spill(store: SpillBuffer, tmp_path: Path) -> tuple[int, Path]:
    """Make the store's next spill file a pipe, opened for reading: the thread that spills
    into it blocks in its write once the pipe is full, until the pipe is drained."""
    directory = store.directory
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "0.pkl"
    os.mkfifo(path)
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK), path


def _drain(fd: int) -> bytes:
    """Read the pipe until its writer closes it."""
    chunks = []
    while True:
        readable, _, _ = select.select([fd], [], [], 60)
        assert readable, "the spilling thread wrote nothing for 60 s"
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def test_nobody_waits_for_a_value_being_written_to_disk(tmp_path: Path) -> None:
    store = SpillBuffer(tmp_path / "spill")
    array = np.arange(MIB, dtype=np.uint8)
    store["a"] = array
    store["b"] = b"b" * 100
    fd, path = _fifo_spill(store, tmp_path)
    spiller = threading.Thread(target=store.evict, args=(1,))
    spiller.start()
    try:
        readable, _, _ = select.select([fd], [], [], 60)  # it is writing "a" now
        assert readable
        others: list[Any] = []

        def use_the_store() -> None:
            store["c"] = b"c" * 100
            others.extend([store["a"] is array, store["b"], "c" in store, len(store)])

        user = threading.Thread(target=use_the_store)
        user.start()
        user.join(30)  # a bound: waiting on the disk would keep it here
        assert not user.is_alive(), "a store and a read waited for another value's write"
        assert others == [True, b"b" * 100, True, 3]
    finally:
        written = _drain(fd)
        spiller.join(60)
        os.close(fd)
    path.unlink()
    path.write_bytes(written)  # what went through the pipe, as a file: read back from it
    assert "a" in store.slow
    np.testing.assert_array_equal(store["a"], array)


def test_a_value_released_while_it_is_written_leaves_no_file(tmp_path: Path) -> None:
    store = SpillBuffer(tmp_path / "spill")
    store["a"] = np.arange(MIB, dtype=np.uint8)
    fd, path = _fifo_spill(store, tmp_path)
    spiller = threading.Thread(target=store.evict, args=(1,))
    spiller.start()
    try:
        readable, _, _ = select.select([fd], [], [], 60)
        assert readable
        releaser = threading.Thread(target=store.__delitem__, args=("a",))
        releaser.start()
        releaser.join(30)  # a bound: waiting on the disk would keep it here
        assert not releaser.is_alive(), "the release waited for the value's write"
    finally:
        _drain(fd)
        spiller.join(60)
        os.close(fd)
    assert len(store) == 0 and store.spilled_count == 0 and not path.exists()


def test_two_threads_checking_memory_at_once_spill_once(tmp_path: Path) -> None:
    from apportion.worker.server import Worker

    settings = {
        "worker.memory.spill-directory": str(tmp_path),
        "worker.memory.spill": False,  # only the target decides: no measure of the process
        "worker.memory.pause": False,
        "worker.memory.terminate": False,
    }
    with config.set(settings):
        worker = Worker("tcp://127.0.0.1:9", memory_limit=10 * MIB)
    store = worker.data
    assert store is not None
    for i in range(4):  # 8 MiB against a target of 6: 2 MiB to spill
        store[f"r{i}"] = np.full(2 * MIB, i, dtype=np.uint8)
    fd, _ = _fifo_spill(store, tmp_path)
    first = threading.Thread(target=worker.check_memory)  # the monitor's thread, say
    first.start()
    try:
        readable, _, _ = select.select([fd], [], [], 60)  # writing the first result now
        assert readable
        # A task thread after its run, meanwhile: its measure must follow the first spill.
        second = threading.Thread(target=worker.check_memory)
        second.start()
        second.join(2)  # (time enough to spill too, were it deciding on the same measure)
    finally:
        _drain(fd)
        first.join(60)
        os.close(fd)
    second.join(60)
    assert store.spilled_count == 1 and store.fast_bytes == 6 * MIB
    store.close()


def test_after_a_run_results_are_spilled_by_their_sizes_not_the_process_measure(
    tmp_path: Path,
) -> None:
    from apportion.worker.server import Worker

    settings = {
        "worker.memory.spill-directory": str(tmp_path),
        "worker.memory.pause": False,  # this process is far past the small limit
        "worker.memory.terminate": False,
    }
    limit = 40 * MIB
    assert process_memory() > 0.7 * limit  # so the process measure would spill it all
    with config.set(settings):
        worker = Worker("tcp://127.0.0.1:9", memory_limit=limit)
    store = worker.data
    assert store is not None
    for i in range(4):  # 32 MiB of results against a target of 24
        store[f"r{i}"] = np.full(8 * MIB, i, dtype=np.uint8)
    worker.spill_to_target()
    assert list(store.slow) == ["r0"] and store.fast_bytes == 24 * MIB
    worker.spill_to_target()  # at the target: nothing more
    assert store.spilled_count == 1
    # The monitor's measure of the process is the backstop: it spills the rest.
    worker.check_memory()
    assert store.fast_bytes == 0
    store.close()


def test_results_beyond_the_target_are_what_a_stored_result_spills() -> None:
    from apportion.worker.memory import beyond_target

    assert beyond_target(600, 664) == 64
    assert beyond_target(600, 600) == 0 and beyond_target(600, 10) == 0


def test_a_stored_result_spills_down_to_room_for_one_more_within_the_target() -> None:
    from apportion.worker.memory import spill_goal

    assert spill_goal(600, 64) == 536  # room for the next 64 MB result under the target
    assert spill_goal(600, 0) == 600
    assert spill_goal(600, 10_000) == 450  # room kept is at most a quarter of the target


def _worker_spilling_by_sizes(tmp_path: Path, limit: int, **settings: Any) -> Any:
    """A worker (not started) whose only spilling is by the results' sizes after runs."""
    from apportion.worker.server import Worker

    defaults = {
        "worker.memory.spill-directory": str(tmp_path),
        "worker.memory.spill": False,
        "worker.memory.pause": False,
        "worker.memory.terminate": False,
    }
    with config.set({**defaults, **settings}):
        return Worker("tcp://127.0.0.1:9", memory_limit=limit)


def _wait_for(condition: Any, what: str, timeout: float = 60) -> None:
    done = threading.Event()
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {timeout} s"
        done.wait(0.01)


def test_a_task_thread_starts_its_next_task_while_the_older_result_is_written(
    tmp_path: Path,
) -> None:
    worker = _worker_spilling_by_sizes(tmp_path, 40 * MIB)  # a target of 24 MiB
    store = worker.data
    for i in range(5):  # 20 MiB: room for one more 4 MiB result within the target
        store[f"r{i}"] = np.full(4 * MIB, i, dtype=np.uint8)
        worker.spill_after_run(f"r{i}")
    assert store.spilled_count == 0
    fd, _ = _fifo_spill(store, tmp_path)  # r0's write blocks until the pipe is drained
    try:
        store["r5"] = np.full(4 * MIB, 5, dtype=np.uint8)  # at the target
        after_run = threading.Thread(target=worker.spill_after_run, args=("r5",))
        after_run.start()
        after_run.join(30)  # a bound: waiting for r0's write would keep it here
        assert not after_run.is_alive(), "the task thread waited for a write within the target"
        readable, _, _ = select.select([fd], [], [], 60)
        assert readable, "r0 is not being written in the background"
        # The next result brings the results beyond the target: its run's thread waits for
        # r0's write (the room it makes), so memory peaks no higher than before.
        store["r6"] = np.full(4 * MIB, 6, dtype=np.uint8)
        beyond = threading.Thread(target=worker.spill_after_run, args=("r6",))
        beyond.start()
        beyond.join(0.5)
        assert beyond.is_alive(), "results beyond the target did not wait for room"
    finally:
        _drain(fd)
        os.close(fd)
    beyond.join(60)
    assert not beyond.is_alive() and store.fast_bytes <= 24 * MIB
    _wait_for(lambda: store.fast_bytes == 20 * MIB, "spilled down to room for one more")
    assert list(store.slow) == ["r0", "r1"] and worker.memory_report()["spill_wait_seconds"] > 0
    worker._spill_writer.stop()
    store.close()


def test_a_paused_worker_resumes_as_soon_as_a_spill_ends(tmp_path: Path) -> None:
    import asyncio

    # The monitor never looks (it is not started): only the spill's end can resume it.
    worker = _worker_spilling_by_sizes(
        tmp_path, 40 * 1024 * MIB, **{"worker.memory.target": 0.0005, "worker.memory.pause": 0.8}
    )
    worker._loop = asyncio.new_event_loop()  # (where the resumption is told to the scheduler)
    try:
        store = worker.data
        thresholds = worker.memory_thresholds
        # Paused by a measure, as the monitor pauses it (this process is past a tiny pause).
        worker.memory_thresholds = thresholds._replace(pause=1e-6)
        worker.check_memory()
        assert worker.state.paused
        worker.memory_thresholds = thresholds  # far under its pause threshold now
        for i in range(3):  # 24 MiB against a target of about 20 MiB
            store[f"r{i}"] = np.full(8 * MIB, i, dtype=np.uint8)
        worker.spill_after_run("r2")
        _wait_for(lambda: not worker.state.paused, "resumed after the spill")
        assert store.spilled_count >= 1
        paused = worker.memory_report()["paused_seconds"]
        assert paused > 0 and worker.memory_report()["paused_seconds"] == paused
    finally:
        worker._spill_writer.stop()
        worker._loop.close()
        worker.data.close()


def test_the_spill_writer_waits_for_room_only_while_it_can_make_some(tmp_path: Path) -> None:
    store = SpillBuffer(tmp_path / "spill")
    writer = SpillWriter(store, threading.Lock())
    store["a"] = np.full(MIB, 1, dtype=np.uint8)
    waiting = threading.Thread(target=writer.wait_below, args=(0,))
    waiting.start()  # nothing asked: nothing to wait for
    waiting.join(30)
    assert not waiting.is_alive()
    writer.spill_to(0)
    writer.wait_below(0)
    assert store.fast_bytes == 0 and list(store.slow) == ["a"]
    store["b"] = threading.Lock()  # cannot be written: waiting ends when the writer gives up
    writer.spill_to(0)
    writer.wait_below(0)
    assert "b" in store.fast
    writer.stop()
    store.close()
