"""Checking the session tables against the change log they follow (``inorder validate``).

Per existing table (:func:`check_tables_against_change_log`):

* **Commits** on the lineage of the table's version (a ``RESTORE`` to version ``v`` drops
  the commits after ``v``) must apply the batches ``inorder.first_batch``..``inorder.batch``
  in order from batch 0 without overlap, skipping only batches that change nothing in the
  table (they make no commit); ``inorder.offsets`` must be the change rows' offset range per
  ``topic/partition``; a restore's last commit and the transaction version name the last batch.
* **Rows**: the current table and the history's open versions must be
  :func:`~inorder.sessions.rebuild.rebuild_tables` of the change rows of the batches the
  table holds; every history version an ``insert``/``update`` change row with its data, the
  versions of a row without overlap, ``is_current`` exactly those without an end.

A table behind the change log is not a discrepancy: the next run catches it up (docs/tables.md).

Memory: one bucket of sessions. The change log and each table are read once, in record
batches, and spilled to local files by session (:mod:`inorder.sessions.tables_check_spill`);
the rows are then compared bucket by bucket (:mod:`inorder.sessions.tables_check_rows`),
and the commits checked on the per-batch offset ranges gathered while spilling. Whether
skipped batches change a table is answered bucket by bucket too: the commits are walked
once to ask, and again with the answers.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.errors import InorderError
from inorder.sessions.rebuild import REQUIRED_COLUMNS
from inorder.sessions.tables_check_iceberg import iceberg_commits, iceberg_rows, walk_iceberg
from inorder.sessions.tables_check_log import (
    BatchOffsets,
    ChangeLogView,
    CommitLog,
    RowFormat,
    TableCheck,
    batch_commit,
    gap,
)
from inorder.sessions.tables_check_rows import RowFindings, compare_bucket
from inorder.sessions.tables_check_spill import (
    BUCKET_ROWS,
    POSITION,
    SHARDS,
    Spill,
    bucket_shards,
    change_log_batches,
    scan,
)
from inorder.sessions.tables_delta import BATCH_KEY, FIRST_BATCH_KEY, OFFSETS_KEY, DeltaTableOutput
from inorder.sessions.tables_iceberg import IcebergTableOutput
from inorder.sessions.tables_writer import SessionTablesWriter
from inorder.sinks.delta_read import delta_dataset

#: Commits that change no row: expected in a table's history.
_HARMLESS = frozenset({"CREATE TABLE", "OPTIMIZE", "VACUUM START", "VACUUM END"})


@dataclass
class TablesCheck:
    """The session tables checked against the change log through ``change_log_last_batch``
    (its last committed batch, -1: none)."""

    change_log_last_batch: int
    tables: list[TableCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every table matches the change log."""
        return all(t.ok for t in self.tables)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return asdict(self) | {"ok": self.ok, "tables": [t.to_json() for t in self.tables]}

    def lines(self) -> list[str]:
        """Human-readable report."""
        if not self.tables:
            return list(self.notes)
        bad = sum(not t.ok for t in self.tables)
        found = f"{bad} with discrepancies" if bad else "no discrepancy"
        summary = (
            f"{len(self.tables)} session table(s) checked against the change log through batch "
            f"{self.change_log_last_batch}, {found}"
        )
        return [*(line for t in self.tables for line in t.lines()), *self.notes, summary]


def check_pipeline_tables(
    pipeline: Any, owner: str | None = None, bucket_rows: int | None = None
) -> TablesCheck | None:
    """The session tables of ``pipeline`` (``[tables]``) checked against its change log.

    ``None`` without tables. ``owner`` is the checkpoint id the pipeline ran with: with it
    the tables' transaction versions are found and checked too. Nothing is created.
    ``bucket_rows``: see :func:`check_tables_against_change_log` (``None``: its default).
    """
    from inorder.sessions.tables_ops import ops_writer

    tables = getattr(pipeline, "tables", None)
    if tables is None:
        return None
    if owner and getattr(pipeline.sink, "owner", None) is None:
        pipeline.sink.bind(owner)  # the tables' transactions are kept under the owner's id
    writer = ops_writer(pipeline)
    if writer is None:
        return None
    return check_tables_against_change_log(writer, bucket_rows=bucket_rows or BUCKET_ROWS)


