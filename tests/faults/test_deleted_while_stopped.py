"""A topic deleted while the query is stopped, with records it had not read yet.

Kafka keeps no trace of a deleted topic: the restarted planner only sees its partitions gone.
The ends the previous run saw while a backlog remained (``inorder.highWatermarksFile``) are
what turns that into a counted loss (``failOnDataLoss=false``: in ``lostRecords``, so the run
exits with the set-aside code) or the named error, instead of a silent prune. The planner runs
here as Spark drives it, against the real broker, without a Spark session: the loss is decided
entirely on the driver.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from pyspark.sql.streaming.datasource import ReadMaxRows

from inorder.errors import DataLossError
from inorder.kafka.high_marks import load_high_marks
from inorder.kafka.offsets import SourceOffset
from inorder.kafka.options import parse_options
from inorder.kafka.source import KafkaStreamReader
from inorder.records import TopicPartition

RECORDS, FIRST_BATCH = 100, 10


def _options(bootstrap: str, pattern: str, highs: Path | None, strict: bool) -> Any:
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribePattern": pattern,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": str(FIRST_BATCH),
        "failOnDataLoss": str(strict).lower(),
    }
    if highs is not None:
        options["inorder.highWatermarksFile"] = str(highs)
    return parse_options(options)


def _first_plan(bootstrap: str, pattern: str, highs: Path | None) -> dict[str, Any]:
    """The first run plans one capped batch (10 of 100 records) and stops."""
    reader = KafkaStreamReader(_options(bootstrap, pattern, highs, strict=True))
    end = reader.latestOffset(reader.initialOffset(), ReadMaxRows(FIRST_BATCH))
    assert sum(SourceOffset.from_dict(end).positions.values()) == FIRST_BATCH
    return end


def _restart(
    bootstrap: str, pattern: str, highs: Path | None, committed: dict[str, Any], strict: bool
) -> SourceOffset:
    reader = KafkaStreamReader(_options(bootstrap, pattern, highs, strict))
    return SourceOffset.from_dict(reader.latestOffset(committed, ReadMaxRows(FIRST_BATCH)))


def test_unread_records_of_a_topic_deleted_while_stopped_are_counted(
    kafka: Any, tmp_path: Path, matrix: Any
) -> None:
    bootstrap = kafka.bootstrap_servers
    prefix = f"gone-{uuid.uuid4().hex[:8]}-"
    topic = kafka.new_topic(prefix + "a")
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(RECORDS):
        producer.produce(topic, value=str(i).encode())
    assert producer.flush(30) == 0
    pattern = f"{prefix}.*"
    highs = tmp_path / "highs.json"
    committed = _first_plan(bootstrap, pattern, highs)
    assert load_high_marks(str(highs)) == {TopicPartition(topic, 0): RECORDS}
    blind = _first_plan(bootstrap, pattern, None)  # the same run, without the file

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)

    with pytest.raises(DataLossError) as refused:
        _restart(bootstrap, pattern, highs, committed, strict=True)
    line = str(refused.value)
    assert f"topic {topic!r} partition 0" in line and "deleted" in line, line
    assert f"{FIRST_BATCH}" in line and f"{RECORDS}" in line, line

    skipped = _restart(bootstrap, pattern, highs, committed, strict=False)
    counted = skipped.lost_records
    assert counted == RECORDS - FIRST_BATCH and skipped.pruned_partitions == 1, skipped
    # Without the file the restart cannot know: it prunes the topic and counts nothing.
    unknown = _restart(bootstrap, pattern, None, blind, strict=False)
    assert unknown.lost_records == 0 and unknown.pruned_partitions == 1, unknown
    fault = "topic deleted while the query is stopped, records unread"
    matrix.record(
        group="bad input", fault=f"{fault} (strict)", times=1, outcome="named error",
        check=line, ok=True,
    )  # fmt: skip
    matrix.record(
        group="bad input", fault=f"{fault} (fail_on_data_loss = false)", times=1,
        outcome="policy action",
        check=f"{counted} of {RECORDS - FIRST_BATCH} unread offsets counted lost "
        "(lostRecords; exit 3 in inorder run), the topic's partition dropped from the plan",
        ok=counted == RECORDS - FIRST_BATCH,
    )  # fmt: skip
