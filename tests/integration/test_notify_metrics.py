"""Notifications reach a local HTTP receiver; the metrics endpoint shows the run's numbers."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.test_validate import session_config, small_simulation

from inorder.assemble import build_pipeline
from inorder.dev.simulator import simulate
from inorder.ops.metrics import MetricsExporter
from inorder.ops.notify import Notifier, NotifySettings
from inorder.ops.observer import run_observed
from inorder.pipeline.progress import BatchProgress


class Receiver:
    """A local webhook: records JSON bodies; answers ``fail_first`` requests with HTTP 500."""

    def __init__(self, fail_first: int = 0) -> None:
        self.events: list[dict[str, Any]] = []
        self.requests = 0
        self.fail_first = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests += 1
                if receiver.requests <= receiver.fail_first:
                    self.send_response(500)
                    self.end_headers()
                    return
                receiver.events.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hook"

    def wait_for(self, event: str, timeout: float = 10.0, count: int = 1) -> dict[str, Any]:
        """The ``count``-th ``event`` received, once it has arrived (within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.events if e["event"] == event]
            if len(found) >= count:
                return found[count - 1]
            time.sleep(0.05)
        raise AssertionError(f"no {event!r} event (#{count}); got {self.events}")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "pipeline"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def progress(batch_id: int, records: int, **extra: Any) -> BatchProgress:
    return BatchProgress(batch_id, records, records / 2.0, 2.0, None, 10, records, 1, **extra)


def test_run_reports_violations_failure_and_metrics(
    kafka: Any, spark: Any, tmp_path: Path, receiver: Receiver
) -> None:
    prefix = f"notify-{time.time_ns()}-"
    simulate(small_simulation(prefix, seed=71, faulty=0.5), kafka.bootstrap_servers)

    # A run that survives its violations (restart_session): violation events + metrics.
    notifier = Notifier(NotifySettings(webhook_url=receiver.url, violation_threshold=1), "ops")
    metrics = MetricsExporter(port=0, pipeline="ops")
    metrics.on_start()
    config = session_config(kafka.bootstrap_servers, prefix, tmp_path / "a")
    summary = run_observed(build_pipeline(config), [notifier, metrics])
    assert summary.violations, "the faulty sessions must show up"
    reported = [e for e in receiver.events if e["event"] == "violations"]
    assert reported
    totals: dict[str, int] = {}
    for e in reported:
        for rule, n in e["violations"].items():
            totals[rule] = totals.get(rule, 0) + n
    assert totals == summary.violations
    assert metrics.port is None  # run_observed stopped the server with the run
    value = metrics.registry.get_sample_value
    assert value("inorder_records_total", {"pipeline": "ops"}) == summary.records
    assert value("inorder_batches_total", {"pipeline": "ops"}) == summary.batches
    assert value("inorder_last_committed_batch", {"pipeline": "ops"}) == summary.last_batch_id
    for rule, n in summary.violations.items():
        assert value("inorder_violations_total", {"pipeline": "ops", "rule": rule}) == n
    # Per partition: only the simulated topic's partitions, adding up to the totals by rule.
    assert summary.violations_by_partition
    summed: dict[str, int] = {}
    for partition, counts in summary.violations_by_partition.items():
        assert partition.startswith(prefix) and partition.endswith("]"), partition
        for rule, n in counts.items():
            summed[rule] = summed.get(rule, 0) + n
            labels = {"pipeline": "ops", "partition": partition, "rule": rule}
            assert value("inorder_partition_violations_total", labels) == n
    assert summed == summary.violations

    # The metrics as scraped while a run is live (numbers from the finished run above).
    live = MetricsExporter(port=0, pipeline="ops")
    live.on_start()
    try:
        assert live.port is not None and live.port > 0
        live.on_batch(
            progress(
                7,
                100,
                violations={"seq_gap": 2},
                violations_by_partition={"t[0]": {"seq_gap": 1}, "t[1]": {"seq_gap": 1}},
            ),
            {"t[0]": 5, "t[1]": 0},
        )
        live.on_batch(progress(8, 50, violations={"seq_gap": 1, "undecodable": 1}), {"t[0]": 0})
        values = scrape(live.port)
        assert values[("inorder_records_total", ())] == 150
        assert values[("inorder_violations_total", (("rule", "seq_gap"),))] == 3
        assert values[("inorder_violations_total", (("rule", "undecodable"),))] == 1
        by_tp = (("partition", "t[1]"), ("rule", "seq_gap"))
        assert values[("inorder_partition_violations_total", by_tp)] == 1
        assert values[("inorder_lag_records", (("partition", "t[0]"),))] == 0
        assert values[("inorder_lag_records", (("partition", "t[1]"),))] == 0
        assert values[("inorder_last_committed_batch", ())] == 8
        assert values[("inorder_batch_duration_seconds_count", ())] == 2
        assert values[("inorder_records_per_second", ())] == 25
        assert values[("inorder_state_keys", ())] == 10
        assert values[("inorder_up", ())] == 1
    finally:
        live.on_stop()

    # The same topics with the fail policy: the run fails, the failure is reported.
    receiver.events.clear()
    failing = session_config(kafka.bootstrap_servers, prefix, tmp_path / "b", on_violation="fail")
    failed_metrics = MetricsExporter(port=0, pipeline="ops")
    # (The runner currently lets Spark's StreamingQueryException through instead of
    # IntegrityError; either way the observers see the failure.)
    with pytest.raises(Exception) as info:
        run_observed(
            build_pipeline(failing),
            [Notifier(NotifySettings(webhook_url=receiver.url), "ops"), failed_metrics],
        )
    event = receiver.wait_for("failure")
    assert event["pipeline"] == "ops"
    assert event["error"] == str(info.value).strip().splitlines()[0]
    assert "seq_gap" in str(info.value) or "integrity" in str(info.value)
    assert failed_metrics.failures.labels("ops")._value.get() == 1


