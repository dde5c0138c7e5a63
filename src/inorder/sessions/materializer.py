"""Writing full materializations of session tables to a second output, exactly once per batch.

After micro-batch ``B``'s change rows are committed, :meth:`Materializer.after_commit` reads
them back from the change log, applies them to the tables it keeps
(:class:`~inorder.sessions.table_book.TableBook`) and writes, as batch ``B`` of its own output:

* every live session's full table when :func:`~inorder.sessions.table_book.due` (reason
  ``periodic``),
* the final table of each session an ``end`` dropped in ``B`` (reason ``end``) and an empty
  table for each session a ``reset`` dropped (reason ``reset``).

The tables come from the change log, never from the engine's state, so this works the same
with every backend. After a restart (or a failed batch) the tables are rebuilt from the last
``periodic`` materialization at or before ``B - 1`` plus the change rows of the batches after
it, so a batch re-run after a crash writes exactly what the first run would have written.
The output is committed by batch id: a re-run of a batch whose materialization is committed
writes nothing (exactly once).

Batch ids here are the change log's (its ``batch_id`` column): a sink renumbered by
``inorder repair`` (:class:`~inorder.sinks.offset_ids.BatchIdOffset`) is read and written
with the shifted ids.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.errors import ConfigError
from inorder.records import BATCH_ID_FIELD, ORIGIN_FIELDS
from inorder.sessions.processor import SessionTables
from inorder.sessions.rebuild import NON_ROW_COLUMNS, ordered_changes
from inorder.sessions.table_book import (
    PERIODIC,
    ChangeRow,
    Materialization,
    SessionTable,
    TableBook,
    due,
)
from inorder.sinks.base import Sink, SinkError

#: Columns of a materialization row in front of the row data, after ``ORIGIN_FIELDS``.
SESSION_FIELDS = (
    pa.field("session", pa.string(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("row_id", pa.string()),
)
REASON_FIELD = pa.field("reason", pa.string(), nullable=False)


def row_fields(processor: SessionTables) -> list[pa.Field]:
    """The row data columns: ``row`` (JSON text), or one column per field of ``row_type``."""
    if processor.row_type is None:
        return [pa.field("row", pa.string())]
    from inorder.schema import output_schema

    changes = output_schema(processor.out_type)
    return [f.with_nullable(True) for f in changes if f.name not in NON_ROW_COLUMNS]


def materialized_schema(processor: SessionTables) -> pa.Schema:
    """Schema of the materialized output of ``processor``'s session tables."""
    return pa.schema(
        [*ORIGIN_FIELDS, *SESSION_FIELDS, *row_fields(processor), REASON_FIELD, BATCH_ID_FIELD]
    )


@dataclass
class MaterializeReport:
    """What one batch's materialization did."""

    batch_id: int
    sessions: int = 0
    rows: int = 0
    committed: bool = False
    rebuilt: bool = False
    """Whether the tables were rebuilt from the outputs first (start, restart, retry)."""
    seconds: float = 0.0


def change_log_of(sink: Sink) -> tuple[Sink, int]:
    """The sink that stores the change log and the offset added to batch ids on the way.

    Unwraps :class:`~inorder.sinks.versioned.VersionedSink` and
    :class:`~inorder.sinks.offset_ids.BatchIdOffset` (both keep the stored sink in ``inner``).
    """
    from inorder.sinks.offset_ids import BatchIdOffset

    offset = 0
    while True:
        if isinstance(sink, BatchIdOffset):
            offset += sink.offset
        inner = getattr(sink, "inner", None)
        if not isinstance(inner, Sink):
            return sink, offset
        sink = inner


