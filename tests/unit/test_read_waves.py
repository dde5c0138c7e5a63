"""An engine task given several ranges of one partition reads them in order, one per read."""

from __future__ import annotations

from inorder.engine.task import read_waves
from inorder.records import TopicPartition

A, B, C = (TopicPartition("t", p) for p in range(3))


def test_distinct_partitions_are_one_wave() -> None:
    assert read_waves([(A, 0, 5), (B, 3, 9), (C, 1, 2)]) == [[(A, 0, 5), (B, 3, 9), (C, 1, 2)]]


def test_a_partitions_later_ranges_go_to_later_waves_in_order() -> None:
    ranges = [(A, 0, 5), (B, 0, 4), (A, 5, 9), (A, 9, 12), (C, 7, 8), (B, 4, 6)]
    assert read_waves(ranges) == [
        [(A, 0, 5), (B, 0, 4), (C, 7, 8)],
        [(A, 5, 9), (B, 4, 6)],
        [(A, 9, 12)],
    ]
    assert read_waves([]) == []
