"""The batch planner of the current/history session tables against a reference model.

Random change logs follow the session-table rules (snapshots re-listing some rows, inserts,
updates, deletes, resets, ends, restarts) and are applied in batches to in-memory tables
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
from inorder.sessions.tables_plan import (
    BatchPlan,
    ChangeColumns,
    Close,
    EndMode,
    Version,
    apply_live,
    plan_batch,
)

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

    def live(self, kind: str) -> dict[tuple[str, str], set[str]]:
        keys = (
            list(self.current)
            if kind == "current"
            else [(v["topic"], v["session"], v["row_id"]) for v in self.history if v["current"]]
        )
        live: dict[tuple[str, str], set[str]] = {}
        for topic, session, rid in keys:
            live.setdefault((topic, session), set()).add(rid)
        return live

    def merge(self, kind: str, plan: BatchPlan, changes: list[dict[str, Any]], last: int) -> None:
        if kind == "current":
            for key in plan.deletes:
                del self.current[key]
            for i in plan.upserts:
                c = changes[i]
                self.current[(c["topic"], c["session"], c["row_id"])] = c
        else:
            for close in plan.closes:
                self._close(close, changes)
            for v in plan.versions:
                self.history.append(_version(v, changes))
        self.committed[kind] = last

    def _close(self, close: Close, changes: list[dict[str, Any]]) -> None:
        matches = [
            v
            for v in self.history
            if v["current"] and (v["topic"], v["session"], v["row_id"]) == close.key
        ]
        assert len(matches) == 1, f"close of {close.key}: {len(matches)} open versions"
        end = changes[close.index]
        matches[0].update(current=False, to=end["offset"], to_ts=end["kafka_ts"])
        matches[0]["closed_by"] = close.closed_by


def _version(v: Version, changes: list[dict[str, Any]]) -> dict[str, Any]:
    c = changes[v.index]
    end = None if v.closed_at is None else changes[v.closed_at]
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
        "closed_by": v.closed_by,
    }


def run_batches(
    log: pa.Table, end: EndMode, restarts: set[int], behind: set[int], reruns: set[int]
) -> ModelTables:
    """Apply the log batch by batch as the writer does; returns the tables."""
    model = ModelTables()
    live: dict[str, dict[tuple[str, str], set[str]] | None] = {"current": None, "history": None}
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
                columns = ChangeColumns(
                    *(ordered.column(c).to_pylist() for c in ("topic", "session", "op", "row_id"))
                )
                known = live[kind]
                assert known is not None
                plan = plan_batch(known, columns, end)
                model.merge(kind, plan, ordered.to_pylist(), b)
                apply_live(known, plan)
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
        st.integers(0, 5),
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


def after(plan: BatchPlan, live: dict[tuple[str, str], set[str]]) -> dict[Any, set[str]]:
    apply_live(live, plan)
    return live


def test_snapshot_closes_unlisted_rows_and_reopens_listed_ones() -> None:
    changes = ChangeColumns(
        topics=["t"] * 4,
        sessions=["s"] * 4,
        ops=["clear", "insert", "update", "end"],
        row_ids=[None, "a", "b", None],
    )
    plan = plan_batch({("t", "s"): {"a", "b", "c"}}, changes, end="drop")
    assert sorted((c.key[2], c.index, c.closed_by) for c in plan.closes) == [
        ("a", 0, "snapshot"),
        ("b", 0, "snapshot"),
        ("c", 0, "snapshot"),
    ]
    assert plan.versions == [Version(1, 3, "end"), Version(2, 3, "end")]
    assert sorted(plan.deletes) == [("t", "s", "a"), ("t", "s", "b"), ("t", "s", "c")]
    assert plan.upserts == [] and after(plan, {("t", "s"): {"a", "b", "c"}}) == {}

    kept = plan_batch({("t", "s"): {"a", "b", "c"}}, changes, end="keep")
    assert kept.upserts == [1, 2] and sorted(kept.deletes) == [("t", "s", "c")]
    assert kept.versions == [Version(1), Version(2)]


def test_untouched_rows_are_not_written() -> None:
    changes = ChangeColumns(["t", "t"], ["s", "s"], ["update", "delete"], ["a", "b"])
    plan = plan_batch({("t", "s"): {"a", "b", "c"}}, changes)
    assert plan.upserts == [0] and plan.deletes == [("t", "s", "b")]
    assert [c.closed_by for c in plan.closes] == ["update", "delete"]
    assert after(plan, {("t", "s"): {"a", "b", "c"}}) == {("t", "s"): {"a", "c"}}


def test_refuses_what_is_not_a_change_log() -> None:
    with pytest.raises(ValueError, match="unknown op 'upsert'"):
        plan_batch({}, ChangeColumns(["t"], ["s"], ["upsert"], ["a"]))
    with pytest.raises(ValueError, match="update without a row_id"):
        plan_batch({}, ChangeColumns(["t"], ["s"], ["update"], [None]))
    with pytest.raises(ValueError, match="end must be"):
        plan_batch({}, ChangeColumns([], [], [], []), end="forget")  # type: ignore[arg-type]
