"""The fuzzy tier end to end: the per-minute windows example against a batch computation.

Readings reach Kafka out of order. The windows the example emits (reference runner, and the
partition backend on Spark across several micro-batches with a crash and wiped caches) must
equal a pandas group-by over the same readings, where late readings are found independently
(event time behind the running max of their partition minus the lateness) and only windows
the final watermark has passed are expected.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from inorder.codecs.json import JsonCodec
from inorder.engine.partition import PartitionBackend
from inorder.engine.reference import ReferenceRunner
from inorder.integrity import Integrity
from inorder.records import KafkaRecord, TopicPartition
from inorder.sinks.parquet import ParquetSink, committed_files
from inorder.state.store import StateOptions
from inorder.testing.memory import records_dataframe

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples import fuzzy_windows
from examples.fuzzy_windows import MinuteWindows, Reading

LATENESS = timedelta(seconds=30)
T0 = 1_731_000_000.0


def readings(seed: int, n: int = 3000, sites: int = 6, partitions: int = 2) -> list[KafkaRecord]:
    """Readings whose event times trail the Kafka timestamps by random delays (some late)."""
    rng = random.Random(seed)
    out: list[KafkaRecord] = []
    offsets = [0] * partitions
    now = T0
    for _ in range(n):
        now += rng.uniform(0, 0.5)
        site = f"s{rng.randrange(sites)}"
        p = int(site[1:]) % partitions
        delay = abs(rng.gauss(0, 8)) if rng.random() < 0.9 else rng.uniform(0, 90)
        body = {"site": site, "value": round(rng.uniform(0, 100), 3), "ts": now - delay}
        out.append(
            KafkaRecord(
                "readings-a",
                p,
                offsets[p],
                site.encode(),
                json.dumps(body).encode(),
                datetime.fromtimestamp(now, tz=UTC),
            )
        )
        offsets[p] += rng.choice([1, 1, 1, 2])  # gaps, as transaction markers leave
    return out


def expected_windows(records: list[KafkaRecord]) -> tuple[pd.DataFrame, set[tuple[int, int]]]:
    """Windows by pandas, and the (partition, offset) of late readings."""
    df = pd.DataFrame(
        [
            {"partition": r.partition, "offset": r.offset, **json.loads(r.value or b"")}
            for r in records
        ]
    ).sort_values(["partition", "offset"])
    lateness = LATENESS.total_seconds()
    df["wm"] = df.groupby("partition")["ts"].cummax() - lateness
    late = df["ts"] < df.groupby("partition")["wm"].shift(1).fillna(-1e18)
    final_wm = df.groupby("partition")["wm"].max()
    ok = df[~late].copy()
    ok["window_start"] = (ok["ts"] // 60 * 60).astype("int64")
    grouped = (
        ok.groupby(["partition", "site", "window_start"])["value"]
        .agg(["count", "mean", "min", "max"])
        .reset_index()
    )
    grouped = grouped[grouped["window_start"] + 60 <= grouped["partition"].map(final_wm)]
    late_set = {
        (int(p), int(o)) for p, o in df[late][["partition", "offset"]].itertuples(index=False)
    }
    return grouped, late_set


def as_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df["window_start"] = df["window_start"].map(lambda t: int(t.timestamp()))
    df = df.rename(columns={"low": "min", "high": "max"})
    return df[["partition", "site", "window_start", "count", "mean", "min", "max"]]


def assert_same_windows(got: pd.DataFrame, want: pd.DataFrame) -> None:
    key = ["partition", "site", "window_start"]
    got = got.sort_values(key).reset_index(drop=True)
    want = want.sort_values(key).reset_index(drop=True)
    assert len(got) == len(want) and len(got) > 30
    pd.testing.assert_frame_equal(got, want, check_dtype=False, check_exact=False, rtol=1e-9)


def split(records: list[KafkaRecord], parts: int) -> list[list[KafkaRecord]]:
    size = len(records) // parts + 1
    return [records[i : i + size] for i in range(0, len(records), size)]


def test_reference_windows_match_batch_computation() -> None:
    records = readings(seed=3)
    want, late = expected_windows(records)
    assert len(late) > 20  # the data does have late readings
    runner = ReferenceRunner(
        MinuteWindows(), JsonCodec(Reading), MinuteWindows().default_integrity()
    )
    result = runner.run(split(records, 5))
    assert_same_windows(as_frame(result.rows), want)
    got_late = {(tp.partition, d.offset) for tp, d in result.dead_letters}
    assert got_late == late
    assert {d.rule for _, d in result.dead_letters} == {"late"}
    assert sum(b.violation_counts.get("late", 0) for b in result.batches) == len(late)


def test_window_closes_before_the_next_minutes_reading() -> None:
    # Out of order inside the lateness: 61 s arrives before 59 s; the watermark passes 60 s
    # only with the reading at 100 s, which first closes minute 0, then processes 61 s.
    def rec(offset: int, ts: float) -> KafkaRecord:
        body = json.dumps({"site": "s", "value": ts, "ts": T0 // 60 * 60 + ts}).encode()
        return KafkaRecord("r", 0, offset, b"s", body, datetime.fromtimestamp(T0, tz=UTC))

    runner = ReferenceRunner(MinuteWindows(), JsonCodec(Reading), Integrity.fuzzy(LATENESS))
    result = runner.run([[rec(0, 10), rec(1, 61), rec(2, 59)], [rec(3, 100), rec(4, 5)]])
    rows = result.rows
    assert [(r["count"], r["low"], r["high"]) for r in rows] == [(2, 10.0, 59.0)]
    assert rows[0]["offset"] == 2  # the timeout row names the last reading applied
    assert [(d.offset, d.rule) for _, d in result.dead_letters] == [(4, "late")]
    assert result.batches[0].counters["records"] == 3


@pytest.mark.timeout(300)
def test_partition_backend_windows_match_batch_computation(spark: Any, tmp_path: Path) -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(fuzzy_windows)
    records = readings(seed=7, n=2000)
    want, late = expected_windows(records)
    tps = [TopicPartition("readings-a", p) for p in range(2)]
    cache = tmp_path / "cache"
    backend = PartitionBackend(
        MinuteWindows(),
        JsonCodec(Reading),
        Integrity.fuzzy(LATENESS),
        checkpoint=str(tmp_path / "ckpt"),
        sink=ParquetSink(str(tmp_path / "out")),
        dead_letter_sink=ParquetSink(str(tmp_path / "late")),
        state_options=StateOptions(snapshot_interval=2, cache_dir=str(cache)),
    )
    for batch_id, chunk in enumerate(split(records, 4)):
        df = records_dataframe(spark, chunk, tps)
        if batch_id == 1:  # crash after the tasks ran, before the commit; caches lost
            backend.run_tasks(df, batch_id)
            shutil.rmtree(cache, ignore_errors=True)
        report = backend.run_batch(df, batch_id)
        assert report.committed
    rows: list[dict[str, Any]] = []
    for f in committed_files(str(tmp_path / "out")):
        rows.extend(pq.read_table(str(tmp_path / "out" / f.path)).to_pylist())
    assert_same_windows(as_frame(rows), want)
    dead = []
    for f in committed_files(str(tmp_path / "late")):
        dead.extend(pq.read_table(str(tmp_path / "late" / f.path)).to_pylist())
    assert {(d["partition"], d["offset"]) for d in dead} == late
    assert {d["rule"] for d in dead} == {"late"}
