"""The level planner of tiered compaction: which files of a partition to merge, and when.

Every live file has a **level**: batch files are level 0, a merge of level-``i`` files
writes level ``i + 1``. Per output partition, with fan-in ``k`` (``fanout``) and top level
``L`` (``levels``):

1. **merge by count**: while the partition holds ``k`` non-final files of level ``i``, the
   oldest ``k`` of them become one merge writing level ``i + 1``. At level 0 the files of one
   commit count once: a batch of ``t`` tasks writes ``t`` files to a partition, and a
   level's span of time must not shrink with ``t``;
2. **merge by age**: when the oldest non-final file of level ``i`` left after that is older
   than ``W_i = trigger x k^(i+1)`` and at least 2 are left, they are merged anyway, so a
   quiet partition converges to few files instead of waiting forever for ``k``;
3. **final files** (at least 3/4 of ``target_file_size``, or level ``L``) are never merged;
4. **bounded merges**: a merge reads at most ``max_merge_bytes`` of input. Files a rule
   takes that do not fit in one merge are cut, oldest first, into several merges (a last
   file left alone waits), and a file of half the bound or more is final too, so any two
   non-final files fit in one merge.

Each merge moves every row it touches up one level and level ``L`` is final, so a row is
rewritten at most ``L`` times, and a partition keeps at most ``L x (k - 1)`` non-final
files (counting a batch's level-0 files once) once the plan is applied (repeatedly: a
merge's output may complete the next level).

Planning is pure: a function of the live files (level, size, commit time), the time now and
the settings, so every compactor (the sink after a commit, ``inorder compact``) plans the
same merges from the same commit log. ``docs/small-files.md`` has the design and the write
amplification it gives.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from inorder.sinks.base import SinkError

DEFAULT_FANOUT = 9
DEFAULT_LEVELS = 3
#: The most input one merge reads, by default (``compaction_max_merge_bytes``).
DEFAULT_MAX_MERGE_BYTES = 512 * 1024 * 1024
#: A file at least this share of ``target_file_size`` is final: merging it gains nothing.
FINAL_FRACTION = 0.75


class Tiered(Protocol):
    """What the planner needs to know of a live file."""

    @property
    def level(self) -> int:
        """0 for a batch's file, ``i + 1`` for a merge of level-``i`` files."""

    @property
    def size_bytes(self) -> int:
        """Size of the file."""

    @property
    def committed_at(self) -> float | None:
        """When the oldest batch of its rows committed (epoch seconds); ``None``: unknown
        (commit logs of older releases), taken as older than every window."""


F = TypeVar("F", bound=Tiered)


@dataclass(frozen=True)
class LevelSettings:
    """The knobs of the level rule."""

    target_file_size: int
    fanout: int = DEFAULT_FANOUT
    """``k``: files of one level merged into one of the next."""
    levels: int = DEFAULT_LEVELS
    """``L``: files of this level are final."""
    trigger_seconds: float | None = None
    """The interval between batches; ``None``: unknown, so only files of unknown age are
    merged by age (see :func:`estimate_trigger`)."""
    max_merge_bytes: int = DEFAULT_MAX_MERGE_BYTES
    """The most input bytes one merge reads."""

    def __post_init__(self) -> None:
        check_level_settings(self.fanout, self.levels)
        if self.target_file_size <= 0:
            raise SinkError(f"target_file_size must be > 0, not {self.target_file_size}")
        check_max_merge_bytes(self.max_merge_bytes, self.target_file_size)

    def window(self, level: int) -> float | None:
        """``W_level = trigger x k^(level + 1)``: how old the oldest file of ``level`` may
        get before the files of that level are merged whatever their number."""
        if self.trigger_seconds is None:
            return None
        return float(self.trigger_seconds * self.fanout ** (level + 1))

    def is_final(self, f: Tiered) -> bool:
        """Whether ``f`` is never merged again (level ``L``, 3/4 of the target size, or half
        of ``max_merge_bytes``: two such files would not fit in one merge)."""
        if f.level >= self.levels:
            return True
        return f.size_bytes >= min(self.target_file_size * FINAL_FRACTION, self.max_merge_bytes / 2)


def check_level_settings(fanout: int, levels: int) -> None:
    """:class:`SinkError` naming the setting unless ``fanout >= 2`` and ``levels >= 1``."""
    if isinstance(fanout, bool) or not isinstance(fanout, int) or fanout < 2:
        raise SinkError(f"compaction_fanout must be an integer >= 2, not {fanout!r}")
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 1:
        raise SinkError(f"compaction_levels must be an integer >= 1, not {levels!r}")


def check_max_merge_bytes(max_merge_bytes: int, target_file_size: int) -> None:
    """:class:`SinkError` naming the setting unless ``max_merge_bytes >= target_file_size``
    (a smaller bound could never write a file of the target size)."""
    value = max_merge_bytes
    if isinstance(value, bool) or not isinstance(value, int) or value < target_file_size:
        raise SinkError(
            "compaction_max_merge_bytes must be an integer >= target_file_size "
            f"({target_file_size}), not {value!r}"
        )


@dataclass(frozen=True)
class Merge(Generic[F]):
    """One planned merge: files of one partition (oldest first) into files of ``level``."""

    files: tuple[F, ...]
    level: int
    """Level of the output files."""
    rule: Literal["count", "age", "full"]

    @property
    def size_bytes(self) -> int:
        """Bytes the merge reads."""
        return sum(f.size_bytes for f in self.files)

    @property
    def committed_at(self) -> float | None:
        """The output's commit time for the age rule: that of its oldest rows."""
        known = [f.committed_at for f in self.files if f.committed_at is not None]
        return min(known) if len(known) == len(self.files) else None


