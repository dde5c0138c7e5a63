"""Small helpers shared by the operations commands."""

from __future__ import annotations

from datetime import UTC, datetime

from inorder.errors import ConfigError


def parse_time_ms(text: str, option: str) -> int:
    """An instant as epoch milliseconds: ISO 8601 (UTC when no zone) or epoch seconds."""
    raw = text.strip()
    try:
        number = float(raw)
    except ValueError:
        pass
    else:
        # Treat large numbers as milliseconds (seconds since 1970 stay below 1e11 until 5138).
        return int(number if number > 1e11 else number * 1000)
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{option}: expected an ISO 8601 time (2024-05-01T12:00:00Z) or epoch seconds, "
            f"not {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)
