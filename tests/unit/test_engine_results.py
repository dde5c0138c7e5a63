"""The engine's boundary: typed task results, and Spark DDL derived from the Arrow schemas."""

from __future__ import annotations

import pyarrow as pa

from inorder.ddl import arrow_ddl
from inorder.engine.results import (
    RESULT_SCHEMA,
    ResultFile,
    TaskResult,
    failure_result,
    merge_results,
    result_of,
    result_row,
)
from inorder.engine.violations import ViolationEvent
from inorder.records import KAFKA_SPARK_DDL
from inorder.sinks.base import WrittenFile


def test_a_result_crosses_the_boundary_whole() -> None:
    stats = '{"numRecords": 3, "minValues": {"offset": 4}, "maxValues": {"offset": 9}}'
    event = ViolationEvent("t", 1, 7, "k", "late", "2 s behind", "dead_letter")
    result = TaskResult(
        topic="t",
        partition=1,
        first_offset=4,
        last_offset=9,
        records=6,
        output_rows=3,
        files=[ResultFile.of(WrittenFile("a/part-0.parquet", 3, 100, {"topic": "t"}, stats))],
        violations=[event],
        violation_counts={"late": 1},
        counters={"records": 6},
        timings={"apply": 0.5},
    )
    row = result_row(result)
    batch = pa.RecordBatch.from_pylist([row], schema=RESULT_SCHEMA)
    back = result_of(batch.to_pylist()[0])
    assert back == result
    assert back.written_files() == [WrittenFile("a/part-0.parquet", 3, 100, {"topic": "t"}, stats)]
    assert back.violations == [event]


def test_key_groups_merge_into_one_result_per_partition() -> None:
    a = TaskResult(topic="t", partition=0, first_offset=5, last_offset=9, records=2)
    b = TaskResult(topic="t", partition=0, first_offset=3, last_offset=8, records=3)
    bug = failure_result("t", 1, "ValueError: x")
    merged = merge_results([a, bug, b])
    assert [(r.topic, r.partition) for r in merged] == [("t", 0), ("t", 1)]
    assert (merged[0].first_offset, merged[0].last_offset, merged[0].records) == (3, 9, 5)
    assert merged[1].failed is not None and merged[1].failed.rule == "processor_error"


def test_ddl_of_arrow_schemas() -> None:
    assert arrow_ddl(RESULT_SCHEMA) == "topic string, partition bigint, result binary"
    assert KAFKA_SPARK_DDL == (
        "key binary, value binary, topic string, partition int, offset bigint, "
        "timestamp timestamp, timestampType int, headers array<struct<key: string, value: binary>>"
    )
    nested = pa.schema([("m", pa.map_(pa.string(), pa.list_(pa.decimal128(10, 2))))])
    assert arrow_ddl(nested) == "m map<string,array<decimal(10,2)>>"
