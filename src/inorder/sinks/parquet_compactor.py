"""When a Parquet sink's merges run, and over which partitions: after each commit, in a
driver thread or inline.

By default (``compact_in_background``) the commit only wakes a :class:`BackgroundWork`
thread and returns, so batch time does not depend on compaction (docs/small-files.md, "Off
the critical path"). Merges are safe beside batch commits in any order: batch manifests and
compaction records are separate sequences, and a merge takes only files of batches that are
done. Inline, the commit merges before it returns (the previous behaviour).

**What a round plans.** Each commit tells the compactor which partition directories its
batch wrote; a round plans only the partitions touched since the previous round, since only
those can have gained a merge by count. Every partition is planned (a *sweep*) in the first
round of the process (after a restart, whatever the previous run left is planned again),
after a round that failed (its partitions are not lost), and once ``fanout`` commits passed
since the last sweep (``sweep_every``): merges by age fall due without a commit, and the
shortest age window is ``fanout`` triggers.

**A bounded round.** A round commits at most ``max_round_merges`` merges reading at most
``max_round_bytes`` (default: ``max_merge_bytes``) in all, at least one merge: when many
partitions fall due together, the work is committed in several short rounds, so a crash
loses at most one round and the backlog shrinks visibly. The partitions a round left due
merges in are planned by the next round, which runs at once (inline, within the same
commit), not at the next sweep.

**A timer.** Each round notes, per partition it planned, when its next merge by age falls
due (a sweep for every partition). Between commits the thread waits on its condition until
the earliest of those times, then plans the partitions that are due, so a stream that stops
committing still merges by age; :meth:`ParquetCompactor.finish` ends the wait at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from inorder.sinks import compaction
from inorder.sinks.background import BackgroundWork
from inorder.sinks.compaction_levels import DEFAULT_MAX_MERGE_BYTES

#: The most merges one round commits, by default: at 300 tiny merges a round took 27 s on a
#: loaded 2-core machine (docs/benchmarks.md), this is about 3 s of it.
DEFAULT_ROUND_MERGES = 32
#: The timer waits at least this long between its rounds (a due time in the past, a clock
#: that stepped) and at most this long (a clock that stepped back).
TIMER_FLOOR_SECONDS = 1.0
TIMER_CEILING_SECONDS = 300.0


@dataclass
class ParquetCompactor:
    """Runs the level rule's merges of one dataset after its commits."""

    path: str
    storage_options: Mapping[str, str] | None
    target_file_size: int
    grace_seconds: float
    compression: str
    fanout: int
    levels: int
    background: bool
    max_merge_bytes: int = DEFAULT_MAX_MERGE_BYTES
    #: A round plans every partition once this many commits passed since the last such
    #: round (``None``: ``fanout``).
    sweep_every: int | None = None
    #: The most merges, and input bytes (``None``: ``max_merge_bytes``), of one round.
    max_round_merges: int = DEFAULT_ROUND_MERGES
    max_round_bytes: int | None = None
    #: Runs before each merge's commit point: the writer's lease check.
    guard: Callable[[], None] | None = None
    #: The time the age rule is measured at (the timer's clock).
    clock: Callable[[], float] = time.time
    #: Rounds that planned every partition, and rounds that planned the touched ones only;
    #: of all rounds, those that stopped at the bound, and those the timer started.
    sweeps: int = 0
    touched_rounds: int = 0
    bounded_rounds: int = 0
    timed_rounds: int = 0
    _work: BackgroundWork | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _sweep: bool = field(default=True, repr=False)
    _touched: set[str] = field(default_factory=set, repr=False)
    _since_sweep: int = field(default=0, repr=False)
    _due: dict[str, float] = field(default_factory=dict, repr=False)
    _timed: bool = field(default=False, repr=False)

    def after_commit(self, partitions: Collection[str] | None = None) -> None:
        """A batch committed, writing to ``partitions`` (directories; ``None``: unknown, so
        every partition is planned): merge now (inline) or wake the thread (background)."""
        with self._lock:
            self._since_sweep += 1
            if partitions is None or self._since_sweep >= (self.sweep_every or self.fanout):
                self._sweep = True
            else:
                self._touched.update(partitions)
            if self._sweep:
                self._since_sweep = 0
        if not self.background:
            while self.run_round():  # the commit returns merged, one bounded round at a time
                pass
            return
        if self._work is None or self._work.finished:  # a finished run's sink, run again
            with self._lock:  # a new run starts with a sweep, as a new process does
                self._sweep = self._sweep or self._work is not None
            self._work = BackgroundWork(self.run_round, f"inorder-compactor {self.path}", self)
        self._work.wake()

    def run_round(self) -> bool:
        """Merge what the level rule says is due in the partitions touched since the last
        round (every partition when a sweep is due), within the round's bound; ``True`` when
        the bound left due merges for the next round."""
        with self._lock:
            sweep, touched, timed = self._sweep, self._touched, self._timed
            self._sweep, self._touched, self._timed = False, set(), False
        try:
            report = self._compact(dry_run=False, partitions=None if sweep else touched)
        except BaseException:
            with self._lock:  # the partitions it did not finish: all of them, next round
                self._sweep = True
            raise
        with self._lock:
            if sweep:
                self._due = dict(report.due)
            else:
                for partition in touched:
                    self._due.pop(partition, None)
                self._due.update(report.due)
            self._touched.update(report.left)
        self.sweeps += sweep
        self.touched_rounds += not sweep
        self.bounded_rounds += bool(report.left)
        self.timed_rounds += timed
        return bool(report.left)

    def seconds_to_next(self) -> float | None:
        """The timer's wait: until the earliest merge by age falls due (``None``: none
        will without a commit)."""
        with self._lock:
            if not self._due:
                return None
            wait = min(self._due.values()) - self.clock()
        return min(max(wait, TIMER_FLOOR_SECONDS), TIMER_CEILING_SECONDS)

    def due(self) -> bool:
        """Whether merges by age are due now; if so, the next round plans their partitions."""
        now = self.clock()
        with self._lock:
            due = {p for p, when in self._due.items() if when < now}
            if due:
                self._touched.update(due)
                self._timed = True
        return bool(due)

    def plan(self) -> compaction.CompactionReport:
        """What a round over every partition would merge now, without merging (the
        compaction backlog)."""
        return self._compact(dry_run=True, partitions=None)

    def _compact(
        self, dry_run: bool, partitions: Collection[str] | None
    ) -> compaction.CompactionReport:
        return compaction.compact_parquet(  # looked up per call: a benchmark may wrap it
            self.path,
            storage_options=self.storage_options,
            target_file_size=self.target_file_size,
            grace_seconds=self.grace_seconds,
            compression=self.compression,
            fanout=self.fanout,
            levels=self.levels,
            dry_run=dry_run,
            before_commit=self.guard,
            max_merge_bytes=self.max_merge_bytes,
            partitions=partitions,
            now=self.clock(),
            max_round_merges=None if dry_run else self.max_round_merges,
            max_round_bytes=None if dry_run else (self.max_round_bytes or self.max_merge_bytes),
        )

    @property
    def work(self) -> BackgroundWork | None:
        """The background thread's handle (``None`` inline, or before the first commit)."""
        return self._work

    def finish(self, timeout: float | None = None) -> str | None:
        """Finish the pending round and stop the thread; its last error, if any."""
        return None if self._work is None else self._work.finish(timeout)


__all__ = ["ParquetCompactor"]
