"""Which CUDA devices a task's child process may see: its GPU units, through the worker's
own CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import pytest

from apportion.core.context import TaskInfo, visible_devices


@pytest.mark.parametrize(
    ("units", "inherited", "expected"),
    [
        ([1], None, "1"),
        ([0, 1], "", "0,1"),
        ([1], "2,3", "3"),
        ([0, 1], " 2, 3 ", "2,3"),
        ([0], "GPU-5f1c2e7a", "GPU-5f1c2e7a"),  # UUIDs pass through as given
        ([], "2,3", ""),
    ],
)
def test_units_map_through_the_workers_own_visible_devices(
    units: list[int], inherited: str | None, expected: str
) -> None:
    assert visible_devices(units, inherited) == expected


def test_a_unit_the_worker_cannot_see_is_an_error_saying_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"units \[2\].*shows only 2 device.*declare no more GPU"):
        visible_devices([1, 2], "4,5")


def test_a_task_info_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    info = TaskInfo("k", {"GPU": 1}, {"GPU": [1]})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    assert info.cuda_visible_devices == "7"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert info.cuda_visible_devices == "1"
    assert TaskInfo("k").cuda_visible_devices == ""
