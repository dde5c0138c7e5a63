"""Exactly-once Delta Lake tables (delta-rs), one Delta commit per micro-batch.

Executors write Parquet data files straight into the table directory under names unique to
the task attempt (``<col>=<value>/part-<batch_id:010d>-<attempt>-<n:05d>.parquet``). Delta
readers only read files named by the transaction log, so such a file is invisible until the
driver commits it. The driver then makes one Delta commit holding the batch's ``add``
actions and an application transaction ``txn(appId=app_id, version=batch_id)``
(``DeltaTable.create_write_transaction``). Before committing it reads
``DeltaTable.transaction_version(app_id)``: a batch at or below that version is already in
the table, so the commit is skipped and the new files are deleted.

Files of attempts that never reach the driver (killed tasks) stay unreferenced until
``vacuum`` removes them (``inorder compact --format delta``).

The transaction log stays bounded without help from the sink: after each commit delta-rs
writes a log checkpoint every ``delta.checkpointInterval`` commits (default 100) and deletes
log entries older than ``delta.logRetentionDuration`` (default 30 days) that precede a
checkpoint; application transactions are carried in checkpoints, so the committed batch id
survives the cleanup. ``table_properties`` sets these (or any other) properties when the
sink creates the table.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from inorder.sinks.base import (
    BatchWriter,
    ConsumedOffsets,
    DuplicateCommitError,
    SinkError,
    WrittenFile,
)
from inorder.sinks.commit_keys import APP_ID_KEY, BATCH_ID_KEY, FILES_KEY, OFFSETS_KEY, proof_json
from inorder.sinks.compacting import Compacting
from inorder.sinks.compaction_levels import (
    DEFAULT_FANOUT,
    DEFAULT_LEVELS,
    DEFAULT_MAX_MERGE_BYTES,
    check_level_settings,
    check_max_merge_bytes,
)
from inorder.sinks.compaction_merge import file_dir
from inorder.sinks.parquet import (
    DEFAULT_TARGET_FILE_SIZE,
    FileSink,
    ParquetBatchWriter,
    check_writable,
)
from inorder.sinks.parquet_compactor import ParquetCompactor
from inorder.sinks.proof import consumed_ranges
from inorder.sinks.topic_bucket import BUCKET_ONLY_PARQUET, derives_bucket
from inorder.storage import fs as sfs

DEFAULT_APP_ID = "inorder"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def describe_delta_error(exc: BaseException, secrets: tuple[str | None, ...] = ()) -> str:
    """One line of a delta-rs error: the request that failed and the innermost cause.

    delta-rs reports a failed store request as a tree over several lines, colored, whose
    first line is only "Generic S3 error"; the request and the cause are further down.
    """
    lines = [_ANSI.sub("", line).replace("\u21b3", "").strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return type(exc).__name__
    request = next((line for line in lines if line.startswith("Error performing ")), lines[0])
    request = request.split(" in ")[0] if request.startswith("Error performing ") else request
    cause = lines[-1]
    text = request if cause == request or len(lines) == 1 else f"{request}: {cause}"
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def delta_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type Delta stores for ``t`` (microsecond timestamps, signed integers...)."""
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC") if t.tz else pa.timestamp("us")
    if pa.types.is_unsigned_integer(t):
        widened = {8: pa.int16(), 16: pa.int32(), 32: pa.int64(), 64: pa.int64()}
        return widened[t.bit_width]
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_time(t) or pa.types.is_duration(t):
        return pa.int64()
    if pa.types.is_dictionary(t):
        return delta_type(t.value_type)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(delta_type(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(t.value_field.with_type(delta_type(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(delta_type(t.key_type), delta_type(t.item_type))
    return t


def delta_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every type replaced by the type Delta stores."""
    return pa.schema([f.with_type(delta_type(f.type)) for f in schema])


class _DeltaWriter(BatchWriter):
    """Casts rows to the Delta schema and writes data files into the table directory."""

    def __init__(self, inner: ParquetBatchWriter, schema: pa.Schema):
        self._inner = inner
        self._schema = schema

    def write(self, batch: pa.RecordBatch) -> None:
        """Add rows (cast to the table's types)."""
        if batch.schema != self._schema:
            # ns -> us timestamps truncate (Delta stores microseconds): an unsafe cast is intended.
            batch = batch.cast(self._schema, safe=False)
        self._inner.write(batch)

    def close(self) -> list[WrittenFile]:
        """Finish the files; they stay invisible until the driver commits them."""
        return self._inner.close()

    def abort(self) -> None:
        """Delete this writer's files."""
        self._inner.abort()


class DeltaSink(Compacting, FileSink):
    """A Delta table committed exactly once per micro-batch (deltalake / delta-rs).

    ``app_id`` names the writing query in the table's application transactions: a table
    receiving batches from a new checkpoint (batch ids starting again at 0) needs a new
    ``app_id``, or the new batches are taken for committed ones and skipped. Pipelines bind
    the sink to their checkpoint's id (:meth:`bind`), which becomes the ``app_id`` unless one
    was given explicitly.
    On S3 no lock provider is needed: delta-rs commits with ``PUT If-None-Match``.
    """

    def __init__(
        self,
        path: str,
        partition_by: Sequence[str] = (),
        storage_options: Mapping[str, str] | None = None,
        app_id: str | None = None,
        compression: str = "zstd",
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
        compact: bool = False,
        table_properties: Mapping[str, str] | None = None,
        compaction_fanout: int = DEFAULT_FANOUT,
        compaction_levels: int = DEFAULT_LEVELS,
        compact_in_background: bool = True,
        compaction_max_merge_bytes: int | None = None,
    ) -> None:
        super().__init__(path, partition_by, compression, storage_options)
        self.app_id = app_id or DEFAULT_APP_ID
        self._explicit_app_id = app_id is not None
        self.target_file_size = int(target_file_size)
        self.compact = compact
        self.table_properties = dict(table_properties) if table_properties else None
        check_level_settings(compaction_fanout, compaction_levels)
        if compaction_max_merge_bytes is None:
            compaction_max_merge_bytes = max(DEFAULT_MAX_MERGE_BYTES, self.target_file_size)
        check_max_merge_bytes(compaction_max_merge_bytes, self.target_file_size)
        self.compaction_fanout = compaction_fanout
        self.compaction_levels = compaction_levels
        self.compact_in_background = compact_in_background
        self.compaction_max_merge_bytes = compaction_max_merge_bytes
        self._ends: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_ends"] = None
        return self._unshipped(state)

    def _make_compactor(self) -> ParquetCompactor:
        """The level rule over the table's files, in a driver thread unless
        ``compact_in_background=False`` (:mod:`inorder.sinks.delta_compaction`)."""
        from inorder.sinks.delta_compaction import DeltaCompactor, DeltaTarget

        target = DeltaTarget(self.location, self.partition_by, self.compression, self.describe())
        return DeltaCompactor(
            self.path, self.storage_options, self.target_file_size, 0.0, self.compression,
            self.compaction_fanout, self.compaction_levels, self.compact_in_background,
            max_merge_bytes=self.compaction_max_merge_bytes, table=target,
        )  # fmt: skip

    def bind(self, owner: str) -> None:
        """Use the pipeline checkpoint's id as ``app_id`` (unless one was given)."""
        super().bind(owner)
        if not self._explicit_app_id:
            self.app_id = f"inorder-{owner}"

    def describe(self) -> str:
        """One line for humans."""
        parts = f", partitioned by {', '.join(self.partition_by)}" if self.partition_by else ""
        return f"Delta table {self.path}{parts}"

    def _table(self) -> Any:
        from deltalake import DeltaTable

        loc = self.location
        return DeltaTable(loc.delta_uri(), storage_options=loc.storage_options())

    # -- driver ------------------------------------------------------------------------------

    def check(self, schema: pa.Schema) -> None:
        """Check access; create the table if absent; its partitioning must match."""
        from deltalake import DeltaTable

        if derives_bucket(self.partition_by, schema):
            raise SinkError(f"{self.path}: {BUCKET_ONLY_PARQUET}")
        for col in self.partition_by:
            if col not in schema.names:
                raise SinkError(f"{self.path}: partition_by column {col!r} is not in the output")
        loc = self.location
        check_writable(loc)
        target = delta_schema(schema)
        secrets = (loc.s3.secret_access_key,) if loc.s3 else ()
        try:
            if DeltaTable.is_deltatable(loc.delta_uri(), storage_options=loc.storage_options()):
                table = self._table()
                existing = list(table.metadata().partition_columns)
                if existing != self.partition_by:
                    raise SinkError(
                        f"{self.path}: table is partitioned by {existing}, "
                        f"sink partition_by is {self.partition_by}"
                    )
                self._check_schema(table, target)
                self._check_owner(table)
            else:
                DeltaTable.create(
                    loc.delta_uri(),
                    target,
                    partition_by=self.partition_by or None,
                    storage_options=loc.storage_options(),
                    configuration=self.table_properties,
                )
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(
                f"{self.path}: cannot open Delta table: {describe_delta_error(exc, secrets)}"
            ) from None
        self._schema = target

    def _check_schema(self, table: Any, target: pa.Schema) -> None:
        """Refuse an output whose columns differ from the table's (no silent mixing)."""
        from deltalake import Schema

        def columns(schema: Any) -> list[tuple[str, str, bool]]:
            return [(f.name, str(f.type), bool(f.nullable)) for f in schema.fields]

        have, want = columns(table.schema()), columns(Schema.from_arrow(target))
        if have != want:
            gone = [c[0] for c in have if c not in want]
            new = [c[0] for c in want if c not in have]
            raise SinkError(
                f"{self.path}: the Delta table's columns differ from this pipeline's output "
                f"(table only: {gone or 'none'}; output only: {new or 'none'}); write this "
                "output to a new table with a new checkpoint (or a new job_version)"
            )

    def _check_owner(self, table: Any) -> None:
        """Refuse a table holding data committed by another pipeline checkpoint."""
        if self._explicit_app_id or self.owner is None:
            return  # an explicit app_id is the operator's statement of ownership
        if table.version() > 0 and self.committed_version() is None:
            raise SinkError(
                f"{self.path}: already holds data this pipeline checkpoint did not commit "
                f"(no transaction of app id {self.app_id!r} in {table.version()} versions); "
                "batch ids restart with every checkpoint, so the new run would write records "
                "again that the table already holds. Use a new table path, or the checkpoint "
                "that wrote it"
            )

    def open_writer(self, schema: pa.Schema, batch_id: int, task_key: str) -> BatchWriter:
        """Executor: a writer of data files for this task attempt."""
        target = delta_schema(schema)
        attempt = urllib.parse.quote(task_key, safe="-_.")[:40] + "-" + uuid.uuid4().hex[:8]
        inner = ParquetBatchWriter(
            self.location,
            target,
            self.partition_by,
            self.compression,
            self.target_file_size,
            prefix="",
            file_stem=f"part-{batch_id:010d}-{attempt}",
            collect_stats=True,
        )
        return _DeltaWriter(inner, target)

    def committed_version(self) -> int | None:
        """The highest batch id committed by ``app_id``, ``None`` if none."""
        version = self._table().transaction_version(self.app_id)
        return None if version is None else int(version)

    def last_committed_batch(self) -> int | None:
        """Same as :meth:`committed_version` (the name the Parquet sink uses)."""
        return self.committed_version()

    def is_committed(self, batch_id: int) -> bool:
        """Whether ``batch_id`` (or a later batch) of ``app_id`` is in the table."""
        version = self.committed_version()
        return version is not None and version >= batch_id

    def read_batches(self, first: int, last: int, columns: Sequence[str] | None = None) -> pa.Table:
        """The rows of batches ``first..last`` in the table (by their ``batch_id`` column).

        Files whose ``batch_id`` statistics lie outside the range are skipped unread.
        """
        import pyarrow.dataset as ds

        from inorder.sinks.delta_read import delta_dataset  # pyarrow.dataset: only to read

        dataset = delta_dataset(self._table(), self.location)
        condition = (ds.field("batch_id") >= first) & (ds.field("batch_id") <= last)
        table: pa.Table = dataset.to_table(
            columns=list(columns) if columns is not None else None, filter=condition
        )
        return table

    def commit(self, batch_id: int, files: Sequence[WrittenFile]) -> bool:
        """One Delta commit with the batch's files and ``txn(app_id, batch_id)``."""
        return self._commit_batch(batch_id, files, None)

    def commit_consumed(
        self, batch_id: int, files: Sequence[WrittenFile], consumed: Sequence[ConsumedOffsets]
    ) -> bool:
        """:meth:`commit`, recording in ``commitInfo`` the ``[start, end)`` the batch
        consumed per partition (``inorder.offsets``)."""
        return self._commit_batch(batch_id, files, consumed)

    def _commit_batch(
        self,
        batch_id: int,
        files: Sequence[WrittenFile],
        consumed: Sequence[ConsumedOffsets] | None,
    ) -> bool:
        try:
            committed = self._commit(batch_id, files, consumed)
        except SinkError:
            raise
        except Exception as exc:
            secrets = (self.location.s3.secret_access_key,) if self.location.s3 else ()
            raise SinkError(
                f"{self.path}: committing batch {batch_id} to the Delta table failed: "
                f"{describe_delta_error(exc, secrets)}; run again: the batch is committed "
                "once (its id is checked in the table first)"
            ) from None
        if committed:
            self._after_commit({file_dir(f.path) for f in files})
        return committed

    def _already_committed(self, table: Any, batch_id: int) -> bool:
        """Whether ``table`` holds ``batch_id`` (or a later batch) of ``app_id``: then the
        commit is a re-run and changes nothing."""
        version = table.transaction_version(self.app_id)
        return version is not None and int(version) >= batch_id

    def _guard(self, batch_id: int) -> None:
        """Refuse a second commit of ``batch_id``, read from the newest table version.

        delta-rs does not reject a commit whose ``txn`` repeats one already in the log, so
        a driver that decided on a stale view would add the batch's rows twice.
        """
        version = self._table().transaction_version(self.app_id)
        if version is not None and int(version) >= batch_id:
            raise DuplicateCommitError(
                f"{self.path}: batch {batch_id} of app id {self.app_id!r} is already in the "
                f"Delta table (its transactions reach batch {int(version)}); refusing to "
                "commit it a second time. Another driver is writing this table with the "
                "same app id: stop it, then run again"
            )

    def _commit(
        self,
        batch_id: int,
        files: Sequence[WrittenFile],
        consumed: Sequence[ConsumedOffsets] | None,
    ) -> bool:
        from deltalake.transaction import AddAction, CommitProperties, Transaction

        table = self._table()
        loc = self.location
        if self._already_committed(table, batch_id):
            for f in files:
                sfs.delete_quietly(loc, loc.join(f.path))
            return False
        schema = self._schema
        if schema is None:
            schema = pa.schema(table.schema().to_arrow())
        now = int(time.time() * 1000)
        actions = [
            AddAction(
                path=f.path,
                size=f.size_bytes,
                partition_values=dict(f.partition_values),
                modification_time=now,
                data_change=True,
                stats=f.stats or f'{{"numRecords": {f.rows}}}',
            )
            for f in files
        ]
        metadata = {
            APP_ID_KEY: self.app_id,
            BATCH_ID_KEY: str(batch_id),
            FILES_KEY: files_proof(files),
        }
        ranges = None
        if consumed is not None:
            ranges = consumed_ranges(consumed, self._previous_ends(table))
            metadata[OFFSETS_KEY] = json.dumps(ranges, separators=(",", ":"))
        self._guard(batch_id)
        try:
            table.create_write_transaction(
                actions,
                mode="append",
                schema=schema,
                partition_by=self.partition_by or None,
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app_id=self.app_id, version=batch_id)],
                    custom_metadata=metadata,
                ),
            )
        except Exception as exc:
            # The window after the guard: delta-rs refuses a commit whose app id another
            # writer committed after this one's snapshot was read ("Concurrent transaction").
            if "concurrent transaction" in str(exc).lower():
                raise DuplicateCommitError(
                    f"{self.path}: batch {batch_id} of app id {self.app_id!r} was committed "
                    "by another writer while this one committed it; refusing to commit it a "
                    "second time. Stop the other driver with this app id, then run again"
                ) from None
            raise
        if ranges is not None and self._ends is not None:
            self._ends.update({k: v[1] for k, v in ranges.items()})
        return True

    def _previous_ends(self, table: Any) -> dict[str, int]:
        """Where ``app_id``'s previous batches left each partition (from ``commitInfo``)."""
        if self._ends is None:
            self._ends = {}
            for entry in table.history():  # newest first
                if entry.get(APP_ID_KEY) != self.app_id or OFFSETS_KEY not in entry:
                    continue
                for name, (_, end) in json.loads(entry[OFFSETS_KEY]).items():
                    self._ends.setdefault(name, int(end))
        return dict(self._ends)


def files_proof(files: Sequence[WrittenFile]) -> str:
    """``{path: [rows, digest]}`` of a batch's files as JSON (the commit's proof of its rows)."""
    return proof_json({f.path: (f.rows, f.digest) for f in files})
