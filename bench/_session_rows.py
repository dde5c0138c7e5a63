"""What the bench's session-job contenders share (no PySpark: Quix's virtualenv imports it too).

The change rows every contender writes (``CHANGE_COLUMNS``, :func:`change_schema`) and the
part of inorder's ``Context`` the session processor uses (:class:`SessionContext`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

#: Columns of the change rows, in the order every contender writes them.
CHANGE_COLUMNS = (
    "topic",
    "partition",
    "offset",
    "kafka_ts",
    "session",
    "seq",
    "op",
    "row_id",
    "row",
)


def change_schema() -> Any:
    """The change rows' Arrow schema."""
    import pyarrow as pa

    types = (
        pa.string(),
        pa.int32(),
        pa.int64(),
        pa.timestamp("us", tz="UTC"),
        pa.string(),
        pa.int64(),
        pa.string(),
        pa.string(),
        pa.string(),
    )
    return pa.schema(list(zip(CHANGE_COLUMNS, types, strict=True)))


class SessionContext:
    """The part of inorder's Context the session processor uses (no timers in these jobs)."""

    __slots__ = ("timestamp",)

    def __init__(self) -> None:
        self.timestamp: datetime | None = None

    def set_timeout(self, *args: Any) -> None:
        """Timers are not part of these jobs."""

    def clear_timeout(self) -> None:
        """Timers are not part of these jobs."""

    def reset_session(self) -> None:
        """Handled by the caller (state dropped)."""
