"""The session-table check compares sessions bucket by bucket, with the same result as one.

On the real pipeline run of ``test_tables_validate`` (simulated sessions, local broker,
Spark), and on copies of its tables damaged by real Delta writes in sessions outside the
first bucket: the check with a forced handful of buckets reports exactly what it reports in
one bucket (counts, the differences shown and their order, notes), and each bucket holds
sessions no other bucket holds. A change log committed batch by batch without Spark covers
batches that change nothing, asked of every bucket.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Transaction
from tests.integration.test_materializer import SCHEMA, ChangeLog, commit
from tests.integration.test_tables_validate import (
    TablesRun,
    by_kind,
    fake_commit,
    tables_run,  # noqa: F401  (its pipeline run)
    validate_cli,
)

from inorder.sessions import SessionTables, tables_check, tables_check_rows
from inorder.sessions.tables_check import TablesCheck, check_tables_against_change_log
from inorder.sessions.tables_check_spill import shard_of
from inorder.sessions.tables_delta import BATCH_KEY
from inorder.sessions.tables_writer import SessionTablesWriter, TableOutputs
from inorder.sinks.delta import DeltaSink

BUCKETS = 5


def sessions_per_bucket(monkeypatch: pytest.MonkeyPatch) -> list[set[tuple[str, str]]]:
    """Filled with the sessions of the table rows each bucket compares (as they come)."""
    seen: list[set[tuple[str, str]]] = []
    compare = tables_check.compare_bucket

    def counting(found: Any, data: pa.Table, *args: Any) -> None:
        seen.append(set(zip(data["topic"].to_pylist(), data["session"].to_pylist(), strict=True)))
        compare(found, data, *args)

    monkeypatch.setattr(tables_check, "compare_bucket", counting)
    return seen


def same_in_buckets(check: TablesCheck, writer: SessionTablesWriter) -> None:
    """``check`` (made in one bucket) is what the default and forced buckets give, with the
    buckets that match settled in Arrow or every bucket compared in Python."""
    whole = check.to_json()
    assert check_tables_against_change_log(writer).to_json() == whole
    assert check_tables_against_change_log(writer, buckets=BUCKETS).to_json() == whole
    assert check_tables_against_change_log(writer, bucket_rows=50).to_json() == whole
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tables_check_rows, "matches", lambda *args: None)
        assert check_tables_against_change_log(writer, buckets=BUCKETS).to_json() == whole


def settled_in_arrow(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Filled, bucket by bucket and table by table, with whether Arrow settled it."""
    settled: list[bool] = []
    matches = tables_check_rows.matches

    def counting(*args: Any) -> tuple[int, int] | None:
        found = matches(*args)
        settled.append(found is not None)
        return found

    monkeypatch.setattr(tables_check_rows, "matches", counting)
    return settled


def bucket(topic: str, session: str) -> int:
    return int(shard_of(pa.array([topic]), pa.array([session]), BUCKETS)[0])


