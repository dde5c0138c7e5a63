"""Checking an Iceberg session table's commits against the change log (``inorder validate``).

The batch commits on the lineage of the table's current snapshot (a rollback leaves the
others off it) must apply the batches ``inorder.first_batch``..``inorder.batch`` in order
from batch 0 without overlap, skipping only batches that change nothing in the table, and
each commit's ``inorder.offsets`` must be the change rows' offset range per
``topic/partition``. A commit that emptied the table for a repair names the batch it set the
table back to and no first batch. The rows are then compared as for a Delta table
(:mod:`inorder.sessions.tables_check`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from inorder.sessions.tables_check_log import CommitLog, TableCheck, batch_commit, gap
from inorder.sessions.tables_delta import BATCH_KEY, FIRST_BATCH_KEY, OFFSETS_KEY
from inorder.sessions.tables_iceberg import IcebergTableOutput


def iceberg_commits(
    table: IcebergTableOutput,
) -> tuple[Any, int | None, list[tuple[Any, dict[str, str]]]]:
    """The opened table, its current snapshot id and its batch commits, oldest first."""
    ice = table.open()
    snapshot = ice.current_snapshot()
    version = None if snapshot is None else int(snapshot.snapshot_id)
    return ice, version, list(table.commits(ice))[::-1]


def walk_iceberg(
    check: TableCheck, commits: list[tuple[Any, dict[str, str]]], log: CommitLog
) -> int:
    """The last batch the table holds, its commits (oldest first) checked into ``check``."""
    held = -1
    check.first_batch = 0
    for found, props in commits:
        where = f"snapshot {found.snapshot_id}"
        last = int(props[BATCH_KEY])
        first_given = props.get(FIRST_BATCH_KEY)
        if first_given is None:  # emptied by a repair: the table holds batches through last
            if last > held:
                gap(check, log, held + 1, last, where)
            held = last
            continue
        batches = (int(first_given), last)
        held = batch_commit(check, log, where, held, batches, props.get(OFFSETS_KEY))
    return held


def iceberg_rows(ice: Any) -> Iterator[pa.RecordBatch]:
    """The rows of the table's current snapshot, record batch after record batch."""
    if ice.current_snapshot() is None:
        return
    yield from ice.scan().to_arrow_batch_reader()
