"""Human durations in settings: "15 minutes", "1 hour", "30s", "500 ms"."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {
    "ms": 0.001,
    "millisecond": 0.001,
    "milliseconds": 0.001,
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")


def parse_duration(text: str) -> timedelta:
    """Parse ``"<number> <unit>"``; raise ``ValueError`` naming the accepted units."""
    match = _PATTERN.match(text.lower())
    if not match or match.group(2) not in _UNITS:
        raise ValueError(
            f"invalid duration {text!r}: expected e.g. '500 ms', '30 seconds', '15 minutes', "
            "'1 hour', '2 days'"
        )
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def format_duration(value: timedelta) -> str:
    """Inverse of :func:`parse_duration` for display ("90 seconds")."""
    seconds = value.total_seconds()
    if seconds and seconds < 1:
        return f"{round(seconds * 1000)} ms"
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} seconds"
