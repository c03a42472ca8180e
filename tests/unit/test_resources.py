"""Resource validation, spec parsing and the arithmetic placement relies on."""

from __future__ import annotations

import math

import pytest

from apportion.resources import (
    EMPTY_SHAPE,
    acquire,
    fits,
    format_resources,
    free,
    parse_spec,
    release,
    to_shape,
    validate,
    validate_amount,
    validate_name,
)


@pytest.mark.parametrize(
    ("resources", "error", "names"),
    [
        ({"GPU": -1}, ValueError, ["'GPU'", "-1", "zero or more"]),
        ({"GPU": -0.5}, ValueError, ["'GPU'", "-0.5"]),
        ({"GPU": math.nan}, ValueError, ["'GPU'", "nan", "finite"]),
        ({"GPU": math.inf}, ValueError, ["'GPU'", "inf", "finite"]),
        ({"GPU": -math.inf}, ValueError, ["'GPU'", "-inf"]),
        ({"GPU": "2"}, TypeError, ["'GPU'", "str", "'2'", "number"]),
        ({"GPU": None}, TypeError, ["'GPU'", "None"]),
        ({"GPU": [1]}, TypeError, ["'GPU'", "list"]),
        ({"GPU": True}, TypeError, ["'GPU'", "bool", "True"]),
        ({"GPU": False}, TypeError, ["'GPU'", "bool", "False"]),
        ({"": 1}, ValueError, ["''", "invalid resource name"]),
        ({"-GPU": 1}, ValueError, ["'-GPU'"]),
        ({"G PU": 1}, ValueError, ["'G PU'"]),
        ({"GPU!": 1}, ValueError, ["'GPU!'"]),
        ({"x" * 64: 1}, ValueError, ["x" * 64]),
        ({5: 1}, TypeError, ["int", "5", "string"]),
        ({None: 1}, TypeError, ["None"]),
        ([("GPU", 1)], TypeError, ["mapping", "list"]),
        ("GPU=1", TypeError, ["mapping", "'GPU=1'"]),
    ],
)
def test_invalid_resources_are_rejected_naming_the_offending_value(
    resources: object, error: type[Exception], names: list[str]
) -> None:
    with pytest.raises(error) as info:
        validate(resources)  # type: ignore[arg-type]
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("resources", "what", "expected"),
    [
        (None, "demand", {}),
        ({}, "demand", {}),
        ({"GPU": 1}, "demand", {"GPU": 1}),
        ({"GPU": 2.0}, "demand", {"GPU": 2}),
        ({"CPU": 0.5}, "demand", {"CPU": 0.5}),
        ({"MEMORY": 100e9}, "demand", {"MEMORY": 100_000_000_000}),
        ({"GPU": 0, "CPU": 1}, "demand", {"CPU": 1}),  # a zero demand constrains nothing
        ({"GPU": 0}, "capacity", {"GPU": 0}),  # a zero capacity is kept
        ({"nvidia.com/gpu": 1, "a_b-c.d": 2}, "demand", {"nvidia.com/gpu": 1, "a_b-c.d": 2}),
        ({"gpu": 1, "GPU": 2}, "demand", {"gpu": 1, "GPU": 2}),  # names keep their case
        ({"x" * 63: 1}, "demand", {"x" * 63: 1}),
    ],
)
def test_valid_resources_are_cleaned(resources: object, what: str, expected: dict) -> None:
    assert validate(resources, what=what) == expected  # type: ignore[arg-type]


def test_whole_amounts_become_ints_and_fractions_stay_floats() -> None:
    assert type(validate_amount("GPU", 2.0, allow_zero=False)) is int
    assert type(validate_amount("CPU", 0.5, allow_zero=False)) is float


def test_zero_amount_is_rejected_where_zero_is_not_allowed() -> None:
    with pytest.raises(ValueError, match=r"'GPU' amount must be positive, got 0"):
        validate_amount("GPU", 0, allow_zero=False)


def test_validate_name_returns_the_name() -> None:
    assert validate_name("GPU") == "GPU"


