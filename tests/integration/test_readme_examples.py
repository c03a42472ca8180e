"""The README's self-contained Python examples work when pasted: each, run as a script,
prints what its comments say. (The "Running a cluster by hand" and "Coming from Dask"
examples have tests of their own; the Kubernetes one needs a cluster: tests/k8s.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.test_readme_commands import blocks, section


def run_example(title: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    (code,) = blocks(section(title), "python")
    script = cwd / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    return done


def test_the_quick_start_runs_as_pasted(tmp_path: Path) -> None:
    done = run_example("Quick start", tmp_path)
    assert done.stdout.splitlines() == ["74", "[10, 15, 21, 28]"]


def test_the_dask_collections_example_runs_as_pasted(tmp_path: Path) -> None:
    done = run_example("Dask collections", tmp_path)
    assert done.stdout.splitlines() == ["1001000"]


def test_the_dashboard_example_runs_as_pasted(tmp_path: Path) -> None:
    lines = run_example("The dashboard", tmp_path).stdout.splitlines()
    assert lines[0].startswith("http://127.0.0.1:") and "/dashboard?token=" in lines[0]
    assert sorted(line for line in lines if "training step" in line) == [
        f"(gpu-a) training step {step}" for step in range(8)
    ]
    assert "apportion.scheduler" in lines[-2]  # the scheduler's last log lines
    assert lines[-1] == "['gpu-a']"
