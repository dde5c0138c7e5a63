"""Parquet compaction on local disk in bounded rounds: when many partitions fall due
together, each round commits at most its bound and the next round continues with the
partitions left (not at the next sweep); between commits a timer merges by age."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.fixtures.sink_cases import stage_batch
from tests.integration.test_compaction_wake import ids, levels, planned_partitions

from inorder.sinks.base import SinkError
from inorder.sinks.compaction import compact_parquet
from inorder.sinks.parquet import ParquetSink
from inorder.storage import fs as sfs

SCHEMA = pa.schema([("topic", pa.string()), ("id", pa.int64())])
ROWS = 20
TOPICS = tuple(f"t{i}" for i in range(6))
GUARD = 60.0  # a bound on waiting for rounds, never an expectation of their duration


def commit(sink: ParquetSink, batch_id: int, topics: tuple[str, ...]) -> None:
    """``ROWS`` rows per topic, ids numbered by batch (so a lost or doubled row shows)."""
    ids = [batch_id * 1000 + i for i in range(ROWS * len(topics))]
    data = pa.record_batch(
        [pa.array([topics[i % len(topics)] for i in range(len(ids))]), pa.array(ids)],
        schema=SCHEMA,
    )
    sink.commit(batch_id, stage_batch(sink, batch_id, data, tasks=1))


def merges_per_record(path: str) -> list[int]:
    """Per compaction record, oldest first, how many merges it committed (each merge of
    this shape replaces 2 files with 1)."""
    loc = sfs.resolve(path)
    records = sorted(
        (
            i
            for i in sfs.list_files(loc, loc.join("_inorder/compactions"))
            if i.path.endswith(".json")
        ),
        key=lambda i: i.path,
    )
    return [len(json.loads(sfs.read_bytes(loc, i.path))["files"]) for i in records]


#: What each round planned, with hour-long age windows (test_compaction_wake's spy).
hour_windows = planned_partitions


def two_batches_everywhere(path: str) -> list[int]:
    """A run without compaction left 2 files in each of the 6 topics; their ids."""
    before = ParquetSink(path, partition_by=["topic"])
    before.check(SCHEMA)
    for b in range(2):
        commit(before, b, TOPICS)
    return ids(path)


def test_a_bounded_call_commits_its_bound_and_names_what_it_left(tmp_path: Path) -> None:
    path = str(tmp_path / "out")
    expected = two_batches_everywhere(path)
    how: dict[str, Any] = {"fanout": 2, "grace_seconds": 0, "trigger_seconds": 3600.0}
    first = compact_parquet(path, max_round_merges=4, **how)
    assert len(first.groups) == 4 and merges_per_record(path) == [4]
    # The 4 merged partitions too: their outputs might complete the next level.
    assert first.left == [f"topic={t}" for t in TOPICS]
    second = compact_parquet(path, max_round_merges=4, partitions=first.left, **how)
    assert len(second.groups) == 2 and second.left == []
    assert merges_per_record(path) == [4, 2]
    assert levels(path) == {f"topic={t}": [1] for t in TOPICS}
    assert ids(path) == expected
    with pytest.raises(SinkError, match="max_round_merges must be an integer >= 1"):
        compact_parquet(path, max_round_merges=0, **how)


def test_a_byte_bound_takes_at_least_one_merge(tmp_path: Path) -> None:
    path = str(tmp_path / "out")
    expected = two_batches_everywhere(path)
    how: dict[str, Any] = {"fanout": 2, "grace_seconds": 0, "trigger_seconds": 3600.0}
    report = compact_parquet(path, max_round_bytes=1, **how)
    assert len(report.groups) == 1 and len(report.left) == len(TOPICS)
    assert ids(path) == expected


@pytest.mark.parametrize("background", [True, False])
def test_many_partitions_due_together_are_merged_in_bounded_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, background: bool
) -> None:
    """6 partitions fall due in one round with a bound of 2 merges: 3 records of at most 2
    merges, the partitions left are planned by the rounds that follow at once (sweeps only
    every 100 commits), rows exact."""
    path = str(tmp_path / "out")
    expected = two_batches_everywhere(path)
    seen = hour_windows(monkeypatch)
    sink = ParquetSink(path, partition_by=["topic"], compact=True, compaction_fanout=2,
                       compaction_grace_seconds=0, compact_in_background=background)  # fmt: skip
    sink.compactor.max_round_merges = 2
    sink.compactor.sweep_every = 100
    sink.check(SCHEMA)
    commit(sink, 2, ("z",))
    work = sink.compactor.work
    if work is not None:
        assert work.wait_rounds(3, GUARD)
        assert sink.compactor.finish(GUARD) is None
    assert merges_per_record(path) == [2, 2, 2]
    assert seen[0] is None and all(s is not None for s in seen[1:])
    assert (sink.compactor.sweeps, sink.compactor.bounded_rounds) == (1, 2)
    assert levels(path) == {**{f"topic={t}": [1] for t in TOPICS}, "topic=z": [0]}
    assert ids(path) == sorted(expected + [2000 + i for i in range(ROWS)])


def test_a_fenced_bounded_round_keeps_what_the_rounds_before_it_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease is found taken at the second round's commit point: the first round's
    merges stay committed, the second commits nothing, and the next commit's round (a
    sweep, after a failure) merges the rest; rows exact throughout."""
    path = str(tmp_path / "out")
    expected = two_batches_everywhere(path)
    hour_windows(monkeypatch)
    sink = ParquetSink(path, partition_by=["topic"], compact=True, compaction_fanout=2,
                       compaction_grace_seconds=0, compact_in_background=False)  # fmt: skip
    sink.compactor.max_round_merges = 2
    checks = [0]

    def guard() -> None:
        checks[0] += 1
        if checks[0] == 2:
            raise SinkError("lease taken")

    sink.guard_background(guard)
    sink.check(SCHEMA)
    with pytest.raises(SinkError, match="lease taken"):
        commit(sink, 2, ("z",))  # committed; its second bounded round failed
    assert merges_per_record(path) == [2]
    assert ids(path) == sorted(expected + [2000 + i for i in range(ROWS)])
    commit(sink, 3, ("z",))  # the 4 partitions left and z's 2 files: 5 merges
    assert merges_per_record(path) == [2, 2, 2, 1]
    assert levels(path) == {**{f"topic={t}": [1] for t in TOPICS}, "topic=z": [1]}
    assert ids(path) == sorted(expected + [b * 1000 + i for b in (2, 3) for i in range(ROWS)])


