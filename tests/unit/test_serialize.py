"""Pickling of functions, arguments (futures become dependency keys), values and errors."""

from __future__ import annotations

import pickle
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from apportion.errors import RemoteTraceback
from apportion.serialize import (
    FunctionLoadCache,
    FunctionPickleCache,
    SerializationError,
    dumps_args,
    dumps_exception,
    dumps_value,
    loads_args,
    loads_exception,
    loads_value,
    tokenize,
)


class FakeFuture:
    """Anything with a ``.key``; never pickled itself (it has a lock)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.lock = threading.Lock()


@dataclass
class Holder:
    inner: Any
    more: list[Any] = field(default_factory=list)


def _resolve(key: str) -> str:
    return f"value-of-{key}"


@pytest.mark.parametrize(
    ("build", "expected_deps", "expected_args", "expected_kwargs"),
    [
        (lambda f: ((1, "x"), {}), [], (1, "x"), {}),
        (lambda f: ((f["a"],), {}), ["a"], ("value-of-a",), {}),
        (
            lambda f: (([f["a"], [f["b"], (f["c"],)]],), {}),
            ["a", "b", "c"],
            (["value-of-a", ["value-of-b", ("value-of-c",)]],),
            {},
        ),
        (
            lambda f: ((), {"x": {"deep": {"er": f["b"]}}, "y": f["a"]}),
            ["b", "a"],
            (),
            {"x": {"deep": {"er": "value-of-b"}}, "y": "value-of-a"},
        ),
        (
            lambda f: ((Holder(f["a"], [f["b"], {"k": f["a"]}]),), {}),
            ["a", "b"],
            (Holder("value-of-a", ["value-of-b", {"k": "value-of-a"}]),),
            {},
        ),
        (
            lambda f: ((f["a"], f["a"], {f["c"].key: f["c"]}), {}),
            ["a", "c"],
            ("value-of-a", "value-of-a", {"c": "value-of-c"}),
            {},
        ),
    ],
)
def test_futures_anywhere_in_arguments_become_dependencies_resolved_on_load(
    build: Any, expected_deps: list[str], expected_args: tuple, expected_kwargs: dict
) -> None:
    futures = {k: FakeFuture(k) for k in "abc"}
    args, kwargs = build(futures)
    data, deps = dumps_args(args, kwargs, FakeFuture)
    assert deps == expected_deps  # first appearance order, no duplicates
    assert loads_args(data, _resolve) == (expected_args, expected_kwargs)


def test_loading_arguments_asks_for_each_dependency_occurrence() -> None:
    asked: list[str] = []
    data, _ = dumps_args((FakeFuture("a"), FakeFuture("b")), {}, FakeFuture)
    loads_args(data, lambda key: asked.append(key) or key)
    assert asked == ["a", "b"]


def test_only_the_dependency_type_is_treated_as_a_future() -> None:
    class Other:
        key = "not-a-dep"

    data, deps = dumps_args((Other(),), {}, FakeFuture)
    assert deps == []
    (loaded,), _ = loads_args(data, _resolve)
    assert loaded.key == "not-a-dep"


def test_lambdas_and_closures_in_arguments_survive() -> None:
    offset = 10
    data, _ = dumps_args((lambda x: x + offset,), {}, FakeFuture)
    (func,), _ = loads_args(data, _resolve)
    assert func(1) == 11


@pytest.mark.parametrize("bad", [threading.Lock(), {"nested": [threading.Lock()]}])
def test_unpicklable_argument_raises_serialization_error_naming_the_cause(bad: object) -> None:
    with pytest.raises(SerializationError) as info:
        dumps_args((bad,), {}, FakeFuture)
    assert "task arguments" in str(info.value)
    assert "lock" in str(info.value)
    assert info.value.__cause__ is not None
    assert isinstance(info.value, TypeError)


def test_unpicklable_function_raises_serialization_error_naming_it() -> None:
    lock = threading.Lock()

    def uses_lock() -> None:
        with lock:
            pass

    with pytest.raises(SerializationError, match="uses_lock"):
        FunctionPickleCache().dumps(uses_lock)


def test_function_is_pickled_once_and_loaded_once() -> None:
    def f(x: int) -> int:
        return x * 2

    pickles = FunctionPickleCache()
    data = pickles.dumps(f)
    assert pickles.dumps(f) is data
    loads = FunctionLoadCache()
    loaded = loads.loads(data)
    assert loads.loads(bytes(data)) is loaded
    assert loaded(21) == 42


def test_distinct_functions_get_distinct_pickles() -> None:
    pickles = FunctionPickleCache()
    assert pickles.dumps(lambda: 1) != pickles.dumps(lambda: 2)


@pytest.mark.parametrize(
    "value", [None, 1, "s", b"b", [1, {"a": (2, 3)}], {1, 2}, Holder(1, [2]), 1e300]
)
def test_values_round_trip(value: object) -> None:
    assert loads_value(dumps_value(value)) == value


def test_values_plain_pickle_cannot_handle_fall_back_to_cloudpickle() -> None:
    offset = 3
    func = loads_value(dumps_value(lambda x: x + offset))
    assert func(1) == 4


def test_unpicklable_value_raises_serialization_error_naming_its_type() -> None:
    with pytest.raises(SerializationError, match="lock"):
        dumps_value(threading.Lock())


def _raise_value_error() -> None:
    raise ValueError("bad input 42")


def test_exception_round_trips_with_the_remote_traceback_as_its_cause() -> None:
    try:
        _raise_value_error()
    except ValueError as exc:
        data, text = dumps_exception(exc)
    assert "_raise_value_error" in text
    assert "ValueError: bad input 42" in text
    loaded = loads_exception(data, text)
    assert type(loaded) is ValueError
    assert str(loaded) == "bad input 42"
    assert isinstance(loaded.__cause__, RemoteTraceback)
    assert loaded.__cause__.text == text
    assert "Traceback on the worker" in str(loaded.__cause__)


class NeedsTwoArgs(Exception):
    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")


class HoldsALock(Exception):
    def __init__(self) -> None:
        super().__init__("locked")
        self.lock = threading.Lock()


@pytest.mark.parametrize(
    ("exc", "expected"),
    [(NeedsTwoArgs(1, 2), "NeedsTwoArgs: 1/2"), (HoldsALock(), "HoldsALock: locked")],
)
def test_exception_that_cannot_travel_becomes_runtime_error_naming_it(
    exc: Exception, expected: str
) -> None:
    data, text = dumps_exception(exc)
    loaded = loads_exception(data, text)
    assert type(loaded) is RuntimeError
    assert str(loaded) == expected
    assert isinstance(loaded.__cause__, RemoteTraceback)


def test_garbage_exception_bytes_load_as_runtime_error() -> None:
    loaded = loads_exception(b"not a pickle", "tb")
    assert isinstance(loaded, RuntimeError)
    assert "could not be loaded" in str(loaded)


def test_non_exception_payload_loads_as_runtime_error_naming_it() -> None:
    loaded = loads_exception(pickle.dumps(12345), "tb")
    assert isinstance(loaded, RuntimeError)
    assert "12345" in str(loaded)


def test_tokenize_is_deterministic_and_sensitive_to_content() -> None:
    assert tokenize(b"a", b"b") == tokenize(b"a", b"b")
    assert tokenize(b"a", b"b") != tokenize(b"a", b"c")
    assert len(tokenize(b"x")) == 32
