"""What the status page says of a pipeline's committed output: files, rows and bytes, the
rows and files of each batch, and the session resets in it. Parquet, Delta and Iceberg are
each read in their own way (reading one as another only ever fails); nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inorder.records import TopicPartition
from inorder.ui.rows import EventRow, replay_command

#: Session resets listed (the newest ones).
RESETS_SHOWN = 200


@dataclass
class OutputInfo:
    """The committed output: its size and, per output batch id, (rows, files)."""

    kind: str
    location: str
    files: int | None = None
    rows: int | None = None
    bytes: int | None = None
    by_batch: dict[int, tuple[int, int]] | None = None
    resets: list[EventRow] = field(default_factory=list)
    note: str = ""
    #: Parquet: files per compaction level and the merges due now (the compaction backlog).
    compaction: str = ""


#: Reads the session resets of a pyarrow dataset of the output (and whether the scan may
#: filter on the ``op`` column itself).
ResetReader = Callable[..., list[EventRow]]


def read_output(sink: Any, reference: str, batch_offset: int) -> OutputInfo:
    """The committed output of ``sink`` as the page shows it.

    ``reference`` and ``batch_offset`` (this checkpoint's batch b is output batch
    ``batch_offset + b``) build the replay commands of the session resets.
    """
    from inorder.ops.output import sink_kind
    from inorder.sinks.base import stored

    def resets(dataset: Any, pushdown: bool = True) -> list[EventRow]:
        return session_resets(dataset, reference, batch_offset, pushdown)

    try:
        kind = sink_kind(sink)
        if kind == "iceberg":
            return _iceberg_output(sink, resets)
        location = stored(sink).location
    except Exception:
        return OutputInfo("other", sink.describe(), note="not readable")
    shown = str(location.root if hasattr(location, "root") else location)
    if kind == "delta":
        info = _delta_output(location, shown, resets)
        info.compaction = _compaction_backlog(sink)
        return info
    info = _parquet_output(location, shown, resets)
    info.compaction = _compaction_backlog(sink)
    return info


def _compaction_backlog(sink: Any) -> str:
    """Files per level and the merges due, in a few words ("" when it cannot be read)."""
    from inorder.ops.output_files import output_files

    try:
        files = output_files(sink)
    except Exception:  # the page shows what it can: the rest of the output still reads
        return ""
    if files is None:
        return ""
    levels = ", ".join(f"level {lv.level}: {lv.files:,}" for lv in files.levels) or "no files"
    due = (
        f"{files.due_merges:,} merge(s) of {files.due_files:,} files due"
        if files.due_merges
        else "nothing due"
    )
    return f"{levels}; {due}"


def _parquet_output(location: Any, shown: str, resets: ResetReader) -> OutputInfo:
    """Files, rows and bytes of a Parquet output, per batch too, from its commit log."""
    from inorder.sinks.commit_log import file_batch_id, load_state
    from inorder.sinks.parquet_read import committed_dataset

    state = load_state(location)
    by_batch: dict[int, tuple[int, int]] = {}
    for f in state.files.values():
        bid = file_batch_id(f.path)
        if bid is not None:
            rows, files = by_batch.get(bid, (0, 0))
            by_batch[bid] = (rows + f.rows, files + 1)
    info = OutputInfo(
        "parquet",
        shown,
        len(state.files),
        sum(f.rows for f in state.files.values()),
        sum(f.size_bytes for f in state.files.values()),
        by_batch,
    )
    dataset = committed_dataset(location, state)
    if dataset is not None:
        info.resets = resets(dataset)
    return info


def _delta_output(location: Any, shown: str, resets: ResetReader) -> OutputInfo:
    """Files, rows and bytes of a Delta table from its add actions, per batch too: each
    batch's files are named after it (``part-<batch_id:010d>-...``)."""
    from inorder.sinks.commit_log import file_batch_id

    try:
        from deltalake import DeltaTable

        from inorder.sinks.delta_read import delta_dataset

        table = DeltaTable(location.delta_uri(), storage_options=location.storage_options())
        import pyarrow as pa

        # deltalake returns an arro3 table: pyarrow takes it through the Arrow stream interface.
        actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    except Exception as exc:  # a table not created yet, or an older deltalake
        return OutputInfo("delta", shown, note=f"not readable yet ({type(exc).__name__})")
    rows = [int(n or 0) for n in actions.get("num_records", [])]
    sizes = [int(n or 0) for n in actions.get("size_bytes", [])]
    by_batch: dict[int, tuple[int, int]] = {}
    for path, n in zip(actions.get("path", []), rows, strict=False):
        bid = file_batch_id(str(path))
        if bid is not None:  # compacted files hold several batches: theirs are unknown
            had, files = by_batch.get(bid, (0, 0))
            by_batch[bid] = (had + n, files + 1)
    info = OutputInfo("delta", shown, len(sizes), sum(rows), sum(sizes), by_batch)
    try:
        info.resets = resets(delta_dataset(table, location), False)
    except Exception:  # the counts stand without the resets (e.g. an older deltalake)
        info.note = "session resets not readable"
    return info


