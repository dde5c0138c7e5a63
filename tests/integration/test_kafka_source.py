"""The inorder-kafka source against a real broker and real Spark.

Every query collects ``(topic, partition, offset)`` per micro-batch through foreachBatch and
checks ordering and completeness against what was produced.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as CTP
from confluent_kafka.admin import AdminClient, NewPartitions

from inorder.errors import ConfigError
from inorder.kafka import KafkaSource
from inorder.kafka.lag import lag_from_progress, source_counters
from inorder.kafka.markers import parse_marker
from inorder.records import TopicPartition

SCRIPT = Path(__file__).parent / "scripts" / "kafka_exactly_once.py"
Batches = list[tuple[int, list[Any]]]


def produce(bootstrap: str, topic: str, count: int, partitions: int = 1) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(
            topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % partitions
        )
    producer.flush(30)


def run_query(
    spark: Any,
    df: Any,
    checkpoint: Path,
    *,
    trigger: dict[str, Any],
    until: Callable[[Batches], bool] | None = None,
    timeout: float = 90,
    with_pid: bool = False,
) -> tuple[Batches, Any]:
    """Run to completion (AvailableNow) or until ``until(batches)``; return batches and query."""
    from pyspark.sql.functions import spark_partition_id

    batches: Batches = []

    def collect(batch_df: Any, batch_id: int) -> None:
        if with_pid:
            batch_df = batch_df.withColumn("pid", spark_partition_id())
        batches.append((batch_id, batch_df.collect()))

    query = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )
    deadline = time.monotonic() + timeout
    try:
        if until is None:
            assert query.awaitTermination(timeout), "query did not finish in time"
        else:
            while not until(batches):
                assert query.isActive, f"query died: {query.exception()}"
                assert time.monotonic() < deadline, "condition not reached in time"
                time.sleep(0.2)
    finally:
        if query.isActive:
            # stop between triggers (stopping inside foreachBatch logs JVM noise)
            while query.status["isTriggerActive"] and time.monotonic() < deadline + 30:
                time.sleep(0.05)
            query.stop()
    return batches, query


def coords(batches: Batches) -> list[tuple[str, int, int]]:
    return [
        (r.topic, r.partition, r.offset) for _, rows in batches for r in rows if r.value is not None
    ]


def assert_each_once_in_order(
    seen: list[tuple[str, int, int]], expected: dict[tuple[str, int], range]
) -> None:
    by_tp: dict[tuple[str, int], list[int]] = {}
    for t, p, o in seen:
        by_tp.setdefault((t, p), []).append(o)
    assert {tp: offs for tp, offs in by_tp.items() if offs} == {
        tp: list(r) for tp, r in expected.items() if len(r)
    }


def source(kafka: Any, **kw: Any) -> KafkaSource:
    return KafkaSource(bootstrap_servers=kafka.bootstrap_servers, **kw)


# -- ordering, limits, AvailableNow ------------------------------------------------------


def test_available_now_reads_everything_in_order_within_max_offsets(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=3)
    produce(kafka.bootstrap_servers, topic, 900, partitions=3)
    df = source(kafka, topics=[topic], max_offsets_per_trigger=200).load(spark)
    batches, query = run_query(spark, df, tmp_path / "ck", trigger={"availableNow": True})
    seen = coords(batches)
    assert_each_once_in_order(seen, {(topic, p): range(300) for p in range(3)})
    sizes = [len(rows) for _, rows in batches]
    assert max(sizes) <= 200 and sizes[0] == 200  # the first batch already reads
    # fair split: every batch reads from all three partitions while each has a backlog
    assert {r.partition for r in batches[0][1]} == {0, 1, 2}
    assert {r.partition for r in batches[1][1]} == {0, 1, 2}
    # Lag per partition while the backlog is read: 900 - 200 after the first batch, in the
    # query's own progress; records per trigger are its input rows.
    first = next(p for p in query.recentProgress if int(p["numInputRows"]) > 0)
    assert int(first["numInputRows"]) == 200
    lag = lag_from_progress(first)
    assert set(lag) == {TopicPartition(topic, p) for p in range(3)}
    assert sum(lag.values()) == 700 and all(v > 0 for v in lag.values())
    progress = query.lastProgress
    assert set(lag_from_progress(progress)) == set(lag)
    assert sum(lag_from_progress(progress).values()) == 0


def test_max_records_per_partition_spreads_a_partition_over_tasks(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=2)
    produce(kafka.bootstrap_servers, topic, 1000, partitions=2)
    df = source(
        kafka,
        topics=[topic],
        max_offsets_per_trigger=600,
        options={"maxRecordsPerPartition": "120"},
    ).load(spark)
    batches, _ = run_query(
        spark, df, tmp_path / "ck", trigger={"availableNow": True}, with_pid=True
    )
    # Every record once (order across tasks is given up: compared as a set).
    seen = coords(batches)
    assert len(seen) == len(set(seen)) == 1000
    assert set(seen) == {(topic, p, o) for p in range(2) for o in range(500)}
    # 300 offsets per partition in the first batch: 3 tasks of <= 120 each per partition.
    first = batches[0][1]
    tasks: dict[int, list[tuple[int, int]]] = {}
    for r in first:
        tasks.setdefault(r.pid, []).append((r.partition, r.offset))
    assert len(tasks) == 6
    for rows in tasks.values():
        assert len({p for p, _ in rows}) == 1 and len(rows) <= 120
        offsets = [o for _, o in rows]
        assert offsets == sorted(offsets)  # each piece is still read in offset order


def test_assign_starting_positions_and_headers_like_sparks_connector(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    base_ms = int(time.time() * 1000) - 3_600_000  # recent: older records expire by retention
    for i in range(10):
        for p in range(2):
            producer.produce(
                topic,
                value=f"p{p}-{i}".encode(),
                partition=p,
                timestamp=base_ms + i * 1000,
                headers=[("h", f"{i}".encode())],
            )
    producer.flush(30)

    def read(name: str, **kw: Any) -> list[Any]:
        df = source(kafka, **kw).load(spark)
        batches, _ = run_query(spark, df, tmp_path / name, trigger={"availableNow": True})
        return [r for _, rows in batches for r in rows]

    # assign + per-partition JSON start + headers: only partition 1, from offset 3.
    rows = read(
        "assign",
        assign={topic: [1]},
        starting_offsets={topic: {"1": 3}},
        include_headers=True,
    )
    assert [(r.partition, r.offset) for r in rows] == [(1, o) for o in range(3, 10)]
    assert [[(h.key, bytes(h.value)) for h in r.headers] for r in rows] == [
        [("h", f"{o}".encode())] for o in range(3, 10)
    ]
    assert all(r.timestampType == 0 for r in rows)  # CreateTime
    # startingTimestamp: the first record at or after the time, in every partition.
    rows = read("ts", topics=[topic], options={"startingTimestamp": str(base_ms + 7_500)})
    assert sorted((r.partition, r.offset) for r in rows) == [(p, o) for p in (0, 1) for o in (8, 9)]
    # startingOffsets latest: nothing of the backlog.
    assert read("latest", topics=[topic], starting_offsets="latest") == []


def test_min_offsets_per_trigger_holds_batches_until_enough_or_the_delay(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=1)
    produce(kafka.bootstrap_servers, topic, 30)
    df = source(
        kafka,
        topics=[topic],
        options={"minOffsetsPerTrigger": "50", "maxTriggerDelay": "10 seconds"},
    ).load(spark)
    started = time.monotonic()
    arrivals: list[float] = []
    produced: list[float] = []
    more = [20, 60]  # after batch 1: too few (held until the delay); after batch 2: enough

    def until(batches: Batches) -> bool:
        while len(arrivals) < len(batches):
            arrivals.append(time.monotonic() - started)
            if more:
                produce(kafka.bootstrap_servers, topic, more.pop(0))
                produced.append(time.monotonic() - started)
        return len(arrivals) >= 3

    batches, _ = run_query(
        spark,
        df,
        tmp_path / "ck",
        trigger={"processingTime": "200 milliseconds"},
        until=until,
        timeout=90,
    )
    # The first batch reads what is there (partitions entering the plan never wait).
    assert [len(rows) for _, rows in batches[:3]] == [30, 20, 60]
    # 20 < 50 offsets: held until maxTriggerDelay (10 s) after the previous batch was
    # planned, although every 200 ms trigger saw them. (The first batch's run, Python workers
    # starting, takes a few seconds of that delay.)
    assert arrivals[1] - arrivals[0] >= 4.0
    # 60 >= 50 offsets: the next trigger runs it, long before another delay.
    assert arrivals[2] - produced[1] < 3.0
    assert_each_once_in_order(coords(batches), {(topic, 0): range(110)})


def test_markers_start_every_task_and_ticks_run_batches_without_data(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=2)
    produce(kafka.bootstrap_servers, topic, 10, partitions=1)
    df = source(kafka, topics=[topic]).load(
        spark, extra_options={"inorder.partitionMarkers": "true", "inorder.tickIntervalMs": "1000"}
    )
    batches, _ = run_query(
        spark,
        df,
        tmp_path / "ck",
        trigger={"processingTime": "200 milliseconds"},
        until=lambda b: len(b) >= 4,
        with_pid=True,
    )
    for batch_id, rows in batches:
        firsts: dict[int, Any] = {}
        for row in rows:
            firsts.setdefault(row.pid, row)
        markers = [parse_marker(row) for row in firsts.values()]
        assert all(m is not None for m in markers), f"batch {batch_id}: task without marker"
        assert sorted(m.tp.partition for m in markers if m) == [0, 1]
        assert sum(parse_marker(r) is not None for r in rows) == 2
    data_batch = batches[0][1]
    marker0 = parse_marker(data_batch[0])
    assert marker0 is not None and (marker0.start, marker0.end) == (0, 10)
    assert [r.offset for r in data_batch if r.value is not None] == list(range(10))
    # batches 1.. had no data: they ran because the tick advanced
    assert all(all(r.value is None for r in rows) for _, rows in batches[1:])


def test_a_failed_first_batch_is_replayed_with_the_same_ranges(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    topic = kafka.new_topic(partitions=2)
    produce(kafka.bootstrap_servers, topic, 60, partitions=2)
    ck = tmp_path / "ck"
    attempts: list[list[tuple[str, int, int]]] = []

    def fail_first(batch_df: Any, batch_id: int) -> None:
        attempts.append([(r.topic, r.partition, r.offset) for r in batch_df.collect()])
        raise RuntimeError("crash inside the first batch")

    query = (
        source(kafka, topics=[topic])
        .load(spark)
        .writeStream.foreachBatch(fail_first)
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException):
        query.awaitTermination(90)
    assert len(attempts) == 1 and len(attempts[0]) == 60
    produce(kafka.bootstrap_servers, topic, 40, partitions=2)  # arrives before the restart
    batches, _ = run_query(
        spark, source(kafka, topics=[topic]).load(spark), ck, trigger={"availableNow": True}
    )
    # batch 0 again, exactly the range it had (its start is in the offset log), then the rest
    assert batches[0][0] == 0
    assert sorted(coords(batches[:1])) == sorted(attempts[0])
    assert_each_once_in_order(coords(batches), {(topic, p): range(50) for p in range(2)})


# -- discovery -----------------------------------------------------------------------------


def test_topics_and_partitions_appear_and_disappear_mid_run(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    prefix = f"disc-{uuid.uuid4().hex[:8]}"
    first = kafka.new_topic(f"{prefix}-a", partitions=1)
    doomed = kafka.new_topic(f"{prefix}-c", partitions=1)
    produce(kafka.bootstrap_servers, first, 20)
    produce(kafka.bootstrap_servers, doomed, 5)
    df = source(kafka, topic_pattern=f"{prefix}-.*", topic_discovery_interval=0.5).load(spark)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    state = {"stage": 0}
    later = f"{prefix}-b"

    def progress(batches: Batches) -> bool:
        seen = set(coords(batches))
        if state["stage"] == 0 and len(seen) == 25:
            # everything so far read: now add a topic, add a partition, delete a topic
            kafka.new_topic(later, partitions=1)
            produce(kafka.bootstrap_servers, later, 7)
            admin.create_partitions([NewPartitions(first, 2)])[first].result(15)
            time.sleep(0.5)
            producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
            for i in range(4):
                producer.produce(first, value=b"new%d" % i, partition=1)
            producer.flush(10)
            admin.delete_topics([doomed])[doomed].result(15)
            state["stage"] = 1
            state["at"] = len(batches)
        return state["stage"] == 1 and len(seen) == 25 + 7 + 4 and pruned() >= 1

    def pruned() -> int:
        # The deleted topic must have been planned away (logged and counted), not just unread.
        counts = [
            source_counters(p)["prunedPartitions"]
            for q in spark.streams.active
            for p in q.recentProgress
        ]
        return max(counts, default=0)

    batches, query = run_query(
        spark,
        df,
        tmp_path / "ck",
        trigger={"processingTime": "300 milliseconds"},
        until=progress,
        timeout=120,
    )
    seen = coords(batches)
    assert_each_once_in_order(
        seen,
        {(first, 0): range(20), (doomed, 0): range(5), (later, 0): range(7), (first, 1): range(4)},
    )
    # bounded: picked up within a handful of triggers after they appeared
    assert len(batches) - state["at"] <= 12
    assert source_counters(query.lastProgress) == {"lostRecords": 0, "prunedPartitions": 1}


# -- transactions and data loss ----------------------------------------------------------


def test_aborted_transactions_are_hidden_and_marker_gaps_are_not_loss(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=1)
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"tx-{topic}"}
    )
    producer.init_transactions(15)
    committed = []
    for round_ in range(4):
        producer.begin_transaction()
        for i in range(5):
            value = f"c{round_}-{i}".encode()
            producer.produce(topic, value=value, partition=0)
            committed.append(value)
        producer.commit_transaction(15)
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic, value=f"aborted{round_}-{i}".encode(), partition=0)
        producer.abort_transaction(15)
    df = source(kafka, topics=[topic], max_offsets_per_trigger=4).load(spark)
    batches, _ = run_query(spark, df, tmp_path / "ck", trigger={"availableNow": True})
    values = [r.value for _, rows in batches for r in rows]
    assert values == committed  # no aborted record, nothing lost, in order
    offsets = [r.offset for _, rows in batches for r in rows]
    assert offsets == sorted(offsets) and offsets[-1] - offsets[0] > len(offsets) - 1  # gaps


def test_expired_offsets_fail_naming_offsets_or_are_skipped(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=1)
    produce(kafka.bootstrap_servers, topic, 50)
    ck = tmp_path / "ck"
    df = source(kafka, topics=[topic]).load(spark)
    run_query(spark, df, ck, trigger={"availableNow": True})
    produce(kafka.bootstrap_servers, topic, 50)  # offsets 50..99
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.delete_records([CTP(topic, 0, 80)])[CTP(topic, 0, 80)].result(15)
    from pyspark.errors import StreamingQueryException

    with pytest.raises(StreamingQueryException) as failure:
        run_query(
            spark, source(kafka, topics=[topic]).load(spark), ck, trigger={"availableNow": True}
        )
    message = str(failure.value)
    assert f"topic '{topic}' partition 0" in message
    assert "expected offset 50" in message and "earliest available offset is 80" in message
    skipping = source(kafka, topics=[topic], fail_on_data_loss=False).load(spark)
    batches, query = run_query(spark, skipping, ck, trigger={"availableNow": True})
    assert [o for _, _, o in coords(batches)] == list(range(80, 100))
    end = json.loads(query.lastProgress["sources"][0]["endOffset"])
    assert end["lostRecords"] == 30


# -- bad input -----------------------------------------------------------------------------


def test_bad_input_fails_fast_naming_the_option(spark: Any, kafka: Any) -> None:
    with pytest.raises(ConfigError, match="subscribe: unknown topic"):
        source(kafka, topics=["no-such-topic-" + uuid.uuid4().hex]).load(spark)
    with pytest.raises(ConfigError, match="subscribePattern: invalid regex"):
        source(kafka, topic_pattern="a[(").load(spark)
    with pytest.raises(ConfigError, match="maxOffsetsPerTrigger"):
        source(kafka, topics=["x"], options={"maxOffsetsPerTrigger": "-3"}).load(spark)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="no broker answered"):
        KafkaSource(
            bootstrap_servers="127.0.0.1:1",
            topics=["x"],
            options={"inorder.metadataTimeoutMs": "2000"},
        ).load(spark)
    assert time.monotonic() - started < 15
    # through the plain format name the message reaches the user as well
    with pytest.raises(Exception, match=r"bogus[oO]ption"):
        spark.readStream.format("inorder-kafka").options(
            **{
                "kafka.bootstrap.servers": kafka.bootstrap_servers,
                "subscribe": "x",
                "bogusOption": "1",
            }
        ).load()


# -- exactly-once across restarts and kill -9 ----------------------------------------------


class BackgroundProducer:
    """Keeps writing to a topic (about 1500 records/s) until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
        )
        self._topic, self._partitions = topic, partitions
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            for _ in range(150):
                self._producer.produce(self._topic, value=b"%d" % i, partition=i % self._partitions)
                i += 1
            self._producer.poll(0)
            time.sleep(0.1)
        self._producer.flush(30)

    def __enter__(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def expected_offsets(bootstrap: str, topic: str, partitions: int) -> set[tuple[str, int, int]]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check"})
    out = set()
    for p in range(partitions):
        low, high = consumer.get_watermark_offsets(CTP(topic, p), timeout=10, cached=False)
        out |= {(topic, p, o) for o in range(low, high)}
    consumer.close()
    return out


def read_outputs(out: Path) -> list[tuple[str, int, int]]:
    rows: list[tuple[str, int, int]] = []
    for path in sorted(out.glob("batch-*.json")):
        rows.extend(tuple(r) for r in json.loads(path.read_text()))  # type: ignore[misc]
    return rows


def assert_exactly_once(
    rows: list[tuple[str, int, int]], expected: set[tuple[str, int, int]]
) -> None:
    assert len(rows) == len(set(rows)), "duplicates in the sink"
    assert set(rows) == expected, (
        f"missing {len(expected - set(rows))}, extra {len(set(rows) - expected)}"
    )


def test_exactly_once_across_stop_and_restart(spark: Any, kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(partitions=2)
    out, ck = tmp_path / "out", tmp_path / "ck"
    out.mkdir()

    def sink(batch_df: Any, batch_id: int) -> None:
        rows = [
            [r.topic, r.partition, r.offset]
            for r in batch_df.select("topic", "partition", "offset").collect()
        ]
        (out / f"batch-{batch_id:06d}.json").write_text(json.dumps(rows))

    def run(trigger: dict[str, Any], batches: int | None) -> None:
        query = (
            source(kafka, topics=[topic], max_offsets_per_trigger=3000)
            .load(spark)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(ck))
            .trigger(**trigger)
            .start()
        )
        if batches is None:
            assert query.awaitTermination(120)
            return
        deadline = time.monotonic() + 120
        while len(list(out.glob("batch-*"))) < batches and time.monotonic() < deadline:
            time.sleep(0.2)
        while query.status["isTriggerActive"]:
            time.sleep(0.05)
        query.stop()

    with BackgroundProducer(kafka.bootstrap_servers, topic, 2):
        run({"processingTime": "1500 milliseconds"}, 3)
        run({"processingTime": "1500 milliseconds"}, 6)
    run({"availableNow": True}, None)
    assert_exactly_once(read_outputs(out), expected_offsets(kafka.bootstrap_servers, topic, 2))


def _start_driver(
    kafka: Any, topic: str, ck: Path, out: Path, master: str, mode: str
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            kafka.bootstrap_servers,
            topic,
            str(ck),
            str(out),
            master,
            mode,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # kill the driver and its JVM together
    )


def _wait_batches(proc: subprocess.Popen[bytes], count: int, timeout: float) -> Iterator[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen = 0
    while seen < count:
        assert time.monotonic() < deadline, "driver made no progress"
        line = proc.stdout.readline().decode()
        if not line:
            raise AssertionError(f"driver exited early with {proc.wait()}")
        if line.startswith("batch "):
            seen += 1
            yield line


@pytest.mark.slow
@pytest.mark.parametrize("master", ["local[2]", "local-cluster[2,1,1024]"])
def test_exactly_once_across_kill_9_of_the_driver(kafka: Any, tmp_path: Path, master: str) -> None:
    topic = kafka.new_topic(partitions=2)
    out, ck = tmp_path / "out", tmp_path / "ck"
    # Two kills at different points of a batch on local[2]; on local-cluster one kill shows
    # what separate executor JVMs add (each start there costs three JVMs, not one).
    rounds = 2 if master.startswith("local[") else 1
    for round_ in range(rounds):
        # A backlog for the first two batches, then records arriving while the next ones run:
        # production spans the run's batches, not its start, so what is left for the drain
        # does not grow with how long the JVMs take to start on this machine.
        produce(kafka.bootstrap_servers, topic, 1400, partitions=2)
        proc = _start_driver(kafka, topic, ck, out, master, "run")
        try:
            batches = _wait_batches(proc, 3 + round_, 240)
            next(batches)
            with BackgroundProducer(kafka.bootstrap_servers, topic, 2):
                list(batches)
                time.sleep(0.3 * (round_ + 1))  # land the kill at different points of a batch
                os.killpg(proc.pid, signal.SIGKILL)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    drain = _start_driver(kafka, topic, ck, out, master, "drain")
    assert drain.wait(600) == 0
    assert_exactly_once(read_outputs(out), expected_offsets(kafka.bootstrap_servers, topic, 2))
