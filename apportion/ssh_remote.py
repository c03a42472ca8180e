"""What SSHCluster (apportion/ssh.py) runs on each host, over SSH:
``python -m apportion.ssh_remote scheduler|worker ARGS...``.

It reads the cluster's token from its standard input, the SSH channel (a command line is
shown to every user of the host by ``ps``; the channel is not), starts ``apportion ROLE
ARGS --ready-fd 1`` with the token in its environment, and stops that server when its
standard input ends: the cluster closed the channel, or the SSH connection dropped. The
server's readiness line comes back on standard output; the exit code is the server's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from apportion.auth import TOKEN_ENV
from apportion.process import EXIT_STARTUP_FAILED, PARENT_PID_ENV

# How long the server has to stop cleanly (workers leave the scheduler, moving nothing)
# before it is killed.
STOP_GRACE = 20.0


def stop(server: subprocess.Popen[bytes]) -> None:
    """Ask the server to stop; kill it if it has not within ``STOP_GRACE`` seconds."""
    if server.poll() is not None:
        return
    server.terminate()
    try:
        server.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        server.kill()


def stop_when_input_ends(server: subprocess.Popen[bytes]) -> None:
    while os.read(sys.stdin.fileno(), 65536):
        pass  # nothing more is sent after the token: only the end matters
    stop(server)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("scheduler", "worker"):
        print("usage: python -m apportion.ssh_remote scheduler|worker ARGS...", file=sys.stderr)
        return EXIT_STARTUP_FAILED
    token = sys.stdin.buffer.readline().decode("utf-8", "replace").strip()
    if not token:
        print("apportion ssh: no token on standard input", file=sys.stderr)
        return EXIT_STARTUP_FAILED
    env = {**os.environ, TOKEN_ENV: token, PARENT_PID_ENV: str(os.getpid())}
    server = subprocess.Popen(
        [sys.executable, "-m", "apportion", *argv, "--ready-fd", "1"],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: threading.Thread(target=stop, args=(server,)).start())
    threading.Thread(target=stop_when_input_ends, args=(server,), daemon=True).start()
    code = server.wait()
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as shells say


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
