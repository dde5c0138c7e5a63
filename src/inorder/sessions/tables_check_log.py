"""What checking the session tables works from: the change log seen batch by batch, and the
report of one table (:mod:`inorder.sessions.tables_check` for Delta tables,
:mod:`inorder.sessions.tables_check_iceberg` for Iceberg ones).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inorder.sessions.rebuild import (
    CLEARING_OPS,
    NON_ROW_COLUMNS,
    ordered_changes,
    rebuild_tables,
)
from inorder.sessions.tables_plan import EndMode

#: Differences shown per table.
SHOWN = 8
_ABSENT = object()
Key = tuple[Any, ...]


@dataclass
class TableCheck:
    """What checking one session table (``current`` or ``history``) found.

    ``last_batch``: the last change-log batch it holds (-1: none); ``first_batch``: where its
    commits' ranges were checked from (0 unless its early commits were cleaned up);
    ``commits``: batch commits on its version's lineage; ``rows`` / ``versions``: live rows /
    history versions of the change log compared; ``missing``, ``extra``, ``different``: live
    rows; ``problems``: other discrepancies by kind; ``differences``: the first
    :data:`SHOWN` of all, for humans; ``pending``: ``[first, last]`` change-log batches the
    next run applies (not a discrepancy).
    """

    table: str
    path: str
    exists: bool = True
    version: int | None = None
    last_batch: int | None = None
    first_batch: int | None = None
    commits: int = 0
    rows: int = 0
    versions: int = 0
    missing: int = 0
    extra: int = 0
    different: int = 0
    problems: dict[str, int] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)
    pending: list[int] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No discrepancy (a catch-up pending is none)."""
        return not (self.missing or self.extra or self.different or any(self.problems.values()))

    def found(self, kind: str, text: str) -> None:
        """Count one discrepancy of ``kind`` and keep its description while few."""
        self.tally(kind, 1)
        self.show(text)

    def tally(self, kind: str, count: int) -> None:
        """Count ``count`` discrepancies of ``kind``."""
        if kind in ("missing", "extra", "different"):
            setattr(self, kind, getattr(self, kind) + count)
        else:
            self.problems[kind] = self.problems.get(kind, 0) + count

    def show(self, text: str) -> None:
        """Keep a discrepancy's description while few are kept."""
        if len(self.differences) < SHOWN:
            self.differences.append(text)

    def lines(self) -> list[str]:
        """Human lines: a status line, then differences and notes indented."""
        head = f"{self.table} table {self.path}: "
        if not self.exists:
            head = "OK    " + head + "not created yet"
        else:
            what = f"{self.rows:,} rows"
            if self.table == "history":
                what = f"{self.rows:,} open rows and {self.versions:,} versions"
            head += (
                f"version {self.version}, batches {self.first_batch}..{self.last_batch} in "
                f"{self.commits} commit(s) checked; {what} of the change log"
            )
            counts = {"missing": self.missing, "extra": self.extra, "different": self.different}
            counts |= self.problems
            found = ", ".join(f"{k} {v:,}" for k, v in counts.items() if v)
            head = f"OK    {head} match" if self.ok else f"DIFF  {head} compared: {found}"
        if self.pending is not None:
            first, last = self.pending
            head += f"; catch-up pending: the next run applies batches {first}..{last}"
        notes = [f"note: {n}" for n in self.notes]
        return [head, *(f"      {d}" for d in [*self.differences, *notes])]

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return asdict(self) | {"ok": self.ok}


class RowFormat:
    """How the change log holds row data (the JSON ``row`` column or typed columns), taken
    from its schema, and how row data is read from change rows or a table's rows alike.

    ``rows``: whether the change log (through the checked batch) has any row; without one,
    nothing has row data.
    """

    def __init__(self, schema: pa.Schema | None, rows: bool, types: pa.Schema) -> None:
        self.rows = rows and schema is not None
        self.json = self.rows and schema is not None and "row" in schema.names
        self.columns: list[str] = []
        self.casts: dict[str, pa.DataType] = {}
        if not self.rows or schema is None:
            return
        self.columns = (
            ["row"] if self.json else [c for c in schema.names if c not in NON_ROW_COLUMNS]
        )
        for name in self.columns:
            # The tables store Delta's types (timestamps in microseconds): compared as stored.
            if name in types.names and schema.field(name).type != types.field(name).type:
                self.casts[name] = types.field(name).type

    def cast(self, changes: pa.Table) -> pa.Table:
        """``changes`` with the row columns in the tables' types."""
        for name, to in self.casts.items():
            i = changes.schema.get_field_index(name)
            changes = changes.set_column(i, name, changes.column(name).cast(to, safe=False))
        return changes

    def values(self, table: pa.Table) -> list[Any]:
        """Row data of each row of ``table`` (change rows or a table's rows)."""
        if not self.rows:
            return [None] * table.num_rows
        if self.json:
            return [None if t is None else msgspec.json.decode(t) for t in table["row"].to_pylist()]
        return list(table.select(self.columns).to_pylist())


