"""When a Parquet sink's merges run: after each commit, in a driver thread or inline.

By default (``compact_in_background``) the commit only wakes a :class:`BackgroundWork`
thread and returns, so batch time does not depend on compaction (docs/small-files.md, "Off
the critical path"). Merges are safe beside batch commits in any order: batch manifests and
compaction records are separate sequences, and a merge takes only files of batches that are
done. Inline, the commit merges before it returns (the previous behaviour).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from inorder.sinks import compaction
from inorder.sinks.background import BackgroundWork


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
    #: Runs before each merge's commit point: the writer's lease check.
    guard: Callable[[], None] | None = None
    _work: BackgroundWork | None = field(default=None, repr=False)

    def after_commit(self) -> None:
        """A batch committed: merge now (inline) or wake the thread (background)."""
        if not self.background:
            self.run_round()
            return
        if self._work is None or self._work.finished:  # a finished run's sink, run again
            self._work = BackgroundWork(self.run_round, f"inorder-compactor {self.path}")
        self._work.wake()

    def run_round(self) -> None:
        """Merge what the level rule says is due, as of now."""
        self._compact(dry_run=False)

    def plan(self) -> compaction.CompactionReport:
        """What a round would merge now, without merging (the compaction backlog)."""
        return self._compact(dry_run=True)

    def _compact(self, dry_run: bool) -> compaction.CompactionReport:
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
        )

    @property
    def work(self) -> BackgroundWork | None:
        """The background thread's handle (``None`` inline, or before the first commit)."""
        return self._work

    def finish(self, timeout: float | None = None) -> str | None:
        """Finish the pending round and stop the thread; its last error, if any."""
        return None if self._work is None else self._work.finish(timeout)


__all__ = ["ParquetCompactor"]
