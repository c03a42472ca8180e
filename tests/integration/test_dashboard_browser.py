"""The dashboard in a real browser: Debian's chromium, driven by its chromedriver.

Loads the page from ``client.dashboard_link`` while GPU tasks run, checks what it
shows as the server pushes updates, and saves a screenshot
(``APPORTION_DASHBOARD_SCREENSHOT`` names where; the README's is made this way).
``tests/system-deps/chromium.sh`` installs the browser.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apportion import Client, LocalCluster
from tests.conftest import wait_until
from tests.integration.tasks import wait_for_file

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs chromium and chromedriver: bash tests/system-deps/chromium.sh",
)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def train(path: str, step: int) -> int:
    import json

    from apportion import get_worker

    task = get_worker().task
    assert task is not None
    # What the worker granted, for the test to compare with the page.
    with open(f"{path}.units-{task.key}", "w") as f:
        json.dump(task.units, f)
    return wait_for_file(path) and step


def nap(seconds: float) -> float:
    import time

    time.sleep(seconds)
    return seconds


def text_of(browser: Any, css: str) -> str:
    """The text of the first element matching ``css`` ("" if none), read in one script
    call: the page replaces its sections as updates arrive, between any two calls."""
    return str(
        browser.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css
        )
    )


def titles_of(browser: Any, css: str) -> list[str]:
    """The titles of every element matching ``css``, read at one moment."""
    return list(
        browser.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.title);", css
        )
    )


def test_dashboard_shows_gpus_in_use_on_the_right_worker(browser: Any, tmp_path: Path) -> None:
    workers = [
        {"name": "gpu-a", "nthreads": 4, "resources": {"GPU": 2}},
        {"name": "cpu", "nthreads": 2, "resources": {}},
    ]
    gate = str(tmp_path / "go")
    with LocalCluster(workers=workers, http_port=0) as cluster, Client(cluster) as client:
        browser.get(client.dashboard_link)
        assert browser.current_url.endswith("/dashboard")  # signed in; the token is gone
        gpu = '[data-worker="gpu-a"] [data-resource="GPU"]'
        assert "0/2 in use" in text_of(browser, f"{gpu} .usage")

        # Two GPU tasks run on gpu-a, one waits for a GPU, one needs more than any worker.
        running = [
            client.submit(train, gate, step, resources={"GPU": 1}, key=f"train-{step}")
            for step in range(3)
        ]
        impossible = client.submit(train, gate, 99, resources={"GPU": 8}, key="train-huge")
        done = client.map(pow, range(20), [2] * 20)
        client.gather(done)
        naps = client.map(nap, [0.05 * (i % 5 + 1) for i in range(12)], key="preprocess")
        client.gather(naps)

        # Pushed by the server, without reloading the page.
        wait_until(
            lambda: "2/2 in use" in text_of(browser, f"{gpu} .usage"), what="GPU 2/2 on gpu-a"
        )
        holders = sorted(titles_of(browser, f"{gpu} .unit.busy"))
        assert holders in (["train-0", "train-1"], ["train-0", "train-2"], ["train-1", "train-2"])
        # Each on the unit number the worker granted it, once its heartbeat told.
        granted = {
            json.loads(Path(f"{gate}.units-{key}").read_text())["GPU"][0]: key for key in holders
        }
        for number, key in granted.items():
            wait_until(
                lambda n=number, k=key: text_of(browser, f'{gpu} [data-unit="{n}"]') == f"#{n} {k}",
                what=f"GPU #{number} shown held by {key}",
            )
        cpu = text_of(browser, '[data-worker="cpu"]')
        assert "cpu" in cpu and "no declared resources" in cpu and "GPU" not in cpu
        wait_until(lambda: "GPU=8" in text_of(browser, "#waiting"), what="the no-worker demand")
        waiting = text_of(browser, "#waiting")
        assert "GPU=1" in waiting and "queued" in waiting
        assert "no live worker has GPU=8" in waiting
        wait_until(lambda: "20" in text_of(browser, '[data-prefix="pow"]'), what="pow's progress")
        events = text_of(browser, "#events")
        assert "gpu-a" in events and "joined" in events
        screenshot = os.environ.get("APPORTION_DASHBOARD_SCREENSHOT") or str(
            tmp_path / "dashboard.png"
        )
        assert browser.save_screenshot(screenshot)
        assert Path(screenshot).stat().st_size > 10_000

        Path(gate).touch()
        client.gather(running)
        wait_until(lambda: "0/2 in use" in text_of(browser, f"{gpu} .usage"), what="GPUs released")
        wait_until(
            lambda: "GPU #" in text_of(browser, "#stream"), what="unit numbers in the task stream"
        )
        client.cancel([impossible])
        assert client.check_invariants() == []


def test_dashboard_without_the_token_shows_the_login_form(browser: Any) -> None:
    with LocalCluster(n_workers=1, http_port=0) as cluster:
        browser.get(f"http://127.0.0.1:{cluster.http_port}/dashboard")
        assert "Enter the cluster's token" in browser.page_source
        field = browser.find_element("css selector", "input[name=token]")
        field.send_keys(cluster.token)
        field.submit()
        wait_until(lambda: 'data-worker="' in browser.page_source, what="the dashboard after login")
