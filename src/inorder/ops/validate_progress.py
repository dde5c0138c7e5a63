"""A live progress line for ``inorder validate`` on a terminal: records checked, rate, ETA.

Written to standard error and redrawn in place at most once a second; nothing is written
when standard error is not a terminal (the report on standard output stays the only output).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class ProgressLine:
    """Counts records checked against a planned total and redraws one status line."""

    def __init__(
        self,
        stream: TextIO | None = None,
        every: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every, self.clock = every, clock
        self.started = clock()
        self.shown = self.started
        self.planned = 0
        self.done = 0
        self.width = 0

    def plan(self, records: int) -> None:
        """Add ``records`` to the total to check (an upper bound: offsets, not records)."""
        self.planned += max(records, 0)

    def advance(self, records: int, where: str) -> None:
        """``records`` more were checked, in ``where`` (a topic-partition)."""
        self.done += records
        now = self.clock()
        if now - self.shown >= self.every:
            self.shown = now
            self.show(self.text(now, where))

    def text(self, now: float, where: str) -> str:
        """The status line: records checked of planned, rate, ETA."""
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        line = f"validate: {self.done:,} of {self.planned:,} records checked, {rate:,.0f}/s"
        if rate > 0 and self.planned > self.done:
            left = int((self.planned - self.done) / rate)
            line += f", ETA {left // 60}:{left % 60:02d}"
        return f"{line} ({where})"

    def show(self, line: str) -> None:
        """Redraw the status line (terminals only)."""
        if not self.live:
            return
        pad = " " * max(self.width - len(line), 0)
        self.stream.write("\r" + line + pad)
        self.stream.flush()
        self.width = len(line)

    def close(self) -> None:
        """Erase the status line."""
        if self.live and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0
