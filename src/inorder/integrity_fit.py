"""Whether a pipeline's integrity fits its processor: checked once, before anything runs."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.processor import Processor, processor_types
from inorder.schema import is_record_type, record_fields


def check_fits(integrity: Integrity, processor: Any) -> None:
    """Refuse, before anything runs, an integrity the processor cannot honour.

    Raises :class:`~inorder.errors.ConfigError` when ``sequence_field`` names no field of the
    processor's message type (every record would break rule ``sequence_missing``), or when
    ``restart_session`` is the policy of a processor without ``starts_session`` (a key that
    broke a rule would be ignored for good, silently), or when the processor's own
    :meth:`~inorder.processor.Processor.check_integrity` refuses it.
    """
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