def _oldest_first(files: Iterable[F]) -> list[F]:
    # Stable: files of the same commit keep the order of the commit log.
    return sorted(files, key=lambda f: -math.inf if f.committed_at is None else f.committed_at)


def _is_old(f: Tiered, window: float | None, now: float) -> bool:
    if f.committed_at is None:
        return True
    return window is not None and now - f.committed_at > window


def _bounded(files: Sequence[F], limit: int) -> list[tuple[F, ...]]:
    """``files`` (oldest first) cut into runs of at most ``limit`` bytes each, in order.

    Every non-final file is under half the limit, so every run but the last holds at least
    two files; a last run of one file is returned too (the caller leaves it waiting).
    """
    runs: list[list[F]] = []
    size = 0
    for f in files:
        if runs and size + f.size_bytes <= limit:
            runs[-1].append(f)
            size += f.size_bytes
        else:
            runs.append([f])
            size = f.size_bytes
    return [tuple(run) for run in runs]


def _units(files: Sequence[F], level: int) -> list[list[F]]:
    """What the count rule counts among ``files`` (oldest first) of ``level``: at level 0 the
    files of one commit (one per task of a batch) count once; merged files count each (one
    compaction commit may write several merges' outputs, which are not one unit); a file of
    unknown age counts on its own."""
    if level > 0:
        return [[f] for f in files]
    runs: list[list[F]] = []
    for f in files:
        if runs and f.committed_at is not None and runs[-1][0].committed_at == f.committed_at:
            runs[-1].append(f)
        else:
            runs.append([f])
    return runs


def plan_partition(files: Sequence[F], now: float, settings: LevelSettings) -> list[Merge[F]]:
    """The merges of one partition's live files (in commit-log order) at time ``now``."""
    by_level: dict[int, list[F]] = {}
    for f in files:
        if not settings.is_final(f):
            by_level.setdefault(max(f.level, 0), []).append(f)
    merges: list[Merge[F]] = []
    k = settings.fanout
    limit = settings.max_merge_bytes
    for level in sorted(by_level):
        waiting = _oldest_first(by_level[level])
        units = _units(waiting, level)
        while len(units) >= k:
            taken = [f for unit in units[:k] for f in unit]
            runs = _bounded(taken, limit)
            left = runs.pop() if len(runs[-1]) < 2 else ()
            merges.extend(Merge(run, level + 1, "count") for run in runs)
            waiting = [*left, *(f for unit in units[k:] for f in unit)]
            units = _units(waiting, level)
        if len(waiting) >= 2 and _is_old(waiting[0], settings.window(level), now):
            for run in _bounded(waiting, limit):
                if len(run) >= 2:
                    merges.append(Merge(run, level + 1, "age"))
    return merges


def age_due(files: Sequence[F], settings: LevelSettings) -> float | None:
    """When the age rule next merges in a partition whose due merges are done: the earliest
    ``committed_at + W_i`` over the levels holding at least 2 non-final files (``-inf``: a
    file of unknown age, due now); ``None`` when no level will be merged by age without a
    new file (so a compactor's timer need not wake for this partition)."""
    by_level: dict[int, list[F]] = {}
    for f in files:
        if not settings.is_final(f):
            by_level.setdefault(max(f.level, 0), []).append(f)
    due: float | None = None
    for level, waiting in by_level.items():
        if len(waiting) < 2:
            continue
        times = [f.committed_at for f in waiting]
        window = settings.window(level)
        if None in times:
            when = -math.inf
        elif window is None:
            continue
        else:
            when = min(t for t in times if t is not None) + window
        due = when if due is None else min(due, when)
    return due


def plan_full(files: Sequence[F], settings: LevelSettings) -> list[Merge[F]]:
    """Every non-final file of the partition in one merge (``inorder compact --full``), or
    in as few as ``max_merge_bytes`` allows.

    A merge's output level is one above its highest input's (at most ``L``): every row still
    moves up at least one level per rewrite, so the bound of ``L`` rewrites per row holds.
    """
    waiting = _oldest_first(f for f in files if not settings.is_final(f))
    merges: list[Merge[F]] = []
    for run in _bounded(waiting, settings.max_merge_bytes):
        if len(run) >= 2:
            top = max(max(f.level, 0) for f in run)
            merges.append(Merge(run, min(top + 1, settings.levels), "full"))
    return merges


def plan_levels(
    partitions: Mapping[str, Sequence[F]],
    now: float,
    settings: LevelSettings,
    full: bool = False,
) -> list[Merge[F]]:
    """The merges of every partition (``partition key -> live files in commit-log order``)."""
    merges: list[Merge[F]] = []
    for files in partitions.values():
        merges.extend(plan_full(files, settings) if full else plan_partition(files, now, settings))
    return merges


def output_pieces(size_bytes: int, target_file_size: int) -> int:
    """How many files a merge of ``size_bytes`` of input writes: it splits at the target."""
    return max(1, math.ceil(size_bytes / target_file_size))


def estimate_trigger(files: Iterable[Tiered]) -> float | None:
    """The interval between batches, from the commit times of the live batch files.

    The median gap between the distinct commit times of level-0 files: those are the recent
    batches (merges take the older ones), so this follows the pipeline's actual cadence,
    also across restarts. ``None`` with fewer than two known commit times.
    """
    times = sorted({f.committed_at for f in files if f.level == 0 and f.committed_at is not None})
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    return statistics.median(gaps) if gaps else None


_LEVEL = re.compile(r"^compacted-l(\d+)-")


def file_level(path: str) -> int:
    """The level in a merged data file's name (``compacted-l<level>-...``), for table
    formats whose files carry no free-form tags (Iceberg, Delta); other names are 0."""
    match = _LEVEL.match(path.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else 0
