"""Failure notifications: query failure, stalls and integrity violations, to a webhook or command.

:class:`Notifier` is a :class:`~inorder.pipeline.observer.RunObserver`. Events are queued and
delivered by one background thread, with retries and exponential backoff; a notifier that
cannot deliver logs a warning and drops the event after its retries: it never raises into
the job and never blocks a micro-batch.

Events (JSON object, POSTed as ``application/json`` and/or written to the command's stdin)::

    {"event": "failure" | "stall" | "violations", "pipeline": "...", "time": "ISO 8601 UTC",
     "message": "one line", ...details}

* ``failure``: the query stopped with an error (``error`` = the one-line message).
* ``stall``: no micro-batch processed any record for ``stall_after`` while the last known lag
  was above zero (``lag``, ``idle_seconds``). Sent once per stall; re-armed by progress.
* ``violations``: a micro-batch counted at least ``violation_threshold`` integrity events
  (``batch_id``, ``violations`` by rule, ``violations_by_partition``, ``total``).

The command runs without a shell (``command`` is an argument list, or a string split like a
shell would), with ``INORDER_EVENT`` set to the event name and the JSON on stdin.
Error messages are inorder's own one-line messages, which never carry credentials.
"""

from __future__ import annotations

import json
import logging
import queue
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from inorder.pipeline.progress import BatchProgress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NotifySettings:
    """Where notifications go and when they are sent."""

    webhook_url: str | None = None
    command: Sequence[str] | str | None = None
    stall_after: timedelta = timedelta(minutes=30)
    violation_threshold: int = 1
    retries: int = 5
    backoff_seconds: float = 1.0
    max_backoff_seconds: float = 60.0
    timeout_seconds: float = 10.0
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> NotifySettings:
        """Settings from a ``[notify]`` table (see docs/operations.md for the keys)."""
        from inorder.durations import parse_duration

        stall = section.get("stall_after", "30 minutes")
        return cls(
            webhook_url=section.get("webhook_url") or None,
            command=section.get("command") or None,
            stall_after=parse_duration(stall)
            if isinstance(stall, str)
            else timedelta(seconds=stall),
            violation_threshold=int(section.get("violation_threshold", 1)),
            retries=int(section.get("retries", 5)),
            backoff_seconds=float(section.get("backoff_seconds", 1.0)),
            timeout_seconds=float(section.get("timeout_seconds", 10.0)),
            headers=dict(section.get("headers", {})),
        )


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


_STOP = object()


