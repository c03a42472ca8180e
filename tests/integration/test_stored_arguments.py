"""Large submitted arguments travel from the client straight to a worker that can run the
task, never through the scheduler's memory, and are freed with the task's future."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from apportion.worker.stored import waiting_keys

import apportion.client as client_module
import apportion.stored_args as stored_args
from apportion import Client, LocalCluster
from tests.integration.tasks import wait_for_file

WORKERS = [{"name": "a", "resources": {"A": 1}}, {"name": "b", "resources": {"B": 1}}]
MB = 1_000_000


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1e3
    raise LookupError(field)


def peak_rss_mb() -> float:
    """This process's peak resident memory (MB)."""
    return _status_mb("VmHWM")


def rss_mb() -> float:
    """This process's resident memory now (MB)."""
    return _status_mb("VmRSS")


def held_bytes(client: Client) -> dict[str, int]:
    return {w["name"]: w["nbytes"] for w in client.scheduler_info()["workers"].values()}


def wait_until(condition, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with LocalCluster(workers=WORKERS) as cluster, Client(cluster) as client:
        yield client


def test_a_large_argument_goes_to_a_worker_and_not_through_the_scheduler(
    client: Client,
) -> None:
    before = client.run_on_scheduler(peak_rss_mb)
    argument = np.random.default_rng(1).random(400 * MB // 8)
    total = client.submit(np.sum, argument, resources={"B": 1})
    assert total.result(timeout=120) == pytest.approx(argument.sum())
    # The scheduler saw keys only: its peak memory grew by far less than the argument.
    assert client.run_on_scheduler(peak_rss_mb) - before < 50
    # Stored on b, the one worker with the task's resources, as a result of its own.
    held = held_bytes(client)
    assert held["b"] >= 400 * MB
    assert held["a"] < MB
    # Released means freed: the worker's memory gives the argument back.
    b = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == "b")
    holding = client.run(rss_mb)[b]
    del total
    gc.collect()
    wait_until(lambda: held_bytes(client)["b"] < MB)
    wait_until(lambda: client.run(rss_mb)[b] < holding - 300)
    assert client.run(waiting_keys) == {address: [] for address in client.run(waiting_keys)}
    assert client.check_invariants() == []


def test_the_same_argument_twice_is_stored_once(client: Client) -> None:
    argument = np.arange(2 * MB // 8, dtype="f8")
    first = client.submit(np.sum, argument, resources={"A": 1})
    second = client.submit(np.max, argument, resources={"A": 1})
    assert first.result(timeout=60) == argument.sum()
    assert second.result(timeout=60) == argument.max()
    assert first._state.arguments[0].key == second._state.arguments[0].key
    held = held_bytes(client)
    assert 2 * MB <= held["a"] < 3 * MB
    del first, second
    gc.collect()
    wait_until(lambda: held_bytes(client)["a"] < MB)


def _hashing_records_waiting_keys(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> list[list[str]]:
    """Hash large arguments as the client does, first noting the keys waiting on the
    workers; when an upload is on its way, the hash waits for it to arrive (at most 10 s).
    Returns the notes, one list per hash."""
    notes: list[list[str]] = []
    real = client_module.content_token

    def waiting() -> list[str]:
        return [key for keys in client.run(waiting_keys).values() for key in keys]

    def noting(payload: object) -> str:
        deadline = time.monotonic() + 10
        while not any(k.startswith("upload-") for k in waiting()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        notes.append(waiting())
        return real(payload)

    monkeypatch.setattr(client_module, "content_token", noting)
    return notes


def test_an_argument_travels_while_its_key_is_hashed(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes = _hashing_records_waiting_keys(client, monkeypatch)
    argument = np.random.default_rng(2).random(3 * MB // 8)
    total = client.submit(np.sum, argument, resources={"A": 1})
    assert total.result(timeout=60) == pytest.approx(argument.sum())
    # While the key was being hashed, the bytes were on the worker under a name of
    # their own; they are known by the key now.
    assert len(notes) == 1
    assert [key.startswith("upload-") for key in notes[0]] == [True]
    key = total._state.arguments[0].key
    assert key.startswith("ndarray-")
    assert held_bytes(client)["a"] >= 3 * MB  # taken by its task, under its key: a result
    del total
    gc.collect()
    wait_until(lambda: held_bytes(client)["a"] < MB)
    assert client.run(waiting_keys) == {address: [] for address in client.run(waiting_keys)}


def test_an_argument_the_size_of_a_stored_one_is_hashed_before_it_travels(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It may be a repeat (stored once); when it is not, it is stored under its own key."""
    first = np.full(2 * MB // 8, 1.0)
    held = client.submit(np.sum, first, resources={"A": 1})
    assert held.result(timeout=60) == first.sum()
    notes = _hashing_records_waiting_keys(client, monkeypatch)
    other = np.full(2 * MB // 8, 3.0)
    total = client.submit(np.sum, other, resources={"A": 1})
    assert total.result(timeout=60) == other.sum()
    assert len(notes) == 1
    assert not any(key.startswith("upload-") for key in notes[0])
    assert total._state.arguments[0].key != held._state.arguments[0].key
    assert 4 * MB <= held_bytes(client)["a"] < 5 * MB
    del held, total
    gc.collect()
    wait_until(lambda: held_bytes(client)["a"] < MB)


def test_arguments_by_keyword_and_in_containers_are_stored(client: Client) -> None:
    arrays = [np.full(MB // 8, float(i)) for i in range(3)]
    result = client.submit(_weighted, arrays, weight=np.full(2 * MB // 8, 2.0), resources={"A": 1})
    assert result.result(timeout=60) == pytest.approx(2 * (0 + 1 + 2) * (MB // 8))
    assert len(result._state.arguments) == 2
    assert client.check_invariants() == []


def _weighted(arrays: list[np.ndarray], weight: np.ndarray) -> float:
    return float(sum(a.sum() for a in arrays) * weight[0])


def test_small_arguments_and_futures_still_travel_with_the_task(client: Client) -> None:
    made = client.submit(np.ones, 2 * MB // 8, resources={"A": 1})
    total = client.submit(np.sum, made, resources={"B": 1})
    assert total.result(timeout=60) == 2 * MB // 8
    assert not hasattr(total._state, "arguments")
    small = client.submit(np.sum, np.ones(1000), resources={"B": 1})
    assert small.result(timeout=60) == 1000
    assert not hasattr(small._state, "arguments")


def test_with_no_fitting_worker_the_argument_goes_with_the_task(client: Client) -> None:
    argument = np.ones(2 * MB // 8)
    waiting = client.submit(np.sum, argument, resources={"C": 1})
    assert not hasattr(waiting._state, "arguments")
    client.cancel([waiting])


def _sum_after(array: np.ndarray, gate: str) -> float:
    return float(array.sum())


def _worker_names(client: Client) -> dict[str, str]:
    return {address: w["name"] for address, w in client.scheduler_info()["workers"].items()}


def test_an_argument_whose_worker_is_killed_before_its_task_runs_is_stored_again(
    tmp_path: Path,
) -> None:
    workers = [
        {"name": "g1", "resources": {"G": 1}},
        {"name": "g2", "resources": {"G": 1}},
        {"name": "plain"},
    ]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        gate = client.submit(wait_for_file, str(tmp_path / "go"), workers="plain")
        argument = np.random.default_rng(2).random(2 * MB // 8)
        total = client.submit(_sum_after, argument, gate, resources={"G": 1})
        (stored,) = total._state.arguments
        wait_until(stored.done)  # held by its worker; the task still waits for the gate
        holder = _worker_names(client)[stored._state.who_has[0]]
        cluster.kill_worker(holder)
        (tmp_path / "go").touch()
        assert total.result(timeout=60) == pytest.approx(argument.sum())
        survivor = ({"g1", "g2"} - {holder}).pop()
        assert _worker_names(client)[total._state.who_has[0]] == survivor
        assert client.check_invariants() == []


@pytest.mark.filterwarnings("ignore::apportion.client.NoWorkerWarning")  # the task's, for G
def test_with_no_fitting_worker_left_a_lost_argument_travels_with_its_task(
    tmp_path: Path,
) -> None:
    workers = [{"name": "g1", "resources": {"G": 1}}, {"name": "plain"}]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        gate = client.submit(wait_for_file, str(tmp_path / "go"), workers="plain")
        argument = np.random.default_rng(3).random(2 * MB // 8)
        total = client.submit(_sum_after, argument, gate, resources={"G": 1})
        (stored,) = total._state.arguments
        wait_until(stored.done)
        cluster.kill_worker("g1")
        (tmp_path / "go").touch()
        # No worker has G: the argument's value went with its task, to the one left.
        wait_until(lambda: stored.done() and _worker_names(client).get(stored._state.who_has[0]))
        assert _worker_names(client)[stored._state.who_has[0]] == "plain"
        cluster.start_workers([{"name": "g3", "resources": {"G": 1}}])
        assert total.result(timeout=60) == pytest.approx(argument.sum())
        assert _worker_names(client)[total._state.who_has[0]] == "g3"
        assert client.check_invariants() == []


def test_large_arguments_in_a_row_do_not_each_ask_the_scheduler_for_its_workers(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stored_args, "VIEW_STALE_S", 600.0)  # however slow the machine
    asked = []
    request = client.session.request

    def counted(message: dict, timeout: float | None = 60.0) -> dict:
        asked.append(message["op"])
        return request(message, timeout)

    monkeypatch.setattr(client.session, "request", counted)
    arguments = [np.full(2 * MB // 8, float(i)) for i in range(6)]
    totals = [client.submit(np.sum, a, resources={"A": 1}) for a in arguments]
    assert client.gather(totals) == [a.sum() for a in arguments]
    assert all(total._state.arguments for total in totals)  # each stored on a worker
    assert asked.count("info") <= 1  # the first, if the view was old


def test_a_holder_gone_since_the_workers_were_described_is_not_chosen_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stored_args, "VIEW_STALE_S", 600.0)  # the view stays as described
    monkeypatch.setattr(stored_args, "VIEW_FRESH_S", 600.0)
    workers = [{"name": "g1", "resources": {"G": 1}}, {"name": "g2", "resources": {"G": 1}}]
    with LocalCluster(workers=workers) as cluster, Client(cluster) as client:
        first = np.full(2 * MB // 8, 1.0)
        assert client.submit(np.sum, first, resources={"G": 1}).result(60) == first.sum()
        view = client._worker_view
        chosen = stored_args.choose_holder(view.workers, {"G": 1}, {})
        assert chosen is not None
        gone = view.workers[chosen]["name"]
        cluster.kill_worker(gone)
        wait_until(lambda: len(client.scheduler_info()["workers"]) == 1)
        # Still in the view: the argument cannot be put there, and goes with its task.
        second = np.full(2 * MB // 8, 2.0)
        total = client.submit(np.sum, second, resources={"G": 1})
        assert total.result(timeout=60) == second.sum()
        assert not getattr(total._state, "arguments", ())
        # Not chosen again: the next one is stored on the worker left.
        third = np.full(2 * MB // 8, 3.0)
        total = client.submit(np.sum, third, resources={"G": 1})
        assert total.result(timeout=60) == third.sum()
        (stored,) = total._state.arguments
        assert _worker_names(client)[stored._state.who_has[0]] != gone
        assert client.check_invariants() == []


def test_an_argument_missing_from_its_worker_when_held_fails_its_task_saying_so(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler holds a stored argument on its worker at once; should the worker not
    have the value (its client's connection to it ended), the task taking it fails with
    the stored argument's own error, not a hang."""
    names = iter(range(1_000_000))

    def put_nothing(self: Client, holder: str, value: object, payload: object, pure: bool):
        return f"never-stored-{next(names)}", None

    monkeypatch.setattr(client_module.Client, "_put_argument", put_nothing)
    future = client.submit(np.sum, np.ones(2 * MB // 8), resources={"A": 1}, pure=False)
    with pytest.raises(LookupError, match="no longer on this worker"):
        future.result(timeout=60)
    assert client.check_invariants() == []
