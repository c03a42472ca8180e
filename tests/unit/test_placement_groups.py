"""Placement groups on the pure state machine (driven through ``Sim``, no I/O): bundles
reserved all at once or not at all, claims that keep small tasks from starving a waiting
group, tasks within their bundle, worker loss, removal; and the strategies' pure plan."""

from __future__ import annotations

from typing import Any

import pytest
from apportion.scheduler.placement_groups import BundleShape, holding, plan_bundles
from apportion.scheduler.validation import check_placement_group, check_submit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apportion.protocol import ProtocolError
from tests.unit.sim import Sim, task


class GangSim(Sim):
    """A Sim whose independent ledger knows that runs in a bundle use the bundle's units
    (booked once, when the group was placed), not more of the worker's."""

    def assert_consistent(self) -> None:
        problems = self.state.check_invariants()
        assert problems == [], problems
        for address, ws in self.state.workers.items():
            expected: dict[str, float] = dict(holding(ws))
            for msg in self.runs[address].values():
                ts = self.state.tasks.get(msg["key"])
                if ts is not None and type(ts.shape) is BundleShape:
                    continue
                for name, amount in msg.get("resources", {}).items():
                    expected[name] = expected.get(name, 0) + amount
            for name in set(expected) | set(ws.used):
                assert abs(ws.used.get(name, 0) - expected.get(name, 0)) < 1e-9, (address, name)
                assert ws.used.get(name, 0) <= ws.total.get(name, 0) + 1e-9

    # ------------------------------------------------------------ groups
    def group(self, group_id: str, bundles: list[dict[str, float]], strategy: str) -> None:
        self.state.placement_groups().create("c", group_id, bundles, strategy)
        self.step()

    def remove_group(self, group_id: str) -> None:
        self.state.placement_groups().remove(group_id)
        self.step()

    def in_bundle(
        self, key: str, group_id: str, index: int | None, resources: dict[str, float] | None = None
    ) -> None:
        spec = task(key, resources=resources)
        spec["placement_group"] = group_id
        if index is not None:
            spec["bundle_index"] = index
        self.submit_many([spec])

    def group_state(self, group_id: str) -> str:
        groups = self.state.groups
        assert groups is not None
        return groups.groups[group_id].state

    def hosts(self, group_id: str) -> list[str | None]:
        groups = self.state.groups
        assert groups is not None
        return [
            None if b.worker is None else b.worker.address for b in groups.groups[group_id].bundles
        ]

    def ready_reply(self, group_id: str) -> dict[str, Any]:
        groups = self.state.groups
        assert groups is not None
        groups.wait_ready("c", group_id, 99, wait=False)
        self.step()
        return self.client_messages("reply")[-1]


@pytest.fixture
def sim() -> GangSim:
    s = GangSim()
    s.add_client("c")
    return s


# ------------------------------------------------------------------ the pure plan
def test_each_strategy_places_bundles_as_it_says() -> None:
    offer = {"a": {"GPU": 4}, "b": {"GPU": 4}, "c": {"GPU": 1}}
    two = [{"GPU": 1}, {"GPU": 1}]
    assert plan_bundles(two, "strict_pack", offer) == ["a", "a"]
    assert plan_bundles(two, "pack", offer) == ["a", "a"]
    assert sorted(plan_bundles(two, "spread", offer) or []) == ["a", "b"]
    assert sorted(plan_bundles(two, "strict_spread", offer) or []) == ["a", "b"]
    three_big = [{"GPU": 2}] * 3
    assert plan_bundles(three_big, "strict_spread", offer) is None  # c is too small
    assert plan_bundles(three_big, "strict_pack", offer) is None  # 6 > 4 anywhere
    assert plan_bundles(three_big, "pack", offer) == ["a", "a", "b"]
    # Workers missing fewer units (to be waited for) are preferred.
    assert plan_bundles([{"GPU": 4}], "pack", offer, missing={"a": {"GPU": 3}}) == ["b"]
    # Bundles placed already stay; strict_spread keeps clear of their workers.
    assert plan_bundles(two, "strict_spread", offer, fixed={0: "b"}) == ["b", "a"]
    with pytest.raises(ValueError, match="unknown strategy"):
        plan_bundles(two, "scatter", offer)


