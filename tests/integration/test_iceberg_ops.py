"""The operations tools on an Iceberg output: batch offset ranges, inspect, repair, compact."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.fixtures.sessions_job import (
    RESTART_SESSION,
    TWO_LOCAL_CORES,
    check_truth,
    sessions_config,
    small_simulation,
)

from inorder.assemble import build_pipeline, load_target
from inorder.checkpoint.layout import CheckpointLayout
from inorder.commands.run import dump_toml
from inorder.dev.simulator import simulate
from inorder.ops.kafka_reads import watermarks
from inorder.ops.repair import apply_repair, plan_repair
from inorder.pipeline.runner import PipelineRunner
from inorder.records import TopicPartition
from inorder.sinks.base import ConsumedOffsets, SinkError, WrittenFile
from inorder.sinks.iceberg import IcebergSink
from inorder.sinks.iceberg_compaction import compact_iceberg, tiered_files
from inorder.sinks.iceberg_history import (
    BATCH_ID_KEY,
    OFFSETS_KEY,
    ROW_OFFSETS_KEY,
    batch_summaries,
    snapshot_history,
)
from inorder.sinks.offset_ids import BatchIdOffset

SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("payload", pa.string()),
        ("batch_id", pa.int64()),
    ]
)


def rows(batch_id: int, offsets: dict[tuple[str, int], range]) -> pa.RecordBatch:
    """One output row per offset given."""
    cells = [(t, p, o) for (t, p), r in sorted(offsets.items()) for o in r]
    return pa.record_batch(
        [
            pa.array([t for t, _, _ in cells]),
            pa.array([p for _, p, _ in cells], pa.int32()),
            pa.array([o for _, _, o in cells], pa.int64()),
            pa.array([f"{t}/{p}@{o}" for t, p, o in cells]),
            pa.array([batch_id] * len(cells), pa.int64()),
        ],
        schema=SCHEMA,
    )


def stage(sink: Any, batch_id: int, offsets: dict[tuple[str, int], range]) -> list[WrittenFile]:
    """Each topic-partition's rows through its own task writer, as executors would."""
    files: list[WrittenFile] = []
    for (t, p), r in sorted(offsets.items()):
        writer = sink.open_writer(SCHEMA, batch_id, f"{t}-{p}")
        writer.write(rows(batch_id, {(t, p): r}))
        files += writer.close()
    return files


def new_sink(tmp_path: Path, partition_by: tuple[str, ...] = ("topic",)) -> IcebergSink:
    sink = IcebergSink(
        "db.events",
        str(tmp_path / "wh"),
        partition_by=partition_by,
        catalog_file=str(tmp_path / "catalog.db"),
    )
    sink.bind("ck-1")
    sink.check(SCHEMA)
    return sink


def ranges_of(sink: IcebergSink) -> list[dict[str, list[int]]]:
    """``inorder.offsets`` of every batch snapshot, oldest first."""
    table = sink.load_table()
    assert table is not None
    return [json.loads(s[OFFSETS_KEY]) for s in reversed(batch_summaries(table, sink.app_id))]


def all_rows(sink: IcebergSink, snapshot_id: int | None = None) -> list[tuple[Any, ...]]:
    table = sink.load_table()
    assert table is not None
    data = table.scan(snapshot_id=snapshot_id).to_arrow()
    return sorted(zip(*(data.column(c).to_pylist() for c in SCHEMA.names), strict=True))


