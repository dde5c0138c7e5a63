"""IcebergSink on local disk and S3 (SeaweedFS): one idempotent Iceberg snapshot per batch."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from tests.fixtures.sessions_job import (
    TWO_LOCAL_CORES,
    assert_matches_truth,
    sessions_config,
    small_simulation,
)
from tests.fixtures.sink_cases import assert_whole_batches, stage_batch

from inorder.assemble import build_pipeline, load_target
from inorder.commands.run import dump_toml
from inorder.dev.simulator import simulate
from inorder.errors import ConfigError
from inorder.ops.output import OutputView
from inorder.ops.validate import validate as validate_output
from inorder.pipeline.config import validate
from inorder.records import TopicPartition
from inorder.sinks.base import (
    ConsumedOffsets,
    DuplicateCommitError,
    SinkError,
    StoredSink,
    WrittenFile,
)
from inorder.sinks.commit_keys import FILES_KEY
from inorder.sinks.iceberg import BATCH_ID_KEY, OFFSETS_KEY, IcebergSink, batch_summaries
from inorder.sinks.iceberg_history import ROW_OFFSETS_KEY
from inorder.sinks.parquet import read_committed
from inorder.storage import fs as sfs

CRASH_WRITER = Path(__file__).resolve().parents[1] / "fixtures" / "iceberg_crash_writer.py"

SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("kafka_ts", pa.timestamp("ns", tz="UTC")),
        ("payload", pa.string()),
        ("batch_id", pa.int64()),
    ]
)
HOUR_NS = 3_600 * 10**9


def make_batch(batch_id: int, rows: int, hours_apart: bool = False) -> pa.RecordBatch:
    """Rows of two topics and two partitions; offsets ``batch_id*rows ..``."""
    start = batch_id * rows
    step = HOUR_NS if hours_apart else 1000
    return pa.record_batch(
        [
            pa.array(["a" if i % 3 else "b" for i in range(rows)]),
            pa.array([i % 2 for i in range(rows)], pa.int32()),
            pa.array(range(start, start + rows), pa.int64()),
            pa.array([(start + i) * step for i in range(rows)], pa.timestamp("ns", tz="UTC")),
            pa.array([f"payload-{start + i}" for i in range(rows)]),
            pa.array([batch_id] * rows, pa.int64()),
        ],
        schema=SCHEMA,
    )


def new_sink(
    location: tuple[str, dict[str, str] | None], tmp_path: Path, **kwargs: Any
) -> IcebergSink:
    """A sink whose warehouse is ``location`` and whose SQLite catalog is under ``tmp_path``."""
    path, options = location
    kwargs.setdefault("partition_by", ["topic"])
    return IcebergSink(
        kwargs.pop("table", "db.events"),
        path,
        catalog_file=str(tmp_path / "catalog.db"),
        storage_options=options,
        **kwargs,
    )


def stage(sink: IcebergSink, batch_id: int, rows: int, **kwargs: Any) -> list[WrittenFile]:
    return stage_batch(sink, batch_id, make_batch(batch_id, rows, **kwargs))


def offsets(sink: IcebergSink) -> list[int]:
    table = sink.load_table()
    assert table is not None
    return sorted(table.scan().to_arrow().column("offset").to_pylist())


def test_one_snapshot_per_batch_with_its_batch_and_offsets(
    sink_location: tuple[str, dict[str, str] | None], tmp_path: Path
) -> None:
    sink = new_sink(sink_location, tmp_path)
    sink.bind("ck-1")
    sink.check(SCHEMA)
    assert sink.last_committed_batch() is None and not sink.is_committed(0)
    for b in range(3):
        assert sink.commit(b, stage(sink, b, 400)) is True
    table = sink.load_table()
    assert table is not None
    assert [s.summary.additional_properties[BATCH_ID_KEY] for s in table.snapshots()] == [
        "0",
        "1",
        "2",
    ]
    summaries = batch_summaries(table, "inorder-ck-1")
    # The rows' offsets; the consumed ranges need the backend (test_iceberg_ops.py).
    assert OFFSETS_KEY not in summaries[0]
    assert json.loads(summaries[0][ROW_OFFSETS_KEY]) == {
        "a/0": [802, 1198],
        "a/1": [801, 1197],
        "b/0": [800, 1196],
        "b/1": [803, 1199],
    }
    assert offsets(sink) == list(range(1200))
    assert sink.last_committed_batch() == 2
    assert sink.is_committed(2) and not sink.is_committed(3)
    # Timestamps are stored as Iceberg microseconds.
    assert str(table.schema().find_field("kafka_ts").field_type) == "timestamptz"
    assert isinstance(sink, StoredSink)
    assert sink.read_batches(1, 1).num_rows == 400


def test_rerun_of_a_committed_batch_adds_nothing_and_deletes_its_files(
    sink_location: tuple[str, dict[str, str] | None], tmp_path: Path
) -> None:
    sink = new_sink(sink_location, tmp_path)
    sink.check(SCHEMA)
    assert sink.commit(0, stage(sink, 0, 300))
    assert sink.commit(1, stage(sink, 1, 300))
    again = stage(sink, 1, 300, hours_apart=False)
    older = stage(sink, 0, 300)
    assert sink.commit(1, again) is False
    assert sink.commit(0, older) is False
    assert offsets(sink) == list(range(600))
    loc = sink.location
    assert not any(sfs.exists(loc, loc.join(f.path)) for f in again + older)
    table = sink.load_table()
    assert table is not None and len(table.snapshots()) == 2
    # A restarted process (a new sink on the same table) sees the same.
    fresh = new_sink(sink_location, tmp_path)
    fresh.check(SCHEMA)
    assert fresh.commit(1, stage(fresh, 1, 300)) is False
    assert fresh.commit(2, []) is True  # an empty batch is still recorded
    assert fresh.last_committed_batch() == 2 and offsets(fresh) == list(range(600))


class RacedSink(IcebergSink):
    """Lets another writer commit between this sink's table load and its catalog commit."""

    race: Any = None

    def _load_for_commit(self) -> Any:
        table = super()._load_for_commit()
        race, self.race = self.race, None
        if race is not None:
            race()
        return table