def check_tables_against_change_log(
    writer: SessionTablesWriter,
    changes: pa.Table | None = None,
    last_batch: int | None = None,
    *,
    buckets: int | None = None,
    bucket_rows: int = BUCKET_ROWS,
) -> TablesCheck:
    """Check each existing table of ``writer`` against the change log (module docstring).

    ``changes``: the change rows (default: read from the writer's change log up to
    ``last_batch``, default its last committed batch); rows of later batches are ignored.
    Sessions are compared in buckets of about ``bucket_rows`` rows (change rows and table
    rows); ``buckets`` forces that many buckets of sessions instead.
    """
    if last_batch is None:
        committed = getattr(writer.changes, "last_committed_batch", lambda: None)()
        last_batch = -1 if committed is None else int(committed)
    if changes is not None:
        changes = changes.filter(pc.less_equal(changes.column("batch_id"), last_batch))
        rows: Iterable[pa.RecordBatch] = changes.to_batches()
    else:
        rows = change_log_batches(writer.changes, last_batch) if last_batch >= 0 else ()
    types = writer.outputs[0].schema
    with tempfile.TemporaryDirectory(prefix="inorder-validate-") as folder:
        spill = Spill(folder, buckets or SHARDS)
        offsets, seen = BatchOffsets(), _Seen(types)
        sizes = spill.write("changes", seen.rows(rows, offsets))
        offsets.done()
        fmt = seen.format(sum(sizes) > 0)
        asking = CommitLog(last_batch, offsets)
        reads = [_read(t, f"table-{i}", spill, asking) for i, t in enumerate(writer.outputs)]
        for read in reads:
            sizes = [a + b for a, b in zip(sizes, read.spilled, strict=True)]
        groups = (
            [[s] for s in range(spill.shards)] if buckets else bucket_shards(sizes, bucket_rows)
        )
        answers = dict.fromkeys(asking.asked, True)
        for shards in groups:
            view = ChangeLogView(spill.read("changes", shards), last_batch, writer.end, fmt)
            for question in sorted(answers):
                answers[question] = answers[question] and view.unchanged(*question)
            for read in reads:
                if read.through is not None:
                    data = spill.read(read.name, shards)
                    if data is None:
                        data = _empty(read.table.schema)
                    compare_bucket(read.found, data, view, read.through, read.history)
            pa.default_memory_pool().release_unused()  # see Spill.write
    log = CommitLog(last_batch, offsets, answers)
    return TablesCheck(last_batch, [_check_table(read, log) for read in reads])


class _Seen:
    """The change rows as they are spilled: checked to be a change log, row data cast to the
    tables' types, offsets gathered; the row format taken from the first."""

    def __init__(self, types: pa.Schema) -> None:
        self.types = types
        self._format: RowFormat | None = None

    def rows(
        self, batches: Iterable[pa.RecordBatch], offsets: BatchOffsets
    ) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if self._format is None:
                missing = [c for c in REQUIRED_COLUMNS if c not in batch.schema.names]
                if missing:
                    raise InorderError(
                        f"not a session change log: missing column(s) {', '.join(missing)}"
                    )
                self._format = RowFormat(batch.schema, True, self.types)
            piece = self._format.cast(pa.Table.from_batches([batch]))
            offsets.add(piece)
            yield from piece.to_batches()

    def format(self, any_rows: bool) -> RowFormat:
        """The change log's row format (none without rows)."""
        if self._format is None or not any_rows:
            return RowFormat(None, False, self.types)
        return self._format


@dataclass
class _Read:
    """What was read of one table before its rows are compared: enough to check its commits
    again (:func:`_check_table`) and its rows spilled (``name``), or the error that stopped
    the reading, where it stopped (``stage``: 0 before its commits were walked, 1 before its
    transaction version was read, 2 after)."""

    table: DeltaTableOutput | IcebergTableOutput
    name: str
    spilled: list[int]
    exists: bool = True
    version: int | None = None
    commits: list[Any] | None = None
    txn: int | None = None
    stage: int = 0
    error: Exception | None = None
    through: int | None = None
    found: RowFindings = field(default_factory=RowFindings)

    @property
    def history(self) -> bool:
        return self.table.kind == "history"


