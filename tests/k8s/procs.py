"""Starting, waiting for and stopping local processes, always by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class Timeout(RuntimeError):
    pass


def wait_for(
    condition: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.2,
) -> T:
    """Polls condition until it returns a truthy value; exceptions count as 'not yet'."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as err:  # not ready yet; remember why for the timeout message
            last_error = err
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise Timeout(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def start(
    argv: Sequence[str | os.PathLike[str]],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Starts argv in its own session (process group), output appended to log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pid: int, sig: int) -> None:
    """Signals the process group led by pid: every process we start leads its own group,
    so this also reaches whatever it forked."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen[bytes] | int, grace: float = 10.0) -> None:
    """SIGTERM to the process group, then SIGKILL after grace seconds; reaps our children."""
    pid = proc if isinstance(proc, int) else proc.pid
    signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if _exited(proc):
            break
        time.sleep(0.05)
    # Whatever is left of the group (the leader or its descendants) is killed outright.
    signal_group(pid, signal.SIGKILL)
    if isinstance(proc, subprocess.Popen):
        proc.wait()


def _exited(proc: subprocess.Popen[bytes] | int) -> bool:
    if isinstance(proc, subprocess.Popen):
        return proc.poll() is not None
    return not alive(proc)
