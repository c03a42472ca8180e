"""Memory limits as Dask users write them: sizes with units, fractions, 'auto', none."""

from __future__ import annotations

from pathlib import Path

import pytest

from apportion.memory_limit import (
    available_memory,
    cgroup_limit,
    format_size,
    parse_memory_limit,
    parse_size,
)

GIB = 1024**3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GB", 4 * 1000**3),
        ("4GiB", 4 * GIB),
        ("4 gib", 4 * GIB),
        ("512MiB", 512 * 1024**2),
        ("1.5GB", 1_500_000_000),
        ("4e9", 4_000_000_000),
        ("100", 100),
        ("2kB", 2000),
        (4096, 4096),
    ],
)
def test_sizes_take_decimal_and_binary_units(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [("4 parsecs", "unknown unit 'parsecs'"), ("lots", "not a memory size"), ("-1GB", "")],
)
def test_a_bad_size_is_refused_with_the_value(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message or "not a memory size") as caught:
        parse_size(text)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4 * GIB, 4 * GIB),
        ("4GiB", 4 * GIB),
        ("4GB", 4 * 1000**3),
        (0.5, 8 * GIB),
        ("0.25", 4 * GIB),
        (1.0, 16 * GIB),
        (4e9, 4_000_000_000),
        ("auto", 16 * GIB),
        ("AUTO", 16 * GIB),
    ],
)
def test_limits_dask_users_pass_become_bytes(value: str | float, expected: int) -> None:
    assert parse_memory_limit(value, total=16 * GIB) == expected


@pytest.mark.parametrize("value", [None, 0, 0.0, "0", "none", "None", "", False])
def test_none_or_zero_means_no_limit(value: str | float | None) -> None:
    assert parse_memory_limit(value, total=16 * GIB) is None


def test_auto_divides_the_machine_among_the_workers_started_together() -> None:
    assert parse_memory_limit("auto", nworkers=4, total=16 * GIB) == 4 * GIB
    # Explicit sizes and fractions are per worker, whatever the count.
    assert parse_memory_limit("2GiB", nworkers=4, total=16 * GIB) == 2 * GIB
    assert parse_memory_limit(0.5, nworkers=4, total=16 * GIB) == 8 * GIB


def test_auto_on_this_machine_is_at_most_its_memory() -> None:
    limit = parse_memory_limit("auto")
    assert limit is not None and 0 < limit <= available_memory()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "cannot be negative"),
        (-0.5, "cannot be negative"),
        ("plenty", "not a memory size"),
        ("4 XB", "unknown unit"),
        (True, "got True"),
        ([4], r"got \[4\]"),
    ],
)
def test_bad_limits_are_refused_naming_the_value(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_memory_limit(value, total=16 * GIB)  # type: ignore[arg-type]


def test_nworkers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="nworkers must be at least 1, got 0"):
        parse_memory_limit("auto", nworkers=0, total=GIB)


def test_cgroup_v2_limit_and_max(tmp_path: Path) -> None:
    v2 = tmp_path / "memory.max"
    v2.write_text("1073741824\n")
    assert cgroup_limit((str(v2),)) == GIB
    v2.write_text("max\n")
    assert cgroup_limit((str(v2),)) is None


def test_cgroup_v1_limit_and_its_no_limit_number(tmp_path: Path) -> None:
    v1 = tmp_path / "memory.limit_in_bytes"
    v1.write_text("536870912\n")
    missing = str(tmp_path / "absent")
    assert cgroup_limit((missing, str(v1))) == 512 * 1024**2
    v1.write_text("9223372036854771712\n")
    assert cgroup_limit((missing, str(v1))) is None


def test_the_container_limit_wins_when_lower_than_the_machine(tmp_path: Path) -> None:
    limit = tmp_path / "memory.max"
    limit.write_text(str(256 * 1024**2))
    assert available_memory((str(limit),)) == 256 * 1024**2
    assert available_memory((str(tmp_path / "absent"),)) > 256 * 1024**2


def test_sizes_print_for_people() -> None:
    assert format_size(GIB) == "1.00 GiB"
    assert format_size(512) == "512 B"
    assert format_size(None) == "no limit"
