"""The recomputation's one read per partition, cut at the batches' ends."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from inorder.ops import kafka_reads
from inorder.ops.kafka_reads import SegmentedRead
from inorder.records import RecordTuple, TopicPartition

TP = TopicPartition("t", 0)


def _records(offsets: list[int]) -> list[RecordTuple]:
    return [(o, None, b"v", None, None) for o in offsets]


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Chunks of offsets 0-9 (gaps at 4 and 7) in reads of three; the ranges opened."""
    calls: list[tuple[int, int]] = []

    def read_chunks(
        options: Any, tp: TopicPartition, start: int, end: int
    ) -> Generator[list[RecordTuple], None, None]:
        calls.append((start, end))
        offsets = [o for o in [0, 1, 2, 3, 5, 6, 8, 9] if start <= o < end]
        for i in range(0, len(offsets), 3):
            yield _records(offsets[i : i + 3])

    monkeypatch.setattr(kafka_reads, "read_chunks", read_chunks)
    return calls


def _offsets(chunks: Any) -> list[list[int]]:
    return [[r[0] for r in chunk] for chunk in chunks]


def test_segments_are_cut_from_one_read(opened: list[tuple[int, int]]) -> None:
    read = SegmentedRead(None, TP, 0, 10)  # type: ignore[arg-type]
    assert _offsets(read.upto(0, 2)) == [[0, 1]]
    assert _offsets(read.upto(2, 6)) == [[2], [3, 5]]
    assert _offsets(read.upto(6, 6)) == []  # an empty batch
    assert _offsets(read.upto(6, 10)) == [[6], [8, 9]]
    assert _offsets(read.upto(10, 12)) == []
    read.close()
    assert opened == [(0, 10)]  # one consumer for every segment


def test_records_before_a_segments_start_are_dropped(opened: list[tuple[int, int]]) -> None:
    read = SegmentedRead(None, TP, 0, 10)  # type: ignore[arg-type]
    assert _offsets(read.upto(0, 1)) == [[0]]
    # A gap between two logged batches: offsets 1-5 belong to no segment.
    assert _offsets(read.upto(6, 9)) == [[6], [8]]
    assert _offsets(read.upto(9, 10)) == [[9]]
    read.close()


def test_every_record_once_whatever_the_cuts(opened: list[tuple[int, int]]) -> None:
    for cuts in ([10], [1, 10], [3, 4, 7, 10], list(range(1, 11))):
        read = SegmentedRead(None, TP, 0, 10)  # type: ignore[arg-type]
        seen: list[int] = []
        start = 0
        for end in cuts:
            for chunk in read.upto(start, end):
                assert all(start <= r[0] < end for r in chunk)
                seen += [r[0] for r in chunk]
            start = end
        read.close()
        assert seen == [0, 1, 2, 3, 5, 6, 8, 9]
