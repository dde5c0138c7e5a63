"""Running a pipeline with observers from Python (notifications, metrics).

The observer interface itself lives with the runner (:mod:`inorder.pipeline.observer`); its
names are re-exported here, where earlier releases defined them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from inorder.pipeline.observer import RunObserver, SafeObservers
from inorder.pipeline.progress import BatchProgress, RunningBatch

__all__ = ["ObservingReporter", "RunObserver", "SafeObservers", "run_observed"]


class ObservingReporter:
    """A progress reporter that also feeds observers (wraps the pipeline's own reporter).

    Lets observers watch a run through ``PipelineRunner(pipeline, reporter=...)`` without
    changes to the runner; per-partition lag is not known at this level (``None`` is passed,
    the batch's total lag is in ``progress.lag``).
    """

    def __init__(self, inner: Any, observers: SafeObservers) -> None:
        self.inner = inner
        self.observers = observers

    def batch(self, progress: BatchProgress) -> None:
        """Forward the batch to the reporter and the observers."""
        self.inner.batch(progress)
        self.observers.on_batch(progress, None)

    def info(self, text: str) -> None:
        """Forward a note."""
        self.inner.info(text)

    def running(self, status: RunningBatch) -> None:
        """Forward a running batch's status (when the reporter shows one)."""
        show = getattr(self.inner, "running", None)  # reporters written before it existed
        if show is not None:
            show(status)

    def summary(self, summary: Any) -> None:
        """Forward the summary."""
        self.inner.summary(summary)


def run_observed(pipeline: Any, observers: Iterable[RunObserver], **runner_options: Any) -> Any:
    """Run ``pipeline`` with observers: start, every batch, failure, stop. Returns the summary."""
    from inorder.pipeline.progress import make_reporter
    from inorder.pipeline.runner import PipelineRunner

    safe = SafeObservers(observers)
    reporter = ObservingReporter(make_reporter(pipeline.progress), safe)
    safe.on_start()
    try:
        return PipelineRunner(pipeline, reporter=reporter, **runner_options).run()
    except BaseException as exc:
        safe.on_failure(exc)
        raise
    finally:
        safe.on_stop()
