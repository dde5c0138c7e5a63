"""The observer interface a running pipeline reports to (notifications, metrics).

An observer must never disturb the job: every method returns quickly (slow work goes to a
background thread) and swallows its own errors. :class:`SafeObservers` enforces the second
rule for any observer handed to it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from inorder.pipeline.progress import BatchProgress

log = logging.getLogger(__name__)


class RunObserver(Protocol):
    """Lifecycle callbacks of one pipeline run."""

    def on_start(self) -> None:
        """The query is about to start."""
        ...

    def on_batch(self, progress: BatchProgress, lag_by_partition: dict[str, int] | None) -> None:
        """A micro-batch finished (``lag_by_partition``: ``"topic[p]" -> records behind``)."""
        ...

    def on_failure(self, error: BaseException) -> None:
        """The query failed with ``error``."""
        ...

    def on_stop(self) -> None:
        """The run ended (after a failure too); release threads and ports."""
        ...


class SafeObservers:
    """Fans callbacks out to several observers; an observer that raises is logged, not fatal."""

    def __init__(self, observers: Iterable[RunObserver]) -> None:
        self.observers = list(observers)

    def _each(self, name: str, *args: object) -> None:
        for observer in self.observers:
            try:
                getattr(observer, name)(*args)
            except Exception as exc:  # an observer must never kill the job
                log.warning("%s.%s failed: %s", type(observer).__name__, name, exc)

    def on_start(self) -> None:
        """Forward ``on_start``."""
        self._each("on_start")

    def on_batch(self, progress: BatchProgress, lag_by_partition: dict[str, int] | None) -> None:
        """Forward ``on_batch``."""
        self._each("on_batch", progress, lag_by_partition)

    def on_failure(self, error: BaseException) -> None:
        """Forward ``on_failure``."""
        self._each("on_failure", error)

    def on_stop(self) -> None:
        """Forward ``on_stop``."""
        self._each("on_stop")


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
