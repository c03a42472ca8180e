"""The README's "Running a cluster by hand" works when pasted in order.

Its commands are read from the README itself (every line of its bash blocks, then its
Python block), so a change there is tested here. One substitution: the README's
scheduler runs on a machine named ``scheduler`` at port 8786; here it is this machine,
at a free port (tests run side by side).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from apportion import Client
from tests.conftest import wait_until

README = Path(__file__).parents[2] / "README.md"


def section(title: str, page: Path = README) -> str:
    """The text under a heading (``## title``) of the README or of a page of docs/, up to
    the next heading of any level."""
    text = page.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n#", text.index("\n", start) + 1)
    while end != -1 and text.count("```", start, end) % 2:  # a '#' inside a code block
        end = text.find("\n#", end + 1)
    return text[start:end]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def commands(text: str) -> list[str]:
    return [
        line
        for block in blocks(text, "bash")
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return False
    return True


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh directory, a HOME of its own and no token in the environment."""
    monkeypatch.chdir(tmp_path)
    for name in ("APPORTION_TOKEN", "APPORTION_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    yield tmp_path


def test_running_a_cluster_by_hand_works_as_pasted(here: Path) -> None:
    text = section("Running a cluster by hand")
    port = str(_free_port())
    pasted = [
        c.replace("tcp://scheduler:", "tcp://127.0.0.1:").replace("8786", port)
        for c in commands(text)
    ]
    assert len(pasted) == 4 and pasted[0].startswith("apportion scheduler"), pasted
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for command in pasted:
            processes.append(
                subprocess.Popen(
                    ["bash", "-c", command], stdin=subprocess.DEVNULL, start_new_session=True
                )
            )
            if command.startswith("apportion scheduler"):
                wait_until(lambda: (here / "token").is_file(), what="the token file")
                wait_until(lambda: _accepts(int(port)), what="the scheduler listening")
        (python,) = blocks(text, "python")
        namespace: dict[str, object] = {"Client": Client}
        exec(
            python.replace("tcp://scheduler:", "tcp://127.0.0.1:").replace("8786", port), namespace
        )
        client = namespace["client"]
        assert isinstance(client, Client)
        with client:

            def resources() -> list[dict[str, float]]:
                workers = client.scheduler_info()["workers"].values()
                return sorted((w["resources"] for w in workers), key=str)

            expected = sorted([{"GPU": 2}, {"MEMORY": 100e9}, *[{"process": 1}] * 3], key=str)
            wait_until(lambda: resources() == expected, timeout=60, what="five workers")
            assert client.submit(sum, [1, 2], resources={"process": 1}).result(timeout=30) == 3
        assert all(p.poll() is None for p in processes), "a command exited"
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
