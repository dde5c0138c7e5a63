"""DeltaSink on local disk and S3 (SeaweedFS): one idempotent Delta commit per batch."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from tests.fixtures.sink_cases import stage_batch

from inorder.sinks.base import ConsumedOffsets, DuplicateCommitError, SinkError, WrittenFile
from inorder.sinks.commit_keys import BATCH_ID_KEY, FILES_KEY, OFFSETS_KEY
from inorder.sinks.delta import DeltaSink
from inorder.sinks.delta_maintenance import compact_delta
from inorder.storage import fs as sfs

SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("kafka_ts", pa.timestamp("ns", tz="UTC")),
        ("payload", pa.string()),
    ]
)


def make_batch(batch_id: int, rows: int) -> pa.RecordBatch:
    start = batch_id * rows
    return pa.record_batch(
        [
            pa.array(["a" if i % 3 else "b" for i in range(rows)]),
            pa.array([i % 2 for i in range(rows)], pa.int32()),
            pa.array(range(start, start + rows), pa.int64()),
            pa.array([(start + i) * 1000 for i in range(rows)], pa.timestamp("ns", tz="UTC")),
            pa.array([f"payload-{start + i}" for i in range(rows)]),
        ],
        schema=SCHEMA,
    )


def stage(sink: DeltaSink, batch_id: int, rows: int, key: str = "t") -> list[WrittenFile]:
    return stage_batch(sink, batch_id, make_batch(batch_id, rows), key=key)


def read(path: str, options: dict[str, str] | None) -> pa.Table:
    return DeltaTable(path, storage_options=options).to_pyarrow_table()


def test_one_commit_per_batch_with_app_transaction(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    path, options = sink_location
    sink = DeltaSink(path, partition_by=["topic"], storage_options=options, app_id="q1")
    sink.check(SCHEMA)
    for b in range(3):
        assert sink.commit(b, stage(sink, b, 1000)) is True
    table = DeltaTable(path, storage_options=options)
    assert table.version() == 3  # create + one commit per batch
    assert table.transaction_version("q1") == 2
    data = table.to_pyarrow_table()
    assert sorted(data.column("offset").to_pylist()) == list(range(3000))
    assert data.schema.field("kafka_ts").type == pa.timestamp("us", tz="UTC")
    assert table.metadata().partition_columns == ["topic"]
    assert sink.is_committed(2) and not sink.is_committed(3)
    stats = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert all(row["num_records"] > 0 and row["min.offset"] is not None for row in stats)


def test_committed_batch_is_skipped_and_its_new_files_deleted(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    path, options = sink_location
    sink = DeltaSink(path, partition_by=["topic"], storage_options=options)
    sink.check(SCHEMA)
    assert sink.commit(0, stage(sink, 0, 500))
    assert sink.commit(1, stage(sink, 1, 500))
    rerun = stage(sink, 0, 500, key="rerun")
    loc = sfs.resolve(path, options)
    assert all(sfs.exists(loc, loc.join(f.path)) for f in rerun)
    assert sink.commit(0, rerun) is False
    assert not any(sfs.exists(loc, loc.join(f.path)) for f in rerun)
    assert DeltaTable(path, storage_options=options).version() == 2
    assert read(path, options).num_rows == 1000


def test_uncommitted_files_are_invisible_and_abort_deletes(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    sink = DeltaSink(path)
    sink.check(SCHEMA)
    files = stage(sink, 0, 100)
    assert read(path, None).num_rows == 0
    writer = sink.open_writer(SCHEMA, 0, "x")
    writer.write(make_batch(0, 10))
    writer.abort()
    assert sink.commit(0, files)
    assert read(path, None).num_rows == 100
    parquet = [n for _, _, names in os.walk(path) for n in names if n.endswith(".parquet")]
    assert len(parquet) == len(files)


def test_check_errors(tmp_path: Path, s3: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SinkError, match="file/t"):
        DeltaSink(str(blocker / "t")).check(SCHEMA)
    with pytest.raises(SinkError, match="bucket 'missing-bucket-x' does not exist"):
        DeltaSink("s3://missing-bucket-x/t", storage_options=s3.storage_options()).check(SCHEMA)
    bad = {**s3.storage_options(), "AWS_SECRET_ACCESS_KEY": "bad-secret-xyz"}
    with pytest.raises(SinkError) as info:
        DeltaSink(s3.new_prefix(), storage_options=bad).check(SCHEMA)
    assert "bad-secret-xyz" not in str(info.value) and "\n" not in str(info.value)
    path = str(tmp_path / "parts")
    DeltaSink(path, partition_by=["topic"]).check(SCHEMA)
    with pytest.raises(SinkError, match="partitioned by"):
        DeltaSink(path, partition_by=["partition"]).check(SCHEMA)


def test_full_compaction_merges_and_vacuums(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    path, options = sink_location
    sink = DeltaSink(path, partition_by=["topic"], storage_options=options)
    sink.check(SCHEMA)
    for b in range(5):
        sink.commit(b, stage(sink, b, 300))
    before = len(DeltaTable(path, storage_options=options).file_uris())
    assert before == 20
    dry = compact_delta(path, options, dry_run=True, full=True)
    assert dry.files_added == 0 and dry.files_removed == 20
    report = compact_delta(path, options, full=True)
    assert report.files_removed == 20 and report.files_added == 2
    assert report.vacuumed == []  # the 7-day retention keeps replaced files
    vacuumed = compact_delta(path, options, retention_hours=0)
    assert len(vacuumed.vacuumed) == 20
    table = DeltaTable(path, storage_options=options)
    assert len(table.file_uris()) == 2
    assert sorted(table.to_pyarrow_table().column("offset").to_pylist()) == list(range(1500))
    assert sink.commit(5, stage(sink, 5, 300))
    assert read(path, options).num_rows == 1800


def test_compact_command_detects_delta(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from inorder import cli

    path = str(tmp_path / "t")
    sink = DeltaSink(path)
    sink.check(SCHEMA)
    for b in range(3):
        sink.commit(b, stage(sink, b, 100))
    assert cli.main(["compact", path, "--json"]) == 0  # the level rule: 6 < 9 files wait
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "delta" and out["files_removed"] == 0
    assert cli.main(["compact", path, "--json", "--full"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["files_removed"] == 6 and out["files_added"] == 1


def test_a_table_of_another_checkpoint_is_refused(tmp_path: Path) -> None:
    """Batch ids restart with every checkpoint: a second checkpoint on a table holding data
    would commit every record again (before: 20 rows of 10 records, silently)."""
    path = str(tmp_path / "table")
    first = DeltaSink(path, partition_by=["topic"])
    first.bind("checkpoint-a")
    assert first.app_id == "inorder-checkpoint-a"
    first.check(SCHEMA)
    assert first.commit(0, stage(first, 0, 10)) is True
    second = DeltaSink(path, partition_by=["topic"])
    second.bind("checkpoint-b")
    with pytest.raises(SinkError, match="did not commit"):
        second.check(SCHEMA)
    again = DeltaSink(path, partition_by=["topic"])
    again.bind("checkpoint-a")
    again.check(SCHEMA)  # the checkpoint that wrote it goes on
    assert len(DeltaTable(path).to_pyarrow_table()) == 10


def test_a_different_output_schema_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "table")
    sink = DeltaSink(path, partition_by=["topic"], app_id="q")
    sink.check(SCHEMA)
    assert sink.commit(0, stage(sink, 0, 10)) is True
    retyped = SCHEMA.set(4, pa.field("payload", pa.int64()))
    with pytest.raises(SinkError, match=r"columns differ.*table only: \['payload'\]"):
        DeltaSink(path, partition_by=["topic"], app_id="q").check(retyped)


def test_log_is_checkpointed_and_expired_entries_deleted(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    """delta-rs checkpoints the log and deletes expired entries after our commits."""
    import time

    path, options = sink_location
    sink = DeltaSink(
        path,
        partition_by=["topic"],
        storage_options=options,
        app_id="bounded",
        table_properties={
            "delta.checkpointInterval": "5",
            "delta.logRetentionDuration": "interval 1 second",
        },
    )
    sink.check(SCHEMA)
    batches = 22
    for batch_id in range(batches):
        assert sink.commit(batch_id, stage(sink, batch_id, 6)) is True
        if batch_id == 11:
            time.sleep(1.5)  # entries up to here expire
    loc = sfs.resolve(path, options)
    log = sorted(i.base_name for i in sfs.list_files(loc, loc.join("_delta_log")))
    assert any(n.endswith(".checkpoint.parquet") for n in log), log
    assert f"{0:020d}.json" not in log and f"{5:020d}.json" not in log, log
    assert sum(n.endswith(".json") for n in log) <= 15, log  # from the checkpoint before expiry
    # The application transaction survives in the checkpoint: old batches stay committed.
    again = DeltaSink(path, partition_by=["topic"], storage_options=options, app_id="bounded")
    assert again.last_committed_batch() == batches - 1
    assert again.is_committed(2)
    assert again.commit(3, stage(again, 3, 6, key="r")) is False
    table = DeltaTable(loc.delta_uri(), storage_options=loc.storage_options())
    offsets = table.to_pyarrow_table(columns=["offset"]).column("offset").to_pylist()
    assert sorted(offsets) == list(range(batches * 6))


def test_commit_info_carries_offsets_and_file_digests(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "t"), partition_by=["topic"], app_id="q")
    sink.check(SCHEMA)
    for b in range(2):
        consumed = [ConsumedOffsets("in", 0, b * 10, b * 10 + 9)]
        assert sink.commit_consumed(b, stage(sink, b, 100), consumed)
    entries = [h for h in DeltaTable(str(tmp_path / "t")).history() if BATCH_ID_KEY in h]
    by_batch = {int(h[BATCH_ID_KEY]): h for h in entries}
    assert json.loads(by_batch[0][OFFSETS_KEY]) == {"in/0": [0, 10]}
    assert json.loads(by_batch[1][OFFSETS_KEY]) == {"in/0": [10, 20]}
    files = json.loads(by_batch[1][FILES_KEY])
    assert sum(rows for rows, _ in files.values()) == 100
    assert all(digest and len(digest) == 16 for _, digest in files.values())


def test_a_second_commit_of_one_batch_is_refused_at_the_commit_point(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    sink = DeltaSink(path, partition_by=["topic"], app_id="q")
    sink.check(SCHEMA)
    assert sink.commit(0, stage(sink, 0, 100))
    # A driver whose idempotency check missed the commit (a stale view, a twin driver).
    sink._already_committed = lambda table, batch_id: False  # type: ignore[method-assign]
    with pytest.raises(DuplicateCommitError, match="batch 0 of app id 'q' is already in"):
        sink.commit(0, stage(sink, 0, 100, key="twin"))
    assert DeltaTable(path).version() == 1
    assert read(path, None).num_rows == 100


def test_an_unpartitioned_table_answers_filters_on_every_column(tmp_path: Path) -> None:
    # deltalake reads a column without min/max statistics as "column >= null" and skips every
    # file on a filter over it: the table held 30 rows and `topic == 'a'` read none of them
    # (so did inorder's own readers: validate, replay, repair, inspect).
    import datetime as dt
    import decimal

    import pyarrow.dataset as ds

    from inorder.ops.output import OutputView
    from inorder.records import TopicPartition

    long_text = "x" * 100
    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("kafka_ts", pa.timestamp("us", tz="UTC")),
            ("local_ts", pa.timestamp("us")),
            ("text", pa.string()),
            ("flag", pa.bool_()),
            ("amount", pa.decimal128(10, 3)),
            ("day", pa.date32()),
        ]
    )
    stamps = [dt.datetime(2026, 11, 26, 14, 0, 0, 123_456 + i, tzinfo=dt.UTC) for i in range(6)]
    rows = {
        "topic": ["a", "b", "a", "b", "a", "b"],
        "partition": [0, 0, 1, 1, 0, 0],
        "offset": list(range(6)),
        "kafka_ts": stamps,
        "local_ts": [s.replace(tzinfo=None) for s in stamps],
        "text": [long_text + "z", long_text, "m", "n", "o", long_text + "\u00ff"],
        "flag": [True, False, True, False, True, True],
        "amount": [decimal.Decimal(f"{i}.125") for i in range(6)],
        "day": [dt.date(2026, 11, 20 + i) for i in range(6)],
    }
    sink = DeltaSink(str(tmp_path / "t"))
    sink.check(schema)
    assert sink.commit(0, stage_batch(sink, 0, pa.record_batch(rows, schema=schema), tasks=2))
    dataset = DeltaTable(str(tmp_path / "t")).to_pyarrow_dataset()
    for name, values in rows.items():
        for value in {str(v): v for v in values}.values():
            expected = values.count(value)
            found = dataset.count_rows(
                filter=ds.field(name) == pa.scalar(value, schema.field(name).type)
            )
            assert found == expected, (name, value, found, expected)
    view = OutputView(sink)
    assert view.count(TopicPartition("a", 0)) == 2
    assert view.count(TopicPartition("b", 0), 4) == 1


@pytest.mark.parametrize("partition_by", [[], ["topic"]])
def test_inorder_reads_files_without_string_bounds_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partition_by: list[str]
) -> None:
    # Files of the previous release: bounds for numbers and dates only. deltalake's own
    # dataset skips them on a topic filter; inorder's readers must not.
    import pyarrow.dataset as ds

    import inorder.sinks.delta_stats as delta_stats
    from inorder.ops.output import OutputView
    from inorder.records import TopicPartition

    sink = DeltaSink(str(tmp_path / "t"), partition_by=partition_by)
    sink.check(SCHEMA)
    older = (pa.types.is_integer, pa.types.is_floating, pa.types.is_date)
    with monkeypatch.context() as patched:
        patched.setattr(delta_stats, "_BOUNDED", older)
        assert sink.commit(0, stage(sink, 0, 30))
    assert sink.commit(1, stage(sink, 1, 30))  # this release's files beside them
    if not partition_by:  # the reason for the reader below
        plain = DeltaTable(str(tmp_path / "t")).to_pyarrow_dataset()
        assert plain.count_rows(filter=ds.field("topic") == "a") == 20  # batch 1's only
    view = OutputView(sink)
    assert view.count(TopicPartition("a", 0)) == 20
    assert view.count(TopicPartition("a", 1), 40) == 7
    assert view.read(TopicPartition("b", 0)).num_rows == 10
    assert sum(n for n, _, _ in view.partitions().values()) == 60


def test_a_twin_commit_after_the_guard_is_refused_by_the_log(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    sink = DeltaSink(path, partition_by=["topic"], app_id="q")
    sink.check(SCHEMA)
    twin = DeltaSink(path, partition_by=["topic"], app_id="q")
    twin.check(SCHEMA)
    guard = sink._guard

    def twin_wins(batch_id: int) -> None:
        guard(batch_id)  # nothing there yet: the guard lets the commit through ...
        assert twin.commit(batch_id, stage(twin, batch_id, 50, key="twin"))  # ... then a twin

    sink._guard = twin_wins  # type: ignore[method-assign]
    with pytest.raises(DuplicateCommitError, match="was committed by another writer"):
        sink.commit(0, stage(sink, 0, 100))
    assert DeltaTable(path).version() == 1
    assert read(path, None).num_rows == 50
