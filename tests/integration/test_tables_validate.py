"""``inorder validate`` checks the session tables against the change log they follow.

One real pipeline run (simulated sessions, local Kafka-protocol broker, Spark) writes a change
log and both tables; the tests check them, or copies of them changed by real Delta writes:
rows deleted or altered, versions gone or stretched, a table restored to before its last
batch, commits claiming batches they did not apply. Batches that change nothing (and so make
no commit) are followed without Spark, on a change log committed batch by batch.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from tests.fixtures.sessions_job import sessions_config, two_partition_simulation
from tests.integration.test_materializer import SCHEMA, ChangeLog, commit
from tests.integration.test_session_tables import non_empty

from inorder.assemble import build_pipeline
from inorder.checkpoint.layout import CheckpointLayout
from inorder.cli import build_parser
from inorder.commands.run import dump_toml
from inorder.dev.simulator import simulate
from inorder.sessions import SessionTables, rebuild_tables
from inorder.sessions.rebuild import read_changes
from inorder.sessions.tables_check import (
    TablesCheck,
    check_pipeline_tables,
    check_tables_against_change_log,
)
from inorder.sessions.tables_delta import BATCH_KEY, FIRST_BATCH_KEY, OFFSETS_KEY
from inorder.sessions.tables_ops import restore_tables, table_status
from inorder.sessions.tables_writer import SessionTablesWriter, TableOutputs
from inorder.sinks.delta import DeltaSink


@dataclass
class TablesRun:
    """A finished pipeline run that keeps both session tables."""

    config: dict[str, Any]
    work: Path
    owner: str

    @property
    def changes(self) -> pa.Table:
        return read_changes(str(self.work / "output"))

    def copy_tables(self, name: str) -> tuple[dict[str, Any], TableOutputs]:
        """Copies of both tables and the settings of the same pipeline keeping them."""
        paths = {}
        for kind in ("current", "history"):
            paths[kind] = str(self.work / f"{name}-{kind}")
            shutil.copytree(self.config["tables"][kind], paths[kind])
        config = {**self.config, "tables": {**self.config["tables"], **paths}}
        return config, TableOutputs(current=paths["current"], history=paths["history"])

    def writer(self, outputs: TableOutputs) -> SessionTablesWriter:
        """The tables' writer, bound to the run's checkpoint as the run was."""
        pipeline = build_pipeline(self.config)
        pipeline.sink.bind(self.owner)
        return SessionTablesWriter(pipeline.processor, pipeline.sink, outputs)


@pytest.fixture(scope="module")
def tables_run(kafka: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> TablesRun:
    work = tmp_path_factory.mktemp("tables-validate")
    prefix = f"tv-{random.randrange(10**9)}-"
    sim = two_partition_simulation(
        prefix,
        seed=7,
        sessions_per_site=6,
        rows_per_snapshot=4,
        messages=700,
        restart_every=40,
        end_probability=0.02,
        faulty=0.0,
    )
    simulate(sim, kafka.bootstrap_servers)
    tables = {"current": str(work / "current"), "history": str(work / "history")}
    config = sessions_config(kafka.bootstrap_servers, prefix, work, max_offsets=150, tables=tables)
    assert build_pipeline(config).run().stopped_because == "caught up"
    info = CheckpointLayout.of(str(work / "checkpoint")).read_info()
    assert info is not None
    return TablesRun(config, work, str(info["id"]))


def validate_cli(config: dict[str, Any], toml: Path, *flags: str) -> tuple[int, dict[str, Any]]:
    """``inorder validate TOML --json FLAGS`` in this process: exit status and report."""
    toml.write_text(dump_toml(config))
    args = build_parser().parse_args(["validate", str(toml), "--json", *flags])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = int(args.func(args))
    return code, json.loads(out.getvalue())


def by_kind(check: TablesCheck) -> dict[str, Any]:
    return {t.table: t for t in check.tables}


def live_rows(changes: pa.Table, through: int) -> int:
    upto = changes.filter(pc.less_equal(changes.column("batch_id"), through))
    return sum(len(rows) for rows in non_empty(rebuild_tables(upto)).values())


def test_a_clean_run_checks_ok(tables_run: TablesRun, tmp_path: Path) -> None:
    changes = tables_run.changes
    last = int(pc.max(changes.column("batch_id")).as_py())
    assert last >= 3, "the run should take several batches"
    check = check_pipeline_tables(build_pipeline(tables_run.config), tables_run.owner)
    assert check is not None
    assert check.ok, "\n".join(check.lines())
    assert check.change_log_last_batch == last
    versions = pc.sum(pc.is_in(changes.column("op"), pa.array(["insert", "update"]))).as_py()
    for t in check.tables:
        assert t.exists and t.pending is None
        assert t.last_batch == last and t.first_batch == 0
        assert t.commits >= 3  # several batch commits, their ranges and offsets checked
        assert t.rows == live_rows(changes, last) > 0
    assert by_kind(check)["history"].versions == versions > 0
    lines = check.lines()
    assert lines[0].startswith("OK    current table") and "no discrepancy" in lines[-1], lines

    code, doc = validate_cli(tables_run.config, tmp_path / "pipeline.toml")
    assert code == 0, doc
    assert doc["ok"] is True and doc["tables"]["ok"] is True
    assert [t["table"] for t in doc["tables"]["tables"]] == ["current", "history"]


def test_altered_rows_and_versions_are_named_and_validate_fails(
    tables_run: TablesRun, tmp_path: Path
) -> None:
    config, outputs = tables_run.copy_tables("corrupt")
    assert outputs.current is not None and outputs.history is not None
    current = DeltaTable(outputs.current)
    rows = sorted(current.to_pyarrow_table().to_pylist(), key=lambda r: (r["session"], r["row_id"]))
    gone, altered = rows[0], rows[-1]

    def where(row: dict[str, Any]) -> str:
        return f"session = '{row['session']}' AND row_id = '{row['row_id']}'"

    current.delete(where(gone))
    DeltaTable(outputs.current).update({"row": "'{\"tampered\": true}'"}, predicate=where(altered))
    history = DeltaTable(outputs.history)
    closed = [r for r in history.to_pyarrow_table().to_pylist() if not r["is_current"]]
    lost = min(closed, key=lambda r: (r["session"], r["row_id"], r["valid_from_offset"]))
    history.delete(f"{where(lost)} AND valid_from_offset = {lost['valid_from_offset']}")
    # Another closed version made to end after the next version of its row starts.
    starts = {(r["session"], r["row_id"], r["valid_from_offset"]) for r in closed}
    stretched = max(
        (r for r in closed if (r["session"], r["row_id"], r["valid_to_offset"]) in starts),
        key=lambda r: (r["session"], r["row_id"], r["valid_from_offset"]),
    )
    assert (stretched["session"], stretched["row_id"]) != (lost["session"], lost["row_id"])
    DeltaTable(outputs.history).update(
        {"valid_to_offset": f"{stretched['valid_to_offset'] + 1}"},
        predicate=f"{where(stretched)} AND valid_from_offset = {stretched['valid_from_offset']}",
    )

    check = check_tables_against_change_log(tables_run.writer(outputs))
    assert not check.ok
    cur, hist = by_kind(check)["current"], by_kind(check)["history"]
    assert (cur.missing, cur.different, cur.extra, cur.problems) == (1, 1, 0, {}), cur
    key = (gone["topic"], gone["session"], gone["row_id"])
    assert cur.differences[0].startswith(f"missing {key}: the change log has "), cur.differences
    key = (altered["topic"], altered["session"], altered["row_id"])
    assert cur.differences[1].startswith(f"different {key}: the table has "), cur.differences
    assert '{"tampered": true}' in cur.differences[1]
    assert any("DELETE commit not made by the pipeline" in n for n in cur.notes), cur.notes
    # A closed version gone: the open rows still match, the versions do not.
    assert (hist.missing, hist.different, hist.extra) == (0, 0, 0)
    assert hist.problems == {"versions missing": 1, "overlapping versions": 1}, hist.differences
    key = (lost["topic"], lost["session"], lost["row_id"])
    assert (
        f"missing version of {key} from offset {lost['valid_from_offset']}" in (hist.differences[0])
    )
    key = (stretched["topic"], stretched["session"], stretched["row_id"])
    assert hist.differences[1] == (
        f"versions of {key} overlap: the one from offset {stretched['valid_from_offset']} ends "
        f"at {stretched['valid_to_offset'] + 1}, the next starts at {stretched['valid_to_offset']}"
    )
    assert any(line.startswith("DIFF  current table") for line in check.lines())

    code, doc = validate_cli(config, tmp_path / "corrupt.toml")
    assert code == 1
    assert all(p["ok"] for p in doc["partitions"]), "the change log itself matches Kafka"
    assert doc["ok"] is False and doc["tables"]["ok"] is False
    assert [t["missing"] for t in doc["tables"]["tables"]] == [1, 0]
    code, doc = validate_cli(config, tmp_path / "corrupt.toml", "--skip-tables")
    assert code == 0 and "tables" not in doc


def test_a_table_behind_the_change_log_is_a_pending_catch_up(
    tables_run: TablesRun, tmp_path: Path
) -> None:
    _, outputs = tables_run.copy_tables("behind")
    writer = tables_run.writer(outputs)
    last = int(pc.max(tables_run.changes.column("batch_id")).as_py())
    assert [t["last_batch"] for t in table_status(writer)] == [last, last]
    held = restore_tables(writer, last)
    assert held[0] < last and held[1] < last, held

    check = check_tables_against_change_log(writer)
    assert check.ok, "\n".join(check.lines())
    for t, restored_to in zip(check.tables, held, strict=True):
        assert t.last_batch == restored_to
        assert t.pending == [restored_to + 1, last]
        # Compared as of the batch the table holds, not the change log's last one.
        assert t.rows == live_rows(tables_run.changes, restored_to)
        assert t.lines()[0].endswith(
            f"catch-up pending: the next run applies batches {restored_to + 1}..{last}"
        )
        assert t.lines()[0].startswith("OK")

    # Caught up (the next run's part): the restored commits no longer count, the new do.
    writer.after_commit(last)
    check = check_tables_against_change_log(writer)
    assert check.ok, "\n".join(check.lines())
    assert [t.pending for t in check.tables] == [None, None]
    assert [t.last_batch for t in check.tables] == [last, last]


def fake_commit(table: DeltaTable, schema: pa.Schema, metadata: dict[str, str], txn: Any) -> None:
    """A commit with no rows carrying ``metadata`` (and ``txn``) as a table commit does."""
    properties = CommitProperties(app_transactions=[txn], custom_metadata=metadata)
    write_deltalake(table, schema.empty_table(), mode="append", commit_properties=properties)


def test_commits_overlapping_skipping_or_misreporting_batches_are_found(
    tables_run: TablesRun,
) -> None:
    _, outputs = tables_run.copy_tables("commits")
    writer = tables_run.writer(outputs)
    current, history = writer.outputs
    last = int(pc.max(tables_run.changes.column("batch_id")).as_py())
    # The current table: batch `last` committed a second time, with other offsets.
    fake_commit(
        current.open(),
        current.schema,
        {BATCH_KEY: str(last), FIRST_BATCH_KEY: str(last), OFFSETS_KEY: '{"elsewhere/0":[0,9]}'},
        Transaction(current.app_id, last),
    )
    # The history table: back to before `last`, then said to hold it without applying it.
    held = restore_tables(tables_run.writer(TableOutputs(history=outputs.history)), last)[0]
    fake_commit(
        history.open(), history.schema, {BATCH_KEY: str(last)}, Transaction(history.app_id, last)
    )

    check = by_kind(check_tables_against_change_log(writer))
    cur, hist = check["current"], check["history"]
    assert cur.problems == {"batch ranges": 1, "offsets": 1}, cur.differences
    assert (cur.missing, cur.extra, cur.different) == (0, 0, 0)
    assert (
        f"applies batches {last}..{last}, but batches through {last} were applied"
        in (cur.differences[0])
    )
    assert '{"elsewhere/0": [0, 9]}' in cur.differences[1]
    assert hist.problems["batch ranges"] == 1, hist.differences
    assert hist.differences[0].startswith(
        f"batches {held + 1}..{last} change this table but no commit"
    )
    assert hist.last_batch == last and hist.pending is None


def test_batches_that_change_nothing_need_no_commit(tmp_path: Path) -> None:
    """Batches of `end` rows only change no table (end = "keep"): no commit, no gap."""
    changes = DeltaSink(str(tmp_path / "changes"), partition_by=["topic"])
    changes.bind("owner-1")
    changes.check(SCHEMA)
    outputs = TableOutputs(current=str(tmp_path / "current"), history=str(tmp_path / "history"))
    writer = SessionTablesWriter(SessionTables(), changes, outputs)
    writer.check()
    log = ChangeLog(seed=3, sessions=6)
    for b in range(6):
        rows = log.batch(b, messages=20)
        if b in (2, 5):
            ends = pa.array(["end"] * rows.num_rows)
            rows = rows.set_column(rows.schema.get_field_index("op"), "op", ends)
            rows = rows.set_column(
                rows.schema.get_field_index("row"), "row", pa.nulls(rows.num_rows, pa.string())
            )
            rows = rows.set_column(
                rows.schema.get_field_index("row_id"),
                "row_id",
                pa.nulls(rows.num_rows, pa.string()),
            )
        commit(changes, b, rows)
        writer.after_commit(b)
    for t in table_status(writer, limit=10):
        ranges = [(c["first_batch"], c["batch"]) for c in t["commits"]]
        assert ranges == [(4, 4), (3, 3), (1, 1), (0, 0)], ranges

    check = check_tables_against_change_log(writer)
    assert check.ok, "\n".join(check.lines())
    assert [(t.commits, t.last_batch, t.pending) for t in check.tables] == [(4, 4, None)] * 2

    # Batch 6 changes the tables; they do not have it yet: the next run applies 5..6.
    commit(changes, 6, log.batch(6, messages=20))
    check = check_tables_against_change_log(writer)
    assert check.ok and [t.pending for t in check.tables] == [[5, 6], [5, 6]]

    # Batch 7 sets a row to the value it has: the current table's rows stay the same, the
    # history gains a version. Both tables said to hold batch 7 without applying it.
    writer.after_commit(6)
    row = current_rows(str(tmp_path / "current"))[0]
    offset = int(pc.max(changes.read_batches(0, 6).column("offset")).as_py()) + 1
    same = {**row, "offset": offset, "kafka_ts": None, "seq": 99, "op": "update", "batch_id": 7}
    commit(changes, 7, pa.Table.from_pylist([same], schema=SCHEMA))
    for table in writer.outputs:
        txn = Transaction(table.app_id, 7)
        fake_commit(table.open(), table.schema, {BATCH_KEY: "7"}, txn)
    cur, hist = check_tables_against_change_log(writer).tables
    assert cur.ok and cur.last_batch == 7, cur.differences
    assert hist.problems["batch ranges"] == 1, hist.differences
    assert hist.differences[0].startswith("batches 7..7 change this table but no commit")


def current_rows(path: str) -> list[dict[str, Any]]:
    """The current table's rows with the change-log columns they share, by session and row."""
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    keep = ("topic", "partition", "session", "row_id", "row")
    return sorted(
        ({k: r[k] for k in keep} for r in rows), key=lambda r: (r["session"], r["row_id"])
    )


def test_only_pipelines_with_tables_are_checked() -> None:
    assert check_pipeline_tables(SimpleNamespace(tables=None)) is None
