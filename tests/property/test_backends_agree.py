"""Property: the partition backend, the Spark backend and the reference runner agree exactly.

The same random streams (offset gaps, replays of old offsets, duplicates, swapped event
times, undecodable records, late events, violations, session restarts, event- and
processing-time timeouts) go through all three under every tier and policy, with random batch
boundaries and a crash point (a batch's tasks run, nothing committed, the batch re-run: for
the Spark backend the streaming query fails after the batch's tasks and is restarted). The
Spark backend runs as a real streaming query (``transformWithState``) over a source replaying
the micro-batches; the reference runner and the partition backend get the processing time
each Spark batch used (its batch timestamp). The output rows (as a multiset: key groups
write in parallel), the violation counters per batch and partition, the dead letters and the
final state (the Spark backend's read back with Spark's state data source) must be
identical; under ``fail`` all three raise the same error.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from collections.abc import Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inorder.engine.context import from_micros
from inorder.engine.partition import PartitionBackend
from inorder.engine.reference import ReferenceRunner
from inorder.engine.spark_backend import SparkBackend
from inorder.errors import InorderError
from inorder.integrity import Integrity
from inorder.processor import Context
from inorder.records import KafkaRecord, TopicPartition
from inorder.sinks.parquet import ParquetSink, committed_files
from inorder.state.codec import StateCodec
from inorder.state.store import PartitionStore, StateOptions
from inorder.testing.memory import records_dataframe
from inorder.testing.replay import ReplayRun
from tests.property.procs import MsgCodec, Row, Tallier, Tally, record, register_for_spark

OPS = ["add"] * 6 + ["pt", "bad", "start", "end", "clear", "undecodable"]
KEYS = ["a", "b", "c", "d"]
GROUPS = 3
T = TypeVar("T")


class Tallier2(Tallier):
    """Tallier whose timeout rows do not quote ``ctx.watermark``.

    The Spark backend fires a key group's due event-time work at the group's next record (or
    the end of the batch) rather than at the other key's record that raised the watermark:
    same calls in the same order per key, but a later ``ctx.watermark`` inside them.
    """

    def on_timeout(self, state: Tally, key: str, ctx: Context) -> Iterable[Row]:
        yield Row(key, "timeout", state.n, state.total, None)


TIERS_AND_POLICIES = [
    ("strict", "fail"),
    ("strict", "dead_letter"),
    ("strict", "restart_session"),
    ("fuzzy", "fail"),
    ("fuzzy", "dead_letter"),
    ("fuzzy", "restart_session"),
    ("none", "fail"),
]


class Choose(Protocol):
    """Where a scenario's choices come from: Hypothesis (shrinkable) or a seeded Random."""

    def integer(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""
        ...

    def pick(self, options: Sequence[T]) -> T:
        """One of the options."""
        ...


class DrawChoose:
    """Choices drawn by Hypothesis."""

    def __init__(self, draw: st.DrawFn) -> None:
        self._draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(st.integers(lo, hi))

    def pick(self, options: Sequence[T]) -> T:
        return self._draw(st.sampled_from(options))


class SeededChoose:
    """Choices from a seeded Random: the same scenario every run."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, hi)

    def pick(self, options: Sequence[T]) -> T:
        return self._rng.choice(options)


def build_scenario(
    choose: Choose, tier: str | None = None, policy: str | None = None, min_records: int = 0
) -> dict[str, Any]:
    n_parts = choose.integer(1, 2)
    n_batches = choose.integer(1, 3)
    batches: list[list[KafkaRecord]] = [[] for _ in range(n_batches)]
    for p in range(n_parts):
        offset = 0
        t = 100.0
        seqs: dict[str, int] = {}
        history: list[KafkaRecord] = []
        n = choose.integer(min_records, 14)
        bounds = [0, *sorted(choose.integer(0, n) for _ in range(n_batches - 1)), n]
        for b in range(n_batches):
            for _ in range(bounds[b], bounds[b + 1]):
                if history and choose.integer(0, 9) == 0:  # a replay / duplicate
                    batches[b].append(choose.pick(history))
                    continue
                offset += choose.pick([1, 1, 1, 2, 5])  # gaps
                # event-time jumps, swaps (-3) and late events (-30)
                t += choose.pick([0.0, 1.0, 4.0, 12.0, -3.0, -30.0])
                key = choose.pick(KEYS)
                op = choose.pick(OPS)
                seq = seqs.get(key, -1) + choose.pick([1, 1, 1, 1, 2, 0])
                if op == "start":
                    seq = 0
                seqs[key] = seq
                v = choose.integer(0, 3)
                raw = b"{broken" if op == "undecodable" else None
                rec = record(offset, key, v=v, seq=seq, op=op, t=max(t, 0.0), partition=p, raw=raw)
                history.append(rec)
                batches[b].append(rec)
    tier = tier or choose.pick(["strict", "fuzzy", "none"])
    policy = policy or choose.pick(["fail", "dead_letter", "restart_session"])
    if tier == "strict":
        integrity = Integrity.strict(policy, choose.pick([None, "seq"]))
    elif tier == "fuzzy":
        lateness = timedelta(seconds=choose.pick([0, 2, 5]))
        integrity = Integrity.fuzzy(lateness, on_violation=policy)
    else:
        integrity = Integrity.none()
    return {
        "parts": n_parts,
        "batches": batches,
        "crash": choose.integer(-1, n_batches - 1),
        "integrity": integrity,
    }


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    return build_scenario(DrawChoose(draw))


def _rows(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in committed_files(str(path)):
        rows.extend(pq.read_table(str(path / f.path)).to_pylist())
    return rows


def _multiset(rows: Iterable[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted((k, repr(v)) for k, v in r.items())) for r in rows)


@pytest.mark.timeout(900)
@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenario=scenarios())
def test_backends_agree_with_reference(spark: Any, scenario: dict[str, Any]) -> None:
    _run_in_tmp(spark, scenario)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("tier", "policy"), TIERS_AND_POLICIES)
def test_each_tier_and_policy_agree(spark: Any, tier: str, policy: str) -> None:
    """Every tier x policy in every run (the random test above may miss some): a fixed
    scenario each, with enough records to hold gaps, replays, swaps and violations."""
    seed = 1000 + TIERS_AND_POLICIES.index((tier, policy))
    reference = _run_in_tmp(spark, build_scenario(SeededChoose(seed), tier, policy, min_records=10))
    events = sum(sum(b.violation_counts.values()) for b in reference.result.batches)
    replayed = sum(b.counters.get("replayed", 0) for b in reference.result.batches)
    failed = policy == "fail" and tier != "none"
    assert (events > 0 and replayed > 0) or failed, "the fixed scenario must exercise the checks"


def _run_in_tmp(spark: Any, scenario: dict[str, Any]) -> ReferenceRunner:
    register_for_spark()
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    tmp = Path(tempfile.mkdtemp(prefix="inorder-agree-"))
    try:
        return _run(spark, scenario, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _opts(tmp: Path, name: str) -> StateOptions:
    return StateOptions(snapshot_interval=2, retain_versions=1, cache_dir=str(tmp / name))


def _partition_backend(integrity: Integrity, tmp: Path) -> PartitionBackend:
    return PartitionBackend(
        Tallier2(),
        MsgCodec(),
        integrity,
        checkpoint=str(tmp / "p-ckpt"),
        sink=ParquetSink(str(tmp / "p-out")),
        dead_letter_sink=ParquetSink(str(tmp / "p-dl")),
        state_options=_opts(tmp, "p-cache"),
    )


def _spark_backend(integrity: Integrity, tmp: Path) -> SparkBackend:
    return SparkBackend(
        Tallier2(),
        MsgCodec(),
        integrity,
        checkpoint=str(tmp / "s-ckpt"),
        sink=ParquetSink(str(tmp / "s-out")),
        dead_letter_sink=ParquetSink(str(tmp / "s-dl")),
        key_groups=GROUPS,
        shuffle_partitions=2,
    )


def _check_report(name: str, report: Any, ref_batch: Any) -> None:
    assert report.committed, name
    assert report.violations_by_rule == ref_batch.violation_counts, name
    assert report.records == ref_batch.counters.get("records", 0), name
    assert report.timeouts == ref_batch.counters.get("timeouts", 0), name
    assert report.replayed == ref_batch.counters.get("replayed", 0), name
    by_partition: dict[str, dict[str, int]] = {}
    for event in ref_batch.violations:
        counts = by_partition.setdefault(f"{event.topic}[{event.partition}]", {})
        counts[event.rule] = counts.get(event.rule, 0) + 1
    assert report.violations_by_partition == by_partition, name


def _run(spark: Any, scenario: dict[str, Any], tmp: Path) -> ReferenceRunner:
    integrity: Integrity = scenario["integrity"]
    tps = [TopicPartition("t", p) for p in range(scenario["parts"])]
    partition = _partition_backend(integrity, tmp)
    sbackend = _spark_backend(integrity, tmp)
    stream = ReplayRun(spark, sbackend, tmp / "s-run", tps)
    reference = ReferenceRunner(Tallier2(), MsgCodec(), integrity)
    now_us = 0
    try:
        for batch_id, records in enumerate(scenario["batches"]):
            if batch_id == scenario["crash"]:
                stream.crash_batch = batch_id
            spark_error: str | None = None
            try:
                spark_report = stream.step(records)
                now_us = spark_report.processing_time_us
            except InorderError as exc:
                spark_error = str(exc)
                now_us += 1
            expected_error: str | None = None
            try:
                reference.run_batch(records, batch_id, from_micros(now_us), tps)
            except InorderError as exc:
                expected_error = str(exc)
            assert spark_error == expected_error, "spark"
            partition.checkpoint.write_json(
                {"batch_id": batch_id, "processing_time_us": now_us},
                "batches",
                f"{batch_id:020d}.json",
            )
            df = records_dataframe(spark, records, tps)
            if batch_id == scenario["crash"]:
                partition.run_tasks(df, batch_id)
            if expected_error is not None:
                with pytest.raises(InorderError) as info:
                    partition.run_batch(df, batch_id)
                assert str(info.value) == expected_error, "partition"
                break
            ref_batch = reference.result.batches[-1]
            _check_report("spark", spark_report, ref_batch)
            _check_report("partition", partition.run_batch(df, batch_id), ref_batch)
    finally:
        stream.stop()
    want = _multiset(reference.result.rows)
    want_dl = sorted(
        (tp.partition, d.offset, d.rule, d.key) for tp, d in reference.result.dead_letters
    )
    for prefix in ("p", "s"):
        assert _multiset(_rows(tmp / f"{prefix}-out")) == want, prefix
        got_dl = sorted(
            (d["partition"], d["offset"], d["rule"], d["state_key"])
            for d in _rows(tmp / f"{prefix}-dl")
        )
        assert got_dl == want_dl, prefix
    expected_state = reference.final_state()
    assert _partition_state(partition, tps, len(reference.result.batches), tmp) == expected_state
    if reference.result.batches:
        assert _spark_state(spark, tmp / "s-run" / "spark-checkpoint") == expected_state
    return reference


def _partition_state(
    backend: PartitionBackend, tps: list[TopicPartition], next_batch: int, tmp: Path
) -> dict[tuple[str, int, str], Any]:
    codec = StateCodec(Tally)
    got: dict[tuple[str, int, str], Any] = {}
    for tp in tps:
        with PartitionStore(
            backend.checkpoint, tp, codec, backend._epoch, StateOptions(cache_dir=str(tmp / "v"))
        ) as store:
            view, _ = store.open(next_batch)
            for key in KEYS:
                entry = view.load(key)
                if entry is not None and not entry.ignored:
                    got[(tp.topic, tp.partition, key)] = entry.state
    return got


def _spark_state(spark: Any, checkpoint: Path) -> dict[tuple[str, int, str], Any]:
    """The Spark backend's last committed state, read with Spark's state data source."""
    codec = StateCodec(Tally)
    rows = (
        spark.read.format("statestore")
        .option("path", str(checkpoint))
        .option("stateVarName", "entries")
        .load()
        .collect()
    )
    got: dict[tuple[str, int, str], Any] = {}
    for row in rows:
        key, value = row["user_map_key"]["k"], row["user_map_value"]
        if key in KEYS and not value["ignored"]:
            got[(row["key"]["topic"], int(row["key"]["partition"]), key)] = codec.decode(
                bytes(value["state"])
            )
    return got
