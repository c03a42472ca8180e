"""Large inputs stay where they are: a task whose inputs are large runs on the worker
holding them, waiting there for a slot for at most as long as moving them would take,
unless that worker cannot take it (paused, retiring, gone)."""

from __future__ import annotations

import pytest

from tests.unit.sim import FakeClock, Sim, task

MIB = 2**20
LARGE = 64 * MIB  # 64 MiB at the default 100 MB/s: 0.67 s to move
MEDIUM = 2 * MIB  # moved to a free worker, and its copy there dropped after use


def chunks_on(sim: Sim, n: int, nbytes: int = LARGE) -> dict[str, str]:
    """Make ``n`` results of ``nbytes`` each, spread over the workers: chunk key -> holder."""
    sim.submit_many([task(f"c{i}") for i in range(n)])
    holders = {}
    while sim.outstanding():
        for address, runs in sim.runs.items():
            for msg in list(runs.values())[:1]:
                holders[msg["key"]] = address
                sim.finish(msg["key"], nbytes=nbytes)
    return holders


def run_all(sim: Sim) -> dict[str, str]:
    """Finish every run, oldest first, until none is left: key -> the worker it ran on."""
    ran = {}
    while sim.outstanding():
        for address, runs in sim.runs.items():
            for msg in list(runs.values())[:1]:
                ran[msg["key"]] = address
                sim.finish(msg["key"])
    return ran


def two_workers(**settings: object) -> Sim:
    sim = Sim(settings=dict(settings), clock=FakeClock())
    sim.add_client("c")
    sim.add_worker("a")
    sim.add_worker("b")
    return sim


def three_waiting_on_one_chunk() -> tuple[Sim, str, str]:
    """Two workers, one chunk, three tasks on it: two run on its holder, one waits there.
    Returns the simulation, the holder and the other worker."""
    sim = two_workers()
    holder = chunks_on(sim, 1)["c0"]
    sim.submit_many([task(f"s{i}", ["c0"]) for i in range(3)])
    return sim, holder, "b" if holder == "a" else "a"


def test_every_task_on_a_large_input_runs_where_its_input_is() -> None:
    sim = two_workers()
    holders = chunks_on(sim, 12)
    assert set(holders.values()) == {"a", "b"}
    sim.submit_many([task(f"s{i}", [f"c{i}"]) for i in range(12)])
    ran = {}
    while sim.outstanding():  # worker a is the faster: it finishes all it has first
        address = "a" if sim.runs["a"] else "b"
        key = next(iter(sim.runs[address].values()))["key"]
        ran[key] = address
        sim.finish(key)
    assert {key: ran[f"s{key[1:]}"] for key in holders} == holders


def test_a_task_waiting_for_its_inputs_worker_is_queued_there_and_says_so() -> None:
    sim = two_workers()
    holders = chunks_on(sim, 1)
    sim.add_worker("idle")  # holding nothing
    sim.submit_many([task(f"s{i}", ["c0"]) for i in range(4)])
    holder = holders["c0"]
    # Its thread and its prefetch slot: two start there, the others wait there.
    assert sorted(sim.computed_keys(holder)) == ["c0", "s0", "s1"]
    assert sim.states()["s2"] == sim.states()["s3"] == "queued"
    story = sim.state.story("s2")
    assert f"waits for a slot on {holder}, holding its inputs" in story[-1]["reason"]
    assert sim.computed_keys("idle") == []


def test_past_the_time_moving_the_input_takes_a_worker_with_nothing_to_do_takes_it() -> None:
    sim, _, other = three_waiting_on_one_chunk()
    assert sim.states()["s2"] == "queued"
    deadline = sim.state.next_deadline()
    assert deadline is not None and abs(deadline - LARGE / 100e6) < 1e-9
    sim.clock.now = deadline - 0.01
    sim.state.check_timeouts()
    sim.step()
    assert sim.states()["s2"] == "queued"
    sim.clock.now = deadline
    sim.state.check_timeouts()
    sim.step()
    assert sim.computed_keys(other) == ["s2"]
    assert sim.state.next_deadline() is None


