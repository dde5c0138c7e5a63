"""The committed output of a pipeline, read partition by partition and offset range by range.

Parquet datasets are read through the sink's committed view (the files named by done
manifests, after compactions; never a directory listing), Delta and Iceberg tables at their
current version. Reads are filtered on ``topic``, ``partition`` and an ``offset`` range, so Parquet
row-group statistics keep each read small, and sorted by offset.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from inorder.errors import InorderError
from inorder.records import TopicPartition
from inorder.sinks.base import Sink, stored


def sink_kind(sink: Sink) -> str:
    """``"parquet"``, ``"delta"`` or ``"iceberg"`` (other sinks cannot be read back)."""
    from inorder.sinks.delta import DeltaSink
    from inorder.sinks.iceberg import IcebergSink
    from inorder.sinks.parquet import ParquetSink

    if isinstance(sink, DeltaSink):
        return "delta"
    if isinstance(sink, IcebergSink):
        return "iceberg"
    if isinstance(sink, ParquetSink):
        return "parquet"
    raise InorderError(
        f"{sink.describe()}: only Parquet, Delta and Iceberg outputs can be read back"
    )


class OutputView:
    """A consistent read-only view of a sink's committed rows (taken at construction)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.kind = sink_kind(sink)
        self._dataset: ds.Dataset | None = self._open()

    def _open(self) -> ds.Dataset | None:
        if self.kind == "iceberg":
            from inorder.sinks.iceberg import IcebergSink

            assert isinstance(self.sink, IcebergSink)
            return self.sink.dataset()
        if self.kind == "delta":
            from deltalake import DeltaTable
            from deltalake.exceptions import TableNotFoundError

            loc = stored(self.sink).location
            try:
                table = DeltaTable(loc.delta_uri(), storage_options=loc.storage_options())
            except TableNotFoundError:
                return None
            from inorder.sinks.delta_read import partition_pruned_dataset

            return partition_pruned_dataset(table, loc)
        from inorder.sinks.parquet import load_state
        from inorder.sinks.parquet_read import committed_dataset

        loc = stored(self.sink).location
        return committed_dataset(loc, load_state(loc))

    @property
    def empty(self) -> bool:
        """Whether nothing is committed."""
        return self._dataset is None

    @property
    def schema(self) -> pa.Schema | None:
        """The output schema (``None`` when nothing is committed)."""
        return None if self._dataset is None else self._dataset.schema

    def _filter(self, tp: TopicPartition, start: int | None, end: int | None) -> Any:
        expr = (ds.field("topic") == tp.topic) & (ds.field("partition") == tp.partition)
        if start is not None:
            expr = expr & (ds.field("offset") >= start)
        if end is not None:
            expr = expr & (ds.field("offset") < end)
        return expr

    def read(
        self,
        tp: TopicPartition,
        start: int | None = None,
        end: int | None = None,
        columns: list[str] | None = None,
    ) -> pa.Table:
        """Rows of ``tp`` with ``start <= offset < end``, sorted by offset (stable)."""
        if self._dataset is None:
            return pa.table({})
        table = self._dataset.to_table(filter=self._filter(tp, start, end), columns=columns)
        if table.num_rows == 0:
            return table
        return table.sort_by([("offset", "ascending")])

    def count(self, tp: TopicPartition, start: int | None = None, end: int | None = None) -> int:
        """Number of rows of ``tp`` in the offset range."""
        if self._dataset is None:
            return 0
        return int(self._dataset.count_rows(filter=self._filter(tp, start, end)))

    def partitions(self) -> dict[TopicPartition, tuple[int, int, int]]:
        """Per topic-partition in the output: ``(rows, min offset, max offset)``."""
        if self._dataset is None:
            return {}
        out: dict[TopicPartition, tuple[int, int, int]] = {}
        for batch in self._dataset.to_batches(columns=["topic", "partition", "offset"]):
            if batch.num_rows == 0:
                continue
            grouped = (
                pa.Table.from_batches([batch])
                .group_by(["topic", "partition"])
                .aggregate([("offset", "count"), ("offset", "min"), ("offset", "max")])
            )
            for row in grouped.to_pylist():
                tp = TopicPartition(str(row["topic"]), int(row["partition"]))
                n, lo, hi = row["offset_count"], row["offset_min"], row["offset_max"]
                if tp in out:
                    pn, plo, phi = out[tp]
                    out[tp] = (pn + n, min(plo, lo), max(phi, hi))
                else:
                    out[tp] = (n, lo, hi)
        return out


def drop_batch_id(table: pa.Table) -> pa.Table:
    """``table`` without the ``batch_id`` column (batch ids differ between runs)."""
    if "batch_id" in table.column_names:
        return table.drop_columns(["batch_id"])
    return table


def min_offset(table: pa.Table) -> int | None:
    """Smallest ``offset`` of a table (``None`` when empty)."""
    if table.num_rows == 0:
        return None
    value = pc.min(table.column("offset")).as_py()
    return None if value is None else int(value)
