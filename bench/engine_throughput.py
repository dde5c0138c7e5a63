"""Engine throughput: the partition backend vs Spark's applyInPandasWithState vs plain Python.

Also the Spark backend (``transformWithState``), against the partition backend on the same
batch size in the same run.

Run: ``.venv/bin/python bench/engine_throughput.py [--sizes 200000,500000] [--runs R]
[--rounds N]``

All three do the same per-key work (count and sum a value per key, 10k keys) over the same
synthetic records (no broker: records are generated inside the Spark tasks, Kafka-shaped,
one Spark partition per topic-partition, on ``local[2]``), and all three get the same number
of records per batch (each of ``--sizes``, split over the 2 topic-partitions):

* **partition backend**: ``PartitionBackend.run_batch`` per micro-batch (decode, ordered
  apply, state delta checkpoint, commit), state carried over between batches;
* **baseline**: a streaming query ``groupBy(key).applyInPandasWithState`` (RocksDB state
  store) fed by the ``rate-micro-batch`` source, same keys and values;
* **ceiling**: a single-process pure-Python loop over the same records (decode + dict upsert),
  timed from the Arrow batch (its conversion to Python values is inside the timer, as the
  backend's is).

The backend and the baseline alternate, ``--rounds`` times per size, each round with a fresh
checkpoint, one warm-up batch and ``--runs`` timed batches; the median of all timed batches
of a contender is printed.

Then the state store alone: 1M keys in state, 1k changed per batch: the cost of a batch's
checkpoint (delta + cache update) against writing the full state, and the recovery time of
1M keys from the checkpoint into a cold cache. Medians of ``--runs`` runs are printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from inorder.processor import Context, Processor
from inorder.records import KAFKA_ARROW_SCHEMA, KAFKA_SPARK_DDL

KEYS = 10_000
PARTITIONS = 2


@dataclass
class Acc:
    """Per-key state."""

    count: int = 0
    total: int = 0


@dataclass
class Out:
    """Output row type (the bench emits none per record)."""

    k: str
    count: int


class BenchCodec:
    """Value: 8-byte little-endian integer; key: the state key."""

    def decode(self, value: bytes | None, key: bytes | None) -> tuple[str, int]:
        return (key or b"").decode(), int.from_bytes(value or b"", "little")


class CountSum(Processor[tuple[str, int], Acc, Out]):
    """Count and sum per key."""

    def key(self, msg: tuple[str, int]) -> str:
        return msg[0]

    def initial_state(self, key: str) -> Acc:
        return Acc()

    def process(self, state: Acc, msg: tuple[str, int], ctx: Context) -> Iterable[Out]:
        state.count += 1
        state.total += msg[1]
        return ()


_KEY_BYTES: pa.Array | None = None


def partition_batch(partition: int, start: int, n: int) -> pa.RecordBatch:
    """``n`` Kafka-shaped records of one partition from offset ``start`` (vectorised)."""
    import numpy as np

    global _KEY_BYTES
    if _KEY_BYTES is None:
        _KEY_BYTES = pa.array([f"k{i}".encode() for i in range(KEYS)], pa.binary())
    offsets = np.arange(start, start + n, dtype=np.int64)
    key_index = (offsets * 7919 + partition) % KEYS
    values = (offsets % 97).astype("<i8")
    value_array = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(8), n, [None, pa.py_buffer(values.tobytes())]
    ).cast(pa.binary())
    return pa.RecordBatch.from_arrays(
        [
            _KEY_BYTES.take(pa.array(key_index)),
            value_array,
            pa.repeat(pa.scalar("bench", pa.string()), n),
            pa.array(np.full(n, partition, dtype=np.int32)),
            pa.array(offsets),
            pa.array(offsets + 1_700_000_000_000_000).cast(pa.timestamp("us", tz="UTC")),
            pa.array(np.zeros(n, dtype=np.int32)),
            pa.nulls(n, KAFKA_ARROW_SCHEMA.field("headers").type),
        ],
        schema=KAFKA_ARROW_SCHEMA,
    )


def generate(
    start: int, per_partition: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: the records of the partitions whose ids arrive."""
    chunk = 100_000
    for batch in batches:
        for partition in batch.column(0).to_pylist():
            done = 0
            while done < per_partition:
                n = min(chunk, per_partition - done)
                yield partition_batch(partition, start + done, n)
                done += n


