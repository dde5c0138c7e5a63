"""The Quix benchmark contender's pure parts: state round trip, change rows, output check."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pyarrow as pa
from bench._quix import first_difference, summary
from bench.quix_sessions import change_columns, state_from_builtins, state_to_builtins

from inorder.sessions.processor import SessionChange, SessionState

TS = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def _rows(rows: list[tuple[object, ...]], ts_type: pa.DataType | None = None) -> pa.Table:
    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("kafka_ts", ts_type or pa.timestamp("us", tz="UTC")),
            ("session", pa.string()),
            ("seq", pa.int64()),
            ("op", pa.string()),
            ("row_id", pa.string()),
            ("row", pa.string()),
        ]
    )
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema)


ROWS = [
    ("t", 0, 0, TS, "s1", 0, "clear", None, None),
    ("t", 0, 0, TS, "s1", 0, "insert", "r1", '{"id":"r1"}'),
    ("t", 1, 5, TS, "s2", -1, "reset", None, None),
]


def test_state_round_trip_keeps_rows_started_and_seq() -> None:
    state = SessionState(started=True, seq=7, rows={"r1": '{"id":"r1"}'})
    back = state_from_builtins(state_to_builtins(state))
    assert back == state
    assert state_to_builtins(SessionState()) == {"started": False, "seq": -1, "rows": {}}


def test_change_columns_put_the_origin_in_front_of_each_change() -> None:
    changes = [
        SessionChange(TS, "s1", 0, "clear"),
        SessionChange(TS, "s1", 0, "insert", "r1", "{}"),
    ]
    cols = change_columns("t", 3, [(10, changes), (11, [])])
    assert cols[0] == ["t", "t"] and cols[1] == [3, 3] and cols[2] == [10, 10]
    assert cols[6] == ["clear", "insert"] and cols[7] == [None, "r1"] and cols[8] == [None, "{}"]


def test_same_rows_in_another_order_and_time_unit_are_equal() -> None:
    inorder = _rows(ROWS).append_column("batch_id", pa.array([0, 0, 1], pa.int64()))
    other = _rows(list(reversed(ROWS)), pa.timestamp("ms", tz="UTC"))
    assert first_difference(inorder, other) is None


def test_the_same_instant_in_another_time_zone_is_equal() -> None:
    shifted = [(*r[:3], r[3].astimezone(timezone(timedelta(hours=2))), *r[4:]) for r in ROWS]
    assert first_difference(_rows(ROWS), _rows(shifted, pa.timestamp("us", tz="+02:00"))) is None


def test_a_different_row_is_named() -> None:
    changed = [*ROWS[:1], ("t", 0, 0, TS, "s1", 0, "insert", "r1", '{"id":"r2"}'), ROWS[2]]
    diff = first_difference(_rows(ROWS), _rows(changed))
    assert diff is not None and "sorted row 1" in diff and "r2" in diff


def test_a_missing_row_is_named() -> None:
    diff = first_difference(_rows(ROWS), _rows(ROWS[:2]))
    assert diff is not None and "3 rows expected, 2 got" in diff and "missing" in diff


def test_a_shifted_timestamp_is_a_difference() -> None:
    later = [(*ROWS[0][:3], TS + timedelta(milliseconds=1), *ROWS[0][4:]), *ROWS[1:]]
    assert first_difference(_rows(ROWS), _rows(later)) is not None


def test_summary_counts_from_the_process_start() -> None:
    event = {
        "event": "quix",
        "records": 4,
        "rows": 9,
        "first_message": 102.0,
        "commits": [[103.0, 2], [104.5, 2], [105.0, 0]],
    }
    got = summary([{"event": "other"}, event], 100.0, 4)
    assert got["startup"] == 2.0 and got["first_commit"] == 3.0 and got["batches"] == 2
    assert got["commits"] == [(3.0, 2), (4.5, 2)]
