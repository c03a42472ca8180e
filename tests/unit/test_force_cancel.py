"""A forced cancel names the workers running the cancelled tasks, to be replaced."""

from __future__ import annotations

import pytest
from apportion.scheduler.client_ops import CLIENT_OPS, running_on

from apportion.protocol import ProtocolError
from tests.unit.sim import Sim, task


def test_the_workers_running_cancelled_tasks_are_named_with_those_tasks() -> None:
    sim = Sim()
    sim.add_worker("w1", {"GPU": 1}, nthreads=2)
    sim.add_worker("w2", {"GPU": 1}, nthreads=2)
    sim.submit_many([task("a", resources={"GPU": 1}), task("b", resources={"GPU": 1})])
    sim.submit_many([task("c", resources={"GPU": 1})])  # queued: nothing to replace
    hosts = running_on(sim.state, ["a", "b", "c", "unknown"])
    assert sorted(k for keys in hosts.values() for k in keys) == ["a", "b"]
    assert sorted(hosts) == ["w1", "w2"]


def test_force_must_be_true_or_false() -> None:
    check = CLIENT_OPS["cancel"].check
    check({"op": "cancel", "keys": ["a"], "force": True})
    with pytest.raises(ProtocolError, match="'force' as true or false"):
        check({"op": "cancel", "keys": ["a"], "force": "yes"})
