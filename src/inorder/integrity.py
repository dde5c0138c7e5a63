"""Integrity tiers and violation policies: what a pipeline promises about order and loss.

See ``docs/concepts.md`` for the table of tiers. A tier is chosen per pipeline::

    Integrity.strict(on_violation="fail", sequence_field="seq")
    Integrity.fuzzy(lateness=timedelta(minutes=5))
    Integrity.none()
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

Tier = Literal["none", "fuzzy", "strict"]
Policy = Literal["fail", "restart_session", "dead_letter"]

POLICIES: tuple[Policy, ...] = ("fail", "restart_session", "dead_letter")
#: Default :attr:`Integrity.reject_limit`: a batch in which more than half the records break
#: rules (at least :data:`MIN_REJECTED` of them) stops before it commits. Real data is not
#: that broken; a wrong ``row_key``, codec or envelope is.
REJECT_LIMIT = 0.5
#: Fewer rejected records than this never stop a batch (a small batch proves nothing).
MIN_REJECTED = 100


@dataclass(frozen=True, slots=True)
class Integrity:
    """The integrity a pipeline enforces and what it does when a record breaks it.

    Rules (``strict``): records of a partition arrive in increasing offset order with none
    skipped below the log-start offset (data loss); every record decodes; when
    ``sequence_field`` is set, that field of the messages of a key goes up by exactly one
    (a new session, see :meth:`inorder.processor.Processor.starts_session`, may restart it);
    a processor may raise :class:`inorder.processor.Violation` for its own rules.
    Offset gaps from transaction markers or compaction are not violations.

    Under ``dead_letter`` and ``restart_session``, a batch in which more than
    ``reject_limit`` of the records broke rules (dead-lettered or reset) stops
    before it commits: a wrong setting, not the data, rejects that much.
    """

    tier: Tier = "strict"
    on_violation: Policy = "fail"
    sequence_field: str | None = None
    lateness: timedelta = timedelta(0)
    #: The share of a batch's records that may break rules before the batch stops,
    #: uncommitted, naming the setting that is likely wrong (1.0: never).
    reject_limit: float = REJECT_LIMIT

    def __post_init__(self) -> None:
        if self.on_violation not in POLICIES:
            raise ValueError(
                f"on_violation must be one of {', '.join(POLICIES)}, not {self.on_violation!r}"
            )
        if self.lateness < timedelta(0):
            raise ValueError("lateness must not be negative")
        if not 0.0 < self.reject_limit <= 1.0:
            raise ValueError(f"reject_limit must be above 0 and at most 1, not {self.reject_limit}")

    @classmethod
    def strict(
        cls,
        on_violation: Policy = "fail",
        sequence_field: str | None = None,
        reject_limit: float = REJECT_LIMIT,
    ) -> Integrity:
        """Exact offset order, no loss, no undecodable records; optional sequence checks."""
        return cls("strict", on_violation, sequence_field, reject_limit=reject_limit)

    @classmethod
    def fuzzy(cls, lateness: timedelta, on_violation: Policy = "dead_letter") -> Integrity:
        """Event-time order per key within ``lateness``; later records are late.

        Records wait in a reorder buffer (kept in state) until the partition's watermark
        (max event time - ``lateness``) reaches them; a record already behind the watermark
        when it arrives breaks rule ``late`` (dead-lettered by default).
        """
        return cls("fuzzy", on_violation, None, lateness)

    @classmethod
    def none(cls) -> Integrity:
        """No checks, no promised order.

        Records are still applied one task per topic-partition, in offset order (a large
        partition is not split over several tasks); anything that goes wrong is
        dead-lettered.
        """
        return cls("none", "dead_letter")
