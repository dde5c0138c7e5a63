"""Pure planning, offsets, options, markers and lag of the Kafka source (no broker)."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest

from inorder.errors import ConfigError, InorderError
from inorder.kafka.api import KafkaSource
from inorder.kafka.consumer import SOURCE_ARROW_SCHEMA, marker_batch
from inorder.kafka.lag import lag_from_progress, source_counters, total_lag
from inorder.kafka.markers import is_marker, marker_mask, parse_marker
from inorder.kafka.offsets import SourceOffset, parse_partition_offsets
from inorder.kafka.options import parse_options
from inorder.kafka.planning import (
    LossKind,
    OffsetRange,
    Watermarks,
    fair_share,
    next_offset,
    next_tick,
    nothing_new,
    plan_ranges,
    should_wait,
    split_ranges,
)
from inorder.records import TopicPartition as TP
from inorder.redaction import redact

A0, A1, A10, A2, B0 = TP("a", 0), TP("a", 1), TP("a", 10), TP("a", 2), TP("b", 0)
BASE = {"kafka.bootstrap.servers": "h:9092", "subscribe": "a"}


# -- offsets -----------------------------------------------------------------------------


def test_offset_json_is_canonical_whatever_the_insertion_order() -> None:
    one = SourceOffset({B0: 1, A10: 3, A2: 2, A0: 0}, tick=5)
    two = SourceOffset({A0: 0, A2: 2, B0: 1, A10: 3}, tick=5)
    assert one.to_json() == two.to_json()
    text = one.to_json()
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    # What Spark serialises (plain json.dumps of the dict) is sorted too.
    assert json.dumps(one.to_dict()) == json.dumps(one.to_dict(), sort_keys=True)
    assert '"a":{"0":0,"10":3,"2":2}' in text


def test_offset_round_trip_keeps_counters_and_flags() -> None:
    offset = SourceOffset({A0: 7}, tick=3, lost_records=4, pruned_partitions=2)
    assert SourceOffset.from_json(offset.to_json()) == offset
    initial = SourceOffset(initial=True)
    assert SourceOffset.from_dict(initial.to_dict()).initial
    entered = SourceOffset({A0: 9, B0: 4}, starts={A0: 2})
    assert SourceOffset.from_json(entered.to_json()) == entered
    assert entered.to_json() == json.dumps(entered.to_dict(), sort_keys=True, separators=(",", ":"))
    assert "tick" not in SourceOffset({A0: 1}).to_dict()


def test_parse_partition_offsets_errors_name_the_option() -> None:
    assert parse_partition_offsets('{"a": {"0": 5, "1": -2}}', "startingOffsets") == {
        A0: 5,
        A1: -2,
    }
    with pytest.raises(ConfigError, match="startingOffsets: not valid JSON"):
        parse_partition_offsets("{nope", "startingOffsets")
    with pytest.raises(ConfigError, match="startingOffsets: partition id 'x'"):
        parse_partition_offsets('{"a": {"x": 1}}', "startingOffsets")


# -- planning ------------------------------------------------------------------------------


def test_plan_ranges_with_and_without_markers() -> None:
    start = SourceOffset({A0: 5, A1: 3})
    end = SourceOffset({A0: 9, A1: 3, B0: 4})  # b0 is new: enters at 4, read next batch
    assert [(r.tp, r.start, r.end) for r in plan_ranges(start, end, markers=False)] == [(A0, 5, 9)]
    assert [(r.tp, r.start, r.end) for r in plan_ranges(start, end, markers=True)] == [
        (A0, 5, 9),
        (A1, 3, 3),
        (B0, 4, 4),
    ]


def test_fair_share_is_max_min_fair_and_exact() -> None:
    backlogs = {A0: 1000, A1: 5, B0: 40}
    granted = fair_share(backlogs, 100)
    assert granted == {A0: 55, A1: 5, B0: 40}
    assert sum(fair_share({A0: 10, A1: 10, B0: 10}, 7).values()) == 7
    assert fair_share({A0: 10, A1: 10, B0: 10}, 7) == {A0: 3, A1: 2, B0: 2}
    assert fair_share({A0: 3}, 100) == {A0: 3}


def test_next_offset_caps_by_max_offsets_fairly() -> None:
    start = SourceOffset({A0: 0, A1: 100})
    marks = {A0: Watermarks(0, 1000), A1: Watermarks(0, 110)}
    result = next_offset(start, watermarks=marks, max_offsets=50)
    assert dict(result.offset.positions) == {A0: 40, A1: 110}
    assert result.available == 1010
    assert dict(next_offset(start, watermarks=marks).offset.positions) == {A0: 1000, A1: 110}


def test_new_partitions_are_read_from_their_start_in_the_same_batch() -> None:
    start = SourceOffset({A0: 3})
    marks = {A0: Watermarks(0, 3), B0: Watermarks(2, 9)}
    result = next_offset(start, watermarks=marks, new_starts={B0: 2})
    assert dict(result.offset.positions) == {A0: 3, B0: 9}
    assert dict(result.offset.starts) == {B0: 2}  # where b0 began: in the offset log
    assert result.new_partitions == (B0,)
    ranges = plan_ranges(start, result.offset, markers=False)
    assert [(r.tp, r.start, r.end) for r in ranges] == [(B0, 2, 9)]
    # A replay plans the same ranges from the logged offsets alone.
    logged = SourceOffset.from_json(result.offset.to_json())
    assert plan_ranges(start, logged, markers=False) == ranges
    # Next trigger: nothing new; ``starts`` alone must not look like new data.
    after = next_offset(logged, watermarks=marks)
    assert not after.offset.starts
    assert nothing_new(after.offset, logged)


def test_a_new_query_reads_in_its_first_batch_and_replays_it_identically() -> None:
    initial = SourceOffset(initial=True)
    marks = {A0: Watermarks(5, 105), A1: Watermarks(0, 0), B0: Watermarks(0, 40)}
    result = next_offset(
        initial, watermarks=marks, new_starts={A0: 5, A1: 0, B0: 0}, max_offsets=60
    )
    assert dict(result.offset.positions) == {A0: 35, A1: 0, B0: 30}
    assert dict(result.offset.starts) == {A0: 5, B0: 0}  # a1 is empty: nothing to record
    ranges = [(r.tp, r.start, r.end) for r in plan_ranges(initial, result.offset, markers=True)]
    assert ranges == [(A0, 5, 35), (A1, 0, 0), (B0, 0, 30)]
    # the replayed first batch: Spark hands back the constant initial offset and the log's end
    replayed = plan_ranges(
        SourceOffset.from_dict(initial.to_dict()),
        SourceOffset.from_json(result.offset.to_json()),
        markers=True,
    )
    assert [(r.tp, r.start, r.end) for r in replayed] == ranges


def test_new_partitions_outside_the_readable_log_enter_without_reading() -> None:
    marks = {A0: Watermarks(20, 30), B0: Watermarks(0, 10)}
    result = next_offset(SourceOffset(), watermarks=marks, new_starts={A0: 5, B0: 50})
    assert dict(result.offset.positions) == {A0: 5, B0: 50}
    assert not result.offset.starts and not result.losses
    after = next_offset(result.offset, watermarks=marks)
    assert {loss.kind for loss in after.losses} == {LossKind.EXPIRED, LossKind.RESET}


def test_expired_offsets_are_a_loss_naming_the_offsets() -> None:
    start = SourceOffset({A0: 10})
    result = next_offset(start, watermarks={A0: Watermarks(25, 40)})
    (loss,) = result.losses
    assert loss.kind is LossKind.EXPIRED
    assert "topic 'a' partition 0" in loss.message()
    assert "expected offset 10" in loss.message() and "earliest available offset is 25" in (
        loss.message()
    )
    assert result.offset.positions[A0] == 40  # skip mode: reads 25..40 next
    assert result.offset.lost_records == 15
    # The range read begins at the log start, recorded with the batch: the task does not
    # meet the expired offsets again (and count them a second time).
    assert dict(result.offset.starts) == {A0: 25}
    assert plan_ranges(start, result.offset, markers=True) == [OffsetRange(A0, 25, 40)]


def test_deleted_topic_is_pruned_and_loss_only_with_unread_records() -> None:
    start = SourceOffset({A0: 10, B0: 5})
    marks = {B0: Watermarks(0, 5)}
    clean = next_offset(start, watermarks=marks, gone=[A0], last_known_high={A0: 10})
    assert clean.losses == () and clean.pruned == (A0,)
    assert dict(clean.offset.positions) == {B0: 5} and clean.offset.pruned_partitions == 1
    lossy = next_offset(start, watermarks=marks, gone=[A0], last_known_high={A0: 12})
    assert [e.kind for e in lossy.losses] == [LossKind.DELETED]


class _TopicInTransition:
    """Admin stand-in: topic ``a`` is listed with a metadata error (no leader), then heals."""

    def __init__(self) -> None:
        self.healthy = False
        self.errored_topics: frozenset[str] = frozenset()

    def check_subscription(self) -> None:
        pass

    def discover(self) -> list[TP]:
        self.errored_topics = frozenset() if self.healthy else frozenset({"a"})
        return [A0] if self.healthy else []

    def watermarks(self, tps: object) -> tuple[dict[TP, Watermarks], set[TP]]:
        wanted = set(tps)  # type: ignore[call-overload]
        if self.healthy:
            return {tp: Watermarks(0, 20) for tp in wanted}, set()
        return {}, wanted


def test_a_topic_with_a_metadata_error_is_kept_not_pruned_and_not_reread() -> None:
    from inorder.kafka.source import KafkaStreamReader

    reader = KafkaStreamReader(parse_options(BASE))
    admin = _TopicInTransition()
    reader._admin = admin  # type: ignore[assignment]
    start = SourceOffset({A0: 10}).to_dict()
    during = SourceOffset.from_dict(reader.latestOffset(start, reader.getDefaultReadLimit()))
    assert dict(during.positions) == {A0: 10} and during.pruned_partitions == 0
    admin.healthy = True
    reader._last_discovery = float("-inf")
    after = SourceOffset.from_dict(
        reader.latestOffset(during.to_dict(), reader.getDefaultReadLimit())
    )
    # Read on from where it was (10), not again from its start as a new topic.
    assert [(r.start, r.end) for r in plan_ranges(during, after, markers=False)] == [(10, 20)]


class _HealsAfter(_TopicInTransition):
    """Topic ``a`` answers with a metadata error for the first ``errors`` discoveries."""

    def __init__(self, errors: int) -> None:
        super().__init__()
        self.left = errors

    def discover(self) -> list[TP]:
        self.healthy = self.left <= 0
        self.left -= 1
        return super().discover()

    def unsettled_topics(self) -> list[str]:
        return sorted(self.errored_topics)


def test_available_now_waits_for_a_topic_with_a_metadata_error_then_fails_naming_it() -> None:
    from inorder.kafka.source import KafkaStreamReader

    # Left out of the target, the topic would never be read by this query, and the run
    # would end "caught up".
    reader = KafkaStreamReader(parse_options({**BASE, "inorder.metadataTimeoutMs": "5000"}))
    reader._admin = _HealsAfter(errors=2)  # type: ignore[assignment]
    reader.prepareForTriggerAvailableNow()
    assert reader._target == {A0: 20}
    stuck = KafkaStreamReader(parse_options({**BASE, "inorder.metadataTimeoutMs": "1000"}))
    stuck._admin = _HealsAfter(errors=1_000)  # type: ignore[assignment]
    with pytest.raises(
        InorderError, match=r"1 topic\(s\) of the subscription \(a\) had a metadata"
    ):
        stuck.prepareForTriggerAvailableNow()


def test_offset_beyond_end_is_a_reset_and_pruned() -> None:
    result = next_offset(SourceOffset({A0: 50}), watermarks={A0: Watermarks(0, 3)})
    assert [e.kind for e in result.losses] == [LossKind.RESET]
    assert A0 not in result.offset.positions


def test_available_now_target_caps_positions_and_new_partitions() -> None:
    start = SourceOffset({A0: 0})
    marks = {A0: Watermarks(0, 100)}
    result = next_offset(start, watermarks=marks, target={A0: 60})
    assert result.offset.positions[A0] == 60


def test_min_offsets_and_trigger_delay() -> None:
    kw = {"min_offsets": 100, "max_trigger_delay": 10.0}
    assert should_wait(available=5, seconds_since_last_batch=1, **kw)  # type: ignore[arg-type]
    assert not should_wait(available=5, seconds_since_last_batch=11, **kw)  # type: ignore[arg-type]
    assert not should_wait(available=100, seconds_since_last_batch=1, **kw)  # type: ignore[arg-type]
    assert not should_wait(
        available=0, min_offsets=None, seconds_since_last_batch=0, max_trigger_delay=0
    )


def test_tick_never_goes_backwards() -> None:
    assert next_tick(None, 10_500, 1000) == 10
    assert next_tick(12, 10_500, 1000) == 12


# -- options -------------------------------------------------------------------------------


def test_options_are_case_insensitive_with_spark_names() -> None:
    opts = parse_options(
        {
            "KAFKA.BOOTSTRAP.SERVERS": "h:9092",
            "subscribepattern": "site-.*",
            "STARTINGOFFSETS": "earliest",
            "maxOffsetsPerTrigger": "500",
            "failondataloss": "false",
            "includeHeaders": "true",
            "topicDiscoveryInterval": "2 seconds",
            "kafka.security.protocol": "SASL_SSL",
            "inorder.partitionmarkers": "true",
            "inorder.tickIntervalMs": "2000",
        }
    )
    assert opts.subscribe_pattern == "site-.*" and opts.starting_offsets == "earliest"
    assert opts.max_offsets_per_trigger == 500 and not opts.fail_on_data_loss
    assert opts.include_headers and opts.partition_markers and opts.tick_interval_ms == 2000
    assert opts.topic_discovery_interval.total_seconds() == 2
    assert opts.kafka == {"security.protocol": "SASL_SSL"}
    assert opts.isolation_level == "read_committed"


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"subscribePattern": "x"}, "subscribe, subscribePattern, assign: exactly one"),
        ({"bogus": "1"}, "bogus: unknown option"),
        ({"minPartitions": "4"}, "minPartitions: not supported"),
        (
            {"maxRecordsPerPartition": "1000", "inorder.partitionMarkers": "true"},
            "maxRecordsPerPartition: not supported by inorder's engines",
        ),
        ({"maxRecordsPerPartition": "0"}, "maxRecordsPerPartition: must be at least 1"),
        ({"kafka.auto.offset.reset": "earliest"}, "kafka.auto.offset.reset: not supported"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger: must be at least 1"),
        ({"maxOffsetsPerTrigger": "ten"}, "maxOffsetsPerTrigger: expected an integer"),
        ({"startingOffsets": "middle"}, "startingOffsets: expected earliest"),
        (
            {"startingOffsets": "earliest", "startingTimestamp": "5"},
            "startingOffsets, startingTimestamp: conflicting",
        ),
        (
            {"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"},
            "minOffsetsPerTrigger, maxOffsetsPerTrigger: conflicting",
        ),
        ({"maxTriggerDelay": "5 s"}, "maxTriggerDelay: only meaningful"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss: expected true or false"),
        ({"kafka.isolation.level": "dirty"}, "kafka.isolation.level"),
        ({"newTopicStartingOffsets": "middle"}, "newTopicStartingOffsets"),
        ({"inorder.rangeGroups": "2"}, "inorder.rangeGroups: needs inorder.rangesOnly=true"),
        (
            {
                "inorder.partitionMarkers": "true",
                "inorder.rangesOnly": "true",
                "inorder.rangeGroups": "-1",
            },
            "inorder.rangeGroups: must be at least 0",
        ),
    ],
)
def test_bad_options_name_the_option(extra: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        parse_options({**BASE, **extra})


def test_max_records_per_partition_cuts_long_ranges_only() -> None:
    a0, a1 = TP("a", 0), TP("a", 1)
    ranges = [OffsetRange(a0, 10, 35), OffsetRange(a1, 5, 15), OffsetRange(a1, 0, 0)]
    assert split_ranges(ranges, 10) == [
        OffsetRange(a0, 10, 20),
        OffsetRange(a0, 20, 30),
        OffsetRange(a0, 30, 35),
        OffsetRange(a1, 5, 15),
        OffsetRange(a1, 0, 0),
    ]
    assert parse_options({**BASE, "maxRecordsPerPartition": "10"}).max_records_per_partition == 10


def test_invalid_regex_and_missing_bootstrap() -> None:
    with pytest.raises(ConfigError, match="subscribePattern: invalid regex"):
        parse_options({"kafka.bootstrap.servers": "h", "subscribePattern": "a[("})
    with pytest.raises(ConfigError, match=re.escape("kafka.bootstrap.servers: required")):
        parse_options({"subscribe": "a"})
    with pytest.raises(ConfigError, match="given twice"):
        parse_options({**BASE, "Subscribe": "b"})


def test_jaas_config_is_translated_and_secrets_redacted() -> None:
    opts = parse_options(
        {
            **BASE,
            "kafka.sasl.jaas.config": 'org.apache...PlainLoginModule required username="u" '
            'password="s3cret";',
            "kafka.ssl.key.password": "pw",
        }
    )
    assert opts.kafka["sasl.username"] == "u" and opts.kafka["sasl.password"] == "s3cret"
    shown = str(opts.redacted_kafka())
    assert "s3cret" not in shown and "pw'" not in shown and "'u'" in shown
    assert redact({"sasl.oauthbearer.client.secret": "x"}) == {
        "sasl.oauthbearer.client.secret": "***"
    }


def test_kafka_source_to_options_round_trips_through_the_parser() -> None:
    source = KafkaSource(
        bootstrap_servers="h:9092",
        topic_pattern="site-.*",
        max_offsets_per_trigger=100,
        fail_on_data_loss=False,
        kafka_options={"sasl.password": "hidden", "kafka.security.protocol": "SASL_SSL"},
        topic_discovery_interval="5 seconds",
    )
    opts = parse_options(source.to_options())
    assert opts.subscribe_pattern == "site-.*" and opts.starting_offsets == "earliest"
    assert opts.kafka == {"sasl.password": "hidden", "security.protocol": "SASL_SSL"}
    assert opts.topic_discovery_interval.total_seconds() == 5
    assert "hidden" not in repr(source)
    with pytest.raises(ConfigError, match="exactly one"):
        KafkaSource(bootstrap_servers="h", topics=["a"], topic_pattern="b").to_options()
    assign = KafkaSource(bootstrap_servers="h", assign={"a": [0, 1]}).to_options()
    assert parse_options(assign).assign == (A0, A1)


def test_kafka_source_options_by_spark_name_win_over_fields() -> None:
    by_time = KafkaSource(
        bootstrap_servers="h", topics=["a"], options={"startingTimestamp": "1700000000000"}
    )
    parsed = parse_options(by_time.to_options())
    assert parsed.starting_timestamp == 1700000000000
    per_partition = KafkaSource(
        bootstrap_servers="h",
        topics=["a"],
        options={"startingOffsetsByTimestamp": json.dumps({"a": {"0": 1700000000000}})},
    )
    assert parse_options(per_partition.to_options()).starting_timestamps == {A0: 1700000000000}
    other_case = KafkaSource(
        bootstrap_servers="h", topics=["a"], options={"startingoffsets": "latest"}
    )
    assert parse_options(other_case.to_options()).starting_offsets == "latest"
    with pytest.raises(ConfigError, match="maxOffsetsPerTrigger"):
        parse_options(
            KafkaSource(bootstrap_servers="h", topics=["a"], max_offsets_per_trigger=0).to_options()
        )


# -- markers and lag -----------------------------------------------------------------------


def test_marker_rows_round_trip() -> None:
    batch = marker_batch(A1, 5, 9)
    assert batch.schema == SOURCE_ARROW_SCHEMA
    (row,) = batch.to_pylist()
    assert is_marker(row)
    marker = parse_marker(row)
    assert marker is not None and (marker.tp, marker.start, marker.end) == (A1, 5, 9)
    record = {**row, "value": b"x", "timestampType": 0, "headers": None}
    assert not is_marker(record) and parse_marker(record) is None
    both = pa.Table.from_batches([batch]).to_batches()[0]
    assert marker_mask(both).to_pylist() == [True]


def test_lag_from_progress() -> None:
    progress = {
        "sources": [
            {
                "endOffset": json.dumps(
                    SourceOffset({A0: 10, A1: 5}, pruned_partitions=1).to_dict()
                ),
                "latestOffset": SourceOffset({A0: 25, A1: 5}).to_dict(),
            },
            {"endOffset": "42", "latestOffset": "50"},  # some other source
        ]
    }
    assert lag_from_progress(progress) == {A0: 15, A1: 0}
    assert total_lag(json.dumps(progress)) == 15
    assert source_counters(progress) == {"lostRecords": 0, "prunedPartitions": 1}


# -- Arrow conversion of consumed records ----------------------------------------------------


def _message(offset: int, ts: tuple[int, int]) -> object:
    from confluent_kafka import Message

    return Message(
        topic="a", partition=0, offset=offset, key=b"k%d" % offset, value=b"v", timestamp=ts
    )


def test_records_become_arrow_columns_of_the_source_schema() -> None:
    from inorder.kafka.consumer import _to_batch

    created = [_message(o, (1, 1_700_000_000_000 + o)) for o in range(5, 8)]
    batch = _to_batch(A0, created, 5, include_headers=False)  # a contiguous run from 5
    assert batch.schema == SOURCE_ARROW_SCHEMA
    assert batch.column("offset").to_pylist() == [5, 6, 7]
    assert batch.column("timestampType").to_pylist() == [0, 0, 0]
    assert batch.column("key").to_pylist() == [b"k5", b"k6", b"k7"]
    assert batch.column("timestamp")[0].value == 1_700_000_000_005_000  # microseconds
    assert batch.column("headers").null_count == 3
    mixed = [_message(3, (2, 10)), _message(9, (0, -1)), _message(12, (1, 20))]
    batch = _to_batch(A0, mixed, [3, 9, 12], include_headers=False)  # gaps: the list is kept
    assert batch.column("offset").to_pylist() == [3, 9, 12]
    assert batch.column("timestampType").to_pylist() == [1, -1, 0]
    assert batch.column("timestamp").is_null().to_pylist() == [False, True, False]


def test_source_options_repr_hides_secrets() -> None:
    from inorder.kafka.options import parse_options

    options = parse_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9",
            "subscribe": "t",
            "kafka.sasl.password": "hunter2",
            "kafka.security.protocol": "SASL_SSL",
        }
    )
    shown = repr(options)
    assert "hunter2" not in shown and "'sasl.password': '***'" in shown
    assert "SASL_SSL" in shown and "bootstrap_servers='127.0.0.1:9'" in shown


def test_range_groups_balance_records_and_keep_each_partition_in_one_group() -> None:
    from inorder.kafka.input_partitions import group_ranges

    ranges = [("a", 0, 0, 900), ("a", 1, 0, 100), ("b", 0, 50, 550), ("b", 1, 0, 400)]
    groups = group_ranges(ranges, 2)
    assert len(groups) == 2
    loads = sorted(sum(e - s for _, _, s, e in g.ranges) for g in groups)
    assert loads == [900, 1000]  # largest first, each into the lighter group
    flat = [r for g in groups for r in g.ranges]
    assert sorted(flat) == sorted(ranges)  # every range exactly once
    assert all(g.ranges == sorted(g.ranges) for g in groups)  # topic-partition order within
    assert len(group_ranges(ranges[:1], 4)) == 1  # never an empty group


def test_a_range_group_reads_as_one_marker_row_per_range() -> None:
    from inorder.kafka.source import KafkaStreamReader

    options = {
        **BASE,
        "inorder.partitionMarkers": "true",
        "inorder.rangesOnly": "true",
        "inorder.rangeGroups": "2",
    }
    reader = KafkaStreamReader(parse_options(options))
    start = SourceOffset({TP("a", 0): 0, TP("a", 1): 0, TP("b", 0): 0}).to_dict()
    end = SourceOffset({TP("a", 0): 30, TP("a", 1): 10, TP("b", 0): 25}).to_dict()
    parts = reader.partitions(start, end)
    assert len(parts) == 2
    found = []
    for part in parts:
        (batch,) = list(reader.read(part))
        assert batch.schema == SOURCE_ARROW_SCHEMA
        for row in batch.to_pylist():
            marker = parse_marker(row)
            assert marker is not None
            found.append((marker.tp.topic, marker.tp.partition, marker.start, marker.end))
    assert sorted(found) == [("a", 0, 0, 30), ("a", 1, 0, 10), ("b", 0, 0, 25)]


def test_range_groups_stay_the_same_while_partitions_are_equally_busy() -> None:
    from inorder.kafka.input_partitions import group_ranges

    def members(ranges: list[tuple[str, int, int, int]]) -> list[list[tuple[str, int]]]:
        return [[(t, p) for t, p, _, _ in g.ranges] for g in group_ranges(ranges, 2)]

    # Two batches of 12 partitions whose sizes differ a little and in another order: the
    # balanced packing (largest first) moves partitions between groups, the stable one not.
    first = [
        (t, p, 0, 8300 + 37 * ((p * 5 + len(t)) % 7)) for t in ("x", "y", "z") for p in range(4)
    ]
    second = [(t, p, e, e + 8400 - 41 * ((p * 3 + len(t)) % 5)) for t, p, _, e in first]
    assert members(first) == members(second)
    assert members(first)[0] == [("x", 0), ("x", 2), ("y", 0), ("y", 2), ("z", 0), ("z", 2)]
    # The busy partitions would share one group: balance wins over stability.
    skewed = [("x", p, 0, 5000 if p % 2 == 0 else 1000) for p in range(4)]
    loads = sorted(sum(e - s for _, _, s, e in g.ranges) for g in group_ranges(skewed, 2))
    assert loads == [6000, 6000]


def test_range_groups_deal_whole_topics_when_that_is_as_even() -> None:
    from inorder.kafka.input_partitions import group_ranges

    def members(ranges: list[tuple[str, int, int, int]], n: int) -> list[list[tuple[str, int]]]:
        return [[(t, p) for t, p, _, _ in g.ranges] for g in group_ranges(ranges, n)]

    # Many topics per group: each topic's partitions share a task (one output file per topic).
    many = [(f"s{i:03d}", p, 0, 1000 + 7 * p) for i in range(10) for p in range(4)]
    groups = members(many, 2)
    assert [len(g) for g in groups] == [20, 20]
    assert all(len({t for t, _ in g}) == 5 for g in groups)
    assert groups[0][:4] == [("s000", 0), ("s000", 1), ("s000", 2), ("s000", 3)]
    # Fewer topics than that spreads evenly (10 topics over 8 groups): partitions are dealt.
    assert sorted(len(g) for g in members(many, 8)) == [5] * 8
