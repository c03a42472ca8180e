"""A worker's own resource ledger."""

from __future__ import annotations

import random

import pytest
from apportion.worker.local_resources import LocalResources

from apportion.resources import to_shape


def shape(**demand: float) -> tuple:
    return to_shape(demand)


def test_whole_units_are_granted_as_distinct_indices_and_returned() -> None:
    ledger = LocalResources({"GPU": 4})
    first = ledger.acquire(shape(GPU=1))
    second = ledger.acquire(shape(GPU=2))
    assert first == {"GPU": [0]}
    assert second == {"GPU": [1, 2]}
    ledger.release(shape(GPU=1), first)
    third = ledger.acquire(shape(GPU=2))
    assert third == {"GPU": [0, 3]}
    assert ledger.free() == {"GPU": 0}


@pytest.mark.parametrize(
    ("total", "demand"),
    [
        ({"MEMORY": 100e9}, {"MEMORY": 10e9}),
        ({"MEMORY": 100e9}, {"MEMORY": 100e9}),
        ({"CPU": 1.5}, {"CPU": 1}),
        ({"GPU": 2}, {"GPU": 0.5}),
    ],
)
def test_quantities_get_no_unit_indices(total: dict, demand: dict) -> None:
    ledger = LocalResources(total)
    assert ledger.acquire(to_shape(demand)) == {}


def test_mixed_demand_gets_units_only_for_countable_resources() -> None:
    ledger = LocalResources({"GPU": 2, "MEMORY": 100e9})
    assert ledger.acquire(shape(GPU=1, MEMORY=50e9)) == {"GPU": [0]}
    assert ledger.free() == {"GPU": 1, "MEMORY": 50e9}


@pytest.mark.parametrize(
    ("total", "demand", "ever", "now"),
    [
        ({"GPU": 2}, {"GPU": 2}, True, True),
        ({"GPU": 2}, {"GPU": 3}, False, False),
        ({"GPU": 2}, {"OTHER": 1}, False, None),
        ({}, {}, True, True),
        ({"GPU": 0}, {"GPU": 1}, False, False),
    ],
)
def test_can_ever_fit_and_fits_now(total: dict, demand: dict, ever: bool, now: bool) -> None:
    ledger = LocalResources(total)
    assert ledger.can_ever_fit(to_shape(demand)) is ever
    if now is not None:
        assert ledger.fits_now(to_shape(demand)) is now


def test_acquire_beyond_free_is_refused_and_changes_nothing() -> None:
    ledger = LocalResources({"GPU": 2})
    ledger.acquire(shape(GPU=2))
    with pytest.raises(RuntimeError, match="does not fit"):
        ledger.acquire(shape(GPU=1))
    assert ledger.used == {"GPU": 2}
    assert ledger.free() == {"GPU": 0}


def test_peak_records_the_most_ever_used() -> None:
    ledger = LocalResources({"GPU": 4})
    a = ledger.acquire(shape(GPU=3))
    ledger.release(shape(GPU=3), a)
    ledger.acquire(shape(GPU=1))
    assert ledger.peak == {"GPU": 3}


@pytest.mark.parametrize("seed", range(5))
def test_random_acquire_release_never_over_commits_nor_shares_a_unit(seed: int) -> None:
    rng = random.Random(seed)
    total = {"GPU": 4, "MEMORY": 64e9, "CPU": 2}
    ledger = LocalResources(total)
    held: list[tuple[tuple, dict]] = []
    demands = [
        shape(GPU=1),
        shape(GPU=2),
        shape(MEMORY=16e9),
        shape(GPU=1, MEMORY=8e9),
        shape(CPU=0.5),
        shape(CPU=1, GPU=1),
    ]
    for _ in range(500):
        if held and rng.random() < 0.45:
            demand, units = held.pop(rng.randrange(len(held)))
            ledger.release(demand, units)
        else:
            demand = rng.choice(demands)
            if ledger.fits_now(demand):
                held.append((demand, ledger.acquire(demand)))
            else:
                with pytest.raises(RuntimeError):
                    ledger.acquire(demand)
        for name, amount in total.items():
            assert 0 <= ledger.used[name] <= amount
        granted = [u for _, units in held for u in units.get("GPU", [])]
        assert len(granted) == len(set(granted))
        assert all(0 <= u < 4 for u in granted)
        assert len(granted) == sum(dict(d).get("GPU", 0) for d, _ in held)
    for demand, units in held:
        ledger.release(demand, units)
    assert all(v == 0 for v in ledger.used.values())


def test_fractional_demands_that_sum_exactly_to_the_total_all_fit() -> None:
    ledger = LocalResources({"CPU": 1})
    for _ in range(5):
        ledger.acquire(shape(CPU=0.2))
    assert ledger.free() == {"CPU": 0}
