"""Raw archive, tiered replay past Kafka's retention, initial state and versioned jobs.

Real broker (noida-db or external), real Spark; reference outputs come from runs over the
full topic before its oldest records were deleted.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tests.integration import archive_support as job

from inorder.archive import InitialState, load_coverage
from inorder.archive.job_versions import compare_outputs, switched_rows
from inorder.archive.tiered_source import tiered_options_of
from inorder.codecs.json import JsonCodec
from inorder.kafka.api import KafkaSource
from inorder.kafka.options import parse_options
from inorder.ops.kafka_reads import read_chunks, watermarks
from inorder.pipeline.archiver import Archive
from inorder.pipeline.pipeline import Pipeline
from inorder.processor import Processor
from inorder.records import TopicPartition
from inorder.sinks.parquet import ParquetSink, read_committed

ROOT = Path(__file__).resolve().parents[2]
KEY_COLS = ["topic", "partition", "offset", "k", "n", "total"]


@pytest.fixture(autouse=True, scope="module")
def _ship_processors() -> None:
    job.register_for_spark()


def _delete_records(bootstrap: str, topic: str, before: dict[int, int]) -> None:
    from confluent_kafka import TopicPartition as CTP
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([CTP(topic, p, o) for p, o in before.items()])
    for f in futures.values():
        f.result(timeout=15)


def _counter_run(
    bootstrap: str,
    topic: str,
    work: Path,
    run: str,
    *,
    max_offsets: int,
    archive: str | None = None,
) -> Any:
    """The v1 counter over ``topic`` (through ``archive`` when given) until it is read.

    Output in ``work/out-<run>``, checkpoint in ``work/ckpt-<run>``; returns the summary.
    """
    out, checkpoint = str(work / f"out-{run}"), str(work / f"ckpt-{run}")
    return job.run_pipeline(
        bootstrap, topic, archive, out, checkpoint, "available-now", max_offsets
    )


def _kafka_records(bootstrap: str, topic: str, partitions: int) -> dict[TopicPartition, list[Any]]:
    options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    marks = watermarks(options, tps)
    return {
        tp: [
            r[:3]
            for chunk in read_chunks(options, tp, marks[tp].low, marks[tp].high)
            for r in chunk
        ]
        for tp in tps
    }


def _rows(path: Path) -> list[tuple[Any, ...]]:
    table = read_committed(str(path))
    return sorted(tuple(r[c] for c in KEY_COLS) for r in table.to_pylist())


def test_replay_past_retention_equals_full_topic_run(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    bootstrap = kafka.bootstrap_servers
    topic = kafka.new_topic(partitions=2)
    job.produce(bootstrap, topic, 600, partitions=2)
    reports: list[Any] = []
    summary = Archive(
        source=KafkaSource(bootstrap, topics=[topic], max_offsets_per_trigger=300),
        path=str(tmp_path / "archive"),
        checkpoint=str(tmp_path / "archive-ckpt"),
        trigger="available-now",
        on_batch=reports.append,
    ).run()
    original = _kafka_records(bootstrap, topic, 2)
    assert summary.records == sum(len(v) for v in original.values()) == 600
    assert summary.batches >= 3

    # Exactly the broker's records, each once, and the coverage ends where Kafka ended.
    archived = read_committed(str(tmp_path / "archive"))
    keys = list(
        zip(
            archived.column("partition").to_pylist(),
            archived.column("offset").to_pylist(),
            strict=True,
        )
    )
    assert len(keys) == len(set(keys)) == 600
    coverage = load_coverage(str(tmp_path / "archive"))
    options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    marks = watermarks(options, [TopicPartition(topic, p) for p in range(2)])
    for tp, wm in marks.items():
        cov = coverage.of(tp)
        assert cov is not None and cov.start == 0 and cov.end == wm.high  # markers included
    assert set(archived.column("date").to_pylist()) == {
        v.date() for v in archived.column("timestamp").to_pylist()
    }

    # More records after the archive's end: the replay has to continue from Kafka.
    job.produce(bootstrap, topic, 200, partitions=2, first=600)
    full = _counter_run(bootstrap, topic, tmp_path, "full", max_offsets=500)
    assert full.records == 800
    ends = {tp.partition: coverage.of(tp).end for tp in marks}  # type: ignore[union-attr]
    _delete_records(bootstrap, topic, {0: ends[0], 1: ends[1] // 2})
    after = watermarks(options, list(marks))
    assert after[TopicPartition(topic, 0)].low == ends[0] > 0

    # Kafka no longer holds partition 0's archived records; reads through the archive do ...
    tiered_options = tiered_options_of(options, str(tmp_path / "archive"))
    tp0 = TopicPartition(topic, 0)
    tiered = [
        r[:3] for chunk in read_chunks(tiered_options, tp0, 0, after[tp0].high) for r in chunk
    ]
    assert tiered == original[tp0] + [
        r[:3] for chunk in read_chunks(options, tp0, ends[0], after[tp0].high) for r in chunk
    ]

    # ... the tiered source does, and gives exactly the full-topic run's output.
    replay = _counter_run(
        bootstrap, topic, tmp_path, "tiered", max_offsets=500, archive=str(tmp_path / "archive")
    )
    assert replay.records == 800
    expected = _rows(tmp_path / "out-full")
    got = _rows(tmp_path / "out-tiered")
    assert len(got) == len(set(got))
    assert got == expected


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.archive_support", *args],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _commits(checkpoint: Path) -> int:
    """Batches Spark's commits log under ``checkpoint`` holds (its plain numbered files)."""
    return sum(1 for f in checkpoint.glob("**/commits/*") if f.name.isdigit())


