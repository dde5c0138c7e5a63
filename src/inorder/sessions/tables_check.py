"""Checking the session tables against the change log they follow (``inorder validate``).

Per existing table (:func:`check_tables_against_change_log`):

* **Commits** on the lineage of the table's version (a ``RESTORE`` to version ``v`` drops
  the commits after ``v``) must apply the batches ``inorder.first_batch``..``inorder.batch``
  in order from batch 0 without overlap, skipping only batches that change nothing in the
  table (they make no commit); ``inorder.offsets`` must be the change rows' offset range per
  ``topic/partition``; a restore's last commit and the transaction version name the last batch.
* **Rows**: the current table and the history's open versions must be
  :func:`~inorder.sessions.rebuild.rebuild_tables` of the change rows of the batches the
  table holds; every history version an ``insert``/``update`` change row with its data, the
  versions of a row without overlap, ``is_current`` exactly those without an end.

A table behind the change log is not a discrepancy: the next run catches it up (docs/tables.md).
Memory: the whole change log and one table.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inorder.sessions.rebuild import NON_ROW_COLUMNS, ordered_changes, rebuild_tables
from inorder.sessions.tables_delta import BATCH_KEY, FIRST_BATCH_KEY, OFFSETS_KEY, DeltaTableOutput
from inorder.sessions.tables_plan import EndMode
from inorder.sessions.tables_writer import SessionTablesWriter

#: Differences shown per table.
SHOWN = 8
#: Commits that change no row: expected in a table's history.
_HARMLESS = frozenset({"CREATE TABLE", "OPTIMIZE", "VACUUM START", "VACUUM END"})
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
        if kind in ("missing", "extra", "different"):
            setattr(self, kind, getattr(self, kind) + 1)
        else:
            self.problems[kind] = self.problems.get(kind, 0) + 1
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


@dataclass
class TablesCheck:
    """The session tables checked against the change log through ``change_log_last_batch``
    (its last committed batch, -1: none)."""

    change_log_last_batch: int
    tables: list[TableCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every table matches the change log."""
        return all(t.ok for t in self.tables)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return asdict(self) | {"ok": self.ok, "tables": [t.to_json() for t in self.tables]}

    def lines(self) -> list[str]:
        """Human-readable report."""
        if not self.tables:
            return list(self.notes)
        bad = sum(not t.ok for t in self.tables)
        found = f"{bad} with discrepancies" if bad else "no discrepancy"
        summary = (
            f"{len(self.tables)} session table(s) checked against the change log through batch "
            f"{self.change_log_last_batch}, {found}"
        )
        return [*(line for t in self.tables for line in t.lines()), *self.notes, summary]


def check_pipeline_tables(pipeline: Any, owner: str | None = None) -> TablesCheck | None:
    """The session tables of ``pipeline`` (``[tables]``) checked against its change log.

    ``None`` without tables. ``owner`` is the checkpoint id the pipeline ran with: with it
    the tables' transaction versions are found and checked too. Nothing is created.
    """
    from inorder.sessions.tables_ops import ops_writer

    tables = getattr(pipeline, "tables", None)
    if tables is None:
        return None
    if getattr(tables, "format", "delta") != "delta":  # no Delta commit log to follow
        return TablesCheck(-1, notes=[f"session tables in {tables.format} format: not checked"])
    if owner and getattr(pipeline.sink, "owner", None) is None:
        pipeline.sink.bind(owner)  # the tables' transactions are kept under the owner's id
    writer = ops_writer(pipeline)
    return None if writer is None else check_tables_against_change_log(writer)


def check_tables_against_change_log(
    writer: SessionTablesWriter, changes: pa.Table | None = None, last_batch: int | None = None
) -> TablesCheck:
    """Check each existing table of ``writer`` against the change log (module docstring).

    ``changes``: the change rows (default: read from the writer's change log up to
    ``last_batch``, default its last committed batch); rows of later batches are ignored.
    """
    if last_batch is None:
        committed = getattr(writer.changes, "last_committed_batch", lambda: None)()
        last_batch = -1 if committed is None else int(committed)
    if changes is None and last_batch >= 0:
        changes = writer.changes.read_batches(0, last_batch)
    if changes is not None:
        changes = changes.filter(pc.less_equal(changes.column("batch_id"), last_batch))
    log = _ChangeLog(changes, last_batch, writer.end, writer.tables[0].schema)
    return TablesCheck(last_batch, [_check_table(t, log) for t in writer.tables])


