"""``annotate`` blocks and the client-side ``FutureState``."""

from __future__ import annotations

import pytest

from apportion.annotations import annotate, current
from apportion.errors import CancelledError, RemoteTraceback
from apportion.futures import FutureState
from apportion.serialize import dumps_exception, dumps_value


def test_annotate_sets_and_restores_defaults() -> None:
    assert current() == {}
    with annotate(resources={"GPU": 1}):
        assert current() == {"resources": {"GPU": 1}}
    assert current() == {}


def test_nested_annotate_merges_and_inner_values_win() -> None:
    with annotate(resources={"GPU": 1}, priority=1):
        with annotate(priority=5, retries=2):
            assert current() == {"resources": {"GPU": 1}, "priority": 5, "retries": 2}
        with annotate(resources={"MEMORY": 1e9}):
            assert current() == {"resources": {"MEMORY": 1e9}, "priority": 1}
        assert current() == {"resources": {"GPU": 1}, "priority": 1}
    assert current() == {}


def test_annotate_restores_when_the_block_raises() -> None:
    with pytest.raises(KeyError), annotate(priority=3):
        raise KeyError
    assert current() == {}


@pytest.mark.parametrize("keyword", ["resource", "workers", "gpu"])
def test_unknown_annotation_is_rejected_naming_it_and_the_supported_ones(keyword: str) -> None:
    with pytest.raises(TypeError) as info, annotate(**{keyword: 1}):
        pytest.fail("the block must not run")
    assert keyword in str(info.value)
    assert "resources" in str(info.value)


@pytest.mark.parametrize(
    ("resources", "error", "text"),
    [
        ({"GPU": -1}, ValueError, "-1"),
        ({"GPU": "one"}, TypeError, "'one'"),
        ({"": 1}, ValueError, "''"),
        (["GPU"], TypeError, "mapping"),
    ],
)
def test_invalid_resources_are_rejected_at_the_with(
    resources: object, error: type[Exception], text: str
) -> None:
    ran = False
    with pytest.raises(error, match=text):
        with annotate(resources=resources):
            ran = True
    assert not ran
    assert current() == {}


# -------------------------------------------------------------------- FutureState
def test_finish_sets_status_wakes_waiters_and_runs_callbacks_once() -> None:
    state = FutureState("k")
    calls: list[str] = []
    state.add_callback(lambda: calls.append("early"))
    assert state.status == "pending"
    assert not state.event.is_set()
    state.finish(["w"], dumps_value({"x": 1}))
    assert state.status == "finished"
    assert state.event.is_set()
    assert state.who_has == ["w"]
    assert calls == ["early"]
    state.add_callback(lambda: calls.append("late"))
    assert calls == ["early", "late"]
    assert state.value() == {"x": 1}
    assert state.data is None  # decoded once, bytes dropped
    assert state.value() == {"x": 1}


def test_value_without_data_is_a_lookup_error_naming_the_key() -> None:
    state = FutureState("k")
    state.finish(["w"], None)
    with pytest.raises(LookupError, match="k"):
        state.value()
    state.store(dumps_value(5))
    assert state.value() == 5


def test_fail_keeps_the_remote_exception_and_traceback() -> None:
    state = FutureState("k")
    data, text = dumps_exception(ZeroDivisionError("div"))
    state.fail(data, text)
    assert state.status == "error"
    exc = state.exception()
    assert isinstance(exc, ZeroDivisionError)
    assert isinstance(exc.__cause__, RemoteTraceback)
    # A fresh object each time: one kept would keep the frames of every raise alive.
    again = state.exception()
    assert again is not exc and type(again) is ZeroDivisionError and again.args == ("div",)


def test_cancel_records_a_cancelled_error_naming_the_key() -> None:
    state = FutureState("k")
    state.cancel()
    assert state.status == "cancelled"
    assert state.event.is_set()
    assert isinstance(state.exception(), CancelledError)
    assert "k" in str(state.exception())


def test_lost_result_goes_back_to_pending_unless_the_value_is_already_here() -> None:
    state = FutureState("k")
    state.finish(["w"], None)
    state.lose()
    assert state.status == "pending"
    assert not state.event.is_set()
    kept = FutureState("j")
    kept.finish(["w"], dumps_value(1))
    kept.lose()
    assert kept.status == "finished"
    assert kept.value() == 1