def _kill_runs(args: list[str], kills: int, rng: random.Random) -> None:
    # Each run is killed a seeded moment after its next committed batch: placed by the
    # event, so it lands mid-stream however long Spark's start-up takes on this machine.
    checkpoint = Path(args[args.index("--checkpoint") + 1])
    for _ in range(kills):
        seen = _commits(checkpoint)
        proc = _spawn([*args, "--trigger", "0.5 seconds"])
        deadline = time.monotonic() + 300
        while _commits(checkpoint) <= seen:
            assert proc.poll() is None, f"the run exited ({proc.returncode}) before a commit"
            assert time.monotonic() < deadline, "no batch committed within 300 s"
            time.sleep(0.2)
        time.sleep(rng.uniform(0, 2))
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
        proc.wait()
    done = _spawn([*args, "--trigger", "available-now"])
    _, err = done.communicate(timeout=300)
    assert done.returncode == 0, err.decode()[-2000:]


@pytest.mark.slow
def test_seam_exact_under_kill_9(kafka: Any, spark: Any, tmp_path: Path) -> None:
    bootstrap = kafka.bootstrap_servers
    topic = kafka.new_topic(partitions=2)
    job.produce(bootstrap, topic, 1200, partitions=2)
    rng = random.Random(7)
    archive = str(tmp_path / "archive")
    common = ["--bootstrap", bootstrap, "--topic", topic, "--archive", archive]
    # One kill of the archiver: its restart resumes beside the killed attempt's residue.
    _kill_runs(["archive", *common, "--checkpoint", str(tmp_path / "archive-ckpt")], 1, rng)
    original = _kafka_records(bootstrap, topic, 2)
    archived = read_committed(archive)
    keys = Counter(
        zip(
            archived.column("partition").to_pylist(),
            archived.column("offset").to_pylist(),
            strict=True,
        )
    )
    assert max(keys.values()) == 1, "an archived record is duplicated"
    assert set(keys) == {(tp.partition, r[0]) for tp, rs in original.items() for r in rs}

    job.produce(bootstrap, topic, 300, partitions=2, first=1200)
    # The reference: per-partition state makes its output independent of the batch size.
    _counter_run(bootstrap, topic, tmp_path, "full", max_offsets=500)
    coverage = load_coverage(archive)
    ends = {p: coverage.of(TopicPartition(topic, p)).end for p in range(2)}  # type: ignore[union-attr]
    _delete_records(bootstrap, topic, {0: ends[0] - 100, 1: ends[1]})
    _kill_runs(
        [
            "pipeline",
            *common,
            "--out",
            str(tmp_path / "out-tiered"),
            "--checkpoint",
            str(tmp_path / "ckpt-tiered"),
            "--max-offsets",
            "150",
        ],
        2,
        rng,
    )
    got = _rows(tmp_path / "out-tiered")
    assert len(got) == len(set(got)), "duplicate output rows"
    assert got == _rows(tmp_path / "out-full")


def _counter_pipeline(
    processor: Processor[job.Msg, Any, Any],
    bootstrap: str,
    topic: str,
    work: Path,
    suffix: str = "",
    *,
    max_offsets: int | None = None,
    version: str | None = None,
    initial_state: InitialState | None = None,
) -> Pipeline[Any, Any, Any]:
    """``processor`` (a counter of ``archive_support``) over ``topic`` until it is read.

    Output in ``work/out<suffix>``, checkpoint in ``work/ckpt<suffix>``.
    """
    return Pipeline(
        source=KafkaSource(bootstrap, topics=[topic], max_offsets_per_trigger=max_offsets),
        processor=processor,
        codec=JsonCodec(job.Msg),
        sink=ParquetSink(str(work / f"out{suffix}")),
        checkpoint=str(work / f"ckpt{suffix}"),
        trigger="available-now",
        progress="quiet",
        job_version=version,
        initial_state=initial_state,
    )


