"""SessionTables, SessionCodec and rebuild_tables driven directly (pure unit logic)."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import random
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from inorder.codecs.base import DecodeError
from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.processor import Header, Violation, processor_types
from inorder.sessions import (
    Delete,
    End,
    Insert,
    SessionChange,
    SessionCodec,
    SessionState,
    SessionTables,
    Snapshot,
    Update,
    rebuild_tables,
    rebuild_tables_duckdb,
)
from inorder.sessions.messages import SessionMessage
from inorder.sessions.processor import SCHEMA_DRIFT
from inorder.sessions.table_book import TableRow, due, materialize

T0 = datetime(2024, 11, 7, 12, 0, tzinfo=UTC)


class FakeContext:
    """A concrete Context: fixed coordinates, records the per-key requests of one call."""

    def __init__(self, topic: str = "site-a", partition: int = 0) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = 0
        self.timestamp: datetime | None = T0
        self.key: bytes | None = None
        self.headers: Sequence[Header] = ()
        self.watermark: datetime | None = None
        self.processing_time = T0
        self.batch_id = 0
        self.timeout: timedelta | datetime | None = None
        self.cleared = False
        self.reset = False

    def set_timeout(self, when: timedelta | datetime, *, event_time: bool = False) -> None:
        self.timeout = when

    def clear_timeout(self) -> None:
        self.timeout = None
        self.cleared = True

    def reset_session(self) -> None:
        self.reset = True


class Driver:
    """Applies messages like the engine does: per-key state, rollback on Violation, resets."""

    def __init__(self, proc: SessionTables) -> None:
        self.proc = proc
        self.states: dict[str, SessionState] = {}
        self.ctx = FakeContext()
        self.out: list[dict[str, Any]] = []

    def send(self, msg: SessionMessage, offset: int | None = None) -> list[Any]:
        ctx = self.ctx
        ctx.offset = ctx.offset + 1 if offset is None else offset
        ctx.reset = False
        key = self.proc.key(msg)
        state = self.states.get(key) or self.proc.initial_state(key)
        rows = list(self.proc.process(state, msg, ctx))
        if ctx.reset:
            self.states.pop(key, None)
        else:
            self.states[key] = state
        self._collect(rows)
        return rows

    def _collect(self, rows: Iterable[Any]) -> None:
        for r in rows:
            self.out.append(
                {
                    "topic": self.ctx.topic,
                    "partition": self.ctx.partition,
                    "offset": self.ctx.offset,
                    **msgspec.structs.asdict(r),
                    "batch_id": 0,
                }
            )

    def table(self) -> pa.Table:
        return pa.Table.from_pylist(self.out)


def snap(session: str = "S", seq: int = 0, rows: list[dict[str, Any]] | None = None) -> Snapshot:
    if rows is None:
        rows = [{"id": "r1", "v": 1}, {"id": "r2", "v": 2}]
    return Snapshot(session, seq, rows, ts=1731000000.5)


def ops(rows: Iterable[Any]) -> list[tuple[str, str | None, str | None]]:
    return [(r.op, r.row_id, r.row) for r in rows]


# -- codec ---------------------------------------------------------------------------------


def test_codec_decodes_every_message_type() -> None:
    codec = SessionCodec()
    msgs = [
        b'{"type":"snapshot","session":"S","seq":0,"ts":1731000000.5,"rows":[{"id":"r1","a":1}]}',
        b'{"type":"insert","session":"S","seq":1,"ts":1.0,"row":{"id":"r9","a":2}}',
        b'{"type":"update","session":"S","seq":2,"row":{"id":"r9","a":3}}',
        b'{"type":"delete","session":"S","seq":3,"ts":2,"id":"r9"}',
        b'{"type":"end","session":"S","seq":4,"ts":3.5,"extra":"ignored"}',
    ]
    decoded = [codec.decode(m, b"S") for m in msgs]
    assert [type(m) for m in decoded] == [Snapshot, Insert, Update, Delete, End]
    assert decoded[0] == Snapshot("S", 0, [{"id": "r1", "a": 1}], 1731000000.5)
    assert decoded[3] == Delete("S", 3, "r9", 2.0)
    assert decoded[2].ts is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b'{"type":"insert","session":"S",', "malformed JSON"),
        (b"not json", "malformed JSON"),
        (b'{"type":"upsert","session":"S","seq":1}', "invalid session message"),
        (b'{"type":"insert","session":"S","seq":"1","row":{"id":"a"}}', "invalid session message"),
        (b'{"type":"insert","session":"S","seq":1,"row":{"x":1}}', "no string or integer 'id'"),
        (b'{"type":"snapshot","session":"S","seq":0,"rows":[{"id":"a"},{"id":null}]}', "row 1"),
        (None, "tombstone"),
    ],
)
def test_codec_rejects_bad_values(value: bytes | None, expected: str) -> None:
    with pytest.raises(DecodeError, match=expected):
        SessionCodec().decode(value, b"S")


def test_codec_custom_row_key_and_pickle() -> None:
    codec = pickle.loads(pickle.dumps(SessionCodec(row_key="pk")))
    msg = codec.decode(b'{"type":"delete","session":"S","seq":3,"pk":7}', None)
    assert isinstance(msg, Delete)
    assert msg.id == 7
    assert pickle.loads(pickle.dumps(msg)) == msg
    with pytest.raises(DecodeError, match="'pk'"):
        codec.decode(b'{"type":"insert","session":"S","seq":1,"row":{"id":"a"}}', None)


# -- the happy path ------------------------------------------------------------------------


def test_snapshot_emits_clear_then_inserts_in_canonical_json() -> None:
    d = Driver(SessionTables())
    rows = d.send(snap(rows=[{"v": 1, "id": "r1", "z": {"b": 1, "a": 2}}, {"id": "r2"}]))
    assert ops(rows) == [
        ("clear", None, None),
        ("insert", "r1", '{"id":"r1","v":1,"z":{"a":2,"b":1}}'),
        ("insert", "r2", '{"id":"r2"}'),
    ]
    assert all(r.seq == 0 and r.session == "S" and r.kafka_ts == T0 for r in rows)
    assert d.states["S"] == SessionState(
        True, 0, {"r1": '{"id":"r1","v":1,"z":{"a":2,"b":1}}', "r2": '{"id":"r2"}'}
    )


def test_insert_update_delete() -> None:
    d = Driver(SessionTables())
    d.send(snap())
    assert ops(d.send(Insert("S", 1, {"id": "r3", "v": 3}))) == [
        ("insert", "r3", '{"id":"r3","v":3}')
    ]
    assert ops(d.send(Update("S", 2, {"id": "r1", "v": 10}))) == [
        ("update", "r1", '{"id":"r1","v":10}')
    ]
    assert ops(d.send(Delete("S", 3, "r2"))) == [("delete", "r2", None)]
    state = d.states["S"]
    assert state.seq == 3
    assert state.rows == {"r1": '{"id":"r1","v":10}', "r3": '{"id":"r3","v":3}'}
    assert rebuild_tables(d.table()) == {
        ("site-a", "S"): {"r1": {"id": "r1", "v": 10}, "r3": {"id": "r3", "v": 3}}
    }


def test_integer_row_keys_become_strings() -> None:
    d = Driver(SessionTables())
    d.send(snap(rows=[{"id": 1}]))
    assert ops(d.send(Delete("S", 1, 1))) == [("delete", "1", None)]


def test_new_snapshot_replaces_the_table() -> None:
    d = Driver(SessionTables())
    d.send(snap())
    d.send(Insert("S", 1, {"id": "r3"}))
    rows = d.send(snap(rows=[{"id": "x"}]))  # producer restart: seq starts over
    assert ops(rows) == [("clear", None, None), ("insert", "x", '{"id":"x"}')]
    assert d.states["S"].rows == {"x": '{"id":"x"}'}
    assert d.states["S"].seq == 0
    d.send(Update("S", 1, {"id": "x", "v": 1}))
    assert rebuild_tables(d.table())[("site-a", "S")] == {"x": {"id": "x", "v": 1}}


def test_snapshot_may_start_at_any_seq() -> None:
    d = Driver(SessionTables())
    d.send(snap(seq=5))
    d.send(Delete("S", 6, "r1"))
    assert d.states["S"].seq == 6


def test_end_emits_end_and_drops_state() -> None:
    d = Driver(SessionTables())
    d.send(snap())
    rows = d.send(End("S", 1))
    assert ops(rows) == [("end", None, None)]
    assert rows[0].seq == 1
    assert "S" not in d.states
    with pytest.raises(Violation) as err:
        d.send(Insert("S", 2, {"id": "r9"}))
    assert err.value.rule == "before_snapshot"
    # The table survives in the change log: end leaves it as it was.
    assert rebuild_tables(d.table())[("site-a", "S")] == {
        "r1": {"id": "r1", "v": 1},
        "r2": {"id": "r2", "v": 2},
    }


def test_sessions_are_independent() -> None:
    d = Driver(SessionTables())
    d.send(snap("A"))
    d.send(snap("B", rows=[]))
    d.send(Insert("B", 1, {"id": "b1"}))
    d.send(Delete("A", 1, "r1"))
    assert rebuild_tables(d.table()) == {
        ("site-a", "A"): {"r2": {"id": "r2", "v": 2}},
        ("site-a", "B"): {"b1": {"id": "b1"}},
    }


# -- violations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("msg", "rule"),
    [
        (Update("S", 2, {"id": "nope"}), "update_missing_row"),
        (Delete("S", 2, "nope"), "delete_missing_row"),
        (Insert("S", 2, {"id": "r1"}), "insert_existing_row"),
        (Insert("S", 3, {"id": "r9"}), "seq_gap"),
        (Insert("S", 1, {"id": "r9"}), "seq_repeat"),  # seq 1 already applied
        (Delete("S", 0, "r1"), "seq_repeat"),  # lower
        (End("S", 5), "seq_gap"),
        (Snapshot("S", 0, [{"id": "a"}, {"id": "a"}]), "insert_existing_row"),
        (Insert("S", 2, {"idx": "r9"}), "row_schema"),  # not via the codec
    ],
)
def test_violation_leaves_state_untouched(msg: SessionMessage, rule: str) -> None:
    d = Driver(SessionTables(inactivity_timeout=timedelta(hours=1)))
    d.send(snap())
    d.send(Insert("S", 1, {"id": "r3"}))
    before = copy.deepcopy(d.states["S"])
    d.ctx.timeout = None
    d.ctx.reset = False
    with pytest.raises(Violation) as err:
        d.send(msg)
    assert err.value.rule == rule
    assert "'S'" in err.value.detail
    assert d.states["S"] == before
    assert d.ctx.timeout is None
    assert not d.ctx.reset


@pytest.mark.parametrize(
    "msg",
    [Insert("S", 1, {"id": "a"}), Update("S", 0, {"id": "a"}), Delete("S", 0, "a"), End("S", 0)],
)
def test_before_snapshot(msg: SessionMessage) -> None:
    d = Driver(SessionTables())
    with pytest.raises(Violation) as err:
        d.send(msg)
    assert err.value.rule == "before_snapshot"
    assert d.states == {}


def test_seq_detail_names_expected_value() -> None:
    d = Driver(SessionTables())
    d.send(snap())
    with pytest.raises(Violation, match=r"seq_gap: session 'S': seq 4 after 0 \(expected 1\)"):
        d.send(Delete("S", 4, "r1"))


def test_on_reset_emits_one_reset_row() -> None:
    proc = SessionTables()
    ctx = FakeContext()
    rows = list(proc.on_reset("S", Violation("seq_gap", "x"), ctx))
    assert len(rows) == 1
    assert (rows[0].op, rows[0].session, rows[0].seq, rows[0].row_id, rows[0].row) == (
        "reset",
        "S",
        -1,
        None,
        None,
    )
    assert rows[0].kafka_ts == T0


def test_reset_empties_the_rebuilt_table() -> None:
    d = Driver(SessionTables())
    d.send(snap())
    d.ctx.offset += 1
    d._collect(d.proc.on_reset("S", Violation("seq_gap", "x"), d.ctx))
    assert rebuild_tables(d.table()) == {("site-a", "S"): {}}


def test_hooks() -> None:
    proc = SessionTables()
    assert proc.record_key(b"sess-1") == "sess-1"
    assert proc.record_key(None) is None
    assert proc.record_key(b"\xff\xfe") is None
    assert proc.starts_session(snap())
    assert not proc.starts_session(Insert("S", 1, {"id": "a"}))
    assert proc.key(End("S9", 1)) == "S9"
    assert proc.initial_state("S") == SessionState()
    assert SessionTables().default_integrity() == Integrity.strict(on_violation="restart_session")
    assert isinstance(proc.default_codec(), SessionCodec)
    assert SessionTables(row_key="pk").default_codec().row_key == "pk"
    types = processor_types(proc)
    assert types.out is SessionChange
    assert types.state is SessionState


def test_state_roundtrips_through_msgpack() -> None:
    d = Driver(SessionTables())
    d.send(snap())
    state = d.states["S"]
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=SessionState) == state


def test_processor_pickles() -> None:
    proc = SessionTables(row_key="pk", inactivity_timeout="1 hour")
    copy_ = pickle.loads(pickle.dumps(proc))
    assert (copy_.row_key, copy_.inactivity_timeout) == ("pk", timedelta(hours=1))


def test_bad_options() -> None:
    with pytest.raises(ConfigError, match="inactivity_timeout"):
        SessionTables(inactivity_timeout=timedelta(0))
    with pytest.raises(ConfigError, match="row_key"):
        SessionTables(row_key="")
    with pytest.raises(ConfigError, match="row_type"):
        SessionTables(row_type="no_such_module_xyz:Row")


# -- inactivity timeout --------------------------------------------------------------------


def test_inactivity_timeout_is_set_on_every_message_and_ends_the_session() -> None:
    d = Driver(SessionTables(inactivity_timeout=timedelta(minutes=30)))
    d.send(snap())
    assert d.ctx.timeout == timedelta(minutes=30)
    d.ctx.timeout = None
    d.send(Insert("S", 1, {"id": "r3"}))
    assert d.ctx.timeout == timedelta(minutes=30)
    # The engine calls on_timeout with the context of the key's last record.
    d.ctx.reset = False
    rows = list(d.proc.on_timeout(d.states["S"], "S", d.ctx))
    assert ops(rows) == [("end", None, None)]
    assert rows[0].seq == 1
    assert d.ctx.reset


def test_end_message_clears_the_timeout() -> None:
    d = Driver(SessionTables(inactivity_timeout=timedelta(minutes=30)))
    d.send(snap())
    d.send(End("S", 1))
    assert d.ctx.cleared and d.ctx.timeout is None


def test_no_timeout_requests_without_the_option() -> None:
    d = Driver(SessionTables())
    d.send(snap())
    d.send(End("S", 1))
    assert d.ctx.timeout is None and not d.ctx.cleared


# -- typed rows ----------------------------------------------------------------------------


@dataclasses.dataclass
class Item:
    id: str
    name: str
    qty: int = 0
    when: datetime | None = None


class StructItem(msgspec.Struct):
    id: str
    price: float


def test_typed_rows_have_real_columns() -> None:
    proc = SessionTables(row_type=Item)
    out_type = processor_types(proc).out
    assert out_type is proc.out_type
    assert [f.name for f in msgspec.structs.fields(out_type)] == [
        "kafka_ts",
        "session",
        "seq",
        "op",
        "row_id",
        "id",
        "name",
        "qty",
        "when",
    ]
    d = Driver(proc)
    rows = d.send(snap(rows=[{"id": "a", "name": "x", "qty": 2, "when": "2024-01-01T00:00:00Z"}]))
    assert rows[0].op == "clear" and rows[0].name is None
    assert (rows[1].op, rows[1].row_id, rows[1].name, rows[1].qty) == ("insert", "a", "x", 2)
    assert rows[1].when == datetime(2024, 1, 1, tzinfo=UTC)
    rows = d.send(Update("S", 1, {"id": "a", "name": "y"}))
    assert (rows[0].op, rows[0].name, rows[0].qty) == ("update", "y", 0)
    rows = d.send(Delete("S", 2, "a"))
    assert (rows[0].op, rows[0].row_id, rows[0].name) == ("delete", "a", None)
    assert d.states["S"].rows == {}
    # Typed rows pickle by reference (the engine may ship them between processes).
    assert pickle.loads(pickle.dumps(rows[0])) == rows[0]
    assert pickle.loads(pickle.dumps(proc)).out_type is out_type


@pytest.mark.parametrize(
    ("row", "match", "rule"),
    [
        ({"id": "a"}, "missing required field `name`", "row_schema"),
        ({"id": "a", "name": 5}, r"Expected `str`, got `int` - at `\$.name`", "row_schema"),
        # A field the type lacks is the source's schema changing: no policy may skip it.
        ({"id": "a", "name": "x", "colour": "red"}, "not in row_type Item: colour", SCHEMA_DRIFT),
    ],
)
def test_typed_rows_that_do_not_fit(row: dict[str, Any], match: str, rule: str) -> None:
    d = Driver(SessionTables(row_type=Item))
    d.send(snap(rows=[]))
    with pytest.raises(Violation, match=match) as err:
        d.send(Insert("S", 1, row))
    assert err.value.rule == rule
    assert err.value.fatal == (rule == SCHEMA_DRIFT)
    assert d.states["S"] == SessionState(True, 0, {})


def test_typed_struct_rows_and_rebuild() -> None:
    d = Driver(SessionTables(row_type=StructItem))
    d.send(snap(rows=[{"id": "a", "price": 1}]))
    d.send(Insert("S", 1, {"id": "b", "price": 2.5}))
    d.send(Delete("S", 2, "a"))
    expected = {("site-a", "S"): {"b": {"id": "b", "price": 2.5}}}
    assert rebuild_tables(d.table()) == expected
    assert rebuild_tables_duckdb(d.table()) == expected


def test_typed_row_type_must_fit_the_change_log() -> None:
    @dataclasses.dataclass
    class Clash:
        id: str
        op: str

    with pytest.raises(ConfigError, match="'op' clashes"):
        SessionTables(row_type=Clash)
    with pytest.raises(ConfigError, match="no field for the row key 'pk'"):
        SessionTables(row_type=Item, row_key="pk")
    with pytest.raises(ConfigError, match=r"dataclass, msgspec\.Struct or NamedTuple"):
        SessionTables(row_type=int)


def test_row_type_from_reference() -> None:
    proc = SessionTables(row_type=f"{__name__}:Item")
    assert proc.row_type is Item


# -- rebuild -------------------------------------------------------------------------------


def _random_run(seed: int) -> tuple[Driver, dict[tuple[str, str], dict[str, Any]]]:
    """Random sessions on two topics; returns the driver and the expected tables."""
    rng = random.Random(seed)
    proc = SessionTables()
    drivers = {t: Driver(proc) for t in ("site-a", "site-b")}
    drivers["site-b"].ctx.topic = "site-b"
    expected: dict[tuple[str, str], dict[str, Any]] = {}
    seqs: dict[tuple[str, str], int] = {}
    for _ in range(600):
        topic = rng.choice(list(drivers))
        d = drivers[topic]
        session = f"s{rng.randrange(8)}"
        key = (topic, session)
        table = expected.get(key)
        if key not in seqs or rng.random() < 0.03:
            rows: list[dict[str, Any]] = [
                {"id": f"r{i}", "v": rng.random()} for i in range(rng.randrange(4))
            ]
            d.send(Snapshot(session, 0, rows))
            expected[key] = {r["id"]: r for r in rows}
            seqs[key] = 0
            continue
        seq = seqs[key] + 1
        assert table is not None
        choice = rng.random()
        if choice < 0.02:
            d.send(End(session, seq))
            del seqs[key]
        elif choice < 0.4 or not table:
            rid = f"r{rng.randrange(1000)}"
            while rid in table:
                rid += "x"
            row = {"id": rid, "v": rng.random()}
            d.send(Insert(session, seq, row))
            table[rid] = row
            seqs[key] = seq
        elif choice < 0.75:
            rid = rng.choice(sorted(table))
            row = {"id": rid, "v": rng.random(), "n": seq}
            d.send(Update(session, seq, row))
            table[rid] = row
            seqs[key] = seq
        else:
            rid = rng.choice(sorted(table))
            d.send(Delete(session, seq, rid))
            del table[rid]
            seqs[key] = seq
    merged = Driver(proc)
    merged.out = drivers["site-a"].out + drivers["site-b"].out
    return merged, expected


def test_rebuild_random_sessions_any_row_order(tmp_path: Path) -> None:
    d, expected = _random_run(7)
    table = d.table()
    assert rebuild_tables(table) == expected
    assert rebuild_tables_duckdb(table) == expected
    shuffled = table.take(random.Random(1).sample(range(table.num_rows), table.num_rows))
    assert rebuild_tables(shuffled) == expected
    assert rebuild_tables_duckdb(shuffled) == expected
    # A hive-partitioned Parquet dataset on disk, as the Parquet sink lays it out.
    root = tmp_path / "changes"
    pq.write_to_dataset(table, root, partition_cols=["topic"])
    (root / "_inorder").mkdir()
    pq.write_table(table, root / "_inorder" / "staged.parquet")  # must be ignored
    assert rebuild_tables(str(root)) == expected
    assert rebuild_tables_duckdb(str(root)) == expected
    # A Delta table is read through its log (files it removed must not count).
    from deltalake import write_deltalake

    delta = tmp_path / "delta"
    write_deltalake(str(delta), table.slice(0, 50), partition_by=["topic"])
    write_deltalake(str(delta), table, mode="overwrite", partition_by=["topic"])
    assert rebuild_tables(str(delta)) == expected


def test_rebuild_rejects_non_change_logs() -> None:
    with pytest.raises(Exception, match="missing column"):
        rebuild_tables(pa.table({"x": [1]}))


# -- materialization -----------------------------------------------------------------------


def test_materialize() -> None:
    d = Driver(SessionTables())
    d.send(snap(rows=[{"id": "b"}, {"id": "a"}]))
    assert materialize("S", d.states["S"]) == [
        TableRow("S", 0, "a", '{"id":"a"}'),
        TableRow("S", 0, "b", '{"id":"b"}'),
    ]
    assert materialize("S", SessionState()) == []
    assert d.proc.table(d.states["S"]) == {"a": {"id": "a"}, "b": {"id": "b"}}
    assert [b for b in range(7) if due(b, 3)] == [2, 5]