def test_batch_offsets_are_the_consumed_ranges_and_tile_each_partition(tmp_path: Path) -> None:
    sink = new_sink(tmp_path)
    c = ConsumedOffsets
    # Batch 0: a/0 consumed 0..9 with rows; a/1 nothing yet; b/0 consumed 0..4, no row.
    sink.commit_consumed(
        0,
        stage(sink, 0, {("a", 0): range(0, 10)}),
        [c("a", 0, 0, 9), c("a", 1, None, -1), c("b", 0, 0, 4)],
    )
    # Batch 1: a/0 rows for some records only; a/1 its first records; b/0 no record.
    sink.commit_consumed(
        1,
        stage(sink, 1, {("a", 0): range(12, 15), ("a", 1): range(0, 4)}),
        [c("a", 0, 10, 19), c("a", 1, 0, 3), c("b", 0, None, 4)],
    )
    assert ranges_of(sink) == [
        {"a/0": [0, 10], "b/0": [0, 5]},
        {"a/0": [10, 20], "a/1": [0, 4], "b/0": [5, 5]},
    ]
    table = sink.load_table()
    assert table is not None
    # The rows' own first and last offsets are kept apart from the consumed ranges.
    assert json.loads(batch_summaries(table)[0][ROW_OFFSETS_KEY]) == {
        "a/0": [12, 14],
        "a/1": [0, 3],
    }

    # A repair cuts a/0 at 13: its next batch starts there, not at the old end 20.
    sink.delete_from({("a", 0): 13}, expected=2)
    assert [o for _, _, o, _, _ in all_rows(sink) if o >= 13] == []
    # After a repair the runner numbers batches from an offset: the ranges still reach the sink.
    shifted = BatchIdOffset(sink, 2)
    assert shifted.commit_consumed(
        0,
        stage(shifted, 0, {("a", 0): range(13, 15)}),
        [c("a", 0, 13, 21), c("a", 1, None, 3), c("b", 0, 7, 8)],
    )
    assert ranges_of(sink)[-1] == {"a/0": [13, 22], "a/1": [4, 4], "b/0": [5, 9]}
    assert sink.last_committed_batch() == 2
    # A commit without the consumed offsets (a direct API call) records no ranges.
    assert sink.commit(3, stage(sink, 3, {("b", 0): range(9, 10)}))
    table = sink.load_table()
    assert table is not None
    newest = batch_summaries(table)[0]
    assert newest[BATCH_ID_KEY] == "3" and OFFSETS_KEY not in newest

    history = snapshot_history(table)
    assert [s.kind for s in history] == ["batch", "batch", "repair", "batch", "batch"]
    assert history[2].offsets == {"a/0": [13, 13]} and history[2].batch_id is None
    # Copy-on-write: the file holding 12..14 was rewritten with 12 only.
    assert (history[2].deleted_records, history[2].added_records) == (3, 1)
    assert [s.batch_id for s in snapshot_history(table, limit=2)] == [2, 3]