# --------------------------------------------------------------- the state machine
def test_a_group_is_placed_at_once_when_it_fits(sim: GangSim) -> None:
    sim.add_worker("a", {"GPU": 2}, nthreads=4)
    sim.add_worker("b", {"GPU": 2}, nthreads=4)
    sim.group("g", [{"GPU": 1}] * 4, "strict_pack")
    assert sim.group_state("g") == "pending"  # no worker has 4 GPUs
    assert "no set of the 2 connected workers" in sim.ready_reply("g")["why"]
    sim.group("h", [{"GPU": 1}] * 2, "strict_spread")
    assert sim.group_state("h") == "ready"
    assert sorted(sim.hosts("h")) == ["a", "b"]  # type: ignore[type-var]
    assert sim.used("a") == {"GPU": 1}
    assert sim.ready_reply("h")["workers"] == sim.hosts("h")


def test_a_waiting_group_holds_no_bundle_and_small_tasks_do_not_starve_it(sim: GangSim) -> None:
    sim.add_worker("a", {"GPU": 2}, nthreads=4)
    sim.add_worker("b", {"GPU": 2}, nthreads=4)
    for i in range(4):
        sim.submit(f"small{i}", resources={"GPU": 1})
    sim.group("g", [{"GPU": 2}, {"GPU": 2}], "strict_spread")
    assert sim.group_state("g") == "pending"
    assert sim.hosts("g") == [None, None]
    sim.finish("small0")
    # The freed unit is claimed for the group: a new small task waits, not the group.
    sim.submit("late", resources={"GPU": 1})
    assert sim.states()["late"] == "queued"
    for i in range(1, 4):
        sim.finish(f"small{i}")
        if i < 3:
            assert sim.hosts("g") == [None, None]  # nothing held as bundles until all fit
    assert sim.group_state("g") == "ready"
    assert sim.states()["late"] == "queued"  # every GPU is in the group's bundles
    sim.in_bundle("train0", "g", 0)
    sim.in_bundle("train1", "g", 1)
    assert sorted(sim.outstanding()) == ["train0", "train1"]
    computes = {m["key"]: (a, m) for a, m in sim.computes}
    assert computes["train0"][1]["resources"] == {"GPU": 2}
    assert {computes["train0"][0], computes["train1"][0]} == {"a", "b"}
    sim.remove_group("g")  # runs under way keep their bundles until they end
    assert sim.states()["late"] == "queued"
    sim.finish("train0")
    assert sim.outstanding() == ["late", "train1"]


def test_units_a_reservation_lets_go_of_go_to_a_waiting_group_at_once(sim: GangSim) -> None:
    sim.add_worker("a", {"GPU": 2}, nthreads=4)
    sim.submit("running", resources={"GPU": 1})
    sim.submit("big", resources={"GPU": 2})  # reserves a: its spare unit is held for it
    sim.group("g", [{"GPU": 1}], "pack")
    assert sim.group_state("g") == "pending"
    sim.cancel("big")  # no run ends, but the held unit is free again
    assert sim.group_state("g") == "ready"


def test_tasks_share_a_bundle_within_its_resources(sim: GangSim) -> None:
    sim.add_worker("a", {"GPU": 4}, nthreads=8)
    sim.group("g", [{"GPU": 2}], "pack")
    for i in range(3):
        sim.in_bundle(f"t{i}", "g", 0, resources={"GPU": 1})
    assert sim.outstanding() == ["t0", "t1"]  # the third would exceed the bundle
    assert sim.states()["t2"] == "queued"
    sim.submit("outside", resources={"GPU": 2})  # the rest of the worker is free to others
    assert "outside" in sim.outstanding()
    sim.finish("t0")
    assert "t2" in sim.outstanding()
    sim.in_bundle("too-big", "g", 0, resources={"GPU": 3})
    assert "does not fit bundle 0" in str(sim.error_of("too-big"))


