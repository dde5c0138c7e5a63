"""inspect's batch ranges follow the source's planning, whatever batch a partition enters in."""

from __future__ import annotations

from inorder.checkpoint.spark_log import SparkBatch
from inorder.ops.batchlog import BatchEntry, BatchLog
from inorder.ops.inspect import batches
from inorder.records import TopicPartition

A = TopicPartition("site-a", 0)
B = TopicPartition("site-a", 1)


def entry(batch_id: int, end: dict[TopicPartition, int], **starts: int) -> BatchEntry:
    first = {TopicPartition("site-a", int(p[1:])): o for p, o in starts.items()}
    return BatchEntry(SparkBatch(batch_id, {}, True, None, None, end, first))


def test_a_partition_entering_with_nothing_to_read_starts_at_its_end() -> None:
    # Partition 1 is known at batch 1 but empty (no start recorded), gets records in batch 2.
    log = BatchLog([entry(0, {A: 5}, p0=0), entry(1, {A: 9, B: 0}), entry(2, {A: 9, B: 4})])
    ranges = [b.ranges for b in batches(log)]
    assert ranges == [
        {"site-a[0]": [0, 5]},
        {"site-a[0]": [5, 9], "site-a[1]": [0, 0]},
        {"site-a[0]": [9, 9], "site-a[1]": [0, 4]},
    ]
    assert [b.records_planned for b in batches(log)] == [5, 4, 4]


def test_the_first_batch_of_a_truncated_log_has_unknown_starts() -> None:
    log = BatchLog([entry(7, {A: 50}), entry(8, {A: 60, B: 3}, p1=1)])
    ranges = [b.ranges for b in batches(log)]
    assert ranges == [{"site-a[0]": [-1, 50]}, {"site-a[0]": [50, 60], "site-a[1]": [1, 3]}]


def test_a_batch_committed_by_a_later_run_takes_its_own_time_not_the_pause() -> None:
    # Batch 1 was planned at 1000 by a run that stopped; the next run started at 1060 and
    # committed it at 1065.88.
    log = BatchLog(
        [
            BatchEntry(SparkBatch(0, {}, True, 990.0, 992.5, {A: 5}, {A: 0})),
            BatchEntry(SparkBatch(1, {}, True, 1000.0, 1065.88, {A: 9})),
            BatchEntry(SparkBatch(2, {}, True, 1066.0, 1067.0, {A: 12})),
        ]
    )
    shown = batches(log, run_started=1060.0)
    # Nothing measured it: unknown, never the 65.88 s across the two runs.
    assert [(b.duration_seconds, b.restarted) for b in shown] == [
        (2.5, False),
        (None, True),
        (1.0, False),
    ]
    # The progress line the second run recorded measured it.
    recorded = {1: {"duration_seconds": 1.2345}}
    assert batches(log, history=recorded, run_started=1060.0)[1].duration_seconds == 1.234
