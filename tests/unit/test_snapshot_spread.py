"""Partitions take their first state snapshot after different numbers of deltas (pure logic)."""

from __future__ import annotations

from collections import Counter

from inorder.records import TopicPartition
from inorder.state.store import snapshot_after


def test_each_partition_first_snapshots_after_all_to_one_and_a_half_intervals() -> None:
    tps = [TopicPartition(f"site-{s:04d}", p) for s in range(300) for p in range(4)]
    after = [snapshot_after(tp, 20) for tp in tps]
    assert set(after) <= set(range(20, 30))
    # Spread: no number of deltas holds more than a fifth of the partitions.
    counts = Counter(after)
    assert len(counts) == 10 and max(counts.values()) < len(tps) / 5, counts
    # Stable: the same partition, the same number, in every process.
    assert [snapshot_after(tp, 20) for tp in tps] == after
    assert snapshot_after(TopicPartition("site-0000", 0), 20) == snapshot_after(
        TopicPartition("site-0000", 0), 20
    )


def test_small_intervals_are_kept_as_given() -> None:
    for interval in (1, 2, 3):
        assert {snapshot_after(TopicPartition(f"t{i}", i), interval) for i in range(50)} == {
            interval
        }
