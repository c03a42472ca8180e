"""The README's "Coming from Dask" example works when pasted: run as a script, it prints
what its comments say and writes its report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.test_readme_commands import blocks, section


def test_the_coming_from_dask_example_runs_as_its_comments_say(tmp_path: Path) -> None:
    (code,) = blocks(section("Coming from Dask"), "python")
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["8", "256"]
    assert lines[2].startswith("deadlock: evaluate-") and "waits for ['train-" in lines[2]
    assert lines[3:] == ["evaluated", "{'GPU': 0}"]
    assert "Task stream (7 runs" in (tmp_path / "report.html").read_text()
    assert "NoWorkerWarning" not in done.stderr
