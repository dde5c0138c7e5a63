"""Simulated sessions (with faults) through the reference runner: tables and resets are exact."""

from __future__ import annotations

import zlib
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from inorder.dev.sim_model import FaultRates, SimRecord, SimulationConfig, SiteModel
from inorder.engine.reference import ReferenceRunner
from inorder.integrity import Integrity
from inorder.records import KafkaRecord
from inorder.sessions import SessionCodec, SessionTables, rebuild_tables, rebuild_tables_duckdb

T0 = datetime(2024, 11, 7, tzinfo=UTC)


def place(
    records: list[SimRecord], partitions: int
) -> tuple[list[KafkaRecord], dict[int, KafkaRecord]]:
    """Key-hash partitioning and per-partition offsets, as a broker would assign them.

    Offsets step by 2 now and then: gaps (transaction markers) must not matter.
    """
    next_offset: dict[tuple[str, int], int] = defaultdict(int)
    placed: list[KafkaRecord] = []
    by_index: dict[int, KafkaRecord] = {}
    for rec in records:
        partition = zlib.crc32(rec.key) % partitions
        offset = next_offset[(rec.topic, partition)]
        next_offset[(rec.topic, partition)] = offset + (2 if rec.index % 7 == 0 else 1)
        kafka = KafkaRecord(
            rec.topic,
            partition,
            offset,
            rec.key,
            rec.value,
            T0 + timedelta(milliseconds=rec.index),
        )
        placed.append(kafka)
        by_index[rec.index] = kafka
    return placed, by_index


def expected_resets(model: SiteModel, records: list[SimRecord]) -> set[int]:
    """Record indexes where a consumer must reset: each fault not hidden by an earlier reset.

    After a reset a session is ignored until its next snapshot, so a second fault before
    that snapshot shows nothing.
    """
    faults = {f.record for sess in model.sessions for f in sess.faults}
    reset_sessions: set[str] = set()
    out: set[int] = set()
    for rec in records:
        if rec.index in faults and rec.session not in reset_sessions:
            out.add(rec.index)
            reset_sessions.add(rec.session)
        elif rec.index not in faults and rec.value.startswith(b'{"type":"snapshot"'):
            reset_sessions.discard(rec.session)
    return out


