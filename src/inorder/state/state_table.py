"""State files' tables: the rows of one or several partitions' changes as one Arrow table
of :data:`~inorder.state.checkpoint.STATE_FILE_SCHEMA`, and back."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from inorder.state.cache import Row
from inorder.state.checkpoint import META_KEY, STATE_FILE_SCHEMA


def rows_of_table(table: pa.Table) -> tuple[list[tuple[str, Row]], list[str]]:
    """A state file's table as its upserts (key, stored row) and its deleted keys."""
    cols = {name: table.column(name).to_pylist() for name in STATE_FILE_SCHEMA.names}
    upserts: list[tuple[str, Row]] = []
    deletes: list[str] = []
    for i, key in enumerate(cols["key"]):
        if cols["deleted"][i]:
            deletes.append(key)
            continue
        upserts.append(
            (
                key,
                (
                    cols["state"][i],
                    cols["last_offset"][i],
                    cols["last_ts"][i],
                    cols["kafka_key"][i],
                    cols["seq"][i],
                    cols["timer"][i],
                    cols["timer_kind"][i] or 0,
                    bool(cols["ignored"][i]),
                ),
            )
        )
    return upserts, deletes


def table_of_rows(
    upserts: list[tuple[str, Row]], deletes: list[str], meta: dict[str, Any]
) -> pa.Table:
    """A state file's table: ``upserts`` then tombstones of ``deletes``, ``meta`` in its
    schema's metadata."""
    return with_meta(table_of_segments([(upserts, deletes)]), meta)


def with_meta(table: pa.Table, meta: dict[str, Any]) -> pa.Table:
    """``table`` with ``meta`` as its state file metadata."""
    return table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})


def table_of_segments(segments: list[tuple[list[tuple[str, Row]], list[str]]]) -> pa.Table:
    """The rows of several state files in one table, without metadata: each segment's
    upserts, then its tombstones, segment after segment."""
    keys: list[str] = []
    deleted: list[bool] = []
    columns: list[list[Any]] = [[] for _ in range(8)]
    for upserts, deletes in segments:
        keys += [k for k, _ in upserts]
        keys += deletes
        deleted += [False] * len(upserts)
        deleted += [True] * len(deletes)
        pad: list[Any] = [None] * len(deletes)
        for i, column in enumerate(columns):
            column += [r[i] for _, r in upserts]
            column += pad
    types = [f.type for f in STATE_FILE_SCHEMA][2:]
    arrays = [pa.array(keys, pa.string()), pa.array(deleted, pa.bool_())]
    arrays += [pa.array(c, t) for c, t in zip(columns, types, strict=True)]
    return pa.Table.from_arrays(arrays, schema=STATE_FILE_SCHEMA)
