"""validate's progress line: records checked, rate and ETA on a terminal, nothing elsewhere."""

from __future__ import annotations

import io

from inorder.ops.validate_progress import ProgressLine


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_line_names_records_rate_and_eta() -> None:
    now = [0.0]
    out = _Terminal()
    line = ProgressLine(out, every=1.0, clock=lambda: now[0])
    line.plan(1_000)
    line.plan(-5)  # an empty range plans nothing
    now[0] = 2.0
    line.advance(200, "site-a[0]")
    assert out.getvalue() == "\rvalidate: 200 of 1,000 records checked, 100/s, ETA 0:08 (site-a[0])"
    line.close()
    assert out.getvalue().endswith("\r")


def test_redrawn_at_most_once_per_interval() -> None:
    now = [0.0]
    out = _Terminal()
    line = ProgressLine(out, every=1.0, clock=lambda: now[0])
    line.plan(100)
    now[0] = 0.5
    line.advance(10, "t[0]")
    assert out.getvalue() == ""
    now[0] = 1.5
    line.advance(10, "t[0]")
    assert out.getvalue().count("\r") == 1


def test_quiet_when_not_a_terminal() -> None:
    out = io.StringIO()
    line = ProgressLine(out, every=0.0)
    line.plan(10)
    line.advance(10, "t[0]")
    line.show("validate: checking the session tables against the change log")
    line.close()
    assert out.getvalue() == ""
