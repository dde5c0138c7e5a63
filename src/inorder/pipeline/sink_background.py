"""The run's side of sinks' background work (compactor threads): fenced, then finished.

Work a sink does beside the stream commits to the output too, so it is fenced by the same
lease as the batch commits; and a run finishes it before giving the lease up, so the next
driver never finds a merge of the previous one still running.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from inorder.checkpoint.lease import CheckpointLease
from inorder.sinks.base import Sink


def guard_sinks(sinks: Sequence[Sink], lease: CheckpointLease) -> None:
    """Check ``lease`` before every commit the sinks make beside the stream."""
    for sink in sinks:
        sink.guard_background(lambda: lease.check())


def finish_sinks(sinks: Sequence[Sink], warn: Callable[[str], None]) -> None:
    """Finish the sinks' background work; ``warn`` gets one line per sink whose last round
    failed (its output is whole, only not merged)."""
    for sink in sinks:
        error = sink.finish_background()
        if error is not None:
            warn(
                f"inorder: warning: compacting {sink.describe()} failed, the output is whole "
                f"but not merged (run `inorder compact` to retry): {error}"
            )


__all__ = ["finish_sinks", "guard_sinks"]
