"""What an Iceberg table's snapshot summaries say about the pipelines that wrote it.

Every snapshot inorder makes carries ``inorder.*`` properties in its summary:

* a **batch** (:class:`~inorder.sinks.iceberg.IcebergSink` commit): ``inorder.app-id`` (the
  writing pipeline checkpoint), ``inorder.batch-id``, ``inorder.offsets`` (per
  ``"<topic>/<partition>"`` the half-open ``[start, end)`` of offsets the batch consumed:
  ``end`` is one past the highest offset consumed, ``start`` the previous batch's ``end``,
  so the ranges of successive batches tile a partition with no gap and no overlap, whether
  or not a record produced a row) and ``inorder.row-offsets`` (first and last offset of the
  rows written);
* a **repair** (``inorder repair``): ``inorder.operation = "repair"`` and
  ``inorder.repair-from`` (per partition, the offset from which rows were deleted: the next
  batch of that partition starts there);
* a **compaction** (``inorder compact``): ``inorder.operation = "compact"``; the same rows
  in fewer files. Neither has a batch id, so they never count as a committed batch.

The exactly-once record of a pipeline is the newest batch summary of its app id among the
current snapshot's ancestors (:func:`last_batch`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from inorder.sinks.base import ConsumedOffsets
from inorder.sinks.commit_keys import APP_ID_KEY as APP_ID_KEY
from inorder.sinks.commit_keys import BATCH_ID_KEY as BATCH_ID_KEY
from inorder.sinks.commit_keys import COMPACT as COMPACT
from inorder.sinks.commit_keys import OFFSETS_KEY as OFFSETS_KEY
from inorder.sinks.commit_keys import OPERATION_KEY as OPERATION_KEY
from inorder.sinks.proof import consumed_ranges

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

ROW_OFFSETS_KEY = "inorder.row-offsets"
REPAIR_FROM_KEY = "inorder.repair-from"
REPAIR = "repair"


def _ancestors(table: Table) -> Iterator[Snapshot]:
    from pyiceberg.table.snapshots import ancestors_of

    yield from ancestors_of(table.current_snapshot(), table.metadata)


def _props(snap: Snapshot) -> dict[str, str]:
    return dict(snap.summary.additional_properties) if snap.summary else {}


def batch_summaries(table: Table, app_id: str | None = None) -> list[dict[str, str]]:
    """The batch summaries of the current snapshot's ancestors, newest first."""
    out: list[dict[str, str]] = []
    for snap in _ancestors(table):
        summary = _props(snap)
        if BATCH_ID_KEY in summary and (app_id is None or summary.get(APP_ID_KEY) == app_id):
            out.append(summary)
    return out


def last_batch(table: Table, app_id: str) -> int | None:
    """The newest batch id ``app_id`` committed in the current snapshot's history."""
    for snap in _ancestors(table):
        props = _props(snap)
        if props.get(APP_ID_KEY) == app_id and BATCH_ID_KEY in props:
            return int(props[BATCH_ID_KEY])
    return None


def total_records(table: Table) -> int:
    """Rows in the current snapshot (from its summary)."""
    snap = table.current_snapshot()
    if snap is None or snap.summary is None:
        return 0
    return int(snap.summary.additional_properties.get("total-records", "0") or 0)


def _positions(table: Table, app_id: str, names: set[str]) -> dict[str, int]:
    """Per partition name, where ``app_id``'s next batch starts by the newest summary
    naming it: the end of a batch's range, or the offset a repair deleted from."""
    found: dict[str, int] = {}
    for snap in _ancestors(table):
        if len(found) == len(names):
            break
        props = _props(snap)
        if props.get(APP_ID_KEY) != app_id:
            continue
        if OFFSETS_KEY in props:
            for name, (_, end) in json.loads(props[OFFSETS_KEY]).items():
                if name in names:
                    found.setdefault(name, int(end))
        if REPAIR_FROM_KEY in props:
            for name, start in json.loads(props[REPAIR_FROM_KEY]).items():
                if name in names:
                    found.setdefault(name, int(start))
    return found


