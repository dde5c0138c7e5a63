"""A sink's housekeeping off the batch's critical path: one driver thread per sink.

The batch commit makes rows readable; merging small files only changes how they are stored
later, so it need not hold the next batch up. :class:`BackgroundWork` runs one round of that
work (``run_round``) in a daemon thread each time it is woken: wake-ups that arrive while a
round runs coalesce into one more round, so a commit never waits and the rounds never queue
up. A round that returns ``True`` did a bounded part of its work and asks for the next
round at once. Between wake-ups a :class:`Timer` may ask for a round too (work that falls due
with time, not with commits): the thread waits on its condition with the timer's timeout, so
:meth:`BackgroundWork.finish` ends the wait at once, never after a sleep. A round's failure
is logged and kept (the next wake-up tries again): a compaction that lost a race, an object
store that is down for a while or a lease found taken (the commit check raises before the
merge's commit point) costs a round, never a row, because each merge commits atomically or
not at all. :meth:`BackgroundWork.finish` runs what is pending (the rest of a bounded round's
work included) and stops, so a run that ends leaves the output as compacted as the inline
mode would.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)


class Timer(Protocol):
    """What wakes the thread between commits."""

    def seconds_to_next(self) -> float | None:
        """How long to wait for a wake-up before asking :meth:`due` (``None``: no limit)."""

    def due(self) -> bool:
        """Whether a round is due now (asked when the wait ends without a wake-up)."""


class BackgroundWork:
    """Rounds of ``run_round`` in one daemon thread, woken by :meth:`wake` (and by
    ``timer``); a round returning ``True`` asks for the next one at once."""

    def __init__(
        self, run_round: Callable[[], object], name: str, timer: Timer | None = None
    ) -> None:
        self._run_round = run_round
        self._name = name
        self._timer = timer
        self._cond = threading.Condition()
        self._pending = False
        self._ticked = False
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

    def tick(self) -> None:
        """End the current wait as the timer would (returns at once): the timer is asked
        whether a round is due. What a timer's timeout does, without waiting for it."""
        with self._cond:
            self._ticked = True
            self._cond.notify_all()

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` was called (a finished one never runs another round)."""
        with self._cond:
            return self._stopping

    @property
    def running(self) -> bool:
        """Whether the thread is alive (started and not stopped)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

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

    def _idle(self) -> None:
        """Wait (holding the condition) until a round is pending or the work stops."""
        while not (self._pending or self._stopping):
            if not self._ticked:
                timeout = None if self._timer is None else self._timer.seconds_to_next()
                if self._cond.wait(timeout) and not self._ticked:
                    continue  # woken: pending or stopping, checked above
            self._ticked = False
            if self._timer is not None and self._timer.due():
                self._pending = True

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._idle()
                if not self._pending:
                    return  # stopping, nothing left to do
                self._pending = False
            more = False
            try:
                more = self._run_round() is True
                error = None
            except Exception as exc:  # kept and logged: the stream goes on
                error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                log.warning(
                    "%s: round failed (tried again at the next commit): %s", self._name, error
                )
            with self._cond:
                self.last_error = error
                self.rounds += 1
                self._pending = self._pending or more
                self._cond.notify_all()


__all__ = ["BackgroundWork", "Timer"]
