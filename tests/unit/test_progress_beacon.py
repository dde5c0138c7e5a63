"""Tasks' running counts reach the driver over loopback UDP, and the status line shows them."""

from __future__ import annotations

import json
import time

import pytest

from inorder.engine import beacon
from inorder.engine.beacon import ProgressBeacon
from inorder.pipeline.live_progress import LiveProgress
from inorder.pipeline.progress import RunningBatch, format_running
from inorder.records import TopicPartition


def wait_for(receiver: LiveProgress, batch_id: int, expected: int) -> int | None:
    """The batch's count once it reaches ``expected`` (datagrams are asynchronous)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if receiver.applied(batch_id) == expected:
            break
        time.sleep(0.01)
    return receiver.applied(batch_id)


def test_counts_from_several_tasks_add_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(beacon, "INTERVAL", 0.0)  # every add is sent
    receiver = LiveProgress()
    try:
        assert receiver.applied(3) is None
        first = ProgressBeacon(receiver.address, 3)
        second = ProgressBeacon(receiver.address, 3)
        first.add(TopicPartition("site-a", 0), 100)
        first.add(TopicPartition("site-a", 0), 50)
        second.add(TopicPartition("site-b", 1), 7)
        assert wait_for(receiver, 3, 157) == 157
        first.close()
        second.close()
        receiver.forget(3)
        assert receiver.applied(3) is None
    finally:
        receiver.close()


def test_totals_survive_a_lost_or_late_datagram() -> None:
    receiver = LiveProgress()
    try:
        # Totals, not increments: an older total arriving late changes nothing.
        receiver._record(json.dumps({"batch": 1, "applied": [["t", 0, 500]]}).encode())
        receiver._record(json.dumps({"batch": 1, "applied": [["t", 0, 200]]}).encode())
        receiver._record(b"not json")
        receiver._record(json.dumps({"batch": 1, "applied": [["t", 1, 5]]}).encode())
        assert receiver.applied(1) == 505
    finally:
        receiver.close()


def test_a_beacon_without_an_address_sends_nothing() -> None:
    quiet = ProgressBeacon(None, 0)
    quiet.add(TopicPartition("t", 0), 10)
    quiet.close()


def test_many_partitions_are_split_into_datagrams_that_fit() -> None:
    counts: list[list[object]] = [[f"site-{i:05d}", 3, 123_456] for i in range(5_000)]
    datagrams = beacon._datagrams(9, counts)
    assert len(datagrams) > 1
    assert all(len(d) <= beacon._MAX_DATAGRAM for d in datagrams)
    merged = [row for d in datagrams for row in json.loads(d)["applied"]]
    assert merged == counts


def test_the_status_line_shows_applied_rate_and_time_left() -> None:
    line = format_running(RunningBatch(4, 10.0, 0, 2, 690_000, applied_records=120_000))
    assert line == (
        "batch 4 running for 10 s, tasks 0/2, 120,000 of 690,000 records applied "
        "(12,000/s, about 48 s left)"
    )
    tables = format_running(RunningBatch(4, 70.0, 2, 2, 690_000, 690_000, phase="tables"))
    assert tables == (
        "batch 4 running for 70 s: writing the session tables, 690,000 records applied"
    )
    # Before any task reported: what is planned, as before.
    assert format_running(RunningBatch(4, 1.0, 0, 2, 690_000)).endswith("690,000 records planned")
