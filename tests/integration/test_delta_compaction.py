"""The Delta sink's tiered compaction: the level rule, one Delta commit per round, digests
recorded for ``inorder verify``, never the same files merged twice."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from tests.fixtures.sink_cases import stage_batch

from inorder.ops.verify import verify
from inorder.sinks.base import SinkError
from inorder.sinks.commit_keys import COMPACT, FILES_KEY, OPERATION_KEY
from inorder.sinks.compaction_levels import LevelSettings
from inorder.sinks.delta import DeltaSink
from inorder.sinks.delta_compaction import DeltaTarget, compact_delta_levels, live_files

SCHEMA = pa.schema([("topic", pa.string()), ("offset", pa.int64()), ("payload", pa.string())])


def batch(batch_id: int, rows: int = 10) -> pa.RecordBatch:
    start = batch_id * rows
    return pa.record_batch(
        [
            pa.array(["a" if i % 2 else "b" for i in range(rows)]),
            pa.array(range(start, start + rows), pa.int64()),
            pa.array([f"p-{start + i}" for i in range(rows)]),
        ],
        schema=SCHEMA,
    )


def offsets(path: str, options: dict[str, str] | None = None) -> list[int]:
    table = DeltaTable(path, storage_options=options).to_pyarrow_table()
    return sorted(table.column("offset").to_pylist())


def target(sink: DeltaSink) -> DeltaTarget:
    return DeltaTarget(sink.location, sink.partition_by, sink.compression, sink.describe())


def commit_batches(sink: DeltaSink, first: int, count: int) -> None:
    for b in range(first, first + count):
        assert sink.commit(b, stage_batch(sink, b, batch(b), tasks=1))


def log_actions(path: str) -> list[dict[str, Any]]:
    entries = []
    for name in sorted(os.listdir(Path(path) / "_delta_log")):
        if name.endswith(".json"):
            for line in (Path(path) / "_delta_log" / name).read_text().splitlines():
                entries.append(json.loads(line))
    return entries


def test_the_sink_merges_by_the_level_rule_and_verify_stays_exact(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    path, options = sink_location
    sink = DeltaSink(
        path,
        partition_by=["topic"],
        storage_options=options,
        compact=True,
        compact_in_background=False,
        compaction_fanout=3,
    )
    sink.check(SCHEMA)
    sink.compactor.clock = lambda: 0.0  # before every commit: no merge by age, only by count
    commit_batches(sink, 0, 2)
    assert len(live_files(DeltaTable(path, storage_options=options))) == 4  # 2 topics x 2
    commit_batches(sink, 2, 1)  # the third file of each topic: a level-1 merge per topic
    files = live_files(DeltaTable(path, storage_options=options))
    assert sorted(f.level for f in files) == [1, 1]
    assert all(os.path.basename(f.path).startswith("compacted-l1-") for f in files)
    commit_batches(sink, 3, 6)  # nine batches: three level-1 files per topic make a level 2
    files = live_files(DeltaTable(path, storage_options=options))
    assert sorted(f.level for f in files) == [2, 2]
    assert offsets(path, options) == list(range(90))
    if options is None:  # the log's actions: a rearrangement, no new data for streams
        batch_times = [
            a["add"]["modificationTime"]
            for a in log_actions(path)
            if "add" in a and "compacted" not in a["add"]["path"]
        ]
        # Each merge keeps the commit time of its oldest rows, for the age rule.
        assert min(f.modified_ms for f in files) == min(batch_times)
        compacts = [
            a
            for a in log_actions(path)
            if ("add" in a and "compacted" in a["add"]["path"]) or "remove" in a
        ]
        assert compacts and all(
            not (a.get("add") or a.get("remove"))["dataChange"] for a in compacts
        )
    history = DeltaTable(path, storage_options=options).history()
    merges = [h for h in history if h.get(OPERATION_KEY) == COMPACT]
    assert len(merges) == 4  # rounds: after batches 2, 5 and 8, and the level 2 after 8
    assert all(FILES_KEY in h for h in merges)
    report = verify(sink, None, digests=True)
    assert report.ok, [p.line() for p in report.problems]
    assert report.digests_checked == 2  # the merged files' digests, recorded by their merge


def test_a_batch_landing_during_the_commit_is_kept(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    sink = DeltaSink(path, partition_by=["topic"])
    sink.check(SCHEMA)
    commit_batches(sink, 0, 3)
    landed: list[int] = []

    def batch_lands() -> None:  # another commit takes the version this commit was made on
        if not landed:
            landed.append(3)
            commit_batches(sink, 3, 1)

    settings = LevelSettings(1 << 27, fanout=3, levels=3)
    compact_delta_levels(target(sink), settings, before_commit=batch_lands)
    assert landed and offsets(path) == list(range(40))
    assert sorted(f.level for f in live_files(DeltaTable(path))) == [0, 0, 1, 1]


def test_files_merged_by_another_compaction_are_not_merged_again(tmp_path: Path) -> None:
    """delta-rs lets a commit remove a file another commit removed: both merges would add
    their rows. The second compaction finds its inputs gone and changes nothing."""
    path = str(tmp_path / "t")
    sink = DeltaSink(path, partition_by=["topic"])
    sink.check(SCHEMA)
    commit_batches(sink, 0, 3)
    settings = LevelSettings(1 << 27, fanout=3, levels=3)

    def another_compaction() -> None:
        compact_delta_levels(target(sink), settings)

    with pytest.raises(SinkError, match="removed by another commit during the compaction"):
        compact_delta_levels(target(sink), settings, before_commit=another_compaction)
    assert offsets(path) == list(range(30))  # once each
    on_disk = [n for _, _, names in os.walk(path) for n in names if n.startswith("compacted")]
    assert len(on_disk) == 2  # the loser's merged files were deleted


def test_a_fenced_writer_commits_no_merge(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    sink = DeltaSink(path, compact=True, compact_in_background=False, compaction_fanout=2)
    sink.check(SCHEMA)

    def fenced() -> None:
        raise SinkError("the lease is held by another driver")

    sink.guard_background(fenced)
    commit_batches(sink, 0, 1)
    with pytest.raises(SinkError, match="lease"):
        commit_batches(sink, 1, 1)  # the batch commits; its merge is refused before its commit
    assert offsets(path) == list(range(20))
    assert {f.level for f in live_files(DeltaTable(path))} == {0}


def test_in_a_driver_thread(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    sink = DeltaSink(path, compact=True, compaction_fanout=3)
    sink.check(SCHEMA)
    commit_batches(sink, 0, 3)
    assert sink.finish_background(timeout=120) is None
    assert [f.level for f in live_files(DeltaTable(path))] == [1]
    assert offsets(path) == list(range(30))


def test_a_table_with_deletion_vectors_is_refused(tmp_path: Path) -> None:
    """Its files' rows are not all live: merging their Parquet alone would bring deleted
    rows back, so the merge leaves such a table to the engines' OPTIMIZE."""
    from deltalake import write_deltalake

    from inorder.storage import fs as sfs

    path = str(tmp_path / "dv")
    table = pa.table({"topic": ["a", "a"], "offset": [1, 2]})
    for _ in range(3):
        write_deltalake(
            path, table, mode="append", configuration={"delta.enableDeletionVectors": "true"}
        )
    dv = DeltaTarget(sfs.resolve(path), [], "zstd", "Delta table dv")
    with pytest.raises(SinkError, match=r"deletionVectors.*OPTIMIZE"):
        compact_delta_levels(dv, LevelSettings(1 << 27, fanout=2, levels=2))
    assert len(live_files(DeltaTable(path))) == 3  # nothing changed


def test_the_compactor_vacuums_with_the_tables_retention(tmp_path: Path) -> None:
    """Files the merges replaced leave the disk once the table's retention has passed
    (here none), at most once per ``vacuum_every``."""
    path = str(tmp_path / "t")
    sink = DeltaSink(
        path,
        compact=True,
        compact_in_background=False,
        compaction_fanout=2,
        table_properties={"delta.deletedFileRetentionDuration": "interval 0 seconds"},
    )
    sink.check(SCHEMA)
    sink.compactor.vacuum_every = 0.0  # type: ignore[attr-defined]
    commit_batches(sink, 0, 4)
    on_disk = sorted(n for _, _, names in os.walk(path) for n in names if n.endswith(".parquet"))
    live = {os.path.basename(f.path) for f in live_files(DeltaTable(path))}
    assert offsets(path) == list(range(40))
    # A round vacuums before it merges: what the earlier rounds replaced is gone (batches 0
    # and 1), what the last round replaced (batches 2 and 3, and their level-1 merges) waits
    # for the next round.
    assert not [n for n in on_disk if n.startswith(("part-0000000000", "part-0000000001"))]
    assert len(set(on_disk) - live) == 4, (on_disk, live)
