"""Micro-batch sizes that follow a time target while a backlog lasts (pure; no I/O).

Each micro-batch pays a fixed cost (planning, a Spark job, state opens, a commit), so a backlog
read in small batches spends much of its time on those. ``maxOffsetsPerTrigger`` is a fixed
record count: too small for a backlog, or too large for a slow pipeline. With a target duration
(``inorder.targetBatchDuration``) the source sizes each batch from the rate the previous full
batches achieved: records per second x the target, starting at :data:`FIRST_BATCH` records and
changing by at most :data:`STEP` times per batch. Only batches that were full (as large as the
limit they were given) teach the rate: a batch cut short because the pipeline caught up says
how much data there was, not how fast it is processed. ``maxOffsetsPerTrigger`` stays a hard
cap (whatever the target says, a batch never plans more), and ``minOffsetsPerTrigger`` /
trigger intervals still decide when a batch starts once caught up.

The rate is measured on the planning side, in the long-lived process Spark keeps for the
source: the time from one plan to the next is the previous batch's run (batches follow each
other back to back while there is a backlog). After a restart it starts again from
:data:`FIRST_BATCH`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Records of the first sized batch (and after a restart).
FIRST_BATCH = 100_000
#: The smallest batch the sizing asks for.
SMALLEST_BATCH = 1_000
#: The most a batch's limit grows or shrinks against the previous one.
STEP = 4.0


@dataclass
class BatchSizer:
    """The record limit of each next micro-batch for a ``target_seconds`` duration."""

    target_seconds: float
    current: int = FIRST_BATCH
    _last: tuple[float, int, bool] | None = field(default=None, repr=False)

    def limit(self, now: float) -> int:
        """The record limit of the batch planned at ``now`` (monotonic seconds).

        The caller applies ``maxOffsetsPerTrigger`` on top (the smaller of the two wins).
        """
        if self._last is not None:
            planned_at, records, full = self._last
            elapsed = now - planned_at
            if full and records > 0 and elapsed > 0:
                wanted = records / elapsed * self.target_seconds
                low, high = self.current / STEP, self.current * STEP
                self.current = int(min(max(wanted, low, SMALLEST_BATCH), high))
            self._last = None
        return self.current

    def planned(self, records: int, limit: int, now: float) -> None:
        """Record what the batch planned at ``now`` holds (``limit``: what it was allowed)."""
        if records > 0:
            self._last = (now, records, records >= limit)
