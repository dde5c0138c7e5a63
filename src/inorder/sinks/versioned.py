"""``VersionedSink``: every output row records the job version that wrote it.

Wraps any :class:`~inorder.sinks.base.Sink` and adds a constant ``job_version`` string
column, placed just before ``batch_id`` (which ends every output row) when there is one, at
the end otherwise. The inner sink sees the widened schema in ``check`` and gets the column in
every batch its writers receive; commits, binding and idempotence are the inner sink's.

Two versions of a job writing the same dataset would each commit "batch N": run each version
with its own output (and checkpoint) and switch readers over (see docs/versioned-jobs.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

from inorder.sinks.base import BatchWriter, ConsumedOffsets, Sink, SinkError, WrittenFile

#: Name of the added column.
JOB_VERSION_FIELD = "job_version"


def versioned_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with ``job_version`` inserted before ``batch_id`` (or appended)."""
    if JOB_VERSION_FIELD in schema.names:
        raise SinkError(f"output already has a {JOB_VERSION_FIELD!r} column")
    field = pa.field(JOB_VERSION_FIELD, pa.string(), nullable=False)
    at = schema.get_field_index("batch_id")
    return schema.insert(at if at >= 0 else len(schema), field)


class _VersionedWriter(BatchWriter):
    """Adds the constant column to each batch, then hands it to the inner writer."""

    def __init__(self, inner: BatchWriter, schema: pa.Schema, version: str) -> None:
        self._inner = inner
        self._index = schema.get_field_index(JOB_VERSION_FIELD)
        self._field = schema.field(JOB_VERSION_FIELD)
        self._version = version

    def write(self, batch: pa.RecordBatch) -> None:
        """Add ``job_version`` and write."""
        column = pa.array([self._version] * batch.num_rows, pa.string())
        arrays = list(batch.columns)
        arrays.insert(self._index, column)
        fields = list(batch.schema)
        fields.insert(self._index, self._field)
        self._inner.write(pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields)))

    def close(self) -> list[WrittenFile]:
        """The inner writer's staged files."""
        return self._inner.close()

    def abort(self) -> None:
        """Abort the inner writer."""
        self._inner.abort()


class VersionedSink(Sink):
    """Any sink, with a ``job_version`` column on every row (see the module docstring)."""

    def __init__(self, inner: Sink, job_version: str) -> None:
        if not str(job_version).strip():
            raise SinkError("job_version must be a non-empty string")
        self.inner = inner
        self.job_version = str(job_version)

    def __repr__(self) -> str:
        return f"VersionedSink({self.inner!r}, job_version={self.job_version!r})"

    def bind(self, owner: str) -> None:
        """Bind the inner sink (it records and checks the owner)."""
        super().bind(owner)
        self.inner.bind(owner)

    def check(self, schema: pa.Schema) -> None:
        """Check the inner sink with the widened schema."""
        self.inner.check(versioned_schema(schema))

    def open_writer(self, schema: pa.Schema, batch_id: int, task_key: str) -> BatchWriter:
        """A writer adding the column in front of the inner sink's writer."""
        wide = versioned_schema(schema)
        return _VersionedWriter(
            self.inner.open_writer(wide, batch_id, task_key), wide, self.job_version
        )

    def commit(self, batch_id: int, files: Sequence[WrittenFile]) -> bool:
        """The inner sink's commit."""
        return self.inner.commit(batch_id, files)

    def commit_consumed(
        self, batch_id: int, files: Sequence[WrittenFile], consumed: Sequence[ConsumedOffsets]
    ) -> bool:
        """The wrapped sink's :meth:`commit_consumed` (it may record the offsets)."""
        return self.inner.commit_consumed(batch_id, files, consumed)

    def is_committed(self, batch_id: int) -> bool:
        """The inner sink's answer."""
        return self.inner.is_committed(batch_id)

    def guard_background(self, check: Callable[[], None]) -> None:
        """The inner sink's."""
        self.inner.guard_background(check)

    def finish_background(self, timeout: float | None = None) -> str | None:
        """The inner sink's."""
        return self.inner.finish_background(timeout)

    def describe(self) -> str:
        """The inner sink's description, with the version."""
        return f"{self.inner.describe()} [job_version {self.job_version}]"