def test_the_timer_merges_by_age_without_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two files of ``topic=a`` (fan-in 3: no merge by count) fall due by age once the
    compactor's clock passes the level-0 window; a tick of the timer (what its timeout
    does) then runs a round over that partition with no commit; finishing ends the wait."""
    path = str(tmp_path / "out")
    seen = hour_windows(monkeypatch)
    sink = ParquetSink(path, partition_by=["topic"], compact=True, compaction_fanout=3,
                       compaction_grace_seconds=0)  # fmt: skip
    now = [0.0]
    sink.compactor.clock = lambda: now[0]
    sink.check(SCHEMA)
    for b in range(2):
        now[0] = time.time()
        commit(sink, b, ("a", "b") if b == 0 else ("a",))
        work = sink.compactor.work
        assert work is not None and work.wait_rounds(b + 1, GUARD)
    assert levels(path) == {"topic=a": [0, 0], "topic=b": [0]}
    waiting = sink.compactor.seconds_to_next()
    assert waiting is not None and waiting > 0
    assert not sink.compactor.due()
    now[0] += 3 * 3600.0 + 60  # past the level-0 window: trigger x fan-in
    work.tick()
    assert work.wait_rounds(3, GUARD)
    assert levels(path) == {"topic=a": [1], "topic=b": [0]}
    assert seen[2] == ["topic=a"] and sink.compactor.timed_rounds == 1
    assert sink.compactor.seconds_to_next() is None  # nothing more falls due by age
    assert sink.compactor.finish(GUARD) is None and not work.running
    assert ids(path) == sorted(b * 1000 + i for b in range(2) for i in range(ROWS * (2 - b)))