class _ChangeLog:
    """The change rows, batch after batch, as the tables should hold them."""

    def __init__(self, changes: pa.Table | None, last: int, end: EndMode, types: pa.Schema) -> None:
        self.last, self.drop = last, end == "drop"
        self.json, self.row_cols = False, []
        self.rows: pa.Table | None = None
        self.offsets: dict[int, dict[str, list[int]]] = {}
        if changes is None or changes.num_rows == 0:
            return
        self.json = "row" in changes.column_names
        self.row_cols = (
            ["row"] if self.json else [c for c in changes.column_names if c not in NON_ROW_COLUMNS]
        )
        for name in self.row_cols:
            # The tables store Delta's types (timestamps in microseconds): compared as stored.
            if name in types.names and changes.schema.field(name).type != types.field(name).type:
                i = changes.schema.get_field_index(name)
                changes = changes.set_column(
                    i, name, changes.column(name).cast(types.field(name).type, safe=False)
                )
        ordered = ordered_changes(changes)
        # Batch after batch, each in application order (the sort is stable).
        self.rows = ordered.take(pc.sort_indices(ordered, [("batch_id", "ascending")]))
        self.batch = np.asarray(self.rows.column("batch_id").to_numpy(), dtype=np.int64)
        grouped = self.rows.group_by(["batch_id", "topic", "partition"]).aggregate(
            [("offset", "min"), ("offset", "max")]
        )
        names = ("batch_id", "topic", "partition", "offset_min", "offset_max")
        for b, t, p, lo, hi in zip(*(grouped[c].to_pylist() for c in names), strict=True):
            self.offsets.setdefault(b, {})[f"{t}/{p}"] = [lo, hi]
        self._columns: list[list[Any]] | None = None
        self._pos, self._tables = 0, dict[tuple[str, str], dict[str, Any]]()

    def values(self, table: pa.Table) -> list[Any]:
        """Row data of each row of ``table`` (change rows or a table's rows)."""
        if self.rows is None:
            return [None] * table.num_rows
        if self.json:
            return [None if t is None else msgspec.json.decode(t) for t in table["row"].to_pylist()]
        return list(table.select(self.row_cols).to_pylist())

    def offset_ranges(self, first: int, last: int) -> dict[str, list[int]]:
        """Per ``topic/partition``: first and last offset of the change rows of the batches."""
        out: dict[str, list[int]] = {}
        for b in sorted(k for k in self.offsets if first <= k <= last):
            for tp, (lo, hi) in self.offsets[b].items():
                have = out.setdefault(tp, [lo, hi])
                have[:] = [min(have[0], lo), max(have[1], hi)]
        return out

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
            elif op in ("clear", "reset") or (op == "end" and self.drop):
                if before is not None:
                    for r, v in rows.items():
                        before.setdefault((*session, r), v)
                rows.clear()
        self._pos = stop
        return opened


def _check_table(table: DeltaTableOutput, log: _ChangeLog) -> TableCheck:
    check = TableCheck(table.kind, table.path)
    history = table.kind == "history"
    try:
        if not table.exists():
            check.exists = False
            if not log.unchanged(0, log.last, history):
                check.pending = [0, log.last]
            return check
        delta = table.open()
        check.version = int(delta.version())
        commits = [h for h in delta.history() if int(h["version"]) <= check.version]
        walked = _walk(check, commits, log)
        txn = table.committed_batch()
        held = walked if walked is not None else (-1 if txn is None else txn)
        check.last_batch = held
        if txn is not None and txn != held:
            check.found(
                "transaction",
                f"transaction version {txn} (where the next run resumes), but its commits "
                f"hold batches through {held}",
            )
        data = delta.to_pyarrow_dataset().to_table()
    except Exception as exc:
        check.found("unreadable", f"cannot read the table: {exc}")
        return check
    if held > log.last:
        check.found("ahead", f"holds batches through {held}; the change log ends at {log.last}")
    elif held < log.last and not log.unchanged(held + 1, log.last, history):
        check.pending = [held + 1, log.last]
    through = min(held, log.last)
    live = data.filter(pc.equal(data.column("is_current"), True)) if history else data
    _compare_live(check, live, log, through)
    if history:
        _check_versions(check, data, log, through)
    return check


