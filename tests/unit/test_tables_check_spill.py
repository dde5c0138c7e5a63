"""Spilling rows by session for the session-table check: shards, buckets, the files' rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from inorder.sessions.tables_check_spill import POSITION, Spill, bucket_shards, shard_of


def test_a_session_has_one_shard_whatever_the_batch() -> None:
    topics = pa.array(["a", "a", "b", "a", None])
    sessions = pa.array(["s1", "s2", "s1", "s1", "s1"])
    shards = shard_of(topics, sessions, 7)
    assert shards[0] == shards[3] and all(0 <= s < 7 for s in shards)
    alone = shard_of(pa.array(["a"]), pa.array(["s1"]), 7)
    assert alone[0] == shards[0]


def test_shards_are_grouped_into_buckets_of_at_most_the_rows() -> None:
    assert bucket_shards([3, 3, 3, 10, 0, 1], 6) == [[0, 1], [2], [3], [4, 5]]
    assert bucket_shards([0, 0], 6) == [[0, 1]]
    assert bucket_shards([], 6) == [[]]


def test_spilled_rows_come_back_by_shard_in_their_order(tmp_path: Path) -> None:
    rows = pa.table(
        {
            "topic": ["t"] * 6,
            "session": ["s1", "s2", "s3", "s1", "s2", "s3"],
            "v": list(range(6)),
        }
    )
    spill = Spill(tmp_path, 4)
    counts = spill.write("x", rows.to_batches(max_chunksize=4), position=True)
    assert sum(counts) == 6
    back = [spill.read("x", [s]) for s in range(4)]
    assert [0 if b is None else b.num_rows for b in back] == counts
    read = spill.read("x", range(4))
    assert read is not None
    assert sorted(read[POSITION].to_pylist()) == list(range(6))
    for table in filter(None, back):
        assert table[POSITION].to_pylist() == sorted(table[POSITION].to_pylist())
        assert table["v"].to_pylist() == table[POSITION].to_pylist()
