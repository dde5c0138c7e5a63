"""Property: the partition backend, the Spark backend and the reference runner agree exactly.

The same random streams (offset gaps, replays of old offsets, duplicates, swapped event
times, undecodable records, late events, violations, session restarts, event- and
processing-time timeouts) go through all three under every tier and policy, with random batch
boundaries and a crash point (a batch's tasks run, nothing committed, the batch re-run). The
output rows (as a multiset: the Spark backend writes key groups in parallel), the violation
counters per batch, the dead letters and the final state must be identical; under ``fail``
all three raise the same error.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inorder.engine.context import from_micros
from inorder.engine.keygroups import group_store_partition
from inorder.engine.memory import records_dataframe
from inorder.engine.partition import PartitionBackend
from inorder.engine.reference import ReferenceRunner
from inorder.engine.spark_backend import SparkBackend
from inorder.errors import InorderError
from inorder.integrity import Integrity
from inorder.processor import Context
from inorder.records import KafkaRecord, TopicPartition
from inorder.sinks.parquet import ParquetSink, committed_files
from inorder.state.store import PartitionStore, StateOptions
from inorder.statecodec import StateCodec
from tests.property.procs import MsgCodec, Row, Tallier, Tally, record, register_for_spark

OPS = ["add"] * 6 + ["pt", "bad", "start", "end", "clear", "undecodable"]
KEYS = ["a", "b", "c", "d"]
GROUPS = 3


class Tallier2(Tallier):
    """Tallier whose timeout rows do not quote ``ctx.watermark``.

    The Spark backend fires a key group's due event-time work at the group's next record (or
    the end of the batch) rather than at the other key's record that raised the watermark:
    same calls in the same order per key, but a later ``ctx.watermark`` inside them.
    """

    def on_timeout(self, state: Tally, key: str, ctx: Context) -> Iterable[Row]:
        yield Row(key, "timeout", state.n, state.total, None)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    n_parts = draw(st.integers(1, 2))
    n_batches = draw(st.integers(1, 3))
    batches: list[list[KafkaRecord]] = [[] for _ in range(n_batches)]
    for p in range(n_parts):
        offset = 0
        t = 100.0
        seqs: dict[str, int] = {}
        history: list[KafkaRecord] = []
        n = draw(st.integers(0, 14))
        cuts = sorted(
            draw(st.lists(st.integers(0, n), min_size=n_batches - 1, max_size=n_batches - 1))
        )
        bounds = [0, *cuts, n]
        for b in range(n_batches):
            for _ in range(bounds[b], bounds[b + 1]):
                if history and draw(st.integers(0, 9)) == 0:  # a replay / duplicate
                    batches[b].append(draw(st.sampled_from(history)))
                    continue
                offset += draw(st.sampled_from([1, 1, 1, 2, 5]))  # gaps
                # event-time jumps, swaps (-3) and late events (-30)
                t += draw(st.sampled_from([0.0, 1.0, 4.0, 12.0, -3.0, -30.0]))
                key = draw(st.sampled_from(KEYS))
                op = draw(st.sampled_from(OPS))
                seq = seqs.get(key, -1) + draw(st.sampled_from([1, 1, 1, 1, 2, 0]))
                if op == "start":
                    seq = 0
                seqs[key] = seq
                v = draw(st.integers(0, 3))
                raw = b"{broken" if op == "undecodable" else None
                rec = record(offset, key, v=v, seq=seq, op=op, t=max(t, 0.0), partition=p, raw=raw)
                history.append(rec)
                batches[b].append(rec)
    tier = draw(st.sampled_from(["strict", "fuzzy", "none"]))
    policy = draw(st.sampled_from(["fail", "dead_letter", "restart_session"]))
    if tier == "strict":
        integrity = Integrity.strict(policy, draw(st.sampled_from([None, "seq"])))
    elif tier == "fuzzy":
        lateness = timedelta(seconds=draw(st.sampled_from([0, 2, 5])))
        integrity = Integrity.fuzzy(lateness, on_violation=policy)
    else:
        integrity = Integrity.none()
    return {
        "parts": n_parts,
        "batches": batches,
        "crash": draw(st.integers(-1, n_batches - 1)),
        "integrity": integrity,
        "steps": draw(st.lists(st.integers(0, 3), min_size=n_batches, max_size=n_batches)),
    }


def _rows(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in committed_files(str(path)):
        rows.extend(pq.read_table(str(path / f.path)).to_pylist())
    return rows


def _multiset(rows: Iterable[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted((k, repr(v)) for k, v in r.items())) for r in rows)


@pytest.mark.timeout(900)
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenario=scenarios())
def test_backends_agree_with_reference(spark: Any, scenario: dict[str, Any]) -> None:
    register_for_spark()
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    tmp = Path(tempfile.mkdtemp(prefix="inorder-agree-"))
    try:
        _run(spark, scenario, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _backends(integrity: Integrity, tmp: Path) -> dict[str, PartitionBackend]:
    def opts(name: str) -> StateOptions:
        return StateOptions(snapshot_interval=2, retain_versions=1, cache_dir=str(tmp / name))

    return {
        "partition": PartitionBackend(
            Tallier2(),
            MsgCodec(),
            integrity,
            checkpoint=str(tmp / "p-ckpt"),
            sink=ParquetSink(str(tmp / "p-out")),
            dead_letter_sink=ParquetSink(str(tmp / "p-dl")),
            state_options=opts("p-cache"),
        ),
        "spark": SparkBackend(
            Tallier2(),
            MsgCodec(),
            integrity,
            checkpoint=str(tmp / "s-ckpt"),
            sink=ParquetSink(str(tmp / "s-out")),
            dead_letter_sink=ParquetSink(str(tmp / "s-dl")),
            state_options=opts("s-cache"),
            key_groups=GROUPS,
            shuffle_partitions=2,
        ),
    }


def _run(spark: Any, scenario: dict[str, Any], tmp: Path) -> None:
    integrity: Integrity = scenario["integrity"]
    tps = [TopicPartition("t", p) for p in range(scenario["parts"])]
    backends = _backends(integrity, tmp)
    reference = ReferenceRunner(Tallier2(), MsgCodec(), integrity)
    now_us = 1_000_000_000
    for batch_id, records in enumerate(scenario["batches"]):
        now_us += scenario["steps"][batch_id] * 1_000_000
        expected_error: str | None = None
        try:
            reference.run_batch(records, batch_id, from_micros(now_us), tps)
        except InorderError as exc:
            expected_error = str(exc)
        for name, backend in backends.items():
            backend.checkpoint.write_json(
                {"batch_id": batch_id, "processing_time_us": now_us},
                "batches",
                f"{batch_id:020d}.json",
            )
            df = records_dataframe(spark, records, tps)
            if batch_id == scenario["crash"]:
                backend.run_tasks(df, batch_id)
            if expected_error is not None:
                with pytest.raises(InorderError) as info:
                    backend.run_batch(df, batch_id)
                assert str(info.value) == expected_error, name
                continue
            report = backend.run_batch(df, batch_id)
            ref_batch = reference.result.batches[-1]
            assert report.committed, name
            assert report.violations_by_rule == ref_batch.violation_counts, name
            assert report.records == ref_batch.counters.get("records", 0), name
            assert report.timeouts == ref_batch.counters.get("timeouts", 0), name
            by_partition: dict[str, dict[str, int]] = {}
            for event in ref_batch.violations:
                counts = by_partition.setdefault(f"{event.topic}[{event.partition}]", {})
                counts[event.rule] = counts.get(event.rule, 0) + 1
            assert report.violations_by_partition == by_partition, name
        if expected_error is not None:
            break
    want = _multiset(reference.result.rows)
    want_dl = sorted(
        (tp.partition, d.offset, d.rule, d.key) for tp, d in reference.result.dead_letters
    )
    for name, backend in backends.items():
        prefix = name[0]
        assert _multiset(_rows(tmp / f"{prefix}-out")) == want, name
        got_dl = sorted(
            (d["partition"], d["offset"], d["rule"], d["state_key"])
            for d in _rows(tmp / f"{prefix}-dl")
        )
        assert got_dl == want_dl, name
        assert _final_state(backend, tps, len(reference.result.batches), tmp) == (
            reference.final_state()
        ), name


def _final_state(
    backend: PartitionBackend, tps: list[TopicPartition], next_batch: int, tmp: Path
) -> dict[tuple[str, int, str], Any]:
    codec = StateCodec(Tally)
    stores = (
        [(tp, group_store_partition(tp, g)) for tp in tps for g in range(GROUPS)]
        if isinstance(backend, SparkBackend)
        else [(tp, tp) for tp in tps]
    )
    got: dict[tuple[str, int, str], Any] = {}
    for tp, store_tp in stores:
        with PartitionStore(
            backend.checkpoint,
            store_tp,
            codec,
            backend._epoch,
            StateOptions(cache_dir=str(tmp / "verify")),
        ) as store:
            view, _ = store.open(next_batch)
            for key in KEYS:
                entry = view.load(key)
                if entry is not None and not entry.ignored:
                    got[(tp.topic, tp.partition, key)] = entry.state
    return got
