"""Settling a bucket of a session table in Arrow when it matches the change log.

:func:`~inorder.sessions.tables_check_rows.compare_bucket` turns every change row and every
table row of a bucket into Python objects (row data decoded, keys as tuples, dictionaries of
rows and versions) to find and describe discrepancies. A table that matches its change log
has none, and that can be shown in Arrow, column against column: :func:`matches` rebuilds
the live rows and lists the versions of the change log with sorts, group-bys and a join, and
compares them with the table's rows key for key and row data for row data.

It only ever answers "nothing to report" when the Python comparison would report nothing:
it gives up (``False``) on anything it does not settle exactly (null keys, keys held twice,
different column types, row data that differs as text, which may still decode equal), and
the bucket is then compared in Python as before, messages and all. Row data is compared as
stored (the JSON text, or the typed columns): equal text decodes to equal data.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inorder.sessions.rebuild import CLEARING_OPS
from inorder.sessions.tables_check_log import ChangeLogView

_ROW_OPS = pa.array(["insert", "update", "delete"])
_SET_OPS = pa.array(["insert", "update"])
_CLEARING = pa.array(list(CLEARING_OPS))
_LIVE_KEY = ["topic", "session", "row_id"]
_VERSION_KEY = ["topic", "session", "row_id", "partition"]


def matches(
    data: pa.Table, log: ChangeLogView, through: int, history: bool
) -> tuple[int, int] | None:
    """``(rows, versions)`` the bucket's comparison counts when ``data`` (a table's rows of
    the bucket's sessions) matches ``log`` as of batch ``through`` with nothing to report;
    ``None`` when that is not shown here (the bucket is then compared in Python)."""
    try:
        live = data.filter(pc.equal(data.column("is_current"), True)) if history else data
        want = _want_live(log, through)
        if want is None or not _same(want, live, _LIVE_KEY, _LIVE_KEY, log.format.columns):
            return None
        if not history:
            return want.num_rows, 0
        versions = _want_versions(log, through)
        if versions is None or not _versions_match(data, versions, log.format.columns):
            return None
        return want.num_rows, versions.num_rows
    except (pa.ArrowException, KeyError, ValueError, TypeError):
        return None


def _want_live(log: ChangeLogView, through: int) -> pa.Table | None:
    """The live rows of the change log after batch ``through`` (key and row data columns),
    as :meth:`ChangeLogView.live` has them; ``None`` when not derived here."""
    columns = [*_LIVE_KEY, *log.format.columns]
    rows = log.upto(through)
    if rows is None:
        return None
    if rows.num_rows == 0:
        return rows.select(columns)
    ops = rows.column("op")
    if log.drop:  # an end takes the session's rows out of the tables, as a clear
        ops = pc.if_else(pc.equal(ops, "end"), "clear", ops)
    touching = pc.is_in(ops, _ROW_OPS)
    if any(rows.column(c).filter(touching).null_count for c in _LIVE_KEY):
        return None
    if rows.column("topic").null_count or rows.column("session").null_count:
        return None
    # Application order, as rebuild_tables sorts: topic, partition, offset, op rank, then
    # the order of the rows (batch after batch).
    rank = pc.if_else(
        pc.is_in(ops, _CLEARING),
        pa.scalar(0, pa.int8()),
        pc.if_else(pc.equal(ops, "end"), pa.scalar(2, pa.int8()), pa.scalar(1, pa.int8())),
    )
    n = rows.num_rows
    keyed = pa.table(
        {
            "topic": rows.column("topic"),
            "partition": rows.column("partition"),
            "offset": rows.column("offset"),
            "rank": rank,
            "ordinal": pa.array(np.arange(n, dtype=np.int64)),
        }
    )
    order = pc.sort_indices(
        keyed, [(c, "ascending") for c in ("topic", "partition", "offset", "rank", "ordinal")]
    )
    # pos: each row's place in application order.
    pos = np.empty(n, dtype=np.int64)
    pos[order.to_numpy()] = np.arange(n, dtype=np.int64)
    steps = pa.table(
        {
            "topic": rows.column("topic"),
            "session": rows.column("session"),
            "row_id": rows.column("row_id"),
            "pos": pa.array(pos),
        }
    )
    cuts = (
        steps.filter(pc.is_in(ops, _CLEARING))
        .group_by(["topic", "session"], use_threads=False)
        .aggregate([("pos", "max")])
        .rename_columns(["topic", "session", "cut"])
    )
    changed = steps.filter(touching)
    if cuts.num_rows:
        changed = changed.join(
            cuts, ["topic", "session"], join_type="left outer", use_threads=False
        )
        after = pc.or_kleene(
            pc.is_null(changed.column("cut")), pc.greater(changed["pos"], changed["cut"])
        )
        changed = changed.filter(pc.fill_null(after, False))
    last = changed.group_by(_LIVE_KEY, use_threads=False).aggregate([("pos", "max")])
    # The row each last change is: pos -> row index.
    at = order.to_numpy()[last.column("pos_max").to_numpy()]
    picked = rows.take(pa.array(at))
    kept_ops = ops.take(pa.array(at))
    return picked.filter(pc.is_in(kept_ops, _SET_OPS)).select(columns)


def _want_versions(log: ChangeLogView, through: int) -> pa.Table | None:
    """The versions the change log opens through batch ``through`` (key, offset, row data)."""
    rows = log.upto(through)
    if rows is None:
        return None
    rows = rows.filter(pc.is_in(rows.column("op"), _SET_OPS))
    return rows.select([*_VERSION_KEY, "offset", *log.format.columns]).rename_columns(
        [*_VERSION_KEY, "valid_from_offset", *log.format.columns]
    )


def _versions_match(data: pa.Table, want: pa.Table, values: list[str]) -> bool:
    """Every history version held once, ``is_current`` exactly without an end, the versions
    of a row not overlapping, and the versions those the change log opens."""
    key = [*_VERSION_KEY, "valid_from_offset"]
    is_current, ends = data.column("is_current"), data.column("valid_to_offset")
    if is_current.null_count:
        return False
    if pc.all(pc.equal(is_current, pc.is_null(ends))).as_py() is False:
        return False
    if not _same(want, data, key, key, values):
        return False
    ordered = data.select([*key, "valid_to_offset"]).sort_by([(c, "ascending") for c in key])
    if ordered.num_rows < 2:
        return True
    same_row = _same_as_previous(ordered, _VERSION_KEY)
    end = ordered.column("valid_to_offset").combine_chunks()[:-1]
    following = ordered.column("valid_from_offset").combine_chunks()[1:]
    overlap = pc.or_kleene(pc.is_null(end), pc.greater(end, following))
    bad = pc.and_kleene(same_row, pc.fill_null(overlap, True))
    return not pc.any(bad).as_py()


def _same(
    want: pa.Table, got: pa.Table, want_key: list[str], got_key: list[str], values: list[str]
) -> bool:
    """Whether ``got`` holds each key of ``want`` once, with the same row data, and no other."""
    if want.num_rows != got.num_rows:
        return False
    if want.num_rows == 0:
        return True
    if any(got.column(c).null_count or want.column(c).null_count for c in got_key):
        return False
    a = want.select([*want_key, *values]).sort_by([(c, "ascending") for c in want_key])
    b = got.select([*got_key, *values]).sort_by([(c, "ascending") for c in got_key])
    for x, y in zip(a.columns, b.columns, strict=True):
        if x.type != y.type or not x.combine_chunks().equals(y.combine_chunks()):
            return False
    # Equal sorted keys: each held once on both sides when the want's keys are distinct.
    return a.num_rows < 2 or not pc.any(_same_as_previous(a, want_key)).as_py()


def _same_as_previous(ordered: pa.Table, key: list[str]) -> pa.Array:
    """For each row but the first of ``ordered`` (sorted, no null key): whether its key
    columns equal the previous row's."""
    same: pa.Array | None = None
    for c in key:
        col = ordered.column(c).combine_chunks()
        eq = pc.equal(col[1:], col[:-1])
        same = eq if same is None else pc.and_(same, eq)
    assert same is not None
    return same
