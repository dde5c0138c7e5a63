"""The partition backend on real Spark: output, state and commits per micro-batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from tests.property.procs import (
    HeaderNote,
    MsgCodec,
    Tallier,
    as_comparable,
    record,
    register_for_spark,
)

from inorder.engine.partition import PartitionBackend
from inorder.engine.reference import ReferenceRunner
from inorder.errors import ConfigError, IntegrityError
from inorder.integrity import Integrity
from inorder.records import KafkaRecord, TopicPartition
from inorder.sinks.parquet import ParquetSink, committed_files, read_committed
from inorder.state.store import StateOptions
from inorder.testing.memory import records_dataframe


def read_output(path: Path) -> list[dict[str, Any]]:
    """Committed rows, file by file, in file order."""
    rows: list[dict[str, Any]] = []
    for f in committed_files(str(path)):
        rows.extend(pq.read_table(str(path / f.path)).to_pylist())
    return rows


def make_backend(
    tmp: Path, integrity: Integrity | None = None, state_options: StateOptions | None = None
) -> PartitionBackend:
    register_for_spark()
    return PartitionBackend(
        Tallier(),
        MsgCodec(),
        integrity or Integrity.strict(),
        checkpoint=str(tmp / "ckpt"),
        sink=ParquetSink(str(tmp / "out")),
        state_options=state_options,
    )


def test_three_batches_match_reference(spark: Any, tmp_path: Path) -> None:
    batches = [
        [record(0, "a", v=1, t=0), record(1, "b", v=2, t=1), record(0, "c", v=5, partition=1)],
        [record(2, "a", v=3, t=5), record(5, "a", op="pt", v=0, t=6)],
        [record(6, "b", v=4, t=30), record(1, "c", v=1, t=40, partition=1)],
    ]
    backend = make_backend(tmp_path)
    backend.check()
    reports = [
        backend.run_batch(records_dataframe(spark, b, _tps(batches)), i)
        for i, b in enumerate(batches)
    ]
    assert [r.records for r in reports] == [3, 2, 2]
    ref = ReferenceRunner(Tallier(), MsgCodec(), Integrity.strict())
    for i, b in enumerate(batches):
        ref.run_batch(b, i, _time(backend, i), _tps(batches))
    got = read_output(tmp_path / "out")
    assert as_comparable(got) == as_comparable(ref.result.rows)
    assert any(r["kind"] == "timeout" for r in got)
    assert reports[-1].last_offsets == {"t[0]": 6, "t[1]": 1}


def test_rerun_of_a_committed_batch_changes_nothing(spark: Any, tmp_path: Path) -> None:
    # A crash after the sink commit but before Spark's commit log: Spark re-runs the batch.
    backend = make_backend(tmp_path)
    records = [record(0, "a", v=1), record(1, "a", v=2)]
    first = backend.run_batch(records_dataframe(spark, records), 0)
    again = backend.run_batch(records_dataframe(spark, records), 0)
    assert first.committed and not again.committed
    assert [r["n"] for r in read_output(tmp_path / "out")] == [1, 2]
    nxt = backend.run_batch(records_dataframe(spark, [record(2, "a", v=3)]), 1)
    assert nxt.records == 1
    assert [r["n"] for r in read_output(tmp_path / "out")] == [1, 2, 3]


def test_plan_has_no_exchange(spark: Any, tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    df = records_dataframe(spark, [record(0, "a"), record(0, "b", partition=1)])
    plan = backend.plan(df, 0)._jdf.queryExecution().executedPlan().toString()
    assert "Exchange" not in plan
    assert "MapInArrow" in plan or "PythonMapInArrow" in plan


def test_partitions_are_coalesced_into_one_task_per_core(spark: Any, tmp_path: Path) -> None:
    batches = [
        [record(o, "abc"[o % 3], v=o, t=float(o), partition=p) for p in range(6) for o in range(5)],
        [
            record(o, "abc"[o % 2], v=o, t=float(o), partition=p)
            for p in range(6)
            for o in range(5, 9)
        ],
    ]
    tps = _tps(batches)
    backend = make_backend(tmp_path)
    df = records_dataframe(spark, batches[0], tps)
    cores = spark.sparkContext.defaultParallelism
    assert backend.plan(df, 0).rdd.getNumPartitions() == min(cores, 6) < 6
    reports = [
        backend.run_batch(records_dataframe(spark, b, tps), i) for i, b in enumerate(batches)
    ]
    assert [len(r.partitions) for r in reports] == [6, 6]
    ref = ReferenceRunner(Tallier(), MsgCodec(), Integrity.strict())
    for i, b in enumerate(batches):
        ref.run_batch(b, i, _time(backend, i), tps)
    assert as_comparable(read_output(tmp_path / "out")) == as_comparable(ref.result.rows)
    one_per_partition = make_backend(tmp_path / "uncoalesced")
    one_per_partition.max_tasks = 0
    assert one_per_partition.plan(df, 0).rdd.getNumPartitions() == 6


def test_a_task_writes_one_file_per_topic_for_all_its_partitions(
    spark: Any, tmp_path: Path
) -> None:
    from inorder.ops.verify import verify

    batches = [
        [
            record(o, "ab"[o % 2], v=o, t=float(o), topic=topic, partition=p)
            for topic in ("s1", "s2")
            for p in range(4)
            for o in range(first, first + 3)
        ]
        for first in (0, 3)
    ]
    tps = _tps(batches)
    register_for_spark()
    sink = ParquetSink(str(tmp_path / "out"), partition_by=["topic"])
    backend = PartitionBackend(
        Tallier(), MsgCodec(), Integrity.strict(), checkpoint=str(tmp_path / "ckpt"), sink=sink
    )
    backend.max_tasks = 1  # one task applies all eight topic-partitions
    reports = [
        backend.run_batch(records_dataframe(spark, b, tps), i) for i, b in enumerate(batches)
    ]
    assert [r.output_files for r in reports] == [2, 2]
    files = committed_files(str(tmp_path / "out"))
    assert sorted((f.path.split("/")[0], f.path.rsplit("-", 2)[1]) for f in files) == [
        ("topic=s1", "0000000000"),
        ("topic=s1", "0000000001"),
        ("topic=s2", "0000000000"),
        ("topic=s2", "0000000001"),
    ]
    # Each file holds the rows of its topic's four partitions, every row with its origin.
    for f in files:
        table = pq.read_table(str(tmp_path / "out" / f.path))
        assert sorted(set(table.column("partition").to_pylist())) == [0, 1, 2, 3]
        assert table.num_rows == f.rows
    ref = ReferenceRunner(Tallier(), MsgCodec(), Integrity.strict())
    for i, b in enumerate(batches):
        ref.run_batch(b, i, _time(backend, i), tps)
    got = read_committed(str(tmp_path / "out")).to_pylist()
    assert as_comparable(got) == as_comparable(ref.result.rows)
    assert len(got) == len(ref.result.rows) > 0
    report = verify(sink, None, digests=True)
    assert report.ok, "\n".join(report.lines())
    assert report.partitions == {f"{tp.topic}/{tp.partition}": [0, 6] for tp in tps}
    assert report.digests_checked == report.files == 4
    assert not list((tmp_path / "out" / "_inorder" / "staging").iterdir())


def test_python_workers_are_forked_from_the_preloading_daemon(spark: Any) -> None:
    import sys

    def probe(_: int) -> tuple[str | None, bool]:
        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        # Nothing in this function imports them: they were loaded before the fork.
        preloaded = "pyarrow" in sys.modules and "inorder.engine.task" in sys.modules
        return (getattr(spec, "name", None), preloaded)

    got = spark.sparkContext.parallelize([0, 1], 2).map(probe).collect()
    assert got == [("inorder.spark.daemon", True)] * 2


def test_a_local_jvm_runs_with_the_quick_start_options(spark: Any) -> None:
    from inorder.pipeline.spark import LOCAL_JVM_OPTIONS

    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    for option in LOCAL_JVM_OPTIONS.split():
        assert option in args, f"{option} not among the JVM's arguments {args}"


def test_fail_policy_raises_before_commit(spark: Any, tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    records = [record(0, "a", v=1), record(1, "a", v=9, op="bad"), record(2, "a")]
    with pytest.raises(IntegrityError, match=r"bad_value at t\[0\] offset 1 \(key 'a'\)"):
        backend.run_batch(records_dataframe(spark, records), 0)
    assert not backend.sink.is_committed(0)
    assert read_output(tmp_path / "out") == []


def test_undecodable_dead_letter_and_counters(spark: Any, tmp_path: Path) -> None:
    backend = make_backend(tmp_path, Integrity.strict(on_violation="dead_letter"))
    records = [record(0, "a", v=1), record(1, "a", raw=b"{nope"), record(2, "a", v=2)]
    report = backend.run_batch(records_dataframe(spark, records), 0)
    assert report.violations_by_rule == {"undecodable": 1}
    assert report.violations_by_partition == {"t[0]": {"undecodable": 1}}
    assert report.dead_letters == 1
    assert [r["n"] for r in read_output(tmp_path / "out")] == [1, 2]


def test_incompatible_state_type_fails_check(tmp_path: Path) -> None:
    from tests.property.procs import Msg, Row

    make_backend(tmp_path).check()

    from dataclasses import dataclass

    @dataclass
    class Other:
        n: str = ""

    class Changed(Tallier):
        state_type = Other

    changed = PartitionBackend(
        Changed(),
        MsgCodec(),
        Integrity.strict(),
        checkpoint=str(tmp_path / "ckpt"),
        sink=ParquetSink(str(tmp_path / "out")),
    )
    _ = (Msg, Row)
    with pytest.raises(ConfigError):
        changed.check()


def test_headers_reach_the_processor(spark: Any, tmp_path: Path) -> None:
    register_for_spark()
    records = [
        record(0, "a", headers=(("trace", b"\x00\xffid"), ("empty", None))),
        record(1, "a"),
        record(2, "b", headers=(("x", b"y"),)),
    ]
    backend = PartitionBackend(
        HeaderNote(),
        MsgCodec(),
        Integrity.strict(),
        checkpoint=str(tmp_path / "ckpt"),
        sink=ParquetSink(str(tmp_path / "out")),
    )
    backend.run_batch(records_dataframe(spark, records), 0)
    notes = [r["note"] for r in read_output(tmp_path / "out")]
    assert notes == [
        repr([("trace", b"\x00\xffid"), ("empty", None)]),
        repr([]),
        repr([("x", b"y")]),
    ]


def test_a_batch_that_wrote_a_snapshot_and_did_not_commit_reruns_on_the_whole_state(
    spark: Any, tmp_path: Path
) -> None:
    # Batch 3's tasks write a partition's second snapshot and clean up old versions; then
    # the batch does not commit (the sink, the driver). Its re-run must see every key.
    options = StateOptions(snapshot_interval=2, retain_versions=0, cache_dir=str(tmp_path / "c"))
    backend = make_backend(tmp_path, state_options=options)
    batches = [[record(0, "a", v=1, t=0)]]
    batches += [[record(b, "b", v=b, t=float(b))] for b in range(1, 4)]
    batches += [[record(4, "a", v=2, t=4), record(5, "b", v=5, t=5)]]
    tps = _tps(batches)
    ref = ReferenceRunner(Tallier(), MsgCodec(), Integrity.strict())
    for i, b in enumerate(batches):
        if i == 3:
            backend.run_tasks(records_dataframe(spark, b, tps), i)
            assert not backend.sink.is_committed(i)
        assert backend.run_batch(records_dataframe(spark, b, tps), i).committed
        ref.run_batch(b, i, _time(backend, i), tps)
    got = read_output(tmp_path / "out")
    assert as_comparable(got) == as_comparable(ref.result.rows)


def _tps(batches: list[list[KafkaRecord]]) -> list[TopicPartition]:
    return sorted({TopicPartition(r.topic, r.partition) for b in batches for r in b})


def _time(backend: PartitionBackend, batch_id: int) -> Any:
    from inorder.engine.context import from_micros

    return from_micros(backend.checkpoint.batch_time_us(batch_id))


CLUSTER_SCRIPT = r"""
import shutil, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from inorder.engine.context import from_micros
from inorder.testing.memory import records_dataframe
from inorder.engine.partition import PartitionBackend
from inorder.engine.reference import ReferenceRunner
from inorder.integrity import Integrity
from inorder.pipeline.spark import build_spark_session
from inorder.records import TopicPartition
from inorder.sinks.parquet import ParquetSink, committed_files
from inorder.state.store import StateOptions
import pyarrow.parquet as pq
from tests.property.procs import MsgCodec, Tallier, as_comparable, record, register_for_spark

