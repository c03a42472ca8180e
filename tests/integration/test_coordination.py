"""Variable, Queue, Event, Lock and Semaphore on real processes: shared by clients and
tasks through the scheduler."""

from __future__ import annotations

import sys
import time

import cloudpickle
import pytest

from apportion import Client, Event, Lock, Queue, Semaphore, Variable
from apportion.coordination import CoordinationError
from tests.integration.tasks import peak_concurrency

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def read_variable(name: str) -> object:
    return Variable(name).get(timeout=30)


def produce(name: str, items: list[int]) -> int:
    queue = Queue(name)
    for item in items:
        queue.put(item)
    return len(items)


def wait_for_event(name: str) -> bool:
    return Event(name).wait(timeout=60)


def guarded(semaphore: Semaphore, seconds: float, tag: int) -> dict:
    with semaphore:
        start = time.monotonic()
        time.sleep(seconds)  # the work the semaphore guards
        return {"tag": tag, "worker": "cluster", "start": start, "end": time.monotonic()}


def test_a_variable_set_by_one_client_is_read_by_another_and_by_tasks(
    client: Client, seed_cluster: object
) -> None:
    Variable("model-version", client).set({"version": 3})
    with Client(seed_cluster) as other:
        assert Variable("model-version", other).get(timeout=10) == {"version": 3}
    assert client.submit(read_variable, "model-version", pure=False).result(30) == {"version": 3}
    Variable("model-version", client).delete()
    with pytest.raises(TimeoutError, match=r"not set within 0\.2s"):
        Variable("model-version", client).get(timeout=0.2)


def test_variable_get_waits_until_it_is_set(client: Client) -> None:
    future = client.submit(read_variable, "late-variable", pure=False)
    time.sleep(0.2)  # the task is waiting meanwhile (no assertion depends on this)
    assert not future.done()
    Variable("late-variable", client).set("now")
    assert future.result(30) == "now"


def test_a_queue_carries_items_from_tasks_to_the_client_in_order(client: Client) -> None:
    queue = Queue("results", client)
    assert client.submit(produce, "results", [1, 2, 3], pure=False).result(30) == 3
    assert [queue.get(timeout=10) for _ in range(3)] == [1, 2, 3]
    assert queue.qsize() == 0
    queue.put("a")
    queue.put("b")
    assert queue.get(batch=True) == ["a", "b"]
    with pytest.raises(TimeoutError, match="stayed empty"):
        queue.get(timeout=0.2)


def test_an_event_releases_the_tasks_waiting_for_it(client: Client) -> None:
    event = Event("go", client)
    assert event.wait(timeout=0.1) is False
    waiting = [client.submit(wait_for_event, "go", pure=False) for _ in range(3)]
    assert not any(f.done() for f in waiting)
    event.set()
    assert client.gather(waiting) == [True, True, True]
    assert event.is_set()
    event.clear()
    assert not event.is_set()


def test_a_semaphore_caps_concurrency_across_the_cluster(client: Client) -> None:
    # 10 threads across the seed cluster, but only 2 leases.
    semaphore = Semaphore(2, "db-connections", client)
    futures = [client.submit(guarded, semaphore, 0.1, i, pure=False) for i in range(8)]
    records = client.gather(futures)
    assert peak_concurrency(records) == {"cluster": 2}
    assert semaphore.get_value() == 0


def test_a_lock_is_exclusive_and_released_when_its_holder_disconnects(
    client: Client, seed_cluster: object
) -> None:
    lock = Lock("exclusive", client)
    with Client(seed_cluster) as other:
        assert Lock("exclusive", other).acquire(timeout=5)
        assert lock.locked()
        assert lock.acquire(timeout=0.2) is False
        assert lock.acquire(blocking=False) is False
    # The holder is gone: its lease went with it.
    assert lock.acquire(timeout=10)
    lock.release()
    assert not lock.locked()


def test_wrong_use_gets_a_clear_error(client: Client) -> None:
    Semaphore(2, "limited", client).get_value()
    with pytest.raises(CoordinationError, match="exists with max_leases=2, not 3"):
        Semaphore(3, "limited", client).acquire()
    with pytest.raises(CoordinationError, match="released by a client that does not hold it"):
        Lock("never-taken", client).release()
    with pytest.raises(ValueError, match="max_leases must be a whole number"):
        Semaphore(0, "x", client)
