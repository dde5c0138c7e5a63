"""The bound on one merge's input (``compaction_max_merge_bytes``) in the level planner.

Pure planning, no files (the files are in tests/integration/test_compaction_wake.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from inorder.sinks.base import SinkError
from inorder.sinks.compaction_levels import (
    DEFAULT_MAX_MERGE_BYTES,
    LevelSettings,
    check_max_merge_bytes,
    plan_full,
    plan_partition,
)

MIB = 1024 * 1024


@dataclass(frozen=True)
class F:
    """A live file for the planner."""

    level: int
    size_bytes: int
    committed_at: float | None
    name: str = ""


def files(n: int, size: int, level: int = 0, at: float = 100.0) -> list[F]:
    return [F(level, size, at + i, name=f"l{level}-{i}") for i in range(n)]


def test_the_default_bound_is_512_mib_and_the_defaults_pass_its_check() -> None:
    assert DEFAULT_MAX_MERGE_BYTES == 512 * MIB
    assert LevelSettings(128 * MIB).max_merge_bytes == 512 * MIB


def test_a_count_merge_over_the_bound_is_cut_into_merges_that_fit() -> None:
    """Nine 90 MiB files with a 512 MiB bound: the oldest five (450 MiB) and the other four
    (360 MiB), both by count, both one level up."""
    s = LevelSettings(128 * MIB, trigger_seconds=5.0)
    merges = plan_partition(files(9, 90 * MIB), now=101.0, settings=s)
    assert [[f.name for f in m.files] for m in merges] == [
        [f"l0-{i}" for i in range(5)],
        [f"l0-{i}" for i in range(5, 9)],
    ]
    assert all(m.level == 1 and m.rule == "count" for m in merges)
    assert all(m.size_bytes <= s.max_merge_bytes for m in merges)
    # Cut into runs that leave one file alone: that file waits with the younger ones.
    s = LevelSettings(100, fanout=3, trigger_seconds=5.0, max_merge_bytes=100)
    merges = plan_partition(files(4, 45), now=101.0, settings=s)
    assert [[f.name for f in m.files] for m in merges] == [["l0-0", "l0-1"]]
    merges = plan_partition(files(5, 45), now=101.0, settings=s)
    assert [[f.name for f in m.files] for m in merges] == [["l0-0", "l0-1"], ["l0-2", "l0-3"]]


def test_the_age_rule_and_full_cut_their_merges_at_the_bound() -> None:
    s = LevelSettings(100, fanout=50, trigger_seconds=5.0, max_merge_bytes=100)
    level0 = files(7, 30)
    aged = plan_partition(level0, now=1e9, settings=s)
    assert [len(m.files) for m in aged] == [3, 3]  # the seventh waits alone
    assert all(m.size_bytes <= 100 and m.rule == "age" for m in aged)
    full = plan_full([*files(3, 30), *files(2, 40, level=1, at=50.0)], s)
    assert all(m.size_bytes <= 100 for m in full)
    # Each merge's output is one above its own highest input.
    assert [(len(m.files), m.level) for m in full] == [(2, 2), (3, 1)]


def test_a_file_of_half_the_bound_is_final_so_any_two_others_fit() -> None:
    s = LevelSettings(100, trigger_seconds=5.0, max_merge_bytes=120)
    assert s.is_final(F(0, 60, 1.0)) and not s.is_final(F(0, 59, 1.0))
    # A file too big to pair with any other is never taken.
    assert plan_partition([F(0, 60, 1.0), F(0, 10, 2.0)], now=1e9, settings=s) == []


def test_the_bound_is_checked_by_name() -> None:
    with pytest.raises(SinkError, match=r"compaction_max_merge_bytes must be an integer >= "):
        check_max_merge_bytes(10, 100)
    with pytest.raises(SinkError, match="compaction_max_merge_bytes"):
        LevelSettings(100, max_merge_bytes=99)
    with pytest.raises(SinkError, match="compaction_max_merge_bytes"):
        check_max_merge_bytes(True, 1)  # type: ignore[arg-type]
    check_max_merge_bytes(100, 100)


def test_a_target_above_the_default_bound_keeps_working_without_the_key(tmp_path: Any) -> None:
    """Files of earlier releases set ``target_file_size`` alone: the bound follows it."""
    from inorder.pipeline.config import validate
    from inorder.sinks.parquet import ParquetSink

    big = 1024 * MIB
    sink = ParquetSink(str(tmp_path / "out"), target_file_size=big)
    assert sink.compaction_max_merge_bytes == big
    assert ParquetSink(str(tmp_path / "o2")).compaction_max_merge_bytes == DEFAULT_MAX_MERGE_BYTES
    config = validate(
        {
            "source": {"topics": ["t"], "bootstrap_servers": "127.0.0.1:1"},
            "processor": {"type": "sessions"},
            "sink": {"path": str(tmp_path / "o3"), "target_file_size": big, "compact": True},
        },
        origin="test.toml",
    )
    assert config["sink"]["compaction_max_merge_bytes"] == 0
