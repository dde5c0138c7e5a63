"""`inspect`'s view of a Parquet output: live files by compaction level and the merges due."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from tests.fixtures.sink_cases import ID_SCHEMA, id_batch, stage_batch

from inorder.ops.output_files import LevelFiles, format_output_files, output_files
from inorder.sinks.compaction import compact_parquet
from inorder.sinks.offset_ids import BatchIdOffset
from inorder.sinks.parquet import ParquetSink


def assert_levels_after_one_compaction(levels: Sequence[LevelFiles]) -> None:
    """Per topic the two oldest batches' 4 files became one of level 1, and the newest batch's
    2 files wait for a second batch; unless they were older than the level rule's age window
    when the compaction ran (twice the interval between these commits, measured from their
    own commit times: a busy machine can delay the compaction that long), and then they went
    to level 1 too, and the two level-1 files on to level 2, the top one."""
    found = [(lv.level, lv.files) for lv in levels]
    assert found in ([(0, 4), (1, 2)], [(2, 2)]), levels


def test_files_by_level_and_the_backlog(tmp_path: Path) -> None:
    path = str(tmp_path / "out")
    sink = ParquetSink(path, partition_by=["topic"], compaction_fanout=2, compaction_levels=2)
    sink.check(ID_SCHEMA)
    for b in range(3):  # two topics, two tasks: 4 small files per batch, no compaction
        sink.commit(b, stage_batch(sink, b, id_batch(b, 20)))
    before = output_files(BatchIdOffset(sink, 0))  # a wrapped sink is looked through
    assert before is not None
    assert (before.files, before.rows, before.partitions) == (12, 60, 2)
    assert [(lv.level, lv.files) for lv in before.levels] == [(0, 12)]
    # Per topic the files of its 2 oldest commits (2 tasks' files each: a commit counts once).
    assert before.due_merges == 2 and before.due_files == 8
    line = format_output_files(asdict(before))
    assert line[0].startswith("output: 12 files, ") and "2 merge(s) of 8 files due now" in line[0]

    compact_parquet(path, fanout=2, levels=2, grace_seconds=0)
    after = output_files(sink)
    assert after is not None and after.rows == 60 and after.files < before.files
    assert_levels_after_one_compaction(after.levels)


def test_a_delta_tables_files_by_level_and_the_backlog(tmp_path: Path) -> None:
    from inorder.sinks.delta import DeltaSink
    from inorder.sinks.delta_maintenance import compact_delta

    path = str(tmp_path / "table")
    sink = DeltaSink(path, partition_by=["topic"], compaction_fanout=2, compaction_levels=2)
    sink.check(ID_SCHEMA)
    for b in range(3):  # two topics, two tasks: 4 small files per batch, no compaction
        sink.commit(b, stage_batch(sink, b, id_batch(b, 20)))
    before = output_files(sink)
    assert before is not None
    assert (before.files, before.rows, before.partitions) == (12, 60, 2)
    assert [(lv.level, lv.files) for lv in before.levels] == [(0, 12)]
    assert before.due_merges == 2 and before.due_files == 8  # 2 commits per topic

    compact_delta(path, fanout=2, levels=2)
    after = output_files(sink)
    assert after is not None and after.rows == 60 and after.files < before.files
    assert_levels_after_one_compaction(after.levels)
