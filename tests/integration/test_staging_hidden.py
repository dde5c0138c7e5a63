"""Nothing uncommitted is visible to a reader that globs a Parquet dataset.

Staged files (a failed batch, a crashed compaction or output repair) live under
``<root>/_inorder/staging/`` with names ending in ``.parquet.staged``: DuckDB's
``read_parquet('<root>/**/*.parquet')`` enters ``_``-prefixed folders, so the name is what
keeps them out. The datasets are read with DuckDB and pyarrow directly, not with the sink's
reader; crashes are real (a child process exits at the commit point).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.fixtures.sink_cases import stage_batch

from inorder.records import TopicPartition
from inorder.sessions.rebuild import read_changes
from inorder.sinks.base import WrittenFile
from inorder.sinks.compaction import compact_parquet
from inorder.sinks.parquet import (
    COMMITS_DIR,
    STAGED_SUFFIX,
    ParquetSink,
    manifest_name,
    read_committed,
)
from inorder.storage import fs as sfs

SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("payload", pa.string()),
    ]
)
ROWS = 100


def make_batch(batch_id: int, rows: int = ROWS) -> pa.RecordBatch:
    """Rows of one batch: topics a/b, partitions 0/1, offsets batch_id*rows .. +rows."""
    start = batch_id * rows
    return pa.record_batch(
        [
            pa.array(["a" if i % 2 else "b" for i in range(rows)]),
            pa.array([i % 2 for i in range(rows)], pa.int32()),
            pa.array(range(start, start + rows), pa.int64()),
            pa.array([f"payload-{start + i}" for i in range(rows)]),
        ],
        schema=SCHEMA,
    )


def stage(sink: ParquetSink, batch_id: int, key: str = "t") -> list[WrittenFile]:
    """What the executors of a batch do: write its rows as staged files (two tasks)."""
    return stage_batch(sink, batch_id, make_batch(batch_id), key=key)


def sink_with_batch_0(path: str, options: dict[str, str] | None) -> ParquetSink:
    """A checked sink partitioned by topic at ``path`` whose batch 0 is committed."""
    sink = ParquetSink(path, partition_by=["topic"], storage_options=options)
    sink.check(SCHEMA)
    assert sink.commit(0, stage(sink, 0))
    return sink


def all_files(path: str, options: dict[str, str] | None = None) -> list[str]:
    loc = sfs.resolve(path, options)
    return sorted(i.path[len(loc.root) + 1 :] for i in sfs.list_files(loc, loc.root, True))


def glob_count(root: str, pattern: str = "**/*.parquet") -> int:
    """Rows DuckDB sees through a glob of the dataset (0 when the glob matches nothing)."""
    sql = f"select count(*) from read_parquet('{root}/{pattern}', hive_partitioning = true)"
    try:
        rows = duckdb.sql(sql).fetchall()
    except duckdb.IOException as exc:
        if "No files found" in str(exc):
            return 0
        raise
    return int(rows[0][0])


def assert_only_committed_visible(root: str) -> None:
    """DuckDB (both documented globs) and a pyarrow dataset see exactly the committed rows."""
    committed = read_committed(root).num_rows
    assert glob_count(root) == committed
    assert glob_count(root, "*/*.parquet") == committed
    assert ds.dataset(root, format="parquet", partitioning="hive").count_rows() == committed


def test_staged_files_of_a_failed_batch_match_no_parquet_glob(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    path, options = sink_location
    sink = sink_with_batch_0(path, options)
    failed = stage(sink, 1)  # the executors staged batch 1, then the batch failed
    assert failed and all(f.path.endswith(STAGED_SUFFIX) for f in failed)
    names = all_files(path, options)
    staged = [n for n in names if n.startswith("_inorder/staging/")]
    assert staged and not [n for n in staged if n.endswith(".parquet")], staged
    data = [n for n in names if n.endswith(".parquet")]
    assert data == [
        "topic=a/part-0000000000-00000.parquet",
        "topic=a/part-0000000000-00001.parquet",
        "topic=b/part-0000000000-00002.parquet",
        "topic=b/part-0000000000-00003.parquet",
    ]
    if options is None:
        assert_only_committed_visible(path)
        assert glob_count(path) == ROWS
    # The retried batch publishes under the usual final names; the leftovers are cleaned.
    assert sink.commit(1, stage(sink, 1, key="retry"))
    names = all_files(path, options)
    assert not [n for n in names if n.startswith("_inorder/staging/")]
    assert read_committed(path, options).num_rows == 2 * ROWS
    if options is None:
        assert glob_count(path) == 2 * ROWS


def test_a_manifest_of_the_previous_release_is_completed(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    """A crash between manifest and publish under 0.1.0: staged names ended in ``.parquet``."""
    path, options = sink_location
    sink = sink_with_batch_0(path, options)
    loc = sink.location
    table = pa.Table.from_batches([make_batch(1)])
    entries = []
    for n, topic in enumerate(("a", "b")):
        rows = table.filter(pa.compute.equal(table.column("topic"), topic)).drop_columns(["topic"])
        staged = f"_inorder/staging/1/t0/topic={topic}/part-0000{n}.parquet"
        if not loc.is_s3:
            loc.filesystem.create_dir(loc.join(staged).rsplit("/", 1)[0], recursive=True)
        with loc.filesystem.open_output_stream(loc.join(staged)) as out:
            pq.write_table(rows, out)
        entries.append(
            {
                "staged": staged,
                "final": f"topic={topic}/part-{1:010d}-{n:05d}.parquet",
                "rows": rows.num_rows,
                "size_bytes": loc.filesystem.get_file_info(loc.join(staged)).size,
                "partition_values": {"topic": topic},
            }
        )
    manifest = {
        "format": 1,
        "kind": "batch",
        "batch_id": 1,
        "created_at": 0.0,
        "partition_by": ["topic"],
        "owner": None,
        "files": entries,
    }
    sfs.write_bytes(loc, loc.join(COMMITS_DIR, manifest_name(1)), json.dumps(manifest).encode())
    restarted = ParquetSink(path, partition_by=["topic"], storage_options=options)
    restarted.check(SCHEMA)  # recovery publishes what the manifest lists
    assert sorted(read_committed(path, options).column("offset").to_pylist()) == list(
        range(2 * ROWS)
    )
    names = all_files(path, options)
    assert "topic=a/part-0000000001-00000.parquet" in names
    assert not [n for n in names if n.startswith("_inorder/staging/")]
    assert restarted.commit(1, stage(restarted, 1, key="rerun")) is False
    if options is None:
        assert_only_committed_visible(path)


def _crash_at_commit_point(code: str) -> None:
    """Run ``code`` in a child process that dies (exit 9) when it creates a manifest."""
    script = textwrap.dedent(
        """
        import os
        from inorder.storage import fs as sfs

        def die(*args, **kwargs):
            os._exit(9)

        sfs.put_if_absent = die
        """
    ) + textwrap.dedent(code)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 9, done.stderr[-3000:]


def _three_small_batches(root: str, options: dict[str, str] | None = None) -> ParquetSink:
    sink = ParquetSink(root, partition_by=["topic"], storage_options=options)
    sink.check(SCHEMA)
    for b in range(3):
        assert sink.commit(b, stage(sink, b))
    return sink


def test_a_compaction_killed_after_staging_leaves_nothing_visible(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    root, options = sink_location
    _three_small_batches(root, options)
    _crash_at_commit_point(
        f"""
        from inorder.sinks.compaction import compact_parquet
        compact_parquet({root!r}, storage_options={options!r}, grace_seconds=0, full=True)
        """
    )
    staged = [n for n in all_files(root, options) if n.startswith("_inorder/staging/c")]
    assert staged and all(n.endswith(STAGED_SUFFIX) for n in staged), staged
    assert read_committed(root, options).num_rows == 3 * ROWS
    if options is None:
        assert_only_committed_visible(root)
        assert glob_count(root) == 3 * ROWS
    # The next compaction finishes the job and deletes the dead run's staging; with no
    # grace period the replaced files go at once.
    report = compact_parquet(root, storage_options=options, grace_seconds=0, full=True)
    assert report.groups and report.deleted
    assert read_committed(root, options).num_rows == 3 * ROWS
    if options is None:
        assert_only_committed_visible(root)
        assert glob_count(root) == 3 * ROWS
    assert not [n for n in all_files(root, options) if n.startswith("_inorder/staging/")]


def test_a_repair_killed_after_staging_leaves_nothing_visible(tmp_path: Path) -> None:
    root = str(tmp_path / "out")
    _three_small_batches(root)
    _crash_at_commit_point(
        f"""
        from inorder.ops.repair_output import delete_rows
        from inorder.records import TopicPartition
        from inorder.sinks.parquet import ParquetSink
        sink = ParquetSink({root!r}, partition_by=["topic"])
        delete_rows("output", sink, {{TopicPartition("a", 1): 160}})
        """
    )
    staged = [n for n in all_files(root) if n.startswith("_inorder/staging/r")]
    assert staged and all(n.endswith(STAGED_SUFFIX) for n in staged), staged
    assert_only_committed_visible(root)
    assert glob_count(root) == 3 * ROWS
    from inorder.ops.repair_output import delete_rows

    sink = ParquetSink(root, partition_by=["topic"])
    result = delete_rows("output", sink, {TopicPartition("a", 1): 160})
    assert result.rows == 70  # odd offsets 161..299 are topic a, partition 1
    assert result.files_rewritten == 1  # 151..159 stay
    assert_only_committed_visible(root)
    assert glob_count(root) == 3 * ROWS - 70
    assert not [n for n in all_files(root) if n.startswith("_inorder/staging/")]


def test_two_compactors_racing_for_one_sequence_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loser of the race must not delete (or overwrite) the winner's staged files."""
    root = str(tmp_path / "out")
    _three_small_batches(root)
    real_put = sfs.put_if_absent
    state: dict[str, Any] = {"calls": 0, "winner": None}

    def racing_put(location: sfs.Location, target: str, data: bytes) -> None:
        if "/_inorder/compactions/" not in target:
            real_put(location, target, data)
            return
        state["calls"] += 1
        if state["calls"] == 1:
            # Compactor A is at its commit point; compactor B planned the same groups and
            # sequence number and now stages, then loses the race to A and cleans up.
            state["winner"] = (location, target, data)
            with pytest.raises(Exception, match="another compaction committed"):
                compact_parquet(root, grace_seconds=3600, full=True)
            return  # A's manifest was created inside B's attempt
        real_put(*state["winner"])  # A wins ...
        real_put(location, target, data)  # ... so B's create-if-absent fails

    monkeypatch.setattr(sfs, "put_if_absent", racing_put)
    report = compact_parquet(root, grace_seconds=3600, full=True)
    monkeypatch.setattr(sfs, "put_if_absent", real_put)
    assert report.seq == 0 and state["calls"] == 2
    table = read_committed(root)
    assert sorted(table.column("offset").to_pylist()) == list(range(3 * ROWS))
    assert not [n for n in all_files(root) if n.startswith("_inorder/staging/")]


def test_rebuild_reads_committed_files_not_the_compaction_grace_copies(tmp_path: Path) -> None:
    """During a compaction's grace period the replaced files are still there: a session
    rebuild reads the committed file list, never both copies."""
    root = str(tmp_path / "out")
    _three_small_batches(root)
    report = compact_parquet(root, grace_seconds=3600, full=True)
    assert report.groups and not report.deleted
    changes = read_changes(root)
    assert changes.num_rows == 3 * ROWS
    assert sorted(changes.column("offset").to_pylist()) == list(range(3 * ROWS))