def test_buckets_hold_distinct_sessions_and_check_the_same(
    tables_run: TablesRun,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, outputs = tables_run.copy_tables("buckets")
    writer = tables_run.writer(outputs)
    settled = settled_in_arrow(monkeypatch)
    whole = check_tables_against_change_log(writer, buckets=1)
    assert whole.ok, "\n".join(whole.lines())
    assert settled == [True, True], "a matching table is settled without Python rows"
    seen = sessions_per_bucket(monkeypatch)
    assert check_tables_against_change_log(writer, buckets=BUCKETS).to_json() == whole.to_json()
    # Two tables per bucket, several buckets holding rows, no session in two buckets.
    assert len(seen) == 2 * BUCKETS
    current = seen[0::2]
    assert sum(bool(s) for s in current) >= 2, [len(s) for s in current]
    assert sum(len(s) for s in current) == len(set().union(*current))
    for i, sessions in enumerate(current):
        assert {bucket(*s) for s in sessions} <= {i}


def test_damage_in_later_buckets_is_found_as_in_one(
    tables_run: TablesRun,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, outputs = tables_run.copy_tables("later")
    assert outputs.current is not None and outputs.history is not None
    rows = DeltaTable(outputs.current).to_pyarrow_table().to_pylist()
    later = sorted(
        (r for r in rows if bucket(r["topic"], r["session"]) > 0),
        key=lambda r: (r["session"], r["row_id"]),
    )
    # More damaged rows than a check shows, spread over the later buckets.
    picked = later[:: max(1, len(later) // 11)][:11]
    gone, altered = picked[:5], picked[5:]
    assert len(altered) == 6
    assert len({bucket(r["topic"], r["session"]) for r in gone + altered}) >= 2
    current = DeltaTable(outputs.current)
    for row in gone:
        current.delete(f"session = '{row['session']}' AND row_id = '{row['row_id']}'")
    for row in altered:
        DeltaTable(outputs.current).update(
            {"row": "'{\"tampered\": true}'"},
            predicate=f"session = '{row['session']}' AND row_id = '{row['row_id']}'",
        )
    history = DeltaTable(outputs.history)
    closed = [r for r in history.to_pyarrow_table().to_pylist() if not r["is_current"]]
    # A closed version of the last bucket that has some.
    last = max(bucket(r["topic"], r["session"]) for r in closed)
    assert last > 0
    lost = min(
        (r for r in closed if bucket(r["topic"], r["session"]) == last),
        key=lambda r: (r["session"], r["row_id"], r["valid_from_offset"]),
    )
    history.delete(
        f"session = '{lost['session']}' AND row_id = '{lost['row_id']}' "
        f"AND valid_from_offset = {lost['valid_from_offset']}"
    )

    writer = tables_run.writer(outputs)
    settled = settled_in_arrow(monkeypatch)
    check_tables_against_change_log(writer, buckets=BUCKETS)
    assert not all(settled) and any(settled), settled  # damaged buckets only in Python
    whole = check_tables_against_change_log(writer, buckets=1)
    cur, hist = by_kind(whole)["current"], by_kind(whole)["history"]
    assert (cur.missing, cur.different, cur.extra) == (5, 6, 0), cur.differences
    assert len(cur.differences) == 8 and cur.differences[0].startswith("missing ")
    assert hist.problems == {"versions missing": 1}, hist.differences
    key = (lost["topic"], lost["session"], lost["row_id"])
    assert (
        f"missing version of {key} from offset {lost['valid_from_offset']}" in (hist.differences[0])
    )
    same_in_buckets(whole, writer)

    code, doc = validate_cli(config, tmp_path / "later.toml", "--tables-bucket-rows", "100")
    assert code == 1 and doc["tables"] == whole.to_json()
    # Two processes (the table check in a worker): the report of one.
    alone = validate_cli(config, tmp_path / "later.toml", "--jobs", "1")
    assert validate_cli(config, tmp_path / "later.toml", "--jobs", "2") == alone
    assert alone[1]["tables"] == whole.to_json()


def test_batches_that_change_nothing_are_asked_of_every_bucket(tmp_path: Path) -> None:
    """Skipped batches and a commit claiming a batch it did not apply, as in one bucket."""
    changes = DeltaSink(str(tmp_path / "changes"), partition_by=["topic"])
    changes.bind("owner-1")
    changes.check(SCHEMA)
    outputs = TableOutputs(current=str(tmp_path / "current"), history=str(tmp_path / "history"))
    writer = SessionTablesWriter(SessionTables(), changes, outputs)
    writer.check()
    log = ChangeLog(seed=5, sessions=12)
    for b in range(5):
        rows = log.batch(b, messages=30)
        if b == 2:  # ends only: no table changes (end = "keep"), no commit
            for name, value in (
                ("op", pa.array(["end"] * rows.num_rows)),
                ("row", pa.nulls(rows.num_rows, pa.string())),
                ("row_id", pa.nulls(rows.num_rows, pa.string())),
            ):
                rows = rows.set_column(rows.schema.get_field_index(name), name, value)
        commit(changes, b, rows)
        writer.after_commit(b)
    commit(changes, 5, log.batch(5, messages=30))
    whole = check_tables_against_change_log(writer, buckets=1)
    assert whole.ok and [t.pending for t in whole.tables] == [[5, 5], [5, 5]]
    same_in_buckets(whole, writer)

    # Both tables said to hold batch 5 without applying it.
    for table in writer.outputs:
        fake_commit(table.open(), table.schema, {BATCH_KEY: "5"}, Transaction(table.app_id, 5))
    whole = check_tables_against_change_log(writer, buckets=1)
    for t in whole.tables:
        assert t.problems["batch ranges"] == 1, t.differences
        assert t.differences[0].startswith("batches 5..5 change this table but no commit")
    same_in_buckets(whole, writer)
