"""Current (SCD1) and history (SCD2) session tables on real Delta tables, local and on S3.

First without Spark: a random change log following the session-table rules is committed batch
by batch to a real Delta change log and the table writer follows it, through restarts, a
failure between the change log's commit and a table's commit, a re-run batch and a restore.
Then a real pipeline on the simulator: its current table is the ground truth's final tables
and the history table, queried as of offsets and times with DuckDB and polars, is the change
log rebuilt up to there.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tests.fixtures.sessions_job import duplicate_change_rows, sessions_config
from tests.integration.test_materializer import SCHEMA, ChangeLog, commit

from inorder.assemble import build_pipeline
from inorder.dev.simulator import simulate
from inorder.errors import ConfigError, InorderError
from inorder.pipeline.config import validate
from inorder.sessions import SessionTables, rebuild_tables
from inorder.sessions.rebuild import read_changes
from inorder.sessions.tables_delta import (
    BATCH_KEY,
    OFFSETS_KEY,
    DeltaTableOutput,
    query_dataset,
)
from inorder.sessions.tables_ops import (
    format_table_status,
    ops_writer,
    restore_tables,
    table_status,
)
from inorder.sessions.tables_writer import (
    SessionTablesWriter,
    TableOutputs,
    pipeline_tables,
)
from inorder.sinks.delta import DeltaSink

Location = tuple[str, dict[str, str] | None]

#: The history table of one session as of an offset of its partition (docs/tables.md).
AS_OF_OFFSET_SQL = """
SELECT row_id, "row" FROM history
WHERE topic = $topic AND session = $session
  AND valid_from_offset <= $offset AND (valid_to_offset IS NULL OR valid_to_offset > $offset)
