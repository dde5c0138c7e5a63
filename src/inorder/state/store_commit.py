"""Committing a task's partitions: their deltas built together, written as a file per
partition (state format 2) or one file per task (format 3), then each cache moved."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from inorder.state.cache import Row
from inorder.state.entry import KeyEntry, PartitionMeta
from inorder.state.state_table import table_of_segments, with_meta
from inorder.state.store import PartitionStore

#: Rows of deltas built into one table at a time: enough to gather thousands of small deltas,
#: few enough that a task's large deltas are not all held in memory at once.
TABLE_ROWS = 16_384


def commit_partitions(
    commits: Iterable[tuple[PartitionStore, dict[str, KeyEntry | None], PartitionMeta]],
) -> None:
    """Commit this batch's changes of several open partitions (of one task): each writes
    its delta, moves its cache and maybe writes a snapshot, as :meth:`PartitionStore.commit`.

    The rows of consecutive deltas, up to about :data:`TABLE_ROWS`, become one Arrow table:
    with ``delta_files = "partition"`` each file is a slice of it (building a table costs
    ~100 us whatever its rows, which at thousands of partitions per task, a few keys each, was
    a fifth of the state commit); with ``"task"`` the table is one task file, and task files
    no partition needs any more are deleted. ``commits`` is consumed as it goes, a table's
    worth at a time.
    """
    chunk: list[tuple[PartitionStore, dict[str, KeyEntry | None], PartitionMeta]] = []
    rows = 0
    keep: dict[tuple[str, int], int] = {}
    last: PartitionStore | None = None
    for commit in commits:
        chunk.append(commit)
        rows += len(commit[1])
        if rows >= TABLE_ROWS:
            _commit_together(chunk, keep)
            chunk, rows = [], 0
        last = commit[0]
    if chunk:
        _commit_together(chunk, keep)
    if keep and last is not None and last.listed is not None:
        for path in last.listed.unneeded(last.batch_id, keep):
            last.checkpoint.delete(path)


def _commit_together(
    commits: list[tuple[PartitionStore, dict[str, KeyEntry | None], PartitionMeta]],
    keep: dict[tuple[str, int], int],
) -> None:
    """Commit ``commits`` with their deltas built as one table (:func:`commit_partitions`);
    with task files, each partition's ``keep_from`` goes into ``keep``."""
    started = time.perf_counter()
    parts: list[tuple[PartitionStore, list[tuple[str, Row]], list[str], dict[str, Any]]] = []
    for store, changes, meta in commits:
        store.stats.changed_keys = len(changes)
        doc = {"version": store.batch_id, "epoch": store.epoch, "meta": meta.to_json()}
        parts.append((store, *store.delta_rows(changes), doc))
    table = table_of_segments([(upserts, deletes) for _, upserts, deletes, _ in parts])
    if parts and parts[0][0].options.delta_files == "task":
        _write_task_file(parts, table, keep, started)
        return
    shared = (time.perf_counter() - started) / max(len(parts), 1)
    offset = 0
    for store, upserts, deletes, doc in parts:
        own = time.perf_counter()
        if store.listed is not None and store.listed.files:
            # Task files of an earlier run in task files go by the same rule (never otherwise).
            keep[(store.tp.topic, store.tp.partition)] = store.keep_from(store.snapshot_due())
        rows = len(upserts) + len(deletes)
        piece = with_meta(table.slice(offset, rows), doc)
        offset += rows
        store.write_delta(piece, upserts, deletes, doc)
        store.stats.commit_seconds = shared + time.perf_counter() - own


def _write_task_file(
    parts: list[tuple[PartitionStore, list[tuple[str, Row]], list[str], dict[str, Any]]],
    table: pa.Table,
    keep: dict[tuple[str, int], int],
    started: float,
) -> None:
    """Write ``parts``' deltas (``table``) as one task file, then advance each partition."""
    first = parts[0][0]
    index: list[Any] = []
    offset = 0
    for store, upserts, deletes, doc in parts:
        rows = len(upserts) + len(deletes)
        keep_from = store.keep_from(snapshot_now=store.snapshot_due())
        keep[(store.tp.topic, store.tp.partition)] = keep_from
        index.append([store.tp.topic, store.tp.partition, offset, rows, doc["meta"], keep_from])
        offset += rows
    attempt, size = first.checkpoint.write_task_file(first.batch_id, first.epoch, table, index)
    shared = (time.perf_counter() - started) / len(parts)
    for store, upserts, deletes, doc in parts:
        own = time.perf_counter()
        store.stats.delta_bytes = size * (len(upserts) + len(deletes)) // max(offset, 1)
        store.advance(upserts, deletes, doc, attempt)
        store.stats.commit_seconds = shared + time.perf_counter() - own