def test_two_groups_needing_the_same_workers_do_not_deadlock(sim: GangSim) -> None:
    sim.add_worker("a", {"GPU": 2}, nthreads=4)
    sim.add_worker("b", {"GPU": 2}, nthreads=4)
    sim.submit("s0", resources={"GPU": 1})
    sim.submit("s1", resources={"GPU": 1})
    sim.group("first", [{"GPU": 2}, {"GPU": 2}], "strict_spread")
    sim.group("second", [{"GPU": 2}, {"GPU": 2}], "strict_spread")
    sim.finish("s0")
    sim.finish("s1")
    assert sim.group_state("first") == "ready"
    assert sim.group_state("second") == "pending"
    assert sim.hosts("second") == [None, None]
    sim.remove_group("first")
    assert sim.group_state("second") == "ready"


def test_a_lost_worker_puts_the_group_back_to_pending_and_its_bundle_is_placed_again(
    sim: GangSim,
) -> None:
    sim.add_worker("a", {"GPU": 1}, nthreads=2)
    sim.add_worker("b", {"GPU": 1}, nthreads=2)
    sim.group("g", [{"GPU": 1}, {"GPU": 1}], "strict_spread")
    sim.in_bundle("r0", "g", 0)
    sim.in_bundle("r1", "g", 1)
    lost = sim.hosts("g")[1]
    assert lost is not None
    sim.remove_worker(lost)
    assert sim.group_state("g") == "pending"
    assert sim.states()["r1"] == "queued"  # waits for its bundle to be placed again
    sim.add_worker("c", {"GPU": 1}, nthreads=2)
    assert sim.group_state("g") == "ready"
    assert sim.hosts("g")[1] == "c"
    assert sim.run_of("r1")[0] == "c"


def test_tasks_naming_no_bundle_spread_over_the_bundles(sim: GangSim) -> None:
    sim.add_worker("a", {"GPU": 2}, nthreads=4)
    sim.add_worker("b", {"GPU": 2}, nthreads=4)
    sim.group("g", [{"GPU": 1}, {"GPU": 1}], "strict_spread")
    sim.submit_many(
        [{**task(f"t{i}"), "placement_group": "g"} for i in range(2)]  # no bundle_index
    )
    assert sorted(a for a, _ in sim.computes) == ["a", "b"]


def test_removing_a_group_fails_its_queued_tasks_and_a_client_leaving_removes_its_groups(
    sim: GangSim,
) -> None:
    sim.add_worker("a", {"GPU": 1}, nthreads=2)
    sim.group("g", [{"GPU": 2}], "pack")  # never fits
    sim.in_bundle("t", "g", 0)
    sim.remove_group("g")
    assert "was removed" in str(sim.error_of("t"))
    sim.in_bundle("u", "g", 0)
    assert "no placement group" in str(sim.error_of("u"))
    sim.group("h", [{"GPU": 1}], "pack")
    assert sim.used("a") == {"GPU": 1}
    sim.state.remove_client("c")
    sim.step()
    assert sim.used("a") == {"GPU": 0}


def test_malformed_group_requests_are_refused_whole() -> None:
    good = {"op": "placement-group", "id": 1, "group": "g", "bundles": [{"GPU": 1}]}
    check_placement_group({**good, "strategy": "pack"})
    for bad, problem in [
        ({**good, "group": 3, "strategy": "pack"}, "needs 'group'"),
        ({**good, "bundles": [], "strategy": "pack"}, "non-empty list"),
        ({**good, "bundles": [{"GPU": -1}], "strategy": "pack"}, "bundle"),
        (good, "strategy"),
    ]:
        with pytest.raises(ProtocolError, match=problem):
            check_placement_group(bad)
    spec = {**task("t"), "placement_group": "g", "bundle_index": -1}
    with pytest.raises(ProtocolError, match="bundle_index"):
        check_submit({"tasks": [spec]})


def test_scheduler_info_shows_each_group_and_its_bundles(sim: GangSim) -> None:
    sim.add_worker("a", {"GPU": 2}, nthreads=2)
    sim.group("g", [{"GPU": 1}, {"GPU": 4}], "pack")
    sim.group("h", [{"GPU": 1}], "pack")
    info = sim.state.info()["placement_groups"]
    assert info["h"] == {
        "state": "ready",
        "strategy": "pack",
        "bundles": [{"resources": {"GPU": 1}, "worker": "a", "queued": 0}],
    }
    assert info["g"]["state"] == "pending"
    assert [b["worker"] for b in info["g"]["bundles"]] == [None, None]


