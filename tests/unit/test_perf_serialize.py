"""The plain-pickle fast path for task arguments gives what the cloudpickle path gives."""

from __future__ import annotations

import enum

import pytest

from apportion.serialize import _plain_kind, dumps_args, loads_args


class Dep:
    def __init__(self, key: str) -> None:
        self.key = key


class Colour(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize(
    ("args", "kwargs", "kind"),
    [
        ((1, 2.5, "s", b"b", None, True), {}, 1),
        ((Dep("a"), [1, Dep("b")]), {"k": (Dep("c"),)}, 2),
        ((1,), {"k": Dep("a")}, 2),
        ((Colour.RED,), {}, 0),  # a subclass of int: cloudpickle path
        (([{"nested": 1}],), {}, 0),
        ((lambda: 1,), {}, 0),
    ],
)
def test_round_trip_and_dependencies(args: tuple, kwargs: dict, kind: int) -> None:
    plain = _plain_kind(args, Dep)
    if plain and kwargs:
        k = _plain_kind(kwargs.values(), Dep)
        plain = max(plain, k) if k else 0
    assert plain == kind
    data, deps = dumps_args(args, kwargs, Dep)
    expected = []
    for value in [*args, *kwargs.values()]:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, Dep) and item.key not in expected:
                expected.append(item.key)
    assert deps == expected
    loaded_args, loaded_kwargs = loads_args(data, lambda key: f"value of {key}")
    assert len(loaded_args) == len(args) and set(loaded_kwargs) == set(kwargs)
    if kind == 2:
        assert loaded_args[0] in ("value of a", 1)
