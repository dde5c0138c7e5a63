"""The current (SCD1) and history (SCD2) session tables as Delta tables: schemas, MERGEs.

A :class:`DeltaTableOutput` is one of the two tables. :meth:`DeltaTableOutput.merge` turns a
:class:`~inorder.sessions.tables_plan.BatchPlan` into the table's rows (taken from the
change log's Arrow columns) and applies it with one deltalake MERGE whose commit carries the
micro-batch id as the application transaction ``txn(app_id, batch_id)`` and the offsets it
covers in ``commitInfo`` (``inorder.batch``, ``inorder.first_batch``, ``inorder.offsets``).

Both tables are partitioned by ``topic`` (the history by ``is_current`` as well); the MERGE
condition names the batch's topics (and for the history, open versions only), so other
partitions are not read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inorder.errors import InorderError
from inorder.sessions.tables_plan import BatchPlan, live_table
from inorder.sinks.delta import delta_schema
from inorder.sinks.delta_read import delta_dataset
from inorder.storage import fs as sfs

TableKind = Literal["current", "history"]
#: Commit-info keys of a table commit.
BATCH_KEY = "inorder.batch"
FIRST_BATCH_KEY = "inorder.first_batch"
OFFSETS_KEY = "inorder.offsets"
#: The column of a MERGE source saying what each row does (upsert, delete, close, insert).
ACTION_COLUMN = "_inorder_action"
#: What identifies a row of a session table.
KEY_COLUMNS = ("topic", "session", "row_id")


class TablesError(InorderError):
    """A session table cannot be opened, read or committed."""


def current_schema(changes: pa.Schema, row_names: Sequence[str]) -> pa.Schema:
    """Columns of the current table: origin, session, row id, row data, ``batch_id``."""
    head = ["topic", "partition", "offset", "kafka_ts", "session", "row_id"]
    fields = [_field(changes, n, n in ("topic", "session", "row_id")) for n in head]
    fields += [_field(changes, n) for n in row_names]
    fields.append(_field(changes, "batch_id", True))
    return delta_schema(pa.schema(fields))


def history_schema(changes: pa.Schema, row_names: Sequence[str]) -> pa.Schema:
    """Columns of the history table: one row per version of a session's row."""
    ts = changes.field("kafka_ts").type
    fields = [_field(changes, n, True) for n in ("topic", "partition", "session", "row_id")]
    fields += [_field(changes, n) for n in row_names]
    fields += [
        pa.field("valid_from_offset", pa.int64(), nullable=False),
        pa.field("valid_from_ts", ts),
        pa.field("valid_to_offset", pa.int64()),
        pa.field("valid_to_ts", ts),
        pa.field("is_current", pa.bool_(), nullable=False),
        pa.field("closed_by", pa.string()),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("closed_batch_id", pa.int64()),
    ]
    return delta_schema(pa.schema(fields))


def _field(schema: pa.Schema, name: str, required: bool = False) -> pa.Field:
    return schema.field(name).with_nullable(not required)


