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


def test_loopback_is_measured_both_cached_and_into_a_new_buffer_of_the_whole_size() -> None:
    assert floor.loopback_tcp_mb_per_s(8_000_000) > 0
    assert floor.loopback_tcp_mb_per_s(8_000_000, whole=True) > 0
    text = floor.describe(
        {
            "round_trip_us": {"p50": 1.0, "p99": 2.0},
            "cpu_loop_s": 0.1,
            "loopback_tcp_mb_per_s": 1700.0,
            "memcpy_gb_per_s": 9.0,
            "loopback_tcp_whole_400mb_mb_per_s": 900.0,
        }
    )
    assert "1700 MB/s" in text and "new one in the other process: 900 MB/s" in text