def synthetic_df(spark: Any, start: int, per_partition: int) -> Any:
    """A Kafka-shaped DataFrame, one Spark partition per topic-partition."""
    import functools

    return spark.range(0, PARTITIONS, 1, PARTITIONS).mapInArrow(
        functools.partial(generate, start, per_partition), KAFKA_SPARK_DDL
    )


# -- the three contenders ----------------------------------------------------------------------


def bench_partition_backend(spark: Any, per_partition: int, runs: int, tmp: str) -> list[float]:
    """records/s of PartitionBackend.run_batch, one value per (timed) batch."""
    from inorder.engine.partition import PartitionBackend
    from inorder.integrity import Integrity
    from inorder.sinks.parquet import ParquetSink
    from inorder.state.store import StateOptions

    backend = PartitionBackend(
        CountSum(),
        BenchCodec(),
        Integrity.strict(),
        checkpoint=os.path.join(tmp, "ckpt"),
        sink=ParquetSink(os.path.join(tmp, "out")),
        state_options=StateOptions(cache_dir=os.path.join(tmp, "cache")),
    )
    backend.check()
    rates = []
    for batch_id in range(runs + 1):  # batch 0 warms up the Python workers
        df = synthetic_df(spark, batch_id * per_partition, per_partition)
        started = time.perf_counter()
        report = backend.run_batch(df, batch_id)
        elapsed = time.perf_counter() - started
        assert report.records == per_partition * PARTITIONS, report
        if batch_id > 0:
            rates.append(report.records / elapsed)
    return rates


def bench_spark_backend(
    spark: Any, per_partition: int, runs: int, tmp: str, key_groups: int = 4
) -> list[float]:
    """records/s of the Spark backend's streaming query (route, transformWithState, commit).

    The query runs over a replay source (``inorder.testing.replay``); a batch is timed
    from its release to the end of its ``foreachBatch`` (reading, routing, the shuffle, the
    keyed stage with Spark's RocksDB state, the commit).
    """
    from inorder.engine.spark_backend import SparkBackend
    from inorder.integrity import Integrity
    from inorder.records import TopicPartition
    from inorder.sinks.parquet import ParquetSink
    from inorder.testing.replay import ReplayRun

    backend = SparkBackend(
        CountSum(),
        BenchCodec(),
        Integrity.strict(),
        checkpoint=os.path.join(tmp, "spark-ckpt"),
        sink=ParquetSink(os.path.join(tmp, "spark-out")),
        key_groups=key_groups,
        shuffle_partitions=key_groups,
    )
    backend.check()
    tps = [TopicPartition("bench", p) for p in range(PARTITIONS)]
    run = ReplayRun(spark, backend, os.path.join(tmp, "spark-run"), tps)
    rates = []
    try:
        for batch_id in range(runs + 1):  # batch 0 warms up the Python workers
            table = pa.Table.from_batches(
                [
                    partition_batch(p, batch_id * per_partition, per_partition)
                    for p in range(PARTITIONS)
                ]
            )
            started = time.perf_counter()
            report = run.step(table)
            elapsed = time.perf_counter() - started
            assert report.records == per_partition * PARTITIONS, report
            if batch_id > 0:
                rates.append(report.records / elapsed)
    finally:
        run.stop()
    return rates


def bench_vanilla(spark: Any, rows_per_batch: int, runs: int, tmp: str) -> list[float]:
    """records/s of groupBy(key).applyInPandasWithState on rate-micro-batch input."""
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    def count_sum(key: Any, pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        count, total = state.get if state.exists else (0, 0)
        for pdf in pdfs:
            count += len(pdf)
            total += int(pdf["v"].sum())
        state.update((count, total))
        yield pd.DataFrame({"k": [key[0]], "count": [count]})

    # applyInPandasWithState does not support the Avro state encoding inorder's session sets.
    spark.conf.set("spark.sql.streaming.stateStore.encodingFormat", "unsaferow")
    source = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", PARTITIONS)
        .load()
        .selectExpr(f"concat('k', cast((value * 7919) % {KEYS} as string)) as k", "value % 97 as v")
    )
    query = (
        source.groupBy("k")
        .applyInPandasWithState(
            count_sum,
            "k string, count long",
            "count long, total long",
            "update",
            GroupStateTimeout.NoTimeout,
        )
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", os.path.join(tmp, "vanilla-ckpt"))
        .start()
    )
    rates: list[float] = []
    seen: set[int] = set()
    try:
        while len(rates) < runs:
            time.sleep(0.5)
            for progress in query.recentProgress:
                bid = progress["batchId"] if isinstance(progress, dict) else progress.batchId
                data = progress if isinstance(progress, dict) else progress.jsonValue
                if callable(data):
                    data = data()
                if bid in seen or bid == 0:
                    seen.add(bid)
                    continue
                seen.add(bid)
                rows = int(data["numInputRows"])
                ms = float(data["durationMs"]["triggerExecution"])
                if rows:
                    rates.append(rows / (ms / 1000.0))
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
    finally:
        query.stop()
    return rates[:runs]