class BatchOffsets:
    """Per change-log batch and ``topic/partition``: the first and last offset of its rows,
    gathered from the change rows piece by piece (:meth:`add`)."""

    def __init__(self) -> None:
        self._pieces: list[pa.Table] = []
        self._batch = np.zeros(0, np.int64)
        self._tp: list[str] = []
        self._lo: list[int] = []
        self._hi: list[int] = []

    def add(self, changes: pa.Table) -> None:
        """Take in the offsets of some change rows (a batch may come in several pieces)."""
        if changes.num_rows:
            self._pieces.append(_offset_ranges(changes))

    def done(self) -> None:
        """Merge the pieces; :meth:`ranges` answers from then on."""
        if not self._pieces:
            return
        grouped = _offset_ranges(pa.concat_tables(self._pieces), "_min", "_max")
        self._pieces = []
        grouped = grouped.sort_by([("batch_id", "ascending")])
        self._batch = np.asarray(grouped.column("batch_id").to_numpy(), dtype=np.int64)
        topics, partitions = grouped["topic"].to_pylist(), grouped["partition"].to_pylist()
        self._tp = [f"{t}/{p}" for t, p in zip(topics, partitions, strict=True)]
        self._lo = grouped["offset_min"].to_pylist()
        self._hi = grouped["offset_max"].to_pylist()

    def ranges(self, first: int, last: int) -> dict[str, list[int]]:
        """Per ``topic/partition``: first and last offset of the change rows of the batches."""
        out: dict[str, list[int]] = {}
        start = int(np.searchsorted(self._batch, first, "left"))
        stop = int(np.searchsorted(self._batch, last, "right"))
        for i in range(start, stop):
            lo, hi = self._lo[i], self._hi[i]
            have = out.setdefault(self._tp[i], [lo, hi])
            have[:] = [min(have[0], lo), max(have[1], hi)]
        return out


def _offset_ranges(changes: pa.Table, lo: str = "", hi: str = "") -> pa.Table:
    """``batch_id, topic, partition, offset_min, offset_max`` of ``changes`` (whose offsets
    are in ``offset{lo}`` and ``offset{hi}``)."""
    keys = ["batch_id", "topic", "partition"]
    if not lo:
        return changes.group_by(keys).aggregate([("offset", "min"), ("offset", "max")])
    merged = changes.group_by(keys).aggregate([(f"offset{lo}", "min"), (f"offset{hi}", "max")])
    return merged.rename_columns([*keys, "offset_min", "offset_max"])