def test_lost_commit_race_is_retried_after_a_refresh_never_duplicated(tmp_path: Path) -> None:
    location = (str(tmp_path / "wh"), None)
    sink = new_sink(location, tmp_path, table="db.raced")
    sink.__class__ = RacedSink
    sink.bind("ck-1")
    sink.check(SCHEMA)
    zombie = new_sink(location, tmp_path, table="db.raced")
    zombie.bind("ck-1")
    zombie.check(SCHEMA)
    other = new_sink(location, tmp_path, table="db.raced", app_id="other-writer")
    other.check(SCHEMA)
    assert sink.commit(0, stage(sink, 0, 100))

    # Another application commits first: the retry commits this batch on top of it.
    other_files = stage_batch(other, 7, make_batch(50, 100))
    mine = stage(sink, 1, 100)
    sink.race = lambda: other.commit(7, other_files)
    assert sink.commit(1, mine) is True
    assert offsets(sink) == sorted([*range(200), *range(5000, 5100)])

    # A second driver of the same checkpoint commits the same batch first: the retry sees
    # the batch in the summaries and adds nothing.
    zombie_files = stage(zombie, 2, 100)
    sink.race = lambda: zombie.commit(2, zombie_files)
    assert sink.commit(2, stage(sink, 2, 100)) is False
    assert Counter(offsets(sink)) == Counter([*range(300), *range(5000, 5100)])
    table = sink.load_table()
    assert table is not None
    batches = [s[BATCH_ID_KEY] for s in batch_summaries(table, "inorder-ck-1")]
    assert batches == ["2", "1", "0"]


def test_new_nullable_column_evolves_the_table_by_name(tmp_path: Path) -> None:
    location = (str(tmp_path / "wh"), None)
    sink = new_sink(location, tmp_path)
    sink.check(SCHEMA)
    assert sink.commit(0, stage(sink, 0, 50))
    wider = SCHEMA.append(pa.field("note", pa.string(), nullable=True))
    sink2 = new_sink(location, tmp_path)
    sink2.check(wider)
    batch = make_batch(1, 50)
    batch = pa.RecordBatch.from_arrays(
        [*batch.columns, pa.array([f"n{i}" for i in range(50)])], schema=wider
    )
    assert sink2.commit(1, stage_batch(sink2, 1, batch))
    table = sink2.load_table()
    assert table is not None
    rows = table.scan().to_arrow().sort_by("offset")
    notes = rows.column("note").to_pylist()
    assert notes[:50] == [None] * 50 and notes[50:] == [f"n{i}" for i in range(50)]
    assert sink2.dataset() is not None
    assert sink2.read_batches(0, 1).num_rows == 100

    narrower = pa.schema([f for f in SCHEMA if f.name != "payload"])
    with pytest.raises(SinkError, match=r"'payload'.*removed"):
        new_sink(location, tmp_path).check(narrower)