def _read(
    table: DeltaTableOutput | IcebergTableOutput, name: str, spill: Spill, log: CommitLog
) -> _Read:
    """Read ``table``'s commits (asking ``log`` what checking them asks) and spill its rows
    as stream ``name``."""
    read = _Read(table, name, [0] * spill.shards)
    scratch = TableCheck(table.kind, table.path)
    try:
        if not table.exists():
            read.exists = False
            log.unchanged(0, log.last, read.history)
            return read
        rows: Iterator[pa.RecordBatch]
        if isinstance(table, DeltaTableOutput):
            delta = table.open()
            read.version = int(delta.version())
            read.commits = [h for h in delta.history() if int(h["version"]) <= read.version]
            walked = _walk(scratch, read.commits, log)
            read.stage = 1
            read.txn = table.committed_batch()
            read.stage = 2
            held = walked if walked is not None else (-1 if read.txn is None else read.txn)
            rows = scan(delta_dataset(delta, table.location))
        else:
            ice, read.version, read.commits = iceberg_commits(table)
            held = walk_iceberg(scratch, read.commits, log)
            read.stage = 2
            rows = iceberg_rows(ice)
        read.spilled = spill.write(read.name, rows, position=True)
    except Exception as exc:
        read.error = exc
        return read
    if held < log.last:
        log.unchanged(held + 1, log.last, read.history)
    read.through = min(held, log.last)
    return read


def _empty(schema: pa.Schema) -> pa.Table:
    return schema.append(pa.field(POSITION, pa.int64())).empty_table()


def _check_table(read: _Read, log: CommitLog) -> TableCheck:
    """The check of one table: its commits walked again with ``log``'s answers, in the order a
    single reading finds things, then its rows' findings."""
    table = read.table
    check = TableCheck(table.kind, table.path)
    history = read.history
    try:
        if not read.exists:
            check.exists = False
            if not log.unchanged(0, log.last, history):
                check.pending = [0, log.last]
            return check
        check.version = read.version
        if read.commits is None:
            raise _stopped(read)
        if isinstance(table, DeltaTableOutput):
            walked = _walk(check, read.commits, log)
            if read.stage < 2:
                raise _stopped(read)
            txn = read.txn
            held = walked if walked is not None else (-1 if txn is None else txn)
            if txn is not None and txn != held:
                check.found(
                    "transaction",
                    f"transaction version {txn} (where the next run resumes), but its commits "
                    f"hold batches through {held}",
                )
        else:
            held = walk_iceberg(check, read.commits, log)
        if read.error is not None:
            raise read.error
        check.last_batch = held
    except Exception as exc:
        check.found("unreadable", f"cannot read the table: {exc}")
        return check
    if held > log.last:
        check.found("ahead", f"holds batches through {held}; the change log ends at {log.last}")
    elif held < log.last and not log.unchanged(held + 1, log.last, history):
        check.pending = [held + 1, log.last]
    read.found.report(check)
    return check


def _stopped(read: _Read) -> Exception:
    """The error that stopped reading the table."""
    assert read.error is not None
    return read.error


def _walk(check: TableCheck, history: list[dict[str, Any]], log: CommitLog) -> int | None:
    """Check the batch commits on the lineage of the table's version; its last batch
    (``None``: no batch commit left in an incomplete log)."""
    entries = sorted(history, key=lambda h: int(h["version"]))
    complete = bool(entries) and int(entries[0]["version"]) == 0
    lineage: list[dict[str, Any]] = []
    for h in entries:
        if h.get("operation") != "RESTORE":
            lineage.append(h)
            continue
        to = (h.get("operationParameters") or {}).get("version")
        if to is None:
            check.notes.append(f"version {h['version']}: restore to an unknown version")
            lineage, complete = [], False
        else:
            lineage = [e for e in lineage if int(e["version"]) <= int(to)]
    if not complete:
        check.notes.append("the table's early commits are not in its log: checked from the first")
    held: int | None = -1 if complete else None
    check.first_batch = 0 if complete else None
    for h in lineage:
        v, batch, op = int(h["version"]), h.get(BATCH_KEY), h.get("operation")
        if batch is None:
            if op not in _HARMLESS:
                check.notes.append(f"version {v}: {op} commit not made by the pipeline")
            continue
        last = int(batch)
        if h.get(FIRST_BATCH_KEY) is None:  # a restore's last commit: where the table is now
            if held is not None and last < held:
                check.found(
                    "batch ranges",
                    f"version {v}: sets the table back to batch {last} while it holds batches "
                    f"through {held} (the next run would apply them twice)",
                )
            elif held is not None:
                gap(check, log, held + 1, last, f"version {v}")
            else:
                check.first_batch = last + 1
            held = last
            continue
        first = int(h[FIRST_BATCH_KEY])
        if held is None:
            held = first - 1
            check.first_batch = first
        held = batch_commit(check, log, f"version {v}", held, (first, last), h.get(OFFSETS_KEY))
    return held
