"""``inorder inspect``'s human lines: one line a batch and a state section that stay readable
at thousands of topic-partitions.

A batch names its offset ranges one by one up to :data:`~inorder.listing.RANGES_LISTED`
topic-partitions; past that its line counts topics and partitions and names the ranges with
the most records (``--all`` lists every range). The state section is one line a partition up to
:data:`STATE_LISTED` partitions, else a summary: totals, the largest partitions, and every
partition without a committed version counted and the first of them named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inorder.listing import NAMED, count, named, ranges_text, topics_and_partitions
from inorder.ops.output_files import format_output_files

#: Topic-partitions the state section shows a line each (beyond: a summary).
STATE_LISTED = 20


def _range(tp: str, r: Sequence[int]) -> str:
    return f"{tp} {r[0] if r[0] >= 0 else '?'}..{r[1]}"


def format_ranges(ranges: Mapping[str, Sequence[int]], full: bool = False) -> str:
    """A batch's offset ranges: each one, or (many, not ``full``) counts and the largest."""
    return ranges_text(ranges, _range, full)


def _batch_line(b: Mapping[str, Any], doc: Mapping[str, Any], newest: Any, full: bool) -> str:
    shift = int(doc.get("output_batch_offset") or 0)
    state = "committed" if b["committed"] else "NOT committed"
    if not b["committed"] and doc.get("running") and b["batch_id"] == newest:
        state = "in flight"
    dur = "?" if b["duration_seconds"] is None else f"{b['duration_seconds']:.2f} s"
    if b.get("restarted"):
        dur += " (re-run after a restart)" if b["committed"] else " (to re-run)"
    shown = f"{b['batch_id']:>6}" + (f" (output {b['batch_id'] + shift})" if shift else "")
    return (
        f"batch {shown} {state:<13} planned {b['planned_at']} took {dur} "
        f"records {b['records_planned']:,}  {format_ranges(b['ranges'], full)}"
    )


def _state_line(s: Mapping[str, Any]) -> str:
    if not s.get("loaded", True):
        return (
            f"state {s['topic']}[{s['partition']}] version {s['version']}: "
            f"{s['file_bytes']:,} file bytes (not loaded)"
        )
    return (
        f"state {s['topic']}[{s['partition']}] version {s['version']}: {s['keys']:,} keys "
        f"({s['ignored_keys']:,} ignored), {s['state_bytes']:,} state bytes, "
        f"{s['file_bytes']:,} file bytes, last offset {s['last_offset']}"
    )


def format_state(state: Sequence[Mapping[str, Any]], full: bool = False) -> list[str]:
    """The state section: a line a partition, or (many, not ``full``) a summary."""
    if full or len(state) <= STATE_LISTED:
        return [_state_line(s) for s in state]
    names = [f"{s['topic']}[{s['partition']}]" for s in state]
    loaded = [s for s in state if s.get("loaded", True)]
    versions = [s["version"] for s in state if s["version"] is not None]
    span = f"versions {min(versions)}..{max(versions)}" if versions else "no version"
    file_bytes = sum(s["file_bytes"] for s in state)
    lines = [f"state: {topics_and_partitions(names)}, {span}, {file_bytes:,} file bytes"]
    if len(loaded) == len(state):
        keys = sum(s["keys"] for s in loaded)
        ignored = sum(s["ignored_keys"] for s in loaded)
        state_bytes = sum(s["state_bytes"] for s in loaded)
        lines[0] += f", {keys:,} keys ({ignored:,} ignored), {state_bytes:,} state bytes"
        largest = sorted(loaded, key=lambda s: (-s["state_bytes"], -s["keys"]))[:NAMED]
        lines.append(
            "state: largest: "
            + "; ".join(
                f"{s['topic']}[{s['partition']}] {s['keys']:,} keys {s['state_bytes']:,} bytes"
                for s in largest
            )
        )
    else:
        lines[0] += (
            f"; keys and state bytes not loaded at {count(len(state), 'partition')} "
            "(--all loads each, --topic/--partition one)"
        )
        largest = sorted(state, key=lambda s: -s["file_bytes"])[:NAMED]
        lines.append(
            "state: largest files: "
            + "; ".join(
                f"{s['topic']}[{s['partition']}] {s['file_bytes']:,} bytes" for s in largest
            )
        )
    missing = [f"{s['topic']}[{s['partition']}]" for s in state if s["version"] is None]
    if missing:
        lines.append(
            f"state: {count(len(missing), 'partition')} without a committed version: "
            + named(missing)
        )
    lines.append("state: one line a partition with --all; every field with --json")
    return lines


def format_inspect(doc: dict[str, Any], full: bool = False) -> list[str]:
    """Human lines for :func:`inorder.ops.inspect.inspect_all`'s document (``full``: every
    offset range and a state line per partition, however many)."""
    lines = [f"checkpoint {doc['checkpoint']}: last committed batch {doc['last_committed_batch']}"]
    shift = int(doc.get("output_batch_offset") or 0)
    if shift:
        lines.append(
            f"repaired checkpoint: its batch b is batch {shift} + b in the output "
            "(the rows' batch_id column)"
        )
    if doc.get("running"):
        lines.append(f"a run is in progress: {doc['running']}")
    shown_batches = doc.get("batches", [])
    newest = max((b["batch_id"] for b in shown_batches), default=None)
    lines.extend(_batch_line(b, doc, newest, full) for b in shown_batches)
    if "output_files" in doc:
        lines.extend(format_output_files(doc["output_files"]))
    if "output_snapshots" in doc:
        from inorder.sinks.iceberg_history import format_snapshot

        lines.extend(format_snapshot(s, full) for s in doc["output_snapshots"])
    if "tables" in doc:
        from inorder.sessions.tables_ops import format_table_status

        lines.extend(format_table_status(doc["tables"], full))
    lines.extend(format_state(doc.get("state", []), full))
    return lines
