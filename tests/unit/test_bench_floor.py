"""The benchmark's machine floor: a real round trip between two processes, described."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks import floor, tls


def test_round_trip_between_processes_is_measured_in_order() -> None:
    trip = floor.round_trip_us(count=200)
    assert 0 < trip["p50"] <= trip["p99"]


def test_description_names_both_figures_and_tolerates_old_results() -> None:
    text = floor.describe({"round_trip_us": {"p50": 56.0, "p99": 1219.5}, "cpu_loop_s": 0.2})
    assert "56 µs (p50)" in text and "1219.5 µs (p99)" in text and "0.2 s" in text
    assert floor.describe(None) == ""


def _anonymous_rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


def test_receive_buffer_is_new_memory_or_made_on_request() -> None:
    # "new" must leave the pages to the bytes' arrival (a zero-filled bytearray, which the
    # 400 MB floor used, made them all before the clock started).
    size = 64 << 20
    before = _anonymous_rss_kb()
    new = floor.receive_buffer(size, made=False)
    grown_new = _anonymous_rss_kb() - before
    made = floor.receive_buffer(size, made=True)
    grown_made = _anonymous_rss_kb() - before - grown_new
    assert len(new) == len(made) == size
    assert grown_new < 8 << 10, f"new memory already had {grown_new} KiB of pages"
    assert grown_made > (size >> 10) * 9 // 10, f"made memory had only {grown_made} KiB"


def test_loopback_is_measured_cached_into_made_and_into_new_memory() -> None:
    for into in floor.RECEIVERS:
        assert floor.loopback_tcp_mb_per_s(8_000_000, into=into) > 0
    with pytest.raises(ValueError, match="expected one of"):
        floor.loopback_tcp_mb_per_s(8_000_000, into="whole")
    text = floor.describe(
        {
            "round_trip_us": {"p50": 1.0, "p99": 2.0},
            "cpu_loop_s": 0.1,
            "loopback_tcp_mb_per_s": 1700.0,
            "memcpy_gb_per_s": 9.0,
            "loopback_tcp_400mb_made_mb_per_s": 2900.0,
            "loopback_tcp_400mb_new_mb_per_s": 900.0,
        }
    )
    assert "1700 MB/s" in text
    assert "2900 MB/s into memory made before, 900 MB/s into new memory" in text


def test_the_shape_of_each_row_is_timed_over_a_connection_used_before() -> None:
    # A first transfer warms the connection (untimed); each timed one is into new memory.
    figures = floor.warm_transfers_mb_per_s(1_000_000, 3)
    assert len(figures) == 3 and all(figure > 0 for figure in figures)
    shapes = floor.shape_samples((1,))
    assert list(shapes) == ["1"] and len(shapes["1"]) == 5


def test_results_from_before_the_two_whole_figures_still_describe() -> None:
    text = floor.describe(
        {
            "round_trip_us": {"p50": 1.0, "p99": 2.0},
            "cpu_loop_s": 0.1,
            "loopback_tcp_whole_400mb_mb_per_s": 3235.2,
        }
    )
    assert "other process: 3235.2 MB/s." in text


def test_the_loopback_figure_is_the_median_of_every_sample_over_the_run() -> None:
    first = floor.with_loopback_samples({"cpu_loop_s": 0.1}, [2000.0, 4700.0, 1800.0])
    assert first["loopback_tcp_mb_per_s"] == 2000.0
    later = floor.with_loopback_samples(first, [2100.0, 2200.0, 1900.0])
    assert later["loopback_tcp_mb_per_s"] == 2050.0
    assert later["loopback_tcp_samples_mb_per_s"] == [1800, 1900, 2000, 2100, 2200, 4700]
    assert later["cpu_loop_s"] == 0.1
    text = floor.describe(
        {**later, "round_trip_us": {"p50": 1.0, "p99": 2.0}, "memcpy_gb_per_s": 9.0}
    )
    assert "moves 2050 MB/s between two processes (median of 6 samples over the run," in text
    assert "1800-4700); memcpy 9 GB/s." in text
    assert len(floor.loopback_samples(2)) == 2


def test_each_data_row_is_read_against_the_floor_of_its_own_shape() -> None:
    from benchmarks import report

    machine = floor.with_shape_samples(
        {"loopback_tcp_mb_per_s": 2000.0}, {"10": [900.0, 1000.0, 1100.0], "400": [1200.0]}
    )
    machine = floor.with_shape_samples(machine, {"400": [1000.0, 800.0]})
    assert floor.shape_floor(machine, 10) == 1000.0
    assert floor.shape_floor(machine, 400) == 1000.0  # median of all three samples
    assert floor.shape_floor(machine, 100) is None
    assert "10 MB 1,000, 400 MB 1,000 MB/s" in floor.describe(
        {
            **machine,
            "round_trip_us": {"p50": 1.0, "p99": 2.0},
            "cpu_loop_s": 0.1,
            "memcpy_gb_per_s": 9,
        }
    )
    metrics = {
        "data_10mb_worker_to_worker_mb_per_s": 950.0,  # 95% of its floor, 1.9x dask
        "data_10mb_worker_to_worker_transfer_mb_per_s": 1200.0,  # the receiver's own timing
        "data_10mb_gather_mb_per_s": 850.0,  # 85%: short of the floor
        "data_400mb_worker_to_worker_mb_per_s": 920.0,  # 92%, but 1.15x dask only
        "data_400mb_task_pass_ms": 30.0,
        "data_peak_rss_sender_mb": 590.0,
        "data_peak_rss_client_mb": 610.0,
    }
    dask = {
        "data_10mb_worker_to_worker_mb_per_s": 500.0,
        "data_10mb_gather_mb_per_s": 400.0,
        "data_400mb_worker_to_worker_mb_per_s": 800.0,
    }
    runs = [
        {"system": "apportion", "metrics": metrics},
        {"system": "dask", "metrics": dask},
    ]
    plane = report.summarise(runs, ["apportion", "dask"], machine)["data_plane"]
    row = plane["data_10mb_worker_to_worker_mb_per_s"]
    assert row["of_floor"] == 0.95 and row["over_dask"] == 1.9 and row["met"] is True
    assert row["of_cached_loopback"] == 950.0 / 2000.0
    assert row["transfer_mb_per_s"] == 1200.0
    assert plane["data_10mb_gather_mb_per_s"]["transfer_mb_per_s"] is None
    assert plane["data_10mb_gather_mb_per_s"]["met"] is False
    row = plane["data_400mb_worker_to_worker_mb_per_s"]
    assert row["met"] is False and row["task_pass_ms"] == 30.0
    assert plane["data_peak_rss_sender_mb"]["met"] is True  # 590 <= 1.5 x 400
    assert plane["data_peak_rss_client_mb"]["met"] is False
    results = {
        **report.summarise(runs, ["apportion", "dask"], machine),
        "meta": {"reps": 1, "quick": False, "versions": {}, "cpus": 2, "when": "now"}
        | {"uptime_start": "", "uptime_end": ""},
    }
    text = report.markdown(results)
    assert "| 10 MB array: client gather | 850 | 1,000 | 85% | 42% | n/a | 2.12x |" in text
    assert "| 10 MB array: worker to worker | 950 | 1,000 | 95% | 48% | 1,200 (120%) |" in text
    assert "90% of floor, 1.2x dask MISSED" in text


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_loops_own_tls_transport_is_timed_into_made_and_into_new_memory(
    tmp_path: Path,
) -> None:
    """What a TLS row can at most reach: the interpreter's TLS transport with no system
    around it, between two processes, into either kind of receiving memory."""
    files = tls.make_certificates(tmp_path)
    for into in floor.TLS_RECEIVERS:
        assert floor.loopback_tls_mb_per_s(files, 3_000_000, into, count=2) > 0
    with pytest.raises(ValueError, match="expected one of"):
        floor.loopback_tls_mb_per_s(files, 3_000_000, "cached")