class ChangeLogView:
    """Change rows (all of them, or those of some sessions), batch after batch, as the tables
    should hold them."""

    def __init__(self, changes: pa.Table | None, last: int, end: EndMode, fmt: RowFormat) -> None:
        self.last, self.drop, self.format = last, end == "drop", fmt
        self.rows: pa.Table | None = None
        if changes is None or changes.num_rows == 0:
            return
        ordered = ordered_changes(changes)
        # Batch after batch, each in application order (the sort is stable).
        self.rows = ordered.take(pc.sort_indices(ordered, [("batch_id", "ascending")]))
        self.batch = np.asarray(self.rows.column("batch_id").to_numpy(), dtype=np.int64)
        self._columns: list[list[Any]] | None = None
        self._pos, self._tables = 0, dict[tuple[str, str], dict[str, Any]]()

    def values(self, table: pa.Table) -> list[Any]:
        """Row data of each row of ``table`` (change rows or a table's rows)."""
        return self.format.values(table)

    def upto(self, last: int) -> pa.Table | None:
        """The change rows of batches up to ``last``."""
        if self.rows is None:
            return None
        return self.rows.slice(0, int(np.searchsorted(self.batch, last, "right")))

    def live(self, last: int) -> dict[Key, Any]:
        """``{(topic, session, row_id): row}`` of the sessions after batch ``last``."""
        rows = self.upto(last)
        if rows is None or rows.num_rows == 0:
            return {}
        if self.drop:  # an end takes the session's rows out of the tables, as a clear
            ops = rows.column("op")
            swapped = pc.if_else(pc.equal(ops, "end"), "clear", ops)
            rows = rows.set_column(rows.schema.get_field_index("op"), "op", swapped)
        return {
            (topic, session, rid): row
            for (topic, session), kept in rebuild_tables(rows).items()
            for rid, row in kept.items()
        }

    def versions(self, last: int) -> dict[Key, Any]:
        """``{(topic, session, row_id, partition, offset): row}``: the versions opened."""
        rows = self.upto(last)
        if rows is None:
            return {}
        rows = rows.filter(pc.is_in(rows.column("op"), pa.array(["insert", "update"])))
        names = ("topic", "session", "row_id", "partition", "offset")
        keys = zip(*(rows[c].to_pylist() for c in names), strict=True)
        return dict(zip(keys, self.values(rows), strict=True))

    def unchanged(self, first: int, last: int, history: bool) -> bool:
        """Whether batches ``first..last`` leave a table as it was (so need no commit).

        The change log is applied with rebuild_tables' rules up to there: asked in increasing
        batch order, each change is applied once.
        """
        if self.rows is None:
            return True
        start = int(np.searchsorted(self.batch, first, "left"))
        stop = int(np.searchsorted(self.batch, last, "right"))
        if start >= stop:
            return True
        if start < self._pos:
            self._pos, self._tables = 0, {}
        self._apply(start, None)
        before: dict[Key, Any] = {}
        if self._apply(stop, before) and history:
            return False  # every insert and update is a version of its own
        return all(self._tables.get(k[:2], {}).get(k[2], _ABSENT) == v for k, v in before.items())

    def _apply(self, stop: int, before: dict[Key, Any] | None) -> bool:
        """Apply the changes up to position ``stop``; ``before`` gets each touched row's
        value before them. Whether any set a row."""
        if self._columns is None:
            assert self.rows is not None
            names = ("topic", "session", "op", "row_id")
            self._columns = [self.rows[c].to_pylist() for c in names] + [self.values(self.rows)]
        topics, sessions, ops, row_ids, values = self._columns
        opened = False
        for i in range(self._pos, stop):
            op, rid, session = ops[i], row_ids[i], (topics[i], sessions[i])
            rows = self._tables.setdefault(session, {})
            if op in ("insert", "update", "delete"):
                if before is not None:
                    before.setdefault((*session, rid), rows.get(rid, _ABSENT))
                if op == "delete":
                    rows.pop(rid, None)
                else:
                    rows[rid], opened = values[i], True
            elif op in CLEARING_OPS or (op == "end" and self.drop):
                if before is not None:
                    for r, v in rows.items():
                        before.setdefault((*session, r), v)
                rows.clear()
        self._pos = stop
        return opened


class CommitLog:
    """What checking a table's commits asks of the change log: its last batch, the offset
    ranges of batches, and whether batches change the table.

    ``answers`` to the last, per ``(first, last, history)``; without them the questions are
    recorded in :attr:`asked` (and answered "unchanged"), to be answered bucket by bucket.
    """

    def __init__(
        self,
        last: int,
        offsets: BatchOffsets,
        answers: dict[tuple[int, int, bool], bool] | None = None,
    ) -> None:
        self.last, self.offsets, self.answers = last, offsets, answers
        self.asked: set[tuple[int, int, bool]] = set()

    def unchanged(self, first: int, last: int, history: bool) -> bool:
        """Whether batches ``first..last`` leave a table as it was (so need no commit)."""
        if self.answers is None:
            self.asked.add((first, last, history))
            return True
        return self.answers[(first, last, history)]


def gap(check: TableCheck, log: CommitLog, first: int, last: int, where: str) -> None:
    """A discrepancy unless batches ``first..last`` leave the table unchanged (no commit due)."""
    if not log.unchanged(first, last, check.table == "history"):
        check.found(
            "batch ranges",
            f"batches {first}..{last} change this table but no commit before {where} applied them",
        )


def batch_commit(
    check: TableCheck,
    log: CommitLog,
    where: str,
    held: int,
    batches: tuple[int, int],
    offsets: str | None,
) -> int:
    """Check one commit applying ``batches`` (first, last) with its recorded ``offsets`` (JSON)
    after batches through ``held``; the batches held after it."""
    first, last = batches
    check.commits += 1
    if first <= held:
        check.found(
            "batch ranges",
            f"{where}: applies batches {first}..{last}, but batches through {held} were applied "
            "already",
        )
    else:
        gap(check, log, held + 1, first - 1, where)
    recorded = json.loads(offsets or "{}")
    expected = log.offsets.ranges(first, last)
    if recorded != expected:
        check.found(
            "offsets",
            f"{where} (batches {first}..{last}) records offsets {short(recorded)}, the change "
            f"log has {short(expected)}",
        )
    return max(held, last)


def short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
