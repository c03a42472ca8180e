"""The benchmark's machine floor: a real round trip between two processes, described."""

from __future__ import annotations

from benchmarks import floor


def test_round_trip_between_processes_is_measured_in_order() -> None:
    trip = floor.round_trip_us(count=200)
    assert 0 < trip["p50"] <= trip["p99"]


def test_description_names_both_figures_and_tolerates_old_results() -> None:
    text = floor.describe({"round_trip_us": {"p50": 56.0, "p99": 1219.5}, "cpu_loop_s": 0.2})
    assert "56 µs (p50)" in text and "1219.5 µs (p99)" in text and "0.2 s" in text
    assert floor.describe(None) == ""