"""
AS_OF_TIME_SQL = """
SELECT topic, session, row_id, "row" FROM history
WHERE valid_from_ts <= $ts AND (valid_to_ts IS NULL OR valid_to_ts > $ts)
"""


def non_empty(tables: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], Any]:
    return {k: rows for k, rows in tables.items() if rows}


def current_tables(path: str, options: dict[str, str] | None) -> dict[tuple[str, str], Any]:
    """The current table read back as ``{(topic, session): {row_id: row}}``."""
    rows = pl.read_delta(path, storage_options=options)
    assert rows.select(["topic", "session", "row_id"]).is_duplicated().sum() == 0
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows.iter_rows(named=True):
        out.setdefault((r["topic"], r["session"]), {})[r["row_id"]] = msgspec.json.decode(r["row"])
    return out


def history_dataset(path: str, options: dict[str, str] | None) -> Any:
    return query_dataset(path, options)


def duckdb_as_of(history: Any, topic: str, session: str, offset: int) -> dict[str, Any]:
    con = duckdb.connect()
    try:
        con.register("history", history)
        params = {"topic": topic, "session": session, "offset": offset}
        found = con.execute(AS_OF_OFFSET_SQL, params).fetchall()
    finally:
        con.close()
    return {rid: msgspec.json.decode(row) for rid, row in found}


def polars_as_of(history: pl.DataFrame, topic: str, session: str, offset: int) -> dict[str, Any]:
    valid = history.filter(
        (pl.col("topic") == topic)
        & (pl.col("session") == session)
        & (pl.col("valid_from_offset") <= offset)
        & (pl.col("valid_to_offset").is_null() | (pl.col("valid_to_offset") > offset))
    )
    return {r["row_id"]: msgspec.json.decode(r["row"]) for r in valid.iter_rows(named=True)}


def check_history(changes: pa.Table, path: str, options: dict[str, str] | None, n: int) -> int:
    """``n`` sampled (session, offset) as-of queries, DuckDB and polars, against a rebuild."""
    history = pl.read_delta(path, storage_options=options)
    dataset = history_dataset(path, options)
    keys = sorted(
        set(
            zip(
                changes.column("topic").to_pylist(),
                changes.column("partition").to_pylist(),
                changes.column("session").to_pylist(),
                changes.column("offset").to_pylist(),
                strict=True,
            )
        )
    )
    rng = random.Random(5)
    for topic, partition, session, offset in rng.sample(keys, min(n, len(keys))):
        upto = changes.filter(
            pc.and_(
                pc.and_(
                    pc.equal(changes.column("topic"), topic),
                    pc.equal(changes.column("partition"), partition),
                ),
                pc.less_equal(changes.column("offset"), offset),
            )
        )
        expected = rebuild_tables(upto).get((topic, session), {})
        assert duckdb_as_of(dataset, topic, session, offset) == expected, (session, offset)
        assert polars_as_of(history, topic, session, offset) == expected, (session, offset)
    return min(n, len(keys))


def delta_location(loc: Location, name: str) -> str:
    base, _ = loc
    return f"{base.rstrip('/')}/{name}"


def test_tables_follow_the_change_log_through_failures_and_restore(
    sink_location: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = sink_location[1]
    changes = DeltaSink(
        delta_location(sink_location, "changes"), partition_by=["topic"], storage_options=options
    )
    changes.bind("owner-7")
    changes.check(SCHEMA)
    outputs = TableOutputs(
        current=delta_location(sink_location, "current"),
        history=delta_location(sink_location, "history"),
        storage_options=options,
    )

    def writer(catch_up_batches: int = 8) -> SessionTablesWriter:
        w = SessionTablesWriter(SessionTables(), changes, outputs, catch_up_batches)
        w.check()
        return w

    batches = 9
    w = drive_through_failures(changes, writer, DeltaTableOutput, monkeypatch, batches)
    log_rows = changes.read_batches(0, batches)
    expected = non_empty(rebuild_tables(log_rows))
    current_path, history_path = outputs.current, outputs.history
    assert current_path is not None and history_path is not None
    assert current_tables(current_path, options) == expected
    open_rows = pl.read_delta(history_path, storage_options=options).filter(pl.col("is_current"))
    assert open_rows.height == sum(len(rows) for rows in expected.values())
    assert check_history(log_rows, history_path, options, 60) == 60

    # Each commit names its batch (the app transaction) and the offsets it covers.
    for table in w.outputs:
        assert table.committed_batch() == batches - 1
        info = table.open().history(1)[0]
        assert info[BATCH_KEY] == str(batches - 1)
        assert json.loads(info[OFFSETS_KEY])

    # Repair: both tables back to before batch 4, then caught up from the change log.
    assert restore_tables(w, 4) == [3, 3]
    assert restore_tables(w, 4) == [3, 3]  # applied twice: nothing more
    before_4 = log_rows.filter(pc.less(log_rows.column("batch_id"), 4))
    assert current_tables(current_path, options) == non_empty(rebuild_tables(before_4))
    # Caught up two batches per commit: 4-5, 6-7, 8.
    assert writer(catch_up_batches=2).after_commit(batches - 1).caught_up == batches - 1 - 4
    assert current_tables(current_path, options) == expected
    assert check_history(log_rows, history_path, options, 30) == 30

    # What `inorder inspect` shows: the last batch and the offsets of the newest commits.
    status = table_status(writer(), limit=3)
    assert [t["table"] for t in status] == ["current", "history"]
    for t in status:
        assert t["last_batch"] == batches - 1
        commits = [(c["first_batch"], c["batch"]) for c in t["commits"]]
        assert commits == [(8, 8), (6, 7), (4, 5)], commits
        for c in t["commits"]:
            assert c["offsets"] == offsets_of(log_rows, c["first_batch"], c["batch"])
    lines = format_table_status(status)
    assert lines[0].endswith("holds change-log batches through 8"), lines
    assert any("batches 6..7" in line for line in lines), lines


def drive_through_failures(
    changes: Any,
    writer: Callable[[], SessionTablesWriter],
    output_class: type[Any],
    monkeypatch: pytest.MonkeyPatch,
    batches: int,
    commits_of: Callable[[SessionTablesWriter], Any] | None = None,
) -> SessionTablesWriter:
    """Commit ``batches`` change-log batches and the tables after each, through a restart
    (batch 3), a failure between the current and the history table's commits (5), a lost
    table commit (6, caught up by 7) and a re-run of every batch, which must commit nothing
    (nor change ``commits_of`` the tables, when given); the last writer."""
    log = ChangeLog(seed=11, sessions=16)
    w = writer()
    original = output_class.merge
    for b in range(batches):
        commit(changes, b, log.batch(b, messages=30))
        if b == 3:
            w = writer()  # a restart: row ids read back from the tables
        if b == 5:
            # Killed after the current table's commit, before the history's.
            def failing(self: Any, *args: Any) -> dict[str, Any]:
                if self.kind == "history":
                    raise InorderError("injected failure")
                return original(self, *args)  # type: ignore[no-any-return]

            with monkeypatch.context() as patch:
                patch.setattr(output_class, "merge", failing)
                with pytest.raises(InorderError, match="injected"):
                    w.after_commit(b)
            w = writer()  # the re-run of batch 5: current has it, history catches up
            report = w.after_commit(b)
            assert report.committed == ["history"], report
            continue
        if b == 6:
            continue  # a table commit lost entirely: batch 7 catches up 6 and 7
        report = w.after_commit(b)
        if b == 7:
            assert report.caught_up == 1
        before = commits_of(w) if commits_of is not None else None
        assert writer().after_commit(b).committed == []  # a re-run commits nothing twice
        if commits_of is not None:
            assert commits_of(w) == before
    return w


def middle_of_busiest_partition(changes: pa.Table) -> tuple[Any, int]:
    """A failure point for a repair: the middle offset of the partition with most changes."""
    from inorder.records import TopicPartition

    parts = changes.group_by(["topic", "partition"]).aggregate([("offset", "count")])
    busiest = parts.sort_by([("offset_count", "descending")]).to_pylist()[0]
    tp = TopicPartition(busiest["topic"], busiest["partition"])
    mine = changes.filter(
        pc.and_(
            pc.equal(changes.column("topic"), tp.topic),
            pc.equal(changes.column("partition"), tp.partition),
        )
    )
    return tp, sorted(mine.column("offset").to_pylist())[mine.num_rows // 2]


def offsets_of(changes: pa.Table, first: int, last: int) -> dict[str, list[int]]:
    """``{"topic/partition": [first, last]}`` offsets of the change rows of batches first..last."""
    out: dict[str, list[int]] = {}
    for r in changes.to_pylist():
        if first <= r["batch_id"] <= last:
            key = f"{r['topic']}/{r['partition']}"
            lo, hi = out.get(key, [r["offset"], r["offset"]])
            out[key] = [min(lo, r["offset"]), max(hi, r["offset"])]
    return out


def test_end_drop_and_typed_rows(tmp_path: Path) -> None:
    from tests.integration.test_materializer import TYPED_SCHEMA, Item

    changes = DeltaSink(str(tmp_path / "changes"), partition_by=["topic"])
    changes.check(TYPED_SCHEMA)
    outputs = TableOutputs(current=str(tmp_path / "current"), end="drop")
    w = SessionTablesWriter(SessionTables(row_type=Item), changes, outputs)
    w.check()
    log = ChangeLog(seed=4, sessions=10, typed=True)
    for b in range(6):
        commit(changes, b, log.batch(b, messages=30))
        w.after_commit(b)
    rows = changes.read_batches(0, 5)
    ended = rows.set_column(
        rows.schema.get_field_index("op"),
        "op",
        pc.if_else(pc.equal(rows.column("op"), "end"), "clear", rows.column("op")),
    )
    current = pl.read_delta(str(tmp_path / "current"))
    assert current.schema["v"] == pl.Int64
    got: dict[tuple[str, str], dict[str, Any]] = {}
    for r in current.iter_rows(named=True):
        got.setdefault((r["topic"], r["session"]), {})[r["row_id"]] = {"id": r["id"], "v": r["v"]}
    assert got == non_empty(rebuild_tables(ended))
    assert rows.filter(pc.equal(rows.column("op"), "end")).num_rows > 0


def test_a_history_table_of_another_layout_is_refused(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from inorder.sessions.tables_delta import TablesError, history_schema

    schema = history_schema(SCHEMA, ["row"])
    DeltaTable.create(str(tmp_path / "history"), schema, partition_by=["topic"])
    table = DeltaTableOutput("history", str(tmp_path / "history"), schema)
    with pytest.raises(
        TablesError, match=r"partitioned by \['topic'\], not \['topic', 'is_current'\]"
    ):
        table.check()
    fresh = DeltaTableOutput("history", str(tmp_path / "fresh"), schema)
    assert not fresh.exists()
    fresh.check()
    assert fresh.exists() and fresh.open().metadata().partition_columns == ["topic", "is_current"]


def test_tables_need_the_session_processor(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[tables\] needs the session-table processor"):
        validate(
            {
                "source": {"topics": ["t"]},
                "processor": {"type": "json"},
                "sink": {"path": str(tmp_path / "o")},
                "tables": {"current": str(tmp_path / "c")},
            }
        )
    with pytest.raises(ConfigError, match=r"tables\.end"):
        TableOutputs(current="x", end="forget")  # type: ignore[arg-type]

    class NotSessions:
        processor = object()
        tables = TableOutputs(current=str(tmp_path / "c"))

    with pytest.raises(ConfigError, match="only session-table pipelines"):
        pipeline_tables(NotSessions())


def test_pipeline_tables_match_ground_truth_and_survive_a_crash(
    kafka: Any, spark: Any, sink_location: Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fixtures.sessions_job import two_partition_simulation

    prefix = f"tables-{random.randrange(10**9)}-"
    sim = two_partition_simulation(
        prefix,
        seed=21,
        sites=2,
        sessions_per_site=8,
        rows_per_snapshot=5,
        messages=2500,
        restart_every=50,
        end_probability=0.02,
        faulty=0.0,
    )
    result = simulate(sim, kafka.bootstrap_servers)
    options = sink_location[1]
    tables = {
        "current": delta_location(sink_location, "current"),
        "history": delta_location(sink_location, "history"),
        "storage_options": options or {},
    }
    cfg = sessions_config(kafka.bootstrap_servers, prefix, tmp_path, max_offsets=700, tables=tables)
    pipeline = build_pipeline(cfg)
    assert isinstance(pipeline.tables, TableOutputs)

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
    summary = build_pipeline(cfg).run()
    assert summary.stopped_because == "caught up"

    changes = read_changes(str(tmp_path / "output"))
    assert duplicate_change_rows(changes) == 0
    assert int(pc.max(changes.column("batch_id")).as_py()) >= 3
    expected = non_empty(rebuild_tables(changes))
    current = current_tables(tables["current"], options)
    assert current == expected
    truth = result.ground_truth
    exact = [s for s in truth.sessions.values() if s.table_exact and s.table is not None]
    assert len(exact) >= 10
    for s in exact:
        assert current.get((s.topic, s.session), {}) == s.table, s.key
    checked = check_history(changes, tables["history"], options, 40)
    assert checked == 40

    # As of a time: the kafka_ts of a change, DuckDB over the Delta table's files.
    stamps = sorted(set(changes.column("kafka_ts").to_pylist()))
    ts = stamps[len(stamps) // 2]
    upto = changes.filter(pc.less_equal(changes.column("kafka_ts"), ts))
    con = duckdb.connect()
    try:
        con.register("history", history_dataset(tables["history"], options))
        found = con.execute(AS_OF_TIME_SQL, {"ts": ts}).fetchall()
    finally:
        con.close()
    got: dict[tuple[str, str], dict[str, Any]] = {}
    for topic, session, rid, row in found:
        got.setdefault((topic, session), {})[rid] = msgspec.json.decode(row)
    # Producer timestamps of one partition may tie or step back: compared where they rise.
    monotonic = all(a <= b for part in _by_partition(changes) for a, b in itertools.pairwise(part))
    if monotonic:
        assert got == non_empty(rebuild_tables(upto))

    repair_and_inspect(cfg, tables, options, tmp_path)


def repair_and_inspect(
    cfg: dict[str, Any], tables: dict[str, Any], options: dict[str, str] | None, work: Path
) -> None:
    """`inorder inspect` shows the tables; `inorder repair` restores them to before the first
    batch whose change rows it deletes, and the next run brings them back to the change log."""
    from inorder.ops.inspect import format_inspect, inspect_all
    from inorder.ops.repair import apply_repair, plan_repair
    from inorder.ops.target import OpsTarget

    changes = read_changes(str(work / "output"))
    last = int(pc.max(changes.column("batch_id")).as_py())
    doc = inspect_all(OpsTarget(build_pipeline(cfg)), True, False)
    assert [t["last_batch"] for t in doc["tables"]] == [last, last]
    newest = doc["tables"][0]["commits"][0]
    assert newest["offsets"] == offsets_of(changes, newest["first_batch"], newest["batch"])
    assert any(line.startswith("current table") for line in format_inspect(doc))

    tp, at = middle_of_busiest_partition(changes)
    target = OpsTarget(build_pipeline(cfg))
    plan = plan_repair(target, at_offsets={tp: at})
    assert plan.tables_from_batch is not None and plan.tables_from_batch <= last
    assert all(t.needed for t in plan.tables), plan.tables
    assert any("catches it up from the change log" in line for line in plan.lines())
    apply_repair(target, plan)
    for t in table_status(ops_writer(build_pipeline(cfg)) or _fail()):
        assert t["last_batch"] == plan.tables_from_batch - 1, t
    # Applied again: nothing left to restore.
    again = plan_repair(OpsTarget(build_pipeline(cfg)), at_offsets={tp: at})
    assert not any(t.needed for t in again.tables)

    assert build_pipeline(cfg).run().stopped_because == "caught up"
    changes = read_changes(str(work / "output"))
    assert duplicate_change_rows(changes) == 0
    assert int(pc.max(changes.column("batch_id")).as_py()) > last  # ids continue after a repair
    expected = non_empty(rebuild_tables(changes))
    assert current_tables(tables["current"], options) == expected
    history = pl.read_delta(tables["history"], storage_options=options)
    # No version twice: the restored tables did not apply the re-made change rows again.
    assert history.select(["topic", "session", "row_id", "valid_from_offset"]).is_unique().all()
    assert history.filter(pl.col("is_current")).height == sum(map(len, expected.values()))
    assert check_history(changes, tables["history"], options, 30) == 30


def _fail() -> Any:
    raise AssertionError("the pipeline keeps no tables")


def _by_partition(changes: pa.Table) -> list[list[Any]]:
    ordered: dict[tuple[str, int], list[tuple[int, Any]]] = {}
    for t, p, o, ts in zip(
        *(changes.column(c).to_pylist() for c in ("topic", "partition", "offset", "kafka_ts")),
        strict=True,
    ):
        ordered.setdefault((t, p), []).append((o, ts))
    return [[ts for _, ts in sorted(v)] for v in ordered.values()]
