"""Spark accepts a derived output schema as the declared schema of ``mapInArrow``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from collections.abc import Iterator
from decimal import Decimal
from typing import Annotated, Any

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql.types import StructType

from inorder.schema import (
    Precision,
    RowEncoder,
    decode_rows,
    output_schema,
    spark_ddl,
    spark_schema,
)

UTC = dt.UTC


@dataclasses.dataclass
class Part:
    name: str
    qty: int


@dataclasses.dataclass
class SparkRow:
    site: str
    count: int
    mean: float | None
    at: dt.datetime
    day: dt.date
    price: Annotated[Decimal, Precision(12, 3)]
    tags: list[str]
    attrs: dict[str, int]
    part: Part | None
    raw: bytes


ROWS = [
    SparkRow(
        "a", 1, 1.5, dt.datetime(2024, 1, 1, tzinfo=UTC), dt.date(2024, 1, 1), Decimal("1.250"),
        ["x"], {"k": 1}, Part("p", 2), b"\x01",
    ),
    SparkRow(
        "b", 2, None, dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC), dt.date(2024, 1, 2),
        Decimal("-2.000"), [], {}, None, b"",
    ),
]  # fmt: skip


def _encode_on_executor(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        pass
    # Encoded inside the Python worker, as the engine does.
    yield RowEncoder(SparkRow).encode_with_origin(ROWS, "readings", 4, [100, 101], 9)


def test_output_schema_round_trips_through_map_in_arrow(spark: Any) -> None:
    # Executors cannot import the tests package: ship this module's classes by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    try:
        schema = output_schema(SparkRow)
        struct = spark_schema(schema)
        assert struct.fieldNames() == schema.names
        assert not struct["site"].nullable and struct["mean"].nullable
        ddl = spark_ddl(schema)
        assert ddl.startswith("topic STRING NOT NULL,partition INT NOT NULL,offset BIGINT NOT NULL")
        # DDL cannot say "array/map elements never null"; everything else survives it.
        assert StructType.fromDDL(ddl).simpleString() == struct.simpleString()
        df = spark.range(1, numPartitions=1).mapInArrow(_encode_on_executor, struct)
        # collect(), not toArrow(): PySpark's toArrow() re-casts Spark's batches, and Spark
        # fills the children of a null struct with nulls, which a non-nullable child rejects.
        rows = [r.asDict(recursive=True) for r in df.collect()]
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    assert df.schema == struct
    assert [r["offset"] for r in rows] == [100, 101]
    assert [r["topic"] for r in rows] == ["readings", "readings"]
    assert [r["batch_id"] for r in rows] == [9, 9]
    # collect() gives timestamps as naive local datetimes and maps as dicts.
    fixed = [{**r, "at": r["at"].astimezone(UTC), "attrs": list(r["attrs"].items())} for r in rows]
    assert decode_rows(pa.Table.from_pylist(fixed, schema=schema), SparkRow) == ROWS