class Materializer:
    """Writes full session tables to ``output`` every ``every`` batches and when sessions end.

    ``changes`` is the pipeline's sink (the change log, read back with
    :meth:`~inorder.sinks.base.Sink.read_batches`); ``output`` a Parquet or Delta sink bound
    to the same checkpoint. Driver side; one instance per running pipeline.
    """

    def __init__(self, processor: SessionTables, changes: Sink, output: Sink, every: int) -> None:
        if every < 1:
            raise ConfigError(f"materialize every: must be >= 1 batch, not {every}")
        self.processor = processor
        self.changes, self.batch_offset = change_log_of(changes)
        self.output = output
        self.every = every
        self.schema = materialized_schema(processor)
        self._row_names = [f.name for f in row_fields(processor)]
        self._book: TableBook | None = None
        self._through: int | None = None

    def check(self) -> None:
        """Before the first batch: the output is usable and takes this schema."""
        try:
            self.output.check(self.schema)
        except SinkError as exc:
            raise ConfigError(f"materialized output: {exc}") from None

    # -- one batch ---------------------------------------------------------------------------

    def after_commit(self, batch_id: int) -> MaterializeReport:
        """Materialize checkpoint batch ``batch_id``, whose change rows are committed."""
        started = time.perf_counter()
        b = self.batch_offset + batch_id
        report = MaterializeReport(batch_id=b)
        book, through = self._book, self._through
        # A failure below leaves the book half-applied: rebuild it next time.
        self._book, self._through = None, None
        if book is None or through != b - 1:
            book = self._rebuild(b - 1)
            report.rebuilt = True
        dropped = book.apply(self._change_rows(b, b))
        writes: list[Materialization] = dropped
        if due(b, self.every):
            writes = dropped + list(book.periodic())
        if writes and not self.output.is_committed(b):
            report.sessions = len(writes)
            report.rows, report.committed = self._write(b, writes)
        self._book, self._through = book, b
        report.seconds = time.perf_counter() - started
        return report

    # -- reading -----------------------------------------------------------------------------

    def _change_rows(self, first: int, last: int) -> Iterator[ChangeRow]:
        """Change rows of batches ``first..last``, in application order."""
        if last < first:
            return iter(())
        wanted = [
            "topic",
            "partition",
            "offset",
            "session",
            "seq",
            "op",
            "row_id",
            *self._row_names,
        ]
        table = self.changes.read_batches(first, last, columns=wanted)
        if table.num_rows == 0:
            return iter(())
        return _rows(ordered_changes(table), self._row_names)

    def _rebuild(self, through: int) -> TableBook:
        """Tables as of batch ``through``: last periodic materialization + later changes."""
        book = TableBook()
        base = self._last_periodic(through)
        if base is not None:
            rows = self.output.read_batches(base, base)
            rows = rows.filter(pc.equal(rows.column("reason"), PERIODIC))
            for materialization in _materializations(rows, self._row_names):
                book.load(materialization)
        book.apply(self._change_rows(-1 if base is None else base + 1, through))
        return book

    def _last_periodic(self, through: int) -> int | None:
        if through < 0:
            return None
        marks = self.output.read_batches(0, through, columns=["batch_id", "reason"])
        if marks.num_rows == 0:
            return None
        periodic = marks.filter(pc.equal(marks.column("reason"), PERIODIC))
        if periodic.num_rows == 0:
            return None
        last: int = pc.max(periodic.column("batch_id")).as_py()
        return last

    # -- writing -----------------------------------------------------------------------------

    def _write(self, batch_id: int, writes: Sequence[Materialization]) -> tuple[int, bool]:
        table = self._table(batch_id, writes)
        writer = self.output.open_writer(
            self.schema, batch_id, f"materialize-{uuid.uuid4().hex[:12]}"
        )
        try:
            for batch in table.to_batches(max_chunksize=65536):
                writer.write(batch)
            files = writer.close()
        except BaseException:
            writer.abort()
            raise
        return table.num_rows, self.output.commit(batch_id, files)

    def _table(self, batch_id: int, writes: Sequence[Materialization]) -> pa.Table:
        """Output rows: one per table row, ordered by row id; one null-``row_id`` row for an
        empty table (so a reader sees that the session's table is empty now)."""
        topics: list[str] = []
        partitions: list[int] = []
        offsets: list[int] = []
        sessions: list[str] = []
        seqs: list[int] = []
        row_ids: list[str | None] = []
        rows: list[Any] = []
        reasons: list[str] = []
        for m in writes:
            t = m.table
            ids: list[str | None] = [*sorted(t.rows)] if t.rows else [None]
            n = len(ids)
            topics += [m.topic] * n
            partitions += [t.partition] * n
            offsets += [t.offset] * n
            sessions += [m.session] * n
            seqs += [t.seq] * n
            reasons += [m.reason] * n
            row_ids += ids
            rows += [None if rid is None else t.rows[rid] for rid in ids]
        columns: list[Any] = [topics, partitions, offsets, sessions, seqs, row_ids]
        if len(self._row_names) == 1 and self.processor.row_type is None:
            columns.append(rows)
        else:
            width = len(self._row_names)
            empty = (None,) * width
            tuples = [empty if r is None else r for r in rows]
            columns += [[tup[i] for tup in tuples] for i in range(width)]
        columns += [reasons, [batch_id] * len(topics)]
        arrays = [pa.array(col, type=f.type) for col, f in zip(columns, self.schema, strict=True)]
        return pa.Table.from_arrays(arrays, schema=self.schema)


def _rows(table: pa.Table, row_names: Sequence[str]) -> Iterator[ChangeRow]:
    """Change rows of an ordered change-log table (row data as the change log holds it)."""
    cols = [table.column(c).to_pylist() for c in ("topic", "partition", "offset", "session")]
    cols += [table.column(c).to_pylist() for c in ("seq", "op", "row_id")]
    if len(row_names) == 1 and row_names[0] == "row":
        data: list[Any] = table.column("row").to_pylist()
    else:
        data = list(zip(*(table.column(c).to_pylist() for c in row_names), strict=True))
        if not data:
            data = [()] * table.num_rows
    for topic, partition, offset, session, seq, op, rid, row in zip(*cols, data, strict=True):
        yield ChangeRow(topic, partition, offset, session, seq, op, rid, row)


