"""What Dask programs do that apportion must do as dask.distributed does: each test is a
program's step that failed, hung or ran differently before, on real processes."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import dask
import dask.array as da
import dask.dataframe as dd
import joblib
import numpy as np
import pandas as pd
import pytest

from apportion import (
    Actor,
    ActorFuture,
    Client,
    LocalCluster,
    Queue,
    Semaphore,
    Variable,
    as_completed,
    fire_and_forget,
    get_client,
    get_worker,
    wait,
)
from tests.integration import dask_tasks
from tests.integration.dask_tasks import Counter

# Workers import nothing from the test tree: this module's functions go by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(dask_tasks)

WORKERS = [
    {"name": "gpu", "nthreads": 1, "resources": {"GPU": 1}},
    {"name": "cpu-1", "nthreads": 1},
    {"name": "cpu-2", "nthreads": 1},
    {"name": "cpu-3", "nthreads": 1},
]


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """Four single-thread workers (one with a GPU), as in the programs that found these."""
    with LocalCluster(workers=WORKERS) as cluster, Client(cluster) as client:
        yield client


def inc(x: int) -> int:
    return x + 1


def worker_name(_: object = None) -> str:
    return get_worker().name


def slow_worker_name(_: object = None) -> str:
    time.sleep(0.5)
    return get_worker().name


# ----------------------------------------------------------------- bugs found
def test_first_imports_of_dask_dataframe_on_a_fresh_many_threaded_worker() -> None:
    # Four task threads unpickling dataframe tasks at once imported dask.dataframe
    # concurrently and failed (partially initialized module / import deadlock).
    df = dask.datasets.timeseries(start="2000-01-01", end="2000-01-08", freq="1h")
    expected = df.groupby("name").x.mean().compute(scheduler="sync")
    with LocalCluster(n_workers=1, threads_per_worker=4) as cluster, Client(cluster) as client:
        persisted = client.persist(df)
        got = client.compute(persisted.groupby("name").x.mean()).result(timeout=120)
    pd.testing.assert_series_equal(got.sort_index(), expected.sort_index())


def launcher(i: int) -> int:
    """The futures page's task that launches tasks: get_client(), submit, gather."""
    client = get_client()
    a = client.submit(inc, i, pure=False)
    b = client.submit(inc, i + 1, pure=False)
    a, b = client.gather([a, b])
    return a + b


def test_a_task_gathering_the_tasks_it_launched_does_not_hold_their_thread() -> None:
    # One worker, one thread: the launcher's subtasks need the very thread it waits on.
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
        results = [client.submit(launcher, i, pure=False).result(timeout=60) for i in range(10)]
        assert results == [2 * i + 3 for i in range(10)]
        # ...and a seceding task still runs afterwards.
        assert client.submit(launcher, 100, pure=False).result(timeout=60) == 203


def test_futures_pass_through_a_variable_and_a_queue(client: Client) -> None:
    variable = Variable("compat-v", client=client)
    future = client.submit(inc, 1, pure=False)
    variable.set(future)
    del future  # the variable holds the result now
    assert variable.get(timeout=30).result(timeout=30) == 2
    queue = Queue("compat-q", client=client)
    queue.put([client.submit(inc, 2, pure=False), "label"])
    got, label = queue.get(timeout=30)
    assert (got.result(timeout=30), label) == (3, "label")


def put_a_future(name: str) -> None:
    Queue(name).put(get_client().submit(inc, 41, pure=False))


def fail(_: object = None) -> None:
    raise ValueError("a put that failed")


