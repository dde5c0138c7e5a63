"""The short job whose JVM writes the class archive: ``python -m inorder.pipeline.warm_up_job DIR``.

It touches the Spark machinery a local ``inorder run`` uses (a Python streaming data source
planned through Spark's Python planner processes, ``mapInArrow``, ``foreachBatch``, a
collect, a Parquet write) so their classes land in the archive; classes it misses are still
loaded from the jars as usual. Run by :func:`inorder.pipeline.class_archive.build`, which sets
where the JVM writes the archive and waits for this process (and its JVM) to end.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

_ROWS = 2000


class _Range(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end


class _CountingReader(DataSourceStreamReader):
    """Two partitions of consecutive integers, then nothing more."""

    def initialOffset(self) -> dict[str, int]:
        return {"at": 0}

    def latestOffset(self, start: Any = None, limit: Any = None) -> dict[str, int]:
        return {"at": _ROWS}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Range]:
        middle = (start["at"] + end["at"]) // 2
        return [_Range(start["at"], middle), _Range(middle, end["at"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, str]]:
        assert isinstance(partition, _Range)
        for i in range(partition.start, partition.end):
            yield i, f"row-{i}"

    def commit(self, end: dict[str, int]) -> None:
        pass


class _CountingSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "inorder-warm-up"

    def schema(self) -> str:
        return "n bigint, label string"

    def streamReader(self, schema: Any) -> _CountingReader:
        return _CountingReader()


def _double(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield pa.RecordBatch.from_arrays(
            [pa.compute.multiply(batch.column(0), 2), batch.column(1)], names=["n", "label"]
        )


def main(work: str) -> int:
    """Run the job in ``work``; 0 once the JVM has exited."""
    from inorder.pipeline.spark import build_spark_session

    spark = build_spark_session(master="local[2]", app_name="inorder-warm-up")
    spark.dataSource.register(_CountingSource)
    written: list[int] = []

    def on_batch(frame: Any, batch_id: int) -> None:
        written.append(len(frame.collect()))
        frame.write.mode("overwrite").parquet(f"{work}/parquet")

    query = (
        spark.readStream.format("inorder-warm-up")
        .load()
        .mapInArrow(_double, "n bigint, label string")
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", f"{work}/checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    # The JVM writes the archive as it exits: close the gateway and wait for that.
    gateway = spark.sparkContext._gateway
    spark.stop()
    jvm = getattr(gateway, "proc", None)
    if jvm is not None:
        jvm.stdin.close()
        jvm.wait(timeout=300)
    return 0 if sum(written) == _ROWS else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
