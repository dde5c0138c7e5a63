"""The net change one micro-batch makes to the query-ready session tables (pure, no I/O).

Two Delta tables can be kept beside a session change log (docs/tables.md):

* the **current** table (SCD type 1): one row per live ``(topic, session, row_id)``;
* the **history** table (SCD type 2): one row per version of each row, with the offsets and
  Kafka timestamps between which it was the row's value.

:func:`plan_batch` takes a batch's change rows in application order
(:func:`~inorder.sessions.rebuild.ordered_changes`) and returns what the batch changes, per
row key, with the rules of :func:`~inorder.sessions.rebuild_tables`:

* ``insert`` / ``update`` set a row (a new version; the open one is closed by ``update``),
* ``delete`` removes it (its open version is closed by ``delete``),
* ``clear`` (a snapshot starts) removes every row of the session: rows the snapshot lists
  again come back as its ``insert`` rows, so rows it no longer lists are deleted, and every
  open version is closed by ``snapshot`` (the snapshot's rows open new versions),
* ``truncate`` (the source emptied its table, e.g. Debezium's ``op = "t"``) removes every row
  of the session, each open version closed by ``truncate``: the same effect as an empty
  snapshot, but a reader of the history can tell a deliberate emptying from a re-listing,
* ``reset`` removes every row (closed by ``reset``),
* ``end`` keeps the session's rows (``end="keep"``, like the change log: its final table) or
  removes them (``end="drop"``, closed by ``end``).

The walk is column-wise (numpy over the Arrow columns), not a Python loop per change: a
version opened at change ``i`` ends at the earlier of the next change of its row key and the
next wipe (``clear``, ``truncate``, ``reset``, dropping ``end``) of its session; a version open
before the batch ends at the first change of its key if that comes before the session's first
wipe, else at that wipe.

Changes are referred to by their position in the batch (``index``), so the caller builds the
tables' rows from the change log's Arrow columns with ``take``. The planner only needs the
row keys live before the batch (:data:`LIVE_SCHEMA`) and returns the live keys after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: What ``end`` does to a session's rows in the tables.
EndMode = Literal["keep", "drop"]
END_MODES: tuple[str, ...] = ("keep", "drop")

#: ``closed_by`` of a history version: what ended it.
CLOSED_BY = ("update", "delete", "snapshot", "reset", "end", "truncate")

#: Live row keys: one row per ``(topic, session, row_id)`` holding a row.
LIVE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("session", pa.string(), nullable=False),
        pa.field("row_id", pa.string(), nullable=False),
    ]
)
_KEYS = ("topic", "session", "row_id")
_ROW_OPS = pa.array(["insert", "update", "delete"])
_OPS = pa.array(["insert", "update", "delete", "clear", "reset", "end", "truncate"])

CLOSES_SCHEMA = pa.schema([*LIVE_SCHEMA, pa.field("index", pa.int64()), ("closed_by", pa.string())])
VERSIONS_SCHEMA = pa.schema(
    [
        pa.field("index", pa.int64()),
        pa.field("closed_at", pa.int64()),
        pa.field("closed_by", pa.string()),
    ]
)


@dataclass(frozen=True)
class BatchPlan:
    """What a batch changes in the current and the history table (Arrow columns).

    ``upserts``: the change (index, ascending) that last set each row the current table must
    insert or replace; ``deletes``: keys the current table held before the batch that are gone
    after it; ``closes``: versions opened before the batch that it ends (key, ``index`` of the
    ending change, ``closed_by``); ``versions``: the versions the batch opens (``index``,
    ascending), with ``closed_at``/``closed_by`` set when the same batch ends them again;
    ``live``: the live keys after the batch.
    """

    upserts: pa.Array
    deletes: pa.Table
    closes: pa.Table
    versions: pa.Table
    live: pa.Table

    @property
    def empty(self) -> bool:
        """Whether neither table changes."""
        sizes = (len(self.upserts), self.deletes.num_rows, self.closes.num_rows)
        return not any(sizes) and self.versions.num_rows == 0


def no_live() -> pa.Table:
    """Live keys of tables that hold nothing."""
    return LIVE_SCHEMA.empty_table()


def live_table(keys: pa.Table) -> pa.Table:
    """``keys``' key columns as :data:`LIVE_SCHEMA` (a table's ``string_view`` columns too)."""
    return pa.Table.from_arrays(
        [keys.column(name).cast(pa.string()) for name in _KEYS], schema=LIVE_SCHEMA
    )


_INSERT, _UPDATE, _DELETE, _CLEAR, _RESET, _END, _TRUNCATE = range(7)  # positions in _OPS
# Codes of CLOSED_BY.
_BY_UPDATE, _BY_DELETE, _BY_SNAPSHOT, _BY_RESET, _BY_END, _BY_TRUNCATE = range(6)
# What each wiping op closes versions with (indexed by op code; row ops never wipe).
_WIPE_REASON = np.array(
    [_BY_UPDATE, _BY_UPDATE, _BY_DELETE, _BY_SNAPSHOT, _BY_RESET, _BY_END, _BY_TRUNCATE]
)


def plan_batch(live: pa.Table, changes: pa.Table, end: EndMode = "keep") -> BatchPlan:
    """The net change of ``changes`` (one or more batches, in application order) per row key.

    ``changes`` needs the columns ``topic``, ``session``, ``op`` and ``row_id``; ``live`` holds
    the row keys live before the changes (:data:`LIVE_SCHEMA`, :func:`live_table`). Raises
    ``ValueError`` for an ``op`` that is not a change-log op or a row change without a row
    id (not a change log written by :class:`~inorder.sessions.SessionTables`).
    """
    if end not in END_MODES:
        raise ValueError(f"end must be 'keep' or 'drop', not {end!r}")
    _refuse_what_is_not_a_change_log(changes)
    live = live_table(live)
    batch = live_table(changes.select(list(_KEYS)).cast(_NULLABLE_KEYS))
    n = batch.num_rows
    sessions, keys = _codes(pa.concat_tables([batch, live]))
    session, key = sessions[:n], keys[:n]
    live_session, live_key = sessions[n:], keys[n:]
    op = pc.index_in(changes.column("op"), value_set=_OPS).to_numpy(zero_copy_only=False)
    idx = np.arange(n, dtype=np.int64)
    none = n  # "no such change": after every index

    wipe = (op == _CLEAR) | (op == _TRUNCATE) | (op == _RESET) | ((op == _END) & (end == "drop"))
    reason = _WIPE_REASON[op]
    next_wipe = _next_in_group(session, np.where(wipe, idx, none), none)
    session_wipe = np.full(int(sessions.max(initial=-1)) + 1, none, np.int64)
    np.minimum.at(session_wipe, session[wipe], idx[wipe])  # each session's first wipe

    # Row changes grouped by key, in order: each one's next change of the same key.
    rows = np.flatnonzero(op <= _DELETE)
    grouped = rows[np.argsort(key[rows], kind="stable")]
    follows = key[grouped[1:]] == key[grouped[:-1]]
    next_change = np.full(n, none, np.int64)
    next_change[grouped[:-1][follows]] = grouped[1:][follows]
    first_of_key = np.zeros(n, np.bool_)
    first_of_key[grouped] = True
    first_of_key[grouped[1:][follows]] = False

    # Versions opened in the batch end at the next change of their key or the next wipe.
    opened = np.flatnonzero(op <= _UPDATE)
    by_key, by_wipe = next_change[opened], next_wipe[opened]
    closed_at = np.minimum(by_key, by_wipe)
    still_open = closed_at == none
    ended_by_key = by_key < by_wipe
    key_reason = np.where(op[np.minimum(by_key, n - 1)] == _DELETE, _BY_DELETE, _BY_UPDATE)
    closed_by = np.where(ended_by_key, key_reason, reason[np.minimum(by_wipe, n - 1)])
    versions = pa.table(
        {
            "index": pa.array(opened, pa.int64()),
            "closed_at": pa.array(closed_at, pa.int64(), mask=still_open),
            "closed_by": _reasons(closed_by, still_open),
        },
        schema=VERSIONS_SCHEMA,
    )

    # Versions open before the batch end at their key's first change if it comes before the
    # session's first wipe, else at that wipe.
    early = first_of_key & (idx < session_wipe[session]) & (op <= _DELETE)
    by_change = np.flatnonzero(early & _isin(key, live_key))
    wiped = np.flatnonzero(
        (session_wipe[live_session] < none) & ~_isin(live_key, key[early])
        if len(session_wipe)
        else np.zeros(live.num_rows, np.bool_)
    )
    wiped_at = session_wipe[live_session[wiped]]
    close_at = np.concatenate([by_change, wiped_at])
    close_reason = np.concatenate(
        [np.where(op[by_change] == _DELETE, _BY_DELETE, _BY_UPDATE), reason[wiped_at]]
    )
    closed_keys = np.concatenate([key[by_change], live_key[wiped]])
    closed = pa.concat_tables([batch.take(by_change), live.take(wiped)])
    closes = closed.append_column("index", pa.array(close_at, pa.int64())).append_column(
        "closed_by", _reasons(close_reason, np.zeros(len(close_reason), np.bool_))
    )
    new = opened[still_open]
    # Every key the batch opens had its earlier version closed: the two parts are disjoint.
    after = pa.concat_tables([live.filter(~_isin(live_key, closed_keys)), batch.take(new)])
    return BatchPlan(
        upserts=pa.array(new, pa.int64()),
        deletes=closed.filter(~_isin(closed_keys, key[new])),
        closes=closes.take(np.argsort(close_at, kind="stable")).cast(CLOSES_SCHEMA),
        versions=versions,
        live=after,
    )


_NULLABLE_KEYS = pa.schema([f.with_nullable(True) for f in LIVE_SCHEMA])


def _codes(keys: pa.Table) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """An integer per distinct ``(topic, session)`` and per distinct row key."""
    # Topic names cannot hold NUL (Kafka allows [a-zA-Z0-9._-]): the join is unambiguous.
    joined = pc.binary_join_element_wise(keys.column("topic"), keys.column("session"), "\x00")
    sessions = _indices(joined)
    # Null row ids (session-wide changes) become -1 and share a code per session.
    row_ids = _indices(keys.column("row_id"))
    pairs = sessions * (int(row_ids.max(initial=-1)) + 2) + row_ids + 1
    # Dense codes (0..distinct keys) let membership be a lookup instead of a sort.
    return sessions, _indices(pa.array(pairs, pa.int64()))


def _indices(values: pa.Array | pa.ChunkedArray) -> np.ndarray[Any, Any]:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = pc.fill_null(values.dictionary_encode().indices, -1)
    return np.asarray(encoded.to_numpy(), dtype=np.int64)


def _isin(values: np.ndarray[Any, Any], of: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Whether each of ``values`` is in ``of`` (dense non-negative codes)."""
    size = max(int(values.max(initial=-1)), int(of.max(initial=-1))) + 1
    table = np.zeros(size, np.bool_)
    table[of] = True
    return np.asarray(table[values], dtype=np.bool_)


