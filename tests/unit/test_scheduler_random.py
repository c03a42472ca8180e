"""Randomised stimuli against the scheduler state machine (fixed seeds: deterministic).

After every step the accounting invariants hold (Sim.step checks them against an
independent ledger of outstanding runs); at the end every task the client still
wants is in memory or erred, the client was told so last, every worker's used
resources are back to zero, and releasing everything forgets every task.
"""

from __future__ import annotations

import random

import pytest

from tests.unit.sim import FakeClock, Sim, task

DEMANDS = [
    None,
    None,
    {"GPU": 1},
    {"GPU": 2},
    {"GPU": 4},
    {"MEMORY": 40e9},
    {"GPU": 1, "MEMORY": 10e9},
    {"CPU": 0.5},
    {"CPU": 0.25, "GPU": 1},
]
WORKER_KINDS = [
    {},
    {"GPU": 2},
    {"GPU": 1, "MEMORY": 100e9},
    {"CPU": 1},
    {"GPU": 4, "MEMORY": 100e9, "CPU": 2},
]
EVERYTHING = {"GPU": 4, "MEMORY": 100e9, "CPU": 2}
OPS = [
    "submit",
    "finish",
    "err",
    "give-back",
    "add-worker",
    "remove-worker",
    "release",
    "cancel",
    "retire",
    "copy-done",
    "copy-failed",
    "time-passes",
]
WEIGHTS = [30, 30, 6, 3, 5, 4, 6, 3, 3, 6, 1, 1]


def _random_run(rng: random.Random, sim: Sim) -> tuple[str, int] | None:
    runs = [(a, r) for a, by_run in sorted(sim.runs.items()) for r in sorted(by_run)]
    return rng.choice(runs) if runs else None


def _key_of(sim: Sim, run: tuple[str, int]) -> str:
    return sim.runs[run[0]][run[1]]["key"]


def _answer_a_copy(rng: random.Random, sim: Sim, ok: bool) -> None:
    """A worker asked to copy a result reports back (if it is still there)."""
    open_copies = [i for i, (address, _) in enumerate(sim.acquires) if address in sim.state.workers]
    if not open_copies:
        return
    address, message = sim.acquires.pop(rng.choice(open_copies))
    if ok:
        sim.acquired(address, message["key"])
    else:
        sim.acquire_failed(address, message["key"])


def drive(seed: int, steps: int = 400) -> tuple[Sim, set[str]]:
    rng = random.Random(seed)
    clock = FakeClock()
    sim = Sim({"scheduler.retire-timeout": 10}, clock=clock)
    sim.add_client("c")
    wanted: set[str] = set()
    n_tasks = n_workers = n_retires = 0
    for _ in range(steps):
        op = rng.choices(OPS, WEIGHTS)[0]
        if op == "submit":
            batch = []
            for _ in range(rng.randint(1, 3)):
                pool = sorted(wanted)
                deps = rng.sample(pool, k=min(len(pool), rng.choice([0, 0, 1, 2])))
                key = f"t{n_tasks}"
                n_tasks += 1
                batch.append(
                    task(
                        key,
                        deps,
                        rng.choice(DEMANDS),
                        priority=rng.randint(-2, 2),
                        retries=rng.choice([0, 0, 1]),
                    )
                )
                wanted.add(key)
            sim.submit_many(batch)
        elif op in ("finish", "err", "give-back"):
            run = _random_run(rng, sim)
            if run is None:
                continue
            key = _key_of(sim, run)
            if op == "finish":
                data = b"x" * rng.randint(1, 3000) if rng.random() < 0.5 else None
                sim.finish(key, nbytes=rng.randint(1, 10_000), run=run, data=data)
            elif op == "err":
                sim.err(key, run=run)
            else:
                sim.released(key, run=run)
        elif op == "add-worker":
            sim.add_worker(f"w{n_workers}", rng.choice(WORKER_KINDS), nthreads=rng.randint(1, 3))
            n_workers += 1
        elif op == "remove-worker" and sim.state.workers:
            sim.remove_worker(rng.choice(sorted(sim.state.workers)))
        elif op == "retire" and sim.state.workers:
            names = rng.sample(sorted(sim.state.workers), k=min(len(sim.state.workers), 2))
            sim.retire(*names, count=rng.choice([None, 1]), requester=f"ops{n_retires}")
            n_retires += 1
        elif op in ("copy-done", "copy-failed"):
            _answer_a_copy(rng, sim, ok=op == "copy-done")
        elif op == "time-passes":
            clock.now += 4
            sim.state.check_timeouts()
            sim.step()
        elif op in ("release", "cancel") and wanted:
            key = rng.choice(sorted(wanted))
            if op == "release":
                wanted.discard(key)
                sim.release(key)
            else:
                before = len(sim.client_messages("task-cancelled"))
                sim.cancel(key)
                for msg in sim.client_messages("task-cancelled")[before:]:
                    wanted.discard(msg["key"])

    # Drain: a worker that fits every demand joins, and workers finish whatever they run.
    sim.add_worker("drain", EVERYTHING, nthreads=4)
    for _ in range(100_000):
        run = _random_run(rng, sim)
        if run is None:
            break
        sim.finish(_key_of(sim, run), run=run)
    # Every retire request is answered, by its deadline at the latest.
    clock.now += 10
    sim.state.check_timeouts()
    sim.step()
    assert sim.state.retirements == [] and sim.state.awaiting == {}
    assert all(sim.retire_reply(f"ops{i}") is not None for i in range(n_retires))
    return sim, wanted


@pytest.mark.parametrize("seed", range(12))
def test_random_workload_keeps_accounting_exact_and_ends_with_every_wanted_task_done(
    seed: int,
) -> None:
    sim, wanted = drive(seed)
    assert sim.outstanding() == []
    states = sim.states()
    unfinished = {k: states.get(k, "forgotten") for k in wanted}
    unfinished = {k: s for k, s in unfinished.items() if s not in ("memory", "erred")}
    assert unfinished == {}
    for key in wanted:
        ops = [
            op
            for op in sim.client_ops(key)
            if op in ("task-finished", "task-erred", "task-lost", "task-cancelled")
        ]
        expected = "task-finished" if states[key] == "memory" else "task-erred"
        assert ops and ops[-1] == expected, (key, states[key], ops)
    for address, ws in sim.state.workers.items():
        assert all(v == 0 for v in ws.used.values()), (address, ws.used)
        assert ws.processing == {}
    assert sim.state.info()["no_worker"] == []
    # Releasing everything the client holds forgets every task.
    sim.release(*sorted(wanted))
    assert sim.state.tasks == {}
    for ws in sim.state.workers.values():
        assert ws.has_what == set()


def test_random_workloads_exercise_the_interesting_paths() -> None:
    """Guard against the random driver silently testing little."""
    seen_ops: set[str] = set()
    states_seen: set[str] = set()
    for seed in range(12):
        sim, _ = drive(seed)
        for messages in sim.to_clients.values():
            seen_ops.update(m["op"] for m in messages)
        states_seen.update(sim.states().values())
    assert {"task-finished", "task-erred", "task-lost", "task-cancelled", "no-worker"} <= seen_ops
    assert {"memory", "erred"} <= states_seen
    assert "retire-reply" in seen_ops