def test_identity_and_day_partitions_and_readers(tmp_path: Path) -> None:
    location = (str(tmp_path / "wh"), None)
    sink = new_sink(location, tmp_path, partition_by=["topic", "day(kafka_ts)"])
    sink.check(SCHEMA)
    # 100 rows an hour apart: 5 days, two topics.
    assert sink.commit(0, stage(sink, 0, 100, hours_apart=True))
    table = sink.load_table()
    assert table is not None
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [
        ("topic", "identity"),
        ("kafka_ts_day", "day"),
    ]
    files = table.inspect.files().to_pylist()
    parts = {(f["partition"]["topic"], f["partition"]["kafka_ts_day"]) for f in files}
    assert {p[0] for p in parts} == {"a", "b"} and len({p[1] for p in parts}) == 5
    assert all(
        "/data/topic=" in f["file_path"] and "kafka_ts_day=1970-01-0" in f["file_path"]
        for f in files
    )
    # Partition pruning: one day of one topic is read from its files only.
    day1 = table.scan(
        row_filter="topic == 'a' and kafka_ts >= '1970-01-02T00:00:00+00:00' "
        "and kafka_ts < '1970-01-03T00:00:00+00:00'"
    )
    assert len(list(day1.plan_files())) < len(files)
    expected = sorted(o for o in range(24, 48) if o % 3)
    assert sorted(day1.to_arrow().column("offset").to_pylist()) == expected
    assert sorted(pl.scan_iceberg(table).collect()["offset"].to_list()) == list(range(100))
    # DuckDB's iceberg extension is downloaded on first use; offline, pyiceberg hands DuckDB
    # the scan's rows instead.
    con = table.scan(selected_fields=("topic", "offset")).to_duckdb("events")
    assert con.sql('select count(*), sum("offset") from events').fetchall() == [(100, 4950)]
    with pytest.raises(SinkError, match="partitioned by"):
        new_sink(location, tmp_path, partition_by=["topic"]).check(SCHEMA)
    with pytest.raises(SinkError, match="is not one of"):
        new_sink(location, tmp_path, partition_by=["bucket(topic)"])


def test_another_checkpoint_is_refused_and_credentials_stay_hidden(s3: Any, tmp_path: Path) -> None:
    path = s3.new_prefix()
    sink = IcebergSink(
        "db.owned", path, catalog_file=str(tmp_path / "c.db"), storage_options=s3.storage_options()
    )
    sink.bind("ck-1")
    sink.check(SCHEMA)
    assert sink.commit(0, stage(sink, 0, 10))
    intruder = IcebergSink(
        "db.owned", path, catalog_file=str(tmp_path / "c.db"), storage_options=s3.storage_options()
    )
    intruder.bind("ck-2")
    with pytest.raises(SinkError, match="did not commit"):
        intruder.check(SCHEMA)
    text = f"{sink.describe()} {sink!r}"
    assert s3.secret_access_key not in text and s3.access_key_id not in text
    with pytest.raises(SinkError, match="catalog_file") as err:
        IcebergSink("db.t", path, storage_options=s3.storage_options())
    assert s3.secret_access_key not in str(err.value)


