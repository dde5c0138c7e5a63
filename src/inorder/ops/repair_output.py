"""Deleting a pipeline's output rows from given offsets on, per topic-partition, safely.

* **Delta**: one ``DELETE`` transaction with a predicate on ``topic``, ``partition`` and
  ``offset``: readers see the table before or after it, never in between; the application
  transactions (``txn``) of the writing query stay in the log.
* **Parquet** (the manifest protocol of :mod:`inorder.sinks.parquet`): every committed file
  holding affected rows is rewritten without them as a staged file
  (``_inorder/staging/r<seq>-<id>/...parquet.staged``: no ``*.parquet`` glob of the dataset
  matches it, so a repair killed before its commit point leaves nothing visible); one
  *repair manifest* ``_inorder/compactions/<seq:020d>.json`` (``"kind": "repair"``) lists
  the files it replaces and their rewritten copies (none when every row of a file goes),
  created if absent: that is the commit point, after which
  :func:`~inorder.sinks.parquet.read_committed` (and every reader of the committed file
  list) reads the new set. The new files are then published,
  ``.done`` is written, and the replaced files are deleted at once (``.cleaned``): they hold
  exactly the rows being removed, so listing readers must stop seeing them.

The pipeline must be stopped meanwhile (its writer owns pending batch manifests).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from inorder.errors import InorderError
from inorder.records import TopicPartition
from inorder.sinks.base import Sink, stored
from inorder.storage import fs as sfs


@dataclass
class OutputDeletion:
    """What deleting rows from one output does (or did)."""

    name: str
    """``output`` or ``dead-letter``."""
    describe: str
    kind: str
    rows: int = 0
    rows_by_partition: dict[str, int] = field(default_factory=dict)
    files_rewritten: int = 0
    files_removed: int = 0
    detail: str = ""
    """Parquet: the repair manifest written; Delta: the predicate."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return {
            "output": self.name,
            "sink": self.describe,
            "kind": self.kind,
            "rows": self.rows,
            "rows_by_partition": dict(self.rows_by_partition),
            "files_rewritten": self.files_rewritten,
            "files_removed": self.files_removed,
            "detail": self.detail,
        }


def _kind(sink: Sink) -> str:
    from inorder.ops.output import sink_kind

    return sink_kind(sink)


def count_rows(name: str, sink: Sink, starts: Mapping[TopicPartition, int]) -> OutputDeletion:
    """Rows of ``sink`` at or after ``starts[tp]`` per topic-partition (nothing is changed)."""
    from inorder.ops.output import OutputView

    kind = _kind(sink)
    result = OutputDeletion(name, sink.describe(), kind)
    view = OutputView(sink)
    if view.empty:
        return result
    for tp, start in sorted(starts.items()):
        n = view.count(tp, start=start)
        if n:
            result.rows_by_partition[str(tp)] = n
            result.rows += n
    if kind == "delta":
        result.detail = delta_predicate(starts)
    return result


def delete_rows(name: str, sink: Sink, starts: Mapping[TopicPartition, int]) -> OutputDeletion:
    """Delete the rows at or after ``starts[tp]``; idempotent (nothing left: nothing done)."""
    planned = count_rows(name, sink, starts)
    if planned.rows == 0:
        return planned
    if planned.kind == "delta":
        _delete_delta(sink, starts, planned)
    elif planned.kind == "iceberg":
        from inorder.sinks.iceberg import IcebergSink

        assert isinstance(sink, IcebergSink)
        chosen = {tp: s for tp, s in starts.items() if str(tp) in planned.rows_by_partition}
        sink.delete_from(
            {(tp.topic, tp.partition): start for tp, start in chosen.items()}, planned.rows
        )
        planned.detail = delta_predicate(chosen)
    else:
        _delete_parquet(sink, starts, planned)
    return planned


# -- Delta ------------------------------------------------------------------------------------


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def delta_predicate(starts: Mapping[TopicPartition, int]) -> str:
    """The SQL predicate selecting rows at or after each partition's start offset."""
    terms = [
        f'(topic = {_sql_string(tp.topic)} AND "partition" = {tp.partition} '
        f'AND "offset" >= {start})'
        for tp, start in sorted(starts.items())
    ]
    return " OR ".join(terms) if terms else "false"


