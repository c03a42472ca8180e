"""``apportion scheduler`` listens on all interfaces by default and says where to connect."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

from apportion import Client

APPORTION = [sys.executable, "-m", "apportion"]


def _listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(address)
    return found


def _start(*args: str) -> tuple[subprocess.Popen[str], dict, str]:
    read_end, write_end = os.pipe()
    scheduler = subprocess.Popen(
        [*APPORTION, "scheduler", "--port", "0", "--no-auth", "--ready-fd", str(write_end), *args],
        pass_fds=(write_end,),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    with os.fdopen(read_end) as ready:
        details = json.loads(ready.readline())
    assert scheduler.stderr is not None
    for line in scheduler.stderr:
        if "listening" in line:
            return scheduler, details, line
    raise AssertionError("no 'listening' line")


def _stop(scheduler: subprocess.Popen[str]) -> None:
    scheduler.send_signal(signal.SIGTERM)
    scheduler.communicate(timeout=30)


def test_the_scheduler_listens_on_all_interfaces_and_names_the_address_to_use() -> None:
    scheduler, details, line = _start()
    try:
        address = details["address"]
        port = int(address.rsplit(":", 1)[1])
        # The wildcard address, in IPv4 or IPv6: every interface.
        assert _listening_addresses(port) & {"00000000", "0" * 32}, _listening_addresses(port)
        assert f"connect to {address}" in line and "all interfaces" in line, line
        host = re.match(r"tcp://([^:]+):", address).group(1)  # type: ignore[union-attr]
        assert not host.startswith("127."), "others cannot use a loopback address"
        with Client(address) as client:  # through that interface, not loopback
            assert client.scheduler_info()["workers"] == {}
    finally:
        _stop(scheduler)


def test_host_keeps_the_scheduler_to_one_interface() -> None:
    scheduler, details, _ = _start("--host", "127.0.0.1")
    try:
        port = int(details["address"].rsplit(":", 1)[1])
        assert details["address"] == f"tcp://127.0.0.1:{port}"
        assert _listening_addresses(port) == {"0100007F"}
    finally:
        _stop(scheduler)
