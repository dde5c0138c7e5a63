"""The pure simulation model: determinism, message contract, fault bookkeeping."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from typing import Any

import pytest

from inorder.dev.sim_model import (
    FaultKind,
    FaultRates,
    OpMix,
    SimRecord,
    SimulationConfig,
    SiteModel,
)
from inorder.errors import ConfigError

FAULTS = FaultRates(drop=0.01, duplicate=0.01, swap=0.01, malformed=0.01)


def run(config: SimulationConfig) -> tuple[SiteModel, list[SimRecord]]:
    model = SiteModel(config)
    return model, list(model.records())


def by_session(records: list[SimRecord]) -> dict[str, list[SimRecord]]:
    out: dict[str, list[SimRecord]] = defaultdict(list)
    for rec in records:
        out[f"{rec.topic}/{rec.session}"].append(rec)
    return out


def parse(rec: SimRecord) -> dict[str, Any] | None:
    try:
        value: dict[str, Any] = json.loads(rec.value)
    except ValueError:
        return None
    return value


def test_same_seed_same_records_different_seed_different() -> None:
    config = SimulationConfig(
        messages=5_000, restart_every=50, end_probability=0.01, late_sites=1, faults=FAULTS
    )
    _, first = run(config)
    _, second = run(config)
    assert [(r.topic, r.key, r.value) for r in first] == [(r.topic, r.key, r.value) for r in second]
    _, other = run(SimulationConfig(messages=5_000, seed=1))
    assert [r.value for r in other] != [r.value for r in first[: len(other)]]


def test_messages_follow_the_contract() -> None:
    config = SimulationConfig(
        sites=2, sessions_per_site=3, rows_per_snapshot=5, messages=3_000, end_probability=0.005
    )
    model, records = run(config)
    assert len(records) == 3_000 == model.messages
    assert [r.index for r in records] == list(range(3_000))
    for key, recs in by_session(records).items():
        topic, session = key.split("/")
        seqs = []
        for rec in recs:
            msg = parse(rec)
            assert msg is not None
            assert rec.key == session.encode() and msg["session"] == session
            assert session.startswith(topic + "-")
            fields = {"snapshot": "rows", "insert": "row", "update": "row", "delete": "id"}
            tail = [fields[msg["type"]]] if msg["type"] in fields else []
            assert list(msg) == ["type", "session", "seq", "ts", *tail]
            assert isinstance(msg["ts"], float)
            seqs.append(msg["seq"])
        first = json.loads(recs[0].value)
        assert first["type"] == "snapshot" and len(first["rows"]) == 5
        for row in first["rows"]:
            assert list(row) == ["id", "name", "value", "count"]
            assert isinstance(row["value"], float) and isinstance(row["count"], int)
        assert seqs == list(range(len(seqs)))  # no faults: seq 0, 1, 2, ...
        if json.loads(recs[-1].value)["type"] == "end":
            assert model_session(model, key).ended


def model_session(model: SiteModel, key: str) -> Any:
    return next(s for s in model.sessions if s.key == key)


def rebuild(records: list[SimRecord]) -> dict[str, dict[str, Any]]:
    """Apply one clean session's messages; each must be valid against the table so far."""
    table: dict[str, dict[str, Any]] = {}
    for rec in records:
        msg = parse(rec)
        assert msg is not None
        if msg["type"] == "snapshot":
            table = {row["id"]: row for row in msg["rows"]}
        elif msg["type"] == "insert":
            assert msg["row"]["id"] not in table
            table[msg["row"]["id"]] = msg["row"]
        elif msg["type"] == "update":
            assert msg["row"]["id"] in table
            table[msg["row"]["id"]] = msg["row"]
        elif msg["type"] == "delete":
            del table[msg["id"]]
    return table


