"""A pipeline whose Parquet or Delta sink compacts: merges run in the sink's thread beside
the stream, fenced by the run's lease, and are finished before ``run()`` returns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from deltalake import DeltaTable
from tests.e2e.cli_jobs import CountReadings

from inorder import DeltaSink, KafkaSource, ParquetSink, Pipeline, RunSummary
from inorder.sinks.delta_compaction import live_files
from inorder.sinks.parquet import committed_files, read_committed

RECORDS, PER_BATCH = 60, 10


def run_compacting(kafka: Any, tmp_path: Path, sink: Any) -> RunSummary:
    """Produce ``RECORDS`` readings and run them through ``sink`` in small batches."""
    topic = kafka.new_topic()
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(RECORDS):
        producer.produce(topic, value=json.dumps({"site": f"s{i % 3}", "value": i}).encode())
    assert producer.flush(30) == 0
    summary = Pipeline(
        source=KafkaSource(
            bootstrap_servers=kafka.bootstrap_servers,
            topics=[topic],
            max_offsets_per_trigger=PER_BATCH,
        ),
        processor=CountReadings(),
        sink=sink,
        checkpoint=str(tmp_path / "ck"),
        trigger="available-now",
        spark_master="local[2]",
        progress="quiet",
    ).run()
    assert summary.batches >= RECORDS // PER_BATCH, summary
    return summary


def test_merges_run_beside_the_batches_and_finish_with_the_run(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    out = str(tmp_path / "out")
    sink = ParquetSink(out, compact=True, compaction_fanout=2, compaction_levels=2,
                       compaction_grace_seconds=0)  # fmt: skip
    summary = run_compacting(kafka, tmp_path, sink)
    # Every batch's rows once, and the merges committed before the run returned.
    rows = read_committed(out)
    assert sorted(rows.column("offset").to_pylist()) == list(range(RECORDS))
    levels = sorted(f.level for f in committed_files(out))
    assert levels and max(levels) >= 1 and len(levels) < summary.batches, levels
    work = sink.compactor.work
    assert work is not None and work.rounds >= 1 and work.last_error is None


def test_a_delta_sink_merges_beside_the_batches_too(kafka: Any, spark: Any, tmp_path: Path) -> None:
    out = str(tmp_path / "table")
    sink = DeltaSink(out, compact=True, compaction_fanout=2, compaction_levels=2)
    summary = run_compacting(kafka, tmp_path, sink)
    rows = DeltaTable(out).to_pyarrow_table()
    assert sorted(rows.column("offset").to_pylist()) == list(range(RECORDS))
    levels = sorted(f.level for f in live_files(DeltaTable(out)))
    assert levels and max(levels) >= 1 and len(levels) < summary.batches, levels
    work = sink.compactor.work
    assert work is not None and work.rounds >= 1 and work.last_error is None
