"""The README's self-contained Python examples work when pasted: each, run as a script,
prints what its comments say. (The "Running a cluster by hand" and "Coming from Dask"
examples have tests of their own; the Kubernetes one needs a cluster: tests/k8s.) A
section given a Python block is run by a test, or this file fails until it is."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from tests.integration.test_readme_commands import README, blocks, section

DASK_PAGE = README.parent / "docs" / "dask.md"


def run_example(title: str, cwd: Path, page: Path = README) -> subprocess.CompletedProcess[str]:
    (code,) = blocks(section(title, page), "python")
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


def test_the_gangs_example_runs_as_pasted(tmp_path: Path) -> None:
    (line,) = run_example("Gangs", tmp_path).stdout.splitlines()
    ranks = ast.literal_eval(line)  # a printed list of tuples
    assert [rank for rank, _, _ in ranks] == [0, 1]
    assert sorted(worker for _, worker, _ in ranks) == ["gpu-0", "gpu-1"]
    assert all(units == [0, 1] for _, _, units in ranks)


def test_the_teams_example_runs_as_pasted(tmp_path: Path) -> None:
    lines = run_example("Teams", tmp_path).stdout.splitlines()
    assert lines == ["vision speech", "{'vision': 3, 'speech': 1}", "{'speech': 2}"]


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


def test_the_task_timeout_example_runs_as_pasted(tmp_path: Path) -> None:
    done = run_example("When things go wrong", tmp_path)
    assert done.stdout.splitlines() == ["timed out", "3"]


# Sections of the README whose Python blocks run elsewhere: by hand (test_readme_commands),
# Coming from Dask (test_coming_from_dask_readme), On Kubernetes (tests/k8s).
RUN_ELSEWHERE = {"Running a cluster by hand", "Coming from Dask", "On Kubernetes"}
RUN_HERE = {
    "Quick start",
    "Gangs",
    "Teams",
    "Dask collections",
    "The dashboard",
    "When things go wrong",
}


def test_every_python_block_of_the_readme_is_run_by_a_test() -> None:
    text = README.read_text()
    titles = re.findall(r"^## (.+)$", text, flags=re.M)
    with_python = {title for title in titles if blocks(section(title), "python")}
    assert with_python == RUN_HERE | RUN_ELSEWHERE


def test_starting_a_cluster_as_in_dask_runs_as_pasted(tmp_path: Path) -> None:
    done = run_example("Starting a cluster as in Dask", tmp_path, DASK_PAGE)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("<Client ") and "workers=2, threads=2" in lines[0]
    assert "resources=GPU=2" in lines[0]
    assert lines[1:] == ["3", "3", "True"]
    assert "reconnecting" not in done.stderr, done.stderr