def test_toml_iceberg_sink_settings(tmp_path: Path) -> None:
    base = {
        "source": {"bootstrap_servers": "localhost:1", "topics": ["t"]},
        "processor": {"type": "sessions"},
    }
    sink = {
        "type": "iceberg",
        "path": str(tmp_path / "wh"),
        "table": "db.sessions",
        "partition_by": ["topic", "day(kafka_ts)"],
        "catalog": {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db"},
        "table_properties": {"write.parquet.compression-codec": "zstd"},
    }
    built = build_pipeline(validate({**base, "sink": sink})).sink
    assert isinstance(built, IcebergSink)
    assert built.table == "db.sessions" and built.partition_by == ["topic", "day(kafka_ts)"]
    assert "cat.db" in built.describe()
    with pytest.raises(ConfigError, match=r"sink\.table is required"):
        validate({**base, "sink": {**sink, "table": ""}})
    with pytest.raises(ConfigError, match=r"dead_letter\.path"):
        validate({**base, "sink": sink, "dead_letter": {"path": str(tmp_path / "dl")}})


# -- kill -9 of the committing driver -------------------------------------------------------


def _run_writer(warehouse: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CRASH_WRITER), warehouse, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _check_exactly_once(warehouse: str, batches: int, rows: int) -> None:
    sink = IcebergSink("crash.ids", warehouse)
    table = sink.load_table()
    assert table is not None
    committed = [s[BATCH_ID_KEY] for s in batch_summaries(table)]
    assert sorted(committed, key=int) == [str(b) for b in range(batches)], committed
    ids = table.scan().to_arrow().column("id").to_pylist()
    assert_whole_batches(ids, rows, batches)


@pytest.mark.parametrize("point", ["before-commit", "after-commit"])
def test_kill9_around_the_catalog_commit_keeps_every_row_once(point: str, tmp_path: Path) -> None:
    warehouse = str(tmp_path / "wh")
    killed = _run_writer(warehouse, "4", "200", point, "2")
    assert killed.returncode == -9, killed.stderr
    assert "committed 1" in killed.stdout and "2" not in killed.stdout.split("committed 1")[1]
    done = _run_writer(warehouse, "4", "200")
    assert done.returncode == 0, done.stderr
    expected = "skipped 2" if point == "after-commit" else "committed 2"
    assert expected in done.stdout and "committed 3" in done.stdout
    _check_exactly_once(warehouse, 4, 200)


@pytest.mark.slow
def test_repeated_kill9_at_random_commit_points(tmp_path: Path) -> None:
    rng = random.Random(17)
    warehouse = str(tmp_path / "wh")
    # Six rounds of seed 17 kill before and after a commit, each following the other, at the
    # first and at the second of a run's two new batches; more rounds repeat those cases.
    rows, rounds = 100, 6
    for i in range(rounds):
        # Each run re-commits what earlier runs committed (skipped) and dies in a new batch.
        point = rng.choice(["before-commit", "after-commit"])
        kill_batch = rng.randrange(2 * i, 2 * i + 2)
        result = _run_writer(warehouse, str(2 * i + 2), str(rows), point, str(kill_batch))
        assert result.returncode == -9, (result.stdout, result.stderr)
    assert _run_writer(warehouse, str(2 * rounds), str(rows)).returncode == 0
    _check_exactly_once(warehouse, 2 * rounds, rows)


# -- a pipeline onto Iceberg -----------------------------------------------------------------


def test_session_pipeline_onto_iceberg_equals_parquet_and_the_truth(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    prefix = f"ice{random.randrange(10**9)}-"
    sim = simulate(small_simulation(prefix, 23, faulty=0.3), kafka.bootstrap_servers)

    def config(work: Path, sink: dict[str, Any]) -> dict[str, Any]:
        return sessions_config(
            kafka.bootstrap_servers,
            prefix,
            work,
            name="ice",
            max_offsets=700,
            integrity={"on_violation": "restart_session"},
            spark=TWO_LOCAL_CORES,
            sink=sink,
        )

    parquet_work, iceberg_work = tmp_path / "pq", tmp_path / "ice"
    build_pipeline(config(parquet_work, {"path": str(parquet_work / "output")})).run()
    ice_config = config(
        iceberg_work,
        {
            "type": "iceberg",
            "path": str(iceberg_work / "warehouse"),
            "table": "sessions.changes",
            "partition_by": ["topic", "day(kafka_ts)"],
        },
    )
    build_pipeline(ice_config).run()

    sink = build_pipeline(ice_config).sink
    assert isinstance(sink, IcebergSink)
    table = sink.load_table()
    assert table is not None
    changes = table.scan().to_arrow()
    assert_matches_truth(changes, sim.ground_truth)
    summaries = batch_summaries(table)
    assert len(summaries) >= 2 and all(json.loads(s[OFFSETS_KEY]) for s in summaries[1:])

    key = ["topic", "partition", "offset", "op", "row_id", "row"]
    parquet = read_committed(str(parquet_work / "output"), None)
    assert sorted(parquet.select(key).to_pylist(), key=str) == sorted(
        changes.select(key).to_pylist(), key=str
    )

    toml = iceberg_work / "pipeline.toml"
    toml.write_text(dump_toml(ice_config))
    target = load_target(str(toml))
    report = validate_output(target)
    assert report.ok, "\n".join(report.lines())
    assert sum(p.records for p in report.partitions) == sim.records
    view = OutputView(target.sink)
    tp = TopicPartition(f"{prefix}000", 0)
    assert view.count(tp) == sum(
        1
        for r in changes.select(["topic", "partition"]).to_pylist()
        if r == {"topic": tp.topic, "partition": 0}
    )


def test_summary_carries_file_digests_and_a_second_commit_is_refused(tmp_path: Path) -> None:
    sink = new_sink((str(tmp_path / "wh"), None), tmp_path, app_id="q")
    sink.check(SCHEMA)
    consumed = [ConsumedOffsets("in", 0, 0, 9)]
    assert sink.commit_consumed(0, stage(sink, 0, 100), consumed)
    table = sink.load_table()
    assert table is not None
    (summary,) = batch_summaries(table)
    files = json.loads(summary[FILES_KEY])
    assert sum(rows for rows, _ in files.values()) == 100
    assert all(p.startswith("data/") and len(digest) == 16 for p, (_, digest) in files.items())
    # A driver whose idempotency check missed the commit (a stale view, a twin driver).
    sink._already_committed = lambda table, batch_id: False  # type: ignore[method-assign]
    with pytest.raises(DuplicateCommitError, match="batch 0 of app id 'q' is already in"):
        sink.commit_consumed(0, stage(sink, 0, 100), consumed)
    table = sink.load_table()
    assert table is not None and len(table.snapshots()) == 1
