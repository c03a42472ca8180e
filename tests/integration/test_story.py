"""A task's story: every change of state the scheduler made to it, with its reason, for a
client (``client.story``) and over HTTP (``GET /api/v1/story/<key>``, with the token)."""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from apportion import Client, LocalCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(workers=[{"name": "a", "resources": {"GPU": 1}}], http_port=0) as cluster:
        yield cluster


def _steps(story: list[dict]) -> list[tuple[str, str]]:
    return [(change["from"], change["to"]) for change in story]


def test_a_finished_task_tells_its_changes_oldest_first_with_reasons(
    cluster: LocalCluster,
) -> None:
    with Client(cluster) as client:
        future = client.submit(sum, [1, 2], resources={"GPU": 1})
        assert future.result(timeout=30) == 3
        story = client.story(future.key)
    assert _steps(story)[-1] == ("processing", "memory")
    assert all(change["reason"] for change in story)
    times = [change["time"] for change in story]
    assert times == sorted(times) and times[0] > 0
    # Each change starts where the one before ended.
    assert all(a["to"] == b["from"] for a, b in itertools.pairwise(story))


def test_a_key_never_seen_has_an_empty_story(cluster: LocalCluster) -> None:
    with Client(cluster) as client:
        assert client.story("never-submitted") == []


def test_the_story_over_http_needs_the_token_and_equals_the_clients(
    cluster: LocalCluster,
) -> None:
    with Client(cluster) as client:
        future = client.submit(sum, [4, 5])
        assert future.result(timeout=30) == 9
        told = client.story(future.key)  # held by the client: nothing changes meanwhile
        key = urllib.parse.quote(future.key)
        url = f"http://127.0.0.1:{cluster.http_port}/api/v1/story/{key}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code in (401, 403)
        bearer = {"Authorization": f"Bearer {cluster.token}"}
        request = urllib.request.Request(url, headers=bearer)
        body = json.loads(urllib.request.urlopen(request, timeout=10).read())
    assert body["key"] == future.key
    assert body["story"] == told