def test_restart_every_k_messages_resends_a_changed_snapshot() -> None:
    model, records = run(SimulationConfig(sites=1, sessions_per_site=2, messages=1_000,
                                           restart_every=40, mix=OpMix(1, 1, 1)))  # fmt: skip
    for key, recs in by_session(records).items():
        types = [json.loads(r.value)["type"] for r in recs]
        assert [i for i, t in enumerate(types) if t == "snapshot"] == list(range(0, len(recs), 40))
        # The producer's table equals what applying its messages gives.
        assert rebuild(recs) == model_session(model, key).table
        snapshots = [json.loads(r.value) for r in recs if b'"snapshot"' in r.value[:20]]
        # A restart snapshot is not the previous table unchanged (a merge would be caught).
        before = rebuild(recs[:40])
        assert {r["id"]: r for r in snapshots[1]["rows"]} != before


def test_end_closes_a_session_and_a_new_one_takes_its_place() -> None:
    model, records = run(SimulationConfig(sites=1, sessions_per_site=2, messages=2_000,
                                           end_probability=0.02))  # fmt: skip
    ended = [s for s in model.sessions if s.ended]
    assert ended and len(model.sessions) == 2 + len(ended)
    sessions = by_session(records)
    for sess in ended:
        assert json.loads(sessions[sess.key][-1].value)["type"] == "end"


def test_mix_only_inserts() -> None:
    _, records = run(SimulationConfig(messages=500, mix=OpMix(1, 0, 0)))
    types = {json.loads(r.value)["type"] for r in records}
    assert types == {"snapshot", "insert"}


def test_late_sites_appear_after_the_fraction() -> None:
    config = SimulationConfig(sites=2, late_sites=2, late_after=0.25, messages=4_000)
    model, records = run(config)
    late = set(config.late_topics())
    assert late == {"site-002", "site-003"}
    first_late = min(i for i, r in enumerate(records) if r.topic in late)
    assert first_late == 1_000 == model.late_activated_at
    assert {r.topic for r in records[first_late:]} >= late


def test_late_sites_in_duration_mode_join_when_told() -> None:
    model = SiteModel(SimulationConfig(late_sites=1, messages=None, duration=1.0))
    before = [r for _ in range(500) for r in model.step()]
    model.activate_late_sites()
    after = [r for _ in range(500) for r in model.step()]
    assert all(r.topic != "site-003" for r in before)
    assert any(r.topic == "site-003" for r in after)
    assert model.late_activated_at == 500


def test_faulty_sessions_fraction_is_exact() -> None:
    model = SiteModel(SimulationConfig(sites=4, sessions_per_site=5, faulty_sessions=0.25))
    assert sum(s.faulty for s in model.sessions) == 5


def test_fault_bookkeeping_matches_the_records() -> None:
    config = SimulationConfig(
        sites=2, sessions_per_site=4, messages=20_000, restart_every=60, end_probability=0.002,
        faults=FAULTS, faulty_sessions=0.5,
    )  # fmt: skip
    model, records = run(config)
    sessions = by_session(records)
    seen_kinds = set()
    for sess in model.sessions:
        recs = sessions.get(sess.key, [])
        assert len(recs) == sess.records
        if not sess.faulty:
            assert not sess.faults
        if not sess.faults:
            if recs:
                assert rebuild(recs) == sess.table
            continue
        position = {r.index: i for i, r in enumerate(recs)}
        for fault in sess.faults:
            seen_kinds.add(fault.kind)
            i = position[fault.record]
            rec = recs[i]
            assert rec.track
            if fault.kind is FaultKind.DROP:
                # The session's record before the violating one is the seq before the drop.
                assert rec.seq == fault.seq + 1 and recs[i - 1].seq == fault.seq - 1
            elif fault.kind is FaultKind.DUPLICATE:
                assert recs[i - 1].value == rec.value and rec.seq == fault.seq
            elif fault.kind is FaultKind.SWAP:
                assert rec.seq == fault.seq + 1 and recs[i + 1].seq == fault.seq
            else:
                assert parse(rec) is None and rec.seq == fault.seq
        # Exact again only if a snapshot follows the last fault.
        last_fault = position[sess.faults[-1].record]
        snapshot_after = any(
            (parse(r) or {}).get("type") == "snapshot" for r in recs[last_fault + 1 :]
        )
        assert sess.table_exact == snapshot_after
        if sess.table_exact:
            last_snapshot = max(
                i for i, r in enumerate(recs) if (parse(r) or {}).get("type") == "snapshot"
            )
            assert rebuild(recs[last_snapshot:]) == sess.table
    assert seen_kinds == set(FaultKind)


