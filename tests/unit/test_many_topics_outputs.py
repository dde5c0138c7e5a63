"""Human outputs at 1,000 topics and 4,000 topic-partitions: lines summarise (bounded count
and length, counts right), the detailed form (``--all``, JSON) stays complete, and a
partition that is behind or has a problem is always named or counted."""

from __future__ import annotations

from typing import Any

from inorder.ops.inspect_text import format_inspect
from inorder.ops.repair_plan import PartitionRepair, RepairPlan
from inorder.ops.validate_report import PartitionDiff, ValidationReport
from inorder.pipeline.progress import BatchProgress, RunSummary, format_batch, format_summary
from inorder.ui.page import render_live

TOPICS = 1000
#: The longest line a summarised output may print.
LINE = 400


def tps(partitions: int = 1) -> list[tuple[str, int]]:
    """``site-0000[0]`` .. ``site-0999[partitions - 1]``."""
    return [(f"site-{t:04d}", p) for t in range(TOPICS) for p in range(partitions)]


def bounded(lines: list[str], most: int) -> None:
    assert len(lines) <= most, len(lines)
    assert max(len(line) for line in lines) <= LINE, max(lines, key=len)


def test_inspect_summarises_ranges_and_state_and_names_partitions_without_state() -> None:
    ranges = {f"{t}[{p}]": [10, 10 + (p + 1) * (t != "site-0007")] for t, p in tps(4)}
    ranges["site-0500[3]"] = [10, 900]  # the busiest range is named first
    state: list[dict[str, Any]] = [
        {"topic": t, "partition": p, "version": 4, "keys": 2, "ignored_keys": 0,
         "state_bytes": 100, "file_bytes": 300, "versions": [3, 4], "last_offset": 9,
         "loaded": True}
        for t, p in tps(4)
    ]  # fmt: skip
    for s in state[100:103]:
        s.update(version=None, keys=0, state_bytes=0, versions=[])
    doc = {
        "checkpoint": "c",
        "last_committed_batch": 4,
        "batches": [
            {"batch_id": b, "committed": True, "ranges": ranges, "records_planned": 1,
             "planned_at": None, "duration_seconds": 1.0, "processing_time": None}
            for b in range(3)
        ],
        "state": state,
    }  # fmt: skip
    lines = format_inspect(doc)
    bounded(lines, 10)
    batch = lines[1]
    assert "1,000 topics, 4,000 partitions, 3,996 with records" in batch
    assert batch.index("site-0500[3] 10..900") < batch.index(" and 3,991 more")
    assert "state: 1,000 topics, 4,000 partitions, versions 4..4, 1,200,000 file bytes" in lines[4]
    assert "7,994 keys" in lines[4]  # 3,997 partitions with a version, 2 keys each
    missing = next(line for line in lines if "without a committed version" in line)
    assert "3 partitions" in missing and "site-0025[0], site-0025[1], site-0025[2]" in missing

    # State sized from the file listing only: the keys are said to be unknown, not zero.
    for s in state:
        if s["version"] is not None:
            s.update(keys=None, ignored_keys=None, state_bytes=None, loaded=False)
    lines = format_inspect(doc)
    bounded(lines, 10)
    assert "keys and state bytes not loaded at 4,000 partitions" in lines[4]
    assert " 0 keys" not in "\n".join(lines)
    assert any("3 partitions without a committed version" in line for line in lines)

    # --all: every range and a line per partition.
    full = format_inspect(doc, full=True)
    assert len(full) == 1 + 3 + 4000
    assert full[1].count("..") == 4000


def test_validate_summarises_matching_partitions_and_names_every_problem() -> None:
    parts = [PartitionDiff(t, p, 0, 10, records=10, expected_rows=12) for t, p in tps(4)]
    for p in parts[500:530]:
        p.missing, p.first_offset = 1, 3
    parts[3999].unchecked_rows, parts[3999].unchecked_from = 2, 0
    report = ValidationReport(parts)
    lines = report.lines()
    bounded(lines, 25)
    assert lines[0].startswith("OK    993 topics, 3,969 partitions: 47,628 rows match")
    diffs = [line for line in lines if line.startswith("DIFF")]
    assert len(diffs) == 20 and "site-0125[0]" in diffs[0]
    more = next(line for line in lines if line.startswith("... and 11 more"))
    assert "site-0130[0]" in more and "and 6 more" in more  # 10 DIFF + 1 NOCHK left
    assert "4000 partition(s) checked, 30 with discrepancies; 1 with output rows" in lines[-1]
    assert len(report.lines(full=True)) == 4000 + 1
    assert len(report.to_json()["partitions"]) == 4000


