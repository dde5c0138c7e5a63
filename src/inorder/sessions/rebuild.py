"""Rebuild session tables from a change log written by :class:`SessionTables`.

The change rows of a session, applied in order, give its table:

* ``clear``, ``truncate`` and ``reset`` empty the table (a snapshot's ``clear`` is followed by
  its inserts; a ``truncate`` is the source emptying its table, e.g. Debezium's ``op = "t"``;
  a ``reset`` means the session broke a rule and is unknown until its next snapshot),
* ``insert`` / ``update`` set the row, ``delete`` removes it,
* ``end`` leaves the table as it is (the session's final table).

Order: by ``topic``, ``partition``, ``offset``, then within one offset the ops of
:data:`CLEARING_OPS` first, the row changes, ``end`` last, and finally the order rows have in
the input. The op rank makes the result independent of how a dataset's files happen to be
listed (the rows of one offset cannot conflict otherwise: a snapshot's inserts name distinct
rows).

Every session that appears in the change log is in the result, with an empty table if it has
no rows (e.g. after a ``reset``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from inorder.errors import InorderError

#: Session tables: ``(topic, session) -> {row_id: row}``.
Tables = dict[tuple[str, str], dict[str, dict[str, Any]]]

#: Columns that are not row data in a typed change log (everything else is a row field).
NON_ROW_COLUMNS = frozenset(
    {"topic", "partition", "offset", "kafka_ts", "session", "seq", "op", "row_id", "batch_id"}
)
#: Columns every change log has.
REQUIRED_COLUMNS = ("topic", "partition", "offset", "session", "op", "row_id")

#: Change-log ops that empty a session's table: a snapshot starting (``clear``), the source
#: emptying its table (``truncate``), a session reset after a broken rule (``reset``).
CLEARING_OPS = ("clear", "truncate", "reset")


def read_changes(
    source: pa.Table | str, storage_options: Mapping[str, str] | None = None
) -> pa.Table:
    """The change log as one Arrow table: a table as is, a Delta table, or a Parquet dataset.

    ``source`` is a local path or URI (``s3://bucket/prefix``). ``storage_options`` uses the
    object_store keys (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_REGION``, ``AWS_ALLOW_HTTP``).

    A dataset written by :class:`~inorder.sinks.parquet.ParquetSink` (it has an
    ``_inorder/commits`` folder) is read through its commit log
    (:func:`~inorder.sinks.parquet.read_committed`): exactly the committed rows, never a
    batch being published nor both copies of rows during a compaction's grace period. Any
    other Parquet dataset is listed: hive-style directories (``topic=a/``) become columns;
    files and directories starting with ``_`` or ``.`` (staging, logs) are skipped.
    """
    if isinstance(source, pa.Table):
        return source
    fs, path = _filesystem(source, storage_options)
    if fs.get_file_info(path.rstrip("/") + "/_delta_log").type == pafs.FileType.Directory:
        from deltalake import DeltaTable

        # pyarrow's own filesystem, not deltalake's Python one: see inorder.sinks.delta_read.
        delta = DeltaTable(source, storage_options=dict(storage_options or {}))
        files = pafs.SubTreeFileSystem(path.rstrip("/"), fs)
        table: pa.Table = delta.to_pyarrow_dataset(filesystem=files).to_table()
        return table
    if fs.get_file_info(path.rstrip("/") + "/_inorder/commits").type == pafs.FileType.Directory:
        from inorder.sinks.parquet import read_committed

        try:
            return read_committed(source, storage_options)
        except (OSError, pa.ArrowInvalid) as exc:
            raise InorderError(f"cannot read change log at {source}: {exc}") from None
    import pyarrow.dataset as ds  # it imports pandas: only where a dataset is read

    try:
        dataset = ds.dataset(path, filesystem=fs, format="parquet", partitioning="hive")
        return dataset.to_table()
    except (OSError, pa.ArrowInvalid) as exc:
        raise InorderError(f"cannot read change log at {source}: {exc}") from None


def _filesystem(
    source: str, storage_options: Mapping[str, str] | None
) -> tuple[pafs.FileSystem, str]:
    parsed = urlparse(source)
    if parsed.scheme in ("s3", "s3a") and storage_options:
        opts = {k.upper(): v for k, v in storage_options.items()}
        kwargs: dict[str, Any] = {}
        endpoint = opts.get("AWS_ENDPOINT_URL") or opts.get("AWS_ENDPOINT")
        if endpoint:
            ep = urlparse(endpoint)
            kwargs["endpoint_override"] = ep.netloc or ep.path
            kwargs["scheme"] = ep.scheme or "https"
        if opts.get("AWS_ACCESS_KEY_ID"):
            kwargs["access_key"] = opts["AWS_ACCESS_KEY_ID"]
            kwargs["secret_key"] = opts.get("AWS_SECRET_ACCESS_KEY", "")
        if opts.get("AWS_REGION"):
            kwargs["region"] = opts["AWS_REGION"]
        return pafs.S3FileSystem(**kwargs), parsed.netloc + parsed.path
    if parsed.scheme in ("", "file"):
        return pafs.LocalFileSystem(), parsed.path if parsed.scheme else source
    fs, path = pafs.FileSystem.from_uri(source)
    return fs, path


def ordered_changes(changes: pa.Table) -> pa.Table:
    """The change rows in application order (see the module docstring), with the row data."""
    missing = [c for c in REQUIRED_COLUMNS if c not in changes.column_names]
    if missing:
        raise InorderError(f"not a session change log: missing column(s) {', '.join(missing)}")
    ops = changes.column("op")
    # Within one offset: the clearing ops (0), then row changes (1), then end (2).
    rank = pc.if_else(
        pc.is_in(ops, value_set=pa.array(CLEARING_OPS)),
        pa.scalar(0, pa.int8()),
        pc.if_else(pc.equal(ops, "end"), pa.scalar(2, pa.int8()), pa.scalar(1, pa.int8())),
    )
    keyed = changes.append_column("__rank", rank).append_column(
        "__ordinal", pa.array(range(changes.num_rows), pa.int64())
    )
    order = pc.sort_indices(
        keyed,
        sort_keys=[
            ("topic", "ascending"),
            ("partition", "ascending"),
            ("offset", "ascending"),
            ("__rank", "ascending"),
            ("__ordinal", "ascending"),
        ],
    )
    return keyed.take(order).drop_columns(["__rank", "__ordinal"])


def rebuild_tables(
    changes: pa.Table | str, storage_options: Mapping[str, str] | None = None
) -> Tables:
    """Apply a session change log: ``{(topic, session): {row_id: row dict}}``.

    ``changes`` is an Arrow table or the location of the output (see :func:`read_changes`).
    Works for both output shapes: the JSON ``row`` column, or typed rows (one column per field,
    every column that is not a change-log column is a row field).
    """
    table = ordered_changes(read_changes(changes, storage_options))
    row_columns = _row_columns(table)
    topics = table.column("topic").to_pylist()
    sessions = table.column("session").to_pylist()
    ops = table.column("op").to_pylist()
    row_ids = table.column("row_id").to_pylist()
    if row_columns is None:
        decode = msgspec.json.decode
        rows: list[Any] = [
            None if text is None else decode(text) for text in table.column("row").to_pylist()
        ]
    else:
        rows = table.select(row_columns).to_pylist()
    tables: Tables = {}
    for topic, session, op, rid, row in zip(topics, sessions, ops, row_ids, rows, strict=True):
        key = (topic, session)
        current = tables.get(key)
        if current is None:
            current = tables[key] = {}
        if op == "insert" or op == "update":
            current[rid] = row
        elif op == "delete":
            current.pop(rid, None)
        elif op in CLEARING_OPS:
            current.clear()
        # "end": the table stays as it is
    return tables


def _row_columns(table: pa.Table) -> list[str] | None:
    """None for the JSON ``row`` column, else the typed row columns (input order)."""
    if "row" in table.column_names:
        return None
    return [c for c in table.column_names if c not in NON_ROW_COLUMNS]


#: DuckDB query giving the current rows of every session from a change log named ``changes``
#: (columns: topic, session, row_id, then ``row`` or the typed row columns via ``{row_cols}``).
TABLES_SQL = """
WITH c AS (
    SELECT *, row_number() OVER (
        PARTITION BY topic, session
        ORDER BY "partition", "offset",
                 CASE WHEN op IN ('clear', 'truncate', 'reset') THEN 0
                      WHEN op = 'end' THEN 2 ELSE 1 END,
                 __ordinal
    ) AS pos
    FROM changes
),
cut AS (
    SELECT topic, session,
           max(pos) FILTER (WHERE op IN ('clear', 'truncate', 'reset')) AS cut_pos
    FROM c GROUP BY topic, session
),
latest AS (
    SELECT c.*, row_number() OVER (
        PARTITION BY c.topic, c.session, c.row_id ORDER BY c.pos DESC
    ) AS rn
    FROM c JOIN cut USING (topic, session)
    WHERE c.row_id IS NOT NULL AND (cut.cut_pos IS NULL OR c.pos > cut.cut_pos)
)
SELECT topic, session, row_id, {row_cols}
FROM latest
WHERE rn = 1 AND op IN ('insert', 'update')
"""


def rebuild_tables_duckdb(
    changes: pa.Table | str, storage_options: Mapping[str, str] | None = None
) -> Tables:
    """Same result as :func:`rebuild_tables`, computed by DuckDB (:data:`TABLES_SQL`).

    The change log is read with pyarrow (so S3 works without DuckDB extensions) and queried in
    place; useful as an independent check and as a template for ad-hoc SQL.
    """
    import duckdb

    table = read_changes(changes, storage_options)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise InorderError(f"not a session change log: missing column(s) {', '.join(missing)}")
    row_columns = _row_columns(table)
    selected = "row" if row_columns is None else ", ".join(f'"{c}"' for c in row_columns)
    changes_table = table.append_column(  # queried by name in DuckDB
        "__ordinal", pa.array(range(table.num_rows), pa.int64())
    )
    con = duckdb.connect()
    try:
        con.register("changes", changes_table)
        live: pa.Table = con.sql(TABLES_SQL.format(row_cols=selected)).to_arrow_table()
        sessions = con.execute("SELECT DISTINCT topic, session FROM changes").fetchall()
    finally:
        con.close()
    tables: Tables = {(topic, session): {} for topic, session in sessions}
    topics = live.column("topic").to_pylist()
    names = live.column("session").to_pylist()
    row_ids = live.column("row_id").to_pylist()
    if row_columns is None:
        decode = msgspec.json.decode
        rows: list[Any] = [decode(text) for text in live.column("row").to_pylist()]
    else:
        rows = live.select(row_columns).to_pylist()
    for topic, session, rid, row in zip(topics, names, row_ids, rows, strict=True):
        tables[(topic, session)][rid] = row
    return tables