def test_the_wait_follows_the_bandwidth_setting() -> None:
    sim = two_workers(**{"scheduler.bandwidth": 1e9})
    chunks_on(sim, 1)
    sim.submit_many([task(f"s{i}", ["c0"]) for i in range(3)])
    assert sim.state.next_deadline() == LARGE / 1e9


def test_after_the_wait_the_holder_may_still_take_it_first() -> None:
    sim = two_workers()
    holders = chunks_on(sim, 2)
    assert holders == {"c0": "a", "c1": "b"} or holders == {"c0": "b", "c1": "a"}
    sim.submit_many([task(f"s{i}", ["c0"]) for i in range(3)])
    sim.submit_many([task(f"t{i}", ["c1"]) for i in range(3)])  # the other is busy too
    sim.clock.now = 10.0
    sim.state.check_timeouts()
    sim.step()
    ran = run_all(sim)
    assert {ran[f"s{i}"] for i in range(3)} == {holders["c0"]}
    assert {ran[f"t{i}"] for i in range(3)} == {holders["c1"]}


def test_small_inputs_move_to_an_idle_worker() -> None:
    sim = two_workers()
    holders = chunks_on(sim, 1, nbytes=1000)
    sim.submit_many([task(f"s{i}", ["c0"]) for i in range(2)])
    ran = {key: address for address, msg in sim.computes for key in [msg["key"]]}
    assert ran["s0"] == holders["c0"]  # a free thread there
    assert ran["s1"] != holders["c0"]  # its thread busy: the idle worker, not its prefetch


def test_the_threshold_is_a_setting() -> None:
    sim = two_workers(**{"scheduler.locality-bytes": 2000})
    holders = chunks_on(sim, 1, nbytes=1000)
    sim.submit_many([task(f"s{i}", ["c0"]) for i in range(2)])
    assert sim.computed_keys(holders["c0"]) == ["c0", "s0"]
    sim = two_workers(**{"scheduler.locality-bytes": 1000})
    holders = chunks_on(sim, 1, nbytes=1000)
    sim.submit_many([task(f"s{i}", ["c0"]) for i in range(3)])
    assert sim.computed_keys(holders["c0"]) == ["c0", "s0", "s1"]
    assert sim.states()["s2"] == "queued"


def test_a_more_urgent_task_goes_before_those_waiting_for_their_inputs() -> None:
    sim = two_workers()
    sim.remove_worker("b", expected=True)
    chunks_on(sim, 1)
    sim.submit_many([task(f"s{i}", ["c0"]) for i in range(4)])
    sim.submit("urgent", priority=5)
    sim.submit("later")
    sim.finish("s0")
    assert sim.outstanding() == ["s1", "urgent"]
    sim.finish("urgent")
    sim.finish("s1")
    assert sim.outstanding() == ["s2", "s3"]  # as urgent as "later", and waiting here first


def test_a_holder_that_pauses_or_retires_sends_its_waiting_tasks_elsewhere() -> None:
    for stop in ("pause", "retire"):
        sim, holder, other = three_waiting_on_one_chunk()
        if stop == "pause":
            pause(sim, holder)
        else:
            sim.retire(holder)
        assert sim.computed_keys(other) == ["s2"]


def test_tasks_waiting_on_a_lost_worker_are_recomputed_elsewhere() -> None:
    sim, holder, other = three_waiting_on_one_chunk()
    sim.remove_worker(holder)
    assert sim.outstanding() == ["c0"]  # its input first, then every one of them
    sim.finish("c0", nbytes=LARGE)
    ran = run_all(sim)
    assert set(ran) == {"s0", "s1", "s2"} and set(ran.values()) == {other}
    assert sim.state.next_deadline() is None


