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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.sessions.tables_check_iceberg import read_iceberg
from inorder.sessions.tables_check_log import (
    ChangeLogView,
    Key,
    TableCheck,
    batch_commit,
    gap,
    short,
)
from inorder.sessions.tables_delta import BATCH_KEY, FIRST_BATCH_KEY, OFFSETS_KEY, DeltaTableOutput
from inorder.sessions.tables_iceberg import IcebergTableOutput
from inorder.sessions.tables_writer import SessionTablesWriter

#: Commits that change no row: expected in a table's history.
_HARMLESS = frozenset({"CREATE TABLE", "OPTIMIZE", "VACUUM START", "VACUUM END"})


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
    log = ChangeLogView(changes, last_batch, writer.end, writer.outputs[0].schema)
    return TablesCheck(last_batch, [_check_table(t, log) for t in writer.outputs])


def _check_table(table: DeltaTableOutput | IcebergTableOutput, log: ChangeLogView) -> TableCheck:
    check = TableCheck(table.kind, table.path)
    history = table.kind == "history"
    try:
        if not table.exists():
            check.exists = False
            if not log.unchanged(0, log.last, history):
                check.pending = [0, log.last]
            return check
        if isinstance(table, DeltaTableOutput):
            held, data = _read_delta(check, table, log)
        else:
            held, data = read_iceberg(check, table, log)
        check.last_batch = held
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


def _read_delta(
    check: TableCheck, table: DeltaTableOutput, log: ChangeLogView
) -> tuple[int, pa.Table]:
    """The last batch the Delta table holds (its commits checked) and its rows."""
    delta = table.open()
    check.version = int(delta.version())
    commits = [h for h in delta.history() if int(h["version"]) <= check.version]
    walked = _walk(check, commits, log)
    txn = table.committed_batch()
    held = walked if walked is not None else (-1 if txn is None else txn)
    if txn is not None and txn != held:
        check.found(
            "transaction",
            f"transaction version {txn} (where the next run resumes), but its commits "
            f"hold batches through {held}",
        )
    return held, delta.to_pyarrow_dataset().to_table()


def _walk(check: TableCheck, history: list[dict[str, Any]], log: ChangeLogView) -> int | None:
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
                gap(check, log, held + 1, last, f"version {v}")
            else:
                check.first_batch = last + 1
            held = last
            continue
        first = int(h[FIRST_BATCH_KEY])
        if held is None:
            held = first - 1
            check.first_batch = first
        held = batch_commit(check, log, f"version {v}", held, (first, last), h.get(OFFSETS_KEY))
    return held


def _compare_live(check: TableCheck, data: pa.Table, log: ChangeLogView, through: int) -> None:
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


def _check_versions(check: TableCheck, data: pa.Table, log: ChangeLogView, through: int) -> None:
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
        check.found(f"{kind}missing", f"missing {name(key)}: the change log has {short(want[key])}")
    for key in sorted(got.keys() - want.keys()):
        check.found(
            f"{kind}extra",
            f"extra {name(key)}: the table has {short(got[key])}, the change log none",
        )
    for key in sorted(k for k in want.keys() & got.keys() if want[k] != got[k]):
        check.found(
            f"{kind}different",
            f"different {name(key)}: the table has {short(got[key])}, the change log "
            f"{short(want[key])}",
        )
