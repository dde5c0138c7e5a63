"""The session tables seen by the operations tools: restore for a repair, status for inspect.

``inorder repair`` deletes change-log rows from clean restart offsets on; the tables hold the
same rows, so :func:`restore_tables` rolls each one back to its last version holding only
batches before the first rolled-back one, and the next run catches it up from the repaired
change log (:mod:`inorder.sessions.tables_writer`). ``inorder inspect`` shows each table's
newest commits and the change-log offsets they hold (:func:`table_status`), read from the
commit metadata every table commit carries (:mod:`inorder.sessions.tables_delta`).

Iceberg tables (``tables.format = "iceberg"``) are rolled back to the snapshot of their last
commit holding only batches before the first rolled-back one (their lineage then names the
batch they hold, :mod:`inorder.sessions.tables_iceberg`); a table with no such commit is
emptied by a commit naming batch -1.

Nothing here creates a table: a table that does not exist is skipped.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from inorder.sessions.tables_delta import (
    BATCH_KEY,
    FIRST_BATCH_KEY,
    OFFSETS_KEY,
)
from inorder.sessions.tables_iceberg import IcebergTableOutput, snapshot_commits
from inorder.sessions.tables_writer import (
    SessionTablesWriter,
    TableOutput,
    TableOutputs,
    check_tables,
)


def ops_writer(pipeline: Any) -> SessionTablesWriter | None:
    """The table writer of a pipeline with ``[tables]`` (unchecked: nothing is created).

    The pipeline's sink must be bound to its checkpoint's owner id for the tables'
    transaction versions (:meth:`DeltaTableOutput.committed_batch`) to be found.
    """
    tables: TableOutputs | None = getattr(pipeline, "tables", None)
    if tables is None:
        return None
    check_tables(pipeline.processor, tables)
    return SessionTablesWriter(pipeline.processor, pipeline.sink, tables)


@dataclass(frozen=True)
class TableRestore:
    """What restoring one table to before a batch does (or did)."""

    table: str
    """``current`` or ``history``."""
    path: str
    holds: int | None
    """The last batch the table holds now (``None``: no commit of this pipeline)."""
    restored_to: int
    """The last batch it holds after the restore (-1: none)."""
    version: int
    """The Delta version (Iceberg: the snapshot id) it is restored to; -1 for an Iceberg table
    emptied."""
    format: str = "delta"

    @property
    def restore_to(self) -> str:
        """Where the table goes back to, for humans."""
        if self.format != "iceberg":
            return f"version {self.version}"
        return "empty" if self.version < 0 else f"snapshot {self.version}"

    @property
    def needed(self) -> bool:
        """Whether the table holds a batch that is rolled back."""
        return self.holds is not None and self.holds > self.restored_to

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return asdict(self)


def _restore_point(table: TableOutput, first_rolled_back: int) -> TableRestore:
    version, kept = 0, -1  # none: back to the table's creation
    if isinstance(table, IcebergTableOutput):
        version = -1
        for snap, props in table.commits():  # newest first
            if int(props[BATCH_KEY]) < first_rolled_back:
                version, kept = int(snap.snapshot_id), int(props[BATCH_KEY])
                break
    else:
        for entry in table.open().history():  # newest first
            batch = entry.get(BATCH_KEY)
            if batch is not None and int(batch) < first_rolled_back:
                version, kept = int(entry["version"]), int(batch)
                break
    committed = table.committed_batch()
    if committed is not None and committed < first_rolled_back:
        kept = committed  # already there (a repair applied twice): left alone
    kind = "iceberg" if isinstance(table, IcebergTableOutput) else "delta"
    return TableRestore(table.kind, table.path, committed, kept, version, kind)


def restore_plan(writer: SessionTablesWriter, first_rolled_back: int) -> list[TableRestore]:
    """Per existing table: what :func:`restore_tables` would do (nothing is changed)."""
    return [_restore_point(t, first_rolled_back) for t in writer.outputs if t.exists()]


def restore_tables(writer: SessionTablesWriter, first_rolled_back: int) -> list[int]:
    """Roll each table back to before change-log batch ``first_rolled_back``.

    Each table is restored (deltalake ``restore``) to its last version holding only batches
    before ``first_rolled_back`` (its creation if none), then a commit with no rows sets its
    transaction version back to the last batch it holds, so the next run catches it up from
    the change log. Returns the batch each existing table holds now (-1: none); a table
    already there is left alone (a repair applied twice changes nothing). It needs the
    restored version's files: run it before a vacuum removes them.
    """
    from deltalake import CommitProperties, Transaction, write_deltalake

    kept_batches = []
    for point, table in zip(
        restore_plan(writer, first_rolled_back),
        [t for t in writer.outputs if t.exists()],
        strict=True,
    ):
        kept_batches.append(point.restored_to)
        if not point.needed:
            continue
        if isinstance(table, IcebergTableOutput):
            _roll_back(table, point)
            continue
        try:
            delta = table.open()
            delta.restore(point.version)
            write_deltalake(
                delta,
                pa.Table.from_pylist([], schema=table.schema),
                mode="append",
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(table.app_id, point.restored_to)],
                    custom_metadata={BATCH_KEY: str(point.restored_to)},
                ),
            )
        except Exception as exc:
            raise table.failure(f"cannot restore version {point.version}", exc) from None
    writer.forget()
    return kept_batches


def _roll_back(table: IcebergTableOutput, point: TableRestore) -> None:
    """Make the Iceberg table's current snapshot the one of ``point`` (emptied: -1)."""
    if point.version < 0:
        table.clear(point.restored_to)  # no commit to go back to
        return
    try:
        table.open().manage_snapshots().rollback_to_snapshot(point.version).commit()
    except Exception as exc:
        raise table.failure(f"cannot roll back to snapshot {point.version}", exc) from None


