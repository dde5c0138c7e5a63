"""Partition marker rows (``inorder.partitionMarkers=true``), for engines built on the source.

With markers, every planned input partition (one per known topic-partition, even one with no
new records) starts with exactly one marker row: ``key`` and ``value`` null, ``topic`` and
``partition`` set, ``offset`` = the range start, ``timestamp`` null, ``timestampType`` -1 and
one header ``inorder.range`` = ``b"<start>-<end>"``. A task therefore always knows its
topic-partition and planned range ``[start, end)``, even when it has no records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.kafka.consumer import MARKER_HEADER
from inorder.records import TopicPartition

__all__ = ["MARKER_HEADER", "Marker", "is_marker", "marker_mask", "parse_marker"]


@dataclass(frozen=True)
class Marker:
    """The planned range of the task the marker row starts."""

    tp: TopicPartition
    start: int
    end: int


def _get(row: Any, name: str) -> Any:
    if isinstance(row, Mapping):
        return row.get(name)
    try:
        return row[name]  # pyspark Row
    except (KeyError, TypeError, IndexError, ValueError):
        return getattr(row, name, None)


def _range_header(row: Any) -> bytes | None:
    headers = _get(row, "headers")
    if not headers or len(headers) != 1:
        return None
    header = headers[0]
    if _get(header, "key") != MARKER_HEADER:
        return None
    value = _get(header, "value")
    return bytes(value) if value is not None else None


def is_marker(row: Any) -> bool:
    """Whether a row (dict, pyspark ``Row`` or attribute object) is a marker row."""
    return (
        _get(row, "key") is None
        and _get(row, "value") is None
        and _get(row, "timestampType") == -1
        and _range_header(row) is not None
    )


def parse_marker(row: Any) -> Marker | None:
    """The :class:`Marker` a row carries, or ``None`` for an ordinary record."""
    if not is_marker(row):
        return None
    raw = _range_header(row)
    assert raw is not None
    start_text, _, end_text = raw.decode().partition("-")
    return Marker(
        TopicPartition(str(_get(row, "topic")), int(_get(row, "partition"))),
        int(start_text),
        int(end_text),
    )


def marker_mask(batch: pa.RecordBatch | pa.Table) -> pa.Array:
    """Boolean array: true where a row of an Arrow batch (source schema) is a marker."""
    ts_type = batch.column("timestampType")
    candidate = pc.and_(
        pc.and_(pc.is_null(batch.column("key")), pc.is_null(batch.column("value"))),
        pc.fill_null(pc.equal(ts_type, -1), False),
    )
    if not pc.any(candidate).as_py():
        return candidate
    flags = [
        bool(c) and is_marker(row)
        for c, row in zip(candidate.to_pylist(), batch.to_pylist(), strict=True)
    ]
    return pa.array(flags, pa.bool_())
