"""Row-by-row comparison of one partition's recomputed and output rows (``validate``).

Rows are matched per offset as multisets (see :mod:`inorder.ops.validate`); chunks whose two
sides are equal in Arrow, row for row, are counted without building Python rows.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from inorder.ops.validate_report import PartitionDiff

_SAMPLES = 5


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


class Comparer:
    """Accumulates the row-by-row comparison of one partition."""

    def __init__(self, diff: PartitionDiff, keep_rows: bool) -> None:
        self.diff = diff
        self.keep_rows = keep_rows
        self.exp_left: Counter[int] = Counter()
        self.act_left: Counter[int] = Counter()
        self.act_rows: Counter[tuple[int, Any]] = Counter()
        self.columns: list[str] | None = None

    def _rows(self, table: pa.Table | None) -> list[tuple[int, Any, dict[str, Any]]]:
        if table is None or table.num_rows == 0:
            return []
        if self.columns is None:
            self.columns = [c for c in table.column_names if c != "batch_id"]
        cols = [c for c in self.columns if c in table.column_names]
        out = []
        for row in table.select(cols).to_pylist():
            out.append((int(row["offset"]), _freeze(row), row))
        return out

    def _sample(self, kind: str, offset: int, row: dict[str, Any]) -> None:
        if len(self.diff.samples) < _SAMPLES * 2:
            self.diff.samples.append(
                {"kind": kind, "offset": offset, "row": {k: _jsonable(v) for k, v in row.items()}}
            )

    def _same_rows(self, expected: pa.Table | None, actual: pa.Table | None) -> bool:
        """Whether both sides hold equal rows in the same order, checked in Arrow.

        A clean output is read back in the order it was computed, so this settles most
        chunks without turning rows into Python objects. Columns must match by name and type
        (an output's dictionary-encoded column is decoded first); anything else, unequal
        floats such as NaN included, goes to the row-by-row comparison, which alone decides
        what differs.
        """
        if expected is None or actual is None or not expected.num_rows:
            return False
        if expected.num_rows != actual.num_rows:
            return False
        if self.columns is None:
            self.columns = [c for c in expected.column_names if c != "batch_id"]
        cols = [c for c in self.columns if c in expected.column_names]
        if cols != [c for c in self.columns if c in actual.column_names]:
            return False
        for name in cols:
            exp, act = expected.column(name), actual.column(name)
            if pa.types.is_dictionary(act.type) and not pa.types.is_dictionary(exp.type):
                act = act.cast(act.type.value_type)
            if exp.type != act.type or not exp.equals(act):
                return False
        return True

    def compare(self, expected: pa.Table | None, actual: pa.Table | None) -> None:
        if self._same_rows(expected, actual):
            assert expected is not None
            self.diff.expected_rows += expected.num_rows
            self.diff.actual_rows += expected.num_rows
            return
        exp_rows = self._rows(expected)
        self.columns = self.columns  # expected (when present) fixes the compared columns
        act_rows = self._rows(actual)
        self.diff.expected_rows += len(exp_rows)
        self.diff.actual_rows += len(act_rows)
        exp = Counter((o, f) for o, f, _ in exp_rows)
        act = Counter((o, f) for o, f, _ in act_rows)
        exp_only = exp - act
        act_only = act - exp
        if not exp_only and not act_only:
            return
        raw = {(o, f): r for o, f, r in exp_rows + act_rows}
        for (offset, frozen), n in exp_only.items():
            self.exp_left[offset] += n
            self._sample("expected_only", offset, raw[(offset, frozen)])
        for (offset, frozen), n in act_only.items():
            self.act_left[offset] += n
            if self.keep_rows:
                self.act_rows[(offset, frozen)] += n
            self._sample("output_only", offset, raw[(offset, frozen)])

    def late(self, table: pa.Table | None, from_offset: int) -> None:
        """Expected rows emitted after their offset's range was compared (timeouts)."""
        for offset, frozen, row in self._rows(table):
            if offset < from_offset:
                continue
            self.diff.expected_rows += 1
            if self.act_rows[(offset, frozen)] > 0:
                self.act_rows[(offset, frozen)] -= 1
                self.act_left[offset] -= 1
                self.diff.samples = [
                    s
                    for s in self.diff.samples
                    if not (s["kind"] == "output_only" and s["offset"] == offset)
                ]
            else:
                self.exp_left[offset] += 1
                self._sample("expected_only", offset, row)

    def finish(self) -> None:
        d = self.diff
        for offset in sorted(set(self.exp_left) | set(self.act_left)):
            e, a = self.exp_left[offset], self.act_left[offset]
            if not e and not a:
                continue
            both = min(e, a)
            d.different += both
            d.missing += e - both
            d.extra += a - both
            if d.first_offset is None:
                d.first_offset = offset


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)