# ------------------------------------------------------------------------ property
OPS = st.one_of(
    st.tuples(st.just("worker"), st.integers(1, 3)),
    st.tuples(st.just("lose"), st.integers(0, 5)),
    st.tuples(
        st.just("group"),
        st.integers(1, 3),
        st.integers(1, 2),
        st.sampled_from(["pack", "spread", "strict_pack", "strict_spread"]),
    ),
    st.tuples(st.just("remove"), st.integers(0, 5)),
    st.tuples(st.just("small"), st.integers(1, 2)),
    st.tuples(st.just("in"), st.integers(0, 5), st.integers(0, 2)),
    st.tuples(st.just("finish"), st.integers(0, 20)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=40))
def test_a_group_holds_all_its_bundles_or_none_and_the_books_stay_right(
    ops: list[tuple[Any, ...]],
) -> None:
    sim = GangSim()  # checks invariants (groups' included) after every step
    sim.add_client("c")
    workers: list[str] = []
    groups: list[str] = []
    n = 0
    for op in ops:
        n += 1
        kind = op[0]
        if kind == "worker":
            workers.append(f"w{n}")
            sim.add_worker(f"w{n}", {"GPU": op[1]}, nthreads=2)
        elif kind == "lose" and workers:
            sim.remove_worker(workers.pop(op[1] % len(workers)))
        elif kind == "group":
            groups.append(f"g{n}")
            sim.group(f"g{n}", [{"GPU": op[2]}] * op[1], op[3])
        elif kind == "remove" and groups:
            sim.remove_group(groups.pop(op[1] % len(groups)))
        elif kind == "small":
            sim.submit(f"s{n}", resources={"GPU": op[1]})
        elif kind == "in" and groups:
            sim.in_bundle(f"b{n}", groups[op[1] % len(groups)], None if op[2] == 2 else op[2])
        elif kind == "finish":
            running = sim.outstanding()
            if running:
                sim.finish(running[op[1] % len(running)])
        state = sim.state.groups
        for group in state.groups.values() if state is not None else ():
            placed = [b.worker is not None for b in group.bundles]
            if not group.was_ready:
                assert not any(placed), "a group held bundles before it was ever ready"
            if group.state == "ready":
                assert all(placed)


def test_a_wait_for_a_group_no_worker_could_host_fails_after_the_no_worker_timeout() -> None:
    sim = GangSim(settings={"scheduler.no-worker-timeout": 5.0})
    sim.add_client("c")
    sim.add_worker("a", {"GPU": 2}, nthreads=4)
    sim.submit("busy", resources={"GPU": 2})
    sim.group("never", [{"GPU": 4}], "pack")  # no worker has 4 GPUs
    sim.group("later", [{"GPU": 2}], "pack")  # waits for "busy" to end
    groups = sim.state.placement_groups()
    for reply_id, group_id in enumerate(["never", "later"]):
        groups.wait_ready("c", group_id, reply_id, wait=True, now=sim.clock())
    sim.step()
    assert sim.state.next_deadline() == 5.0
    sim.clock.now = 4.9  # type: ignore[attr-defined]
    sim.state.check_timeouts()
    sim.step()
    assert sim.client_messages("reply") == []
    sim.clock.now = 5.0  # type: ignore[attr-defined]
    sim.state.check_timeouts()
    sim.step()
    (failed,) = sim.client_messages("reply")
    assert failed["id"] == 0 and failed["kind"] == "NoValidWorkerError"
    assert "waited 5s (scheduler.no-worker-timeout)" in failed["error"]
    assert "no set of the 1 connected workers" in failed["error"]
    assert sim.group_state("never") == "pending"  # the group stays, for a bigger worker
    sim.finish("busy")
    assert sim.client_messages("reply")[-1]["workers"] == ["a"]  # the other wait goes on
