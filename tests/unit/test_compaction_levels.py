"""The level planner of tiered compaction: its rules, and the bounds they give.

Pure planning, no files: :func:`simulate` runs batches of a few topics through plan and
apply in memory and counts what compaction rewrites. ``docs/small-files.md`` quotes the
numbers :func:`test_amplification_of_an_hour_at_30_topics` computes.
"""

from __future__ import annotations

import random
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from inorder.sinks.base import SinkError
from inorder.sinks.commit_log import file_entry, final_name, live_file, partition_dir
from inorder.sinks.compaction_levels import (
    LevelSettings,
    Merge,
    check_level_settings,
    estimate_trigger,
    output_pieces,
    plan_full,
    plan_partition,
)
from inorder.sinks.compaction_merge import partition_files, plan_merges
from inorder.storage import fs as sfs

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
TARGET = 128 * MIB


@dataclass(frozen=True)
class F:
    """A live file for the planner; ``chunks`` are (rows, times rewritten) per batch slice."""

    level: int
    size_bytes: int
    committed_at: float | None
    chunks: tuple[tuple[int, int], ...] = ()
    name: str = ""


def files(
    n: int, level: int = 0, size: int = 4000, at: float = 100.0, step: float = 5.0
) -> list[F]:
    return [F(level, size, at + i * step, name=f"l{level}-{i}") for i in range(n)]


def settings(trigger: float | None = 5.0, **kwargs: int) -> LevelSettings:
    return LevelSettings(TARGET, trigger_seconds=trigger, **kwargs)


# -- the rules ---------------------------------------------------------------------------------


def test_count_rule_merges_the_oldest_k_into_the_next_level() -> None:
    young = files(10, at=1000.0)
    shuffled = young[5:] + young[:5]  # the planner orders by commit time, not by position
    merges = plan_partition(shuffled, now=1050.0, settings=settings())
    assert [(m.rule, m.level, [f.name for f in m.files]) for m in merges] == [
        ("count", 1, [f"l0-{i}" for i in range(9)])
    ]
    assert plan_partition(young[:8], now=1040.0, settings=settings()) == []


def test_count_rule_at_every_level_and_several_merges_per_level() -> None:
    group = files(19, at=1000.0, step=0.1) + files(9, level=1, at=900.0, step=1.0)
    merges = plan_partition(group, now=1002.0, settings=settings())
    assert [(m.rule, m.level, len(m.files)) for m in merges] == [
        ("count", 1, 9),
        ("count", 1, 9),
        ("count", 2, 9),
    ]


def test_count_rule_counts_commits_not_files() -> None:
    # Two tasks: every batch writes two files to the partition, at one commit time.
    two_per_batch = [
        F(0, 4000, 1000.0 + 5.0 * b, name=f"b{b}-t{t}") for b in range(10) for t in range(2)
    ]
    merges = plan_partition(two_per_batch, now=1050.0, settings=settings())
    # The files of the oldest 9 batches (18 files), not the oldest 9 files (4.5 batches):
    # a level spans the same time whatever the number of tasks.
    assert [(m.rule, m.level, len(m.files)) for m in merges] == [("count", 1, 18)]
    assert {f.name for f in merges[0].files} == {f"b{b}-t{t}" for b in range(9) for t in range(2)}
    assert plan_partition(two_per_batch[:16], now=1040.0, settings=settings()) == []
    # Files of unknown age each count as a commit of their own.
    unknown = [F(0, 4000, None, name=f"u{i}") for i in range(9)]
    assert [len(m.files) for m in plan_partition(unknown, 1050.0, settings())] == [9]


def test_age_rule_merges_a_quiet_level_once_its_oldest_file_is_older_than_its_window() -> None:
    s = settings(trigger=5.0)  # windows: 45 s, 405 s, 3645 s
    assert (s.window(0), s.window(1), s.window(2)) == (45.0, 405.0, 3645.0)
    quiet = files(3, at=0.0, step=20.0)  # committed at 0, 20, 40
    assert plan_partition(quiet, now=45.0, settings=s) == []  # oldest exactly 45 s old
    [merge] = plan_partition(quiet, now=45.5, settings=s)
    assert (merge.rule, merge.level, len(merge.files)) == ("age", 1, 3)
    assert merge.committed_at == 0.0  # the output keeps the age of its oldest rows
    # One file alone is never merged, however old.
    assert plan_partition(quiet[:1], now=10_000.0, settings=s) == []
    # Level 1 waits for its own, longer window.
    ones = files(2, level=1, at=0.0)
    assert plan_partition(ones, now=400.0, settings=s) == []
    assert [m.rule for m in plan_partition(ones, now=406.0, settings=s)] == ["age"]