def test_v1_to_v2_upgrade_side_by_side(kafka: Any, spark: Any, tmp_path: Path) -> None:
    bootstrap = kafka.bootstrap_servers
    topic = kafka.new_topic(partitions=2)
    job.produce(bootstrap, topic, 400, partitions=2)

    def v1() -> Pipeline[Any, Any, Any]:
        return _counter_pipeline(
            job.CounterV1(), bootstrap, topic, tmp_path, "-v1", max_offsets=150, version="1"
        )

    v1().run()
    initial = InitialState.from_checkpoint(str(tmp_path / "ckpt-v1"))
    switch = {
        TopicPartition(t, int(p)): o
        for t, parts in initial.offsets.items()
        for p, o in parts.items()
    }
    assert sum(switch.values()) > 0
    job.produce(bootstrap, topic, 300, partitions=2, first=400)

    # v2 starts from v1's checkpointed state (its new field takes the default) at v1's offsets.
    v2 = _counter_pipeline(
        job.CounterV2(),
        bootstrap,
        topic,
        tmp_path,
        "-v2",
        max_offsets=150,
        version="2",
        initial_state=initial,
    )
    summary = v2.run()
    assert summary.records == 300  # only the records after v1's state
    v1().run()  # v1 keeps running next to v2

    old = read_committed(str(tmp_path / "out-v1"))
    new = read_committed(str(tmp_path / "out-v2"))
    assert set(old.column("job_version").to_pylist()) == {"1"}
    assert set(new.column("job_version").to_pylist()) == {"2"}
    assert new.schema.names[-2:] == ["job_version", "batch_id"]
    assert "max_v" in new.schema.names
    assert pc.min(new.column("max_v")).as_py() >= 0

    diff = compare_outputs(old, new, start=switch)
    assert diff.columns == ["topic", "partition", "offset", "k", "n", "total"]
    assert diff.rows_new == 300 and diff.equal, diff.samples

    combined = switched_rows(old, new, switch, KEY_COLS)
    keys = list(
        zip(
            combined.column("partition").to_pylist(),
            combined.column("offset").to_pylist(),
            strict=True,
        )
    )
    assert len(keys) == len(set(keys)) == 700  # no duplicate, no missing
    assert combined.equals(
        old.select(KEY_COLS)
        .take(
            pc.sort_indices(
                old.select(KEY_COLS),
                sort_keys=[
                    ("topic", "ascending"),
                    ("partition", "ascending"),
                    ("offset", "ascending"),
                ],
            )
        )
        .cast(combined.schema)
    )

    # A second start of v2 does not seed again (its checkpoint has state of its own).
    job.produce(bootstrap, topic, 50, partitions=2, first=700)
    again = dataclasses.replace(v2)
    assert again.run().records == 50


def test_initial_state_from_table(kafka: Any, spark: Any, tmp_path: Path) -> None:
    bootstrap = kafka.bootstrap_servers
    topic = kafka.new_topic(partitions=1)
    job.produce(bootstrap, topic, 120, partitions=1)
    seeded = pa.table(
        {
            "topic": [topic, topic],
            "partition": [0, 0],
            "key": ["k0", "k1"],
            "n": [1000, 2000],
            "total": [5, 6],
        }
    )
    initial = InitialState(
        offsets={topic: {0: 60}},
        table=seeded,
        to_state=lambda key, rows: job.Count(rows[0]["n"], rows[0]["total"]),
    )
    pipeline = _counter_pipeline(job.CounterV1(), bootstrap, topic, tmp_path, initial_state=initial)
    pipeline.run()
    out = read_committed(str(tmp_path / "out")).to_pylist()
    assert min(r["offset"] for r in out) >= 60
    first_k0 = min((r for r in out if r["k"] == "k0"), key=lambda r: r["offset"])
    assert first_k0["n"] == 1001
    first_k2 = min((r for r in out if r["k"] == "k2"), key=lambda r: r["offset"])
    assert first_k2["n"] == 1


def test_versioned_sink_adds_column_before_batch_id(tmp_path: Path) -> None:
    from inorder.sinks.versioned import VersionedSink

    schema = pa.schema([("topic", pa.string()), ("offset", pa.int64()), ("batch_id", pa.int64())])
    sink = VersionedSink(ParquetSink(str(tmp_path / "out")), "7")
    sink.bind("owner-1")
    sink.check(schema)
    writer = sink.open_writer(schema, 0, "t-0")
    writer.write(pa.RecordBatch.from_pylist([{"topic": "t", "offset": 1, "batch_id": 0}], schema))
    assert sink.commit(0, writer.close())
    assert not sink.commit(0, [])  # idempotent: the inner sink's protocol
    out = read_committed(str(tmp_path / "out"))
    assert out.schema.names == ["topic", "offset", "job_version", "batch_id"]
    assert out.column("job_version").to_pylist() == ["7"]
