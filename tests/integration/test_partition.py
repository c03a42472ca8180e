"""A worker cut off from its scheduler by a real partition (packets dropped, no RST) notices
within a few heartbeats, reconnects when the partition heals, and nothing is lost.

The partition is made on loopback only, inside a network namespace the test makes itself
(tests/integration/partition_scenario.py), so it needs ``unshare --net`` and ``iptables``
(root, as the test machine runs).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.partition_scenario import HEARTBEAT

ROOT = Path(__file__).resolve().parents[2]


def _can_make_a_partition() -> str | None:
    """Why this machine cannot run the scenario, or None."""
    for tool in ("unshare", "iptables", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = subprocess.run(
        ["unshare", "--net", "iptables", "-L", "INPUT", "-n"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"cannot make a network namespace with iptables: {probe.stderr.strip()}"
    return None


@pytest.mark.timeout(400)
def test_a_worker_notices_a_partition_within_a_few_heartbeats_and_loses_nothing() -> None:
    reason = _can_make_a_partition()
    if reason is not None:
        pytest.skip(reason)
    run = subprocess.run(
        ["unshare", "--net", sys.executable, "-m", "tests.integration.partition_scenario"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    # The first heartbeat after the cut goes out within one interval; the worker gives the
    # connection up at the heartbeat that finds it unacknowledged for three intervals
    # (reachability.py); a little slack for a loaded machine. Left to the kernel, it would
    # retransmit for about 15 minutes.
    assert seen["noticed_after_s"] < 4 * HEARTBEAT + 2, seen
    assert seen["reconnected_after_s"] < 10, seen
    assert seen["during"] == "made during the cut"
    assert seen["before"] == [x * 2 for x in range(10)]
    assert seen["invariants"] == []