def _next_in_group(
    groups: np.ndarray[Any, Any], values: np.ndarray[Any, Any], none: int
) -> np.ndarray[Any, Any]:
    """For each position: the least of ``values`` at it or after it within its group."""
    order = np.argsort(groups, kind="stable")
    # Offsetting each value by its group makes one reverse running minimum stay inside
    # the group: every later group's values are larger than any of this group's.
    span = none + 1
    shifted = groups[order] * span + values[order]
    least = np.minimum.accumulate(shifted[::-1])[::-1] - groups[order] * span
    out = np.empty_like(least)
    out[order] = least
    return np.asarray(out, dtype=np.int64)


def _reasons(codes: np.ndarray[Any, Any], missing: np.ndarray[Any, Any]) -> pa.Array:
    names = pa.array(CLOSED_BY, pa.string())
    return names.take(pa.array(codes, pa.int64(), mask=missing))


def _refuse_what_is_not_a_change_log(changes: pa.Table) -> None:
    ops = changes.column("op")
    unknown = pc.invert(pc.is_in(ops, value_set=_OPS))
    unknown = pc.fill_null(unknown, True)
    no_row_id = pc.and_(pc.is_in(ops, value_set=_ROW_OPS), pc.is_null(changes.column("row_id")))
    first_unknown = pc.index(unknown, True).as_py()
    first_no_row_id = pc.index(no_row_id, True).as_py()
    if first_unknown < 0 and first_no_row_id < 0:
        return
    if first_no_row_id < 0 or 0 <= first_unknown < first_no_row_id:
        i = first_unknown
        session, op = changes.column("session")[i].as_py(), ops[i].as_py()
        raise ValueError(f"change {i} of session {session!r}: unknown op {op!r}")
    i = first_no_row_id
    topic, session = changes.column("topic")[i].as_py(), changes.column("session")[i].as_py()
    raise ValueError(f"session {session!r} of topic {topic!r}: {ops[i].as_py()} without a row_id")
