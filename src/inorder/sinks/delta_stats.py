"""Column statistics of a data file as Delta ``add.stats``: numRecords, min/max, null counts.

Every primitive column gets bounds, strings and timestamps included. deltalake (1.6) turns a
primitive column that has no ``minValues``/``maxValues`` entry into the guarantee
``column >= null`` when it opens a table as a pyarrow dataset, so any filter on that column
skips the file: without string bounds, ``topic == 'x'`` read 0 rows of an unpartitioned table.
Bounds are safe to be loose, never tight: a long string's maximum is its prefix followed by
the highest code point, a decimal's bounds are rounded outwards to floats, and timestamps
are written to the millisecond (readers widen the maximum by 1 ms).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: Longest string bound written: longer values are cut (the maximum then made larger).
MAX_STRING_BOUND = 64
_TOP = "\U0010ffff"

_BOUNDED = (
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_date,
    pa.types.is_boolean,
    pa.types.is_decimal,
    pa.types.is_timestamp,
    pa.types.is_string,
    pa.types.is_large_string,
)


def merge_stats(stats: dict[str, list[Any]], data: pa.Table) -> dict[str, list[Any]]:
    """Fold min/max/null count of ``data`` into ``stats`` (``name -> [min, max, nulls]``)."""
    for name in data.column_names:
        col = data.column(name)
        entry = stats.setdefault(name, [None, None, 0])
        entry[2] += col.null_count
        if not any(check(col.type) for check in _BOUNDED) or col.null_count == len(col):
            continue
        mm = pc.min_max(col)
        lo, hi = _lower(mm["min"].as_py()), _upper(mm["max"].as_py())
        if isinstance(lo, float) and (lo != lo or hi != hi):  # NaN: no usable bounds
            continue
        entry[0] = lo if entry[0] is None else min(entry[0], lo)
        entry[1] = hi if entry[1] is None else max(entry[1], hi)
    return stats


def stats_json(rows: int, stats: Mapping[str, list[Any]]) -> str:
    """Delta ``add.stats`` JSON of ``rows`` rows and the merged ``stats``."""
    mins = {k: _json_value(v[0]) for k, v in stats.items() if v[0] is not None}
    maxs = {k: _json_value(v[1]) for k, v in stats.items() if v[1] is not None}
    nulls = {k: int(v[2]) for k, v in stats.items()}
    return json.dumps(
        {"numRecords": rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    )


def _lower(value: Any) -> Any:
    if isinstance(value, str):
        return value[:MAX_STRING_BOUND]
    if isinstance(value, decimal.Decimal):
        return math.nextafter(float(value), -math.inf)
    return value


def _upper(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING_BOUND else value[:MAX_STRING_BOUND] + _TOP
    if isinstance(value, decimal.Decimal):
        return math.nextafter(float(value), math.inf)
    return value


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        # deltalake's own writer: UTC with "Z" for zoned timestamps, a space for naive ones.
        if value.tzinfo is not None:
            utc = value.astimezone(dt.UTC)
            return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
        return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}"
    if isinstance(value, dt.date):
        return value.isoformat()
    return value
