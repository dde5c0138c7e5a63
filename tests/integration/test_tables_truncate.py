"""A truncate in the change log closes history versions as ``truncate``, not ``snapshot``.

Reproduced before the change: the tables refused a change log holding a ``truncate`` row
(``unknown op``), and a Debezium truncate (``op = "t"``) can only be written today as an empty
snapshot, whose versions close as ``snapshot``: a history reader could not tell a source
emptying its table from a producer re-listing it. A ``truncate`` change row empties the
session like a snapshot's ``clear`` (current table, rebuild, materializations, the tables
check) and closes every open version as ``truncate``. Real Delta tables read back with
deltalake, real Iceberg tables (SQL catalog) read back with pyiceberg.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
from deltalake import DeltaTable
from tests.integration.test_materializer import SCHEMA, commit

from inorder.sessions import SessionTables, rebuild_tables
from inorder.sessions.rebuild import ordered_changes, rebuild_tables_duckdb
from inorder.sessions.table_book import ChangeRow, TableBook
from inorder.sessions.tables_check import check_tables_against_change_log
from inorder.sessions.tables_iceberg import IcebergTableOutput
from inorder.sessions.tables_writer import SessionTablesWriter, TableOutputs
from inorder.sinks.delta import DeltaSink

EPOCH = datetime(2026, 11, 1, tzinfo=UTC)

#: ``(batch, offset, session, seq, op, row_id, value)``: one session of site ``t`` (partition 0)
#: truncated after an update, another re-listed by a snapshot.
CHANGES = [
    (0, 0, "s1", 0, "clear", None, None),
    (0, 0, "s1", 0, "insert", "a", 1),
    (0, 0, "s1", 0, "insert", "b", 1),
    (0, 1, "s2", 0, "clear", None, None),
    (0, 1, "s2", 0, "insert", "x", 1),
    (1, 2, "s1", 1, "update", "a", 2),
    (1, 3, "s1", 0, "truncate", None, None),
    (1, 4, "s1", 1, "insert", "c", 1),
    (1, 5, "s2", 0, "clear", None, None),
    (1, 5, "s2", 0, "insert", "y", 1),
]

#: What ended each version: ``(session, row_id, valid_from_offset) -> (closed_by, to)``.
CLOSED = {
    ("s1", "a", 0): ("update", 2),
    ("s1", "a", 2): ("truncate", 3),
    ("s1", "b", 0): ("truncate", 3),
    ("s1", "c", 4): (None, None),
    ("s2", "x", 1): ("snapshot", 5),
    ("s2", "y", 5): (None, None),
}


def _batch(batch: int) -> pa.Table:
    rows = [
        {
            "topic": "t",
            "partition": 0,
            "offset": offset,
            "kafka_ts": EPOCH + timedelta(seconds=offset),
            "session": session,
            "seq": seq,
            "op": op,
            "row_id": rid,
            "row": None if rid is None else msgspec.json.encode({"id": rid, "v": v}).decode(),
            "batch_id": batch,
        }
        for b, offset, session, seq, op, rid, v in CHANGES
        if b == batch
    ]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _follow(tmp_path: Path, outputs: TableOutputs) -> SessionTablesWriter:
    """Commit the change log batch by batch; the table writer follows each commit."""
    changes = DeltaSink(str(tmp_path / "changes"), partition_by=["topic"])
    changes.check(SCHEMA)
    writer = SessionTablesWriter(SessionTables(), changes, outputs)
    writer.check()
    for b in (0, 1):
        commit(changes, b, _batch(b))
        writer.after_commit(b)
    return writer


def _current(rows: pa.Table) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in rows.to_pylist():
        out.setdefault(r["session"], set()).add(r["row_id"])
    return out


def _closed(history: pa.Table) -> dict[tuple[str, str, int], tuple[Any, Any]]:
    return {
        (r["session"], r["row_id"], r["valid_from_offset"]): (r["closed_by"], r["valid_to_offset"])
        for r in history.to_pylist()
    }


def test_the_change_log_readers_empty_a_truncated_session() -> None:
    log = pa.concat_tables([_batch(0), _batch(1)])
    expected = {("t", "s1"): {"c": {"id": "c", "v": 1}}, ("t", "s2"): {"y": {"id": "y", "v": 1}}}
    assert rebuild_tables(log) == expected
    assert rebuild_tables_duckdb(log) == expected
    truncated = log.slice(0, 7)  # up to the truncate: s1 is empty, not ended
    assert rebuild_tables(truncated)[("t", "s1")] == {}
    assert rebuild_tables_duckdb(truncated)[("t", "s1")] == {}
    # Materializations: the session goes on, empty (a reset or an end would drop it).
    book = TableBook()
    fields = ChangeRow.__struct_fields__
    rows = [ChangeRow(**{f: r[f] for f in fields}) for r in ordered_changes(truncated).to_pylist()]
    assert book.apply(rows) == []
    assert book.tables[("t", "s1")].rows == {}


def test_delta_history_closes_versions_as_truncate(tmp_path: Path) -> None:
    outputs = TableOutputs(current=str(tmp_path / "current"), history=str(tmp_path / "history"))
    writer = _follow(tmp_path, outputs)
    current = DeltaTable(str(tmp_path / "current")).to_pyarrow_table()
    assert _current(current) == {"s1": {"c"}, "s2": {"y"}}
    history = DeltaTable(str(tmp_path / "history")).to_pyarrow_table()
    assert _closed(history) == CLOSED
    checked = check_tables_against_change_log(writer)
    assert checked.ok, checked.lines()


def test_iceberg_history_closes_versions_as_truncate(tmp_path: Path) -> None:
    outputs = TableOutputs(
        current="sessions.current",
        history="sessions.history",
        format="iceberg",
        warehouse=str(tmp_path / "warehouse"),
    )
    writer = _follow(tmp_path, outputs)
    tables = {}
    for table in writer.outputs:
        assert isinstance(table, IcebergTableOutput)
        tables[table.kind] = table.open().scan().to_arrow()  # pyiceberg's own read
    assert _current(tables["current"]) == {"s1": {"c"}, "s2": {"y"}}
    assert _closed(tables["history"]) == CLOSED
    checked = check_tables_against_change_log(writer)
    assert checked.ok, checked.lines()
