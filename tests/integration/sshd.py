"""A real OpenSSH server for the tests: Debian's ``sshd`` (tests/system-deps/openssh.sh),
started on a free loopback port with its own configuration, host key and one user key the
test makes, for the user running the tests. Nothing of the machine's own SSH set-up is
read or changed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
# The directory sshd insists on when started as root (privilege separation); the package's
# service unit makes it at boot, which a test machine may never have done.
PRIVSEP_DIR = "/run/sshd"


@dataclass(frozen=True)
class Sshd:
    port: int
    pid: int  # the listening sshd; every session is a process under it
    user_key: Path  # private key of the test's user
    known_hosts: Path  # the server's host key, for 127.0.0.1 and localhost on its port
    log: Path

    def connect_options(self) -> dict[str, object]:
        """asyncssh.connect's options to reach this server as the test's user."""
        return {
            "port": self.port,
            "client_keys": [str(self.user_key)],
            "known_hosts": str(self.known_hosts),
            "agent_path": None,
        }


def sshd_missing() -> str | None:
    """Why the SSH tests cannot run here (None: they can)."""
    if not os.path.exists(SSHD) or not shutil.which("ssh-keygen"):
        return "Debian's openssh-server is not installed: make system-deps"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "apportion-test", "-f", str(path)],
        check=True,
    )


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def running_sshd(directory: Path, timeout: float = 30.0) -> Iterator[Sshd]:
    """An sshd for the current user on a free loopback port until the block ends."""
    if os.geteuid() == 0:
        os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
    _keygen(directory / "host_key")
    _keygen(directory / "user_key")
    shutil.copy(directory / "user_key.pub", directory / "authorized_keys")
    port = free_port()
    host_key = (directory / "host_key.pub").read_text().split()
    known_hosts = directory / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port},[localhost]:{port} {host_key[0]} {host_key[1]}\n")
    config = directory / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"ListenAddress 127.0.0.1:{port}",
                f"HostKey {directory / 'host_key'}",
                f"AuthorizedKeysFile {directory / 'authorized_keys'}",
                "StrictModes no",  # the keys live in a temporary directory
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "PidFile none",
                "MaxSessions 50",  # one channel per scheduler and worker
                "MaxStartups 50",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    log = directory / "sshd.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=log_file, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + timeout
        while not _listening(port):
            if process.poll() is not None:
                raise RuntimeError(f"sshd exited with {process.returncode}: {log.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"sshd did not listen within {timeout}s: {log.read_text()}")
            time.sleep(0.05)  # polling for the port to open
        yield Sshd(port, process.pid, directory / "user_key", known_hosts, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
