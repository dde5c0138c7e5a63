"""The numbers of the progress line: the rate and duration of a batch cover every step the
batch waited for (the session tables too), and a lag Spark did not measure is unknown, not 0."""

from __future__ import annotations

from typing import Any

from inorder.engine.batch_report import BatchReport
from inorder.kafka.offsets import SourceOffset
from inorder.pipeline.progress import format_batch
from inorder.pipeline.spark_progress import batch_lag, batch_progress, lag_by_partition
from inorder.records import TopicPartition

A0 = TopicPartition("site-a", 0)


def _source(end: int, latest: int | None) -> dict[str, Any]:
    return {
        "endOffset": SourceOffset(positions={A0: end}).to_json(),
        "latestOffset": None if latest is None else SourceOffset(positions={A0: latest}).to_json(),
    }


def test_rate_and_duration_include_the_tables_step() -> None:
    # The backend took 1 s; the session tables, written after it, another 1 s.
    report = BatchReport(batch_id=4, records=69_000, duration_seconds=1.0)
    report.phase_seconds = {"tasks": 0.8, "commit": 0.2, "tables": 1.0}
    line = batch_progress(4, report, {"sources": [_source(100, 100)]})
    assert line.duration_seconds == 2.0
    assert line.records_per_second == 34_500.0
    assert "(2.00 s)" in format_batch(line)
    # Without a tables step the backend's duration is the batch's.
    plain = BatchReport(batch_id=5, records=100, duration_seconds=0.5)
    assert batch_progress(5, plain, {}).records_per_second == 200.0


def test_a_lag_spark_did_not_measure_is_unknown() -> None:
    planned = {"latestOffset": 12, "walCommit": 30, "triggerExecution": 900}
    measured = {"sources": [_source(100, 319)], "durationMs": planned}
    assert lag_by_partition(measured) == {"site-a[0]": 219}
    assert batch_progress(0, BatchReport(batch_id=0), measured).lag == 219
    # A batch re-run from the offsets log after a restart: this run did not plan it (no
    # latestOffset step), and Spark reports its end as the latest offset. The lag is
    # unknown then, never 0.
    rerun = {"sources": [_source(100, 100)], "durationMs": {"triggerExecution": 900}}
    assert lag_by_partition(rerun) is None
    line = batch_progress(0, BatchReport(batch_id=0), rerun)
    assert line.lag is None
    assert " lag         ? " in format_batch(line)
    # A source without a latest offset at all: unknown too.
    assert lag_by_partition({"sources": [_source(100, None)]}) is None
    # The runner asks the broker then (the source's options given); without them, or when
    # the broker does not answer, it stays unknown.
    assert batch_lag(rerun) is None
    unreachable = {"bootstrap.servers": "127.0.0.1:9", "subscribe": "site-a"}
    assert batch_lag(rerun, lambda: unreachable) is None
    assert batch_progress(0, BatchReport(batch_id=0), rerun, None).lag is None
    assert batch_progress(0, BatchReport(batch_id=0), rerun, {"site-a[0]": 7}).lag == 7