def _delete_delta(sink: Sink, starts: Mapping[TopicPartition, int], result: OutputDeletion) -> None:
    from deltalake import DeltaTable

    loc = stored(sink).location
    secrets = (loc.s3.secret_access_key,) if loc.s3 else ()
    # Only partitions that have rows to delete: a shorter predicate, the same effect.
    chosen = {tp: s for tp, s in starts.items() if str(tp) in result.rows_by_partition}
    predicate = delta_predicate(chosen)
    try:
        table = DeltaTable(loc.delta_uri(), storage_options=loc.storage_options())
        metrics = table.delete(predicate)
    except Exception as exc:
        raise InorderError(
            f"{sink.describe()}: DELETE failed: {sfs.describe_error(exc, secrets)}"
        ) from None
    deleted = int(metrics.get("num_deleted_rows", result.rows))
    if deleted != result.rows:
        raise InorderError(
            f"{sink.describe()}: DELETE removed {deleted} rows, {result.rows} were counted "
            "(is the pipeline still running?)"
        )
    result.files_rewritten = int(metrics.get("num_added_files", 0))
    result.files_removed = int(metrics.get("num_removed_files", 0))
    result.detail = predicate


# -- Parquet ----------------------------------------------------------------------------------


def _delete_mask(
    table: pa.Table, values: Mapping[str, str | None], starts: Mapping[TopicPartition, int]
) -> pa.Array | None:
    """Per row of a file: whether it is deleted (``None``: no row is)."""
    n = table.num_rows
    topic_col = table.column("topic") if "topic" in table.column_names else None
    part_col = table.column("partition") if "partition" in table.column_names else None
    offsets = table.column("offset")
    mask: Any = None
    for tp, start in starts.items():
        if topic_col is None and values.get("topic") != tp.topic:
            continue
        if part_col is None and values.get("partition") not in (None, str(tp.partition)):
            continue
        hit: Any = pc.greater_equal(offsets, start)
        if topic_col is not None:
            hit = pc.and_(hit, pc.equal(topic_col, tp.topic))
        if part_col is not None:
            hit = pc.and_(hit, pc.equal(part_col, tp.partition))
        mask = hit if mask is None else pc.or_(mask, hit)
    if mask is None or n == 0 or not pc.any(mask).as_py():
        return None
    result: pa.Array = pc.fill_null(mask, False).combine_chunks()
    return result


def _delete_parquet(
    sink: Sink, starts: Mapping[TopicPartition, int], result: OutputDeletion
) -> None:
    from inorder.sinks.commit_log import (
        COMPACTIONS_DIR,
        complete_manifest,
        list_records,
        load_state,
    )
    from inorder.sinks.compaction_records import (
        StagedRecord,
        clean_stale_staging,
        remove_replaced,
    )
    from inorder.sinks.parquet import ParquetSink

    loc = stored(sink).location
    compression = sink.compression if isinstance(sink, ParquetSink) else "zstd"
    # Half-published batches or compactions left by a crash are finished first, as the
    # sink itself would at its next start: the rewrite must see every committed row.
    for rel in load_state(loc).pending:
        complete_manifest(loc, rel)
    state = load_state(loc)
    comp_ids, _, _ = list_records(loc, COMPACTIONS_DIR)
    seq = (comp_ids[-1] + 1) if comp_ids else 0
    replaces: list[str] = []
    deleted = 0
    with StagedRecord(loc, "repair", seq, compression) as record:
        for live in state.files.values():
            full = loc.join(live.path)
            columns = [
                c for c in ("topic", "partition", "offset") if c not in live.partition_values
            ]
            probe = pq.read_table(full, columns=columns, filesystem=loc.filesystem)
            mask = _delete_mask(probe, live.partition_values, starts)
            if mask is None:
                continue
            table = pq.read_table(full, filesystem=loc.filesystem)
            kept = table.filter(pc.invert(mask))
            deleted += table.num_rows - kept.num_rows
            replaces.append(live.path)
            if kept.num_rows == 0:
                result.files_removed += 1
                continue
            directory, _, _ = live.path.rpartition("/")
            stem = f"repaired-{seq:010d}-{len(record.files):05d}"
            record.stage(kept, directory, stem, live.partition_values)
            result.files_rewritten += 1
        if deleted != result.rows:  # the count and the files disagree: change nothing
            raise InorderError(
                f"{loc.uri}: files hold {deleted} rows to delete, the committed view "
                f"counted {result.rows}; nothing changed (is the pipeline still running?)"
            )
        rel = record.commit(
            replaces,
            taken=InorderError(
                f"{loc.uri}: a compaction committed #{seq} meanwhile; run the repair again"
            ),
            starts={str(tp): s for tp, s in sorted(starts.items())},
        )
    # The replaced files hold exactly the rows being removed: listing readers must stop
    # seeing them now, not after a grace period.
    remove_replaced(loc, seq, replaces)
    clean_stale_staging(loc, state.compaction_floor)  # left by killed repairs or compactions
    result.detail = rel