tmp = Path(sys.argv[2])
spark = build_spark_session(
    "local-cluster[2,1,1024]", "inorder-cluster", local_dir=str(tmp / "spark")
)
register_for_spark()
tps = [TopicPartition("t", p) for p in range(4)]
cache = tmp / "cache"
backend = PartitionBackend(Tallier(), MsgCodec(), Integrity.strict(), checkpoint=str(tmp / "ckpt"),
                           sink=ParquetSink(str(tmp / "out")),
                           state_options=StateOptions(snapshot_interval=2, cache_dir=str(cache)))
ref = ReferenceRunner(Tallier(), MsgCodec(), Integrity.strict())
offset = 0
for b in range(4):
    records = [record(offset + i, "abc"[i % 3], v=i, t=float(offset + i), partition=p)
               for p in range(4) for i in range(50)]
    offset += 50
    if b == 2:
        shutil.rmtree(cache, ignore_errors=True)  # as if every task landed on a new executor
    if b == 1:
        backend.run_tasks(records_dataframe(spark, records, tps), b)  # crash before commit
    backend.run_batch(records_dataframe(spark, records, tps), b)
    ref.run_batch(records, b, from_micros(backend.checkpoint.batch_time_us(b)), tps)
rows = []
for f in committed_files(str(tmp / "out")):
    rows.extend(pq.read_table(str(tmp / "out" / f.path)).to_pylist())
