"""The status page's numbers in a real browser (headless Chromium) for a Parquet, a Delta and
an Iceberg output: the output's kind, rows and files are the sink's own, every committed
batch shows its rows, records/s are the batches' records over the time they ran, and the
batch in flight shows as running (not as a red "not committed") until it commits.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from tests.e2e.test_status_page import WAIT, _number, _shoot, _text, browser

from inorder.assemble import build_pipeline, load_target
from inorder.checkpoint import CheckpointLayout
from inorder.commands.run import dump_toml
from inorder.pipeline.batch_history import read_history
from inorder.pipeline.config import validate
from inorder.pipeline.progress import QuietReporter
from inorder.pipeline.runner import PipelineRunner
from inorder.ui.app import create_app
from inorder.ui.server import UiServer
from inorder.ui.status import StatusSource

__all__ = ["browser"]  # the module's fixture: one Chromium for these tests

TOKEN = "sinks-page-token"
#: Records per batch, and batches of the first run.
PER_BATCH, BATCHES = 100, 3

SINKS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "parquet": lambda work: {"path": str(work / "out")},
    "delta": lambda work: {"type": "delta", "path": str(work / "out")},
    "iceberg": lambda work: {
        "type": "iceberg",
        "path": str(work / "warehouse"),
        "table": "db.counts",
        "catalog_file": str(work / "catalog.db"),
    },
}


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, value in enumerate(values):
        producer.produce(topic, value, key=f"k{i % 7}".encode())
    assert producer.flush(WAIT) == 0


def _run(config: dict[str, Any]) -> None:
    PipelineRunner(build_pipeline(config), reporter=QuietReporter()).run()


def _wait_for(path: Path, run: threading.Thread) -> None:
    """Until ``path`` exists (the gated batch is running), failing if the run ended first."""
    deadline = time.monotonic() + 300
    while not path.exists():
        assert run.is_alive(), "the run ended before its gated batch started"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _batch(driver: Any, batch_id: int, field: str) -> str:
    return _text(driver, f'tr[data-batch="{batch_id}"] [data-field="{field}"]')


@pytest.mark.parametrize("kind", sorted(SINKS))
def test_page_numbers_are_the_sinks_own(
    kind: str, kafka: Any, spark: Any, browser: Any, tmp_path: Path
) -> None:
    if kind == "iceberg":
        pytest.importorskip("pyiceberg")
    from selenium.webdriver.support.ui import WebDriverWait

    name = f"page-{kind}"
    topic = kafka.new_topic(f"page-{kind}-{random.randrange(10**9)}")
    _produce(kafka.bootstrap_servers, topic, [b"r"] * (PER_BATCH * BATCHES))
    waiting, opened = tmp_path / "waiting", tmp_path / "opened"
    config = validate(
        {
            "pipeline": {
                "name": name,
                "checkpoint": str(tmp_path / "ck"),
                "trigger": "available-now",
                "progress": "quiet",
            },
            "source": {
                "bootstrap_servers": kafka.bootstrap_servers,
                "topics": [topic],
                "max_offsets_per_trigger": PER_BATCH,
            },
            "codec": {"type": "raw"},
            "processor": {
                "type": "tests.e2e.cli_jobs:GatedCountRaw",
                "options": {"waiting": str(waiting), "opened": str(opened)},
            },
            "sink": SINKS[kind](tmp_path),
            "spark": {"master": "local[1]"},
        }
    )
    toml = tmp_path / "pipeline.toml"
    toml.write_text(dump_toml(config))
    _run(config)

    source = StatusSource(str(toml), load_target(str(toml)))
    server = UiServer(create_app(source, TOKEN)).start()
    run: threading.Thread | None = None
    try:
        browser.get(f"{server.url}/pipelines/{name}?token={TOKEN}")
        assert _text(browser, "#out-kind") == kind
        # One output row per record: every row and file of the output is counted.
        assert _number(_text(browser, "#output-rows")) == PER_BATCH * BATCHES
        doc = source.status()
        assert doc["output"]["kind"] == kind and not doc["output"]["note"], doc["output"]
        assert _number(_text(browser, "#output-files")) == doc["output"]["files"] >= BATCHES
        for batch_id in range(BATCHES):
            assert _batch(browser, batch_id, "state") == "committed"
            assert _number(_batch(browser, batch_id, "output-rows")) == PER_BATCH
        # records/s: the records over the time the batches ran (as their runs measured it).
        recorded = read_history(CheckpointLayout.of(tmp_path / "ck"))
        ran = sum(round(recorded[b]["duration_seconds"], 3) for b in range(BATCHES))
        rate = float(_text(browser, "#total-rate").replace(",", ""))
        assert rate == round(PER_BATCH * BATCHES / ran, 1)
        assert _number(_text(browser, "#total-lag")) == 0
        _shoot(browser, tmp_path, f"status-page-{kind}.png")

        # A batch held in flight: shown running (the run holds the checkpoint), its output
        # not counted yet.
        _produce(kafka.bootstrap_servers, topic, [b"gate", *[b"r"] * 20])
        run = threading.Thread(target=_run, args=(config,), daemon=True)
        run.start()
        _wait_for(waiting, run)

        def shows_running(driver: Any) -> bool:
            try:
                return _batch(driver, BATCHES, "state") == "running"
            except Exception:  # the live part is being swapped in
                return False

        WebDriverWait(browser, WAIT, poll_frequency=0.5).until(shows_running)
        row = f'tr[data-tp="{topic}[0]"]'

        def shows_backlog(driver: Any) -> bool:
            # The broker is asked again within seconds: the records in flight are lag.
            try:
                end = _number(_text(driver, f'{row} [data-field="end"]'))
                return end == PER_BATCH * BATCHES + 21
            except Exception:
                return False

        WebDriverWait(browser, WAIT, poll_frequency=0.5).until(shows_backlog)
        assert _number(_text(browser, f'{row} [data-field="lag"]')) == 21
        assert _text(browser, "#run-state") == "running"
        assert "not committed" not in browser.page_source
        cell = f'tr[data-batch="{BATCHES}"] [data-field="state"]'
        assert browser.find_element("css selector", cell).get_attribute("class") == "running"
        assert _batch(browser, BATCHES, "output-rows") == "\N{EN DASH}"
        _shoot(browser, tmp_path, f"status-page-{kind}-running.png")

        opened.touch()
        run.join(300)
        assert not run.is_alive()

        def shows_committed(driver: Any) -> bool:
            # Both: an update fetched between Spark's commit and the run's end shows the
            # batch committed while the run still holds the checkpoint.
            try:
                return (
                    _batch(driver, BATCHES, "state") == "committed"
                    and _text(driver, "#run-state") == "stopped"
                )
            except Exception:
                return False

        WebDriverWait(browser, WAIT, poll_frequency=0.5).until(shows_committed)
        assert _number(_batch(browser, BATCHES, "output-rows")) == 21
        assert _number(_text(browser, "#output-rows")) == PER_BATCH * BATCHES + 21
    finally:
        opened.touch()
        if run is not None:
            run.join(300)
        server.stop()