def test_age_rule_after_the_count_rule_takes_the_rest() -> None:
    group = files(11, at=0.0, step=1.0)
    merges = plan_partition(group, now=100.0, settings=settings())
    assert [(m.rule, len(m.files)) for m in merges] == [("count", 9), ("age", 2)]


def test_without_a_trigger_only_files_of_unknown_age_merge_by_age() -> None:
    known = files(3, at=0.0)
    assert plan_partition(known, now=1e9, settings=settings(trigger=None)) == []
    unknown = [F(0, 4000, None, name=f"old-{i}") for i in range(3)]
    [merge] = plan_partition(unknown, now=0.0, settings=settings(trigger=None))
    assert merge.rule == "age" and merge.committed_at is None


def test_final_files_are_never_merged() -> None:
    s = settings(levels=3)
    big = [F(0, TARGET * 3 // 4, 0.0, name=f"big-{i}") for i in range(20)]
    top = [F(3, 4000, 0.0, name=f"top-{i}") for i in range(20)]
    assert all(s.is_final(f) for f in big + top)
    assert plan_partition(big + top, now=1e9, settings=s) == []
    small = files(2, at=0.0)
    [merge] = plan_partition(big + top + small, now=1e9, settings=s)
    assert {f.name for f in merge.files} == {"l0-0", "l0-1"}


def test_full_merges_every_non_final_file_one_level_up() -> None:
    s = settings(levels=3)
    mixed = files(3, at=10.0) + files(2, level=2, at=0.0) + [F(3, 10, 0.0, name="final")]
    [merge] = plan_full(mixed, s)
    assert (merge.rule, merge.level, len(merge.files)) == ("full", 3, 5)
    assert [f.name for f in merge.files][:2] == ["l2-0", "l2-1"]  # oldest first
    assert plan_full(files(1), s) == []


def test_the_trigger_is_estimated_from_the_batch_files() -> None:
    live = files(5, at=100.0, step=5.0) + files(3, level=1, at=0.0, step=200.0)
    live += [F(0, 10, None), F(0, 10, 120.0)]  # unknown ages and duplicates are left out
    assert estimate_trigger(live) == 5.0
    assert estimate_trigger(files(1)) is None
    assert estimate_trigger([]) is None


def test_output_pieces_split_at_the_target() -> None:
    assert output_pieces(10, TARGET) == 1
    assert output_pieces(TARGET, TARGET) == 1
    assert output_pieces(TARGET + 1, TARGET) == 2


def test_settings_are_checked_by_name() -> None:
    with pytest.raises(SinkError, match="compaction_fanout"):
        check_level_settings(1, 3)
    with pytest.raises(SinkError, match="compaction_levels"):
        check_level_settings(9, 0)
    with pytest.raises(SinkError, match="compaction_fanout"):
        check_level_settings(True, 3)
    from inorder.sinks.parquet import ParquetSink

    with pytest.raises(SinkError, match="compaction_levels must be an integer >= 1"):
        ParquetSink("/tmp/unused", compaction_levels=0)
    with pytest.raises(SinkError, match="compaction_fanout must be an integer >= 2"):
        ParquetSink("/tmp/unused", compaction_fanout=1)


# -- the commit log: levels recorded, old logs read as level 0 --------------------------------


def test_an_entry_without_level_or_time_is_a_level_0_file_of_unknown_age() -> None:
    old = {"final": "topic=a/compacted-0000000001-00000.parquet", "rows": 3, "size_bytes": 900}
    f = live_file(old)
    assert (f.level, f.committed_at) == (0, None)
    batch = {"final": "topic=a/part-0000000007-00000.parquet", "rows": 3, "size_bytes": 900}
    assert live_file(batch, committed_at=123.5).committed_at == 123.5  # the manifest's time
    merged = live_file({**old, "level": 2, "committed_at": 50.0}, committed_at=999.0)
    assert (merged.level, merged.committed_at) == (2, 50.0)
    assert live_file(file_entry(merged)) == merged
    assert "level" not in file_entry(f) and "committed_at" not in file_entry(f)


def test_old_logs_compact_by_the_level_rule() -> None:
    """A dataset of the previous release: no levels, checkpoints without times. Its files are
    level 0 and older than every window, so they merge (by count, then by age)."""
    live = [
        live_file(
            {
                "final": f"topic={t}/part-{b:010d}-00000.parquet",
                "rows": 10,
                "size_bytes": 4000,
                "partition_values": {"topic": t},
            }
        )
        for b in range(12)
        for t in ("a", "b")
    ]
    merges = plan_merges(live, ["topic"], settings(trigger=None), now=0.0)
    assert sorted((m.files[0].partition_values["topic"], m.rule, len(m.files)) for m in merges) == [
        ("a", "age", 3),
        ("a", "count", 9),
        ("b", "age", 3),
        ("b", "count", 9),
    ]
    assert all(len({f.partition_values["topic"] for f in m.files}) == 1 for m in merges)


def test_files_are_grouped_by_the_directory_partition_dir_names() -> None:
    """Planning groups files by their name's directory, which is what ``partition_dir``
    makes of the partition values (escaped, nulls, several columns): the keys the
    compactor's touched partitions and due times use."""
    values = [
        {"topic": "a/b c", "day": "2026-11-27"},
        {"topic": None, "day": "x%y"},
        {"topic": "plain", "day": "=?"},
    ]
    cols = ["topic", "day"]
    live = [
        live_file(
            {
                "final": final_name(partition_dir(cols, v), b, 0),
                "rows": 1,
                "size_bytes": 10,
                "partition_values": v,
            }
        )
        for b in range(3)
        for v in values
    ]
    grouped = partition_files(live, cols)
    assert list(grouped) == [partition_dir(cols, v) for v in values]
    assert all(len(files) == 3 for files in grouped.values())
    only = partition_files(live, cols, [partition_dir(cols, values[1])])
    assert list(only) == [partition_dir(cols, values[1])]
    assert plan_merges(grouped, cols, settings(trigger=None), now=0.0) == plan_merges(
        live, cols, settings(trigger=None), now=0.0
    )


def test_a_dataset_of_release_0_1_0_compacts_and_reads_each_row_once(tmp_path: Path) -> None:
    """The output of tests/compat's 0.1.0 run (no levels, no digests): its batch files are
    level 0, older than their window, so each topic's 4 files merge by age into level 1."""
    from inorder.ops.verify_parquet import collect_parquet
    from inorder.sinks.commit_checkpoint import write_checkpoint
    from inorder.sinks.commit_log import load_state
    from inorder.sinks.compaction import compact_parquet
    from inorder.sinks.parquet import ParquetSink, committed_files, read_committed

    with tarfile.open(ROOT / "tests" / "compat" / "inorder-0.1.0.tar.gz") as archive:
        archive.extractall(
            tmp_path, [m for m in archive.getmembers() if m.name.startswith("out")], filter="data"
        )
    path = str(tmp_path / "out")
    before = read_committed(path)
    assert {f.level for f in committed_files(path)} == {0} and len(committed_files(path)) == 8
    report = compact_parquet(path, grace_seconds=0)
    assert sorted(len(g) for g in report.groups) == [4, 4]
    files = committed_files(path)
    assert [f.level for f in files] == [1, 1]
    assert files[0].committed_at == pytest.approx(1795576896.646)  # batch 0's manifest
    after = read_committed(path)
    key = ["topic", "partition", "offset", "row_id"]
    assert after.num_rows == before.num_rows
    assert after.sort_by([(c, "ascending") for c in key]).equals(
        before.sort_by([(c, "ascending") for c in key])
    )
    assert compact_parquet(path, grace_seconds=0).groups == []  # one file per level: done
    assert write_checkpoint(sfs.resolve(path)) == 1
    assert [f.level for f in load_state(sfs.resolve(path)).files.values()] == [1, 1]
    assert collect_parquet(ParquetSink(path), None).problems == []


# -- simulation: the bounds, and write amplification -----------------------------------------


@dataclass
class Simulation:
    """What compaction did to a run of batches (bytes: a per-file overhead model)."""

    rows_ingested: int = 0
    bytes_ingested: int = 0
    rows_rewritten: int = 0
    bytes_written: int = 0
    merges: int = 0
    max_rewrites: int = 0
    max_non_final: int = 0
    live: dict[str, list[F]] = field(default_factory=dict)

    @property
    def row_amplification(self) -> float:
        return self.rows_rewritten / self.rows_ingested

    @property
    def byte_amplification(self) -> float:
        return self.bytes_written / self.bytes_ingested


def _apply(merge: Merge[F], overhead: int, target: int) -> list[F]:
    data = sum(f.size_bytes - overhead for f in merge.files)
    pieces = output_pieces(data + overhead, target)
    chunks = [(rows, times + 1) for f in merge.files for rows, times in f.chunks]
    per = -(-len(chunks) // pieces)
    return [
        F(merge.level, overhead + data // pieces, merge.committed_at, tuple(chunks[i : i + per]))
        for i in range(0, len(chunks), per)
    ]


def simulate(
    topics: int,
    batches: int,
    s: LevelSettings,
    trigger: float = 5.0,
    overhead: int = 3100,
    data_per_batch: dict[str, int] | None = None,
    every: dict[str, int] | None = None,
    rows: int = 5,
) -> Simulation:
    """``batches`` batches ``trigger`` seconds apart; topic ``t`` writes one file of
    ``overhead + data_per_batch[t]`` bytes every ``every[t]`` batches (default: each
    batch, 900 bytes of data: the measured shape of docs/small-files.md); after each
    batch compaction plans and applies rounds until nothing is left, as the sink does,
    with the trigger estimated from the files as the sink does."""
    sim = Simulation()
    names = [f"t{i}" for i in range(topics)]
    sim.live = {t: [] for t in names}
    for b in range(batches):
        now = b * trigger
        for t in names:
            if b % (every or {}).get(t, 1):
                continue
            size = overhead + (data_per_batch or {}).get(t, 900)
            sim.live[t].append(F(0, size, now, ((rows, 0),)))
            sim.rows_ingested += rows
            sim.bytes_ingested += size
        for _ in range(s.levels + 1):
            estimated = estimate_trigger(f for fs in sim.live.values() for f in fs)
            current = LevelSettings(s.target_file_size, s.fanout, s.levels, estimated)
            planned = {t: plan_partition(fs, now, current) for t, fs in sim.live.items()}
            if not any(planned.values()):
                break
            for t, merges in planned.items():
                for merge in merges:
                    taken = {id(f) for f in merge.files}
                    written = _apply(merge, overhead, s.target_file_size)
                    sim.live[t] = [f for f in sim.live[t] if id(f) not in taken] + written
                    sim.merges += 1
                    sim.rows_rewritten += sum(r for f in merge.files for r, _ in f.chunks)
                    sim.bytes_written += sum(f.size_bytes for f in written)
        for fs in sim.live.values():
            non_final = sum(not s.is_final(f) for f in fs)
            sim.max_non_final = max(sim.max_non_final, non_final)
            for f in fs:
                sim.max_rewrites = max([sim.max_rewrites, *(n for _, n in f.chunks)])
    return sim


@pytest.mark.parametrize(
    ("fanout", "levels", "seed"), [(2, 1, 1), (3, 2, 2), (4, 3, 3), (9, 3, 4), (5, 4, 5)]
)
def test_each_row_is_rewritten_at_most_levels_times(fanout: int, levels: int, seed: int) -> None:
    rng = random.Random(seed)
    topics = 6
    s = LevelSettings(64 * 1024, fanout, levels)  # a small target: busy topics reach it
    data = {f"t{i}": rng.choice([200, 2_000, 20_000]) for i in range(topics)}
    every = {f"t{i}": rng.choice([1, 1, 3, 17]) for i in range(topics)}
    sim = simulate(topics, 400, s, data_per_batch=data, every=every)
    assert sim.merges > 0
    assert sim.max_rewrites <= levels, sim
    assert sim.max_non_final <= levels * (fanout - 1), sim
    # Rows are conserved: every ingested row is in exactly one live file.
    live_rows = sum(r for fs in sim.live.values() for f in fs for r, _ in f.chunks)
    assert live_rows == sim.rows_ingested
    assert sim.row_amplification <= levels


def test_amplification_of_an_hour_at_30_topics() -> None:
    """30 topics x 720 batches at a 5 s trigger (an hour), the defaults (k = 9, L = 3,
    128 MiB), each topic-batch file 3.1 KB of overhead + 0.9 KB of data."""
    sim = simulate(30, 720, settings(trigger=None))
    assert sim.max_rewrites <= 3 and sim.max_non_final <= 24
    assert sim.row_amplification <= 3
    assert sim.byte_amplification < 1
    live = sum(len(fs) for fs in sim.live.values()) / 30
    print(  # quoted in docs/small-files.md (pytest -s shows it)
        f"\n30 topics x 720 batches: rows rewritten per row ingested "
        f"{sim.row_amplification:.2f}, bytes written per byte ingested "
        f"{sim.byte_amplification:.3f}, merges {sim.merges}, live files per topic {live:.1f}, "
        f"max rewrites of a row {sim.max_rewrites}, max non-final files per topic "
        f"{sim.max_non_final}"
    )


def test_iceberg_levels_are_read_from_file_names() -> None:
    from inorder.sinks.iceberg_compaction import file_level

    assert file_level("s3://b/wh/db/t/data/topic=a/compacted-l2-0a1b.parquet") == 2
    assert file_level("data/topic=a/compacted-l10-0a1b.parquet") == 10
    assert file_level("data/topic=a/00000-0-part.parquet") == 0
    # Merged by the previous release (compacted-<uuid>-<n>): level 0.
    assert file_level("data/compacted-9f8e7d6c5b4a39281706f5e4d3c2b1a0-00000.parquet") == 0
    assert file_level("data/topic=compacted-l3-x/part.parquet") == 0  # the name, not the path