def test_validate_returns_a_copy() -> None:
    original = {"GPU": 1}
    clean = validate(original)
    clean["GPU"] = 5
    assert original == {"GPU": 1}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("GPU=2", {"GPU": 2}),
        ("GPU=2,MEMORY=100e9", {"GPU": 2, "MEMORY": 100_000_000_000}),
        ("GPU=2 MEMORY=1e9", {"GPU": 2, "MEMORY": 1_000_000_000}),
        (" GPU=2 , process=1 ", {"GPU": 2, "process": 1}),
        ("GPU=2,,", {"GPU": 2}),
        ("CPU=0.5", {"CPU": 0.5}),
        ("GPU=0", {"GPU": 0}),
        ("nvidia.com/gpu=1", {"nvidia.com/gpu": 1}),
        ("", {}),
    ],
)
def test_parse_spec_accepts_name_number_pairs(spec: str, expected: dict) -> None:
    assert parse_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "error", "names"),
    [
        ("GPU", ValueError, ["'GPU'", "NAME=NUMBER"]),
        ("GPU=", ValueError, ["'GPU='", "NAME=NUMBER"]),
        ("=2", ValueError, ["'=2'", "NAME=NUMBER"]),
        ("GPU=abc", ValueError, ["'abc'", "not a number", "'GPU=abc'"]),
        ("GPU=2,MEMORY=lots", ValueError, ["'lots'", "'MEMORY=lots'", "'GPU=2,MEMORY=lots'"]),
        ("GPU=1=2", ValueError, ["'1=2'", "not a number"]),
        ("GPU=-1", ValueError, ["'GPU'", "-1"]),
        ("GPU=nan", ValueError, ["'GPU'", "finite"]),
        ("GPU=inf", ValueError, ["'GPU'", "finite"]),
        ("-GPU=1", ValueError, ["'-GPU'", "invalid resource name"]),
        ("G!=1", ValueError, ["'G!'"]),
    ],
)
def test_parse_spec_rejects_malformed_parts_naming_them(
    spec: str, error: type[Exception], names: list[str]
) -> None:
    with pytest.raises(error) as info:
        parse_spec(spec)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("demand", "expected"),
    [
        (None, EMPTY_SHAPE),
        ({}, EMPTY_SHAPE),
        ({"b": 1, "a": 2}, (("a", 2), ("b", 1))),
        ({"GPU": 1}, (("GPU", 1),)),
    ],
)
def test_to_shape_is_sorted_and_hashable(demand: dict | None, expected: tuple) -> None:
    shape = to_shape(demand)
    assert shape == expected
    hash(shape)


def test_equal_demands_have_equal_shapes_whatever_the_order() -> None:
    assert to_shape({"A": 1, "B": 2}) == to_shape({"B": 2, "A": 1})


@pytest.mark.parametrize(
    ("demand", "available", "expected"),
    [
        ({}, {}, True),
        ({}, {"GPU": 0}, True),
        ({"GPU": 1}, {}, False),
        ({"GPU": 1}, {"GPU": 0}, False),
        ({"GPU": 1}, {"GPU": 1}, True),
        ({"GPU": 2}, {"GPU": 1}, False),
        ({"GPU": 1, "MEMORY": 1e9}, {"GPU": 4, "MEMORY": 1e9}, True),
        ({"GPU": 1, "MEMORY": 2e9}, {"GPU": 4, "MEMORY": 1e9}, False),
        ({"CPU": 0.5}, {"CPU": 0.49}, False),
        ({"gpu": 1}, {"GPU": 1}, False),  # names are case-sensitive
    ],
)
def test_fits_needs_every_demanded_amount(demand: dict, available: dict, expected: bool) -> None:
    assert fits(to_shape(demand), available) is expected


def test_acquire_then_release_returns_used_to_exactly_zero() -> None:
    total = {"CPU": 1, "GPU": 2}
    used: dict[str, float] = {}
    shapes = [to_shape({"CPU": 0.1}) for _ in range(7)] + [to_shape({"GPU": 2})]
    for shape in shapes:
        acquire(used, shape)
    assert free(total, used)["GPU"] == 0
    for shape in shapes:
        release(used, shape)
    assert used == {"CPU": 0, "GPU": 0}
    assert free(total, used) == total


def test_free_lists_every_total_resource() -> None:
    assert free({"GPU": 2, "MEMORY": 10}, {"GPU": 1}) == {"GPU": 1, "MEMORY": 10}


def test_format_resources_of_nothing_is_a_dash() -> None:
    assert format_resources({}) == "-"


def test_format_resources_names_every_resource_sorted() -> None:
    text = format_resources({"b": 1, "a": 2})
    assert text.index("a=2") < text.index("b=1")