def test_stall_is_reported_once_while_lag_is_positive(receiver: Receiver) -> None:
    notifier = Notifier(
        NotifySettings(webhook_url=receiver.url, stall_after=timedelta(seconds=0.4)), "ops"
    )
    notifier.on_start()
    try:
        notifier.on_batch(progress(1, 0), {"t[0]": 0})
        time.sleep(0.8)
        assert not receiver.events, "no lag: not a stall"
        notifier.on_batch(progress(2, 0), {"t[0]": 12})
        event = receiver.wait_for("stall", timeout=5)
        assert event["lag"] == 12
        time.sleep(0.8)
        assert [e["event"] for e in receiver.events] == ["stall"]  # once per stall
        notifier.on_batch(progress(3, 5), {"t[0]": 7})  # progress re-arms it
        assert receiver.wait_for("stall", count=2)["lag"] == 7
        assert [e["event"] for e in receiver.events] == ["stall", "stall"]
    finally:
        notifier.on_stop()


def test_delivery_retries_and_never_raises(tmp_path: Path) -> None:
    flaky = Receiver(fail_first=2)
    try:
        notifier = Notifier(
            NotifySettings(webhook_url=flaky.url, retries=3, backoff_seconds=0.05), "ops"
        )
        notifier.on_failure(RuntimeError("boom\nsecond line"))
        notifier.on_stop()
        assert flaky.requests == 3
        assert [e["error"] for e in flaky.events] == ["boom"]
    finally:
        flaky.server.shutdown()

    out = tmp_path / "event.json"
    broken = Notifier(
        NotifySettings(
            webhook_url="http://127.0.0.1:9/nothing-listens",
            command=[
                sys.executable,
                "-c",
                f"import sys; open({str(out)!r}, 'wb').write(sys.stdin.buffer.read())",
            ],
            retries=1,
            backoff_seconds=0.01,
            timeout_seconds=2,
        ),
        "ops",
    )
    broken.on_batch(progress(4, 10, violations={"seq_gap": 3}), None)  # must not raise
    broken.on_stop()
    assert broken.dropped == 1 and broken.delivered == 1
    assert json.loads(out.read_text())["total"] == 3
