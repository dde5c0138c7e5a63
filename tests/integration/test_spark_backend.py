"""The Spark backend on real Spark (transformWithState in a streaming query): key groups
beyond the partition count, a crash between tasks and commit, order restored inside the
group function, state evolution (both backends), the pipeline setting, and a session-table
pipeline against the broker stopped and restarted (exactly once)."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from inorder.testing.memory import records_dataframe
from inorder.testing.replay import ReplayRun


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


def _backend(tmp_path: Path, processor: Processor[Any, Any, Any], **kw: Any) -> SparkBackend:
    return SparkBackend(
        processor,
        kw.pop("codec", MsgCodec()),
        kw.pop("integrity", Integrity.strict()),
        checkpoint=str(tmp_path / "ckpt"),
        sink=ParquetSink(str(tmp_path / "out")),
        **kw,
    )


def test_one_partition_spreads_over_key_groups_and_matches_reference(
    spark: Any, tmp_path: Path
) -> None:
    records = _records(400, keys=20)
    backend = _backend(tmp_path, NoWatermark(), key_groups=4, shuffle_partitions=4)
    run = ReplayRun(spark, backend, tmp_path / "run", [TopicPartition("t", 0)])
    try:
        run.crash_batch = 0  # the batch's tasks run, the query fails before the commit
        report = run.step(records)  # restarted: Spark re-runs batch 0 from its state at -1
        assert report.records == 400 and report.committed
        assert report.last_offsets == {"t[0]": 798}
        assert report.state_keys == 20
        again = run.step([])  # a batch with no records still runs every group
        assert again.records == 0 and again.state_keys == 20
    finally:
        run.stop()
    reference = ReferenceRunner(NoWatermark(), MsgCodec(), Integrity.strict())
    reference.run([records])
    rows = _out(tmp_path / "out")
    assert sorted(as_comparable(rows)) == sorted(as_comparable(reference.result.rows))
    # One Kafka partition, four key groups, each with its own keys in Spark's state store.
    state = (
        spark.read.format("statestore")
        .option("path", str(tmp_path / "run" / "spark-checkpoint"))
        .option("stateVarName", "entries")
        .load()
        .collect()
    )
    groups = {r["key"]["grp"] for r in state}
    assert groups == {0, 1, 2, 3}
    assert {r["user_map_key"]["k"] for r in state} == {f"k{i}" for i in range(20)}


def test_spark_backend_needs_a_streaming_query(spark: Any, tmp_path: Path) -> None:
    backend = _backend(tmp_path, Tallier())
    with pytest.raises(ConfigError, match="streaming"):
        backend.prepare_stream(records_dataframe(spark, _records(3, keys=1)))
    with pytest.raises(ConfigError, match="prepare_stream"):
        backend.run_batch(records_dataframe(spark, _records(3, keys=1)), 0)


def test_rows_are_checked_and_stably_sorted_by_offset() -> None:
    from pyspark.sql import Row as SparkRow

    from inorder.engine.spark_groups import _sorted_by_offset

    rows = [SparkRow(offset=o, tag=i) for i, o in enumerate([5, 1, 3, 1, 9, 3])]
    ordered = [SparkRow(offset=o, tag=i) for i, o in enumerate([1, 2, 3])]
    assert _sorted_by_offset(ordered) is ordered  # already in order: no sort
    assert [(r.offset, r.tag) for r in _sorted_by_offset(rows)] == [
        (1, 1),
        (1, 3),
        (3, 2),
        (3, 5),
        (5, 0),
        (9, 4),
    ]


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

    def run_batch(backend: PartitionBackend, records: list[KafkaRecord], batch_id: int) -> None:
        if isinstance(backend, SparkBackend):
            stream = ReplayRun(spark, backend, tmp_path / "run", tps)
            try:
                stream.step(records)
            finally:
                stream.stop()
        else:
            backend.run_batch(records_dataframe(spark, records, tps), batch_id)

    run_batch(make(CounterV1()), _msgs(0, 4), 0)
    with pytest.raises(ConfigError) as info:
        make(CounterBad()).check()
    message = str(info.value)
    assert "n" in message and "int" in message and "str" in message, message
    run_batch(make(CounterV2()), _msgs(4, 2), 1)
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


# -- end to end: a session-table pipeline on the spark backend against the broker -------------


@pytest.mark.slow
def test_session_pipeline_on_spark_backend_stops_and_resumes_exactly_once(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    from tests.integration.test_repair import check_truth, run, session_config, simulation

    from inorder.dev.simulator import simulate
    from inorder.sessions.rebuild import read_changes

    prefix = f"tws-{random.randrange(10**9)}-"
    sim = simulate(simulation(prefix, seed=11, faulty=0.0), kafka.bootstrap_servers)
    output = tmp_path / "output"
    config = session_config(kafka.bootstrap_servers, prefix, tmp_path, {"path": str(output)})
    config["pipeline"]["backend"] = "spark"
    run(config, batches=2)  # stopped between batches
    first = read_changes(str(output)).num_rows
    assert first > 0
    run(config)  # resumes from Spark's checkpoint and state store
    changes = read_changes(str(output))
    assert changes.num_rows > first
    problems = check_truth(changes, sim.ground_truth)
    assert not problems, "\n".join(problems[:20])
