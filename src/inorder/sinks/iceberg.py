"""Exactly-once Iceberg tables (pyiceberg), one snapshot per micro-batch.

Executors write Parquet data files straight into the table's data directory
(:mod:`inorder.sinks.iceberg_writer`); Iceberg readers read only files named by a snapshot,
so they stay invisible until the driver commits. The driver then makes one snapshot holding
the batch's files, whose summary records ``inorder.app-id`` (the writing pipeline
checkpoint), ``inorder.batch-id`` and ``inorder.offsets`` (per topic-partition, the
``[start, end)`` of offsets the batch consumed; :mod:`inorder.sinks.iceberg_history`).
Before committing it walks the current snapshot's ancestors for the newest summary of its
app id: a batch at or below it is already in the table, so the commit is skipped and the
new files are deleted. A lost
optimistic-concurrency race (``CommitFailedException``) reloads the table and decides again
from the summaries, so a retry can never add a batch twice.

Files are added with ``Transaction.add_files`` rather than appended as Arrow data: the
executors' files are committed as written (no second write on the driver), and because
they carry no Iceberg field ids, pyiceberg resolves their columns through the table's name
mapping, which schema updates keep current (a column added later reads as null in older
files).
"""

from __future__ import annotations

import json
import pickle
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from inorder.sinks.base import (
    BatchWriter,
    ConsumedOffsets,
    DuplicateCommitError,
    Sink,
    SinkError,
    WrittenFile,
)
from inorder.sinks.commit_keys import FILES_KEY
from inorder.sinks.compacting import Compacting
from inorder.sinks.compaction_levels import DEFAULT_MAX_MERGE_BYTES, LevelSettings
from inorder.sinks.delta import delta_schema, files_proof
from inorder.sinks.evolution import schema_change
from inorder.sinks.iceberg_catalog import (
    PartitionField,
    catalog_properties,
    check_partition_fields,
    create_table,
    describe_catalog,
    open_catalog,
    parse_partition_by,
    require_pyiceberg,
    rows_from_filter,
    secrets_of,
)
from inorder.sinks.iceberg_history import (
    APP_ID_KEY,
    BATCH_ID_KEY,
    OFFSETS_KEY,
    ROW_OFFSETS_KEY,
    batch_summaries,
    input_ranges,
    last_batch,
    repair_summary,
    total_records,
)
from inorder.sinks.iceberg_writer import IcebergBatchWriter, merge_offsets
from inorder.sinks.parquet import COMPRESSIONS, DEFAULT_TARGET_FILE_SIZE
from inorder.sinks.parquet_compactor import ParquetCompactor
from inorder.sinks.topic_bucket import BUCKET_ONLY_PARQUET, derives_bucket
from inorder.storage import fs as sfs

if TYPE_CHECKING:
    import pyarrow.dataset as ds
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

__all__ = ["APP_ID_KEY", "BATCH_ID_KEY", "OFFSETS_KEY", "IcebergSink", "batch_summaries"]

DEFAULT_APP_ID = "inorder"
#: Commit attempts when other writers keep winning the optimistic-concurrency race.
COMMIT_ATTEMPTS = 8


