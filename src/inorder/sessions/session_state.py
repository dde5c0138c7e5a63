"""A session's state: its table's rows, the last ``seq``, and with an envelope, its position.

Kept apart from the processor so that the envelope's apply steps (which read and settle the
position) and the processor (which owns the rules) both import it from below.
"""

from __future__ import annotations

import msgspec


class SessionState(msgspec.Struct):
    """Per-session state: table rows as canonical JSON, last ``seq``, snapshot seen."""

    started: bool = False
    seq: int = -1
    rows: dict[str, str] = {}


class EnvelopeState(SessionState):
    """:class:`SessionState` with an envelope: a snapshot read row by row in progress and the
    source's last position (the contract's state stays without them)."""

    reading: bool = False
    position: list[int | str] | None = None
    #: The last applied source positions, each as ``[digest of the event, *position]``
    #: (oldest first, at most ``REDELIVERY_WINDOW``): to recognise a redelivery.
    recent: list[list[int | str]] = []
