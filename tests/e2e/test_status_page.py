"""The status page in a real browser (headless Chromium through selenium) over a real run of
the session job: the numbers shown are the checkpoint's, and a batch committed by a second
run appears without a reload.

Screenshots go to the test's directory and, when ``INORDER_UI_SCREENSHOTS=DIR`` is set, there
too (``status-page.png`` is the one the documentation shows).
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from tests.fixtures.sessions_job import small_simulation
from tests.integration.test_validate import session_config

from inorder.assemble import build_pipeline, load_target
from inorder.checkpoint import CheckpointLayout
from inorder.commands.run import dump_toml
from inorder.dev.simulator import simulate
from inorder.ops.batchlog import load_batch_log
from inorder.ops.inspect import state_sizes
from inorder.pipeline.batch_history import BatchHistory
from inorder.ui.app import create_app
from inorder.ui.server import UiServer
from inorder.ui.status import StatusSource

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOKEN = "page-test-token"
#: Seconds any wait for the page may take.
WAIT = 45

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs Debian's chromium and chromium-driver",
)


def _run(config: dict[str, Any], history: BatchHistory) -> None:
    """One run to the end of the topics, its batches recorded as `inorder run` records them."""
    pipeline = build_pipeline(config)
    pipeline.observers = [*pipeline.observers, history]
    pipeline.run()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1360,2400",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    yield driver
    driver.quit()


def _shoot(driver: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    assert driver.save_screenshot(str(path)), f"no screenshot {path}"
    extra = os.environ.get("INORDER_UI_SCREENSHOTS")
    if extra:
        os.makedirs(extra, exist_ok=True)
        shutil.copy(path, os.path.join(extra, name))


def _text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    text: str = driver.find_element(By.CSS_SELECTOR, css).text
    return text


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_page_shows_the_checkpoint_and_updates_live(
    kafka: Any, spark: Any, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    prefix = f"uipage-{random.randrange(10**9)}-"
    sim = simulate(small_simulation(prefix, seed=23, faulty=0.3), kafka.bootstrap_servers)
    config = session_config(kafka.bootstrap_servers, prefix, tmp_path)
    toml = tmp_path / "pipeline.toml"
    toml.write_text(dump_toml(config))
    history = BatchHistory(CheckpointLayout.of(tmp_path / "checkpoint"))
    _run(config, history)

    target = load_target(str(toml))
    server = UiServer(create_app(StatusSource(str(toml), target), TOKEN)).start()
    try:
        browser.get(f"{server.url}/pipelines/ops?token={TOKEN}")
        # The token moved to a cookie: the address no longer holds it.
        assert browser.current_url == f"{server.url}/pipelines/ops"
        assert browser.title == "ops · inorder"

        log = load_batch_log(target.spark_dir, target.engine)
        last = log.last_committed()
        assert last is not None and len(log.batches) >= 3
        assert _number(_text(browser, "#last-batch")) == last.batch_id
        assert _number(_text(browser, "#batch-count")) == len(log.batches)
        truth = sim.ground_truth.topics
        assert {str(tp): end for tp, end in last.end.items()} == {
            f"{t}[{p}]": o for t, tt in truth.items() for p, o in tt.end_offsets.items()
        }
        for tp, end in last.end.items():
            row = f'tr[data-tp="{tp}"]'
            assert _number(_text(browser, f'{row} [data-field="committed"]')) == end
            # The broker is reachable: its end offset is shown, and everything was read.
            assert _number(_text(browser, f'{row} [data-field="end"]')) == end
            assert _number(_text(browser, f'{row} [data-field="lag"]')) == 0
        sizes = state_sizes(target, log)
        assert sizes
        for s in sizes:
            keys = _text(browser, f'tr[data-tp="{s.topic}[{s.partition}]"] [data-field="keys"]')
            assert _number(keys) == s.keys
        assert _number(_text(browser, "#state-keys")) == sum(s.keys for s in sizes)
        recorded = sum(sum(line["violations"].values()) for line in history.recent)
        assert recorded > 0, "the faulty sessions broke no rule"
        assert _number(_text(browser, "#event-count")) == recorded
        assert "inorder replay" in browser.page_source
        assert _text(browser, "#run-state") == "stopped"
        _shoot(browser, tmp_path, "status-page.png")

        # A marker only this page load holds: it survives the live update, a reload drops it.
        browser.execute_script("window.inorderMarker = 'same page';")
        updates = int(browser.find_element("id", "live").get_attribute("data-updates"))
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
        topic = sorted(truth)[0]
        for i in range(5):
            producer.produce(topic, b"{not json", key=f"late-{i}".encode(), partition=0)
        assert producer.flush(WAIT) == 0
        _run(config, history)
        log = load_batch_log(target.spark_dir, target.engine)
        newest = log.last_committed()
        assert newest is not None and newest.batch_id > last.batch_id

        def shows_new_batch(driver: Any) -> bool:
            live = driver.find_element("id", "live")
            return (
                int(live.get_attribute("data-updates")) > updates
                and _number(_text(driver, "#last-batch")) == newest.batch_id
            )

        WebDriverWait(browser, WAIT, poll_frequency=0.5).until(shows_new_batch)
        assert browser.execute_script("return window.inorderMarker") == "same page"
        tp0 = f'tr[data-tp="{topic}[0]"] [data-field="committed"]'
        newest_end = {str(t): e for t, e in newest.end.items()}[f"{topic}[0]"]
        assert _number(_text(browser, tp0)) == newest_end
        # The broker is asked again once a new batch committed: its end is not stale.
        tp0_end = f'tr[data-tp="{topic}[0]"] [data-field="end"]'
        assert _number(_text(browser, tp0_end)) == newest_end
        assert _number(_text(browser, "#batch-count")) == len(log.batches)
        _shoot(browser, tmp_path, "status-page-updated.png")
    finally:
        server.stop()