def test_repair_plan_is_a_line_per_reason_naming_the_rows_it_deletes() -> None:
    parts = [PartitionRepair(t, p, 20, "end of batch 7", 20, live_sessions=1) for t, p in tps()]
    parts[42] = PartitionRepair("site-0042", 0, 20, "end of batch 7", 5, "s1", 2, 20, 9)
    parts[900] = PartitionRepair("site-0900", 0, 15, "--at-time", 12, None, 1, 15, 3)
    parts.append(PartitionRepair("site-new", 0, None, "never consumed", -2))
    plan = RepairPlan("p", "c", "owner", 8, parts)
    lines = plan.lines()
    bounded(lines, 10)
    end = next(line for line in lines if "end of batch 7" in line)
    assert end.startswith("  999 topics, 999 partitions: failure point: end of batch 7")
    assert "1 restart before it" in end and "delete 9 row(s)" in end
    assert "most from site-0042[0] (9)" in end
    assert any("site-0900[0] (3)" in line for line in lines)
    assert any("never consumed; start at earliest: site-new[0]" in line for line in lines)
    # Header, a line per partition, the checkpoint, "nothing changed".
    assert len(plan.lines(full=True)) == 1 + 1001 + 2
    assert len(plan.to_json()["partitions"]) == 1001


def test_progress_names_the_partitions_with_most_events_and_counts_the_rest() -> None:
    by_partition = {f"{t}[{p}]": {"seq_gap": 1} for t, p in tps()}
    by_partition["site-0999[0]"] = {"seq_gap": 5, "undecodable": 2}
    progress = BatchProgress(3, 1000, 1.0, 1.0, 0, 1, 1, 1, {"seq_gap": 1006, "undecodable": 2})
    progress.violations_by_partition = by_partition
    line = format_batch(progress)
    assert len(line) <= LINE
    assert "[site-0999[0]: seq_gap=5,undecodable=2; site-0000[0]: seq_gap=1" in line
    assert "and 995 more partition(s) with 995 event(s)]" in line
    summary = RunSummary(violations_by_partition=by_partition)
    text = format_summary(summary)
    bounded(text.splitlines(), 10)
    assert "and 995 more partition(s) with 995 event(s)" in text


def _partition(topic: str, p: int, lag: int = 0, events: int = 0) -> dict[str, Any]:
    return {
        "topic": topic, "partition": p, "committed": 100, "end_offset": 100 + lag, "lag": lag,
        "records_per_second": 1.0, "last_batch_at": None, "state_keys": 3, "state_bytes": 30,
        "events": events, "resets": 0, "ignored": 0,
    }  # fmt: skip


def _status(partitions: list[dict[str, Any]]) -> dict[str, Any]:
    state = [
        {"topic": p["topic"], "partition": p["partition"], "version": 5, "keys": 3,
         "ignored_keys": 0, "state_bytes": 30, "file_bytes": 90, "versions": [5],
         "last_offset": 99, "loaded": True}
        for p in partitions
    ]  # fmt: skip
    return {
        "checkpoint": "c", "broker": "reachable", "running": True, "last_committed_batch": 5,
        "batches_in_log": 6, "partitions": partitions, "batches": [], "events": [],
        "resets": [], "history_recorded": True, "state": state,
        "output": {"kind": "parquet", "location": "o", "files": 1, "rows": 1, "bytes": 1},
    }  # fmt: skip


def test_status_page_paginates_and_names_what_is_behind_on_every_page() -> None:
    partitions = [_partition(t, p) for t, p in tps(4)]
    partitions[3990] = _partition("site-0997", 2, lag=1234)
    partitions[7] = _partition("site-0001", 3, events=2)
    doc = _status(partitions)
    before = len(doc["partitions"])
    for page in (1, 2, 80, 999):
        html = render_live(doc, page)
        assert len(html) < 150_000, len(html)
        assert html.count("<tr data-tp=") == 50
        assert "1,000 topics, 4,000 partitions" in html
        assert "1 behind (1,234 records): site-0997[2] (1,234)" in html
        assert "1 with integrity events: site-0001[3] (2)" in html
    assert 'data-tp="site-0012[2]"' in render_live(doc, 2)  # rows 51..100
    last = render_live(doc, 999)  # past the end: the last page
    assert "page 80 of 80" in last and 'data-tp="site-0999[3]"' in last
    assert len(doc["partitions"]) == before  # the document (status.json) stays whole


def test_iceberg_snapshots_and_session_table_commits_summarise_their_ranges() -> None:
    from inorder.sessions.tables_ops import format_table_status
    from inorder.sinks.iceberg_history import format_snapshot

    offsets = {f"{t}[{p}]": [0, 5] for t, p in tps(4)}
    offsets["site-0321[1]"] = [0, 50]
    snapshot = {
        "snapshot_id": 1, "committed_at": "t", "operation": "append", "kind": "batch",
        "batch_id": 3, "added_records": 1, "deleted_records": 0, "total_records": 1,
        "offsets": offsets,
    }  # fmt: skip
    line = format_snapshot(snapshot)
    assert len(line) <= LINE
    assert "1,000 topics, 4,000 partitions, 4,000 with records: site-0321[1] [0, 50)" in line
    assert format_snapshot(snapshot, full=True).count(" [0, ") == 4000
    table = {
        "exists": True, "table": "current", "path": "p", "format": "delta", "version": 4,
        "last_batch": 3,
        "commits": [{"version": 4, "batch": 3, "first_batch": 3, "offsets": offsets}],
    }  # fmt: skip
    lines = format_table_status([table])
    bounded(lines, 2)
    assert "1,000 topics, 4,000 partitions" in lines[1] and "site-0321[1] 0..50" in lines[1]
    assert format_table_status([table], full=True)[1].count("..") == 4000
