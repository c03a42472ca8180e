"""Tenants on the pure state machine (driven through ``Sim``, no I/O): weighted dominant
resource fairness between tenants waiting for the same resources, quotas never exceeded,
a late tenant reaching its share; and the settings that declare tenants."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from apportion.scheduler.tenants import (
    DEFAULT_TENANT,
    Tenant,
    TenantShares,
    tenants_from_config,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apportion.errors import ConfigError, NoValidWorkerError
from tests.unit.sim import Sim, task


class TenantSim(Sim):
    """A Sim whose clients belong to tenants (client id -> tenant)."""

    def __init__(self, tenants: list[Tenant], clients: dict[str, str]) -> None:
        super().__init__()
        self.clients = clients
        self.state.use_tenants(TenantShares(tenants))
        for client, tenant in clients.items():
            self.state.add_client(client, tenant)
        self.step()

    def gpus_held(self) -> Counter[str]:
        """GPUs held per tenant, from the fake workers' own ledger of outstanding runs."""
        held: Counter[str] = Counter()
        for runs in self.runs.values():
            for msg in runs.values():
                tenant = self.clients[msg["key"].split("-")[0]]  # keys: <client>-<n>
                held[tenant] += int(msg.get("resources", {}).get("GPU", 0))
        return held

    def finish_oldest(self) -> None:
        """The oldest outstanding run ends (runs end in the order they started)."""
        for address, msg in self.computes:
            if msg["run_id"] in self.runs[address]:
                self.finish(msg["key"], run=(address, msg["run_id"]))
                return
        raise AssertionError("nothing runs")


def gpu_workers(sim: Sim, n: int = 4) -> None:
    for i in range(n):
        sim.add_worker(f"w{i}", {"GPU": 1})


def backlog(sim: Sim, client: str, n: int, gpus: int = 1) -> None:
    sim.submit_many(
        [task(f"{client}-{i}", resources={"GPU": gpus}) for i in range(n)], client=client
    )


@pytest.mark.parametrize(("weight_a", "expected_a"), [(1, 2), (3, 3)])
def test_freed_gpus_go_to_tenants_by_weight_while_both_wait(
    weight_a: float, expected_a: int
) -> None:
    sim = TenantSim([Tenant("a", "ta", weight_a), Tenant("b", "tb", 1)], {"ca": "a", "cb": "b"})
    gpu_workers(sim)
    backlog(sim, "ca", 40)  # a alone: takes every GPU (work-conserving)
    assert sim.gpus_held() == {"a": 4}
    backlog(sim, "cb", 40)
    for _ in range(20):
        sim.finish_oldest()
    assert sim.gpus_held() == {"a": expected_a, "b": 4 - expected_a}


def test_a_tenant_alone_takes_every_free_resource() -> None:
    sim = TenantSim([Tenant("a", "ta", 1, {"GPU": 4}), Tenant("b", "tb", 9)], {"ca": "a"})
    gpu_workers(sim)
    backlog(sim, "ca", 10)
    assert sim.gpus_held() == {"a": 4}


def test_a_quota_caps_a_tenant_even_with_idle_gpus_and_its_tasks_say_over_quota() -> None:
    sim = TenantSim([Tenant("a", "ta", 1, {"GPU": 2})], {"ca": "a"})
    gpu_workers(sim)
    backlog(sim, "ca", 6)
    assert sim.gpus_held() == {"a": 2}
    info = sim.state.info()["tenants"]["a"]
    assert info["over_quota"] == 4 and info["waiting"] == 4 and info["used"] == {"GPU": 2}
    assert info["quota"] == {"GPU": 2} and info["share"] == 0.5
    sim.finish_oldest()
    assert sim.gpus_held() == {"a": 2}  # the next one started in its place
    for _ in range(5):
        sim.finish_oldest()
    assert sim.gpus_held() == {}
    assert set(sim.states().values()) == {"memory"}


def test_a_task_cancelled_over_quota_frees_its_place() -> None:
    sim = TenantSim([Tenant("a", "ta", 1, {"GPU": 1})], {"ca": "a"})
    gpu_workers(sim, 2)
    backlog(sim, "ca", 3)
    sim.cancel("ca-1", client="ca")
    sim.finish("ca-0")
    assert sim.outstanding() == ["ca-2"]


def test_a_demand_larger_than_its_quota_fails_naming_the_setting() -> None:
    sim = TenantSim([Tenant("a", "ta", 1, {"GPU": 1})], {"ca": "a"})
    sim.add_worker("w", {"GPU": 2})
    sim.submit("big", resources={"GPU": 2}, client="ca")
    error = sim.error_of("big", client="ca")
    assert isinstance(error, NoValidWorkerError)
    assert "scheduler.tenants.a.quota.GPU" in str(error)


