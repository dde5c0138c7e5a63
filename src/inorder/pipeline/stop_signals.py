"""SIGINT and SIGTERM during a run: the first stops after the current batch, a second forces.

A forced stop is safe (the next start re-runs the unfinished batch and writes its output
once); the line printed says which batch that is, so the re-run is expected.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType


def install_stop_signals(
    stop: Callable[[], None],
    stopping: Callable[[], bool],
    running_batch: Callable[[], int | None],
    info: Callable[[str], None],
) -> Callable[[], None]:
    """Handle SIGINT and SIGTERM until the returned function restores the previous handlers.

    ``stop`` asks the run to stop between batches, ``stopping`` tells whether it was asked,
    ``running_batch`` names the batch running now (``None``: none), ``info`` prints a line.
    Outside the main thread (where Python cannot handle signals) nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def request_stop(signum: int, frame: FrameType | None) -> None:
        if not stopping():
            # Stop first, then say so: a second signal arriving while the note is printed
            # runs this handler again inside this one, and must find the stop requested.
            stop()
            info(
                f"inorder: {signal.Signals(signum).name} received: stopping after the "
                "current batch (again to force)"
            )
            return
        # Say what the forced stop costs, so that the next start's re-run is expected.
        batch = running_batch()
        if batch is None:
            lost = "no batch was running: nothing is lost"
        else:
            lost = (
                f"batch {batch} did not finish and will be re-run by the next start "
                "(its output is still written once)"
            )
        info(f"inorder: forced stop: {lost}")
        # py4j logs the JVM call this interrupts with a traceback: noise after the line
        # above. Logging comes back in restore(), for a caller that carries on.
        logging.disable(logging.CRITICAL)
        raise KeyboardInterrupt

    logging_disabled = logging.root.manager.disable
    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logging.disable(logging_disabled)

    return restore
