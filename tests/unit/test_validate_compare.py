"""validate's row comparison: the Arrow shortcut for equal chunks finds what the row-by-row
comparison finds."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from inorder.ops.validate_compare import Comparer
from inorder.ops.validate_report import PartitionDiff


def _table(offsets: list[int], values: list[object], **cols: pa.Array) -> pa.Table:
    return pa.table({"offset": pa.array(offsets, pa.int64()), "v": values, **cols})


def _compare(expected: pa.Table, actual: pa.Table, shortcut: bool) -> PartitionDiff:
    diff = PartitionDiff("t", 0, 0, None)
    comparer = Comparer(diff, keep_rows=False)
    if not shortcut:
        comparer._same_rows = lambda e, a: False  # type: ignore[method-assign]
    comparer.compare(expected, actual)
    comparer.finish()
    return diff


CASES = {
    "equal": (_table([0, 1, 1], ["a", "b", "c"]), _table([0, 1, 1], ["a", "b", "c"])),
    "reordered within an offset": (
        _table([0, 1, 1], ["a", "b", "c"]),
        _table([0, 1, 1], ["a", "c", "b"]),
    ),
    "different": (_table([0, 1], ["a", "b"]), _table([0, 1], ["a", "x"])),
    "missing": (_table([0, 1], ["a", "b"]), _table([0], ["a"])),
    "extra, batch_id ignored": (
        _table([0], ["a"]),
        _table([0, 2], ["a", "z"], batch_id=pa.array([0, 1], pa.int64())),
    ),
    "dictionary-encoded output column": (
        _table([0, 1], ["a", "b"]),
        _table([0, 1], pa.array(["a", "b"]).dictionary_encode()),
    ),
    "NaN": (_table([0], [float("nan")]), _table([0], [float("nan")])),
    "aware against naive timestamps": (
        _table([0], [dt.datetime(2024, 1, 1, tzinfo=dt.UTC)]),
        _table([0], pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us"))),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_shortcut_finds_what_rows_find(case: str) -> None:
    expected, actual = CASES[case]
    fast, slow = _compare(expected, actual, True), _compare(expected, actual, False)
    assert repr(fast) == repr(slow)  # repr: NaN samples are equal as text only


def test_equal_chunks_are_counted_without_python_rows() -> None:
    expected = _table([0, 1], ["a", "b"])
    diff = PartitionDiff("t", 0, 0, None)
    comparer = Comparer(diff, keep_rows=False)
    comparer._rows = None  # type: ignore[assignment]  # the shortcut must not need it
    comparer.compare(expected, expected)
    assert (diff.expected_rows, diff.actual_rows, diff.samples) == (2, 2, [])
