"""Field-mapped session messages: the same tables as the JSON contract, under other names."""

from __future__ import annotations

import pickle
import tomllib
from datetime import UTC, datetime
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from inorder.codecs.base import DecodeError
from inorder.engine.reference import ReferenceRunner
from inorder.errors import ConfigError
from inorder.records import KafkaRecord
from inorder.sessions import FieldMapping, SessionTables, rebuild_tables
from inorder.sessions.envelopes import envelope_from_options

T0 = datetime(2024, 11, 7, tzinfo=UTC)
KINDS = {
    "snapshot": "full",
    "insert": "add",
    "update": "change",
    "delete": "remove",
    "end": "close",
}
NO_SEQ = FieldMapping(
    type_field="kind",
    types=KINDS,
    session_field=None,
    seq_field=None,
    row_field="item",
    rows_field="items",
    ts_field=None,
)

# (session, contract message without session/seq); the same stream in both shapes
STREAM: list[tuple[str, dict[str, Any]]] = [
    ("A", {"type": "snapshot", "rows": [{"id": "a1", "v": 1}, {"id": "a2", "v": 2}]}),
    ("B", {"type": "snapshot", "rows": []}),
    ("A", {"type": "insert", "row": {"id": "a3", "v": 3}}),
    ("B", {"type": "insert", "row": {"id": 7, "v": 0}}),
    ("A", {"type": "update", "row": {"v": 20, "id": "a2"}}),
    ("A", {"type": "delete", "id": "a1"}),
    ("B", {"type": "end"}),
    ("A", {"type": "snapshot", "rows": [{"id": "a9", "v": 9}]}),
    ("A", {"type": "insert", "row": {"id": "a10", "v": 10}}),
]


def contract_records() -> list[KafkaRecord]:
    seqs: dict[str, int] = {}
    out = []
    for offset, (session, msg) in enumerate(STREAM):
        seq = 0 if msg["type"] == "snapshot" else seqs[session] + 1
        seqs[session] = seq
        value = msgspec.json.encode({**msg, "session": session, "seq": seq})
        out.append(KafkaRecord("t", 0, offset, session.encode(), value, T0))
    return out


def mapped(msg: dict[str, Any]) -> dict[str, Any]:
    """``msg`` in the mapped producer's words: no session, no seq, other names."""
    out: dict[str, Any] = {"kind": KINDS[msg["type"]]}
    if "rows" in msg:
        out["items"] = msg["rows"]
    if "row" in msg:
        out["item"] = msg["row"]
    if "id" in msg:
        out["id"] = msg["id"]
    return out


def mapped_records() -> list[KafkaRecord]:
    return [
        KafkaRecord("t", 0, offset, session.encode(), msgspec.json.encode(mapped(msg)), T0)
        for offset, (session, msg) in enumerate(STREAM)
    ]


def run(proc: SessionTables, recs: list[KafkaRecord]) -> ReferenceRunner:
    runner = ReferenceRunner(proc, proc.default_codec(), SessionTables().default_integrity())
    runner.run_batch(recs, 0, T0)
    return runner


def test_field_mapping_gives_the_contracts_change_log() -> None:
    contract = run(SessionTables(), contract_records())
    fields = run(SessionTables(envelope=NO_SEQ), mapped_records())
    assert fields.result.violations == contract.result.violations == []
    assert fields.result.rows == contract.result.rows
    tables = rebuild_tables(pa.Table.from_pylist(fields.result.rows))
    assert tables[("t", "A")] == {"a9": {"id": "a9", "v": 9}, "a10": {"id": "a10", "v": 10}}
    assert tables[("t", "B")] == {"7": {"id": 7, "v": 0}}