def test_a_task_released_while_it_waits_is_not_started() -> None:
    sim = two_workers()
    chunks_on(sim, 1)
    sim.submit_many([task(f"s{i}", ["c0"]) for i in range(3)])
    sim.release("s2")
    ran = run_all(sim)
    assert "s2" not in ran
    assert sim.state.next_deadline() is None


def fetched_by_a_task(sim: Sim, key: str, deps: list[str]) -> str:
    """Submit ``key`` on ``deps``; the worker it runs on reports fetching the inputs it
    lacked. Returns that worker."""
    sim.submit(key, deps)
    address = sim.run_of(key)[0]
    for dep in deps:
        if sim.state.workers[address] not in sim.state.tasks[dep].who_has:
            sim.state.handle_data_acquired(address, {"key": dep, "replica": True})
    sim.step()
    return address


def holders_of(sim: Sim, key: str) -> set[str]:
    return {ws.address for ws in sim.state.tasks[key].who_has}


def test_a_copy_fetched_as_an_input_is_dropped_once_no_task_there_needs_it() -> None:
    sim = two_workers()
    holders = chunks_on(sim, 2)
    ran_on = fetched_by_a_task(sim, "j", ["c0", "c1"])
    copied = "c1" if holders["c0"] == ran_on else "c0"
    assert holders_of(sim, copied) == {"a", "b"}
    sim.finish("j")
    assert holders_of(sim, copied) == {holders[copied]}
    assert copied in sim.freed.get(ran_on, [])
    assert sim.state.workers[ran_on].fetched == set()


def test_a_fetched_copy_stays_while_another_task_there_needs_it() -> None:
    sim = two_workers()
    holder = chunks_on(sim, 1, nbytes=MEDIUM)["c0"]
    other = "b" if holder == "a" else "a"
    pause(sim, holder)  # tasks on c0 run on the other worker
    assert fetched_by_a_task(sim, "j0", ["c0"]) == other
    sim.submit("j1", ["c0"])
    assert sim.run_of("j1")[0] == other
    sim.finish("j0")
    assert holders_of(sim, "c0") == {"a", "b"}  # j1 still needs it there
    sim.finish("j1")
    assert holders_of(sim, "c0") == {holder}


def test_a_small_fetched_copy_is_kept() -> None:
    sim = two_workers()
    holder = chunks_on(sim, 1, nbytes=MEDIUM // 4)["c0"]
    pause(sim, holder)
    fetched_by_a_task(sim, "j0", ["c0"])
    sim.finish("j0")
    assert holders_of(sim, "c0") == {"a", "b"}


def test_a_copy_asked_for_or_the_last_in_service_is_kept() -> None:
    sim = two_workers()
    holder = chunks_on(sim, 1, nbytes=MEDIUM)["c0"]
    other = "b" if holder == "a" else "a"
    pause(sim, holder)
    fetched_by_a_task(sim, "j0", ["c0"])
    sim.acquired(other, "c0")  # asked for later (a replicate, say): kept
    sim.finish("j0")
    assert holders_of(sim, "c0") == {"a", "b"}
    # Fetched while the only other holder retires: kept, it is the copy that stays.
    sim = two_workers()
    holder = chunks_on(sim, 1, nbytes=MEDIUM)["c0"]
    other = "b" if holder == "a" else "a"
    pause(sim, holder)
    fetched_by_a_task(sim, "j0", ["c0"])
    sim.retire(holder)
    sim.finish("j0")
    assert other in holders_of(sim, "c0")


def pause(sim: Sim, address: str) -> None:
    sim.state.handle_worker_status(address, {"op": "worker-status", "status": "paused"})
    sim.step()


def test_a_bandwidth_of_zero_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"scheduler\.bandwidth must be more than 0, got 0"):
        two_workers(**{"scheduler.bandwidth": 0})
    with pytest.raises(ValueError, match=r"scheduler\.locality-bytes must be 0 or more, got -1"):
        two_workers(**{"scheduler.locality-bytes": -1})
