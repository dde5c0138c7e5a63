"""Debezium change events (fixtures in Debezium's documented shapes) as session tables."""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from inorder.codecs.base import DecodeError
from inorder.engine.reference import ReferenceRunner
from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.records import KafkaRecord
from inorder.sessions import Change, Debezium, SessionTables, rebuild_tables
from inorder.sessions.debezium import DebeziumCodec, key_session

FIXTURES = Path(__file__).parents[1] / "fixtures" / "debezium"
T0 = datetime(2024, 11, 7, tzinfo=UTC)
PG_TABLE = "postgres.inventory.customers"
MY_TABLE = "inventory.customers"
#: The policy these unit tests apply violations under (a run refuses it for Debezium).
RESTART = Integrity.strict(on_violation="restart_session")


def fixture(db: str, name: str) -> tuple[bytes | None, bytes | None]:
    """A fixture's Kafka key and value, as the JSON converter writes them."""
    doc = json.loads((FIXTURES / db / f"{name}.json").read_text())
    encode = msgspec.json.encode
    key, value = doc["key"], doc["value"]
    return (None if key is None else encode(key), None if value is None else encode(value))


def records(db: str, names: list[str], topic: str = "dbz") -> list[KafkaRecord]:
    """The named fixtures as consecutive records of one partition."""
    out = []
    for offset, name in enumerate(names):
        key, value = fixture(db, name)
        out.append(KafkaRecord(topic, 0, offset, key, value, T0))
    return out


def run(
    recs: list[KafkaRecord], envelope: Debezium | None = None
) -> tuple[ReferenceRunner, list[dict[str, Any]]]:
    proc = SessionTables(envelope=envelope or Debezium())
    runner = ReferenceRunner(proc, proc.default_codec(), RESTART)
    runner.run_batch(recs, 0, T0)
    return runner, runner.result.rows


def changes(rows: list[dict[str, Any]]) -> list[tuple[str, int, str, str | None]]:
    return [(r["session"], r["seq"], r["op"], r["row_id"]) for r in rows]


def live_table(runner: ReferenceRunner) -> dict[str, dict[str, Any]]:
    proc = runner.processor
    assert isinstance(proc, SessionTables)
    ((_, state),) = [(k, s) for k, s in runner.final_state().items() if s.started]
    return proc.table(state)


PG_STREAM = ["read_first", "read", "read_last", "create", "update", "delete", "tombstone"]
MY_STREAM = ["read_first", "read_last", "create", "update", "delete", "tombstone"]


@pytest.mark.parametrize(
    ("db", "name", "op", "session", "row_id"),
    [
        ("postgres", "read_first", "read", PG_TABLE, 1001),
        ("postgres", "read_last", "read", PG_TABLE, 1003),
        ("postgres", "create", "insert", PG_TABLE, 1004),
        ("postgres", "update", "update", PG_TABLE, 1001),
        ("postgres", "delete", "delete", PG_TABLE, 1002),
        ("postgres", "tombstone", "skip", "", None),
        ("mysql", "read_first", "read", MY_TABLE, 1001),
        ("mysql", "create", "insert", MY_TABLE, 1004),
        ("mysql", "update", "update", MY_TABLE, 1004),
        ("mysql", "delete", "delete", MY_TABLE, 1001),
        ("mysql", "tombstone", "skip", "", None),
    ],
)
def test_each_documented_event_maps_to_its_operation(
    db: str, name: str, op: str, session: str, row_id: int | None
) -> None:
    key, value = fixture(db, name)
    change = DebeziumCodec(Debezium(), "id").decode(value, key)
    assert (change.op, change.session) == (op, session)
    rid = change.row_id if op == "delete" else (change.row or {}).get("id")
    assert rid == row_id


def test_positions_and_snapshot_markers() -> None:
    codec = DebeziumCodec(Debezium(), "id")
    assert codec.decode(*reversed(fixture("postgres", "update"))).position == (24023300, 24023400)
    # the snapshot reads' sequence has a null committed LSN: no position
    first = codec.decode(*reversed(fixture("postgres", "read_first")))
    assert (first.position, first.snapshot_last) == (None, False)
    assert codec.decode(*reversed(fixture("postgres", "read_last"))).snapshot_last
    assert codec.decode(*reversed(fixture("mysql", "create"))).position == (
        "mysql-bin.000003",
        484,
        0,
    )