def bench_pure_python(records: int, runs: int) -> list[float]:
    """records/s of a plain Python loop: Arrow -> Python, decode, per-key dict upsert."""
    batch = partition_batch(0, 0, records)
    codec = BenchCodec()
    rates = []
    for _ in range(runs):
        state: dict[str, list[int]] = {}
        started = time.perf_counter()
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        for k, v in zip(keys, values, strict=True):
            key, x = codec.decode(v, k)
            acc = state.get(key)
            if acc is None:
                acc = state[key] = [0, 0]
            acc[0] += 1
            acc[1] += x
        rates.append(records / (time.perf_counter() - started))
    return rates


# -- the state store ---------------------------------------------------------------------------


def bench_state(keys: int, changed: int, runs: int, tmp: str) -> dict[str, float]:
    """Checkpoint cost of a small batch vs writing the full state; cold recovery time."""
    from inorder.records import TopicPartition
    from inorder.state.checkpoint import CheckpointStore
    from inorder.state.codec import StateCodec
    from inorder.state.entry import KeyEntry, PartitionMeta
    from inorder.state.store import PartitionStore, StateOptions

    codec = StateCodec(Acc)
    checkpoint = CheckpointStore(os.path.join(tmp, "state-ckpt"))
    tp = TopicPartition("bench", 0)
    options = StateOptions(snapshot_interval=10_000, cache_dir=os.path.join(tmp, "state-cache"))

    def run(batch_id: int, changes: dict[str, KeyEntry | None]) -> PartitionStore:
        with PartitionStore(checkpoint, tp, codec, "bench", options) as store:
            store.open(batch_id)
            store.commit(changes, PartitionMeta(batch_id, None))
        return store

    started = time.perf_counter()
    full = run(0, {f"key-{i:08d}": KeyEntry(Acc(i, i)) for i in range(keys)})
    full_seconds = time.perf_counter() - started
    full_delta = full.stats.commit_seconds
    small: list[float] = []
    for b in range(1, runs + 1):
        changes: dict[str, KeyEntry | None] = {
            f"key-{(b * 7919 + j * 104729) % keys:08d}": KeyEntry(Acc(b, j)) for j in range(changed)
        }
        store = run(b, changes)
        small.append(store.stats.commit_seconds)
    # Full state write: a snapshot of all keys (what a non-incremental store writes per batch).
    with PartitionStore(checkpoint, tp, codec, "bench", options) as store:
        store.open(runs + 1)
        started = time.perf_counter()
        store._snapshot(runs + 1, {"version": runs + 1, "epoch": "bench", "meta": {}})
        snapshot_seconds = time.perf_counter() - started
    recoveries = []
    for r in range(max(1, runs // 2)):
        cold = StateOptions(snapshot_interval=10_000, cache_dir=os.path.join(tmp, f"cold-{r}"))
        started = time.perf_counter()
        with PartitionStore(checkpoint, tp, codec, "bench", cold) as store:
            store.open(runs + 1)
            assert store.key_count() == keys
        recoveries.append(time.perf_counter() - started)
        shutil.rmtree(os.path.join(tmp, f"cold-{r}"), ignore_errors=True)
    return {
        "initial_load_seconds": full_seconds,
        "initial_commit_seconds": full_delta,
        "batch_checkpoint_seconds": statistics.median(small),
        "full_state_write_seconds": snapshot_seconds,
        "ratio": statistics.median(small) / snapshot_seconds,
        "recovery_seconds": statistics.median(recoveries),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default="200000,500000",
        help="records per batch (all topic-partitions together), comma-separated; every "
        "contender gets the same sizes",
    )
    parser.add_argument("--runs", type=int, default=3, help="timed batches per round")
    parser.add_argument(
        "--rounds", type=int, default=2, help="backend/baseline alternations per size"
    )
    parser.add_argument("--state-keys", type=int, default=1_000_000)
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument(
        "--spark-backend-records",
        type=int,
        default=250_000,
        help="records per topic-partition per batch for the Spark backend (0: skip it)",
    )
    parser.add_argument(
        "--backends-only",
        action="store_true",
        help="only the partition backend vs the Spark backend (--spark-backend-records each)",
    )
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    cloudpickle_by_value()
    tmp = tempfile.mkdtemp(prefix="inorder-bench-")
    try:
        if args.backends_only:
            return bench_backends(args.spark_backend_records, args.runs, tmp)
        sizes = [int(n) for n in args.sizes.split(",") if n.strip()]
        py = {n: statistics.median(bench_pure_python(n, args.runs)) for n in sizes}
        for n, rate in py.items():
            print(f"pure-python loop (1 process), {n:,}/batch: {rate:>12,.0f} rec/s", flush=True)
        state = bench_state(args.state_keys, 1000, args.runs, tmp)
        print(
            f"state, {args.state_keys:,} keys, 1k changed/batch: checkpoint "
            f"{state['batch_checkpoint_seconds'] * 1000:.1f} ms vs full write "
            f"{state['full_state_write_seconds'] * 1000:.0f} ms "
            f"({state['ratio']:.1%}); cold recovery {state['recovery_seconds']:.2f} s",
            flush=True,
        )
        if args.skip_spark:
            return 0
        from inorder.pipeline.spark import build_spark_session

        spark = build_spark_session("local[2]", "inorder-bench", local_dir=tmp)
        for n in sizes:
            ours: list[float] = []
            base: list[float] = []
            for r in range(args.rounds):
                ours += bench_partition_backend(
                    spark, n // PARTITIONS, args.runs, os.path.join(tmp, f"backend-{n}-{r}")
                )
                print(f"  {n:,}/batch round {r + 1}: partition backend {ours[-args.runs :]}")
                base += bench_vanilla(spark, n, args.runs, os.path.join(tmp, f"vanilla-{n}-{r}"))
                print(f"  {n:,}/batch round {r + 1}: applyInPandasWithState {base[-args.runs :]}")
            o, b = statistics.median(ours), statistics.median(base)
            print(
                f"{n:,} records/batch: partition backend {o:,.0f} rec/s, "
                f"applyInPandasWithState {b:,.0f} rec/s, pure-python {py[n]:,.0f} rec/s; "
                f"backend/baseline {o / b:.1f}x, backend/pure-python {o / py[n]:.2f}x",
                flush=True,
            )
        if args.spark_backend_records > 0:
            n = args.spark_backend_records
            same = statistics.median(
                bench_partition_backend(spark, n, args.runs, os.path.join(tmp, "same"))
            )
            print(f"partition backend, {n:,}/partition: {same:>12,.0f} rec/s", flush=True)
            keyed = statistics.median(bench_spark_backend(spark, n, args.runs, tmp))
            print(
                f"spark backend (transformWithState, 4 key groups): {keyed:>12,.0f} rec/s "
                f"({keyed / same:.2f}x the partition backend)",
                flush=True,
            )
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def bench_backends(n: int, runs: int, tmp: str) -> int:
    """The partition backend and the Spark backend on the same batches, same session."""
    from inorder.pipeline.spark import build_spark_session

    spark = build_spark_session("local[2]", "inorder-bench", local_dir=tmp)
    same = bench_partition_backend(spark, n, runs, os.path.join(tmp, "same"))
    print(f"partition backend, {n:,}/partition: {statistics.median(same):>12,.0f} rec/s {same}")
    keyed = bench_spark_backend(spark, n, runs, tmp)
    print(f"spark backend (transformWithState): {statistics.median(keyed):>12,.0f} rec/s {keyed}")
    spark.stop()
    return 0


def cloudpickle_by_value() -> None:
    """Ship this script's classes to Spark workers by value."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


if __name__ == "__main__":
    raise SystemExit(main())
