"""The benchmark's TLS rows: certificates every system can use, and the figures read
against each other."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import tls, workloads
from benchmarks.workloads import Sizes, tls_share_of_tcp


def test_each_tls_row_is_read_as_a_share_of_the_same_row_over_tcp() -> None:
    metrics = {
        "data_100mb_worker_to_worker_mb_per_s": 2000.0,
        "data_100mb_tls_worker_to_worker_mb_per_s": 1100.0,
        "data_100mb_tls_gather_mb_per_s": 900.0,  # no TCP gather in this run: no share
    }
    assert tls_share_of_tcp(metrics, Sizes()) == {
        "data_100mb_tls_worker_to_worker_pct_of_tcp": 55.0
    }


def test_the_reference_sentence_names_each_cipher() -> None:
    text = tls.describe({"aes-128-gcm": 5200.0, "aes-256-gcm": 4300.5})
    assert "AES-128-GCM 5,200 MB/s" in text and "AES-256-GCM 4,300 MB/s" in text
    assert tls.describe({}) == "" and tls.describe(None) == ""


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_certificates_serve_mutual_tls_on_loopback(tmp_path: Path) -> None:
    files = tls.make_certificates(tmp_path)
    server, client = tls.mutual_tls_contexts(files)
    server_side, client_side = ssl.MemoryBIO(), ssl.MemoryBIO()
    ours = client.wrap_bio(client_side, server_side, server_hostname="127.0.0.1")
    theirs = server.wrap_bio(server_side, client_side, server_side=True)
    # Memory BIOs crossed: what one side writes is the other's input.
    for _ in range(6):
        for end in (ours, theirs):
            try:
                end.do_handshake()
            except ssl.SSLWantReadError:
                pass
    assert ours.version() == "TLSv1.3"
    assert theirs.getpeercert()["subject"]  # the client presented its certificate


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_the_cpu_of_a_cluster_process_is_read_from_outside_it() -> None:
    """The TLS rows' CPU figures: a child's CPU time, all its threads, read by its pid."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"
    child = subprocess.Popen([sys.executable, "-c", burn + "print('burnt', flush=True)\ninput()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "burnt"
        assert child.pid in workloads._descendants()
        assert workloads.cpu_seconds([child.pid])[child.pid] >= 0.2
    finally:
        child.kill()
        child.wait()
    assert workloads.cpu_seconds([child.pid]) == {}  # gone: left out


def test_the_floor_sentence_names_the_tls_transport_figures_only_when_measured() -> None:
    from benchmarks import floor

    base = {"round_trip_us": {"p50": 1.0, "p99": 2.0}, "cpu_loop_s": 0.1}
    text = floor.describe({**base, "loop_tls_100mb_mb_per_s": {"made": 1066.4, "new": 771.0}})
    assert "1,066 MB/s into memory made before, 771 MB/s into new memory" in text
    for missing in ({}, {"made": 1066.4}):  # no openssl command; a partial record
        assert "TLS transport" not in floor.describe({**base, "loop_tls_100mb_mb_per_s": missing})
    assert "TLS transport" not in floor.describe(base)  # results from before