def test_compaction_is_one_snapshot_that_is_never_taken_for_a_batch(tmp_path: Path) -> None:
    sink = new_sink(tmp_path)
    c = ConsumedOffsets
    for b in range(6):
        sink.commit_consumed(
            b,
            stage(sink, b, {("a", 0): range(10 * b, 10 * b + 10), ("b", 1): range(b, b + 1)}),
            [c("a", 0, 10 * b, 10 * b + 9), c("b", 1, b, b)],
        )
    table = sink.load_table()
    assert table is not None
    before_rows, before_snapshot = all_rows(sink), table.current_snapshot()
    assert before_snapshot is not None
    before_files = len(list(table.scan().plan_files()))
    assert before_files == 12

    planned = compact_iceberg(sink, 64 * 1024 * 1024, dry_run=True, full=True)
    assert (planned.groups, planned.files_replaced, planned.rows) == (2, 12, 66)
    table = sink.load_table()
    assert table is not None and len(table.snapshots()) == 6  # the dry run changed nothing

    done = compact_iceberg(sink, 64 * 1024 * 1024, full=True)
    assert done.files_written == 2 and done.snapshot_id is not None
    table = sink.load_table()
    assert table is not None
    assert len(list(table.scan().plan_files())) == 2
    assert all_rows(sink) == before_rows
    # Readers of the snapshot before it still read its files.
    assert all_rows(sink, before_snapshot.snapshot_id) == before_rows
    assert snapshot_history(table)[-1].kind == "compact"
    assert snapshot_history(table)[-1].batch_id is None

    # The batch summaries stay the exactly-once record: a re-run of batch 5 adds nothing,
    # batch 6 commits, and its ranges continue where batch 5 left them.
    assert sink.last_committed_batch() == 5
    assert sink.commit_consumed(5, stage(sink, 5, {("a", 0): range(50, 60)}), []) is False
    assert sink.commit_consumed(6, stage(sink, 6, {("a", 0): range(60, 61)}), [c("a", 0, 60, 60)])
    assert ranges_of(sink)[-1] == {"a/0": [60, 61]}
    assert ranges_of(sink)[-2] == {"a/0": [50, 60], "b/1": [5, 6]}
    assert len(all_rows(sink)) == 67
    # Topic a's merged file and batch 6's file merge again; topic b's one file stays.
    table = sink.load_table()
    assert table is not None
    count, before_rows = len(table.snapshots()), all_rows(sink)
    assert compact_iceberg(sink, 64 * 1024 * 1024, full=True).groups == 1
    table = sink.load_table()
    assert table is not None and len(table.snapshots()) == count + 1
    assert all_rows(sink) == before_rows and len(before_rows) == 67

    # Levels are in the file names: the first merge wrote level 1, the second level 2.
    names = sorted(t.file.file_path.rsplit("/", 1)[-1] for t in table.scan().plan_files())
    assert [n[:12] for n in names] == ["compacted-l1", "compacted-l2"], names

    # The command line, on the warehouse path.
    done_cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "inorder.cli",
            "compact",
            str(tmp_path / "wh"),
            "--format",
            "iceberg",
            "--table",
            "db.events",
            "--catalog-file",
            str(tmp_path / "catalog.db"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done_cli.returncode == 0, done_cli.stderr
    assert json.loads(done_cli.stdout)["format"] == "iceberg"

    # A table whose partition spec evolved is left to the engines' procedures.
    table = sink.load_table()
    assert table is not None
    with table.update_spec() as spec:
        spec.add_identity("partition")
    with pytest.raises(SinkError, match="rewrite_data_files"):
        compact_iceberg(sink, 64 * 1024 * 1024)


def test_iceberg_compaction_by_the_level_rule(tmp_path: Path) -> None:
    """Fan-in 3, 2 levels: 12 batch files become 4 of level 1 (one snapshot), then 3 of
    those one final file of level 2 (a second snapshot); the fourth waits."""
    sink = new_sink(tmp_path)
    for b in range(12):
        sink.commit_consumed(
            b, stage(sink, b, {("a", 0): range(b, b + 1)}), [ConsumedOffsets("a", 0, b, b)]
        )
    before = all_rows(sink)
    report = compact_iceberg(sink, 64 * 1024 * 1024, fanout=3, levels=2)
    assert (report.groups, report.files_replaced, report.files_written) == (5, 15, 5)
    table = sink.load_table()
    assert table is not None
    names = sorted(t.file.file_path.rsplit("/", 1)[-1][:12] for t in table.scan().plan_files())
    assert names == ["compacted-l1", "compacted-l2"]
    assert [s.kind for s in snapshot_history(table)][-3:] == ["batch", "compact", "compact"]
    # A merged file is as old as its oldest input (its name says when that was committed),
    # not as young as its merge: the level-2 file holds batch 0's rows, the level-1 file
    # batches 9-11.
    batch_times = sorted(s.timestamp_ms / 1000 for s in table.snapshots())[:12]
    aged = {
        t.level: t.committed_at
        for t in tiered_files(table, [task.file for task in table.scan().plan_files()])
    }
    assert aged == {2: batch_times[0], 1: batch_times[9]}, (aged, batch_times)
    assert all_rows(sink) == before
    assert compact_iceberg(sink, 64 * 1024 * 1024, fanout=3, levels=2).groups == 0
    with pytest.raises(SinkError, match="compaction_fanout"):
        compact_iceberg(sink, 64 * 1024 * 1024, fanout=1)


def test_an_iceberg_merge_splits_at_the_target(tmp_path: Path) -> None:
    sink = new_sink(tmp_path)
    for b in range(4):
        rows = range(50 * b, 50 * b + 50)
        sink.commit_consumed(
            b, stage(sink, b, {("a", 0): rows}), [ConsumedOffsets("a", 0, 50 * b, 50 * b + 49)]
        )
    table = sink.load_table()
    assert table is not None
    size = sum(t.file.file_size_in_bytes for t in table.scan().plan_files())
    before = all_rows(sink)
    report = compact_iceberg(sink, size // 2 + 1, full=True)
    assert (report.groups, report.files_replaced, report.files_written) == (1, 4, 2)
    assert all_rows(sink) == before


# -- a pipeline onto Iceberg: lose state, repair, run: exact -----------------------------------


def lose_state(checkpoint: Path) -> None:
    """The crash: every partition's engine state is gone, Spark's logs are intact."""
    import shutil

    state = checkpoint / "engine" / "state"
    for victim in sorted(p for p in state.glob("*/*") if p.is_dir()):
        shutil.rmtree(victim)
    shutil.rmtree(state / "_deltas", ignore_errors=True)  # the task files (state format 3)


def test_repair_of_an_iceberg_output_restores_the_truth(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    prefix = f"icerepair{random.randrange(10**9)}-"
    sim = simulate(
        small_simulation(prefix, 7, faulty=0.0, messages=1600, restart_every=90),
        kafka.bootstrap_servers,
    )
    config = sessions_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        name="icerepair",
        max_offsets=400,
        integrity=RESTART_SESSION,
        spark=TWO_LOCAL_CORES,
        sink={
            "type": "iceberg",
            "path": str(tmp_path / "warehouse"),
            "table": "sessions.changes",
            "partition_by": ["topic"],
        },
    )
    toml = tmp_path / "pipeline.toml"
    toml.write_text(dump_toml(config))
    checkpoint = tmp_path / "checkpoint"

    def run(batches: int | None = None) -> None:
        PipelineRunner(build_pipeline(config), stop_after_batches=batches).run()

    def output() -> pa.Table:
        sink = build_pipeline(config).sink
        assert isinstance(sink, IcebergSink)
        table = sink.load_table()
        assert table is not None
        return table.scan().to_arrow()

    run(batches=2)
    lose_state(checkpoint)
    run()  # carries on with empty state: wrong output from there
    assert check_truth(output(), sim.ground_truth), "the crash did no harm"
    owner = CheckpointLayout.of(checkpoint).read_info()["id"]  # type: ignore[index]

    target = load_target(str(toml))
    plan = apply_repair(target, plan_repair(target, use_validate=True))
    assert plan.applied and plan.outputs[0].rows > 0 and plan.batch_offset > 0
    assert plan.outputs[0].kind == "iceberg"
    sink = target.sink
    assert isinstance(sink, IcebergSink)
    sink.bind(owner)
    # The delete kept the batch summaries: batch ids continue after the last one.
    assert sink.last_committed_batch() == plan.batch_offset - 1
    assert plan_repair(load_target(str(toml))).nothing_to_do

    run()
    problems = check_truth(output(), sim.ground_truth)
    assert not problems, "\n".join(problems[:20])

    # Every partition's batch ranges tile it from its first offset to the log's end: each
    # batch starts where the previous one (or the repair) left it.
    table = sink.load_table()
    assert table is not None
    history = snapshot_history(table)
    kinds = [s.kind for s in history]
    # One commit; pyiceberg makes two snapshots of it when it both drops and rewrites files.
    assert 1 <= kinds.count("repair") <= 2 and set(kinds) == {"batch", "repair"}
    assert max(s.batch_id or 0 for s in history) >= plan.batch_offset
    position: dict[str, int] = {}
    for s in history:
        for tp, (start, end) in s.offsets.items():
            if s.kind == "batch":
                assert position.get(tp, start) == start, (tp, s)
                assert start <= end
            position[tp] = end
    # Two sites, two partitions each; a partition no session was keyed to (the keys carry the
    # run's random prefix) has no records and no range.
    topics = sorted({name.rsplit("/", 1)[0] for name in position})
    assert len(topics) == 2, position
    every = [TopicPartition(t, p) for t in topics for p in (0, 1)]
    ends = watermarks(target.source_options, every)
    written = {f"{tp.topic}/{tp.partition}": ends[tp].high for tp in every if ends[tp].high > 0}
    assert written == position

    shown = subprocess.run(
        [sys.executable, "-m", "inorder.cli", "inspect", str(toml), "--batches", "--limit", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr
    assert " repair " in shown.stdout and f"batch {plan.batch_offset} " in shown.stdout

    # Compacting the repaired table keeps it exact.
    compact_iceberg(sink, 64 * 1024 * 1024)
    assert not check_truth(output(), sim.ground_truth)
    assert sink.last_committed_batch() == max(s.batch_id or 0 for s in history)


def test_expiring_the_last_batch_snapshot_stops_the_next_run(tmp_path: Path) -> None:
    sink = new_sink(tmp_path)
    for b in range(2):
        sink.commit_consumed(
            b, stage(sink, b, {("a", 0): range(b, b + 1)}), [ConsumedOffsets("a", 0, b, b)]
        )
    compact_iceberg(sink, 64 * 1024 * 1024, full=True)
    table = sink.load_table()
    assert table is not None
    current = table.current_snapshot()
    assert current is not None
    older = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current.snapshot_id]
    table.maintenance.expire_snapshots().by_ids(older).commit()

    again = IcebergSink(
        "db.events",
        str(tmp_path / "wh"),
        partition_by=["topic"],
        catalog_file=str(tmp_path / "catalog.db"),
    )
    again.bind("ck-1")
    assert again.last_committed_batch() is None  # the record is gone with its snapshot
    with pytest.raises(SinkError, match="did not commit"):
        again.check(SCHEMA)


def test_iceberg_compaction_rebases_on_a_batch_committed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch every few seconds beside a compaction: the merge's commit, made stale by the
    batch, is made again on the newer snapshot (its inputs still live); all rows once."""
    from inorder.sinks import iceberg_compaction

    sink = new_sink(tmp_path)
    for b in range(3):
        sink.commit_consumed(
            b, stage(sink, b, {("a", 0): range(b, b + 1)}), [ConsumedOffsets("a", 0, b, b)]
        )
    real = iceberg_compaction._overwrite
    calls: list[int] = []

    def batch_lands_first(table: Any, groups: Any, added: Any) -> int | None:
        calls.append(len(calls))
        if len(calls) == 1:  # batch 3 commits between the merge's planning and its commit
            sink.commit_consumed(
                3, stage(sink, 3, {("a", 0): range(3, 4)}), [ConsumedOffsets("a", 0, 3, 3)]
            )
        return real(table, groups, added)

    monkeypatch.setattr(iceberg_compaction, "_overwrite", batch_lands_first)
    report = compact_iceberg(sink, 64 * 1024 * 1024, fanout=3, levels=2)
    assert report.groups == 1 and len(calls) == 2  # the stale commit failed, the rebase held
    assert sorted(r[2] for r in all_rows(sink)) == [0, 1, 2, 3]
    assert sink.last_committed_batch() == 3
    table = sink.load_table()
    assert table is not None
    names = sorted(t.file.file_path.rsplit("/", 1)[-1][:12] for t in table.scan().plan_files())
    assert names[0] == "compacted-l1" and len(names) == 2  # the merge, and batch 3's file

    # Another writer replaced an input: nothing is committed, the merged files are deleted.
    for b in range(4, 6):
        sink.commit_consumed(
            b, stage(sink, b, {("a", 0): range(b, b + 1)}), [ConsumedOffsets("a", 0, b, b)]
        )

    def replaced_first(table: Any, groups: Any, added: Any) -> int | None:
        if calls[-1] != -1:
            calls.append(-1)
            compact_iceberg(sink, 64 * 1024 * 1024, fanout=3, levels=2)  # merges them first
        return real(table, groups, added)

    monkeypatch.setattr(iceberg_compaction, "_overwrite", replaced_first)
    with pytest.raises(SinkError, match="another writer replaced files of the compaction"):
        compact_iceberg(sink, 64 * 1024 * 1024, fanout=3, levels=2)
    assert sorted(r[2] for r in all_rows(sink)) == list(range(6))


def test_the_iceberg_sink_merges_beside_its_commits(tmp_path: Path) -> None:
    """``compact=True``: the level rule's merges run in a driver thread after the commits,
    fenced by the lease check, and finish with the run; every row once."""
    from inorder.sinks.compaction_levels import LevelSettings

    sink = new_sink(tmp_path)
    sink.compact, sink.compaction = True, LevelSettings(64 * 1024 * 1024, fanout=3, levels=2)
    checks: list[int] = []
    sink.guard_background(lambda: checks.append(1))
    for b in range(6):
        sink.commit_consumed(
            b, stage(sink, b, {("a", 0): range(b, b + 1)}), [ConsumedOffsets("a", 0, b, b)]
        )
    assert sink.finish_background(timeout=120) is None
    assert sorted(r[2] for r in all_rows(sink)) == list(range(6))
    table = sink.load_table()
    assert table is not None
    names = {t.file.file_path.rsplit("/", 1)[-1][:12] for t in table.scan().plan_files()}
    assert "compacted-l1" in names or "compacted-l2" in names, names
    assert checks  # the lease was checked before the merges' commits
    assert sink.last_committed_batch() == 5