def run(config: SimulationConfig, batches: int) -> dict[str, Any]:
    model = SiteModel(config)
    records = list(model.records())
    placed, by_index = place(records, config.partitions)
    size = -(-len(placed) // batches)
    proc = SessionTables()
    integrity = Integrity.strict(on_violation="restart_session")
    assert SessionTables().default_integrity() == integrity
    runner = ReferenceRunner(proc, SessionCodec(), integrity)
    result = runner.run([placed[i : i + size] for i in range(0, len(placed), size)])
    return {
        "model": model,
        "records": records,
        "by_index": by_index,
        "changes": pa.Table.from_pylist(result.rows),
        "result": result,
    }


ALL_FAULTS = FaultRates(drop=0.01, duplicate=0.01, swap=0.01, malformed=0.01)
NO_MALFORMED = FaultRates(drop=0.015, duplicate=0.015, swap=0.015)


def faulty_config(seed: int, faults: FaultRates) -> SimulationConfig:
    return SimulationConfig(
        sites=3,
        partitions=3,
        sessions_per_site=40,
        rows_per_snapshot=8,
        messages=12_000,
        restart_every=60,
        end_probability=0.01,
        faults=faults,
        faulty_sessions=0.3,
        late_sites=1,
        seed=seed,
    )


def check_resets(out: dict[str, Any]) -> None:
    """Each fault a consumer can see yields exactly one reset, at the first violating record."""
    changes: pa.Table = out["changes"]
    model: SiteModel = out["model"]
    resets = changes.filter(pa.compute.equal(changes.column("op"), "reset")).to_pylist()
    got = sorted((r["topic"], r["partition"], r["offset"], r["session"]) for r in resets)
    by_index: dict[int, KafkaRecord] = out["by_index"]
    want = sorted(
        (k.topic, k.partition, k.offset, k.key.decode())  # type: ignore[union-attr]
        for k in (by_index[i] for i in expected_resets(model, out["records"]))
    )
    assert want
    assert got == want
    assert all(r["seq"] == -1 and r["row_id"] is None and r["row"] is None for r in resets)


@pytest.mark.parametrize("seed", [1, 2])
def test_tables_are_exact_despite_faults(seed: int) -> None:
    out = run(faulty_config(seed, ALL_FAULTS), batches=7)
    model: SiteModel = out["model"]
    changes: pa.Table = out["changes"]
    tables = rebuild_tables(changes)
    assert rebuild_tables_duckdb(changes) == tables
    exact = [s for s in model.sessions if s.records and s.table_exact]
    inexact = [s for s in model.sessions if s.records and not s.table_exact]
    assert len(exact) > 100 and inexact, "the simulation should have both kinds"
    assert any(s.faults and s.table_exact for s in model.sessions), "recovered after snapshot"
    assert any(s.ended for s in model.sessions)
    for sess in exact:
        assert tables[(sess.topic, sess.session)] == sess.table, sess.key
    resets = changes.filter(pa.compute.equal(changes.column("op"), "reset"))
    assert set(resets.column("session").to_pylist()) <= {
        s.session for s in model.sessions if s.faults
    }
    assert {v.rule for v in out["result"].violations} == {"seq_gap", "seq_repeat", "undecodable"}


@pytest.mark.parametrize("seed", [1, 2])
def test_one_reset_per_visible_fault(seed: int) -> None:
    check_resets(run(faulty_config(seed, NO_MALFORMED), batches=7))


def test_one_reset_per_visible_fault_with_malformed_records() -> None:
    check_resets(run(faulty_config(1, ALL_FAULTS), batches=7))


def test_no_faults_no_resets_and_every_change_unique() -> None:
    config = SimulationConfig(
        sites=2,
        partitions=2,
        sessions_per_site=30,
        messages=5_000,
        restart_every=40,
        end_probability=0.02,
        seed=5,
    )
    out = run(config, batches=4)
    changes: pa.Table = out["changes"]
    assert "reset" not in set(changes.column("op").to_pylist())
    assert out["result"].violations == []
    tables = rebuild_tables(changes)
    for sess in out["model"].sessions:
        if sess.records:
            assert tables[(sess.topic, sess.session)] == sess.table, sess.key
    # The exactly-once key of the output is unique.
    keys = list(
        zip(
            *(
                changes.column(c).to_pylist()
                for c in ("topic", "partition", "offset", "row_id", "op")
            ),
            strict=True,
        )
    )
    assert len(keys) == len(set(keys))
    # Rows are canonical JSON of the producer's rows.
    inserted = changes.filter(pa.compute.equal(changes.column("op"), "insert")).to_pylist()
    row = inserted[0]["row"]
    assert row == msgspec.json.encode(msgspec.json.decode(row), order="deterministic").decode()


def test_inactivity_timeout_ends_idle_sessions() -> None:
    proc = SessionTables(inactivity_timeout=timedelta(seconds=30))
    runner = ReferenceRunner(proc, SessionCodec(), SessionTables().default_integrity())
    snap = b'{"type":"snapshot","session":"A","seq":0,"rows":[{"id":"r1"}]}'
    ins = b'{"type":"insert","session":"B","seq":1,"row":{"id":"b2"}}'
    snap_b = b'{"type":"snapshot","session":"B","seq":0,"rows":[]}'
    recs = [
        KafkaRecord("t", 0, 0, b"A", snap),
        KafkaRecord("t", 0, 1, b"B", snap_b),
    ]
    runner.run_batch(recs, 0, T0)
    runner.run_batch([KafkaRecord("t", 0, 2, b"B", ins)], 1, T0 + timedelta(seconds=20))
    batch = runner.run_batch([], 2, T0 + timedelta(seconds=40))  # A idle for 40 s, B for 20 s
    assert [(r["session"], r["op"], r["offset"], r["seq"]) for r in batch.rows] == [
        ("A", "end", 0, 0)
    ]
    batch = runner.run_batch([], 3, T0 + timedelta(seconds=60))
    assert [(r["session"], r["op"], r["offset"], r["seq"]) for r in batch.rows] == [
        ("B", "end", 2, 1)
    ]
    assert runner.final_state() == {}
    # A message after the timeout is before any snapshot: reset, then ignored.
    late = b'{"type":"insert","session":"A","seq":1,"row":{"id":"r2"}}'
    batch = runner.run_batch([KafkaRecord("t", 0, 3, b"A", late)], 4, T0 + timedelta(seconds=61))
    assert [(r["session"], r["op"], r["offset"]) for r in batch.rows] == [("A", "reset", 3)]
    tables = rebuild_tables(pa.Table.from_pylist(runner.result.rows))
    assert tables == {("t", "A"): {}, ("t", "B"): {"b2": {"id": "b2"}}}


def test_rebuild_from_s3_dataset(s3: Any) -> None:
    """The change log as the Parquet sink lays it out on S3 (hive dirs, ``_inorder/`` skipped)."""
    import pyarrow.parquet as pq

    out = run(faulty_config(3, ALL_FAULTS), batches=3)
    changes: pa.Table = out["changes"]
    prefix = s3.new_prefix()
    fs = s3.pyarrow_fs()
    root = prefix.removeprefix("s3://")
    pq.write_to_dataset(changes, root, partition_cols=["topic"], filesystem=fs)
    pq.write_table(changes.slice(0, 10), f"{root}/_inorder/staging/x.parquet", filesystem=fs)
    expected = rebuild_tables(changes)
    assert rebuild_tables(prefix, storage_options=s3.storage_options()) == expected
    assert rebuild_tables_duckdb(prefix, storage_options=s3.storage_options()) == expected
