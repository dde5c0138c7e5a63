"""A sink whose batch ids continue another checkpoint's numbering.

Sinks key their idempotency by batch id (Parquet manifests ``commits/<batch_id>``, Delta
``txn(app_id, version=batch_id)``), and Spark restarts batch ids at 0 with every new
checkpoint. After ``inorder repair`` the new checkpoint keeps the old owner id and records
``batch_offset`` = the sink's last committed batch + 1; the runner wraps the sink in
:class:`BatchIdOffset`, so the new checkpoint's batch ``b`` is the sink's batch
``batch_offset + b`` (and the rows' ``batch_id`` column says so too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from inorder.records import BATCH_ID_FIELD
from inorder.sinks.base import BatchWriter, ConsumedOffsets, Sink, WrittenFile


class _RenumberingWriter(BatchWriter):
    """Adds the offset to the ``batch_id`` column of every row, then writes."""

    def __init__(self, inner: BatchWriter, offset: int) -> None:
        self._inner = inner
        self._offset = offset

    def write(self, batch: pa.RecordBatch) -> None:
        """Write ``batch`` with its batch ids shifted."""
        index = batch.schema.get_field_index(BATCH_ID_FIELD.name)
        if index >= 0:
            column = batch.column(index)
            shifted = pc.add(column, pa.scalar(self._offset, column.type))
            arrays = list(batch.columns)
            arrays[index] = shifted
            batch = pa.RecordBatch.from_arrays(arrays, schema=batch.schema)
        self._inner.write(batch)

    def close(self) -> list[WrittenFile]:
        """Flush and return the staged files."""
        return self._inner.close()

    def abort(self) -> None:
        """Delete what was staged."""
        self._inner.abort()


class BatchIdOffset(Sink):
    """``sink`` seen through shifted batch ids: checkpoint batch ``b`` is ``offset + b``."""

    def __init__(self, sink: Sink, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"batch id offset must be >= 0, not {offset}")
        self.inner = sink
        self.offset = offset

    def __repr__(self) -> str:
        return f"BatchIdOffset({self.inner!r}, {self.offset})"

    def check(self, schema: pa.Schema) -> None:
        """The wrapped sink's check."""
        self.inner.check(schema)

    def open_writer(self, schema: pa.Schema, batch_id: int, task_key: str) -> BatchWriter:
        """A writer of the wrapped sink for batch ``offset + batch_id``."""
        writer = self.inner.open_writer(schema, self.offset + batch_id, task_key)
        return _RenumberingWriter(writer, self.offset) if self.offset else writer

    def commit(self, batch_id: int, files: Sequence[WrittenFile]) -> bool:
        """Commit batch ``offset + batch_id`` of the wrapped sink."""
        return self.inner.commit(self.offset + batch_id, files)

    def commit_consumed(
        self, batch_id: int, files: Sequence[WrittenFile], consumed: Sequence[ConsumedOffsets]
    ) -> bool:
        """The wrapped sink's :meth:`commit_consumed` (it may record the offsets)."""
        return self.inner.commit_consumed(self.offset + batch_id, files, consumed)

    def is_committed(self, batch_id: int) -> bool:
        """Whether batch ``offset + batch_id`` is committed in the wrapped sink."""
        return self.inner.is_committed(self.offset + batch_id)

    def bind(self, owner: str) -> None:
        """Bind the wrapped sink."""
        self.inner.bind(owner)

    @property
    def owner(self) -> str | None:
        """The wrapped sink's owner."""
        return self.inner.owner

    def guard_background(self, check: Callable[[], None]) -> None:
        """The inner sink's."""
        self.inner.guard_background(check)

    def finish_background(self, timeout: float | None = None) -> str | None:
        """The inner sink's."""
        return self.inner.finish_background(timeout)

    def describe(self) -> str:
        """The wrapped sink's description."""
        return self.inner.describe()
