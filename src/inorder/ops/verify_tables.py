"""The commit proofs of Delta and Iceberg tables, gathered for :mod:`inorder.ops.verify`.

* **Delta**: the ``commitInfo`` of every version in the log (``inorder.batch-id``,
  ``inorder.offsets``, ``inorder.files``) of the sink's app id, and the table's current
  files (``add`` actions: path and ``numRecords``).
* **Iceberg**: the batch summaries among the current snapshot's ancestors and the files of
  the current snapshot's scan (path and ``record_count``).

Table readers read only the files the log or snapshot names, so a file in the directory
that no commit names is invisible to them and is not a problem; a file the table names
whose name says it was written for batch ``B`` while batch ``B``'s commit did not record it
is one (it was added outside the batch's commit).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from inorder.ops.verify_evidence import BatchProof, Evidence, FileProof, Problem
from inorder.sinks.commit_keys import (
    APP_ID_KEY,
    BATCH_ID_KEY,
    COMPACT,
    FILES_KEY,
    OFFSETS_KEY,
    OPERATION_KEY,
)
from inorder.sinks.commit_log import file_batch_id


def _batch(props: dict[str, Any], where: str, evidence: Evidence, seen: dict[int, str]) -> None:
    bid = int(props[BATCH_ID_KEY])
    if bid in seen:
        evidence.problems.append(
            Problem(
                "committed_twice",
                f"committed by {seen[bid]} and again by {where}: its rows are in the table twice",
                bid,
            )
        )
    seen[bid] = where
    offsets = props.get(OFFSETS_KEY)
    ranges = None
    if offsets is not None:
        ranges = {k: (int(a), int(b)) for k, (a, b) in json.loads(offsets).items()}
    files = [
        FileProof(path, int(rows), digest, bid)
        for path, (rows, digest) in json.loads(props.get(FILES_KEY, "{}")).items()
    ]
    evidence.batches.append(BatchProof(bid, ranges, files, files_recorded=FILES_KEY in props))


def _live(
    evidence: Evidence,
    current: list[tuple[str, int]],
    merged: dict[str, FileProof] | None = None,
) -> None:
    """The table's current files, with the rows and digest their batch (or the compaction
    that wrote them, ``merged``) recorded."""
    recorded = {**(merged or {}), **{f.path: f for b in evidence.batches for f in b.files}}
    listed = {b.batch_id for b in evidence.batches if b.files_recorded}
    unproven = 0
    for path, rows in current:
        proof = recorded.get(path)
        if proof is not None:
            evidence.live.append(FileProof(path, rows, proof.digest, proof.batch))
            if rows != proof.rows:
                evidence.problems.append(
                    Problem(
                        "row_count",
                        f"the table says {rows:,} rows, the batch commit recorded {proof.rows:,}",
                        proof.batch,
                        file=path,
                    )
                )
            continue
        evidence.live.append(FileProof(path, rows, None, None))
        unproven += 1
        bid = file_batch_id(path.rsplit("/", 1)[-1])
        if bid is not None and bid in listed:
            evidence.problems.append(
                Problem(
                    "uncommitted_visible",
                    "readers of the table read it, but its batch's commit did not name it",
                    bid,
                    file=path,
                )
            )
    if unproven:
        evidence.notes.append(
            f"{unproven} live file(s) were added by commits that record no proof (a "
            "compaction, a repair, another writer, or a release before commits carried "
            "proofs): checked against the table's own row counts, without digests"
        )


def collect_delta(sink: Any, owner: str | None) -> Evidence:
    """The evidence of a :class:`~inorder.sinks.delta.DeltaSink`'s table."""
    from deltalake import DeltaTable

    if owner is not None:
        sink.bind(owner)
    loc = sink.location
    table = DeltaTable(loc.delta_uri(), storage_options=loc.storage_options())
    evidence = Evidence("delta", sink.describe(), loc, [], [])
    seen: dict[int, str] = {}
    history = sorted(table.history(), key=lambda h: int(h.get("version", 0)))
    if history and int(history[0].get("version", 0)) > 0:
        evidence.notes.append(
            f"the log starts at version {history[0]['version']} (older entries were cleaned "
            "up): batches before it are not checked"
        )
    merged: dict[str, FileProof] = {}
    for entry in history:
        if entry.get(APP_ID_KEY) == sink.app_id and BATCH_ID_KEY in entry:
            _batch(entry, f"version {entry.get('version')}", evidence, seen)
        elif entry.get(OPERATION_KEY) == COMPACT and FILES_KEY in entry:
            for path, (rows, digest) in json.loads(entry[FILES_KEY]).items():
                merged[path] = FileProof(path, int(rows), digest, None)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    current = [
        (str(p), int(n or 0)) for p, n in zip(actions["path"], actions["num_records"], strict=True)
    ]
    _live(evidence, current, merged)
    return evidence


def collect_iceberg(sink: Any, owner: str | None) -> Evidence:
    """The evidence of an :class:`~inorder.sinks.iceberg.IcebergSink`'s table."""
    from inorder.sinks.iceberg_history import batch_summaries

    if owner is not None:
        sink.bind(owner)
    table = sink.load_table()
    evidence = Evidence("iceberg", sink.describe(), sink.location, [], [])
    if table is None:
        evidence.notes.append("the table does not exist yet")
        return evidence
    seen: dict[int, str] = {}
    summaries = batch_summaries(table, sink.app_id)
    for n, summary in enumerate(reversed(summaries)):
        _batch(summary, f"batch snapshot #{n + 1}", evidence, seen)
    root = table.location().rstrip("/") + "/"
    current = (
        [
            (task.file.file_path.removeprefix(root), int(task.file.record_count))
            for task in table.scan().plan_files()
        ]
        if table.current_snapshot() is not None
        else []
    )
    _live(evidence, current)
    return evidence
