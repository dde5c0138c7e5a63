"""A bucket settled in Arrow only when the Python comparison finds nothing, with its counts.

Each case compares :func:`matches` with the Python comparison of
:func:`~inorder.sessions.tables_check_rows.compare_bucket` on a small change log: a match
gives the same row and version counts; any damage the Python comparison reports makes
:func:`matches` give up, so no finding can be lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from inorder.sessions import tables_check_rows
from inorder.sessions.tables_check_fast import matches
from inorder.sessions.tables_check_log import ChangeLogView, RowFormat, TableCheck
from inorder.sessions.tables_check_rows import RowFindings, compare_bucket
from inorder.sessions.tables_check_spill import POSITION

# (batch, partition, offset, session, op, row_id, row)
CHANGES = [
    (0, 0, 1, "s1", "clear", None, None),
    (0, 0, 1, "s1", "insert", "a", '{"v": 1}'),
    (0, 0, 1, "s1", "insert", "b", '{"v": 2}'),
    (0, 0, 2, "s2", "insert", "x", '{"v": 9}'),
    (1, 0, 3, "s1", "update", "a", '{"v": 3}'),
    (1, 0, 4, "s1", "delete", "b", None),
    (1, 0, 5, "s2", "clear", None, None),
    (1, 0, 5, "s2", "insert", "y", '{"v": 7}'),
    (2, 0, 6, "s1", "end", None, None),
]


def change_log(end: str = "keep") -> ChangeLogView:
    batch, part, offset, session, op, row_id, row = zip(*CHANGES, strict=True)
    n = len(CHANGES)
    table = pa.table(
        {
            "topic": pa.array(["t"] * n),
            "partition": pa.array(part, pa.int32()),
            "offset": pa.array(offset, pa.int64()),
            "session": pa.array(session),
            "op": pa.array(op),
            "row_id": pa.array(row_id, pa.string()),
            "row": pa.array(row, pa.string()),
            "batch_id": pa.array(batch, pa.int64()),
        }
    )
    fmt = RowFormat(table.schema, True, pa.schema([("row", pa.string())]))
    return ChangeLogView(table, 2, end, fmt)  # type: ignore[arg-type]


def current(rows: list[tuple[str, str, str | None]]) -> pa.Table:
    return pa.table(
        {
            "topic": pa.array(["t"] * len(rows)),
            "partition": pa.array([0] * len(rows), pa.int32()),
            "session": pa.array([r[0] for r in rows]),
            "row_id": pa.array([r[1] for r in rows]),
            "row": pa.array([r[2] for r in rows], pa.string()),
            POSITION: pa.array(range(len(rows)), pa.int64()),
        }
    )


def history(rows: list[tuple[str, str, str, int, int | None, bool | None]]) -> pa.Table:
    session, row_id, row, start, end, is_current = (list(c) for c in zip(*rows, strict=True))
    return pa.table(
        {
            "topic": pa.array(["t"] * len(rows)),
            "partition": pa.array([0] * len(rows), pa.int32()),
            "session": pa.array(session),
            "row_id": pa.array(row_id),
            "row": pa.array(row, pa.string()),
            "valid_from_offset": pa.array(start, pa.int64()),
            "valid_to_offset": pa.array(end, pa.int64()),
            "is_current": pa.array(is_current, pa.bool_()),
            POSITION: pa.array(range(len(rows)), pa.int64()),
        }
    )


LIVE = [("s1", "a", '{"v": 3}'), ("s2", "y", '{"v": 7}')]
VERSIONS = [
    ("s1", "a", '{"v": 1}', 1, 3, False),
    ("s1", "b", '{"v": 2}', 1, 4, False),
    ("s2", "x", '{"v": 9}', 2, 5, False),
    ("s1", "a", '{"v": 3}', 3, None, True),
    ("s2", "y", '{"v": 7}', 5, None, True),
]


def in_python(data: pa.Table, log: ChangeLogView, hist: bool) -> TableCheck:
    """The Python comparison's report of the bucket (Arrow kept out)."""
    found = RowFindings()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tables_check_rows, "matches", lambda *args: None)
        compare_bucket(found, data, log, 2, hist)
    check = TableCheck("history" if hist else "current", "p")
    found.report(check)
    return check


def test_a_matching_bucket_is_settled_with_the_python_counts() -> None:
    log = change_log()
    for data, hist in ((current(LIVE), False), (history(VERSIONS), True)):
        python = in_python(data, log, hist)
        assert python.ok, python.differences
        assert matches(data, log, 2, hist) == (python.rows, python.versions)
    assert matches(history(VERSIONS), log, 2, True) == (2, 5)
    # The rows as of an earlier batch: b still there, a at its first value.
    assert matches(current([("s1", "a", '{"v": 1}'), ("s1", "b", '{"v": 2}'),
                            ("s2", "x", '{"v": 9}')]), log, 0, False) == (3, 0)  # fmt: skip


def test_ends_that_drop_the_session_are_rebuilt_as_clears() -> None:
    log = change_log("drop")
    data = current([("s2", "y", '{"v": 7}')])
    assert in_python(data, log, False).ok
    assert matches(data, log, 2, False) == (1, 0)
    assert matches(current(LIVE), log, 2, False) is None


def _swap(rows: list[Any], i: int, row: Any) -> list[Any]:
    return [*rows[:i], row, *rows[i + 1 :]]


DAMAGED_CURRENT: dict[str, Callable[[], list[tuple[str, str, str | None]]]] = {
    "missing": lambda: LIVE[:1],
    "extra": lambda: [*LIVE, ("s1", "b", '{"v": 2}')],
    "different": lambda: _swap(LIVE, 0, ("s1", "a", '{"v": 4}')),
    "held twice": lambda: [*LIVE, LIVE[0]],
    "same data, other text": lambda: _swap(LIVE, 0, ("s1", "a", '{"v":3}')),
    "null key": lambda: _swap(LIVE, 1, ("s2", None, '{"v": 7}')),  # type: ignore[list-item]
}

DAMAGED_HISTORY: dict[str, Callable[[], list[Any]]] = {
    "version missing": lambda: VERSIONS[1:],
    "version held twice": lambda: [*VERSIONS, VERSIONS[0]],
    "wrong is_current": lambda: _swap(VERSIONS, 0, ("s1", "a", '{"v": 1}', 1, 3, True)),
    "null is_current": lambda: _swap(VERSIONS, 1, ("s1", "b", '{"v": 2}', 1, 4, None)),
    "overlap": lambda: _swap(VERSIONS, 0, ("s1", "a", '{"v": 1}', 1, 4, False)),
    "open overlap": lambda: _swap(VERSIONS, 0, ("s1", "a", '{"v": 1}', 1, None, True)),
    "version different": lambda: _swap(VERSIONS, 2, ("s2", "x", '{"v": 8}', 2, 5, False)),
    "open row different": lambda: _swap(VERSIONS, 4, ("s2", "y", '{"v": 1}', 5, None, True)),
}


@pytest.mark.parametrize("case", sorted(DAMAGED_CURRENT))
def test_damage_to_live_rows_is_left_to_python(case: str) -> None:
    log, data = change_log(), current(DAMAGED_CURRENT[case]())
    if case != "same data, other text":
        assert not in_python(data, log, False).ok
    assert matches(data, log, 2, False) is None


@pytest.mark.parametrize("case", sorted(DAMAGED_HISTORY))
def test_damage_to_versions_is_left_to_python(case: str) -> None:
    log, data = change_log(), history(DAMAGED_HISTORY[case]())
    assert not in_python(data, log, True).ok
    assert matches(data, log, 2, True) is None
