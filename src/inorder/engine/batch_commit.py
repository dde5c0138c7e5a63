"""A micro-batch's commit, in the order that makes it exactly once.

Both backends end a batch here, on the driver, once its tasks have staged their output and
written their state. :meth:`BatchCommit.commit` runs the steps up to the commit point:

1. **Check**: a task that failed raises its error; ``fail``-policy rejections raise
   :class:`~inorder.errors.IntegrityError`. Nothing is committed.
2. **Fence**: :attr:`BatchCommit.fence` (the checkpoint lease's check) raises in a driver that
   lost the checkpoint to another one, so a fenced driver commits nothing.
3. **Dead letters**: the dead-letter sink commits the batch's set-aside records first, so a
   batch committed in the output never lacks its dead letters.
4. **Sink**: the output's commit, with the offsets consumed per topic-partition. This is the
   batch's commit point: a re-run of a batch committed here commits nothing again.

:meth:`BatchCommit.after_commit` then runs step 5:

5. **After-commit hooks** (the session materializer, the session tables): outputs derived
   from committed change rows. Fenced again, since they commit too, and run also for a re-run
   batch whose commit was already made, because a crash may have come between the commit
   point and them: each hook is idempotent per batch and catches up what it missed.

Spark's own commit log follows when the batch function returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inorder.engine.batch_report import BatchReport, summarize
from inorder.engine.reference import raise_failure
from inorder.engine.rejections import check_rejections
from inorder.engine.results import TaskResult
from inorder.integrity import Integrity
from inorder.sinks.base import ConsumedOffsets, Sink


@dataclass(frozen=True, slots=True)
class AfterCommit:
    """An output derived from the committed change rows, brought to each committed batch."""

    #: The name its seconds go under in :attr:`BatchReport.phase_seconds` and in the live
    #: progress while it runs.
    phase: str
    #: Brings the output to the batch (checkpoint batch id); idempotent per batch.
    run: Callable[[int], object]


class BatchCommit:
    """Commits one micro-batch's staged output in numbered steps (see the module docs)."""

    def __init__(self, sink: Sink, dead_letter_sink: Sink | None, integrity: Integrity) -> None:
        self.sink = sink
        self.dead_letter_sink = dead_letter_sink
        self.integrity = integrity
        #: Called with the batch id before anything commits (the runner's lease check: a
        #: driver that lost the checkpoint's lease raises there and commits nothing).
        self.fence: Callable[[int], None] | None = None
        #: Step 5, in order.
        self.hooks: Sequence[AfterCommit] = ()
        #: Told the phase a hook is in (``None`` when the hooks are done): live progress.
        self.on_phase: Callable[[str | None], None] | None = None

    def commit(self, batch_id: int, results: list[TaskResult]) -> BatchReport:
        """Steps 1-4: check the task results, fence, commit dead letters, then the sink."""
        failures = [r.failed for r in results if r.failed is not None]
        if failures:
            raise_failure(failures)
        check_rejections(batch_id, results, self.integrity)
        report = summarize(batch_id, results)
        files = [f for r in results for f in r.written_files()]
        dl_files = [f for r in results for f in r.written_dead_letter_files()]
        if self.fence is not None:
            self.fence(batch_id)
        if self.dead_letter_sink is not None:
            self.dead_letter_sink.commit(batch_id, dl_files)
        consumed = [
            ConsumedOffsets(r.topic, r.partition, r.first_offset, r.last_offset) for r in results
        ]
        report.committed = self.sink.commit_consumed(batch_id, files, consumed)
        report.output_files = len(files)
        return report

    def after_commit(self, report: BatchReport) -> None:
        """Step 5: the hooks, fenced, for the batch of ``report`` (committed now or before).

        Each hook's seconds are added to the report's ``phase_seconds`` under its phase.
        """
        if not self.hooks:
            return
        if self.fence is not None:
            self.fence(report.batch_id)
        try:
            for hook in self.hooks:
                if self.on_phase is not None:
                    self.on_phase(hook.phase)
                started = time.perf_counter()
                hook.run(report.batch_id)
                seconds = time.perf_counter() - started
                report.phase_seconds[hook.phase] = report.phase_seconds.get(hook.phase, 0) + seconds
        finally:
            if self.on_phase is not None:
                self.on_phase(None)
