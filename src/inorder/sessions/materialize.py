"""Full materializations of session tables: every row of a session, as output rows.

The change log is the primary output; a materialization is a second view (every N micro-batches
and when a session ends) that lets readers get a session's table without replaying its log.

Not wired into pipelines yet: the engine writes one output per pipeline. Until it takes a
second output, call :func:`materialize` on states (e.g. from ``inorder inspect`` or a custom
job over checkpointed state) or rebuild from the change log with
:func:`inorder.sessions.rebuild_tables`.
"""

from __future__ import annotations

import msgspec

from inorder.sessions.processor import SessionState


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
