"""A client whose messages the scheduler refuses (it answers "error" and closes) fails its
pending futures with the scheduler's reason, once, instead of reconnecting and sending the
same messages again in a loop until client.reconnect-timeout."""

from __future__ import annotations

import warnings

from apportion import Client, LocalCluster
from apportion.client import NoWorkerWarning
from apportion.errors import SchedulerConnectionError
from tests.integration.tasks import inc


def test_a_refused_client_fails_its_futures_with_the_reason_and_does_not_reconnect() -> None:
    with LocalCluster(workers=[{"name": "a", "resources": {"GPU": 1}}]) as cluster:
        with Client(cluster) as client, warnings.catch_warnings():
            # Whether the no-worker warning comes before the refusal depends on timing.
            warnings.simplefilter("ignore", NoWorkerWarning)
            pending = client.submit(inc, 1, resources={"GPU": 2})  # no worker has 2: waits
            client.session.post({"op": "submit", "tasks": [{"key": "malformed"}]})
            error = pending.exception(timeout=60)
            assert isinstance(error, SchedulerConnectionError)
            assert "refused this client's messages" in str(error)
            assert "protocol error" in str(error)
        with Client(cluster) as observer:
            closings = [
                line
                for line in observer.get_scheduler_logs()
                if f"closing client {client.id}" in line
            ]
        assert len(closings) == 1, closings