def _materializations(table: pa.Table, row_names: Sequence[str]) -> Iterator[Materialization]:
    """Materializations read back from the output (inverse of ``Materializer._table``)."""
    grouped: dict[tuple[str, str], Materialization] = {}
    changes = _rows(table.append_column("op", pa.array([""] * table.num_rows)), row_names)
    reasons = table.column("reason").to_pylist()
    for c, reason in zip(changes, reasons, strict=True):
        key = (c.topic, c.session)
        m = grouped.get(key)
        if m is None:
            m = grouped[key] = Materialization(
                c.topic, c.session, SessionTable(c.partition, c.offset, c.seq), reason
            )
        if c.row_id is not None:
            m.table.rows[c.row_id] = c.row
    return iter(grouped.values())


def check_materialization(processor: Any, output: Sink | None, every: int | None) -> None:
    """Raise :class:`ConfigError` unless the materialization settings fit together."""
    if output is None and every is None:
        return
    if not isinstance(processor, SessionTables):
        raise ConfigError(
            "materialized output: only session-table pipelines (processor 'sessions') can "
            f"materialize tables; the processor is {type(processor).__name__}"
        )
    if output is None:
        raise ConfigError("materialize_every is set but there is no materialized output")
    if every is None:
        raise ConfigError("materialized output: materialize_every (N batches) is not set")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"materialize_every: must be an integer >= 1, not {every!r}")


def pipeline_materializer(pipeline: Any) -> Materializer | None:
    """The checked materializer of a pipeline (its sink must be bound), or ``None``."""
    output: Sink | None = getattr(pipeline, "materialized", None)
    every: int | None = getattr(pipeline, "materialize_every", None)
    check_materialization(pipeline.processor, output, every)
    if output is None or every is None:
        return None
    if getattr(pipeline, "initial_state", None) is not None:
        # Seeded tables are in the state but not in this change log, which the tables are
        # rebuilt from.
        raise ConfigError("materialized output: not available with initial_state")
    changes, _ = change_log_of(pipeline.sink)
    if getattr(output, "path", None) == getattr(changes, "path", ""):
        raise ConfigError(
            f"materialized output: {output.describe()} is the change log itself; "
            "give it its own path"
        )
    owner = pipeline.sink.owner
    if owner is not None:
        output.bind(owner)
    materializer = Materializer(pipeline.processor, pipeline.sink, output, every)
    materializer.check()
    return materializer


def read_materialized(
    source: pa.Table | str,
    storage_options: Mapping[str, str] | None = None,
    as_of: int | None = None,
) -> dict[tuple[str, str], MaterializedTable]:
    """The latest materialization of every session, at or before batch ``as_of`` (all: None).

    ``source`` is the materialized output (a Parquet dataset or Delta table, local or
    ``s3://``, read like :func:`~inorder.sessions.rebuild.read_changes`) or its rows as an
    Arrow table. For each ``(topic, session)`` the materialization with the greatest
    ``(batch_id, partition, offset)`` wins: a session's last ``end`` shows its final table,
    a ``reset`` an empty one. Rows are decoded like :func:`~inorder.sessions.rebuild_tables`.
    """
    import msgspec

    from inorder.sessions.rebuild import read_changes

    table = read_changes(source, storage_options)
    if as_of is not None:
        table = table.filter(pc.less_equal(table.column("batch_id"), as_of))
    order = pc.sort_indices(
        table,
        sort_keys=[("batch_id", "ascending"), ("partition", "ascending"), ("offset", "ascending")],
    )
    table = table.take(order)
    row_names = [c for c in table.column_names if c not in _NON_ROW_OUTPUT]
    keys = zip(
        table.column("topic").to_pylist(),
        table.column("session").to_pylist(),
        table.column("batch_id").to_pylist(),
        table.column("partition").to_pylist(),
        table.column("offset").to_pylist(),
        table.column("reason").to_pylist(),
        table.column("seq").to_pylist(),
        table.column("row_id").to_pylist(),
        strict=True,
    )
    if row_names == ["row"]:
        decode = msgspec.json.decode
        rows: list[Any] = [
            None if t is None else decode(t) for t in table.column("row").to_pylist()
        ]
    else:
        rows = table.select(row_names).to_pylist()
    out: dict[tuple[str, str], MaterializedTable] = {}
    for (topic, session, batch_id, part, offset, reason, seq, rid), row in zip(
        keys, rows, strict=True
    ):
        key = (topic, session)
        current = out.get(key)
        if current is None or (current.batch_id, current.offset) != (batch_id, offset):
            current = out[key] = MaterializedTable(batch_id, part, offset, seq, reason, {})
        if rid is not None:
            current.rows[rid] = row
    return out


@dataclass
class MaterializedTable:
    """A session's table as one materialization wrote it."""

    batch_id: int
    partition: int
    offset: int
    seq: int
    reason: str
    rows: dict[str, Any]


#: Output columns that are not row data.
_NON_ROW_OUTPUT = frozenset(
    {"topic", "partition", "offset", "session", "seq", "row_id", "reason", "batch_id"}
)