class DeltaTableOutput:
    """One session table (``kind``) stored as a Delta table at ``path``."""

    def __init__(
        self,
        kind: TableKind,
        path: str,
        schema: pa.Schema,
        storage_options: Mapping[str, str] | None = None,
        app_id: str = "inorder",
    ) -> None:
        self.kind: TableKind = kind
        # History: open versions apart from closed ones, so a MERGE reads only the open ones.
        self.partition_by = ["topic"] if kind == "current" else ["topic", "is_current"]
        self.path = path
        self.schema = schema
        self.app_id = app_id
        self.location = sfs.resolve(path, storage_options)
        self._secrets = (self.location.s3.secret_access_key,) if self.location.s3 else ()

    def describe(self) -> str:
        """One line for humans."""
        return f"{self.kind} table {self.path}"

    def failure(self, what: str, exc: BaseException) -> TablesError:
        """A one-line error about this table (credentials never shown)."""
        return TablesError(f"{self.describe()}: {what}: {sfs.describe_error(exc, self._secrets)}")

    def open(self) -> Any:
        """The Delta table (deltalake ``DeltaTable``)."""
        from deltalake import DeltaTable

        loc = self.location
        try:
            return DeltaTable(loc.delta_uri(), storage_options=loc.storage_options())
        except Exception as exc:
            raise self.failure("cannot open", exc) from None

    def exists(self) -> bool:
        """Whether the Delta table exists (nothing is created)."""
        from deltalake import DeltaTable

        loc = self.location
        try:
            return bool(
                DeltaTable.is_deltatable(loc.delta_uri(), storage_options=loc.storage_options())
            )
        except Exception as exc:
            raise self.failure("cannot look for it", exc) from None

    def written(self) -> bool:
        """Whether anything was committed to the table after its creation."""
        return bool(self.open().version() > 0)

    def check(self) -> None:
        """Create the table if absent; an existing one must have this schema and layout."""
        from deltalake import DeltaTable, Schema

        loc = self.location
        try:
            if not DeltaTable.is_deltatable(loc.delta_uri(), storage_options=loc.storage_options()):
                DeltaTable.create(
                    loc.delta_uri(),
                    self.schema,
                    partition_by=self.partition_by,
                    storage_options=loc.storage_options(),
                )
                return
            table = self.open()
            have = [(f.name, str(f.type)) for f in table.schema().fields]
            layout = list(table.metadata().partition_columns)
        except TablesError:
            raise
        except Exception as exc:
            raise self.failure("cannot open or create", exc) from None
        want = [(f.name, str(f.type)) for f in Schema.from_arrow(self.schema).fields]
        if have != want:
            gone = [n for n, _ in have if n not in dict(want)]
            new = [n for n, _ in want if n not in dict(have)]
            raise TablesError(
                f"{self.describe()}: its columns differ from this pipeline's session rows "
                f"(table only: {gone or 'none'}; pipeline only: {new or 'none'}; or types "
                "differ); give the table a new path"
            )
        if layout != self.partition_by:
            raise TablesError(
                f"{self.describe()}: partitioned by {layout}, not {self.partition_by}; "
                "give the table a new path"
            )

    def committed_batch(self) -> int | None:
        """The last micro-batch this pipeline's ``app_id`` committed to the table."""
        try:
            version = self.open().transaction_version(self.app_id)
        except TablesError:
            raise
        except Exception as exc:
            raise self.failure("cannot read its transactions", exc) from None
        return None if version is None else int(version)

    def live_keys(self) -> pa.Table:
        """Keys of the live rows (the current table's rows, the history's open versions)."""
        try:
            dataset = delta_dataset(self.open(), self.location)
            wanted = pc.field("is_current") if self.kind == "history" else None
            keys = dataset.to_table(columns=list(KEY_COLUMNS), filter=wanted)
        except TablesError:
            raise
        except Exception as exc:
            raise self.failure("cannot read its rows", exc) from None
        return live_table(keys)

    # -- one commit ------------------------------------------------------------------------

    def merge(self, plan: BatchPlan, changes: pa.Table, first: int, last: int) -> dict[str, Any]:
        """Apply ``plan`` (of ``changes``, batches ``first..last``) as the commit of ``last``.

        ``changes`` is the ordered change-log table the plan's indexes point into. Returns
        deltalake's merge metrics (empty when the plan changes nothing in this table).
        """
        from deltalake import CommitProperties, Transaction

        if self.kind == "current":
            source = current_source(plan, changes, self.schema)
        else:
            source = history_source(plan, changes, self.schema, last)
        if source.num_rows == 0:
            return {}
        properties = CommitProperties(
            app_transactions=[Transaction(self.app_id, last)],
            custom_metadata={
                BATCH_KEY: str(last),
                FIRST_BATCH_KEY: str(first),
                OFFSETS_KEY: offset_ranges(changes),
            },
        )
        topics = pc.unique(source.column("topic")).to_pylist()
        on = " AND ".join(f"t.{c} = s.{c}" for c in KEY_COLUMNS)
        # Names the partitions the batch touches: the others are not read.
        on += " AND t.topic IN (" + ", ".join(_sql_string(t) for t in topics) + ")"
        if self.kind == "history":
            # Only open versions can be closed: closed ones (most of the table, in their own
            # partition) are not read. A new version must not match the open one it replaces.
            on += f" AND t.is_current = true AND s.{ACTION_COLUMN} = 'close'"
        try:
            merger = self.open().merge(
                source,
                on,
                source_alias="s",
                target_alias="t",
                commit_properties=properties,
                # A materialized source lets delta-rs prune partitions from the predicate.
                streamed_exec=False,
            )
            if self.kind == "current":
                columns = {f.name: f"s.{f.name}" for f in self.schema}
                merger = (
                    merger.when_matched_delete(predicate=f"s.{ACTION_COLUMN} = 'delete'")
                    .when_matched_update(columns, predicate=f"s.{ACTION_COLUMN} = 'upsert'")
                    .when_not_matched_insert(columns, predicate=f"s.{ACTION_COLUMN} = 'upsert'")
                )
            else:
                closing = ("valid_to_offset", "valid_to_ts", "is_current", "closed_by")
                updates = {c: f"s.{c}" for c in (*closing, "closed_batch_id")}
                merger = merger.when_matched_update(
                    updates, predicate=f"s.{ACTION_COLUMN} = 'close'"
                ).when_not_matched_insert(
                    {f.name: f"s.{f.name}" for f in self.schema},
                    predicate=f"s.{ACTION_COLUMN} = 'insert'",
                )
            metrics: dict[str, Any] = merger.execute()
        except Exception as exc:
            raise self.failure(f"cannot commit batch {last}", exc) from None
        return metrics