assert as_comparable(rows) == as_comparable(ref.result.rows), "output differs"
print("OK", len(rows))
spark.stop()
"""


@pytest.mark.cluster
@pytest.mark.slow
def test_local_cluster_tasks_on_separate_executors(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "cluster.py"
    script.write_text(CLUSTER_SCRIPT)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(script), root, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("OK")


def test_daemon_module_default_respects_user_conf_and_interpreters(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    from inorder.pipeline.spark import daemon_module_default

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    assert daemon_module_default("local[2]", {}) == "inorder.spark.daemon"
    assert daemon_module_default("spark://127.0.0.1:7077", {}) == "inorder.spark.daemon"
    # The user's choice wins; a package shipped as py-files is not on the daemon's path.
    assert daemon_module_default("local[2]", {"spark.python.daemon.module": "x"}) is None
    assert daemon_module_default("local[2]", {"spark.submit.pyFiles": "inorder.zip"}) is None
    # Local executors running an interpreter without inorder keep PySpark's daemon.
    bare = tmp_path / "bare-python"
    bare.write_text('#!/bin/sh\nexec /usr/bin/env -i /bin/false "$@"\n')
    bare.chmod(0o755)
    assert daemon_module_default("local[2]", {"spark.pyspark.python": str(bare)}) is None
