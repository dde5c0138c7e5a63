"""Full materializations of session tables: every row of a session, as output rows (pure).

The change log is the primary output; a materialization is a second view (every N micro-batches
and when a session ends or is reset) that lets readers get a session's table without replaying
its log. This module holds the planning only, no I/O:

* :class:`TableBook` keeps every live session's table by applying change rows with the rules
  of :func:`inorder.sessions.rebuild_tables` (``clear``, ``truncate`` and ``reset`` empty the
  table, ``insert`` / ``update`` set a row, ``delete`` removes it), and reports the sessions an
  ``end`` or a ``reset`` drops, with their table at that moment.
* :func:`due` says which batches write every live session.
* :func:`materialize` turns a session's engine state into table rows.

:mod:`inorder.sessions.materializer` reads change rows and writes materializations.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from inorder.sessions.processor import RESET_SEQ
from inorder.sessions.session_state import SessionState

#: ``reason`` of a materialization: every live session, every N batches.
PERIODIC = "periodic"
#: ``reason`` of a materialization: the final table of a session that ended.
END = "end"
#: ``reason`` of a materialization: a session reset (its table is unknown: written empty).
RESET = "reset"
REASONS = (PERIODIC, END, RESET)


class TableRow(msgspec.Struct, gc=False):
    """One row of a session's table at a point in time (``as_of_seq`` = last applied seq)."""

    session: str
    as_of_seq: int
    row_id: str
    row: str


def materialize(session: str, state: SessionState) -> list[TableRow]:
    """Every row of one session's table, ordered by row id (empty if not started)."""
    if not state.started:
        return []
    seq = state.seq
    return [TableRow(session, seq, rid, state.rows[rid]) for rid in sorted(state.rows)]


def due(batch_id: int, every_batches: int) -> bool:
    """Whether micro-batch ``batch_id`` should write materializations (every N batches)."""
    if every_batches <= 0:
        raise ValueError("every_batches must be positive")
    return batch_id % every_batches == every_batches - 1


@dataclass
class SessionTable:
    """One session's table and where its last applied change came from.

    ``rows`` maps row id to the row as the change log holds it: the canonical JSON text, or
    the tuple of typed row column values. ``partition``/``offset``/``seq`` are those of the
    last change applied (the session's topic is part of its key).
    """

    partition: int
    offset: int
    seq: int
    rows: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Materialization:
    """A session's table to write: its key, its table and why it is written."""

    topic: str
    session: str
    table: SessionTable
    reason: str


class ChangeRow(msgspec.Struct, frozen=True, gc=False):
    """The fields of a change row the book applies (``row`` as the change log holds it)."""

    topic: str
    partition: int
    offset: int
    session: str
    seq: int
    op: str
    row_id: str | None
    row: Any


class TableBook:
    """Every live session's table, kept by applying change rows in application order.

    A session is live from its first change row until an ``end`` or a ``reset``: those drop
    it from the book and :meth:`apply` returns its table at that moment (the final table for
    ``end``, an empty one for ``reset``), so it can be written once before it is forgotten.
    For change logs written by :class:`~inorder.sessions.SessionTables` the live tables equal
    :func:`~inorder.sessions.rebuild_tables` of the same rows: after ``end`` or ``reset`` a
    session's next change is a snapshot's ``clear`` (or another ``reset``).
    """

    def __init__(self) -> None:
        self.tables: dict[tuple[str, str], SessionTable] = {}

    def __len__(self) -> int:
        return len(self.tables)

    def load(self, materialization: Materialization) -> None:
        """Start from a written materialization (a previous ``periodic`` one)."""
        self.tables[(materialization.topic, materialization.session)] = materialization.table

    def apply(self, changes: Iterable[ChangeRow]) -> list[Materialization]:
        """Apply change rows (already in application order); return the dropped sessions."""
        dropped: list[Materialization] = []
        tables = self.tables
        for c in changes:
            key = (c.topic, c.session)
            table = tables.get(key)
            if table is None:
                table = tables[key] = SessionTable(c.partition, c.offset, c.seq)
            else:
                table.partition, table.offset, table.seq = c.partition, c.offset, c.seq
            op = c.op
            if op == "insert" or op == "update":
                table.rows[c.row_id] = c.row  # type: ignore[index]
            elif op == "delete":
                table.rows.pop(c.row_id, None)  # type: ignore[arg-type]
            elif op == "clear" or op == "truncate":  # the session goes on, empty
                table.rows = {}
            elif op == "reset":
                del tables[key]
                empty = SessionTable(c.partition, c.offset, RESET_SEQ)
                dropped.append(Materialization(c.topic, c.session, empty, RESET))
            elif op == "end":
                del tables[key]
                dropped.append(Materialization(c.topic, c.session, table, END))
        return dropped

    def periodic(self) -> Iterator[Materialization]:
        """Every live session, in key order (its table is shared, not copied)."""
        for (topic, session), table in sorted(self.tables.items()):
            yield Materialization(topic, session, table, PERIODIC)