def test_a_tenant_arriving_late_reaches_its_share_as_runs_end() -> None:
    sim = TenantSim([Tenant("a", "ta", 1), Tenant("b", "tb", 1)], {"ca": "a", "cb": "b"})
    gpu_workers(sim)
    backlog(sim, "ca", 100)
    for _ in range(10):
        sim.finish_oldest()
    backlog(sim, "cb", 100)
    for _ in range(2):  # two runs end: both GPUs go to b, the tenant below its share
        sim.finish_oldest()
    assert sim.gpus_held() == {"a": 2, "b": 2}


def test_within_a_tenant_priority_then_submission_order_hold() -> None:
    sim = TenantSim([Tenant("a", "ta", 1), Tenant("b", "tb", 1)], {"ca": "a", "cb": "b"})
    sim.add_worker("w", {"GPU": 1})
    sim.submit("first", resources={"GPU": 1}, client="ca")
    sim.submit_many(
        [
            task("low", resources={"GPU": 1}),
            task("high", resources={"GPU": 1}, priority=5),
        ],
        client="cb",
    )
    sim.submit("a-next", resources={"GPU": 1}, client="ca")
    sim.finish("first")
    assert sim.outstanding() == ["high"]  # b is below its share; its most urgent first
    sim.finish("high")
    # Both hold nothing now: equal shares, so submission order decides ("low" is older).
    assert sim.outstanding() == ["low"]


def test_clients_of_the_cluster_token_are_the_default_tenant() -> None:
    sim = TenantSim([Tenant("a", "ta", 1)], {"ca": "a", "plain": DEFAULT_TENANT})
    sim.add_worker("w", {"GPU": 2})
    sim.submit("x", resources={"GPU": 1}, client="plain")
    sim.submit("y", resources={"GPU": 1}, client="ca")
    tenants = sim.state.info()["tenants"]
    assert tenants[DEFAULT_TENANT]["used"] == {"GPU": 1}
    assert tenants["a"]["used"] == {"GPU": 1}


def test_a_lost_worker_gives_its_tenants_runs_back() -> None:
    sim = TenantSim([Tenant("a", "ta", 1, {"GPU": 2})], {"ca": "a"})
    gpu_workers(sim, 3)
    backlog(sim, "ca", 4)
    address, _ = sim.run_of("ca-0")
    sim.remove_worker(address)
    assert sim.gpus_held() == {"a": 2}
    assert sim.state.info()["tenants"]["a"]["used"] == {"GPU": 2}


def test_multi_unit_demands_of_a_tenant_below_its_share_are_not_starved() -> None:
    sim = TenantSim([Tenant("a", "ta", 1), Tenant("b", "tb", 1)], {"ca": "a", "cb": "b"})
    sim.add_worker("w", {"GPU": 2})
    backlog(sim, "ca", 30)
    sim.submit("pair", resources={"GPU": 2}, client="cb")
    for _ in range(2):  # the two runs under way end: then the pair runs, before a's next
        sim.finish_oldest()
    assert sim.outstanding() == ["pair"]


