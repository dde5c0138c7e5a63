"""Parquet compaction on local disk: rounds plan the partitions the batches touched (with a
sweep of every partition on start, after a failed round and every ``fanout`` commits), and
no merge reads more than ``compaction_max_merge_bytes``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.fixtures.sink_cases import stage_batch

from inorder import cli
from inorder.sinks import compaction
from inorder.sinks.base import SinkError
from inorder.sinks.compaction import compact_parquet
from inorder.sinks.parquet import ParquetSink, committed_files, read_committed
from inorder.storage import fs as sfs

SCHEMA = pa.schema([("topic", pa.string()), ("id", pa.int64()), ("payload", pa.string())])
ROWS = 40


def batch(batch_id: int, topics: tuple[str, ...]) -> pa.RecordBatch:
    """``ROWS`` rows per topic, ids numbered by batch (so a lost or doubled row shows)."""
    ids = [batch_id * 1000 + i for i in range(ROWS * len(topics))]
    return pa.record_batch(
        [
            pa.array([topics[i % len(topics)] for i in range(len(ids))]),
            pa.array(ids, pa.int64()),
            pa.array([f"{i:08d}-{i * 7919 % 104729:06d}" * 4 for i in ids]),
        ],
        schema=SCHEMA,
    )


def commit(sink: ParquetSink, batch_id: int, topics: tuple[str, ...]) -> None:
    sink.commit(batch_id, stage_batch(sink, batch_id, batch(batch_id, topics), tasks=1))


def ids(path: str) -> list[int]:
    return sorted(read_committed(path).column("id").to_pylist())


def levels(path: str) -> dict[str, list[int]]:
    """Levels of the live files per partition directory."""
    out: dict[str, list[int]] = {}
    for f in committed_files(path):
        out.setdefault(f.path.rpartition("/")[0], []).append(f.level)
    return {k: sorted(v) for k, v in sorted(out.items())}


def records(path: str) -> list[dict[str, Any]]:
    loc = sfs.resolve(path)
    return [
        json.loads(sfs.read_bytes(loc, i.path))
        for i in sorted(sfs.list_files(loc, loc.join("_inorder/compactions")), key=lambda i: i.path)
        if i.base_name.endswith(".json")
    ]


def test_a_round_told_the_touched_partitions_plans_only_those(tmp_path: Path) -> None:
    """Both partitions hold a merge's worth of files; a round over ``topic=a`` merges a's
    files only, a round over every partition then merges b's; each row stays once."""
    path = str(tmp_path / "out")
    sink = ParquetSink(path, partition_by=["topic"])
    sink.check(SCHEMA)
    for b in range(3):
        commit(sink, b, ("a", "b"))
    expected = ids(path)
    assert levels(path) == {"topic=a": [0, 0, 0], "topic=b": [0, 0, 0]}
    how: dict[str, Any] = {"fanout": 3, "grace_seconds": 0, "trigger_seconds": 3600.0}
    dry = compact_parquet(path, dry_run=True, partitions=["topic=a"], **how)
    assert [g[0].rpartition("/")[0] for g in dry.groups] == ["topic=a"]
    compact_parquet(path, partitions=["topic=a"], **how)
    assert levels(path) == {"topic=a": [1], "topic=b": [0, 0, 0]}
    compact_parquet(path, partitions=[], **how)  # a batch that wrote no file
    assert levels(path) == {"topic=a": [1], "topic=b": [0, 0, 0]}
    compact_parquet(path, **how)
    assert levels(path) == {"topic=a": [1], "topic=b": [1]}
    assert ids(path) == expected


def planned_partitions(monkeypatch: pytest.MonkeyPatch) -> list[list[str] | None]:
    """What each compaction round is told to plan (``None``: every partition). The rounds
    are given hour-long age windows: only the count rule merges, whatever the test's pace."""
    seen: list[list[str] | None] = []
    original: Callable[..., Any] = compaction.compact_parquet

    def spy(*args: Any, **kwargs: Any) -> Any:
        parts = kwargs.get("partitions")
        seen.append(None if parts is None else sorted(parts))
        return original(*args, **{**kwargs, "trigger_seconds": 3600.0})

    monkeypatch.setattr(compaction, "compact_parquet", spy)
    return seen


