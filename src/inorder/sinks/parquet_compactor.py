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
shortest age window is ``fanout`` triggers, so a quiet partition's merge by age is at most
about one window late.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from inorder.sinks import compaction
from inorder.sinks.background import BackgroundWork
from inorder.sinks.compaction_levels import DEFAULT_MAX_MERGE_BYTES


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
    #: Runs before each merge's commit point: the writer's lease check.
    guard: Callable[[], None] | None = None
    #: Rounds that planned every partition, and rounds that planned the touched ones only.
    sweeps: int = 0
    touched_rounds: int = 0
    _work: BackgroundWork | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _sweep: bool = field(default=True, repr=False)
    _touched: set[str] = field(default_factory=set, repr=False)
    _since_sweep: int = field(default=0, repr=False)

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
            self.run_round()
            return
        if self._work is None or self._work.finished:  # a finished run's sink, run again
            with self._lock:  # a new run starts with a sweep, as a new process does
                self._sweep = self._sweep or self._work is not None
            self._work = BackgroundWork(self.run_round, f"inorder-compactor {self.path}")
        self._work.wake()

    def run_round(self) -> None:
        """Merge what the level rule says is due in the partitions touched since the last
        round (every partition when a sweep is due)."""
        with self._lock:
            sweep, touched = self._sweep, self._touched
            self._sweep, self._touched = False, set()
        try:
            self._compact(dry_run=False, partitions=None if sweep else touched)
        except BaseException:
            with self._lock:  # the partitions it did not finish: all of them, next round
                self._sweep = True
            raise
        if sweep:
            self.sweeps += 1
        else:
            self.touched_rounds += 1

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
        )

    @property
    def work(self) -> BackgroundWork | None:
        """The background thread's handle (``None`` inline, or before the first commit)."""
        return self._work

    def finish(self, timeout: float | None = None) -> str | None:
        """Finish the pending round and stop the thread; its last error, if any."""
        return None if self._work is None else self._work.finish(timeout)


__all__ = ["ParquetCompactor"]
