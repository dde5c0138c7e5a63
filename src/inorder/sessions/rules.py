"""The session rules' small helpers: a message's operation name and the violations it breaks."""

from __future__ import annotations

from inorder.processor import Violation
from inorder.sessions.messages import Delete, SessionMessage, Snapshot


def tag(msg: SessionMessage) -> str:
    """The operation of a contract message (its JSON ``type``)."""
    name: str = msg.__struct_config__.tag  # type: ignore[assignment]
    return name


def delete_id(msg: Delete) -> str:
    """The row a delete names, as the string the table keys rows by."""
    rid = msg.id
    return rid if type(rid) is str else str(rid)


def missing(rule: str, msg: SessionMessage, rid: str) -> Violation:
    """``rule`` broken by ``msg`` naming row ``rid``, which the table does not hold."""
    return Violation(rule, f"session {msg.session!r}: {tag(msg)} seq {msg.seq}: no row {rid!r}")


def existing(msg: SessionMessage, rid: str) -> Violation:
    """``insert_existing_row``: ``msg`` adds row ``rid``, which the table already holds."""
    where = "listed twice in the snapshot" if type(msg) is Snapshot else "already present"
    return Violation(
        "insert_existing_row",
        f"session {msg.session!r}: {tag(msg)} seq {msg.seq}: row {rid!r} {where}",
    )


__all__ = ["delete_id", "existing", "missing", "tag"]