def test_the_sink_wakes_its_compactor_with_the_partitions_each_batch_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fan-in 3: the first round sweeps (what a previous run left is merged), the next plans
    only the partition its batch wrote, and once 3 commits passed a round sweeps again; rows
    exact throughout."""
    path = str(tmp_path / "out")
    before = ParquetSink(path, partition_by=["topic"])  # a run without compaction
    before.check(SCHEMA)
    for b in range(2):
        commit(before, b, ("a", "b"))
    seen = planned_partitions(monkeypatch)
    sink = ParquetSink(path, partition_by=["topic"], compact=True, compaction_fanout=3,
                       compaction_grace_seconds=0, compact_in_background=False)  # fmt: skip
    sink.check(SCHEMA)
    commit(sink, 2, ("b",))
    assert seen == [None]
    assert levels(path) == {"topic=a": [0, 0], "topic=b": [1]}
    commit(sink, 3, ("a", "c"))
    assert seen[1:] == [["topic=a", "topic=c"]]
    assert levels(path) == {"topic=a": [1], "topic=b": [1], "topic=c": [0]}
    for b in range(4, 9):
        commit(sink, b, ("c",))
    assert seen[2:] == [["topic=c"], None, ["topic=c"], ["topic=c"], None]
    assert levels(path) == {"topic=a": [1], "topic=b": [1], "topic=c": [1, 1]}
    assert (sink.compactor.sweeps, sink.compactor.touched_rounds) == (3, 4)
    assert ids(path) == sorted(
        b * 1000 + i for b in range(9) for i in range(ROWS * (2 if b < 2 or b == 3 else 1))
    )


def test_after_a_failed_round_the_next_one_sweeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round that fails at a merge's commit point (the lease found taken) commits nothing;
    the partitions it was told about are not forgotten: the next round plans them all."""
    path = str(tmp_path / "out")
    seen = planned_partitions(monkeypatch)
    sink = ParquetSink(path, partition_by=["topic"], compact=True, compaction_fanout=2,
                       compaction_grace_seconds=0, compact_in_background=False)  # fmt: skip
    sink.compactor.sweep_every = 100
    refuse = [False]

    def guard() -> None:
        if refuse[0]:
            raise SinkError("lease taken")

    sink.guard_background(guard)
    sink.check(SCHEMA)
    commit(sink, 0, ("a",))
    refuse[0] = True
    with pytest.raises(SinkError, match="lease taken"):
        commit(sink, 1, ("a",))  # committed; its inline round failed
    assert levels(path) == {"topic=a": [0, 0]}
    refuse[0] = False
    commit(sink, 2, ("b",))
    assert seen == [None, ["topic=a"], None]
    assert levels(path) == {"topic=a": [1], "topic=b": [0]}
    commit(sink, 3, ("b",))
    assert seen[3:] == [["topic=b"]]
    assert ids(path) == sorted(b * 1000 + i for b in range(4) for i in range(ROWS))


def planned_merges(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The input bytes of every merge the rounds plan."""
    sizes: list[int] = []
    original: Callable[..., Any] = compaction.plan_merges

    def spy(*args: Any, **kwargs: Any) -> Any:
        merges = original(*args, **kwargs)
        sizes.extend(m.size_bytes for m in merges)
        return merges

    monkeypatch.setattr(compaction, "plan_merges", spy)
    return sizes


def test_no_merge_reads_more_than_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nine small files of one partition with a bound of three of the largest: the count
    rule cuts them into several merges, none over the bound; rows exact."""
    path = str(tmp_path / "out")
    sink = ParquetSink(path, partition_by=["topic"])
    sink.check(SCHEMA)
    for b in range(9):
        commit(sink, b, ("a",))
    expected = ids(path)
    size_of = {f.path: f.size_bytes for f in committed_files(path)}
    bound = 3 * max(size_of.values())
    merged = planned_merges(monkeypatch)
    report = compact_parquet(path, target_file_size=bound, max_merge_bytes=bound,
                             grace_seconds=0, trigger_seconds=3600.0)  # fmt: skip
    assert len(report.groups) >= 3, report.groups
    for group in report.groups:
        assert 2 <= len(group) <= 3 and sum(size_of[p] for p in group) <= bound
    assert merged and max(merged) <= bound
    assert ids(path) == expected
    assert [r["kind"] for r in records(path)] == ["compaction"]  # one record per round
    with pytest.raises(SinkError, match="compaction_max_merge_bytes must be an integer >= "):
        compact_parquet(path, target_file_size=bound, max_merge_bytes=bound - 1)


def test_the_sink_applies_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``compaction_max_merge_bytes`` on the sink: every merge it plans stays within it,
    whichever rule plans it; rows exact."""
    probe = str(tmp_path / "probe")
    sizing = ParquetSink(probe, partition_by=["topic"])
    sizing.check(SCHEMA)
    commit(sizing, 0, ("a",))
    bound = 3 * committed_files(probe)[0].size_bytes
    merged = planned_merges(monkeypatch)
    path = str(tmp_path / "out")
    sink = ParquetSink(path, partition_by=["topic"], compact=True, compaction_fanout=9,
                       target_file_size=bound, compaction_max_merge_bytes=bound,
                       compaction_grace_seconds=0, compact_in_background=False)  # fmt: skip
    sink.check(SCHEMA)
    for b in range(12):
        commit(sink, b, ("a",))
    assert merged and max(merged) <= bound, merged
    assert ids(path) == sorted(b * 1000 + i for b in range(12) for i in range(ROWS))


def test_the_bound_is_refused_by_name_below_the_target_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SinkError, match="compaction_max_merge_bytes must be an integer >= "):
        ParquetSink(str(tmp_path / "x"), target_file_size=1000, compaction_max_merge_bytes=999)
    assert cli.main(["compact", str(tmp_path / "x"), "--max-merge-size", "1KB"]) != 0
    assert "compaction_max_merge_bytes must be an integer >=" in capsys.readouterr().err