def _iceberg_output(sink: Any, resets: ResetReader) -> OutputInfo:
    """Files, rows and bytes of an Iceberg table from its current snapshot's summary, and
    each batch's rows and files from the summary of the snapshot that committed it."""
    from inorder.sinks.iceberg_history import snapshot_history

    shown = f"{sink.table} in {sink.warehouse}"
    try:
        table = sink.load_table()
    except Exception as exc:  # the catalog cannot be opened or read
        return OutputInfo("iceberg", shown, note=f"not readable ({type(exc).__name__})")
    if table is None or table.current_snapshot() is None:
        return OutputInfo("iceberg", shown, 0, 0, 0, {}, note="no batch committed yet")
    current = table.current_snapshot()
    totals = current.summary.additional_properties if current.summary else {}
    by_batch: dict[int, tuple[int, int]] = {}
    for snap in table.snapshots():
        props = snap.summary.additional_properties if snap.summary else {}
        if props.get("inorder.app-id") != sink.app_id or "inorder.batch-id" not in props:
            continue
        by_batch[int(props["inorder.batch-id"])] = (
            int(props.get("added-records", 0) or 0),
            int(props.get("added-data-files", 0) or 0),
        )
    # Batches whose snapshots are no longer among the current one's ancestors (a repair
    # rolled them back) are not in the output: only the current lineage counts.
    kept = {s.batch_id for s in snapshot_history(table) if s.batch_id is not None}
    by_batch = {b: v for b, v in by_batch.items() if b in kept}
    info = OutputInfo(
        "iceberg",
        shown,
        int(totals.get("total-data-files", 0) or 0),
        int(totals.get("total-records", 0) or 0),
        int(totals.get("total-files-size", 0) or 0),
        by_batch,
    )
    dataset = sink.dataset()
    if dataset is not None:
        info.resets = resets(dataset)
    return info


def session_resets(
    dataset: Any, reference: str, batch_offset: int, pushdown: bool = True
) -> list[EventRow]:
    """Session resets in the output (the ``sessions`` processor's ``reset`` rows).

    ``pushdown=False`` filters the rows as they are read instead of in the scan: a Delta
    dataset's fragments carry string statistics as null (deltalake 1.x), so a filter on a
    string column there skips every file.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    wanted = ["topic", "partition", "offset", "session", "batch_id"]
    if not {*wanted, "op"} <= set(dataset.schema.names):
        return []
    if pushdown:
        table = dataset.to_table(columns=wanted, filter=ds.field("op") == "reset")
    else:
        parts = [
            batch.filter(pc.equal(batch.column("op"), "reset")).select(wanted)
            for batch in dataset.to_batches(columns=[*wanted, "op"])
        ]
        table = pa.Table.from_batches([p for p in parts if p.num_rows])
    rows = sorted(table.to_pylist(), key=lambda r: (r["batch_id"], r["offset"]), reverse=True)
    out = []
    for r in rows[:RESETS_SHOWN]:
        tp = TopicPartition(r["topic"], int(r["partition"]))
        offset = int(r["offset"])
        out.append(
            EventRow(
                "reset", "session reset", tp.topic, tp.partition,
                int(r["batch_id"]) - batch_offset, offset, offset, 1,
                replay_command(reference, tp, offset, offset), r["session"],
            )
        )  # fmt: skip
    return out
