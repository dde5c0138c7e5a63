"""A sink's housekeeping off the batch's critical path: one driver thread per sink.

The batch commit makes rows readable; merging small files only changes how they are stored
later, so it need not hold the next batch up. :class:`BackgroundWork` runs one round of that
work (``run_round``) in a daemon thread each time it is woken: wake-ups that arrive while a
round runs coalesce into one more round, so a commit never waits and the rounds never queue
up. A round's failure is logged and kept (the next wake-up tries again): a compaction that
lost a race, an object store that is down for a while or a lease found taken (the commit
check raises before the merge's commit point) costs a round, never a row, because each merge
commits atomically or not at all. :meth:`BackgroundWork.finish` runs what is pending and
stops, so a run that ends leaves the output as compacted as the inline mode would.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class BackgroundWork:
    """Rounds of ``run_round`` in one daemon thread, woken by :meth:`wake`."""

    def __init__(self, run_round: Callable[[], object], name: str) -> None:
        self._run_round = run_round
        self._name = name
        self._cond = threading.Condition()
        self._pending = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: Rounds finished (failed ones included): what tests and progress wait on.
        self.rounds = 0
        #: The last failed round's error, in one line (``None`` once a round succeeds).
        self.last_error: str | None = None

    def wake(self) -> None:
        """Ask for one more round (returns at once; starts the thread on first use)."""
        with self._cond:
            if self._stopping:
                return
            self._pending = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` was called (a finished one never runs another round)."""
        with self._cond:
            return self._stopping

    def wait_rounds(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` rounds have finished; ``False`` on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.rounds >= count, timeout)

    def finish(self, timeout: float | None = None) -> str | None:
        """Run the pending round (if any), stop the thread; the last round's error, if any."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.last_error

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopping)
                if not self._pending:
                    return  # stopping, nothing left to do
                self._pending = False
            try:
                self._run_round()
                error = None
            except Exception as exc:  # kept and logged: the stream goes on
                error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                log.warning(
                    "%s: round failed (tried again at the next commit): %s", self._name, error
                )
            with self._cond:
                self.last_error = error
                self.rounds += 1
                self._cond.notify_all()


__all__ = ["BackgroundWork"]
