"""The background thread of a sink: bounded rounds continue at once, a timer starts rounds
between wake-ups, and finishing ends a timer's wait at once."""

from __future__ import annotations

import threading

from inorder.sinks.background import BackgroundWork

GUARD = 30.0  # a bound on waiting for a round, never an expectation of how long it takes


class CountingTimer:
    """A timer with a short wait that says a round is due ``rounds`` times."""

    def __init__(self, wait: float | None, rounds: int) -> None:
        self.wait = wait
        self.rounds = rounds
        self.asked = 0

    def seconds_to_next(self) -> float | None:
        return self.wait

    def due(self) -> bool:
        self.asked += 1
        if self.rounds:
            self.rounds -= 1
            return True
        return False


def test_a_round_that_asks_for_more_runs_again_without_a_wake_up() -> None:
    left = [3]

    def bounded() -> bool:
        left[0] -= 1
        return left[0] > 0

    work = BackgroundWork(bounded, "test")
    work.wake()
    assert work.wait_rounds(3, GUARD)
    assert left == [0]
    assert work.finish(GUARD) is None and not work.running
    assert work.rounds == 3


def test_the_timer_starts_a_round_when_its_wait_ends() -> None:
    timer = CountingTimer(0.01, rounds=1)
    work = BackgroundWork(lambda: None, "test", timer)
    work.wake()
    assert work.wait_rounds(2, GUARD)  # the wake-up's round, then the timer's
    work.finish(GUARD)
    assert work.rounds == 2 and timer.asked >= 1 and not work.running


def test_tick_asks_the_timer_at_once_and_nothing_runs_when_nothing_is_due() -> None:
    timer = CountingTimer(None, rounds=0)  # no timeout: only a tick ends the wait
    ran = threading.Event()
    work = BackgroundWork(ran.set, "test", timer)
    work.wake()
    assert work.wait_rounds(1, GUARD)
    timer.rounds = 1
    work.tick()
    assert work.wait_rounds(2, GUARD)
    work.tick()  # nothing due: asked, no round
    work.finish(GUARD)
    assert work.rounds == 2 and timer.asked >= 1


def test_finish_ends_a_long_timer_wait() -> None:
    """The timer would wait an hour: finishing wakes the thread, which stops (the join's
    timeout is a guard; the test fails if the thread is still waiting)."""
    timer = CountingTimer(3600.0, rounds=0)
    work = BackgroundWork(lambda: None, "test", timer)
    work.wake()
    assert work.wait_rounds(1, GUARD)
    work.finish(GUARD)
    assert not work.running