def input_ranges(
    table: Table, app_id: str, consumed: Iterable[ConsumedOffsets]
) -> dict[str, list[int]]:
    """The ``[start, end)`` each partition's batch consumed, for :data:`OFFSETS_KEY`.

    ``end`` is one past the highest offset consumed; ``start`` is where the previous batch
    (or a repair) left the partition, lowered to the batch's first record when the state
    was rewound below it (a repair that deleted no row of the partition). A partition
    that has consumed nothing yet is left out: it covers no offset.
    """
    batch = list(consumed)
    names = {f"{c.topic}/{c.partition}" for c in batch if c.last_offset >= 0}
    return consumed_ranges(batch, _positions(table, app_id, names))


def repair_summary(app_id: str, starts: Mapping[tuple[str, int], int]) -> dict[str, str]:
    """The summary of a repair's delete snapshot (never a batch)."""
    where = {f"{topic}/{partition}": s for (topic, partition), s in sorted(starts.items())}
    return {
        APP_ID_KEY: app_id,
        OPERATION_KEY: REPAIR,
        REPAIR_FROM_KEY: json.dumps(where, separators=(",", ":")),
    }


@dataclass
class SnapshotInfo:
    """One snapshot of the table as ``inorder inspect`` shows it."""

    snapshot_id: int
    committed_at: str
    operation: str
    """Iceberg's operation: append, overwrite, delete."""
    kind: str
    """``batch``, ``repair``, ``compact`` or ``other`` (not written by inorder)."""
    app_id: str | None
    batch_id: int | None
    offsets: dict[str, list[int]] = field(default_factory=dict)
    """Batch: ``[start, end)`` per partition; repair: ``[from, from]``."""
    added_records: int = 0
    deleted_records: int = 0
    total_records: int = 0


def snapshot_history(table: Table, limit: int | None = None) -> list[SnapshotInfo]:
    """The current snapshot's ancestors (the newest ``limit``), oldest first."""
    out: list[SnapshotInfo] = []
    for snap in _ancestors(table):
        if limit is not None and len(out) >= limit:
            break
        props = _props(snap)
        offsets: dict[str, list[int]] = {}
        if BATCH_ID_KEY in props:
            kind = "batch"
            offsets = {k: list(v) for k, v in json.loads(props.get(OFFSETS_KEY, "{}")).items()}
        elif props.get(OPERATION_KEY) in (REPAIR, COMPACT):
            kind = props[OPERATION_KEY]
            offsets = {k: [v, v] for k, v in json.loads(props.get(REPAIR_FROM_KEY, "{}")).items()}
        else:
            kind = "other"
        when = datetime.fromtimestamp(snap.timestamp_ms / 1000, UTC)
        operation = snap.summary.operation.value if snap.summary else "?"
        out.append(
            SnapshotInfo(
                snapshot_id=snap.snapshot_id,
                committed_at=when.isoformat(timespec="seconds"),
                operation=operation,
                kind=kind,
                app_id=props.get(APP_ID_KEY),
                batch_id=int(props[BATCH_ID_KEY]) if BATCH_ID_KEY in props else None,
                offsets=offsets,
                added_records=int(props.get("added-records", 0) or 0),
                deleted_records=int(props.get("deleted-records", 0) or 0),
                total_records=int(props.get("total-records", 0) or 0),
            )
        )
    out.reverse()
    return out


def format_snapshot(s: Mapping[str, object], full: bool = False) -> str:
    """One human line for a :class:`SnapshotInfo` as a dict (``full``: every offset range,
    not a summary past :data:`~inorder.listing.RANGES_LISTED` topic-partitions)."""
    from inorder.listing import ranges_text

    offsets = s.get("offsets") or {}
    assert isinstance(offsets, dict)
    if s["kind"] == "batch":
        what = f"batch {s['batch_id']}"
        ranges = ranges_text(offsets, lambda tp, r: f"{tp} [{r[0]}, {r[1]})", full)
    elif s["kind"] == REPAIR:
        what = "repair"
        ranges = ranges_text(offsets, lambda tp, r: f"{tp} deleted from {r[0]}", full)
    else:
        what, ranges = str(s["kind"]), ""
    return (
        f"snapshot {s['snapshot_id']} {s['committed_at']} {s['operation']:<9} {what:<12} "
        f"+{s['added_records']:,} -{s['deleted_records']:,} rows (total {s['total_records']:,})"
        + (f"  {ranges}" if ranges else "")
    )
