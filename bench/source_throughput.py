"""Throughput of the inorder-kafka source vs a raw confluent-kafka consumer, same topic, same run.

Usage: python bench/source_throughput.py [--records N] [--partitions P] [--runs R] [--write-docs]

Uses $INORDER_KAFKA_BOOTSTRAP_SERVERS, or starts a throwaway local broker (noida-db).
The source runs on local[2] into Spark's ``noop`` sink with Trigger.AvailableNow; its rate is
records / wall time of the query, after a warm-up query (Python workers already started).
Also reported: the query's start-up (``start()`` to the first micro-batch: Spark starts the
source's Python planner process) and the rate of the micro-batches alone.
The raw consumer is one process assigning all partitions and consuming to the end.
With --write-docs the results replace the "## Kafka source" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Kafka source"


def produce(bootstrap: str, topic: str, records: int, partitions: int, size: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    value = b"x" * size
    for i in range(records):
        producer.produce(topic, key=b"k%d" % (i % 1000), value=value, partition=i % partitions)
        if i % 50_000 == 0:
            producer.poll(0)
    producer.flush(120)


def raw_consumer_rate(bootstrap: str, topic: str, partitions: int, records: int) -> float:
    """Records/s of one confluent-kafka consumer reading the whole topic."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "receive.message.max.bytes": 2147483647,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    started = time.perf_counter()
    seen = 0
    while seen < records:
        for message in consumer.consume(num_messages=10_000, timeout=1.0):
            if message.error() is None:
                message.value()
                seen += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return seen / elapsed


def source_rate(
    spark: Any, bootstrap: str, topic: str, workdir: str
) -> tuple[float, float, int, float, int]:
    """Records/s of the source into the noop sink (AvailableNow, fresh checkpoint).

    Returns the rate over the query's wall time, the rate over its micro-batches with data
    (Spark's ``triggerExecution``: without query start-up and the final empty check), the
    rows read, the start-up seconds (``start()`` to the first micro-batch) and the number of
    micro-batches with data.
    """
    from datetime import datetime

    from inorder.kafka import KafkaSource

    df = KafkaSource(bootstrap_servers=bootstrap, topics=[topic]).load(spark)
    wall_start = time.time()
    started = time.perf_counter()
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", f"{workdir}/ck-{uuid.uuid4().hex[:8]}")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    progress = [p for p in query.recentProgress if int(p["numInputRows"]) > 0]
    rows = sum(int(p["numInputRows"]) for p in progress)
    busy = sum(float(p["durationMs"]["triggerExecution"]) for p in progress) / 1000.0
    first = query.recentProgress[0]["timestamp"] if query.recentProgress else None
    startup = (
        datetime.fromisoformat(first.replace("Z", "+00:00")).timestamp() - wall_start
        if first
        else 0.0
    )
    return rows / elapsed, rows / busy, rows, startup, len(progress)


def write_docs(text: str) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    start = current.find(SECTION + "\n")
    if start >= 0:
        nxt = current.find("\n## ", start + len(SECTION))
        current = current[:start] + current[nxt + 1 if nxt >= 0 else len(current) :]
    path.write_text(current.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    from inorder.pipeline.spark import build_spark_session

    with tempfile.TemporaryDirectory(prefix="inorder-bench-") as tmp:
        bootstrap = os.environ.get("INORDER_KAFKA_BOOTSTRAP_SERVERS", "").strip()
        state_dir = None
        if not bootstrap:
            from inorder.dev import services
            from inorder.endpoints import kafka_bootstrap_servers

            state_dir = Path(tmp) / "kafka"
            state_dir.mkdir()
            services.up(state_dir, kafka_port=0, only=["kafka"])
            bootstrap = kafka_bootstrap_servers(state_dir)
        try:
            admin = AdminClient({"bootstrap.servers": bootstrap})
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            warm = f"{topic}-warmup"
            for name, parts in ((topic, args.partitions), (warm, args.partitions)):
                admin.create_topics([NewTopic(name, parts)])[name].result(30)
            produce(bootstrap, warm, 10_000, args.partitions, args.size)
            started = time.perf_counter()
            produce(bootstrap, topic, args.records, args.partitions, args.size)
            print(f"produced {args.records} records in {time.perf_counter() - started:.1f} s")
            spark = build_spark_session("local[2]", "source-throughput", local_dir=tmp)
            source_rate(spark, bootstrap, warm, tmp)  # start the Python workers
            raw, src, steady, startups, loads = [], [], [], [], []
            batches = 0
            for run in range(args.runs):
                raw.append(raw_consumer_rate(bootstrap, topic, args.partitions, args.records))
                rate, batch_rate, rows, startup, batches = source_rate(spark, bootstrap, topic, tmp)
                assert rows == args.records, f"source read {rows} rows, expected {args.records}"
                src.append(rate)
                steady.append(batch_rate)
                startups.append(startup)
                loads.append(os.getloadavg()[0])
                print(
                    f"run {run + 1}: raw {raw[-1]:,.0f} rec/s, source {rate:,.0f} rec/s "
                    f"(data batches {batch_rate:,.0f} rec/s, {batches} of them; query start-up "
                    f"{startup:.1f} s; load average {loads[-1]:.1f})"
                )
            spark.stop()
        finally:
            if state_dir is not None:
                services.down(state_dir, only=["kafka"])
    raw_median, src_median = statistics.median(raw), statistics.median(src)
    steady_median = statistics.median(steady)
    ratio = src_median / raw_median
    per_run = ", ".join(f"{a / b:.0%}" for a, b in zip(src, raw, strict=True))
    summary = (
        f"{SECTION}\n\n"
        f"`bench/source_throughput.py --records {args.records} --partitions {args.partitions} "
        f"--size {args.size} --runs {args.runs}` ({time.strftime('%Y-%m-%d %H:%M')}, 2 cores, "
        "local noida-db broker, Spark local[2], noop sink, Trigger.AvailableNow; the raw "
        "consumer and the source alternate in the same run; source rate = records / wall time "
        "of the whole query: start-up, planning, the micro-batches and the final check that "
        f"nothing is left). The first micro-batch reads data ({batches} micro-batch(es) with "
        "data per query).\n\n"
        "| reader | median records/s | runs |\n|---|---|---|\n"
        f"| raw confluent-kafka consumer (1 process) | {raw_median:,.0f} | "
        + ", ".join(f"{r:,.0f}" for r in raw)
        + f" |\n| inorder-kafka source | {src_median:,.0f} | "
        + ", ".join(f"{r:,.0f}" for r in src)
        + f" |\n| inorder-kafka source, data micro-batches only | {steady_median:,.0f} | "
        + ", ".join(f"{r:,.0f}" for r in steady)
        + f" |\n\nRatio source / raw (wall time): **{ratio:.0%}** (target >= 70%; per run "
        f"{per_run}); data micro-batches only: {steady_median / raw_median:.0%}. Query "
        f"start-up (`start()` to the first micro-batch) median "
        f"{statistics.median(startups):.1f} s. 1-minute load average after each run: "
        + ", ".join(f"{x:.1f}" for x in loads)
        + " on 2 cores.\n"
    )
    print(summary)
    if args.write_docs:
        write_docs(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