def test_without_seq_row_rules_still_hold() -> None:
    recs = [
        *mapped_records()[:1],
        KafkaRecord("t", 0, 1, b"A", b'{"kind":"change","item":{"id":"zz"}}', T0),
    ]
    runner = run(SessionTables(envelope=NO_SEQ), recs)
    assert [v.rule for v in runner.result.violations] == ["update_missing_row"]
    runner = run(SessionTables(envelope=NO_SEQ), mapped_records()[2:3])
    assert [v.rule for v in runner.result.violations] == ["before_snapshot"]


def test_with_a_seq_field_gaps_are_found() -> None:
    mapping = FieldMapping(type_field="kind", types=KINDS, session_field="sid", seq_field="n")
    recs = [
        KafkaRecord("t", 0, 0, None, b'{"kind":"full","sid":"S","n":0,"rows":[]}', T0),
        KafkaRecord("t", 0, 1, None, b'{"kind":"add","sid":"S","n":2,"row":{"id":1}}', T0),
    ]
    runner = run(SessionTables(envelope=mapping), recs)
    assert [v.rule for v in runner.result.violations] == ["seq_gap"]


def test_sessions_may_start_without_a_snapshot() -> None:
    mapping = FieldMapping(session_field=None, seq_field=None, require_snapshot=False)
    recs = [
        KafkaRecord("t", 0, 0, b"S", b'{"type":"insert","row":{"id":"r1"}}', T0),
        KafkaRecord("t", 0, 1, b"S", b'{"type":"delete","row":{"id":"r1"}}', T0),
    ]
    rows = run(SessionTables(envelope=mapping), recs).result.rows
    assert [(r["seq"], r["op"], r["row_id"]) for r in rows] == [
        (0, "clear", None),
        (1, "insert", "r1"),
        (2, "delete", "r1"),
    ]


@pytest.mark.parametrize(
    ("value", "key", "expected"),
    [
        (b'{"kind":"grow"}', b"S", "'kind' is 'grow', expected one of 'full'"),
        (b'{"kind":"add","item":{"v":1}}', b"S", "add 'item' has no string or integer 'id'"),
        (b'{"kind":"full","items":{}}', b"S", "full has no 'items' list"),
        (b'{"kind":"remove"}', b"S", "remove names no row"),
        (b'{"kind":"add","item":{"id":1}}', None, "no Kafka key"),
        (b"[1]", b"S", "a JSON list, not an object"),
        (None, b"S", "tombstone"),
    ],
)
def test_bad_messages_are_one_line_decode_errors(
    value: bytes | None, key: bytes | None, expected: str
) -> None:
    with pytest.raises(DecodeError, match=expected):
        NO_SEQ.codec("id").decode(value, key)


def test_mapping_from_toml_and_pickle() -> None:
    doc = tomllib.loads(
        """
        [processor]
        type = "sessions"
        options = { row_key = "pk", envelope = { kind = "fields", type_field = "kind", """
        """types = { snapshot = "full", delete = "remove" }, session_field = false, """
        """seq_field = false } }
        """
    )
    proc = SessionTables(**doc["processor"]["options"])
    assert proc.envelope == FieldMapping(
        type_field="kind",
        types={"snapshot": "full", "delete": "remove"},
        session_field=None,
        seq_field=None,
    )
    codec = pickle.loads(pickle.dumps(proc.default_codec()))
    change = codec.decode(b'{"kind":"remove","pk":5}', b"S")
    assert (change.op, change.session, change.row_id, change.seq) == ("delete", "S", 5, None)
    assert pickle.loads(pickle.dumps(proc)).envelope == proc.envelope
    assert envelope_from_options({"kind": "json"}) is None


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"kind": "avro"}, "envelope.kind"),
        ({"kind": "fields", "typefield": "x"}, "unknown option"),
        ({"kind": "fields", "types": {"upsert": "u"}}, "upsert not an operation"),
        ({"kind": "fields", "types": {"insert": "x", "update": "x"}}, "share a value"),
        ({"kind": "fields", "row_field": ""}, "row_field"),
    ],
)
def test_bad_options_are_config_errors(options: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        SessionTables(envelope=options)