def test_postgres_stream_rebuilds_the_table() -> None:
    runner, rows = run(records("postgres", PG_STREAM))
    assert changes(rows) == [
        (PG_TABLE, 0, "clear", None),
        (PG_TABLE, 0, "insert", "1001"),
        (PG_TABLE, 1, "insert", "1002"),
        (PG_TABLE, 2, "insert", "1003"),
        (PG_TABLE, 3, "insert", "1004"),
        (PG_TABLE, 4, "update", "1001"),
        (PG_TABLE, 5, "delete", "1002"),
    ]
    assert runner.result.violations == []
    expected = {
        "1001": {
            "id": 1001,
            "first_name": "Sally Anne",
            "last_name": "Thomas",
            "email": "sally.thomas@acme.com",
        },
        "1003": {
            "id": 1003,
            "first_name": "Edward",
            "last_name": "Walker",
            "email": "ed@walker.com",
        },
        "1004": {
            "id": 1004,
            "first_name": "Anne",
            "last_name": "Kretchmar",
            "email": "annek@noanswer.org",
        },
    }
    assert rebuild_tables(pa.Table.from_pylist(rows)) == {("dbz", PG_TABLE): expected}
    assert live_table(runner) == expected
    # the tombstone left no state behind
    assert set(k[2] for k in runner.final_state()) == {PG_TABLE}


def test_mysql_stream_rebuilds_the_table() -> None:
    runner, rows = run(records("mysql", MY_STREAM))
    assert [r[2:] for r in changes(rows)] == [
        ("clear", None),
        ("insert", "1001"),
        ("insert", "1002"),
        ("insert", "1004"),
        ("update", "1004"),
        ("delete", "1001"),
    ]
    tables = rebuild_tables(pa.Table.from_pylist(rows))
    assert sorted(tables[("dbz", MY_TABLE)]) == ["1002", "1004"]
    assert tables[("dbz", MY_TABLE)]["1004"]["first_name"] == "Anne Marie"
    assert tables[("dbz", MY_TABLE)] == live_table(runner)


def test_a_second_snapshot_replaces_the_table() -> None:
    # a connector restarted with snapshot.mode=always reads the table again
    names = ["read_first", "read", "read_last", "create", "read_first", "read_last"]
    _, rows = run(records("postgres", names))
    tables = rebuild_tables(pa.Table.from_pylist(rows))
    assert sorted(tables[("dbz", PG_TABLE)]) == ["1001", "1003"]
    assert [r["op"] for r in rows].count("clear") == 2


def test_changes_without_a_snapshot_start_an_empty_table() -> None:
    runner, rows = run(records("postgres", ["create", "update"]))
    # 1001 was never created here: its update breaks the rule (and resets the table)
    assert [v.rule for v in runner.result.violations] == ["update_missing_row"]
    assert changes(rows) == [
        (PG_TABLE, 0, "clear", None),
        (PG_TABLE, 1, "insert", "1004"),
        (PG_TABLE, -1, "reset", None),
    ]


def test_require_snapshot_refuses_changes_before_one() -> None:
    runner, _ = run(records("postgres", ["create"]), Debezium(require_snapshot=True))
    assert [v.rule for v in runner.result.violations] == ["before_snapshot"]


def test_duplicate_snapshot_row_and_delete_of_missing_row_are_violations() -> None:
    runner, _ = run(records("postgres", ["read_first", "read_first"]))
    assert [v.rule for v in runner.result.violations] == ["insert_existing_row"]
    runner, _ = run(records("postgres", ["read_first", "read_last", "delete", "delete"]))
    assert [v.rule for v in runner.result.violations] == ["delete_missing_row"]


def test_source_position_going_back_is_a_violation() -> None:
    recs = records("mysql", ["read_first", "read_last", "create", "update"])
    key, value = fixture("mysql", "delete")
    event = json.loads(value or b"")
    event["source"]["pos"] = 600  # before the update's 805: delivered out of binlog order
    recs.append(KafkaRecord("dbz", 0, 4, key, msgspec.json.encode(event), T0))
    runner, rows = run(recs)
    assert [v.rule for v in runner.result.violations] == ["source_order"]
    assert "mysql-bin.000003" in runner.result.violations[0].detail
    assert rows[-1]["op"] == "reset"


def test_incremental_snapshot_rows_upsert() -> None:
    key, value = fixture("postgres", "read")
    event = json.loads(value or b"")
    event["source"]["snapshot"] = "incremental"
    event["after"]["first_name"] = "Georgie"
    recs = records("postgres", ["read_first", "read", "read_last"])
    recs.append(KafkaRecord("dbz", 0, 3, key, msgspec.json.encode(event), T0))
    _, rows = run(recs)
    assert changes(rows)[-1] == (PG_TABLE, 3, "update", "1002")