# ------------------------------------------------------------------ properties
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    weights=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    quota=st.one_of(st.none(), st.integers(1, 6)),
    events=st.lists(
        st.one_of(
            st.tuples(st.just("submit"), st.sampled_from(["ca", "cb"]), st.integers(1, 2)),
            st.tuples(st.just("finish"), st.just(""), st.just(0)),
            st.tuples(st.just("cancel"), st.sampled_from(["ca", "cb"]), st.just(0)),
        ),
        max_size=60,
    ),
)
def test_quotas_hold_and_shares_converge_under_random_arrivals(
    weights: tuple[int, int], quota: int | None, events: list[tuple[str, str, int]]
) -> None:
    """Under random arrivals, ends and cancels: no tenant ever holds more than its quota
    (checked at every step, with every other invariant, by the state's own check and by
    the fake workers' ledger), and while both tenants are backlogged, a run's end never
    takes their weighted shares further apart than they were or than one task's worth."""
    tenants = [
        Tenant("a", "ta", weights[0], None if quota is None else {"GPU": quota}),
        Tenant("b", "tb", weights[1]),
    ]
    sim = TenantSim(tenants, {"ca": "a", "cb": "b"})
    gpu_workers(sim, 6)
    submitted = Counter[str]()

    def gap() -> float:
        held = sim.gpus_held()
        return abs(held["a"] / weights[0] - held["b"] / weights[1])

    def backlogged() -> bool:
        info = sim.state.info()["tenants"]
        return all(info[t]["waiting"] > info[t]["over_quota"] for t in ("a", "b"))

    for op, client, gpus in events:
        if op == "submit":
            key = f"{client}-{submitted[client]}"
            submitted[client] += 1
            sim.submit(key, resources={"GPU": gpus}, client=client)
        elif op == "finish" and sim.outstanding():
            before, both = gap(), backlogged()
            sim.finish_oldest()
            if both and backlogged():
                assert gap() <= max(before, 2 / min(weights)) + 1e-9
        elif op == "cancel" and submitted[client]:
            sim.cancel(f"{client}-{submitted[client] - 1}", client=client)
        if quota is not None:
            assert sim.gpus_held()["a"] <= quota


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    weights=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    gpus=st.integers(2, 8),
    late=st.integers(0, 10),
)
def test_weighted_shares_hold_within_one_task_once_the_first_runs_ended(
    weights: tuple[int, int], gpus: int, late: int
) -> None:
    """Both tenants backlogged (b arriving after ``late`` of a's runs ended): once every
    run that started before b arrived has ended, their weighted holdings never differ by
    more than one task of the lighter tenant (what fairness between whole tasks allows)."""
    tenants = [Tenant("a", "ta", weights[0]), Tenant("b", "tb", weights[1])]
    sim = TenantSim(tenants, {"ca": "a", "cb": "b"})
    gpu_workers(sim, gpus)
    backlog(sim, "ca", 4 * gpus + late)
    for _ in range(late):
        sim.finish_oldest()
    backlog(sim, "cb", 4 * gpus)
    for ended in range(4 * gpus):
        sim.finish_oldest()
        info = sim.state.info()["tenants"]
        if not (info["a"]["waiting"] and info["b"]["waiting"]):
            break
        if ended >= gpus:  # the runs under way when b arrived have all ended
            held = sim.gpus_held()
            gap = abs(held["a"] / weights[0] - held["b"] / weights[1])
            assert gap <= 1 / min(weights) + 1e-9, (held, weights)


# ------------------------------------------------------------------ settings
def token_file(tmp_path: Path, name: str, token: str) -> str:
    path = tmp_path / name
    path.write_text(token + "\n")
    path.chmod(0o600)
    return str(path)


def test_tenants_come_from_the_settings_with_the_default_tenant(tmp_path: Path) -> None:
    tree = {
        "a": {"token-file": token_file(tmp_path, "a", "tok-a"), "weight": 3, "quota": {"GPU": 2}},
        "default": {"weight": 2},
    }
    tenants = {t.name: t for t in tenants_from_config(tree, "cluster")}
    assert tenants["a"].token == "tok-a" and tenants["a"].weight == 3
    assert tenants["a"].quota == {"GPU": 2}
    assert tenants[DEFAULT_TENANT].token is None and tenants[DEFAULT_TENANT].weight == 2
    assert tenants_from_config({}, "cluster") == []


@pytest.mark.parametrize(
    ("fields", "key", "message"),
    [
        ({"token-file": "/nonexistent/token"}, "scheduler.tenants.a.token-file", "cannot read"),
        ({}, "scheduler.tenants.a.token-file", "is required"),
        ({"token-file": "A", "weight": -1}, "scheduler.tenants.a.weight", "positive"),
        ({"token-file": "A", "weight": 0}, "scheduler.tenants.a.weight", "positive"),
        ({"token-file": "A", "quota": {"G P U": 1}}, "scheduler.tenants.a.quota.G P U", "invalid"),
        ({"token-file": "A", "quota": {"GPU": -1}}, "scheduler.tenants.a.quota.GPU", "zero or"),
        ({"token-file": "CLUSTER"}, "scheduler.tenants.a.token-file", "cluster's own token"),
    ],
)
def test_bad_tenant_settings_are_errors_naming_the_setting(
    tmp_path: Path, fields: dict[str, object], key: str, message: str
) -> None:
    files = {"A": token_file(tmp_path, "a", "tok-a"), "CLUSTER": token_file(tmp_path, "c", "c")}
    fields = {k: files.get(v, v) if isinstance(v, str) else v for k, v in fields.items()}
    with pytest.raises(ConfigError, match=message) as raised:
        tenants_from_config({"a": fields}, "c")
    assert raised.value.key == key
    assert key in str(raised.value)


def test_two_tenants_with_one_token_are_an_error(tmp_path: Path) -> None:
    path = token_file(tmp_path, "shared", "same")
    with pytest.raises(ConfigError, match=r"same token as scheduler\.tenants\.a\.token-file"):
        tenants_from_config({"a": {"token-file": path}, "b": {"token-file": path}}, "c")
