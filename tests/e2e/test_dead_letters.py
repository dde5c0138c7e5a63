"""Dead letters always land somewhere durable, and rows that do not fit are never coerced.

Before: under the ``dead_letter`` policy with no dead-letter path, bad records were counted
and thrown away; a float yielded into an ``int`` field was written truncated (3.5 -> 3).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from tests.e2e.cli_jobs import Halver

from inorder import Integrity, KafkaSource, ParquetSink, Pipeline
from inorder.errors import ConfigError
from inorder.sinks.base import Sink
from inorder.sinks.parquet import read_committed


def _publish(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(20):
        value = b"not json" if i == 5 else f'{{"site": "s{i % 3}", "value": {i}}}'.encode()
        producer.produce(topic, value=value)
    producer.flush(30)


def _pipeline(kafka: Any, topic: str, tmp_path: Path, sink: Sink) -> Pipeline[Any, Any, Any]:
    return Pipeline(
        source=KafkaSource(bootstrap_servers=kafka.bootstrap_servers, topics=[topic]),
        processor=Halver(),
        integrity=Integrity.strict(on_violation="dead_letter"),
        sink=sink,
        checkpoint=str(tmp_path / "ck"),
        trigger="available-now",
        spark_master="local[2]",
        progress="quiet",
    )


def test_dead_letters_go_beside_the_output_by_default(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(f"dl-{random.randrange(10**9)}")
    _publish(kafka.bootstrap_servers, topic)
    out = tmp_path / "out"
    pipeline = _pipeline(kafka, topic, tmp_path, ParquetSink(str(out)))
    assert pipeline.dead_letter is not None
    assert pipeline.dead_letter.describe().startswith(f"Parquet dataset {out}_dead_letter")
    pipeline.run()

    rows = read_committed(str(out)).to_pylist()
    # Even values fit; odd ones (a float in an int field) and the undecodable record do not.
    assert sorted(r["offset"] for r in rows) == [i for i in range(20) if i % 2 == 0]
    assert all(isinstance(r["half"], int) and r["half"] * 2 == r["offset"] for r in rows)
    letters = read_committed(f"{out}_dead_letter").to_pylist()
    by_offset = {r["offset"]: r for r in letters}
    assert sorted(by_offset) == [i for i in range(20) if i % 2 or i == 5]
    assert by_offset[5]["rule"] == "undecodable"
    assert by_offset[3]["rule"] == "row_schema"
    assert "Half.half: float value 1.5 does not fit int" in by_offset[3]["detail"]
    assert all(r["topic"] == topic and r["partition"] == 0 for r in letters)
    # Nothing of the dead letters is inside the output's directory tree.
    assert not any("dead" in str(p.relative_to(out)) for p in out.rglob("*.parquet"))
    assert pq.read_table(next(out.rglob("*.parquet"))).num_rows > 0


class PathlessSink(ParquetSink):
    """A sink that cannot say where a dataset beside it would go."""

    def beside(self, suffix: str, partition_by: Any) -> None:
        return None


def test_no_place_for_dead_letters_refuses_to_start(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(f"dl-{random.randrange(10**9)}")
    pipeline = _pipeline(kafka, topic, tmp_path, PathlessSink(str(tmp_path / "out")))
    assert pipeline.dead_letter is None
    with pytest.raises(
        ConfigError, match=r"dead_letter policy needs a place.*\[dead_letter\] path"
    ):
        pipeline.run()
