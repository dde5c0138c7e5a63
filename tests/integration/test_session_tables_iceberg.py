"""Current (SCD1) and history (SCD2) session tables as Iceberg tables (SQL catalog, local).

First without Spark: a random change log is committed batch by batch and the table writer
follows it into Iceberg tables, through a restart, a failure between two tables' commits, a
lost commit, re-runs and a repair's rollback. Then a real pipeline on the simulator, crashing
between the change log's commit and the tables': the current table is the change log
rebuilt, the history table answers as-of queries like the rebuild.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.expressions import And, EqualTo
from tests.fixtures.sessions_job import duplicate_change_rows, sessions_config
from tests.integration.test_materializer import SCHEMA, ChangeLog, commit
from tests.integration.test_session_tables import (
    drive_through_failures,
    middle_of_busiest_partition,
    non_empty,
    offsets_of,
    polars_as_of,
)

from inorder.assemble import build_pipeline
from inorder.dev.simulator import simulate
from inorder.errors import ConfigError, InorderError
from inorder.pipeline.config import validate
from inorder.sessions import SessionTables, rebuild_tables
from inorder.sessions.rebuild import read_changes
from inorder.sessions.tables_check import check_tables_against_change_log
from inorder.sessions.tables_delta import BATCH_KEY, OFFSETS_KEY, TablesError, history_schema
from inorder.sessions.tables_iceberg import IcebergTableOutput
from inorder.sessions.tables_ops import (
    format_table_status,
    restore_plan,
    restore_tables,
    table_status,
)
from inorder.sessions.tables_writer import (
    SessionTablesWriter,
    TableOutputs,
)
from inorder.sinks.delta import DeltaSink


def iceberg_outputs(warehouse: Path, **kwargs: Any) -> TableOutputs:
    return TableOutputs(
        current="sessions.current",
        history="sessions.history",
        format="iceberg",
        warehouse=str(warehouse),
        **kwargs,
    )


def read_table(writer: SessionTablesWriter, kind: str) -> pa.Table:
    table = next(t for t in writer.outputs if t.kind == kind)
    assert isinstance(table, IcebergTableOutput)
    rows: pa.Table = table.open().scan().to_arrow()
    return rows


def current_rows(rows: pa.Table) -> dict[tuple[str, str], Any]:
    """The current table as ``{(topic, session): {row_id: row}}``."""
    frame = pl.from_arrow(rows)
    assert isinstance(frame, pl.DataFrame)
    assert frame.select(["topic", "session", "row_id"]).is_duplicated().sum() == 0
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in frame.iter_rows(named=True):
        out.setdefault((r["topic"], r["session"]), {})[r["row_id"]] = msgspec.json.decode(r["row"])
    return out


def check_history(changes: pa.Table, history: pa.Table, n: int) -> int:
    """``n`` sampled (session, offset) as-of queries on the history table against a rebuild."""
    frame = pl.from_arrow(history)
    assert isinstance(frame, pl.DataFrame)
    keys = sorted(
        set(
            zip(
                *(changes.column(c).to_pylist() for c in ("topic", "partition", "session")),
                changes.column("offset").to_pylist(),
                strict=True,
            )
        )
    )
    rng = random.Random(5)
    for topic, partition, session, offset in rng.sample(keys, min(n, len(keys))):
        mine = pc.and_(
            pc.equal(changes.column("topic"), topic),
            pc.equal(changes.column("partition"), partition),
        )
        upto = changes.filter(pc.and_(mine, pc.less_equal(changes.column("offset"), offset)))
        expected = rebuild_tables(upto).get((topic, session), {})
        assert polars_as_of(frame, topic, session, offset) == expected, (session, offset)
    return min(n, len(keys))


def snapshots(writer: SessionTablesWriter) -> list[int]:
    counts = []
    for t in writer.outputs:
        assert isinstance(t, IcebergTableOutput)
        counts.append(len(t.open().snapshots()))
    return counts


def test_iceberg_tables_follow_the_change_log_through_failures_and_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    changes = DeltaSink(str(tmp_path / "changes"), partition_by=["topic"])
    changes.bind("owner-9")
    changes.check(SCHEMA)
    outputs = iceberg_outputs(tmp_path / "warehouse")

    def writer(catch_up_batches: int = 8) -> SessionTablesWriter:
        w = SessionTablesWriter(SessionTables(), changes, outputs, catch_up_batches)
        w.check()
        return w

    batches = 9
    # A re-run adds no snapshot.
    w = drive_through_failures(changes, writer, IcebergTableOutput, monkeypatch, batches, snapshots)
    log_rows = changes.read_batches(0, batches)
    expected = non_empty(rebuild_tables(log_rows))
    assert current_rows(read_table(w, "current")) == expected
    history = read_table(w, "history")
    assert pc.sum(history.column("is_current")).as_py() == sum(map(len, expected.values()))
    assert check_history(log_rows, history, 60) == 60

    # Each commit names its batch and the offsets it covers in its snapshot summary.
    for table in w.outputs:
        assert table.committed_batch() == batches - 1
        assert isinstance(table, IcebergTableOutput)
        snap = table.open().current_snapshot()
        assert snap is not None and snap.summary is not None
        assert snap.summary[BATCH_KEY] == str(batches - 1)
        assert json.loads(str(snap.summary[OFFSETS_KEY]))

    status = table_status(writer(), limit=3)
    for t in status:
        assert t["last_batch"] == batches - 1
        commits = [(c["first_batch"], c["batch"]) for c in t["commits"]]
        assert commits == [(8, 8), (6, 7), (5, 5)], (t["table"], commits)
        for c in t["commits"]:
            assert c["offsets"] == offsets_of(log_rows, c["first_batch"], c["batch"])
    lines = format_table_status(status)
    assert lines[0].endswith("holds change-log batches through 8"), lines

    # A repair: both tables rolled back to before batch 4, then caught up two batches a commit.
    assert [p.restored_to for p in restore_plan(w, 4)] == [3, 3]
    assert restore_tables(w, 4) == [3, 3]
    assert restore_tables(w, 4) == [3, 3]  # applied twice: nothing more
    behind = check_tables_against_change_log(writer())
    assert behind.ok and [t.pending for t in behind.tables] == [[4, 8], [4, 8]], behind.lines()
    before_4 = log_rows.filter(pc.less(log_rows.column("batch_id"), 4))
    assert current_rows(read_table(w, "current")) == non_empty(rebuild_tables(before_4))
    assert writer(catch_up_batches=2).after_commit(batches - 1).caught_up == batches - 1 - 4
    assert current_rows(read_table(w, "current")) == expected
    assert check_history(log_rows, read_table(w, "history"), 30) == 30
    # Back before the first batch: emptied, then rebuilt from the whole change log.
    assert restore_tables(w, 0) == [-1, -1]
    assert read_table(w, "current").num_rows == 0
    assert writer().after_commit(batches - 1).committed == ["current", "history"]
    assert current_rows(read_table(w, "current")) == expected

    # `inorder validate`'s check of the tables: clean through the rollbacks and catch-ups...
    checked = check_tables_against_change_log(writer())
    assert checked.ok, checked.lines()
    assert [(t.last_batch, t.rows) for t in checked.tables] == [(8, checked.tables[0].rows)] * 2
    assert checked.tables[0].rows == sum(map(len, expected.values())) > 0
    assert checked.tables[1].versions > checked.tables[1].rows
    # ... and a row deleted behind the pipeline's back is found, by its key.
    current = next(t for t in w.outputs if t.kind == "current")
    assert isinstance(current, IcebergTableOutput)
    gone = read_table(w, "current").slice(0, 1).to_pylist()[0]
    current.open().delete(
        And(EqualTo("session", gone["session"]), EqualTo("row_id", gone["row_id"]))
    )
    damaged = check_tables_against_change_log(writer())
    assert not damaged.ok and damaged.tables[0].missing == 1, damaged.lines()
    assert damaged.tables[1].ok
    key = (gone["topic"], gone["session"], gone["row_id"])
    assert repr(key) in damaged.tables[0].differences[0], damaged.lines()


def test_iceberg_tables_of_another_layout_or_pipeline_are_refused(tmp_path: Path) -> None:
    from inorder.sinks.iceberg_catalog import catalog_properties, create_table, parse_partition_by

    props = catalog_properties(None, str(tmp_path / "wh"), None, None)
    schema = history_schema(SCHEMA, ["row"])
    table = IcebergTableOutput("history", "db.history", schema, props)
    create_table(table.catalog(), "db.history", schema, parse_partition_by(["topic"]), {})
    with pytest.raises(TablesError, match=r"partitioned by \['topic'\], not"):
        table.check()
    fresh = IcebergTableOutput("history", "db.fresh", schema, props)
    assert not fresh.exists()
    fresh.check()
    assert fresh.exists() and not fresh.written()
    fresh.check()  # an existing table of this layout is taken as it is

    # Tables another pipeline checkpoint wrote are refused.
    changes = DeltaSink(str(tmp_path / "changes"), partition_by=["topic"])
    changes.bind("first")
    changes.check(SCHEMA)
    outputs = iceberg_outputs(tmp_path / "wh2")
    w = SessionTablesWriter(SessionTables(), changes, outputs)
    w.check()
    commit(changes, 0, ChangeLog(seed=3, sessions=4).batch(0, messages=20))
    w.after_commit(0)
    other = DeltaSink(str(tmp_path / "changes"), partition_by=["topic"])
    other.bind("second")
    with pytest.raises(ConfigError, match="holds data this pipeline's checkpoint did not commit"):
        SessionTablesWriter(SessionTables(), other, outputs).check()


def test_iceberg_tables_config(tmp_path: Path) -> None:
    base = {
        "source": {"topics": ["t"], "bootstrap_servers": "localhost:9092"},
        "processor": {"type": "sessions", "options": {"row_key": "id"}},
        "sink": {"path": str(tmp_path / "o")},
    }
    tables = {
        "format": "iceberg",
        "current": "db.current",
        "history": "db.history",
        "warehouse": str(tmp_path / "wh"),
        "catalog_file": str(tmp_path / "cat.db"),
    }
    cfg = validate({**base, "tables": tables})
    pipeline = build_pipeline(cfg)
    assert isinstance(pipeline.tables, TableOutputs)
    assert pipeline.tables.format == "iceberg"
    props = pipeline.tables.catalog_properties()
    assert props["uri"] == f"sqlite:///{tmp_path / 'cat.db'}"
    with pytest.raises(ConfigError, match=r"tables\.format must be 'delta' or 'iceberg'"):
        validate({**base, "tables": {**tables, "format": "hudi"}})
    with pytest.raises(ConfigError, match=r"'namespace\.name'"):
        validate({**base, "tables": {**tables, "current": "current"}})
    with pytest.raises(ConfigError, match="need a warehouse"):
        validate({**base, "tables": {**tables, "warehouse": ""}})
    with pytest.raises(ConfigError, match=r"need tables\.format = 'iceberg'"):
        validate({**base, "tables": {"current": str(tmp_path / "c"), "warehouse": "x"}})
    # Credentials never show in what is said about a table.
    secret = TableOutputs(
        current="db.c",
        format="iceberg",
        warehouse="s3://bucket/wh",
        catalog={"type": "rest", "uri": "https://user:pw@catalog.example/api", "token": "tok"},
    )
    schema = history_schema(SCHEMA, ["row"])
    out = IcebergTableOutput("current", "db.c", schema, secret.catalog_properties())
    assert "pw" not in out.describe() and "tok" not in out.describe()
    assert "tok" not in str(out.failure("cannot load", RuntimeError("bad token tok")))


def test_pipeline_iceberg_tables_match_the_change_log_and_survive_a_crash(
    kafka: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fixtures.sessions_job import two_partition_simulation

    prefix = f"itables-{random.randrange(10**9)}-"
    sim = two_partition_simulation(
        prefix,
        seed=23,
        sites=2,
        sessions_per_site=6,
        rows_per_snapshot=4,
        messages=1200,
        restart_every=50,
        end_probability=0.02,
        faulty=0.0,
    )
    simulate(sim, kafka.bootstrap_servers)
    tables = {
        "format": "iceberg",
        "current": "sessions.current",
        "history": "sessions.history",
        "warehouse": str(tmp_path / "warehouse"),
    }
    cfg = sessions_config(kafka.bootstrap_servers, prefix, tmp_path, max_offsets=250, tables=tables)

    # The first run dies after batch 2's change-log commit, before the tables' commit.
    original = SessionTablesWriter.after_commit

    def crash_at_2(self: SessionTablesWriter, batch_id: int) -> Any:
        if batch_id == 2:
            raise InorderError("injected crash between the change log and the tables")
        return original(self, batch_id)

    with monkeypatch.context() as patch:
        patch.setattr(SessionTablesWriter, "after_commit", crash_at_2)
        with pytest.raises(InorderError):
            build_pipeline(cfg).run()
    assert build_pipeline(cfg).run().stopped_because == "caught up"

    changes = read_changes(str(tmp_path / "output"))
    assert duplicate_change_rows(changes) == 0
    last = int(pc.max(changes.column("batch_id")).as_py())
    assert last >= 3
    from inorder.sessions.tables_ops import ops_writer

    writer = ops_writer(build_pipeline(cfg))
    assert writer is not None
    expected = non_empty(rebuild_tables(changes))
    assert current_rows(read_table(writer, "current")) == expected
    assert check_history(changes, read_table(writer, "history"), 40) == 40
    # `inorder inspect`: the tables hold the last batch; the newest commit's offsets.
    from inorder.ops.inspect import format_inspect, inspect_all
    from inorder.ops.target import OpsTarget

    doc = inspect_all(OpsTarget(build_pipeline(cfg)), True, False)
    assert [t["last_batch"] for t in doc["tables"]] == [last, last]
    newest = doc["tables"][0]["commits"][0]
    assert newest["offsets"] == offsets_of(changes, newest["first_batch"], newest["batch"])
    assert any(line.startswith("current table sessions.current") for line in format_inspect(doc))
    repair(cfg, writer, tmp_path)


def repair(cfg: dict[str, Any], writer: SessionTablesWriter, work: Path) -> None:
    """`inorder repair` rolls the tables back to before the first batch whose change rows it
    deletes; the next run brings them back to the change log."""
    from inorder.ops.inspect import inspect_all
    from inorder.ops.repair import apply_repair, plan_repair
    from inorder.ops.target import OpsTarget

    changes = read_changes(str(work / "output"))
    last = int(pc.max(changes.column("batch_id")).as_py())
    tp, at = middle_of_busiest_partition(changes)
    target = OpsTarget(build_pipeline(cfg))
    plan = plan_repair(target, at_offsets={tp: at})
    assert plan.tables_from_batch is not None and plan.tables_from_batch <= last
    assert all(t.needed for t in plan.tables), plan.tables
    assert any("restore to snapshot" in line or "restore to empty" in line for line in plan.lines())
    apply_repair(target, plan)
    doc = inspect_all(OpsTarget(build_pipeline(cfg)), True, False)
    assert [t["last_batch"] for t in doc["tables"]] == [plan.tables_from_batch - 1] * 2, doc

    assert build_pipeline(cfg).run().stopped_because == "caught up"
    changes = read_changes(str(work / "output"))
    assert duplicate_change_rows(changes) == 0
    assert int(pc.max(changes.column("batch_id")).as_py()) > last
    expected = non_empty(rebuild_tables(changes))
    assert current_rows(read_table(writer, "current")) == expected
    history = read_table(writer, "history")
    # No version twice: the rolled-back tables did not apply the re-made change rows again.
    versions = pl.from_arrow(history.select(["topic", "session", "row_id", "valid_from_offset"]))
    assert isinstance(versions, pl.DataFrame) and versions.is_unique().all()
    assert check_history(changes, history, 30) == 30
