"""Starting, waiting for and stopping local processes, always by PID."""

from __future__ import annotations

import os
import re
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


def port_holder(port: int) -> str | None:
    """Who listens on TCP port `port` on any local address ("pid 123 (python)", or the
    socket's line where the process cannot be seen), or None when nobody does."""
    found = subprocess.run(
        ["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=False
    )
    lines = [line for line in found.stdout.splitlines() if line.strip()]
    if not lines:
        return None
    users = re.findall(r'\("([^"]+)",pid=(\d+)', lines[0])
    if users:
        return ", ".join(f"pid {pid} ({name})" for name, pid in users)
    return f"a process this user cannot see ({' '.join(lines[0].split())})"


def require_free_ports(ports: Sequence[int], why: str, patience: float = 30.0) -> None:
    """Fails, naming the holder, when one of ports is still taken after ``patience``
    seconds (a cluster of an earlier test may be closing): otherwise a pod that cannot
    listen there makes a test time out minutes later with no reason shown."""
    deadline = time.monotonic() + patience
    while True:
        taken = [(port, holder) for port in ports if (holder := port_holder(port)) is not None]
        if not taken or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if taken:
        named = "; ".join(f"port {port} is held by {holder}" for port, holder in taken)
        raise RuntimeError(f"{named}: {why}. Stop it (or another test cluster) and run again")


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


def _stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name: state, ppid, pgrp, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return []


def running(pid: int) -> bool:
    """Alive and not a zombie (a reparented zombie still answers kill(pid, 0))."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    return [pid for pid in pids if (f := _stat(pid)) and f[0] != "Z" and f[2] == str(pgid)]


def tree(pid: int) -> list[int]:
    """pid and its live descendants."""
    children: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (f := _stat(int(entry.name))) and f[0] != "Z":
            children.setdefault(f[1], []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(str(current), []))
    return [p for p in found if running(p)]


def signal_group(pid: int, sig: int) -> None:
    """Signals the process group led by pid: every process we start leads its own group,
    so this also reaches whatever it forked."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_group_gone(proc: subprocess.Popen[bytes] | None, pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None:
            proc.poll()  # reap our own child, or it stays a zombie member
        if not group_members(pgid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes] | int, grace: float = 10.0) -> None:
    """SIGTERM to the process group, SIGKILL to what is left after grace seconds, then
    waits until no process of the group runs (our child is reaped too)."""
    pid = proc if isinstance(proc, int) else proc.pid
    child = None if isinstance(proc, int) else proc
    signal_group(pid, signal.SIGTERM)
    if not _wait_group_gone(child, pid, grace):
        signal_group(pid, signal.SIGKILL)
        _wait_group_gone(child, pid, 10.0)
    if child is not None:
        child.wait()