def test_faults_never_hit_snapshots_or_ends_and_are_separated() -> None:
    config = SimulationConfig(sites=1, sessions_per_site=2, messages=5_000, restart_every=20,
                              end_probability=0.01, faults=FaultRates(drop=0.3, swap=0.3),
                              faulty_sessions=1.0)  # fmt: skip
    model, records = run(config)
    sessions = by_session(records)
    for sess in model.sessions:
        recs = sessions.get(sess.key, [])
        seqs_by_type = {(parse(r) or {}).get("type") for r in recs}
        assert "snapshot" in seqs_by_type or not recs
        position = {r.index: i for i, r in enumerate(recs)}
        indexes = [position[f.record] for f in sess.faults]
        # The message after a fault is clean: faults are at least two records apart.
        assert all(b - a >= 2 for a, b in itertools.pairwise(indexes))
        # A drop never removes a snapshot: every run of seqs restarts at a snapshot with seq 0.
        for rec in recs:
            msg = parse(rec)
            assert msg is None or msg["type"] != "snapshot" or msg["seq"] == 0


def test_drain_sends_held_messages_unchanged() -> None:
    config = SimulationConfig(sites=1, sessions_per_site=1, messages=None, duration=1.0,
                              faults=FaultRates(drop=1.0), faulty_sessions=1.0)  # fmt: skip
    model = SiteModel(config)
    records = model.step() + model.step()  # snapshot, then an insert held back for a drop
    assert len(records) == 1
    held = model.drain()
    assert [r.seq for r in held] == [1] and parse(held[0]) is not None
    assert model.sessions[0].faults == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sites": 0}, "--sites must be an integer >= 1"),
        ({"partitions": 0}, "--partitions"),
        ({"sessions_per_site": 0}, "--sessions-per-site"),
        ({"rows_per_snapshot": -1}, "--rows-per-snapshot"),
        ({"messages": 0}, "--messages"),
        ({"messages": None}, "give --messages or --duration"),
        ({"duration": -1.0}, "--duration"),
        ({"rate": -1.0}, "--rate"),
        ({"rate": float("nan")}, "--rate"),
        ({"end_probability": 1.5}, "--end-probability"),
        ({"faulty_sessions": -0.1}, "--faulty-sessions"),
        ({"late_after": 2.0}, "--late-after"),
        ({"mix": OpMix(0, 0, 0)}, "--mix"),
        ({"mix": OpMix(-1, 1, 1)}, "--mix"),
        ({"faults": FaultRates(drop=0.6, swap=0.6)}, "rates sum to"),
        ({"topic_prefix": "a b"}, "--topic-prefix"),
    ],
)
def test_invalid_config_names_the_option(changes: dict[str, Any], message: str) -> None:
    config = SimulationConfig(**changes)
    with pytest.raises(ConfigError, match=message.replace("-", r"\-")):
        config.validate()


def test_parse_options() -> None:
    assert FaultRates.parse("drop=0.1, swap=0.2") == FaultRates(drop=0.1, swap=0.2)
    assert FaultRates.parse("") == FaultRates()
    assert OpMix.parse("2:5:1") == OpMix(2, 5, 1)
    with pytest.raises(ConfigError, match="KIND=RATE"):
        FaultRates.parse("drop")
    with pytest.raises(ConfigError, match="not a number"):
        FaultRates.parse("drop=x")
    with pytest.raises(ConfigError, match="numbers"):
        OpMix.parse("a:b:c")