class IcebergSink(Compacting, Sink):
    """An Iceberg table committed exactly once per micro-batch (pyiceberg).

    ``table`` is ``"namespace.name"``; ``warehouse`` a local path or ``s3://bucket/prefix``.
    By default the catalog is pyiceberg's SQL catalog on the SQLite file ``catalog_file``
    (default ``<warehouse>/catalog.db`` for a local warehouse); ``catalog`` passes pyiceberg
    catalog properties through (``{"type": "rest", "uri": ...}``, ``{"type": "glue"}`` ...).
    ``partition_by`` takes column names (identity) and ``year(c)``, ``month(c)``, ``day(c)``,
    ``hour(c)``. ``table_properties`` are set when the sink creates the table.

    ``app_id`` names the writing query in snapshot summaries; pipelines bind the sink to
    their checkpoint's id (:meth:`bind`), which becomes the app id unless one was given.
    """

    def __init__(
        self,
        table: str,
        warehouse: str,
        partition_by: Sequence[str] = (),
        catalog: Mapping[str, str] | None = None,
        catalog_file: str | None = None,
        storage_options: Mapping[str, str] | None = None,
        compression: str = "zstd",
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
        table_properties: Mapping[str, str] | None = None,
        app_id: str | None = None,
        compact: bool = False,
        compaction: LevelSettings | None = None,
    ) -> None:
        require_pyiceberg("the Iceberg sink")
        if table.count(".") < 1 or not all(table.split(".")):
            raise SinkError(f"Iceberg table {table!r} must be 'namespace.name'")
        if compression.lower() not in COMPRESSIONS:
            raise SinkError(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
        if target_file_size <= 0:
            raise SinkError("target_file_size must be > 0")
        self.table = table
        self.warehouse = str(warehouse)
        self.partition_by = list(partition_by)
        self.fields: list[PartitionField] = parse_partition_by(self.partition_by)
        self.catalog_file = catalog_file
        self.catalog = dict(catalog) if catalog else None
        self.storage_options = dict(storage_options) if storage_options else None
        self.compression = compression.lower()
        self.target_file_size = int(target_file_size)
        self.table_properties = dict(table_properties) if table_properties else None
        self.app_id = app_id or DEFAULT_APP_ID
        self._explicit_app_id = app_id is not None
        self.compact = compact
        bound = max(DEFAULT_MAX_MERGE_BYTES, target_file_size)
        self.compaction = compaction or LevelSettings(target_file_size, max_merge_bytes=bound)
        self._props = catalog_properties(
            self.catalog, self.warehouse, catalog_file, self.storage_options
        )
        self._table_location: str | None = None
        self._schema: pa.Schema | None = None
        self._location: sfs.Location | None = None
        self._opened: Catalog | None = None

    def __repr__(self) -> str:
        return f"IcebergSink({self.table!r}, partition_by={self.partition_by!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_location"] = None  # re-resolved on the executor
        state["_opened"] = None  # catalog clients are not picklable
        return self._unshipped(state)

    def _make_compactor(self) -> ParquetCompactor:
        """The level rule's merges (``compaction``) in a driver thread, on a copy of the sink
        with its own catalog client (:mod:`inorder.sinks.iceberg_compaction`)."""
        from inorder.sinks.iceberg_compaction import IcebergCompactor

        c = self.compaction
        return IcebergCompactor(
            self.warehouse, self.storage_options, c.target_file_size, 0.0, self.compression,
            c.fanout, c.levels, True, c.max_merge_bytes, sink=pickle.loads(pickle.dumps(self)),
        )  # fmt: skip

    def bind(self, owner: str) -> None:
        """Use the pipeline checkpoint's id as ``app_id`` (unless one was given)."""
        super().bind(owner)
        if not self._explicit_app_id:
            self.app_id = f"inorder-{owner}"

    def describe(self) -> str:
        """One line for humans (no credentials)."""
        parts = f", partitioned by {', '.join(self.partition_by)}" if self.partition_by else ""
        return f"Iceberg table {self.table} ({describe_catalog(self._props)}{parts})"

    def beside(self, suffix: str, partition_by: Sequence[str]) -> IcebergSink:
        """The table ``<table><suffix>`` in the same catalog (the default dead-letter output)."""
        return IcebergSink(
            self.table + suffix,
            self.warehouse,
            partition_by,
            catalog=self.catalog,
            catalog_file=self.catalog_file,
            storage_options=self.storage_options,
            compression=self.compression,
            target_file_size=self.target_file_size,
        )

    # -- catalog access ---------------------------------------------------------------------

    def error(self, what: str, exc: BaseException) -> SinkError:
        """A one-line error naming the table (credentials scrubbed)."""
        secrets = secrets_of(self._props)
        return SinkError(f"{self.describe()}: {what}: {sfs.describe_error(exc, secrets)}")

    def _catalog(self) -> Catalog:
        if self._opened is None:
            self._opened = open_catalog(self._props)
        return self._opened

    def load_table(self) -> Table | None:
        """The table as the catalog has it now, ``None`` when it does not exist."""
        from pyiceberg.exceptions import NoSuchTableError

        catalog = self._catalog()
        try:
            return catalog.load_table(self.table)
        except NoSuchTableError:
            return None
        except Exception as exc:
            raise self.error("cannot load the table", exc) from None

    @property
    def location(self) -> sfs.Location:
        """The table's root (its data files are under ``data/``); the warehouse before the
        table exists."""
        if self._location is None:
            if self._table_location is None:
                table = self.load_table()
                if table is None:
                    return sfs.resolve(self.warehouse, self.storage_options)
                self._table_location = table.location()
            self._location = sfs.resolve(self._table_location, self.storage_options)
        return self._location

    # -- driver ------------------------------------------------------------------------------

    def check(self, schema: pa.Schema) -> None:
        """Create the table if absent; check its partitioning, owner and columns.

        A new nullable output column is added to the table (union by name); any other
        difference is refused.
        """
        if derives_bucket(self.partition_by, schema):
            raise SinkError(f"{self.describe()}: {BUCKET_ONLY_PARQUET}")
        target = delta_schema(schema)
        check_partition_fields(self.fields, target, self.describe())
        try:
            table = self.load_table()
            if table is None:
                table = create_table(
                    self._catalog(), self.table, target, self.fields, self.table_properties
                )
            self._check_spec(table)
            self._check_owner(table)
            self._evolve(table, target)
        except SinkError:
            raise
        except Exception as exc:
            raise self.error("cannot open the table", exc) from None
        self._table_location = table.location()
        self._location = None
        self._schema = target

    def _check_spec(self, table: Table) -> None:
        have = [
            (table.schema().find_column_name(f.source_id), str(f.transform).lower())
            for f in table.spec().fields
        ]
        want = [(f.source, f.transform) for f in self.fields]
        if have != want:
            shown = [s if t == "identity" else f"{t}({s})" for s, t in have]
            raise SinkError(
                f"{self.describe()}: the table is partitioned by {shown}, "
                f"sink partition_by is {self.partition_by}"
            )

    def _check_owner(self, table: Table) -> None:
        """Refuse a table holding data another pipeline checkpoint committed."""
        if self._explicit_app_id or self.owner is None or table.current_snapshot() is None:
            return
        if last_batch(table, self.app_id) is None and total_records(table) > 0:
            raise SinkError(
                f"{self.describe()}: already holds data this pipeline checkpoint did not commit "
                f"(no snapshot of app id {self.app_id!r}); batch ids restart with every "
                "checkpoint, so the new run would write records again that the table already "
                "holds. Use a new table, or the checkpoint that wrote it"
            )

    def _evolve(self, table: Table, target: pa.Schema) -> None:
        """Add new nullable output columns to the table; refuse any other change."""
        # pyiceberg reads strings as large_string: compare in the types the sink writes.
        have = delta_schema(table.schema().as_arrow())
        compatible, changes = schema_change(_plain(have), _plain(target))
        if compatible and not [c for c in changes if c.endswith(" added")]:
            return
        if not compatible:
            raise SinkError(
                f"{self.describe()}: the output schema changed incompatibly "
                f"({'; '.join(changes)}); only adding nullable columns evolves a table in place. "
                "Write this output to a new table with a new checkpoint"
            )
        with table.update_schema() as update:
            update.union_by_name(target)

    def open_writer(self, schema: pa.Schema, batch_id: int, task_key: str) -> BatchWriter:
        """Executor: a writer of data files for this task attempt."""
        if self._table_location is None:
            raise SinkError(f"{self.describe()}: open_writer before check")
        attempt = urllib.parse.quote(task_key, safe="-_.")[:40] + "-" + uuid.uuid4().hex[:8]
        return IcebergBatchWriter(
            self.location,
            delta_schema(schema),
            self.fields,
            self.compression,
            self.target_file_size,
            file_stem=f"part-{batch_id:010d}-{attempt}",
        )

    def last_committed_batch(self) -> int | None:
        """The newest batch id of ``app_id`` in the current snapshot's history."""
        table = self.load_table()
        return None if table is None else last_batch(table, self.app_id)

    def is_committed(self, batch_id: int) -> bool:
        """Whether ``batch_id`` (or a later batch) of ``app_id`` is in the table."""
        last = self.last_committed_batch()
        return last is not None and last >= batch_id

    def commit(self, batch_id: int, files: Sequence[WrittenFile]) -> bool:
        """One snapshot with the batch's files; ``False`` when the batch is already there.

        The summary has no ``inorder.offsets``: only :meth:`commit_consumed` knows them.
        """
        return self._commit(batch_id, files, None)

    def commit_consumed(
        self, batch_id: int, files: Sequence[WrittenFile], consumed: Sequence[ConsumedOffsets]
    ) -> bool:
        """:meth:`commit`, recording the ``[start, end)`` the batch consumed per partition."""
        return self._commit(batch_id, files, consumed)

    def _commit(
        self,
        batch_id: int,
        files: Sequence[WrittenFile],
        consumed: Sequence[ConsumedOffsets] | None,
    ) -> bool:
        from pyiceberg.exceptions import CommitFailedException

        paths = [self._full_path(f.path) for f in files]
        summary = {
            APP_ID_KEY: self.app_id,
            BATCH_ID_KEY: str(batch_id),
            ROW_OFFSETS_KEY: json.dumps(merge_offsets(files), separators=(",", ":")),
            FILES_KEY: files_proof(files),
        }
        for attempt in range(COMMIT_ATTEMPTS):
            table = self._load_for_commit()
            if self._already_committed(table, batch_id):
                self._delete(files)
                return False
            if consumed is not None:
                # Decided on the table this attempt commits on: a repair or another batch
                # that won the race moves where this batch's ranges start.
                ranges = input_ranges(table, self.app_id, consumed)
                summary[OFFSETS_KEY] = json.dumps(ranges, separators=(",", ":"))
            self._guard(table, batch_id)
            try:
                self._commit_snapshot(table, paths, summary)
            except CommitFailedException:
                # Another writer committed first: decide again from the refreshed table.
                time.sleep(min(0.05 * 2**attempt, 2.0))
                continue
            except Exception as exc:
                raise self.error(f"commit of batch {batch_id} failed", exc) from None
            self._after_commit(None)  # committed: the compactor's work is not the batch's
            return True
        raise SinkError(
            f"{self.describe()}: commit of batch {batch_id} lost {COMMIT_ATTEMPTS} concurrent "
            "commit races in a row; another writer keeps committing to this table"
        )

    def _already_committed(self, table: Table, batch_id: int) -> bool:
        """Whether ``table`` holds ``batch_id`` (or a later batch) of ``app_id``: then the
        commit is a re-run and changes nothing."""
        last = last_batch(table, self.app_id)
        return last is not None and last >= batch_id

    def _guard(self, table: Table, batch_id: int) -> None:
        """Refuse a second snapshot of ``batch_id``: any ancestor of the snapshot this commit
        builds on that already records it (whatever came after it) stops the commit."""
        for summary in batch_summaries(table, self.app_id):
            if int(summary[BATCH_ID_KEY]) == batch_id:
                raise DuplicateCommitError(
                    f"{self.describe()}: batch {batch_id} of app id {self.app_id!r} is already "
                    "in the table's snapshot history; refusing to commit it a second time. "
                    "Another driver is writing this table with the same app id: stop it, "
                    "then run again"
                )

    def _load_for_commit(self) -> Table:
        table = self.load_table()
        if table is None:
            raise SinkError(f"{self.describe()}: the table disappeared")
        return table

    def _commit_snapshot(self, table: Table, paths: list[str], summary: dict[str, str]) -> None:
        """The commit point: one catalog commit adding ``paths`` with ``summary``."""
        # pyiceberg retries a lost race itself, re-applying the append on top of whatever
        # won: a second driver's commit of this very batch would then be added twice. Its
        # retry count is read from the table's properties, so it is turned off on this
        # in-memory copy only (the catalog applies the changes to its own current metadata);
        # the caller retries after checking the summaries again.
        properties = {**table.metadata.properties, "commit.retry.num-retries": "0"}
        table.metadata = table.metadata.model_copy(update={"properties": properties})
        tx = table.transaction()
        # Duplicate detection scans every manifest; paths are unique per task attempt and the
        # summary check above already rules out adding a batch twice.
        tx.add_files(paths, snapshot_properties=summary, check_duplicate_files=False)
        tx.commit_transaction()

    def _full_path(self, rel: str) -> str:
        assert self._table_location is not None
        return f"{self._table_location.rstrip('/')}/{rel}"

    def _delete(self, files: Sequence[WrittenFile]) -> None:
        loc = self.location
        for f in files:
            sfs.delete_quietly(loc, loc.join(f.path))

    def delete_from(self, starts: Mapping[tuple[str, int], int], expected: int) -> None:
        """Delete the rows at or after ``starts[(topic, partition)]`` (``inorder repair``).

        One copy-on-write commit (files wholly matched are dropped, others rewritten) whose
        summary says where each partition was cut (``inorder.repair-from``: the next batch's
        ranges start there) and has no batch id: the batch summaries before it stay, so
        batch ids continue after the last one. Deleting rather than rolling back to the
        snapshot before the first affected batch keeps the other partitions' rows (their
        state was not rewound) and the table's history. ``expected`` is the number of rows
        counted beforehand: any other count is an error.
        """
        condition = rows_from_filter(starts)
        if condition is None:
            return
        table = self._load_for_commit()
        before = total_records(table)
        try:
            table.delete(
                delete_filter=condition, snapshot_properties=repair_summary(self.app_id, starts)
            )
        except Exception as exc:
            raise self.error("DELETE failed", exc) from None
        deleted = before - total_records(self._load_for_commit())
        if deleted != expected:
            raise SinkError(
                f"{self.describe()}: DELETE removed {deleted} rows, {expected} were counted "
                "(is the pipeline still running?)"
            )

    # -- reading ------------------------------------------------------------------------------

    def dataset(self) -> ds.Dataset | None:
        """The current snapshot's rows as a pyarrow dataset (``None`` before the first commit).

        Columns a file lacks (added by schema evolution) read as null.
        """
        import pyarrow.dataset as pads

        table = self.load_table()
        if table is None or table.current_snapshot() is None:
            return None
        loc = self.location
        root = self._table_location or table.location()
        paths = [
            loc.join(task.file.file_path.removeprefix(root.rstrip("/") + "/"))
            for task in table.scan().plan_files()
        ]
        schema = table.schema().as_arrow()
        return pads.dataset(paths, schema=schema, filesystem=loc.filesystem, format="parquet")

    def read_batches(self, first: int, last: int, columns: Sequence[str] | None = None) -> pa.Table:
        """The rows of batches ``first..last`` (by their ``batch_id`` column)."""
        import pyarrow.dataset as pads

        data = self.dataset()
        if data is None:
            return pa.table({})
        condition = (pads.field("batch_id") >= first) & (pads.field("batch_id") <= last)
        table: pa.Table = data.to_table(
            columns=list(columns) if columns is not None else None, filter=condition
        )
        return table


def _plain(schema: pa.Schema) -> pa.Schema:
    """``schema`` without metadata (Iceberg's field-id metadata must not count as a change)."""
    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])
