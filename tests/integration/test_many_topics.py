"""The operations tools over a real run of many topics (one partition each) on the local
broker: ``inspect``, ``validate``, ``repair``'s plan and the status page summarise (few,
short lines; a page of bounded size), their JSON stays complete, and partitions that are
behind are named on the page, not lost among a thousand rows.

One simulation and one run serve the whole module (the topics are created once). 150 topics
cross every threshold at which an output starts to summarise (10 and 20 lines, 50 rows a page,
100 partitions' state opened by the page); tests/unit/test_many_topics_outputs.py checks the
same outputs at 1,000 and 4,000 topic-partitions without a broker.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from tests.e2e.test_status_page import (  # noqa: F401 (the browser fixture)
    CHROMEDRIVER,
    CHROMIUM,
    WAIT,
    browser,
)
from tests.fixtures.sessions_job import TWO_LOCAL_CORES, sessions_config
from tests.integration.test_validate import cli

from inorder.assemble import build_pipeline, load_target
from inorder.commands.run import dump_toml
from inorder.dev.sim_config import SimulationConfig
from inorder.dev.sim_model import FaultRates
from inorder.dev.simulator import simulate

TOPICS = 150
#: ``150 topics, 150 partitions``: how the outputs count them.
COUNTED = f"{TOPICS:,} topics, {TOPICS:,} partitions"
#: Rows a page of the status page shows.
PAGE = 50
#: The longest line a summarised output may print.
LINE = 400


@dataclass
class ManyTopics:
    toml: Path
    prefix: str
    topics: list[str]


@pytest.fixture(scope="module")
def many(kafka: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> ManyTopics:
    work = tmp_path_factory.mktemp("many-topics")
    prefix = f"many{random.randrange(10**9)}-"
    config = SimulationConfig(
        sites=TOPICS, topic_prefix=prefix, partitions=1, sessions_per_site=2,
        rows_per_snapshot=3, messages=TOPICS * 5, seed=5, faults=FaultRates(),
        faulty_sessions=0.0,
    )  # fmt: skip
    sim = simulate(config, kafka.bootstrap_servers)
    topics = sorted(sim.ground_truth.topics)
    assert len(topics) == TOPICS
    # Two batches, so each batch line summarises its own ranges.
    pipeline = sessions_config(
        kafka.bootstrap_servers, prefix, work, name="many", max_offsets=TOPICS * 3,
        spark=TWO_LOCAL_CORES,
    )  # fmt: skip
    build_pipeline(pipeline).run()
    toml = work / "pipeline.toml"
    toml.write_text(dump_toml(pipeline))
    return ManyTopics(toml, prefix, topics)


def bounded(text: str, most: int) -> list[str]:
    lines = text.splitlines()
    assert 0 < len(lines) <= most, len(lines)
    assert max(len(line) for line in lines) <= LINE, max(lines, key=len)
    return lines


def test_inspect_summarises_and_its_json_and_all_stay_complete(many: ManyTopics) -> None:
    done = cli("inspect", str(many.toml), timeout=600)
    assert done.returncode == 0, done.stderr
    lines = bounded(done.stdout, 10)
    batches = [line for line in lines if line.startswith("batch ")]
    assert len(batches) >= 2
    assert all(COUNTED in line for line in batches)
    state = next(line for line in lines if line.startswith(f"state: {TOPICS:,} topics"))
    assert f"keys and state bytes not loaded at {TOPICS:,} partitions" in state

    done = cli("inspect", str(many.toml), "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert len(doc["state"]) == TOPICS and all(s["loaded"] for s in doc["state"])
    assert sum(s["keys"] for s in doc["state"]) > 0
    assert all(len(b["ranges"]) == TOPICS for b in doc["batches"])

    done = cli("inspect", str(many.toml), "--state", "--all", timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(1 for line in lines if line.startswith(f"state {many.prefix}")) == TOPICS

    one = many.topics[7]
    done = cli("inspect", str(many.toml), "--state", "--topic", one, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"state {one}[0] version ")
    assert " keys (" in lines[1]  # loaded: its keys are counted


def test_validate_and_repair_summarise_many_partitions(many: ManyTopics) -> None:
    from inorder.ops.repair import plan_repair
    from inorder.ops.validate import validate

    target = load_target(str(many.toml))
    report = validate(target)
    lines = bounded("\n".join(report.lines()), 3)
    assert lines[0].startswith(f"OK    {COUNTED}: ")
    assert lines[-1] == f"{TOPICS} partition(s) checked, no discrepancy"
    assert len(report.to_json()["partitions"]) == TOPICS
    assert len(report.lines(full=True)) == TOPICS + 1

    plan = plan_repair(target)
    lines = bounded("\n".join(plan.lines()), 8)
    assert f"{COUNTED}: failure point: end of batch" in lines[1]
    assert len(plan.to_json()["partitions"]) == TOPICS
    assert len(plan.lines(full=True)) >= TOPICS + 3


def test_status_page_paginates_and_names_the_topics_behind(kafka: Any, many: ManyTopics) -> None:
    from inorder.ui.page import render_live, render_page
    from inorder.ui.status import StatusSource

    # Three topics get records the run has not read: they are behind.
    behind = [many.topics[3], many.topics[TOPICS // 2], many.topics[TOPICS - 2]]
    producer = Producer(kafka.producer_config())
    for n, topic in enumerate(behind):
        for _ in range(n + 1):
            producer.produce(topic, b"{}", key=b"k")
    assert producer.flush(30) == 0

    source = StatusSource(str(many.toml), load_target(str(many.toml)))
    doc = source.status()
    assert len(doc["partitions"]) == TOPICS and len(doc["state"]) == TOPICS
    lags = {p["topic"]: p["lag"] for p in doc["partitions"] if p["lag"]}
    assert lags == {behind[0]: 1, behind[1]: 2, behind[2]: 3}
    html = render_page(doc, "/live", 3000)
    assert len(html) < 150_000, len(html)
    assert html.count("<tr data-tp=") == PAGE
    assert COUNTED in html
    assert f"3 behind (6 records): {behind[2]}[0] (3), {behind[1]}[0] (2), {behind[0]}[0] (1)" in (
        html
    )
    pages = -(-TOPICS // PAGE)
    last = render_live(doc, pages)
    assert f"page {pages} of {pages}" in last and f'data-tp="{many.topics[-1]}[0]"' in last
    assert "3 behind (6 records)" in last


@pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs Debian's chromium and chromium-driver",
)
def test_status_page_in_a_browser_pages_and_keeps_its_page_live(
    many: ManyTopics,
    browser: Any,  # noqa: F811
) -> None:
    """The page's "next" link shows rows 51-100, and the live update that follows keeps
    them (it fetches the same page), in a real browser."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from inorder.ui.app import create_app
    from inorder.ui.server import UiServer
    from inorder.ui.status import StatusSource

    source = StatusSource(str(many.toml), load_target(str(many.toml)))
    server = UiServer(create_app(source)).start()
    try:
        browser.get(f"{server.url}/pipelines/many")
        rows = browser.find_elements(By.CSS_SELECTOR, "tr[data-tp]")
        assert len(rows) == PAGE and rows[0].get_attribute("data-tp") == f"{many.topics[0]}[0]"
        browser.find_element(By.CSS_SELECTOR, 'a[data-page="2"]').click()
        WebDriverWait(browser, WAIT, poll_frequency=0.5).until(
            lambda d: d.current_url.endswith("?page=2")
        )
        live = browser.find_element(By.ID, "live")
        updates = int(live.get_attribute("data-updates"))
        WebDriverWait(browser, WAIT, poll_frequency=0.5).until(
            lambda d: int(d.find_element(By.ID, "live").get_attribute("data-updates")) > updates
        )
        rows = browser.find_elements(By.CSS_SELECTOR, "tr[data-tp]")
        assert len(rows) == PAGE
        assert rows[0].get_attribute("data-tp") == f"{many.topics[PAGE]}[0]"
        assert (
            f"page 2 of {-(-TOPICS // PAGE)}"
            in browser.find_element(By.CSS_SELECTOR, "[data-field=pages]").text
        )
        assert len(browser.page_source) < 200_000
    finally:
        server.stop()
