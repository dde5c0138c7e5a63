"""Partition marker rows (``inorder.partitionMarkers=true``): the one definition of their format.

With markers, every planned input partition (one per known topic-partition, even one with no
new records) starts with exactly one marker row: ``key`` and ``value`` null, ``topic`` and
``partition`` set, ``offset`` = the range start, ``timestamp`` null, ``timestampType`` -1 and
one header ``inorder.range`` = ``b"<start>-<end>"``. A task therefore always knows its
topic-partition and planned range ``[start, end)``, even when it has no records.

Every writer (the source's reads, the in-memory test frames) and every reader (the engine's
tasks, the key-group router, the archiver, users of the source) takes the format from here:
:data:`MARKER_HEADER` and :func:`encode_range` to build one, :func:`headers_range` to read
one row's headers, :func:`marker_rows` for an Arrow batch (vectorised: only rows shaped like
a marker are looked at one by one), :func:`parse_marker` for a row of any form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.records import TopicPartition

__all__ = [
    "MARKER_HEADER",
    "MARKER_TIMESTAMP_TYPE",
    "Marker",
    "decode_range",
    "encode_range",
    "headers_range",
    "is_marker",
    "is_marker_json",
    "marker_mask",
    "marker_rows",
    "parse_marker",
]

#: Header key of the marker row that starts every planned range.
MARKER_HEADER = "inorder.range"
#: ``timestampType`` of a marker row (Kafka's own types are 0 and 1).
MARKER_TIMESTAMP_TYPE = -1

#: One row's headers as ``(key, value)`` pairs.
Headers = Sequence[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Marker:
    """The planned range of the task the marker row starts."""

    tp: TopicPartition
    start: int
    end: int


def encode_range(start: int, end: int) -> bytes:
    """The marker header's value for the planned range ``[start, end)``."""
    return f"{start}-{end}".encode()


def decode_range(raw: bytes) -> tuple[int, int]:
    """``(start, end)`` from a marker header's value (``ValueError`` if it is not one)."""
    start, _, end = raw.decode().partition("-")
    return int(start), int(end)


def headers_range(headers: Headers | None) -> tuple[int, int] | None:
    """The range a marker row's headers announce, or ``None`` for any other headers."""
    if not headers or len(headers) != 1:
        return None
    key, value = headers[0]
    if key != MARKER_HEADER or value is None:
        return None
    return decode_range(bytes(value))


def is_marker_json(key: Any, value: Any, timestamp_type: Any, headers_json: Any) -> bool:
    """Whether a row whose headers travel as JSON text (``headers_json``) is a marker.

    Per record on the key-group router's path: a cheap test (only markers have null key and
    value with timestamp type -1, and their one header's name is in the text).
    """
    return (
        key is None
        and value is None
        and timestamp_type == MARKER_TIMESTAMP_TYPE
        and headers_json is not None
        and MARKER_HEADER in headers_json
    )


def arrow_headers(batch: pa.RecordBatch | pa.Table) -> list[Headers | None]:
    """Per-row headers of the source's ``headers`` column (``None`` when a row has none)."""
    return [
        None if h is None else [(x["key"], x["value"]) for x in h]
        for h in batch.column("headers").to_pylist()
    ]


def marker_rows(
    batch: pa.RecordBatch | pa.Table,
    headers_of: Callable[[Any], Sequence[Headers | None]] = arrow_headers,
) -> list[tuple[int, int, int]]:
    """``(row index, start, end)`` of each marker row of an Arrow batch (source columns).

    Vectorised: the shape (null key and value, timestamp type -1) is tested in Arrow, and
    only the rows that have it get their headers read, by ``headers_of`` (given the rows
    taken out of ``batch``; the default reads the ``headers`` column, a caller whose headers
    travel in another form passes its reader).
    """
    ts_type = batch.column("timestampType")
    value = batch.column("value")
    # Without a null value there is no marker: the common batch of records costs two counts
    # instead of six compute calls (about 100 us a batch, paid per topic-partition).
    if ts_type.null_count == len(ts_type) or value.null_count == 0:
        return []
    if batch.num_rows <= _FEW_ROWS:  # a task's input of marker rows only: one per partition
        key = batch.column("key")
        shaped = [
            i
            for i, kind in enumerate(ts_type.to_pylist())
            if kind == MARKER_TIMESTAMP_TYPE and not key[i].is_valid and not value[i].is_valid
        ]
        return _planned(batch, shaped, headers_of)
    candidate = pc.and_(
        pc.fill_null(pc.equal(ts_type, MARKER_TIMESTAMP_TYPE), False),
        pc.and_(pc.is_null(batch.column("key")), pc.is_null(batch.column("value"))),
    )
    return _planned(batch, pc.indices_nonzero(candidate).to_pylist(), headers_of)


#: Batches of at most this many rows are tested for the marker shape in Python (cheaper than
#: Arrow's compute calls at that size).
_FEW_ROWS = 8


def _planned(
    batch: pa.RecordBatch | pa.Table,
    indices: list[int],
    headers_of: Callable[[Any], Sequence[Headers | None]],
) -> list[tuple[int, int, int]]:
    """``(row index, start, end)`` of the rows ``indices`` of the marker shape that carry a
    planned range."""
    if not indices:
        return []
    headers = headers_of(batch.take(pa.array(indices, pa.int64())))
    found = []
    for i, h in zip(indices, headers, strict=True):
        planned = headers_range(h)
        if planned is not None:
            found.append((i, planned[0], planned[1]))
    return found


def marker_mask(batch: pa.RecordBatch | pa.Table) -> pa.Array:
    """Boolean array: true where a row of an Arrow batch (source schema) is a marker."""
    flags = [False] * batch.num_rows
    for i, _, _ in marker_rows(batch):
        flags[i] = True
    return pa.array(flags, pa.bool_())


def _get(row: Any, name: str) -> Any:
    if isinstance(row, Mapping):
        return row.get(name)
    try:
        return row[name]  # pyspark Row
    except (KeyError, TypeError, IndexError, ValueError):
        return getattr(row, name, None)


def _row_range(row: Any) -> tuple[int, int] | None:
    if not (
        _get(row, "key") is None
        and _get(row, "value") is None
        and _get(row, "timestampType") == MARKER_TIMESTAMP_TYPE
    ):
        return None
    headers = _get(row, "headers")
    if not headers:
        return None
    return headers_range([(_get(h, "key"), _get(h, "value")) for h in headers])


def is_marker(row: Any) -> bool:
    """Whether a row (dict, pyspark ``Row`` or attribute object) is a marker row."""
    return _row_range(row) is not None


def parse_marker(row: Any) -> Marker | None:
    """The :class:`Marker` a row carries, or ``None`` for an ordinary record."""
    planned = _row_range(row)
    if planned is None:
        return None
    tp = TopicPartition(str(_get(row, "topic")), int(_get(row, "partition")))
    return Marker(tp, planned[0], planned[1])
