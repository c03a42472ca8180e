"""``make test-compiled`` really tests the compiled build: apportion comes from the wheel
built with APPORTION_COMPILE=1 (setup.py), in this process and in the processes it starts,
never from the source tree.

Skipped unless APPORTION_EXPECT_COMPILED=1, which ``make test-compiled`` sets.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from apportion.build_info import COMPILED_MODULES, is_native, scheduler_compiled

pytestmark = pytest.mark.skipif(
    os.environ.get("APPORTION_EXPECT_COMPILED") != "1",
    reason="checks the compiled build (make test-compiled)",
)


def test_the_scheduler_is_compiled() -> None:
    assert scheduler_compiled()


@pytest.mark.parametrize("name", COMPILED_MODULES)
def test_each_compiled_module_is_a_native_extension(name: str) -> None:
    module = importlib.import_module(name)
    assert is_native(module), module.__file__


@pytest.mark.parametrize("name", ["apportion", "apportion.scheduler", *COMPILED_MODULES])
def test_modules_come_from_the_installed_wheel_not_the_source_tree(name: str) -> None:
    # The source tree's apportion/ (or scheduler/) would shadow the installed package if
    # pytest had put the repository root on sys.path; nothing there is in site-packages.
    path = Path(importlib.import_module(name).__file__ or "").resolve()
    assert path.is_relative_to(Path(sysconfig.get_path("platlib")).resolve()), path


def test_child_processes_get_the_compiled_scheduler_too() -> None:
    # LocalCluster starts its scheduler as `python -m apportion` in the current directory,
    # which -m and -c put first on sys.path.
    probe = "from apportion.build_info import scheduler_compiled; print(scheduler_compiled())"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.stdout.strip() == "True", result.stderr
