"""The operator forgets a deleted cluster: its one record (in kopf's memo of the cluster)
is emptied and marked gone when the watch reports the cluster DELETED, and only then; a
gone cluster is not reconciled again, not even by a round already under way, and its
timer's filter stops matching so that kopf stops the timer."""

from __future__ import annotations

from typing import Any

import pytest
from apportion.operator import handlers, memo, metrics, reconcile
from apportion.operator.spec import Defaults


def _body(uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"uid": uid, "name": uid, "namespace": "ns", "resourceVersion": "1"},
        "spec": {},
    }


def _filled(uid: str) -> tuple[dict[str, Any], memo.ClusterMemo]:
    """kopf's memo of a cluster, with a record holding something of every kind."""
    kopf_memo: dict[str, Any] = {}
    record = memo.cluster_memo(kopf_memo, _body(uid))
    record.applied["Deployment"] = "digest"
    record.token = "token"
    record.tls_read = memo.TlsRead(f"{uid}-tls", 0.0, None)
    record.tls_context = ("digest", object())  # type: ignore[assignment]
    record.announced["InvalidSpec"] = "message"
    return kopf_memo, record


def _remembered() -> float | None:
    return metrics.REGISTRY.get_sample_value("apportion_operator_clusters")


def test_a_deleted_cluster_keeps_nothing_and_is_marked_gone() -> None:
    gone_memo, gone = _filled("gone")
    kept_memo, kept = _filled("kept")
    before = _remembered()
    handlers.on_event(type="DELETED", body=_body("gone"), memo=gone_memo)
    assert _remembered() == (before or 0) - 1
    assert gone.gone.is_set()
    assert (gone.applied, gone.token, gone.tls_read, gone.tls_context, gone.announced) == (
        {},
        None,
        None,
        None,
        {},
    )
    assert not kept.gone.is_set() and kept.token == "token" and kept.applied
    assert not handlers._alive(memo=gone_memo)
    assert handlers._alive(memo=kept_memo)


@pytest.mark.parametrize("kind", ["ADDED", "MODIFIED", None])
def test_other_events_forget_nothing(kind: str | None) -> None:
    kopf_memo, record = _filled("c")
    handlers.on_event(type=kind, body=_body("c"), memo=kopf_memo)
    assert not record.gone.is_set() and record.token == "token"
    assert handlers._alive(memo=kopf_memo)


def test_a_cluster_deleted_before_any_reconcile_stops_its_timer_too() -> None:
    kopf_memo: dict[str, Any] = {}
    handlers.on_event(type="DELETED", body=_body("brief"), memo=kopf_memo)
    assert not handlers._alive(memo=kopf_memo)


def test_the_record_is_one_per_cluster_memo() -> None:
    kopf_memo: dict[str, Any] = {}
    first = memo.cluster_memo(kopf_memo, _body("c"))
    assert memo.cluster_memo(kopf_memo, _body("c")) is first
    assert memo.cluster_memo({}, _body("c")) is not first


def test_a_deleted_cluster_is_not_reconciled() -> None:
    record = memo.cluster_memo({}, _body("c"))
    record.drop()
    ran: list[str] = []
    reconcile.reconcile(
        _body("c"), record, {}, Defaults(), steps=(lambda r: ran.append("x") or True,)
    )
    assert ran == []


def test_a_round_under_way_stops_at_the_next_step_once_the_cluster_is_deleted() -> None:
    record = memo.cluster_memo({}, _body("c"))
    ran: list[str] = []

    def first(r: reconcile.Round) -> bool:
        ran.append("first")
        r.memo.drop()  # the watch reports the deletion meanwhile
        return True

    def second(r: reconcile.Round) -> bool:
        ran.append("second")
        return True

    reconcile.reconcile(_body("c"), record, {}, Defaults(), steps=(first, second))
    assert ran == ["first"]


def test_the_steps_run_in_order_until_one_ends_the_round() -> None:
    record = memo.cluster_memo({}, _body("c"))
    ran: list[str] = []

    def step(name: str, goes_on: bool) -> reconcile.Step:
        return lambda r: ran.append(name) is None and goes_on

    steps = (step("a", True), step("b", False), step("c", True))
    reconcile.reconcile(_body("c"), record, {}, Defaults(), steps=steps)
    assert ran == ["a", "b"]


def test_the_reconcile_is_observe_decide_apply_then_status() -> None:
    names = [s.__name__ for s in reconcile.STEPS]
    assert names.index("observe") < names.index("decide_sizes") < names.index("carry_out")
    assert names[-1] == "write_status"


def test_a_round_works_on_a_copy_taken_metadata_first() -> None:
    body = _body("c")
    taken = reconcile.snapshot(body)
    body["spec"]["workerGroups"] = [{"name": "late"}]
    body["metadata"]["resourceVersion"] = "2"
    assert taken["spec"] == {} and taken["metadata"]["resourceVersion"] == "1"


def test_the_handlers_module_keeps_no_per_cluster_cache() -> None:
    caches = [
        name
        for name, value in vars(handlers).items()
        if isinstance(value, (dict, set, list)) and not name.isupper() and not name.startswith("__")
    ]
    assert caches == []
