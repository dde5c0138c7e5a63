"""The Spark backend on real Spark: key groups beyond the partition count, order restored
after the shuffle, state evolution (both backends), and the pipeline setting."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.property.procs import (
    MsgCodec,
    Row,
    Tallier,
    Tally,
    as_comparable,
    record,
    register_for_spark,
)

from inorder.engine.keygroups import ROUTED_SCHEMA, group_task
from inorder.engine.memory import records_dataframe
from inorder.engine.partition import PartitionBackend
from inorder.engine.reference import ReferenceRunner
from inorder.engine.spark_backend import SparkBackend
from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.pipeline.config import validate
from inorder.processor import Context, Processor
from inorder.records import KafkaRecord, TopicPartition
from inorder.sinks.parquet import ParquetSink, committed_files
from inorder.state.store import StateOptions


class NoWatermark(Tallier):
    """Timeout rows without ``ctx.watermark`` (a key group sees a later one; engine.md)."""

    def on_timeout(self, state: Tally, key: str, ctx: Context) -> Iterable[Row]:
        yield Row(key, "timeout", state.n, state.total, None)


@pytest.fixture(autouse=True)
def _ship_test_classes() -> None:
    from pyspark import cloudpickle

    register_for_spark()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _out(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in committed_files(str(path)):
        rows.extend(pq.read_table(str(path / f.path)).to_pylist())
    return rows


def _records(n: int, keys: int, seed: int = 1) -> list[KafkaRecord]:
    rng = random.Random(seed)
    return [
        record(i * 2, f"k{rng.randrange(keys)}", v=rng.randrange(5), t=float(i)) for i in range(n)
    ]


def test_one_partition_spreads_over_key_groups_and_matches_reference(
    spark: Any, tmp_path: Path
) -> None:
    records = _records(400, keys=20)
    backend = SparkBackend(
        NoWatermark(),
        MsgCodec(),
        Integrity.strict(),
        checkpoint=str(tmp_path / "ckpt"),
        sink=ParquetSink(str(tmp_path / "out")),
        state_options=StateOptions(cache_dir=str(tmp_path / "cache")),
        key_groups=4,
        shuffle_partitions=4,
    )
    backend.checkpoint.write_json(
        {"batch_id": 0, "processing_time_us": 0}, "batches", f"{0:020d}.json"
    )
    df = records_dataframe(spark, records)
    plan = backend.plan(df, 0)
    assert "Exchange" in plan._jdf.queryExecution().executedPlan().toString()
    results = [r.asDict() for r in plan.collect()]
    groups = {r["grp"] for r in results if r["records"]}
    assert len(groups) == 4  # one Kafka partition, four groups of keys applied in parallel
    assert sum(r["records"] for r in results) == 400
    report = backend.run_batch(df, 0)  # tasks ran before: rerun rewrites the same state
    assert report.records == 400 and report.committed
    assert report.last_offsets == {"t[0]": 798}
    reference = ReferenceRunner(NoWatermark(), MsgCodec(), Integrity.strict())
    reference.run([records])
    rows = _out(tmp_path / "out")
    assert sorted(as_comparable(rows)) == sorted(as_comparable(reference.result.rows))


def test_group_task_restores_offset_order_of_shuffled_rows(tmp_path: Path) -> None:
    records = _records(60, keys=3)
    ordered = [
        (r.key, r.value, r.topic, r.partition, r.offset, r.timestamp, None, 0, None, False)
        for r in records
    ]
    marker = (None, None, "t", 0, -1, None, None, 0, None, True)

    def run(rows: list[tuple[Any, ...]], name: str) -> list[dict[str, Any]]:
        backend = SparkBackend(
            Tallier(),
            MsgCodec(),
            Integrity.strict(on_violation="dead_letter", sequence_field=None),
            checkpoint=str(tmp_path / name / "ckpt"),
            sink=ParquetSink(str(tmp_path / name / "out")),
            state_options=StateOptions(cache_dir=str(tmp_path / name / "cache")),
            key_groups=1,
        )
        backend.checkpoint.write_json(
            {"batch_id": 0, "processing_time_us": 0}, "batches", f"{0:020d}.json"
        )
        columns = list(zip(*rows, strict=True))
        batch = pa.RecordBatch.from_arrays(
            [pa.array(c, f.type) for c, f in zip(columns, ROUTED_SCHEMA, strict=True)],
            schema=ROUTED_SCHEMA,
        )
        list(group_task(backend.spec(0), iter([batch])))
        return _out_staged(tmp_path / name / "out")

    shuffled = [*ordered, marker]
    random.Random(3).shuffle(shuffled)
    assert run(shuffled, "shuffled") == run([marker, *ordered], "ordered")


def _out_staged(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in sorted(path.rglob("*.parquet")):
        rows.extend(pq.read_table(str(f)).to_pylist())
    return sorted(rows, key=lambda r: r["offset"])


# -- state evolution -------------------------------------------------------------------------


@dataclass
class Msg1:
    k: str
    v: int = 0


@dataclass
class CountV1:
    n: int = 0


@dataclass
class CountV2:
    n: int = 0
    total: int = 0
    label: str = "new"


@dataclass
class CountBad:
    n: str = ""


@dataclass
class Out1:
    k: str
    n: int
    total: int
    label: str


class Codec1:
    def decode(self, value: bytes | None, key: bytes | None) -> Msg1:
        d = json.loads(value or b"")
        return Msg1(d["k"], int(d.get("v", 0)))


class CounterV1(Processor[Msg1, CountV1, Out1]):
    def key(self, msg: Msg1) -> str:
        return msg.k

    def initial_state(self, key: str) -> CountV1:
        return CountV1()

    def process(self, state: CountV1, msg: Msg1, ctx: Context) -> Iterable[Out1]:
        state.n += 1
        yield Out1(msg.k, state.n, 0, "v1")


class CounterV2(Processor[Msg1, CountV2, Out1]):
    def key(self, msg: Msg1) -> str:
        return msg.k

    def initial_state(self, key: str) -> CountV2:
        return CountV2()

    def process(self, state: CountV2, msg: Msg1, ctx: Context) -> Iterable[Out1]:
        state.n += 1
        state.total += msg.v
        yield Out1(msg.k, state.n, state.total, state.label)


class CounterBad(Processor[Msg1, CountBad, Out1]):
    def key(self, msg: Msg1) -> str:
        return msg.k

    def initial_state(self, key: str) -> CountBad:
        return CountBad()

    def process(self, state: CountBad, msg: Msg1, ctx: Context) -> Iterable[Out1]:
        yield Out1(msg.k, 0, 0, state.n)


def _msgs(start: int, n: int) -> list[KafkaRecord]:
    return [
        KafkaRecord("t", 0, i, b"x", json.dumps({"k": f"k{i % 2}", "v": i}).encode())
        for i in range(start, start + n)
    ]


@pytest.mark.parametrize("backend_class", [PartitionBackend, SparkBackend])
def test_state_evolution_migrates_added_fields_and_rejects_incompatible_types(
    spark: Any, tmp_path: Path, backend_class: type[PartitionBackend]
) -> None:
    def make(processor: Processor[Any, Any, Any]) -> PartitionBackend:
        return backend_class(
            processor,
            Codec1(),
            Integrity.strict(),
            checkpoint=str(tmp_path / "ckpt"),
            sink=ParquetSink(str(tmp_path / "out")),
            state_options=StateOptions(cache_dir=str(tmp_path / "cache")),
        )

    tps = [TopicPartition("t", 0)]
    make(CounterV1()).run_batch(records_dataframe(spark, _msgs(0, 4), tps), 0)
    with pytest.raises(ConfigError) as info:
        make(CounterBad()).check()
    message = str(info.value)
    assert "n" in message and "int" in message and "str" in message, message
    make(CounterV2()).run_batch(records_dataframe(spark, _msgs(4, 2), tps), 1)
    rows = [r for r in _out(tmp_path / "out") if r["batch_id"] == 1]
    # old counts carried over (2 each), new fields start at their defaults
    assert sorted((r["k"], r["n"], r["total"], r["label"]) for r in rows) == [
        ("k0", 3, 4, "new"),
        ("k1", 3, 5, "new"),
    ]


def test_pipeline_setting_accepts_spark_backend() -> None:
    base = {
        "pipeline": {"backend": "spark"},
        "source": {"topics": ["t"]},
        "processor": {"type": "sessions"},
        "sink": {"path": "out"},
    }
    assert validate(base)["pipeline"]["backend"] == "spark"
    with pytest.raises(ConfigError, match="'partition' or 'spark'"):
        validate({**base, "pipeline": {"backend": "flink"}})