def _walk(check: TableCheck, history: list[dict[str, Any]], log: _ChangeLog) -> int | None:
    """Check the batch commits on the lineage of the table's version; its last batch
    (``None``: no batch commit left in an incomplete log)."""
    entries = sorted(history, key=lambda h: int(h["version"]))
    complete = bool(entries) and int(entries[0]["version"]) == 0
    lineage: list[dict[str, Any]] = []
    for h in entries:
        if h.get("operation") != "RESTORE":
            lineage.append(h)
            continue
        to = (h.get("operationParameters") or {}).get("version")
        if to is None:
            check.notes.append(f"version {h['version']}: restore to an unknown version")
            lineage, complete = [], False
        else:
            lineage = [e for e in lineage if int(e["version"]) <= int(to)]
    if not complete:
        check.notes.append("the table's early commits are not in its log: checked from the first")
    held: int | None = -1 if complete else None
    check.first_batch = 0 if complete else None
    for h in lineage:
        v, batch, op = int(h["version"]), h.get(BATCH_KEY), h.get("operation")
        if batch is None:
            if op not in _HARMLESS:
                check.notes.append(f"version {v}: {op} commit not made by the pipeline")
            continue
        last = int(batch)
        if h.get(FIRST_BATCH_KEY) is None:  # a restore's last commit: where the table is now
            if held is not None and last < held:
                check.found(
                    "batch ranges",
                    f"version {v}: sets the table back to batch {last} while it holds batches "
                    f"through {held} (the next run would apply them twice)",
                )
            elif held is not None:
                _gap(check, log, held + 1, last, v)
            else:
                check.first_batch = last + 1
            held = last
            continue
        first = int(h[FIRST_BATCH_KEY])
        check.commits += 1
        if held is None:
            held = first - 1
            check.first_batch = first
        if first <= held:
            check.found(
                "batch ranges",
                f"version {v}: applies batches {first}..{last}, but batches through {held} "
                "were applied already",
            )
        else:
            _gap(check, log, held + 1, first - 1, v)
        recorded = json.loads(h.get(OFFSETS_KEY) or "{}")
        expected = log.offset_ranges(first, last)
        if recorded != expected:
            check.found(
                "offsets",
                f"version {v} (batches {first}..{last}) records offsets {_short(recorded)}, "
                f"the change log has {_short(expected)}",
            )
        held = max(held, last)
    return held


def _gap(check: TableCheck, log: _ChangeLog, first: int, last: int, version: int) -> None:
    if not log.unchanged(first, last, check.table == "history"):
        check.found(
            "batch ranges",
            f"batches {first}..{last} change this table but no commit before version "
            f"{version} applied them",
        )


def _compare_live(check: TableCheck, data: pa.Table, log: _ChangeLog, through: int) -> None:
    """The table's live rows against the sessions rebuilt from the change log."""
    want = log.live(through)
    check.rows = len(want)
    got: dict[Key, Any] = {}
    keys = zip(*(data[c].to_pylist() for c in ("topic", "session", "row_id")), strict=True)
    for key, value in zip(keys, log.values(data), strict=True):
        if key in got:
            check.found("extra", f"extra {key}: the table holds it more than once")
        got[key] = value
    _diff(check, want, got, "", str)


def _check_versions(check: TableCheck, data: pa.Table, log: _ChangeLog, through: int) -> None:
    """Every history version against the change row that opened it, and their validity."""
    want = log.versions(through)
    check.versions = len(want)
    names = ("topic", "session", "row_id", "partition", "valid_from_offset", "valid_to_offset")
    columns = [data[c].to_pylist() for c in (*names, "is_current")]
    got: dict[Key, Any] = {}
    spans: dict[Key, list[tuple[int, int | None]]] = {}
    for *key, start, end, is_current, value in zip(*columns, log.values(data), strict=True):
        if (*key, start) in got:
            check.found("versions extra", f"version of {tuple(key)} from {start}: held twice")
        got[(*key, start)] = value
        spans.setdefault(tuple(key), []).append((start, end))
        if is_current != (end is None):
            check.found(
                "validity",
                f"version of {tuple(key[:3])} from offset {start}: is_current {is_current} but "
                f"valid_to_offset {end}",
            )
    _diff(check, want, got, "versions ", lambda k: f"version of {k[:3]} from offset {k[4]}")
    for of, span in spans.items():
        span.sort(key=lambda s: s[0])
        for (start, end), (following, _) in itertools.pairwise(span):
            if end is None or end > following:
                check.found(
                    "overlapping versions",
                    f"versions of {of[:3]} overlap: the one from offset {start} ends at {end}, "
                    f"the next starts at {following}",
                )


def _diff(
    check: TableCheck,
    want: dict[Key, Any],
    got: dict[Key, Any],
    kind: str,
    name: Callable[[Key], str],
) -> None:
    """Keys only the change log has, only the table has, and with other data in each."""
    for key in sorted(want.keys() - got.keys()):
        check.found(
            f"{kind}missing", f"missing {name(key)}: the change log has {_short(want[key])}"
        )
    for key in sorted(got.keys() - want.keys()):
        check.found(
            f"{kind}extra",
            f"extra {name(key)}: the table has {_short(got[key])}, the change log none",
        )
    for key in sorted(k for k in want.keys() & got.keys() if want[k] != got[k]):
        check.found(
            f"{kind}different",
            f"different {name(key)}: the table has {_short(got[key])}, the change log "
            f"{_short(want[key])}",
        )


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
