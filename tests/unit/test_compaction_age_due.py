"""When the age rule next merges in a partition (what the compactor's timer waits for).

Pure planning, no files (the timer on files is in tests/integration/test_compaction_rounds.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inorder.sinks.compaction_levels import LevelSettings, age_due, plan_partition

MIB = 1024 * 1024
SETTINGS = LevelSettings(128 * MIB, fanout=3, levels=3, trigger_seconds=10.0)


@dataclass(frozen=True)
class F:
    """A live file for the planner."""

    level: int
    size_bytes: int
    committed_at: float | None


def test_the_oldest_file_of_a_level_with_two_plus_its_window() -> None:
    live = [F(0, 1000, 100.0), F(0, 1000, 105.0), F(1, 1000, 50.0), F(1, 1000, 60.0)]
    # Level 0: 100 + 10 x 3 = 130; level 1: 50 + 10 x 9 = 140.
    assert age_due(live, SETTINGS) == 130.0
    assert plan_partition(live, 130.0, SETTINGS) == []  # not older than the window yet
    assert [m.rule for m in plan_partition(live, 130.5, SETTINGS)] == ["age"]


def test_nothing_falls_due_by_age_without_two_non_final_files_of_a_level() -> None:
    assert age_due([F(0, 1000, 100.0), F(1, 1000, 50.0)], SETTINGS) is None
    final = F(0, 100 * MIB, 90.0)
    assert age_due([final, F(0, 1000, 100.0)], SETTINGS) is None
    unknown_trigger = LevelSettings(128 * MIB, fanout=3, levels=3)
    assert age_due([F(0, 1000, 100.0), F(0, 1000, 101.0)], unknown_trigger) is None


def test_files_of_unknown_age_are_due_now() -> None:
    assert age_due([F(0, 1000, None), F(0, 1000, 100.0)], SETTINGS) == -math.inf
