"""The readable ends the planner last saw, kept on disk so a restart can count what was unread.

A topic deleted while the query is stopped leaves no trace in Kafka: the restarted planner
only sees its partitions gone. What it had not yet read is known only from the high
watermarks the previous run saw while a backlog remained, so the planner writes them here
(``inorder.highWatermarksFile``; ``inorder run`` keeps the file beside its checkpoint) and the
next run starts from them. The numbers are observations, never positions: they only ever turn
a silent prune into a counted (or refused) loss, and a missing, stale or unreadable file
costs nothing but that count.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from inorder.errors import StorageError
from inorder.records import TopicPartition
from inorder.storage import fs as sfs

log = logging.getLogger(__name__)

#: Version of the file's JSON form (readers skip a file of a version they do not know).
HIGH_MARKS_VERSION = 1


def encode_high_marks(highs: Mapping[TopicPartition, int]) -> bytes:
    """The file's bytes: ``{"version": 1, "highs": {topic: {partition: high}}}``."""
    nested: dict[str, dict[str, int]] = {}
    for tp, high in sorted(highs.items()):
        nested.setdefault(tp.topic, {})[str(tp.partition)] = int(high)
    return json.dumps({"version": HIGH_MARKS_VERSION, "highs": nested}, sort_keys=True).encode()


def decode_high_marks(data: bytes) -> dict[TopicPartition, int]:
    """The highs in ``data``; raises ``ValueError`` when it is not a file of this version."""
    parsed = json.loads(data)
    if not isinstance(parsed, dict) or parsed.get("version") != HIGH_MARKS_VERSION:
        raise ValueError(f"not a version {HIGH_MARKS_VERSION} high watermarks file")
    out: dict[TopicPartition, int] = {}
    for topic, partitions in parsed.get("highs", {}).items():
        for partition, high in partitions.items():
            out[TopicPartition(str(topic), int(partition))] = int(high)
    return out


def load_high_marks(path: str) -> dict[TopicPartition, int]:
    """The highs last saved at ``path`` (empty when there is no file or it is unreadable)."""
    try:
        location = sfs.resolve(path)
        data = sfs.read_bytes_if_exists(location, location.root)
        return {} if data is None else decode_high_marks(data)
    except (OSError, StorageError, ValueError, TypeError, AttributeError) as exc:
        log.warning(
            "inorder-kafka: %s: unreadable (%s); offsets of topics deleted while the query "
            "was stopped cannot be counted",
            path,
            exc,
        )
        return {}


def save_high_marks(path: str, highs: Mapping[TopicPartition, int]) -> bool:
    """Replace the file at ``path`` with ``highs``; ``False`` (logged) when it cannot be written.

    A failed write never stops the query: it only narrows what a later restart can count.
    """
    try:
        location = sfs.resolve(path)
        sfs.write_bytes(location, location.root, encode_high_marks(highs))
    except (OSError, StorageError) as exc:
        log.warning("inorder-kafka: %s: not written (%s)", path, exc)
        return False
    return True


__all__ = [
    "HIGH_MARKS_VERSION",
    "decode_high_marks",
    "encode_high_marks",
    "load_high_marks",
    "save_high_marks",
]