def current_source(plan: BatchPlan, changes: pa.Table, schema: pa.Schema) -> pa.Table:
    """The MERGE source of the current table: the rows to upsert, then the keys to delete."""
    nullable = pa.schema([f.with_nullable(True) for f in schema])
    upserts = changes.select(schema.names).take(plan.upserts)
    upserts = upserts.cast(schema, safe=False).cast(nullable)
    n = plan.deletes.num_rows
    deletes: dict[str, Any] = {f.name: pa.nulls(n, f.type) for f in nullable}
    for name in KEY_COLUMNS:
        deletes[name] = plan.deletes.column(name)
    # Non-null columns of a delete row get placeholders; only its key is compared.
    deletes["batch_id"] = pa.array(np.zeros(n, np.int64), schema.field("batch_id").type)
    both = pa.concat_tables([upserts, _table(deletes, nullable)])
    actions = np.repeat(np.array(["upsert", "delete"]), [upserts.num_rows, n])
    return both.append_column(ACTION_COLUMN, pa.array(actions, pa.string()))


def history_source(plan: BatchPlan, changes: pa.Table, schema: pa.Schema, last: int) -> pa.Table:
    """The MERGE source of the history table: versions closed, then new versions."""
    nullable = pa.schema([f.with_nullable(True) for f in schema])
    row_names = [
        f.name
        for f in schema
        if f.name not in {"topic", "partition", "session", "row_id"}
        and not f.name.startswith(("valid_", "is_", "closed_"))
        and f.name != "batch_id"
    ]
    versions = plan.versions
    opened = changes.take(versions.column("index"))
    # Where versions end needs three columns, not the row data.
    ends = changes.select(["offset", "kafka_ts", "batch_id"])
    # A null ``closed_at`` (the version is open) takes a row of nulls.
    end_rows = ends.take(versions.column("closed_at"))
    new: dict[str, Any] = {c: opened.column(c) for c in ("topic", "partition", "session")}
    new["row_id"] = opened.column("row_id")
    for name in row_names:
        new[name] = opened.column(name)
    new.update(
        valid_from_offset=opened.column("offset"),
        valid_from_ts=opened.column("kafka_ts"),
        valid_to_offset=end_rows.column("offset"),
        valid_to_ts=end_rows.column("kafka_ts"),
        is_current=pc.is_null(versions.column("closed_at")),
        closed_by=versions.column("closed_by"),
        batch_id=opened.column("batch_id"),
        closed_batch_id=end_rows.column("batch_id"),
    )
    closes = plan.closes
    n = closes.num_rows
    closing = ends.take(closes.column("index"))
    old: dict[str, Any] = {f.name: pa.nulls(n, f.type) for f in nullable}
    for name in KEY_COLUMNS:
        old[name] = closes.column(name)
    old.update(
        valid_to_offset=closing.column("offset"),
        valid_to_ts=closing.column("kafka_ts"),
        is_current=pa.array(np.zeros(n, np.bool_), pa.bool_()),
        closed_by=closes.column("closed_by"),
        closed_batch_id=pa.array(np.full(n, last, np.int64), pa.int64()),
    )
    both = pa.concat_tables([_table(old, nullable), _table(new, nullable)])
    actions = np.repeat(np.array(["close", "insert"]), [n, versions.num_rows])
    return both.append_column(ACTION_COLUMN, pa.array(actions, pa.string()))


def _table(columns: Mapping[str, Any], schema: pa.Schema) -> pa.Table:
    arrays = []
    for f in schema:
        col = columns[f.name]
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        arrays.append(col.cast(f.type, safe=False))
    return pa.Table.from_arrays(arrays, schema=schema)


def offset_ranges(changes: pa.Table) -> str:
    """``{"topic/partition": [first, last]}`` offsets of the change rows, as JSON."""
    if changes.num_rows == 0:
        return "{}"
    grouped = changes.group_by(["topic", "partition"]).aggregate(
        [("offset", "min"), ("offset", "max")]
    )
    ranges = {
        f"{t}/{p}": [lo, hi]
        for t, p, lo, hi in zip(
            grouped.column("topic").to_pylist(),
            grouped.column("partition").to_pylist(),
            grouped.column("offset_min").to_pylist(),
            grouped.column("offset_max").to_pylist(),
            strict=True,
        )
    }
    return json.dumps(dict(sorted(ranges.items())), separators=(",", ":"))


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def query_dataset(path: str, storage_options: Mapping[str, str] | None = None) -> Any:
    """A session table as a ``pyarrow.dataset.Dataset`` that DuckDB can filter.

    deltalake's MERGE writes string columns as Arrow ``string_view``; a dataset declaring them
    ``string`` (``DeltaTable.to_pyarrow_dataset()``) fails on any filter DuckDB pushes into a
    string column. This one declares the data files' string columns as ``string_view``
    (``topic``, the partition column, stays ``string``).
    """
    from deltalake import DeltaTable

    loc = sfs.resolve(path, storage_options)
    table = DeltaTable(loc.delta_uri(), storage_options=loc.storage_options())
    plain = pa.schema(table.schema().to_arrow())  # what to_pyarrow_dataset declares
    partitions = set(table.metadata().partition_columns)
    schema = pa.schema(
        [
            f.with_type(pa.string_view())
            if pa.types.is_string(f.type) and f.name not in partitions
            else f
            for f in plain
        ]
    )
    return delta_dataset(table, loc, schema)
