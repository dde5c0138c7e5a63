"""ParquetSink on local disk and on S3 (SeaweedFS): commit protocol, layout, sizing, errors."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.fixtures.sink_cases import stage_batch

from inorder import cli
from inorder.sinks.base import ConsumedOffsets, SinkError, WrittenFile
from inorder.sinks.compaction import compact_parquet
from inorder.sinks.parquet import (
    COMMITS_DIR,
    ParquetSink,
    committed_files,
    forget_manifest,
    load_state,
    manifest_name,
    read_committed,
    read_manifest,
)
from inorder.sinks.proof import format_digest, table_digest
from inorder.storage import fs as sfs

SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("payload", pa.string()),
    ]
)


def make_batch(batch_id: int, rows: int, topics: tuple[str, ...] = ("a", "b")) -> pa.RecordBatch:
    """Deterministic rows of one batch: offsets batch_id*rows .. +rows."""
    start = batch_id * rows
    return pa.record_batch(
        [
            pa.array([topics[i % len(topics)] for i in range(rows)]),
            pa.array([i % 2 for i in range(rows)], pa.int32()),
            pa.array(range(start, start + rows), pa.int64()),
            pa.array([f"payload-{start + i:012d}-{'x' * 40}" for i in range(rows)]),
        ],
        schema=SCHEMA,
    )


def stage(sink: Any, batch_id: int, rows: int, tasks: int = 2, key: str = "t") -> list[WrittenFile]:
    """Write one batch through ``tasks`` writers (as executors would) and return the files."""
    return stage_batch(sink, batch_id, make_batch(batch_id, rows), tasks, key)


def all_files(path: str, options: dict[str, str] | None) -> list[str]:
    loc = sfs.resolve(path, options)
    return sorted(i.path[len(loc.root) + 1 :] for i in sfs.list_files(loc, loc.root, True))


def duck_read(path: str, options: dict[str, str] | None) -> pa.Table:
    """Read the data files like an engine that lists the dataset (not the sink's reader)."""
    loc = sfs.resolve(path, options)
    paths = [
        loc.join(f)
        for f in all_files(path, options)
        if not f.startswith("_inorder/") and f.endswith(".parquet")
    ]
    dataset = ds.dataset(
        paths,
        filesystem=loc.filesystem,
        format="parquet",
        partitioning="hive",
        partition_base_dir=loc.root,
    )
    return dataset.to_table()


def test_commit_publishes_every_row_once(sink_location: tuple[str, dict[str, str] | None]) -> None:
    path, options = sink_location
    sink = ParquetSink(path, partition_by=["topic"], storage_options=options)
    sink.check(SCHEMA)
    for b in range(3):
        assert sink.commit(b, stage(sink, b, 1000)) is True
    table = read_committed(path, options)
    assert table.schema == SCHEMA
    assert sorted(table.column("offset").to_pylist()) == list(range(3000))
    listed = duck_read(path, options)
    assert sorted(listed.column("offset").to_pylist()) == list(range(3000))
    names = all_files(path, options)
    assert not [n for n in names if n.startswith("_inorder/staging")]
    assert "topic=a/part-0000000001-00000.parquet" in names
    assert sink.is_committed(2) and not sink.is_committed(3)
    assert sink.last_committed_batch() == 2


def test_recommit_is_idempotent_and_drops_new_staged_files(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    path, options = sink_location
    sink = ParquetSink(path, partition_by=["topic"], storage_options=options)
    sink.check(SCHEMA)
    assert sink.commit(0, stage(sink, 0, 500, key="first"))
    again = stage(sink, 0, 500, key="second")
    assert again and all("_inorder/staging/0/second" in f.path for f in again)
    assert sink.commit(0, again) is False
    assert not [n for n in all_files(path, options) if "staging" in n]
    assert read_committed(path, options).num_rows == 500


def test_staged_files_of_failed_attempts_are_cleaned(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    path, options = sink_location
    sink = ParquetSink(path, storage_options=options)
    sink.check(SCHEMA)
    stage(sink, 0, 300, key="lost-attempt")  # a task attempt whose batch attempt died
    aborted = sink.open_writer(SCHEMA, 0, "aborted")
    aborted.write(make_batch(0, 10))
    aborted.abort()
    assert sink.commit(0, stage(sink, 0, 300, key="winner"))
    names = all_files(path, options)
    assert not [n for n in names if "staging" in n], names
    assert read_committed(path, options).num_rows == 300


def test_half_done_commit_is_completed_by_the_next_process(
    sink_location: tuple[str, dict[str, str] | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, options = sink_location
    sink = ParquetSink(path, partition_by=["topic"], storage_options=options)
    sink.check(SCHEMA)
    files = stage(sink, 0, 600, tasks=3)
    real_move = sfs.move
    calls = {"n": 0}

    def crashing_move(location: sfs.Location, src: str, dst: str) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated crash after the first file was published")
        real_move(location, src, dst)

    monkeypatch.setattr(sfs, "move", crashing_move)
    with pytest.raises(RuntimeError):
        sink.commit(0, files)
    monkeypatch.setattr(sfs, "move", real_move)
    # The manifest exists: readers of committed data do not see the half-published batch yet.
    assert read_committed(path, options).num_rows == 0
    restarted = ParquetSink(path, partition_by=["topic"], storage_options=options)
    assert restarted.is_committed(0)
    restarted.check(SCHEMA)  # recovery runs before any batch
    assert read_committed(path, options).num_rows == 600
    assert restarted.commit(0, stage(restarted, 0, 600, key="rerun")) is False
    assert sorted(duck_read(path, options).column("offset").to_pylist()) == list(range(600))


def test_partitioning_is_hive_style_with_nulls(tmp_path: Path) -> None:
    path = str(tmp_path / "parts")
    schema = pa.schema([("site", pa.string()), ("day", pa.int32()), ("v", pa.int64())])
    sink = ParquetSink(path, partition_by=["site", "day"])
    sink.check(schema)
    writer = sink.open_writer(schema, 0, "t0")
    writer.write(
        pa.record_batch(
            [
                pa.array(["x", "y", None, "x"]),
                pa.array([1, 1, 2, 2], pa.int32()),
                pa.array([1, 2, 3, 4]),
            ],
            schema=schema,
        )
    )
    files = writer.close()
    assert {tuple(sorted(f.partition_values.items())) for f in files} == {
        (("day", "1"), ("site", "x")),
        (("day", "1"), ("site", "y")),
        (("day", "2"), ("site", None)),
        (("day", "2"), ("site", "x")),
    }
    sink.commit(0, files)
    names = all_files(path, None)
    assert "site=__HIVE_DEFAULT_PARTITION__/day=2/part-0000000000-00000.parquet" in names
    # Partition columns live in directory names, not in the files (hive style).
    one = pq.read_table(os.path.join(path, "site=x/day=1/part-0000000000-00001.parquet"))
    assert one.column_names == ["v"]
    table = read_committed(path)
    assert table.schema == schema
    assert sorted(
        zip(table["site"].to_pylist(), table["v"].to_pylist(), strict=True), key=str
    ) == sorted([("x", 1), ("y", 2), (None, 3), ("x", 4)], key=str)
    got = (
        duckdb.connect()
        .execute(
            f"select site, day, v from read_parquet('{path}/*/*/*.parquet', "
            "hive_partitioning=true) "
            "order by v"
        )
        .fetchall()
    )
    assert [r[2] for r in got] == [1, 2, 3, 4]


@pytest.mark.parametrize("codec", ["zstd", "snappy", "none"])
def test_compression_codec_is_applied(tmp_path: Path, codec: str) -> None:
    path = str(tmp_path / codec)
    sink = ParquetSink(path, compression=codec)
    sink.check(SCHEMA)
    sink.commit(0, stage(sink, 0, 2000, tasks=1))
    meta = pq.read_metadata(os.path.join(path, "part-0000000000-00000.parquet"))
    expected = "UNCOMPRESSED" if codec == "none" else codec.upper()
    assert meta.row_group(0).column(0).compression == expected


def test_bad_compression_is_rejected() -> None:
    with pytest.raises(SinkError, match="compression 'lzo'"):
        ParquetSink("/tmp/x", compression="lzo")


def test_file_sizing_one_file_per_partition_and_roll_over(tmp_path: Path) -> None:
    big = ParquetSink(str(tmp_path / "big"), partition_by=["topic"])
    big.check(SCHEMA)
    writer = big.open_writer(SCHEMA, 0, "t0")
    for i in range(10):  # many small writes still make one file per partition
        writer.write(make_batch(i, 2000))
    files = writer.close()
    assert sorted(str(f.partition_values["topic"]) for f in files) == ["a", "b"]
    assert sum(f.rows for f in files) == 20000

    target = 256 * 1024
    small = ParquetSink(str(tmp_path / "small"), target_file_size=target, compression="none")
    small.check(SCHEMA)
    writer = small.open_writer(SCHEMA, 0, "t0")
    for i in range(40):
        writer.write(make_batch(i, 2000))
    files = writer.close()
    sizes = [f.size_bytes for f in files]
    assert len(files) > 3
    assert sum(f.rows for f in files) == 80000
    # Every file but the last reaches the target, none is far beyond it (one row group).
    assert all(s >= target for s in sizes[:-1]), sizes
    assert all(s < 3 * target for s in sizes), sizes
    small.commit(0, files)
    assert read_committed(str(tmp_path / "small")).num_rows == 80000


def test_check_rejects_unwritable_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    sink = ParquetSink(str(blocker / "out"))
    with pytest.raises(SinkError, match="a-file/out"):
        sink.check(SCHEMA)


def test_check_rejects_unknown_partition_column(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="'nope'"):
        ParquetSink(str(tmp_path), partition_by=["nope"]).check(SCHEMA)


def test_check_rejects_wrong_credentials(s3: Any) -> None:
    options = {**s3.storage_options(), "AWS_SECRET_ACCESS_KEY": "wrong-secret-value-123"}
    sink = ParquetSink(s3.new_prefix(), storage_options=options)
    with pytest.raises(SinkError) as info:
        sink.check(SCHEMA)
    message = str(info.value)
    assert "\n" not in message
    assert "wrong-secret-value-123" not in message and s3.secret_access_key not in message
    assert "denied" in message or "signature" in message, message


def test_check_rejects_missing_bucket(s3: Any) -> None:
    sink = ParquetSink("s3://no-such-bucket-inorder/x", storage_options=s3.storage_options())
    with pytest.raises(SinkError, match="bucket 'no-such-bucket-inorder' does not exist"):
        sink.check(SCHEMA)


def test_repr_and_describe_hide_secrets(s3: Any) -> None:
    sink = ParquetSink(s3.new_prefix(), storage_options=s3.storage_options())
    text = repr(sink) + sink.describe() + repr(sink.location) + str(sink.location)
    assert s3.secret_access_key not in text


def test_env_credentials_are_used(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_access_key)
    monkeypatch.setenv("AWS_REGION", s3.region)
    path = s3.new_prefix()
    sink = ParquetSink(path)
    sink.check(SCHEMA)
    assert sink.commit(0, stage(sink, 0, 100))
    assert read_committed(path).num_rows == 100


def test_compaction_merges_small_files_without_loss(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    path, options = sink_location
    sink = ParquetSink(path, partition_by=["topic"], storage_options=options)
    sink.check(SCHEMA)
    for b in range(6):
        sink.commit(b, stage(sink, b, 400))
    before = committed_files(path, options)
    assert len(before) == 24
    dry = compact_parquet(path, options, target_file_size=10 * 1024 * 1024, dry_run=True, full=True)
    assert dry.files_after == 2 and committed_files(path, options) == before
    report = compact_parquet(
        path, options, target_file_size=10 * 1024 * 1024, grace_seconds=3600, full=True
    )
    assert report.files_after == 2 and report.deleted == []
    after = committed_files(path, options)
    assert sorted(f.path for f in after) == [
        "topic=a/compacted-0000000000-00000.parquet",
        "topic=b/compacted-0000000000-00001.parquet",
    ]
    table = read_committed(path, options)
    assert sorted(table.column("offset").to_pylist()) == list(range(2400))
    # Replaced files survive the grace period (readers may still read them) ...
    assert len([n for n in all_files(path, options) if n.endswith(".parquet")]) == 26
    # ... and go away after it.
    cleaned = compact_parquet(path, options, grace_seconds=0)
    assert len(cleaned.deleted) == 24
    assert sorted(duck_read(path, options).column("offset").to_pylist()) == list(range(2400))
    # New batches keep committing after compaction.
    sink.commit(6, stage(sink, 6, 400))
    assert read_committed(path, options).num_rows == 2800


def test_sink_option_compacts_after_each_commit_by_level(tmp_path: Path) -> None:
    """Fan-in 2, 2 levels: two batches' files (2 each: a batch's files count once) merge into
    level 1, two level-1 files into a final level-2 file; levels survive a commit checkpoint
    and `verify` stays exact."""
    from inorder.ops.verify_parquet import collect_parquet

    path = str(tmp_path / "auto")
    sink = ParquetSink(
        path,
        compact=True,
        compaction_grace_seconds=0,
        compaction_fanout=2,
        compaction_levels=2,
        checkpoint_interval=3,
        compact_in_background=False,
    )
    sink.check(SCHEMA)
    levels = []
    for b in range(4):
        consumed = [ConsumedOffsets("in", 0, b * 200, b * 200 + 199)]
        sink.commit_consumed(b, stage(sink, b, 200), consumed)
        levels.append(sorted(f.level for f in committed_files(path)))
    assert levels == [[0, 0], [1], [0, 0, 1], [2]]
    assert load_state(sfs.resolve(path)).checkpoint == 2
    files = committed_files(path)
    assert all(f.committed_at is not None and f.digest is not None for f in files)
    assert sorted(read_committed(path).column("offset").to_pylist()) == list(range(800))
    # Each row was rewritten at most twice: no record replaces a file of level 2.
    loc = sfs.resolve(path)
    seen: dict[str, int] = {}
    for info in sfs.list_files(loc, loc.join("_inorder/compactions")):
        if info.base_name.endswith(".json"):
            record = json.loads(sfs.read_bytes(loc, info.path))
            seen.update({e["final"]: e["level"] for e in record["files"]})
            assert all(seen.get(old, 0) < 2 for old in record["replaces"])
    assert collect_parquet(sink, None).problems == []


def test_background_compaction_never_holds_a_commit_up(tmp_path: Path) -> None:
    """The merges run in the sink's thread: batches commit and are readable while a merge
    waits at its commit point; the run's finish lets it commit; a guard that refuses (a lease
    found taken) commits no merge and is reported, the output whole."""
    import threading

    from inorder.ops.verify_parquet import collect_parquet

    path = str(tmp_path / "bg")
    sink = ParquetSink(path, compact=True, compaction_grace_seconds=0, compaction_fanout=2,
                       compaction_levels=2)  # fmt: skip
    at_commit_point, release = threading.Event(), threading.Event()

    def gate() -> None:
        at_commit_point.set()
        assert release.wait(120), "never released"

    sink.guard_background(gate)
    sink.check(SCHEMA)
    for b in range(2):  # two batches: a merge is due (a batch's two files count once)
        sink.commit(b, stage(sink, b, 200))
    assert at_commit_point.wait(120), "the compactor thread never reached a merge's commit"
    for b in range(2, 4):  # while the merge waits: each commit returns, its rows readable
        sink.commit(b, stage(sink, b, 200))
        assert read_committed(path).num_rows == (b + 1) * 200
    assert {f.level for f in committed_files(path)} == {0}  # nothing merged yet
    release.set()
    assert sink.finish_background() is None
    assert sorted(read_committed(path).column("offset").to_pylist()) == list(range(800))
    assert sorted(f.level for f in committed_files(path)) == [2]
    assert collect_parquet(sink, None).problems == []
    # The same sink in a later run (a notebook running a pipeline again) compacts again.
    for b in range(4, 6):
        sink.commit(b, stage(sink, b, 200))
    assert sink.finish_background() is None
    assert sorted(f.level for f in committed_files(path)) == [1, 2]

    fenced = str(tmp_path / "fenced")
    other = ParquetSink(fenced, compact=True, compaction_fanout=2, compaction_levels=2)

    def taken() -> None:
        raise SinkError("lease taken by another driver")

    other.guard_background(taken)
    other.check(SCHEMA)
    for b in range(2):
        other.commit(b, stage(other, b, 200))
    error = other.finish_background()
    assert error == "SinkError: lease taken by another driver", error
    assert {f.level for f in committed_files(fenced)} == {0}
    loc = sfs.resolve(fenced)
    records = [i for i in sfs.list_files(loc, loc.join("_inorder/compactions"))
               if i.base_name.endswith(".json")]  # fmt: skip
    assert records == [] and read_committed(fenced).num_rows == 400


def test_compact_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "cli")
    sink = ParquetSink(path)
    sink.check(SCHEMA)
    for b in range(3):
        sink.commit(b, stage(sink, b, 100))
    assert cli.main(["compact", path, "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "parquet" and out["dry_run"] is True
    assert cli.main(["compact", path, "--full", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files_after"] == 1
    assert cli.main(["compact", path, "--target-file-size", "64MB", "--full"]) == 0
    assert "merged 6 files into 1" in capsys.readouterr().out
    assert len(committed_files(path)) == 1
    assert cli.main(["compact", path, "--target-file-size", "lots"]) == 2
    assert cli.main(["compact", path, "--fanout", "1"]) != 0
    assert "compaction_fanout must be an integer >= 2" in capsys.readouterr().err


def make_sink_factory(options: dict[str, str] | None) -> Callable[[str], ParquetSink]:
    return lambda p: ParquetSink(p, storage_options=options)


def test_output_of_another_checkpoint_is_refused(tmp_path: Path) -> None:
    # Batch ids restart at 0 with every checkpoint: a new checkpoint writing into an old
    # dataset would take its batches for committed ones and silently drop them.
    path = str(tmp_path / "out")
    first = ParquetSink(path, partition_by=["topic"])
    first.bind("checkpoint-a")
    first.check(SCHEMA)
    assert first.commit(0, stage(first, 0, 10))
    same = ParquetSink(path, partition_by=["topic"])
    same.bind("checkpoint-a")
    same.check(SCHEMA)
    other = ParquetSink(path, partition_by=["topic"])
    other.bind("checkpoint-b")
    with pytest.raises(SinkError, match="another pipeline checkpoint"):
        other.check(SCHEMA)


def test_manifests_and_checkpoints_carry_offsets_and_digests(tmp_path: Path) -> None:
    path = str(tmp_path / "out")
    sink = ParquetSink(path, partition_by=["topic"], checkpoint_interval=3)
    sink.check(SCHEMA)
    for b in range(4):
        consumed = [ConsumedOffsets("in", 0, b * 10, b * 10 + 9), ConsumedOffsets("in", 1, None, 4)]
        assert sink.commit_consumed(b, stage(sink, b, 100), consumed)
    loc = sfs.resolve(path)
    manifest = read_manifest(loc, f"{COMMITS_DIR}/{manifest_name(3)}")
    assert manifest["offsets"] == {"in/0": [30, 40], "in/1": [5, 5]}
    for entry in manifest["files"]:
        table = pq.ParquetFile(loc.join(entry["final"])).read()
        assert entry["digest"] == format_digest(table_digest(table))
    # Batches 0-2 are folded into the checkpoint: their ranges and digests stay in it.
    state = load_state(loc)
    assert state.checkpoint == 2
    assert state.offsets == {"in/0": [[0, 40]], "in/1": [[5, 5]]}
    assert all(f.digest is not None for f in state.files.values())


def test_manifests_of_the_previous_release_still_read_and_resume(tmp_path: Path) -> None:
    path = str(tmp_path / "out")
    sink = ParquetSink(path, partition_by=["topic"], checkpoint_interval=0)
    sink.check(SCHEMA)
    assert sink.commit(0, stage(sink, 0, 100))
    loc = sfs.resolve(path)
    rel = f"{COMMITS_DIR}/{manifest_name(0)}"
    old = read_manifest(loc, rel)
    for entry in old["files"]:  # as written before commits carried proofs
        del entry["digest"]
    sfs.delete_quietly(loc, loc.join(rel))
    sfs.write_bytes(loc, loc.join(rel), json.dumps(old).encode())
    forget_manifest(loc, rel)
    again = ParquetSink(path, partition_by=["topic"], checkpoint_interval=0)
    again.check(SCHEMA)
    assert again.commit_consumed(1, stage(again, 1, 100), [ConsumedOffsets("in", 0, 0, 9)])
    assert read_committed(path).num_rows == 200
    assert [f.digest is None for f in committed_files(path)].count(True) == len(old["files"])


def test_verify_reads_the_proofs_on_local_disk_and_s3(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    from inorder.ops.verify import verify

    path, options = sink_location
    sink = ParquetSink(path, partition_by=["topic"], storage_options=options)
    sink.bind("owner-1")
    sink.check(SCHEMA)
    for b in range(3):
        consumed = [ConsumedOffsets("in", 0, b * 10, b * 10 + 9)]
        assert sink.commit_consumed(b, stage(sink, b, 200), consumed)
    report = verify(sink, "owner-1", digests=True)
    assert report.ok, "\n".join(report.lines())
    assert report.partitions == {"in/0": [0, 30]} and report.digests_checked == report.files
    loc = sfs.resolve(path, options)
    victim = committed_files(path, options)[0].path
    sfs.delete_quietly(loc, loc.join(victim))
    report = verify(sink, "owner-1")
    assert [(p.kind, p.file) for p in report.problems] == [("missing_file", victim)]


def test_a_merge_streams_its_files_splits_at_the_target_and_keeps_digests(
    tmp_path: Path,
) -> None:
    """A merge reads its inputs one at a time, writes as many files as the target size
    needs, keeps files of an evolved schema apart from older ones, and the digests add up."""
    from inorder.ops.verify_parquet import collect_parquet

    path = str(tmp_path / "split")
    sink = ParquetSink(path, partition_by=["topic"])
    sink.check(SCHEMA)
    for b in range(3):
        sink.commit(b, stage(sink, b, 400))
    evolved = SCHEMA.append(pa.field("extra", pa.string()))
    later = ParquetSink(path, partition_by=["topic"])
    later.check(evolved)
    for b in range(3, 5):
        data = make_batch(b, 400)
        extra = pa.array([f"e{b}-{i}" for i in range(data.num_rows)])
        later.commit(b, stage_batch(later, b, pa.record_batch([*data.columns, extra], evolved)))
    before = committed_files(path)
    sizes = [sum(f.size_bytes for f in before if f.partition_values["topic"] == t) for t in "ab"]
    target = min(sizes) // 3 + 1
    report = compact_parquet(path, target_file_size=target, grace_seconds=0, full=True)
    after = committed_files(path)
    for t in "ab":
        outputs = [f for f in after if f.partition_values["topic"] == t]
        assert len(outputs) >= 3 and {f.level for f in outputs} == {1}, (t, outputs)
        assert sum(f.rows for f in outputs) == 1000
        for f in outputs:  # files of the two schemas are merged apart: digests add up
            stored = pq.read_table(str(tmp_path / "split" / f.path))
            evolved_rows = (stored.column("offset").to_numpy() >= 1200).sum()
            assert evolved_rows in (0, stored.num_rows)
            assert ("extra" in stored.column_names) == (evolved_rows > 0)
    assert len(report.groups) == 2
    table = read_committed(path)
    assert sorted(table.column("offset").to_pylist()) == list(range(2000))
    extras = table.filter(pa.compute.is_valid(table.column("extra")))
    assert sorted(extras.column("offset").to_pylist()) == list(range(1200, 2000))
    assert collect_parquet(ParquetSink(path), None).problems == []