def test_a_fire_and_forget_task_puts_a_future_in_a_queue(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    fire_and_forget(client.submit(put_a_future, "compat-ff", pure=False))
    assert Queue("compat-ff", client=client).get(timeout=30).result(timeout=30) == 42
    # A fire-and-forget task that fails is reported: nobody else waits for it.
    with caplog.at_level(logging.ERROR, logger="apportion.client"):
        fire_and_forget(client.submit(fail, pure=False))
        deadline = time.monotonic() + 30
        while "a put that failed" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the log for the report
    assert "fire-and-forget task" in caplog.text and "a put that failed" in caplog.text


def test_independent_dask_tasks_spread_over_idle_workers(client: Client) -> None:
    # Both depend on the graph's one chunk task: the worker holding it must not take both.
    a, b = dask.delayed(slow_worker_name)(1), dask.delayed(slow_worker_name)(2)
    first, second = client.gather(client.compute([a, b]))
    assert first != second


def test_a_persisted_dataframe_of_one_partition_computes(client: Client) -> None:
    frame = pd.DataFrame({"x": range(10), "s": list("abcdefghij")})
    for npartitions in (2, 1):
        df = dd.from_pandas(frame, npartitions=npartitions)
        expected = df.compute(scheduler="sync")
        persisted = client.persist(df)
        pd.testing.assert_frame_equal(client.compute(persisted).result(timeout=30), expected)
        assert client.compute(persisted.x.sum()).result(timeout=30) == 45


# ------------------------------------------------------------ Dask API defects
def where_tasks() -> list:
    return [dask.delayed(worker_name, pure=False)(i) for i in range(4)]


def test_options_of_get_persist_and_compute_apply_to_every_task(client: Client) -> None:
    assert set(client.compute(where_tasks(), resources={"GPU": 1}, sync=True)) == {"gpu"}
    persisted = client.persist(where_tasks(), resources={"GPU": 1})
    assert set(dask.compute(*persisted)) == {"gpu"}
    graph = {f"where-{i}": (worker_name, i) for i in range(4)}
    assert set(client.get(graph, list(graph), resources={"GPU": 1})) == {"gpu"}
    assert set(client.compute(where_tasks(), workers=["cpu-2"], sync=True)) == {"cpu-2"}
    graph = {f"where-else-{i}": (worker_name, i) for i in range(4)}
    futures = client.get(graph, list(graph), workers="cpu-3", retries=1, priority=5, sync=False)
    assert {f.result(timeout=30) for f in futures} == {"cpu-3"}


def answer(dask_scheduler: object) -> int:
    return 42


def test_run_on_scheduler_takes_a_function_of_the_users_script(client: Client) -> None:
    # Defined in a script, a function lives in __main__: by reference, the scheduler
    # looked for it in its own __main__.
    main = sys.modules["__main__"]
    answer.__module__, answer.__qualname__ = "__main__", "answer_of_main"
    main.answer_of_main = answer  # type: ignore[attr-defined]
    try:
        assert client.run_on_scheduler(answer) == 42
    finally:
        del main.answer_of_main  # type: ignore[attr-defined]
        answer.__module__, answer.__qualname__ = __name__, "answer"


def test_wait_takes_collections_and_mixed_lists(client: Client) -> None:
    array = client.persist(da.ones(10, chunks=5))
    frame = client.persist(dd.from_pandas(pd.DataFrame({"x": range(6)}), npartitions=3))
    future = client.submit(inc, 1)
    done, not_done = wait(array, timeout=30)
    assert len(done) == 2 and not not_done
    done, not_done = wait([future, frame, [array]], timeout=30)
    assert len(done) == 1 + 3 + 2 and not not_done
    assert wait(future, timeout=30).done == {future}


IMPORT_ORDER_PROGRAM = """
import sys, warnings
import dask
from apportion import Client, LocalCluster, get_worker

def where(df):
    import pandas as pd
    return pd.Series([get_worker().name] * len(df))

if __name__ == "__main__":
    workers = [{"name": "gpu", "resources": {"GPU": 1}}, {"name": "cpu"}]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        assert "dask.dataframe" not in sys.modules
        import pandas as pd
        import dask.dataframe as dd
        # Dask's "annotations ... will be ignored" fails the program; other warnings (of
        # libraries, in any thread) stay warnings, as in a user's program.
        warnings.filterwarnings("error", message=".*annotation")
        with dask.annotate(resources={"GPU": 1}):
            df = dd.from_pandas(pd.DataFrame({"x": range(100)}), npartitions=10)
            ran = df.map_partitions(where, meta=("w", str)).compute()
        print(sorted(set(ran)))
"""


def test_dataframe_annotations_hold_when_dask_dataframe_is_imported_after_the_client(
    tmp_path: Path,
) -> None:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(IMPORT_ORDER_PROGRAM))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "['gpu']"


# ------------------------------------------------------------------ missing APIs
def total_of_dataset(name: str) -> tuple[int, list[str]]:
    """Another program (a task, in its own process) reads what was published."""
    client = get_client()
    df = client.get_dataset(name)
    return int(client.compute(df.x.sum()).result(timeout=30)), client.list_datasets()


def test_published_datasets(client: Client) -> None:
    frame = pd.DataFrame({"x": range(8)})
    df = client.persist(dd.from_pandas(frame, npartitions=2))
    client.publish_dataset(df, name="compat-df")
    client.publish_dataset(small=[1, 2, 3])
    del df  # published: its chunks stay on the cluster
    total, names = client.submit(total_of_dataset, "compat-df", pure=False).result(timeout=60)
    assert total == 28 and {"compat-df", "small"} <= set(names)
    assert client.datasets["small"] == [1, 2, 3]
    with pytest.raises(KeyError, match="already published"):
        client.publish_dataset(small=[4])
    client.publish_dataset(small=[4], override=True)
    assert client.get_dataset("small") == [4]
    client.datasets["other"] = 5
    del client.datasets["other"]
    client.unpublish_dataset("small")
    client.unpublish_dataset("compat-df")
    assert "small" not in client.list_datasets()
    with pytest.raises(KeyError):
        client.get_dataset("small")
    assert client.get_dataset("small", default=None) is None