def table_status(writer: SessionTablesWriter, limit: int = 3) -> list[dict[str, Any]]:
    """Per table: the last batch it holds and its newest ``limit`` commits with their offsets.

    Read from the commit metadata alone (``inorder.batch``, ``inorder.first_batch``,
    ``inorder.offsets``: per ``topic/partition`` the first and last change-log offset the
    commit applied). A table that does not exist is shown as such.
    """
    out: list[dict[str, Any]] = []
    for table in writer.outputs:
        doc: dict[str, Any] = {"table": table.kind, "path": table.path, "exists": table.exists()}
        out.append(doc)
        if not doc["exists"]:
            continue
        if isinstance(table, IcebergTableOutput):
            doc["format"] = "iceberg"
            doc.update(snapshot_commits(table, limit))
            continue
        delta = table.open()
        doc["version"] = int(delta.version())
        commits: list[dict[str, Any]] = []
        doc["last_batch"] = None
        for entry in delta.history():  # newest first
            batch = entry.get(BATCH_KEY)
            if batch is None:
                continue
            if doc["last_batch"] is None:
                doc["last_batch"] = int(batch)
            if len(commits) < limit:
                first = entry.get(FIRST_BATCH_KEY)
                offsets = entry.get(OFFSETS_KEY)
                commits.append(
                    {
                        "version": int(entry["version"]),
                        "batch": int(batch),
                        "first_batch": None if first is None else int(first),
                        "offsets": {} if offsets is None else json.loads(offsets),
                        "timestamp": entry.get("timestamp"),
                    }
                )
            else:
                break
        doc["commits"] = commits
    return out


def format_table_status(tables: list[dict[str, Any]], full: bool = False) -> list[str]:
    """Human lines for :func:`table_status` (``full``: every offset range of a commit, not
    a summary past :data:`~inorder.listing.RANGES_LISTED` topic-partitions)."""
    from inorder.listing import ranges_text

    lines = []
    for t in tables:
        if not t["exists"]:
            lines.append(f"{t['table']} table {t['path']}: not created yet")
            continue
        version = "snapshot" if t.get("format") == "iceberg" else "version"
        lines.append(
            f"{t['table']} table {t['path']}: {version} {t['version']}, holds change-log batches "
            f"through {t['last_batch'] if t['last_batch'] is not None else 'none'}"
        )
        for c in t["commits"]:
            batches = (
                f"batch {c['batch']}"
                if c["first_batch"] in (None, c["batch"])
                else f"batches {c['first_batch']}..{c['batch']}"
            )
            offsets = ranges_text(c["offsets"], lambda tp, r: f"{tp} {r[0]}..{r[1]}", full)
            lines.append(f"  {version} {c['version']}: {batches}  {offsets or '(no rows)'}")
    return lines
