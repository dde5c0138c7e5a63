"""The observer interface a running pipeline reports to (notifications, metrics).

An observer must never disturb the job: every method returns quickly (slow work goes to a
background thread) and swallows its own errors. :class:`SafeObservers` enforces the second
rule for any observer handed to it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

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