def fails_once(path: str) -> int:
    marker = Path(path)
    if not marker.exists():
        marker.write_text("failed once")
        raise ValueError("first try fails")
    return 1


def test_retry_runs_a_failed_task_and_its_failed_dependencies(
    client: Client, tmp_path: Path
) -> None:
    flaky = client.submit(fails_once, str(tmp_path / "marker"), pure=False)
    after = client.submit(inc, flaky, pure=False)
    with pytest.raises(ValueError, match="first try fails"):
        after.result(timeout=30)
    after.retry()
    assert after.result(timeout=30) == 2
    assert flaky.result(timeout=30) == 1


def test_traceback_is_a_traceback_object_of_the_remote_frames(client: Client) -> None:
    future = client.submit(fail, pure=False)
    wait(future, timeout=30)
    frames = traceback.format_tb(future.traceback())
    assert any("in fail" in frame for frame in frames)
    assert client.submit(inc, 1).traceback(timeout=30) is None


def test_sync_runs_a_coroutine_function_to_its_result(client: Client) -> None:
    async def plus_one(x: int) -> int:
        await asyncio.sleep(0)
        return x + 1

    assert client.sync(plus_one, 1) == 2
    assert client.sync(inc, 1) == 2


def test_as_completed_batches_and_update(client: Client) -> None:
    completed = as_completed([client.submit(inc, i, pure=False) for i in range(5)])
    completed.update([client.submit(inc, 10, pure=False)])
    batches = list(completed.batches())
    assert sorted(f.result() for batch in batches for f in batch) == [1, 2, 3, 4, 5, 11]
    assert completed.is_empty()


def test_semaphore_close_gives_back_the_leases_held(client: Client) -> None:
    semaphore = Semaphore(2, "compat-sem", client=client)
    assert semaphore.acquire(timeout=10) and semaphore.acquire(timeout=10)
    semaphore.close()
    assert semaphore.get_value() == 0


def test_joblib_dask_backend_runs_on_the_cluster(client: Client) -> None:
    with joblib.parallel_backend("dask"):
        names = joblib.Parallel()(joblib.delayed(worker_name)(i) for i in range(20))
    assert set(names) <= {w["name"] for w in WORKERS}
    with joblib.parallel_backend("dask", resources={"GPU": 1}):
        names = joblib.Parallel(batch_size=1)(joblib.delayed(worker_name)(i) for i in range(4))
    assert set(names) == {"gpu"}


def is_scheduler(dask_scheduler: object) -> tuple[bool, int]:
    from apportion.scheduler import Scheduler

    return isinstance(dask_scheduler, Scheduler), len(dask_scheduler.workers)  # type: ignore[attr-defined]


def test_scheduler_and_worker_classes_are_importable(client: Client) -> None:
    from apportion.worker import Worker

    assert client.run_on_scheduler(is_scheduler) == (True, len(WORKERS))
    assert isinstance(Worker, type)


def test_array_results_match_dasks_own(client: Client) -> None:
    x = da.random.default_rng(0).random((200, 200), chunks=(50, 50))
    expected = (x @ x.T).sum(axis=0).compute(scheduler="sync")
    np.testing.assert_allclose(client.compute((x @ x.T).sum(axis=0)).result(timeout=60), expected)


def increment_from_a_task(counter: Actor) -> int:
    return int(counter.increment().result())


def test_an_actor_lives_on_one_worker_and_runs_its_methods_there(client: Client) -> None:
    future = client.submit(Counter, actor=True)
    counter = future.result(timeout=30)
    assert isinstance(counter, Actor)
    calls = [counter.increment() for _ in range(10)]
    assert isinstance(calls[0], ActorFuture)
    assert sorted(call.result(timeout=30) for call in calls) == list(range(1, 11))
    assert counter.n == 10
    # A task gets a proxy of the same object.
    assert client.submit(increment_from_a_task, counter, pure=False).result(timeout=30) == 11
    del future  # the proxy alone keeps it alive
    assert counter.increment().result(timeout=30) == 12


def test_an_actor_given_as_a_future_reaches_a_task_on_another_worker() -> None:
    # A cluster of its own: the second worker has run no task, so no client exists there
    # when the proxy arrives with the task's arguments.
    workers = [{"name": "cpu-1"}, {"name": "cpu-2"}]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        future = client.submit(Counter, actor=True, workers=["cpu-1"])
        task = client.submit(increment_from_a_task, future, workers=["cpu-2"], pure=False)
        assert task.result(timeout=30) == 1
        assert future.result(timeout=30).n == 1
