"""Property: the partition backend on real Spark equals the reference runner, exactly.

Random streams over a few partitions and keys (with offset gaps, replays of old offsets,
undecodable records, violations, session restarts, event- and processing-time timeouts),
random batch boundaries, random policies, random crash points and both layouts of state
deltas (a file per partition, one per task). A crash is simulated by
running a batch's tasks (state versions and staged files written) without committing, then
re-running the batch; the local state caches are also wiped at random to force recovery from
the checkpoint files (snapshots every 2 versions exercise snapshot + delta loading).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inorder.engine.context import from_micros
from inorder.engine.partition import PartitionBackend
from inorder.engine.reference import ReferenceRunner
from inorder.errors import InorderError
from inorder.integrity import Integrity
from inorder.records import KafkaRecord, TopicPartition
from inorder.sinks.parquet import ParquetSink, committed_files
from inorder.state.store import StateOptions
from inorder.testing.memory import records_dataframe
from tests.property.procs import MsgCodec, Tallier, as_comparable, record, register_for_spark

OPS = ["add"] * 6 + ["pt", "bad", "start", "end", "clear", "undecodable"]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    n_parts = draw(st.integers(1, 3))
    n_batches = draw(st.integers(1, 5))
    batches: list[list[KafkaRecord]] = [[] for _ in range(n_batches)]
    for p in range(n_parts):
        offset = 0
        t = 0.0
        seqs: dict[str, int] = {}
        history: list[KafkaRecord] = []
        n = draw(st.integers(0, 12))
        cuts = sorted(
            draw(st.lists(st.integers(0, n), min_size=n_batches - 1, max_size=n_batches - 1))
        )
        bounds = [0, *cuts, n]
        for b in range(n_batches):
            for _ in range(bounds[b], bounds[b + 1]):
                if history and draw(st.integers(0, 9)) == 0:  # a replay of an old record
                    batches[b].append(draw(st.sampled_from(history)))
                    continue
                offset += draw(st.sampled_from([1, 1, 1, 2, 5]))
                t += draw(st.sampled_from([0.0, 1.0, 4.0, 12.0, -3.0]))
                key = draw(st.sampled_from(["a", "b", "c"]))
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
    crashes = draw(st.sets(st.integers(0, n_batches - 1), max_size=2))
    wipes = draw(st.sets(st.integers(0, n_batches - 1), max_size=2))
    policy = draw(st.sampled_from(["fail", "dead_letter", "restart_session"]))
    seq_field = draw(st.sampled_from([None, "seq"]))
    steps = draw(st.lists(st.integers(0, 3), min_size=n_batches, max_size=n_batches))
    return {
        "delta_files": draw(st.sampled_from(["partition", "task"])),
        "parts": n_parts,
        "batches": batches,
        "crashes": crashes,
        "wipes": wipes,
        "integrity": Integrity.strict(on_violation=policy, sequence_field=seq_field),
        "steps": steps,
    }


def read_output(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in committed_files(str(path)):
        rows.extend(pq.read_table(str(path / f.path)).to_pylist())
    return rows


@pytest.mark.timeout(600)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenario=scenarios())
def test_partition_backend_equals_reference(spark: Any, scenario: dict[str, Any]) -> None:
    register_for_spark()
    tmp = Path(tempfile.mkdtemp(prefix="inorder-prop-"))
    try:
        _run(spark, scenario, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(spark: Any, scenario: dict[str, Any], tmp: Path) -> None:
    integrity: Integrity = scenario["integrity"]
    tps = [TopicPartition("t", p) for p in range(scenario["parts"])]
    cache_dir = tmp / "cache"
    backend = PartitionBackend(
        Tallier(),
        MsgCodec(),
        integrity,
        checkpoint=str(tmp / "ckpt"),
        sink=ParquetSink(str(tmp / "out")),
        state_options=StateOptions(
            snapshot_interval=2,
            retain_versions=1,
            cache_dir=str(cache_dir),
            delta_files=scenario["delta_files"],
        ),
    )
    reference = ReferenceRunner(Tallier(), MsgCodec(), integrity)
    now_us = 1_000_000_000
    for batch_id, records in enumerate(scenario["batches"]):
        now_us += scenario["steps"][batch_id] * 1_000_000
        backend.checkpoint.write_json(
            {"batch_id": batch_id, "processing_time_us": now_us},
            "batches",
            f"{batch_id:020d}.json",
        )
        expected_error: str | None = None
        try:
            reference.run_batch(records, batch_id, from_micros(now_us), tps)
        except InorderError as exc:
            expected_error = str(exc)
        if batch_id in scenario["wipes"]:
            shutil.rmtree(cache_dir, ignore_errors=True)
        if batch_id in scenario["crashes"]:
            backend.run_tasks(records_dataframe(spark, records, tps), batch_id)
            assert not backend.sink.is_committed(batch_id)
        if expected_error is not None:
            with pytest.raises(InorderError) as info:
                backend.run_batch(records_dataframe(spark, records, tps), batch_id)
            assert str(info.value) == expected_error
            break
        report = backend.run_batch(records_dataframe(spark, records, tps), batch_id)
        assert report.committed
        ref_batch = reference.result.batches[-1]
        assert report.violations_by_rule == ref_batch.violation_counts
        assert report.records == ref_batch.counters.get("records", 0)
    got = read_output(tmp / "out")
    assert as_comparable(got) == as_comparable(reference.result.rows)
    _assert_state_equal(backend, reference, tps, len(reference.result.batches), tmp)


def _assert_state_equal(
    backend: PartitionBackend,
    reference: ReferenceRunner,
    tps: list[TopicPartition],
    next_batch: int,
    tmp: Path,
) -> None:
    from inorder.state.codec import StateCodec
    from inorder.state.store import PartitionStore
    from tests.property.procs import Tally

    codec = StateCodec(Tally)
    expected = reference.final_state()
    got: dict[tuple[str, int, str], Any] = {}
    for tp in tps:
        with PartitionStore(
            backend.checkpoint,
            tp,
            codec,
            backend._epoch,
            StateOptions(cache_dir=str(tmp / "verify")),
        ) as store:
            view, _ = store.open(next_batch)
            for key in ("a", "b", "c"):
                entry = view.load(key)
                if entry is not None and not entry.ignored:
                    got[(tp.topic, tp.partition, key)] = entry.state
    assert got == expected