def test_truncate_clears_and_message_is_skipped() -> None:
    _, create = fixture("mysql", "create")
    event = json.loads(create or b"")
    truncate = {**event, "op": "t", "before": None, "after": None}
    message = {**event, "op": "m", "after": None}
    recs = records("mysql", ["read_first", "read_last"])
    recs += [
        KafkaRecord("dbz", 0, 2, None, msgspec.json.encode(message), T0),
        KafkaRecord("dbz", 0, 3, None, msgspec.json.encode(truncate), T0),
    ]
    _, rows = run(recs)
    assert changes(rows)[-1] == (MY_TABLE, 0, "truncate", None)
    assert rebuild_tables(pa.Table.from_pylist(rows)) == {("dbz", MY_TABLE): {}}


def test_session_from_the_kafka_key() -> None:
    runner, rows = run(records("postgres", PG_STREAM), Debezium(session="key"))
    assert runner.result.violations == []
    tables = rebuild_tables(pa.Table.from_pylist(rows))
    assert sorted(tables) == [("dbz", "1001"), ("dbz", "1002"), ("dbz", "1003"), ("dbz", "1004")]
    assert tables[("dbz", "1002")] == {}
    assert key_session(b'{"schema":{},"payload":{"a":1,"b":"x"}}') == '{"a":1,"b":"x"}'
    assert key_session(b"plain") == "plain"


def test_session_fields_choose_the_name() -> None:
    key, value = fixture("postgres", "create")
    change = DebeziumCodec(Debezium(session_fields=("table",)), "id").decode(value, key)
    assert change.session == "customers"


def test_boolean_snapshot_flag_of_older_versions() -> None:
    key, value = fixture("postgres", "read")
    event = json.loads(value or b"")
    event["source"]["snapshot"] = True
    change = DebeziumCodec(Debezium(), "id").decode(msgspec.json.encode(event), key)
    assert (change.op, change.snapshot_last) == ("read", False)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"{not json", "malformed JSON"),
        (b'{"op":"x","source":{"table":"t"}}', "unknown op 'x'"),
        (b'{"after":{"id":1},"source":{"table":"t"}}', "no 'op'"),
        (b'{"op":"c","after":null,"source":{"table":"t"}}', "'c' with null 'after'"),
        (b'{"op":"c","after":{"name":"x"},"source":{"table":"t"}}', "no string or integer 'id'"),
        (b'{"op":"c","after":{"id":1}}', "without 'source'"),
        (b'{"op":"d","before":null,"source":{"table":"t"}}', "'d' names no row"),
        (b'{"op":"c","after":{"id":1},"source":{"table":5}}', "invalid Debezium event"),
    ],
)
def test_bad_events_are_one_line_decode_errors(value: bytes, expected: str) -> None:
    with pytest.raises(DecodeError, match=expected) as info:
        DebeziumCodec(Debezium(), "id").decode(value, None)
    assert "\n" not in str(info.value)


def test_delete_without_before_uses_the_kafka_key() -> None:
    value = b'{"op":"d","before":null,"source":{"table":"t"}}'
    change = DebeziumCodec(Debezium(), "id").decode(value, b'{"id":7}')
    assert (change.op, change.row_id) == ("delete", 7)


def test_undecodable_record_cannot_name_a_table_session() -> None:
    recs = records("postgres", ["read_first", "read_last"])
    recs.append(KafkaRecord("dbz", 0, 2, b'{"id":1001}', b"{broken", T0))
    runner, rows = run(recs)
    assert [v.rule for v in runner.result.violations] == ["undecodable"]
    assert "reset" not in [r["op"] for r in rows]


def test_options_config_and_pickle() -> None:
    proc = SessionTables(envelope={"kind": "debezium", "session": "key"})
    assert proc.envelope == Debezium(session="key")
    clone = pickle.loads(pickle.dumps(proc))
    assert clone.envelope == proc.envelope
    codec = pickle.loads(pickle.dumps(proc.default_codec()))
    assert isinstance(codec.decode(None, b'{"id":1}'), Change)
    with pytest.raises(ConfigError, match="session"):
        Debezium(session="topic")
    with pytest.raises(ConfigError, match="session_fields"):
        Debezium(session_fields=("catalog",))
    with pytest.raises(ConfigError, match="unknown option"):
        SessionTables(envelope={"kind": "debezium", "row_key": "id"})
