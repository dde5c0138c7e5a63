"""Micro-batch sizes that follow a time target (pure) and the source applying them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from inorder.errors import ConfigError
from inorder.kafka.batch_sizing import FIRST_BATCH, SMALLEST_BATCH, STEP, BatchSizer
from inorder.kafka.offsets import SourceOffset
from inorder.kafka.options import parse_options
from inorder.kafka.planning import Watermarks
from inorder.records import TopicPartition as TP

BASE = {"kafka.bootstrap.servers": "h:9092", "subscribe": "a"}
A0, A1 = TP("a", 0), TP("a", 1)


def test_a_fast_pipeline_grows_its_batches_at_most_step_times_per_batch() -> None:
    sizer = BatchSizer(target_seconds=20.0)
    assert sizer.limit(0.0) == FIRST_BATCH
    sizer.planned(FIRST_BATCH, FIRST_BATCH, 0.0)  # full: the backlog was larger
    # 100k in 1 s -> 2M for 20 s, but one batch grows at most STEP times.
    assert sizer.limit(1.0) == int(FIRST_BATCH * STEP)
    sizer.planned(400_000, 400_000, 1.0)
    assert sizer.limit(3.0) == 1_600_000
    sizer.planned(1_600_000, 1_600_000, 3.0)
    assert sizer.limit(19.0) == 2_000_000  # 100k/s x 20 s: reached


def test_a_slow_pipeline_shrinks_them_and_never_below_the_floor() -> None:
    sizer = BatchSizer(target_seconds=2.0)
    sizer.planned(FIRST_BATCH, FIRST_BATCH, 0.0)
    assert sizer.limit(10.0) == 25_000  # wanted 20k; one step down at most is 25k
    for now in range(11, 40):
        sizer.planned(sizer.current, sizer.current, float(now))
        sizer.limit(now + 1000.0)  # 1000 s per batch: as small as allowed
    assert sizer.current == SMALLEST_BATCH


def test_only_full_batches_teach_the_rate() -> None:
    sizer = BatchSizer(target_seconds=1.0)
    sizer.planned(500, FIRST_BATCH, 0.0)  # caught up: says how much data there was
    assert sizer.limit(60.0) == FIRST_BATCH
    sizer.planned(0, FIRST_BATCH, 60.0)  # nothing planned: nothing learned
    assert sizer.limit(61.0) == FIRST_BATCH


def test_the_option_is_a_duration() -> None:
    opts = parse_options({**BASE, "inorder.targetBatchDuration": "20 seconds"})
    assert opts.target_batch_duration == timedelta(seconds=20)
    assert parse_options({**BASE, "inorder.targetBatchDuration": "1500"}).target_batch_duration
    assert parse_options(BASE).target_batch_duration is None
    with pytest.raises(ConfigError, match=r"inorder\.targetBatchDuration: must be more than 0"):
        parse_options({**BASE, "inorder.targetBatchDuration": "0"})
    with pytest.raises(ConfigError, match=r"inorder\.targetBatchDuration"):
        parse_options({**BASE, "inorder.targetBatchDuration": "soon"})


class _Backlog:
    """Admin stand-in: two partitions with a million records each."""

    errored_topics: frozenset[str] = frozenset()

    def check_subscription(self) -> None:
        pass

    def discover(self) -> list[TP]:
        return [A0, A1]

    def watermarks(self, tps: object) -> tuple[dict[TP, Watermarks], set[TP]]:
        return {tp: Watermarks(0, 1_000_000) for tp in set(tps)}, set()  # type: ignore[call-overload]


def _planned(reader: object, start: SourceOffset, end: dict[str, object]) -> int:
    stop = SourceOffset.from_dict(end)
    return sum(stop.positions[tp] - start.positions.get(tp, 0) for tp in stop.positions)


@pytest.mark.parametrize(("cap", "first"), [(None, FIRST_BATCH), (30_000, 30_000)])
def test_the_source_plans_the_sized_batch_under_the_hard_cap(
    monkeypatch: pytest.MonkeyPatch, cap: int | None, first: int
) -> None:
    from inorder.kafka import source as source_module
    from inorder.kafka.source import KafkaStreamReader

    options = {**BASE, "inorder.targetBatchDuration": "10 seconds"}
    if cap is not None:
        options["maxOffsetsPerTrigger"] = str(cap)
    reader = KafkaStreamReader(parse_options(options))
    reader._admin = _Backlog()  # type: ignore[assignment]
    clock = [0.0]
    monkeypatch.setattr(source_module.time, "monotonic", lambda: clock[0])
    start = SourceOffset({A0: 0, A1: 0})
    end = reader.latestOffset(start.to_dict(), reader.getDefaultReadLimit())
    assert _planned(reader, start, end) == first
    clock[0] = 1.0  # the batch took 1 s: 10 s would hold STEP times more (capped)
    second_start = SourceOffset.from_dict(end)
    end = reader.latestOffset(end, reader.getDefaultReadLimit())
    assert _planned(reader, second_start, end) == (cap or FIRST_BATCH * STEP)


def test_pipelines_read_a_backlog_in_bounded_batches_by_default() -> None:
    # A backlog read as one batch gave no progress, commit or stop bound until its end.
    from inorder.assemble import make_source
    from inorder.kafka.api import DEFAULT_TARGET_BATCH_DURATION, KafkaSource
    from inorder.pipeline.config import validate

    def target(**given: object) -> str | None:
        return (
            KafkaSource("b:9092", topics=["t"], **given)
            .to_options()
            .get(  # type: ignore[arg-type]
                "inorder.targetBatchDuration"
            )
        )

    assert DEFAULT_TARGET_BATCH_DURATION == "20 seconds"
    assert target() == "20 seconds"
    assert target(target_batch_duration="off") is None
    assert target(target_batch_duration=None) is None
    assert target(target_batch_duration=5) == "5000"
    base = {
        "processor": {"type": "inorder.sessions:SessionTables"},
        "source": {"bootstrap_servers": "b:9092", "topics": ["t"]},
        "sink": {"path": "/x"},
    }
    config = validate(base)
    assert make_source(config["source"]).to_options()["inorder.targetBatchDuration"] == (
        "20 seconds"
    )
    off = validate({**base, "source": {**base["source"], "target_batch_duration": "off"}})
    assert "inorder.targetBatchDuration" not in make_source(off["source"]).to_options()
    # Parsed by the source as any duration.
    assert parse_options(
        {**BASE, "inorder.targetBatchDuration": "20 seconds"}
    ).target_batch_duration