class Notifier:
    """Sends failure, stall and violation events (see the module docs)."""

    def __init__(self, settings: NotifySettings, pipeline: str = "inorder") -> None:
        self.settings = settings
        self.pipeline = pipeline
        self._queue: queue.Queue[Any] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._stopping = threading.Event()
        self._last_progress = time.monotonic()
        self._lag: int | None = None
        self._stalled = False
        self._lock = threading.Lock()
        #: Events delivered / dropped after retries (for tests and metrics).
        self.delivered = 0
        self.dropped = 0

    # -- observer interface ------------------------------------------------------------------

    def on_start(self) -> None:
        """Start the delivery thread and the stall watchdog."""
        if self._worker is not None:
            return
        self._stopping.clear()
        self._last_progress = time.monotonic()
        self._worker = threading.Thread(
            target=self._deliver_loop, name="inorder-notify", daemon=True
        )
        self._worker.start()
        self._watchdog = threading.Thread(target=self._watch, name="inorder-stall", daemon=True)
        self._watchdog.start()

    def on_batch(self, progress: BatchProgress, lag_by_partition: dict[str, int] | None) -> None:
        """Track progress and lag; report violations over the threshold."""
        with self._lock:
            if lag_by_partition is not None:
                self._lag = sum(lag_by_partition.values())
            elif progress.lag is not None:
                self._lag = progress.lag
            if progress.records > 0:
                self._last_progress = time.monotonic()
                self._stalled = False
        total = sum(progress.violations.values())
        if total >= self.settings.violation_threshold > 0:
            self.send(
                "violations",
                f"batch {progress.batch_id}: {total} integrity event(s) "
                + ", ".join(f"{r}={n}" for r, n in sorted(progress.violations.items())),
                batch_id=progress.batch_id,
                violations=dict(progress.violations),
                violations_by_partition={
                    tp: dict(counts) for tp, counts in progress.violations_by_partition.items()
                },
                total=total,
            )

    def on_failure(self, error: BaseException) -> None:
        """Report the query's failure."""
        text = str(error).strip().splitlines()
        message = text[0] if text else type(error).__name__
        self.send("failure", f"pipeline {self.pipeline!r} failed: {message}", error=message)

    def on_stop(self) -> None:
        """Deliver what is queued (bounded wait), then stop the threads."""
        self._stopping.set()
        worker = self._worker
        if worker is not None:
            self._queue.put(_STOP)
            s = self.settings
            worker.join(timeout=s.timeout_seconds * (s.retries + 1) + 5)
        self._worker = None
        self._watchdog = None

    # -- events ------------------------------------------------------------------------------

    def send(self, event: str, message: str, **details: Any) -> None:
        """Queue an event for delivery (never blocks, never raises)."""
        payload = {
            "event": event,
            "pipeline": self.pipeline,
            "time": _now_iso(),
            "message": message,
            **details,
        }
        try:
            self._queue.put_nowait(payload)
        except Exception as exc:  # pragma: no cover - an unbounded queue does not refuse
            log.warning("notification dropped: %s", exc)
        if self._worker is None:
            self.on_start()

    def _watch(self) -> None:
        stall = self.settings.stall_after.total_seconds()
        step = max(0.05, min(5.0, stall / 4))
        while not self._stopping.wait(step):
            with self._lock:
                idle = time.monotonic() - self._last_progress
                lag = self._lag
                due = not self._stalled and lag is not None and lag > 0 and idle >= stall
                if due:
                    self._stalled = True
            if due:
                self.send(
                    "stall",
                    f"pipeline {self.pipeline!r} made no progress for {idle:.0f} s "
                    f"with {lag} record(s) waiting",
                    lag=lag,
                    idle_seconds=round(idle, 1),
                )

    def _deliver_loop(self) -> None:
        while True:
            payload = self._queue.get()
            if payload is _STOP:
                return
            try:
                self._deliver(payload)
            except Exception as exc:  # never let the thread die
                log.warning("notification failed: %s", exc)

    def _deliver(self, payload: dict[str, Any]) -> None:
        s = self.settings
        body = json.dumps(payload, sort_keys=True, default=str).encode()
        targets: list[tuple[str, Any]] = []
        if s.webhook_url:
            targets.append(("webhook", self._post))
        if s.command:
            targets.append(("command", self._run))
        for name, deliver in targets:
            delay = s.backoff_seconds
            for attempt in range(s.retries + 1):
                try:
                    deliver(body, payload["event"])
                    self.delivered += 1
                    break
                except Exception as exc:
                    if attempt == s.retries:
                        self.dropped += 1
                        log.warning(
                            "%s notification %r dropped after %d attempt(s): %s",
                            name,
                            payload["event"],
                            attempt + 1,
                            exc,
                        )
                        break
                    # Shorten the wait when stopping: the job is ending, do not hold it long.
                    if self._stopping.is_set():
                        delay = min(delay, 0.5)
                    time.sleep(delay)
                    delay = min(delay * 2, s.max_backoff_seconds)

    def _post(self, body: bytes, event: str) -> None:
        assert self.settings.webhook_url is not None
        request = urllib.request.Request(
            self.settings.webhook_url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", **self.settings.headers},
        )
        with urllib.request.urlopen(request, timeout=self.settings.timeout_seconds) as response:
            status = int(response.status)
        if not 200 <= status < 300:
            raise OSError(f"webhook answered HTTP {status}")

    def _run(self, body: bytes, event: str) -> None:
        import os

        command = self.settings.command
        argv = shlex.split(command) if isinstance(command, str) else list(command or [])
        done = subprocess.run(
            argv,
            input=body,
            capture_output=True,
            timeout=self.settings.timeout_seconds,
            env={**os.environ, "INORDER_EVENT": event},
            check=False,
        )
        if done.returncode != 0:
            raise OSError(f"command exited with status {done.returncode}")
