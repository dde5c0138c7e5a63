"""A Delta table written by a pipeline run keeps per-file min/max statistics.

The Delta writer collects statistics in the task; the task's result carries its written
files to the driver, which commits them. Before this test the result dropped the statistics
and the driver's commit fell back to row counts: readers lost data skipping on offset,
partition and every column.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from tests.e2e.cli_jobs import CountRaw
from tests.e2e.test_run_fatal_errors import _produce

from inorder import KafkaSource, Pipeline
from inorder.codecs.raw import RawCodec
from inorder.sinks.delta import DeltaSink


def test_pipeline_delta_files_have_min_max_statistics(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(f"dstats-{random.randrange(10**9)}", partitions=2)
    _produce(kafka.bootstrap_servers, topic, 0, 300)
    table_path = str(tmp_path / "table")
    Pipeline(
        source=KafkaSource(
            bootstrap_servers=kafka.bootstrap_servers, topics=[topic], max_offsets_per_trigger=200
        ),
        processor=CountRaw(),
        codec=RawCodec(),
        sink=DeltaSink(table_path, partition_by=["topic"]),
        checkpoint=str(tmp_path / "ck"),
        trigger="available-now",
        spark_master="local[2]",
        progress="quiet",
    ).run()
    table = DeltaTable(table_path)
    assert len(table.to_pyarrow_table()) == 300
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert len(actions) >= 2
    for action in actions:
        assert action["num_records"] > 0
        assert action["min.offset"] is not None and action["max.offset"] is not None, action
        assert action["min.offset"] <= action["max.offset"]
        assert action["null_count.offset"] == 0, action
