"""The client API on the seed cluster: errors, dependencies, cancel, retries, run, gather."""

from __future__ import annotations

import os
import threading
import traceback
from pathlib import Path

import pytest

from apportion import (
    FIRST_COMPLETED,
    CancelledError,
    Client,
    as_completed,
    get_worker,
    wait,
)
from tests.conftest import wait_until
from tests.integration.tasks import hold, inc


def _divide_by_zero(x: int) -> float:
    return _inner(x)


def _inner(x: int) -> float:
    return x / 0


def test_task_errors_reach_the_client_with_type_and_remote_traceback(client: Client) -> None:
    future = client.submit(_divide_by_zero, 1)
    with pytest.raises(ZeroDivisionError) as info:
        future.result(timeout=30)
    remote = str(info.value.__cause__)
    assert "_inner" in remote and "ZeroDivisionError" in remote
    assert future.status == "error"
    assert isinstance(future.exception(), ZeroDivisionError)
    assert "_inner" in "".join(traceback.format_tb(future.traceback()))


def test_dependents_of_a_failed_task_fail_with_its_error(client: Client) -> None:
    bad = client.submit(_divide_by_zero, 2)
    downstream = client.submit(inc, bad)
    with pytest.raises(ZeroDivisionError):
        downstream.result(timeout=30)


def test_futures_nested_in_arguments_are_resolved_on_the_worker(client: Client) -> None:
    a, b, c = client.submit(inc, 1), client.submit(inc, 2), client.submit(inc, 3)
    nested = client.submit(lambda d: d["x"][0] + d["x"][1][0] + d["y"], {"x": [a, (b,)], "y": c})
    assert nested.result(timeout=30) == 2 + 3 + 4


def test_aggregate_fetches_results_from_the_peers_that_hold_them(client: Client) -> None:
    parts = client.map(hold, [0] * 12, range(12), resources={"GPU": 1})
    total = client.submit(
        lambda rs: sorted(r["tag"] for r in rs), parts, resources={"MEMORY": 70e9}
    )
    assert total.result(timeout=30) == list(range(12))


def test_large_results_are_fetched_from_the_worker(client: Client) -> None:
    big = client.submit(os.urandom, 2_000_000, pure=False)
    assert len(big.result(timeout=30)) == 2_000_000
    assert client.submit(len, big).result(timeout=30) == 2_000_000


def test_pure_calls_share_a_key_and_impure_ones_do_not(client: Client) -> None:
    assert client.submit(inc, 10).key == client.submit(inc, 10).key
    assert client.submit(inc, 10, pure=False).key != client.submit(inc, 10, pure=False).key
    assert client.submit(inc, 10, key="mine").key == "mine"


def test_cancel_stops_waiting_and_frees_resources(idle_client: Client) -> None:
    blocker = idle_client.submit(hold, 1.0, "cancel-me", resources={"GPU": 2}, pure=False)
    wait_until(
        lambda: (
            blocker.status == "pending"
            and any(
                w["used_resources"].get("GPU")
                for w in idle_client.scheduler_info()["workers"].values()
            )
        ),
        what="task running",
    )
    assert blocker.cancel()
    with pytest.raises(CancelledError):
        blocker.result(timeout=30)
    assert blocker.cancelled()


def test_retries_rerun_a_flaky_task(client: Client, tmp_path: Path) -> None:
    counter = tmp_path / "attempts"

    def flaky() -> int:
        attempts = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(attempts))
        if attempts < 3:
            raise RuntimeError(f"flaky attempt {attempts}")
        return attempts

    assert client.submit(flaky, retries=2, pure=False).result(timeout=30) == 3
    counter.unlink()
    with pytest.raises(RuntimeError, match="flaky attempt 2"):
        client.submit(flaky, retries=1, pure=False).result(timeout=30)


def test_run_calls_a_function_in_every_worker_process(client: Client) -> None:
    names = client.run(lambda: get_worker().name)
    assert sorted(names.values()) == ["bigmem", "gpu-a", "gpu-b"]
    info = client.scheduler_info()["workers"]
    assert set(names) == set(info)
    assert {info[a]["name"]: info[a]["resources"] for a in info}["gpu-a"] == {"GPU": 2}


def test_get_worker_outside_a_task_says_where_it_works() -> None:
    with pytest.raises(ValueError, match="only inside a task"):
        get_worker()


def test_wait_and_as_completed(client: Client) -> None:
    futures = client.map(hold, [0.01, 0.2], ["fast", "slow"], pure=False)
    done, _ = wait(futures, timeout=30, return_when=FIRST_COMPLETED)
    assert done
    finished = [f.result()["tag"] for f in as_completed(futures, timeout=30)]
    assert sorted(finished) == ["fast", "slow"]
    assert wait(futures, timeout=30).not_done == set()


def test_gather_keeps_structure_and_can_skip_errors(client: Client) -> None:
    good, bad = client.submit(inc, 5), client.submit(_divide_by_zero, 3)
    assert client.gather({"a": [good, (good,)], "b": 7}) == {"a": [6, (6,)], "b": 7}
    assert client.gather([good, bad], errors="skip") == [6]


def test_client_is_thread_safe(client: Client) -> None:
    results: list[int] = []

    def submit_many(offset: int) -> None:
        futures = client.map(inc, range(offset, offset + 200))
        results.extend(client.gather(futures))

    threads = [threading.Thread(target=submit_many, args=(i * 1000,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(results) == sorted(
        x + 1 for i in range(4) for x in range(i * 1000, i * 1000 + 200)
    )


def test_threads_doing_round_trips_at_once_share_keys(client: Client) -> None:
    """Each submit may be written by its own thread; the same pure keys are dropped and
    submitted again by other threads meanwhile, so a release must never overtake them."""
    errors: list[BaseException] = []

    def round_trips() -> None:
        try:
            for i in range(100):
                assert client.submit(inc, i % 7).result(timeout=30) == i % 7 + 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=round_trips) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert not any(thread.is_alive() for thread in threads)


def test_unpicklable_argument_is_a_clear_error_at_submit(client: Client) -> None:
    with pytest.raises(TypeError, match="cannot serialize task arguments"):
        client.submit(inc, threading.Lock())
