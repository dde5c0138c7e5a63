"""How an envelope's :class:`~inorder.sessions.messages.Change` becomes contract messages.

:class:`~inorder.sessions.processor.SessionTables` applies only the contract's messages
(snapshot, insert, update, delete, end) and checks its rules on them. An envelope without a
producer sequence, without a whole-table snapshot message, or with sessions that may begin
without any snapshot is translated here, with the session's state at hand:

* a missing ``seq`` becomes the session's next one (so the change log's ``seq`` still counts
  messages from the snapshot; a gap in the input cannot be seen, see docs/envelopes.md);
* a run of ``read`` rows becomes one snapshot: the first row starts it (the table is cleared),
  the next rows are inserts, until ``snapshot_last`` or any other operation ends the run;
* ``upsert`` becomes an update of an existing row, an insert otherwise;
* with ``require_snapshot=False`` a session's first message starts it with an empty table
  (a ``clear`` change row first, so a rebuilt table never keeps rows of an earlier session);
* ``position`` (the source's own order, e.g. a binlog file and position) must not go back.
  An event at or below the session's last applied position is the source delivering it
  again (Debezium is at-least-once): when the session's last :data:`REDELIVERY_WINDOW`
  positions hold it with the same content it is a :class:`~inorder.processor.Duplicate`,
  skipped and counted; a *different* event at an applied position, or at a position inside
  that window that was never applied, breaks the ``source_order`` rule. A redelivery older
  than the window is skipped as a duplicate without its content compared (there is nothing
  left to compare it with).
"""

from __future__ import annotations

import zlib
from typing import Any

import msgspec

from inorder.processor import Duplicate, Violation
from inorder.sessions.messages import (
    Change,
    Delete,
    End,
    Insert,
    SessionMessage,
    Snapshot,
    Truncate,
    Update,
    row_id_of,
)
from inorder.sessions.session_state import EnvelopeState

#: Operations after which the session's table is whole again (a violation may restart on them).
STARTING_OPS = frozenset({"snapshot", "read", "truncate"})

#: How many of a session's last applied source positions are kept (at least; up to a quarter
#: more between trims), with a digest of each event, to tell a redelivered event from a
#: different one at an old position.
REDELIVERY_WINDOW = 1000

_canonical = msgspec.json.Encoder(order="deterministic").encode


def translate(
    state: EnvelopeState, change: Change, row_key: str, require_snapshot: bool
) -> list[SessionMessage]:
    """The contract messages, in order, that apply ``change`` to a session in ``state``.

    Raises :class:`Violation` (``source_order``) when ``change.position`` goes back.
    """
    op = change.op
    if op == "skip":
        return []
    session = change.session
    started = state.started
    if op == "snapshot":
        return [Snapshot(session, _seq(change, 0), change.rows or [], change.ts)]
    if op == "truncate":
        return [Truncate(session, _seq(change, 0), change.ts)]
    if op == "read":
        if started and state.reading:
            return [Insert(session, _seq(change, state.seq + 1), _row(change), change.ts)]
        return [Snapshot(session, _seq(change, 0), [_row(change)], change.ts)]
    out: list[SessionMessage] = []
    nxt = state.seq + 1
    if not started and not require_snapshot:
        seq = change.seq
        out.append(Snapshot(session, 0 if seq is None else seq - 1, [], change.ts))
        nxt = 1
    seq = _seq(change, nxt)
    if op == "upsert":
        row = _row(change)
        rid = row_id_of(row, row_key)
        exists = started and rid is not None and rid in state.rows
        out.append((Update if exists else Insert)(session, seq, row, change.ts))
    elif op == "insert":
        out.append(Insert(session, seq, _row(change), change.ts))
    elif op == "update":
        out.append(Update(session, seq, _row(change), change.ts))
    elif op == "delete":
        out.append(Delete(session, seq, _delete_id(change), change.ts))
    elif op == "end":
        out.append(End(session, seq, change.ts))
    else:
        raise TypeError(f"not a session operation: {op!r}")
    return out


def settle(state: EnvelopeState, change: Change, row_key: str) -> None:
    """Record what ``change`` leaves behind once applied: a snapshot run, the last position
    and, among the session's recent ones, a digest of the event."""
    if change.op == "skip":
        return
    state.reading = change.op == "read" and not change.snapshot_last and state.started
    if change.position is not None:
        state.position = here = list(change.position)
        recent = state.recent
        recent.append([_applied_digest(state, change, row_key), *here])
        # Trimmed a quarter at a time: cutting one entry off the front per event moved the
        # whole list every time.
        if len(recent) > REDELIVERY_WINDOW + REDELIVERY_WINDOW // 4:
            del recent[: len(recent) - REDELIVERY_WINDOW]


def check_position(state: EnvelopeState, change: Change, row_key: str) -> None:
    """Check ``change``'s source position against the session's applied ones.

    Raises :class:`~inorder.processor.Duplicate` for a redelivered event and
    :class:`Violation` (``source_order``) for an older position that is not one.
    """
    position = change.position
    last = state.position
    if position is None or last is None or change.op == "skip":
        return
    here = list(position)
    try:
        if not here <= last:
            return
    except TypeError:  # positions of another shape (a source changed): nothing to compare
        return
    where = f"session {change.session!r}: {change.op} at source position {here}"
    recent = state.recent
    for entry in reversed(recent):
        if entry[1:] == here:
            if entry[0] == _incoming_digest(change, row_key):
                raise Duplicate(f"{where}: applied before (the source delivered it again)")
            raise Violation(
                "source_order", f"{where}: a different event was applied at this position"
            )
    try:
        inside = bool(recent) and here > recent[0][1:]
    except TypeError:
        inside = False
    if inside or (not recent and here != last):
        raise Violation("source_order", f"{where} after {last}: never applied, and older")
    raise Duplicate(f"{where}: older than the last {len(recent)} positions kept, skipped")


def _digest(op: str, row_id: str, text: str) -> int:
    return zlib.crc32(f"{op}\x00{row_id}\x00{text}".encode())


def _applied_digest(state: EnvelopeState, change: Change, row_key: str) -> int:
    # The row's canonical JSON was just stored by the apply: not encoded a second time.
    row = change.row
    if row is None:
        rid = change.row_id
        return _digest(change.op, "" if rid is None else str(rid), "")
    rid = row_id_of(row, row_key) or ""
    return _digest(change.op, rid, state.rows.get(rid, ""))


def _incoming_digest(change: Change, row_key: str) -> int:
    # The same digest for an event not applied: its row encoded as the apply would store it.
    row = change.row
    if row is None:
        rid = change.row_id
        return _digest(change.op, "" if rid is None else str(rid), "")
    return _digest(change.op, row_id_of(row, row_key) or "", _canonical(row).decode())


def _seq(change: Change, default: int) -> int:
    seq = change.seq
    return default if seq is None else seq


def _row(change: Change) -> dict[str, Any]:
    row = change.row
    if row is None:  # the envelope codecs never build one; a foreign codec might
        raise Violation("row_schema", f"session {change.session!r}: {change.op} without a row")
    return row


def _delete_id(change: Change) -> str | int:
    rid = change.row_id
    if rid is None:
        raise Violation("row_schema", f"session {change.session!r}: delete does not name its row")
    return rid


__all__ = ["REDELIVERY_WINDOW", "STARTING_OPS", "check_position", "settle", "translate"]
