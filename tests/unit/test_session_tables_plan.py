"""The batch planner of the current/history session tables against a reference model.

Random change logs follow the session-table rules (snapshots re-listing some rows, inserts,
updates, deletes, truncates, resets, ends, restarts) and are applied in batches to in-memory tables
the way the Delta MERGEs apply a plan (upsert/delete by key; close the open version of a
key, insert new versions), with restarts (row ids read back from the tables), a table left
behind and caught up, and re-run batches. The current table must equal ``rebuild_tables`` of
the change log; the history table, filtered as of every offset and every timestamp, must
equal the change log rebuilt up to there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inorder.schema import output_schema
from inorder.sessions import SessionChange, rebuild_tables
from inorder.sessions.rebuild import ordered_changes
from inorder.sessions.tables_plan import BatchPlan, EndMode, live_table, no_live, plan_batch

SCHEMA = output_schema(SessionChange)
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
SESSIONS = 5


@dataclass
class _Session:
    topic: str
    partition: int
    name: str
    started: bool = False
    seq: int = -1
    rows: dict[str, str] = field(default_factory=dict)


def change_log(steps: list[tuple[int, int, int, int]], cuts: list[int]) -> pa.Table:
    """Change rows as SessionTables writes them; ``cuts`` are batch sizes in messages."""
    sessions = [_Session(f"t{i % 2}", i % 3, f"s{i}") for i in range(SESSIONS)]
    offsets: dict[tuple[str, int], int] = {}
    rows: list[dict[str, Any]] = []
    batch, left = 0, cuts[0] if cuts else len(steps)
    counter = 0
    for n, (who, kind, pick, size) in enumerate(steps):
        if left == 0:
            batch += 1
            left = cuts[batch] if batch < len(cuts) else len(steps)
        left -= 1
        s = sessions[who % SESSIONS]
        offset = offsets.get((s.topic, s.partition), 0)
        offsets[(s.topic, s.partition)] = offset + 1
        ts = EPOCH + timedelta(seconds=n)

        head = {"topic": s.topic, "partition": s.partition, "offset": offset, "kafka_ts": ts}
        head["batch_id"] = batch

        def emit(
            op: str,
            rid: str | None = None,
            row: str | None = None,
            s: _Session = s,
            head: dict[str, Any] = head,
        ) -> None:
            rows.append(
                {**head, "session": s.name, "seq": s.seq, "op": op, "row_id": rid, "row": row}
            )

        def value(rid: str) -> str:
            nonlocal counter
            counter += 1
            return msgspec.json.encode({"id": rid, "v": counter}).decode()

        if kind == 5:
            s.started, s.rows, s.seq = False, {}, -1
            emit("reset")
            continue
        if not s.started or kind == 0:
            s.started, s.seq = True, 0
            # Snapshots list rows of a small pool: a restart re-lists some, drops others.
            ids = sorted({f"r{(pick + k * 3) % 7}" for k in range(size)})
            s.rows = {rid: value(rid) for rid in ids}
            emit("clear")
            for rid, text in s.rows.items():
                emit("insert", rid, text)
            continue
        if kind == 6:  # the source emptied its table (Debezium's truncate): seq starts again
            s.rows, s.seq = {}, 0
            emit("truncate")
            continue
        s.seq += 1
        rid = f"r{pick % 7}"
        if kind == 4:
            s.started = False
            emit("end")
        elif kind == 1 and rid not in s.rows:
            s.rows[rid] = value(rid)
            emit("insert", rid, s.rows[rid])
        elif kind in (1, 2) and s.rows:
            rid = sorted(s.rows)[pick % len(s.rows)]
            s.rows[rid] = value(rid)
            emit("update", rid, s.rows[rid])
        elif s.rows:
            rid = sorted(s.rows)[pick % len(s.rows)]
            del s.rows[rid]
            emit("delete", rid)
        else:
            s.seq -= 1
    return pa.Table.from_pylist(rows, schema=SCHEMA)


class ModelTables:
    """The two tables in memory, changed exactly as the MERGEs change the Delta tables."""

    def __init__(self) -> None:
        self.current: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.history: list[dict[str, Any]] = []
        self.committed = {"current": -1, "history": -1}

    def live(self, kind: str) -> pa.Table:
        keys = (
            list(self.current)
            if kind == "current"
            else [(v["topic"], v["session"], v["row_id"]) for v in self.history if v["current"]]
        )
        if not keys:
            return no_live()
        topics, sessions, row_ids = zip(*keys, strict=True)
        return live_table(pa.table({"topic": topics, "session": sessions, "row_id": row_ids}))

    def merge(self, kind: str, plan: BatchPlan, changes: list[dict[str, Any]], last: int) -> None:
        if kind == "current":
            for d in plan.deletes.to_pylist():
                del self.current[(d["topic"], d["session"], d["row_id"])]
            for i in plan.upserts.to_pylist():
                c = changes[i]
                self.current[(c["topic"], c["session"], c["row_id"])] = c
        else:
            for close in plan.closes.to_pylist():
                self._close(close, changes)
            for v in plan.versions.to_pylist():
                self.history.append(_version(v, changes))
        self.committed[kind] = last

    def _close(self, close: dict[str, Any], changes: list[dict[str, Any]]) -> None:
        key = (close["topic"], close["session"], close["row_id"])
        matches = [
            v
            for v in self.history
            if v["current"] and (v["topic"], v["session"], v["row_id"]) == key
        ]
        assert len(matches) == 1, f"close of {key}: {len(matches)} open versions"
        end = changes[close["index"]]
        matches[0].update(current=False, to=end["offset"], to_ts=end["kafka_ts"])
        matches[0]["closed_by"] = close["closed_by"]


def _version(v: dict[str, Any], changes: list[dict[str, Any]]) -> dict[str, Any]:
    c = changes[v["index"]]
    end = None if v["closed_at"] is None else changes[v["closed_at"]]
    return {
        "topic": c["topic"],
        "partition": c["partition"],
        "session": c["session"],
        "row_id": c["row_id"],
        "row": c["row"],
        "from": c["offset"],
        "from_ts": c["kafka_ts"],
        "to": None if end is None else end["offset"],
        "to_ts": None if end is None else end["kafka_ts"],
        "current": end is None,
        "closed_by": v["closed_by"],
    }


def run_batches(
    log: pa.Table, end: EndMode, restarts: set[int], behind: set[int], reruns: set[int]
) -> ModelTables:
    """Apply the log batch by batch as the writer does; returns the tables."""
    model = ModelTables()
    live: dict[str, pa.Table | None] = {"current": None, "history": None}
    through = {"current": -1, "history": -1}
    last = max(log.column("batch_id").to_pylist(), default=-1)
    for b in range(last + 1):
        for kind in ("current", "history"):
            if b in behind and kind == "history":
                continue  # crashed before this table's commit
            for _ in range(2 if b in reruns else 1):
                if b in restarts or live[kind] is None:
                    live[kind] = model.live(kind)
                    through[kind] = model.committed[kind]
                if through[kind] >= b:
                    continue  # the re-run of a committed batch
                first = through[kind] + 1
                window = log.filter(
                    pc.and_(
                        pc.greater_equal(log.column("batch_id"), first),
                        pc.less_equal(log.column("batch_id"), b),
                    )
                )
                ordered = ordered_changes(window)
                known = live[kind]
                assert known is not None
                plan = plan_batch(known, ordered, end)
                model.merge(kind, plan, ordered.to_pylist(), b)
                # The keys the plan says are live are the ones the tables hold.
                assert _keys(plan.live) == _keys(model.live(kind))
                live[kind] = plan.live
                through[kind] = b
    return model


def reference(log: pa.Table, end: EndMode) -> dict[tuple[str, str], dict[str, Any]]:
    """``rebuild_tables``, with ``end`` emptying a session under ``end='drop'``."""
    if end == "drop":
        ops = pc.if_else(pc.equal(log.column("op"), "end"), "clear", log.column("op"))
        log = log.set_column(log.schema.get_field_index("op"), "op", ops)
    return {k: rows for k, rows in rebuild_tables(log).items() if rows} if log.num_rows else {}


def as_tables(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        out.setdefault((r["topic"], r["session"]), {})[r["row_id"]] = msgspec.json.decode(r["row"])
    return out


def check(log: pa.Table, model: ModelTables, end: EndMode) -> None:
    assert as_tables(list(model.current.values())) == reference(log, end)
    assert as_tables([v for v in model.history if v["current"]]) == reference(log, end)
    for v in model.history:
        assert v["to"] is None or v["to"] >= v["from"]
    # As of every offset of every partition: the versions valid there are its table.
    parts = set(
        zip(log.column("topic").to_pylist(), log.column("partition").to_pylist(), strict=True)
    )
    for topic, partition in parts:
        mine = log.filter(
            pc.and_(
                pc.equal(log.column("topic"), topic), pc.equal(log.column("partition"), partition)
            )
        )
        for offset in sorted(set(mine.column("offset").to_pylist())):
            upto = mine.filter(pc.less_equal(mine.column("offset"), offset))
            as_of = [
                v
                for v in model.history
                if (v["topic"], v["partition"]) == (topic, partition)
                and v["from"] <= offset
                and (v["to"] is None or offset < v["to"])
            ]
            assert as_tables(as_of) == reference(upto, end), f"{topic}/{partition} @ {offset}"
    # As of every time (Kafka timestamps increase with the offsets here).
    for ts in sorted(set(log.column("kafka_ts").to_pylist())):
        upto = log.filter(pc.less_equal(log.column("kafka_ts"), ts))
        as_of = [
            v
            for v in model.history
            if v["from_ts"] <= ts and (v["to_ts"] is None or ts < v["to_ts"])
        ]
        assert as_tables(as_of) == reference(upto, end), f"as of {ts}"


STEPS = st.lists(
    st.tuples(
        st.integers(0, SESSIONS - 1),
        st.integers(0, 6),
        st.integers(0, 20),
        st.integers(0, 4),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    steps=STEPS,
    cuts=st.lists(st.integers(1, 15), max_size=8),
    end=st.sampled_from(["keep", "drop"]),
    restarts=st.sets(st.integers(0, 8)),
    behind=st.sets(st.integers(0, 8)),
    reruns=st.sets(st.integers(0, 8)),
)
def test_tables_equal_the_rebuilt_change_log(
    steps: list[tuple[int, int, int, int]],
    cuts: list[int],
    end: EndMode,
    restarts: set[int],
    behind: set[int],
    reruns: set[int],
) -> None:
    log = change_log(steps, cuts)
    last = max(log.column("batch_id").to_pylist(), default=-1)
    behind.discard(last)  # the last batch is applied: the run ends caught up
    model = run_batches(log, end, restarts, behind, reruns)
    check(log, model, end)


def _keys(live: pa.Table) -> list[tuple[str, str, str]]:
    return sorted((k["topic"], k["session"], k["row_id"]) for k in live.to_pylist())


def changes(ops: list[str], row_ids: list[str | None]) -> pa.Table:
    n = len(ops)
    columns = {"topic": ["t"] * n, "session": ["s"] * n, "op": ops, "row_id": row_ids}
    return pa.table({k: pa.array(v, pa.string()) for k, v in columns.items()})


def live_of(*row_ids: str) -> pa.Table:
    n = len(row_ids)
    return live_table(pa.table({"topic": ["t"] * n, "session": ["s"] * n, "row_id": row_ids}))


def test_snapshot_closes_unlisted_rows_and_reopens_listed_ones() -> None:
    batch = changes(["clear", "insert", "update", "end"], [None, "a", "b", None])
    plan = plan_batch(live_of("a", "b", "c"), batch, end="drop")
    closes = plan.closes.to_pylist()
    assert sorted((c["row_id"], c["index"], c["closed_by"]) for c in closes) == [
        ("a", 0, "snapshot"),
        ("b", 0, "snapshot"),
        ("c", 0, "snapshot"),
    ]
    assert plan.versions.to_pylist() == [
        {"index": 1, "closed_at": 3, "closed_by": "end"},
        {"index": 2, "closed_at": 3, "closed_by": "end"},
    ]
    assert _keys(plan.deletes) == [("t", "s", "a"), ("t", "s", "b"), ("t", "s", "c")]
    assert plan.upserts.to_pylist() == [] and plan.live.num_rows == 0

    kept = plan_batch(live_of("a", "b", "c"), batch, end="keep")
    assert kept.upserts.to_pylist() == [1, 2] and _keys(kept.deletes) == [("t", "s", "c")]
    assert kept.versions.to_pylist() == [
        {"index": 1, "closed_at": None, "closed_by": None},
        {"index": 2, "closed_at": None, "closed_by": None},
    ]
    assert _keys(kept.live) == [("t", "s", "a"), ("t", "s", "b")]


def test_a_truncate_closes_every_open_version_as_truncate() -> None:
    batch = changes(
        ["insert", "truncate", "insert", "clear", "insert"], ["d", None, "a", None, "a"]
    )
    plan = plan_batch(live_of("a", "b"), batch)
    assert plan.closes.to_pylist() == [
        {"topic": "t", "session": "s", "row_id": "a", "index": 1, "closed_by": "truncate"},
        {"topic": "t", "session": "s", "row_id": "b", "index": 1, "closed_by": "truncate"},
    ]
    assert plan.versions.to_pylist() == [
        {"index": 0, "closed_at": 1, "closed_by": "truncate"},
        {"index": 2, "closed_at": 3, "closed_by": "snapshot"},
        {"index": 4, "closed_at": None, "closed_by": None},
    ]
    assert plan.upserts.to_pylist() == [4] and _keys(plan.deletes) == [("t", "s", "b")]


def test_versions_end_at_the_next_change_of_their_key_or_a_wipe() -> None:
    batch = changes(
        ["insert", "update", "insert", "delete", "insert", "reset", "insert", "insert"],
        ["a", "a", "b", "a", "a", None, "b", "c"],
    )
    plan = plan_batch(live_of("z"), batch)
    assert plan.versions.to_pylist() == [
        {"index": 0, "closed_at": 1, "closed_by": "update"},
        {"index": 1, "closed_at": 3, "closed_by": "delete"},
        {"index": 2, "closed_at": 5, "closed_by": "reset"},
        {"index": 4, "closed_at": 5, "closed_by": "reset"},
        {"index": 6, "closed_at": None, "closed_by": None},
        {"index": 7, "closed_at": None, "closed_by": None},
    ]
    assert plan.closes.to_pylist() == [
        {"topic": "t", "session": "s", "row_id": "z", "index": 5, "closed_by": "reset"}
    ]
    assert plan.upserts.to_pylist() == [6, 7] and _keys(plan.deletes) == [("t", "s", "z")]
    assert not plan.empty and plan_batch(no_live(), changes([], [])).empty


def test_untouched_rows_are_not_written() -> None:
    plan = plan_batch(live_of("a", "b", "c"), changes(["update", "delete"], ["a", "b"]))
    assert plan.upserts.to_pylist() == [0] and _keys(plan.deletes) == [("t", "s", "b")]
    assert plan.closes.column("closed_by").to_pylist() == ["update", "delete"]
    assert _keys(plan.live) == [("t", "s", "a"), ("t", "s", "c")]


def test_refuses_what_is_not_a_change_log() -> None:
    with pytest.raises(ValueError, match="change 1 of session 's': unknown op 'upsert'"):
        plan_batch(no_live(), changes(["insert", "upsert", "update"], ["a", "a", None]))
    with pytest.raises(ValueError, match="update without a row_id"):
        plan_batch(no_live(), changes(["insert", "update", "upsert"], ["a", None, "a"]))
    with pytest.raises(ValueError, match="end must be"):
        plan_batch(no_live(), changes([], []), end="forget")  # type: ignore[arg-type]
