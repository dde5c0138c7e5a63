"""Integrity tiers and violation policies: what a pipeline promises about order and loss.

See ``docs/concepts.md`` for the table of tiers. A tier is chosen per pipeline::

    Integrity.strict(on_violation="fail", sequence_field="seq")
    Integrity.fuzzy(lateness=timedelta(minutes=5))
    Integrity.none()
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from inorder.errors import ConfigError

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


def check_fits(integrity: Integrity, processor: Any) -> None:
    """Refuse, before anything runs, an integrity the processor cannot honour.

    Raises :class:`~inorder.errors.ConfigError` when ``sequence_field`` names no field of the
    processor's message type (every record would break rule ``sequence_missing``), or when
    ``restart_session`` is the policy of a processor without ``starts_session`` (a key that
    broke a rule would be ignored for good, silently), or when the processor's own
    :meth:`~inorder.processor.Processor.check_integrity` refuses it.
    """
    from inorder.processor import Processor

    if isinstance(processor, Processor):
        processor.check_integrity(integrity)  # what only the processor knows of its input
    own = getattr(type(processor), "starts_session", None)
    if integrity.on_violation == "restart_session" and own in (None, Processor.starts_session):
        name = type(processor).__name__
        raise ConfigError(
            f"integrity.on_violation = 'restart_session': {name} has no starts_session, so a "
            "key that broke a rule could never restart and would be ignored for good; "
            f"implement {name}.starts_session(msg) (true for a message that begins a new "
            "session), or use on_violation 'fail' or 'dead_letter'"
        )
    field = integrity.sequence_field
    if field is None:
        return
    found = _message_fields(processor)
    if found is not None and field not in found[1]:
        type_name, fields = found
        close = difflib.get_close_matches(field, fields, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"integrity.sequence_field = {field!r} is not a field of the message type "
            f"{type_name} (its fields: {', '.join(fields) or 'none'}){hint}"
        )


def _message_fields(processor: Any) -> tuple[str, list[str]] | None:
    """The processor's message type name and field names; ``None`` without fixed fields.

    Record types (dataclass, msgspec.Struct, NamedTuple, pydantic) and TypedDicts have them;
    for ``dict``, ``bytes``, ``Any`` and the like nothing can be told before records arrive.
    """
    from inorder.processor import processor_types
    from inorder.schema import is_record_type, record_fields

    try:
        msg_type = processor_types(processor).msg
    except TypeError:
        return None  # the backend's check names the problem with the processor's types
    name = str(getattr(msg_type, "__qualname__", msg_type))
    if is_record_type(msg_type):
        return name, [f.name for f in record_fields(msg_type)]
    if typing.is_typeddict(msg_type):
        return name, list(typing.get_type_hints(msg_type))
    return None
