"""A client's I/O thread stopped with work still pending on it ends that work there and
then: nothing is left for the interpreter's exit to collect, when the modules its cleanup
needs are gone (which printed "Task was destroyed but it is pending!" and "Exception
ignored ..." after the program's own output)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PENDING_THEN_STOPPED = textwrap.dedent(
    """
    import asyncio, socket
    from apportion.protocol.comm import connect
    from apportion.session import Session

    # A peer that accepts (the kernel does) but never answers the handshake.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    session = Session(address, None)
    asyncio.run_coroutine_threadsafe(connect(address, "client", None, timeout=60), session.loop)
    session.closed = True
    session.stop_thread()
    print("stopped")
    """
)


def test_work_pending_when_the_io_thread_stops_ends_before_the_interpreter_exits() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PENDING_THEN_STOPPED], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"
    assert "destroyed but it is pending" not in done.stderr
    assert "Exception ignored" not in done.stderr
    assert "never awaited" not in done.stderr
